//! End-to-end `generate` with a fake model and replayed draws: tokens, draw order, self-conditioning,
//! temperature, stopping, EOS, max length, hooks and errors.

mod common;

use common::{C, FakeModel, FakeSpec, V, cfg, draws, reference_generate, spec};
use dg_model::{GenerationConfig, StoppingConfig};
use dg_sampler::{DrawError, DrawKind, Hooks, NoHooks, Replay, SamplerError, SeededRng, StepInfo, StopReason, generate};

#[derive(Default)]
struct Recorder {
    steps: Vec<(usize, usize, usize, f32, usize)>,
    canvases: Vec<(usize, Vec<u32>)>,
}

impl Hooks for Recorder {
    fn on_step(&mut self, s: &StepInfo<'_>) {
        assert_eq!(s.accepted.iter().filter(|&&a| a).count(), s.num_accepted);
        assert_eq!((s.draft.len(), s.entropies.len(), s.canvas.len()), (C, C, C));
        self.steps.push((s.block, s.step, s.remaining, s.temperature, s.num_accepted));
    }
    fn on_canvas(&mut self, block: usize, tokens: &[u32]) {
        self.canvases.push((block, tokens.to_vec()));
    }
}

#[test]
fn replay_matches_the_reference_loop_and_consumes_draws_in_order() {
    let prompt = [5u32, 9, 2];
    let cfg = cfg(3, 4);
    let recorded = draws(3, 4, C, V, 1);
    let want = reference_generate(&spec(), &prompt, &cfg, C, &recorded);
    let mut model = FakeModel::new(spec());
    let mut replay = Replay::new(recorded);
    let mut hooks = Recorder::default();
    let g = generate(&mut model, &prompt, &cfg, C, V, &mut replay, &mut hooks).unwrap();
    assert_eq!(g.sequence, want.sequence);
    assert_eq!(g.steps_per_canvas, [4, 4, 4]);
    assert_eq!(g.stop_reason, StopReason::AllCanvases);
    assert_eq!((g.decoder_passes, g.prompt_len, g.new_tokens().len()), (12, 3, 18));
    // 1 uniform per block, then (categorical, uniform) per step; all 27 consumed.
    assert_eq!(want.draws_used, 27);
    let kinds: Vec<DrawKind> = replay.consumed_kinds().collect();
    let block = [vec![DrawKind::UniformTokens], [DrawKind::Categorical, DrawKind::UniformTokens].repeat(4)].concat();
    assert_eq!(kinds, block.repeat(3));
    // Encoder: the prompt, then each committed canvas except the last.
    assert_eq!(model.encoded, vec![prompt.to_vec(), g.sequence[3..9].to_vec(), g.sequence[9..15].to_vec()]);
    // Hooks saw every step with n counting down and T = temperature_at(n); and every canvas.
    let seen: Vec<_> = hooks.steps.iter().map(|s| (s.0, s.1, s.2)).collect();
    let want_steps: Vec<_> = (0..3).flat_map(|b| (0..4).map(move |s| (b, s, 4 - s))).collect();
    assert_eq!(seen, want_steps);
    assert!(hooks.steps.iter().all(|s| s.3 == cfg.temperature_at(s.2)));
    assert!(hooks.steps.iter().all(|s| s.4 >= 1) && hooks.steps.iter().any(|s| s.4 < C), "partial acceptance");
    assert_eq!(hooks.canvases.len(), 3);
    assert_eq!(hooks.canvases[2], (2, g.sequence[15..].to_vec()));
}

#[test]
fn self_conditioning_is_the_previous_steps_temperature_scaled_logits() {
    let cfg = cfg(2, 5);
    let mut model = FakeModel::new(spec());
    let mut replay = Replay::new(draws(2, 5, C, V, 2));
    generate(&mut model, &[7], &cfg, C, V, &mut replay, &mut NoHooks).unwrap();
    assert_eq!(model.calls.len(), 10);
    for (i, (_, sc, _)) in model.calls.iter().enumerate() {
        let step = i % 5;
        if step == 0 {
            assert!(sc.is_none(), "call {i}: a block's first step has no self-conditioning");
            continue;
        }
        let t = cfg.temperature_at(5 - (step - 1)); // n of the previous step
        let want: Vec<u32> = model.calls[i - 1].2.iter().map(|x| (x / t).to_bits()).collect();
        let got: Vec<u32> = sc.as_ref().unwrap().iter().map(|x| x.to_bits()).collect();
        assert!(got == want, "call {i}: sc must be raw / T of the previous step, bit for bit");
    }
    // Temperatures: n = N → t_max, n = 1 → t_min + (t_max − t_min)/N.
    assert_eq!(cfg.temperature_at(5), 0.8);
    assert_eq!(cfg.temperature_at(1), 0.4f32 + 0.4f32 * (1.0 / 5.0));
}

#[test]
fn the_block_canvas_is_the_last_steps_argmax_and_the_next_canvas_mixes_samples_and_noise() {
    let cfg = cfg(1, 2);
    let recorded = draws(1, 2, C, V, 3);
    let mut model = FakeModel::new(spec());
    let mut hooks = Recorder::default();
    let g = generate(&mut model, &[4, 4], &cfg, C, V, &mut Replay::new(recorded.clone()), &mut hooks).unwrap();
    // Step 0 decodes the initial uniform draw; step 1 decodes accepted samples / noise of step 0.
    assert_eq!(model.calls[0].0, recorded[0].1);
    let (sampled, noise) = (&recorded[1].1, &recorded[2].1);
    let accepted = hooks.steps[0].4;
    let mixed: Vec<bool> = (0..C).map(|i| model.calls[1].0[i] == sampled[i] && sampled[i] != noise[i]).collect();
    assert!((1..C).contains(&accepted), "peaked rows accepted, flat rows renoised ({accepted})");
    assert_eq!(mixed.iter().filter(|&&m| m).count(), accepted);
    // The output is the argmax of the last forward's logits (first maximal index per row).
    let raw = &model.calls[1].2;
    let argmax: Vec<u32> = (0..C).map(|i| dg_sampler::rows::argmax(&raw[i * V..(i + 1) * V])).collect();
    assert_eq!(&g.sequence[2..], &argmax[..]);
}

#[test]
fn adaptive_stopping_ends_a_block_when_stable_and_confident() {
    let spec = FakeSpec { peak_follows_canvas: false, ..spec() };
    let mut cfg = cfg(2, 6);
    // Stability 1 + a confidence threshold above the mean entropy: stops at the second step of each block.
    cfg.stopping = Some(StoppingConfig { stability_threshold: 1, confidence_threshold: 10.0 });
    let recorded = draws(2, 2, C, V, 4);
    let want = reference_generate(&spec, &[1], &cfg, C, &recorded);
    let mut replay = Replay::new(recorded);
    let g = generate(&mut FakeModel::new(spec.clone()), &[1], &cfg, C, V, &mut replay, &mut NoHooks).unwrap();
    assert_eq!(g.steps_per_canvas, [2, 2]);
    assert_eq!(want.steps, [2, 2]);
    assert_eq!(g.sequence, want.sequence);
    assert_eq!(g.decoder_passes, 4);
    // Stability 2 needs three identical argmax canvases; stability 0 stops on the first step.
    for (k, steps) in [(2, 3), (0, 1)] {
        cfg.stopping = Some(StoppingConfig { stability_threshold: k, confidence_threshold: 10.0 });
        let mut replay = Replay::new(draws(2, steps, C, V, 4));
        let g = generate(&mut FakeModel::new(spec.clone()), &[1], &cfg, C, V, &mut replay, &mut NoHooks).unwrap();
        assert_eq!(g.steps_per_canvas, [steps, steps], "stability {k}");
    }
    // A threshold below the mean entropy never stops: all N steps.
    cfg.stopping = Some(StoppingConfig { stability_threshold: 0, confidence_threshold: 1e-3 });
    let mut replay = Replay::new(draws(2, 6, C, V, 4));
    let g = generate(&mut FakeModel::new(spec), &[1], &cfg, C, V, &mut replay, &mut NoHooks).unwrap();
    assert_eq!(g.steps_per_canvas, [6, 6]);
}

#[test]
fn eos_ends_generation_early_and_pads_after_the_first_eos() {
    // Row 2 peaks at EOS id 3 once the cache holds the prompt and one block (i.e. in block 1).
    let spec = FakeSpec { eos: Some((2, 3, 2 + C)), ..spec() };
    let cfg = GenerationConfig { eos_token_ids: vec![1, 3], ..cfg(4, 3) };
    let recorded = draws(4, 3, C, V, 5);
    let want = reference_generate(&spec, &[8, 8], &cfg, C, &recorded);
    assert_eq!(want.draws_used, 2 * 7);
    let mut replay = Replay::new(recorded[..2 * 7].to_vec());
    let g = generate(&mut FakeModel::new(spec.clone()), &[8, 8], &cfg, C, V, &mut replay, &mut NoHooks).unwrap();
    assert_eq!(g.sequence, want.sequence);
    assert_eq!(g.stop_reason, StopReason::Eos);
    assert_eq!(g.steps_per_canvas.len(), 2, "stops after the block holding EOS");
    let last = &g.sequence[2 + C..];
    assert_eq!(last[2], 3);
    assert!(last[3..].iter().all(|&t| t == 0), "{last:?}");
    assert_eq!(g.valid_tokens, g.new_tokens().iter().filter(|&&t| t != 0).count());
    assert_eq!(g.tokens_per_forward, g.valid_tokens as f64 / 6.0);
    // The same run with the draws of all four blocks leaves draws unconsumed: an error.
    let mut replay = Replay::new(recorded);
    let e = generate(&mut FakeModel::new(spec), &[8, 8], &cfg, C, V, &mut replay, &mut NoHooks).unwrap_err();
    assert!(matches!(e, SamplerError::Draw(DrawError::Unconsumed { consumed: 14, left: 14, .. })), "{e}");
}

#[test]
fn max_length_stops_generation() {
    let mut cfg = cfg(3, 2);
    cfg.max_length = Some(1 + C);
    let mut replay = Replay::new(draws(1, 2, C, V, 6));
    let g = generate(&mut FakeModel::new(spec()), &[9], &cfg, C, V, &mut replay, &mut NoHooks).unwrap();
    assert_eq!((g.stop_reason, g.sequence.len()), (StopReason::MaxLength, 1 + C));
    // With max_new_tokens at its default of 256, max_length sets the number of canvases instead.
    cfg.max_new_tokens = 256;
    cfg.max_length = Some(1 + 2 * C - 1);
    assert_eq!(cfg.new_canvases(1, C), 2);
}

#[test]
fn seeded_generation_is_reproducible() {
    let cfg = cfg(2, 3);
    let run = |seed| {
        let mut model = FakeModel::new(spec());
        generate(&mut model, &[2, 3], &cfg, C, V, &mut SeededRng::new(seed), &mut NoHooks).unwrap().sequence
    };
    assert_eq!(run(11), run(11));
}

/// Stops when asked: after step `at_step` of block `at_block`, or after the canvas of `after_canvas`.
struct StopAt {
    at: Option<(usize, usize)>,
    after_canvas: Option<usize>,
    last_step: (usize, usize),
    canvases: usize,
    stop_now: bool,
}

impl StopAt {
    fn new(at: Option<(usize, usize)>, after_canvas: Option<usize>) -> Self {
        StopAt { at, after_canvas, last_step: (0, 0), canvases: 0, stop_now: false }
    }
}

impl Hooks for StopAt {
    fn on_step(&mut self, s: &StepInfo<'_>) {
        self.last_step = (s.block, s.step);
        self.stop_now = self.at == Some((s.block, s.step));
    }
    fn on_canvas(&mut self, block: usize, _tokens: &[u32]) {
        self.canvases += 1;
        self.stop_now = self.after_canvas == Some(block);
    }
    fn should_stop(&mut self) -> bool {
        self.stop_now
    }
}

#[test]
fn should_stop_ends_generation_at_the_step_it_is_asked() {
    let cfg = cfg(3, 4);
    let mut model = FakeModel::new(spec());
    let mut hooks = StopAt::new(Some((1, 2)), None);
    let g = generate(&mut model, &[2, 3], &cfg, C, V, &mut SeededRng::new(5), &mut hooks).unwrap();
    assert_eq!(g.stop_reason, StopReason::Cancelled);
    assert_eq!(hooks.last_step, (1, 2), "no step runs after the stop");
    // Block 0 whole; block 1 cut after its third step and not appended.
    assert_eq!(g.steps_per_canvas, [4, 3]);
    assert_eq!(g.decoder_passes, 7);
    assert_eq!(g.new_tokens().len(), C);
    assert_eq!(hooks.canvases, 1);
}

#[test]
fn should_stop_after_a_canvas_keeps_that_canvas_and_starts_no_other() {
    let cfg = cfg(3, 4);
    let mut hooks = StopAt::new(None, Some(0));
    let g = generate(&mut FakeModel::new(spec()), &[2, 3], &cfg, C, V, &mut SeededRng::new(5), &mut hooks).unwrap();
    assert_eq!(g.stop_reason, StopReason::Cancelled);
    assert_eq!(g.steps_per_canvas, [4]);
    let full = generate(&mut FakeModel::new(spec()), &[2, 3], &cfg, C, V, &mut SeededRng::new(5), &mut NoHooks).unwrap();
    assert_eq!(g.new_tokens(), &full.new_tokens()[..C], "the kept canvas is the uncancelled run's first");
    // Stopping after the last canvas changes nothing: there is nothing left to cancel.
    let mut hooks = StopAt::new(None, Some(2));
    let g = generate(&mut FakeModel::new(spec()), &[2, 3], &cfg, C, V, &mut SeededRng::new(5), &mut hooks).unwrap();
    assert_eq!(g.stop_reason, full.stop_reason);
}

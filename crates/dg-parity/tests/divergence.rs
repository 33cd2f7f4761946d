//! The divergence check (`dg_parity::divergence`): where two recorded generations first part, and
//! whether the measured logits error explains it.
//!
//! Hand-made recordings over a 4-token vocabulary exercise each rule (argmax, sample, acceptance,
//! stop, length) on both sides of its threshold and of the allowed error; then whole seeded
//! generations on the CPU backend, against the same backend with its logits perturbed: slightly
//! (the tokens must agree, or part where the perturbation explains it) and grossly (the divergence
//! must not be explained at a realistic tolerance).

use dg_cpu::CpuModel;
use dg_model::{GenerationConfig, ModelConfig, ModelDir};
use dg_parity::BoxError;
use dg_parity::checks::Backend;
use dg_parity::cpu::CpuBackend;
use dg_parity::divergence::{Decision, DivergenceKind, Recording, StepRecord, first_divergence, record};
use dg_parity::reference::Reference;
use dg_parity::replay::{AsModel, replay_config};
use dg_sampler::accept::accept_mask;
use dg_sampler::rows::{RowDistributions, RowStat, process_rows};
use dg_sampler::stopping::mean_entropy;
use dg_sampler::{NoHooks, SeededRng, StopDecision, generate};

const V: usize = 4;
const BOUND: f32 = 0.5;
const THRESHOLD: f32 = 0.005;

/// A step that follows the sampler's rules on `rows` (already temperature-scaled) with the given
/// uniforms: draft, entropies, acceptance, samples, a canvas renoised with token 0, and a stable
/// stop decision with the confidence the mean entropy gives.
fn step(block: usize, step: usize, rows: &[[f32; V]], uniforms: &[f64]) -> StepRecord {
    let mut logits: Vec<f32> = rows.iter().flatten().copied().collect();
    let mut stats = vec![RowStat::default(); rows.len()];
    process_rows(&mut logits, V, 1.0, &mut stats).unwrap();
    let dists = RowDistributions::new(&logits, &stats, V);
    let sampled: Vec<u32> = uniforms.iter().enumerate().map(|(r, &u)| dists.sample(r, u)).collect();
    let entropies: Vec<f32> = stats.iter().map(|s| s.entropy).collect();
    let accepted = accept_mask(&entropies, BOUND);
    let mean = mean_entropy(&entropies);
    let stop = StopDecision { stable: true, confident: mean < THRESHOLD };
    StepRecord {
        block,
        step,
        temperature: 1.0,
        draft: stats.iter().map(|s| s.argmax).collect(),
        canvas: sampled.iter().zip(&accepted).map(|(&s, &a)| if a { s } else { 0 }).collect(),
        sampled,
        uniforms: uniforms.to_vec(),
        entropies,
        mean_entropy: mean,
        accepted,
        input_canvas: Vec::new(),
        input_sc: Vec::new(),
        scaled_logits: logits,
        stop: Some(stop),
        finished: stop.finished(),
    }
}

fn recording(steps: Vec<StepRecord>) -> Recording {
    let sequence = steps.last().map(|s| s.draft.clone()).unwrap_or_default();
    Recording { entropy_bound: BOUND, confidence_threshold: Some(THRESHOLD), steps, outcome: Ok(sequence) }
}

const ROW1: [f32; V] = [0.0, 3.0, 1.0, 0.0];
const UNIFORMS: [f64; 2] = [0.49, 0.3];

fn reference_run() -> Recording {
    recording(vec![step(0, 0, &[[2.0, 1.0, 0.0, 0.5], ROW1], &UNIFORMS), step(0, 1, &[[0.0, 0.0, 0.0, 0.0], ROW1], &UNIFORMS)])
}

#[test]
fn identical_recordings_do_not_diverge() {
    let reference = reference_run();
    assert_eq!(first_divergence(&reference, &reference.clone(), V, 0.0), None);
}

#[test]
fn an_argmax_flip_within_twice_the_row_error_is_explained() {
    let reference = reference_run();
    let mut ours = reference.clone();
    // Top-2 gap 1.0 in the reference; both entries move by 0.55 towards each other.
    ours.steps[0] = step(0, 0, &[[1.45, 1.55, 0.0, 0.5], ROW1], &UNIFORMS);
    // ‖Δ‖/‖ref‖ = 0.55·√2 / √15.25 ≈ 0.199.
    let d = first_divergence(&ours, &reference, V, 0.25).unwrap();
    eprintln!("{d}");
    assert_eq!((d.kind, d.block, d.step, d.position), (DivergenceKind::Argmax, 0, 0, Some(0)));
    assert_eq!((d.ours.clone(), d.reference.clone()), (Decision::Token(1), Decision::Token(0)));
    assert!((d.margin.unwrap() - 1.0).abs() < 1e-12 && (d.reach.unwrap() - 1.1).abs() < 1e-6, "{d}");
    assert!((d.normwise.unwrap() - 0.55 * 2f64.sqrt() / 15.25f64.sqrt()).abs() < 1e-6, "{d}");
    assert!(d.explained, "{d}");
    // The same flip from an error above the path's tolerance is not explained.
    let d = first_divergence(&ours, &reference, V, 0.1).unwrap();
    eprintln!("{d}");
    assert_eq!(d.kind, DivergenceKind::Argmax);
    assert!(!d.explained, "{d}");
}

#[test]
fn an_argmax_flip_beyond_twice_the_row_error_is_not_explained() {
    let reference = reference_run();
    let mut ours = reference.clone();
    // Logits 0.2 off in one entry, but a draft they cannot produce (gap 1.0 > 2·0.2).
    ours.steps[0] = step(0, 0, &[[2.0, 1.2, 0.0, 0.5], ROW1], &UNIFORMS);
    ours.steps[0].draft[0] = 1;
    let d = first_divergence(&ours, &reference, V, 1.0).unwrap();
    eprintln!("{d}");
    assert_eq!((d.kind, d.position), (DivergenceKind::Argmax, Some(0)));
    assert!((d.margin.unwrap() - 1.0).abs() < 1e-12 && (d.reach.unwrap() - 0.4).abs() < 1e-6, "{d}");
    assert!(!d.explained, "{d}");
}

#[test]
fn a_sample_flip_is_explained_by_the_cdf_difference_it_needs() {
    let reference = reference_run();
    // Row 0 of step 1 is uniform: u = 0.49 falls in [0.25, 0.5), token 1, 0.01 below the step.
    assert_eq!(reference.steps[1].sampled[0], 1);
    let mut ours = reference.clone();
    // Lowering token 1's logit by 0.1 moves F(1) to ≈ 0.488, below u: ours samples token 2.
    ours.steps[1] = step(0, 1, &[[0.0, -0.1, 0.0, 0.0], ROW1], &UNIFORMS);
    assert_eq!((ours.steps[1].draft[0], ours.steps[1].sampled[0]), (0, 2));
    let d = first_divergence(&ours, &reference, V, 0.05).unwrap();
    eprintln!("{d}");
    assert_eq!((d.kind, d.block, d.step, d.position), (DivergenceKind::Sample, 0, 1, Some(0)));
    assert!((d.margin.unwrap() - 0.01).abs() < 1e-6, "{d}");
    assert!(d.reach.unwrap() >= 0.012 && d.reach.unwrap() < 0.013, "{d}");
    assert!(d.explained, "{d}");
    assert!(!first_divergence(&ours, &reference, V, 0.01).unwrap().explained, "normwise 0.1/√10 > 0.01");

    // The same logits but another sample: no CDF difference can have moved it.
    let mut ours = reference.clone();
    ours.steps[1].sampled[0] = 2;
    let d = first_divergence(&ours, &reference, V, 1.0).unwrap();
    eprintln!("{d}");
    assert_eq!(d.kind, DivergenceKind::Sample);
    assert_eq!(d.reach, Some(0.0));
    assert!(!d.explained, "{d}");

    // Different uniforms: different draws, never explained.
    let mut ours = reference.clone();
    ours.steps[1] = step(0, 1, &[[0.0, 0.0, 0.0, 0.0], ROW1], &[0.51, 0.3]);
    let d = first_divergence(&ours, &reference, V, 1.0).unwrap();
    eprintln!("{d}");
    assert_eq!((d.kind, d.margin), (DivergenceKind::Sample, None));
    assert!(!d.explained, "{d}");
}

/// A recording of one step on two identical rows whose entropies and acceptance are set by hand
/// (the logits error is zero; only the entropy rule decides).
fn acceptance_run(entropies: &[f32], bound: f32) -> Recording {
    let rows = vec![[0.0, 3.0, 1.0, 0.0]; entropies.len()];
    let mut s = step(0, 0, &rows, &vec![0.3; entropies.len()]);
    s.entropies = entropies.to_vec();
    s.accepted = accept_mask(entropies, bound);
    s.mean_entropy = mean_entropy(entropies);
    Recording { entropy_bound: bound, ..recording(vec![s]) }
}

#[test]
fn an_acceptance_flip_at_the_bound_is_explained_by_the_entropy_errors() {
    // Sorted: 0.1 (prefix 0), 0.2 (0.1), 0.5 (0.3 ≤ 0.305): all accepted.
    let reference = acceptance_run(&[0.1, 0.2, 0.5], 0.305);
    // Entropies 0.004 higher before position 2: its prefix 0.308 exceeds the bound.
    let ours = acceptance_run(&[0.104, 0.204, 0.5], 0.305);
    assert_eq!((reference.steps[0].accepted[2], ours.steps[0].accepted[2]), (true, false));
    let d = first_divergence(&ours, &reference, V, 1e-6).unwrap();
    eprintln!("{d}");
    assert_eq!((d.kind, d.position), (DivergenceKind::Acceptance, Some(2)));
    assert_eq!((d.ours.clone(), d.reference.clone()), (Decision::Accepted(false), Decision::Accepted(true)));
    assert!((d.margin.unwrap() - 0.005).abs() < 1e-6 && (d.reach.unwrap() - 0.008).abs() < 1e-6, "{d}");
    assert!(d.explained, "{d}");

    // The same entropies but the other decision: nothing moved the prefix.
    let mut ours = reference.clone();
    ours.steps[0].accepted[2] = false;
    let d = first_divergence(&ours, &reference, V, 1e-6).unwrap();
    eprintln!("{d}");
    assert_eq!((d.kind, d.reach), (DivergenceKind::Acceptance, Some(0.0)));
    assert!(!d.explained, "{d}");
}

#[test]
fn an_acceptance_flip_from_a_swapped_order_is_explained_by_the_pair() {
    // Reference: 0.1 (prefix 0), 0.25 (0.1), 0.26 (0.35 > 0.3): position 1 accepted, 2 not.
    let reference = acceptance_run(&[0.1, 0.25, 0.26], 0.3);
    // Ours ranks position 2 before 1: 2 accepted, 1 not (prefix 0.36).
    let ours = acceptance_run(&[0.1, 0.27, 0.26], 0.3);
    assert_eq!(reference.steps[0].accepted, [true, true, false]);
    assert_eq!(ours.steps[0].accepted, [true, false, true]);
    let d = first_divergence(&ours, &reference, V, 1e-6).unwrap();
    eprintln!("{d}");
    assert_eq!((d.kind, d.position), (DivergenceKind::Acceptance, Some(1)));
    // The prefix at position 1 is 0.2 from the bound; the pair (1, 2) is 0.01 apart, δ = 0.02.
    assert!((d.margin.unwrap() - 0.01).abs() < 1e-6 && (d.reach.unwrap() - 0.02).abs() < 1e-6, "{d}");
    assert!(d.explained, "{d}");

    // Ours decided as if position 2 ranked first, but its entropies (0.005 off at position 2)
    // keep the reference's order and cannot close the 0.01 gap.
    let mut ours = reference.clone();
    ours.steps[0].entropies[2] = 0.255;
    ours.steps[0].accepted = vec![true, false, true];
    let d = first_divergence(&ours, &reference, V, 1e-6).unwrap();
    eprintln!("{d}");
    assert_eq!(d.kind, DivergenceKind::Acceptance);
    assert!(!d.explained, "{d}");
}

#[test]
fn a_stop_flip_is_explained_by_the_mean_entropy_error() {
    let run = |entropy: f32| {
        let mut r = acceptance_run(&[entropy; 3], BOUND);
        let s = &mut r.steps[0];
        s.stop = Some(StopDecision { stable: true, confident: s.mean_entropy < THRESHOLD });
        s.finished = s.stop.unwrap().finished();
        r
    };
    let reference = run(0.0049);
    let ours = run(0.0051);
    assert!(reference.steps[0].finished && !ours.steps[0].finished);
    let d = first_divergence(&ours, &reference, V, 1e-6).unwrap();
    eprintln!("{d}");
    assert_eq!((d.kind, d.position), (DivergenceKind::Stop, None));
    assert!((d.margin.unwrap() - 1e-4).abs() < 1e-8 && (d.reach.unwrap() - 2e-4).abs() < 1e-8, "{d}");
    assert!(d.explained, "{d}");

    let mut ours = reference.clone();
    ours.steps[0].stop = Some(StopDecision { stable: true, confident: false });
    ours.steps[0].finished = false;
    let d = first_divergence(&ours, &reference, V, 1e-6).unwrap();
    eprintln!("{d}");
    assert_eq!((d.kind, d.reach), (DivergenceKind::Stop, Some(0.0)));
    assert!(!d.explained, "{d}");
}

#[test]
fn runs_of_different_lengths_part_by_length() {
    let reference = reference_run();
    // Ours ended with an error after the first step.
    let mut ours = reference.clone();
    ours.steps.truncate(1);
    ours.outcome = Err("backend error".into());
    let d = first_divergence(&ours, &reference, V, 1.0).unwrap();
    eprintln!("{d}");
    assert_eq!((d.kind, d.block, d.step), (DivergenceKind::Length, 0, 1));
    assert_eq!(d.ours, Decision::Ended(Err("backend error".into())));
    assert_eq!(d.reference, Decision::At { block: 0, step: 1 });
    assert!(!d.explained);
    // The other way round: ours has a further block.
    let mut ours = reference.clone();
    ours.steps.push(step(1, 0, &[[0.0; V], ROW1], &UNIFORMS));
    let d = first_divergence(&ours, &reference, V, 1.0).unwrap();
    eprintln!("{d}");
    assert_eq!((d.kind, d.block, d.step), (DivergenceKind::Length, 1, 0));
    assert_eq!(d.ours, Decision::At { block: 1, step: 0 });
    assert!(matches!(d.reference, Decision::Ended(Ok(_))));
    // Same steps, different final sequences.
    let mut ours = reference.clone();
    ours.outcome = Ok(vec![9, 9]);
    let d = first_divergence(&ours, &reference, V, 1.0).unwrap();
    assert_eq!((d.kind, d.position), (DivergenceKind::Length, Some(0)));
    assert!(!d.explained);
}

// --- whole generations on the CPU backend ---

struct Fixture {
    model: ModelDir,
    prompt: Vec<u32>,
    cfg: GenerationConfig,
}

fn fixture(name: &str) -> Fixture {
    let dir = dg_parity::testing::fixture(name);
    let model = ModelDir::open(&dir).unwrap();
    let reference = Reference::open(&dir).unwrap();
    let cfg = replay_config(&reference, &model.generation, &model.config).unwrap();
    Fixture { prompt: reference.ids("prompt_ids").unwrap(), cfg, model }
}

impl Fixture {
    fn cpu(&self) -> CpuBackend {
        CpuBackend(CpuModel::new(self.model.config.clone(), self.model.load_weights().unwrap()))
    }

    fn config(&self) -> &ModelConfig {
        &self.model.config
    }

    fn record(&self, backend: &mut dyn Backend) -> Recording {
        let (c, v) = (self.config().canvas_length, self.config().text.vocab_size);
        record(backend, &self.prompt, &self.cfg, c, v, &mut SeededRng::new(7))
    }
}

/// How a [`Perturbed`] backend changes the logits of every canvas forward.
#[derive(Debug, Clone, Copy)]
enum Perturbation {
    /// `scale` × a hash-based value in [−1, 1] on every logit (a fresh one per forward).
    Noise { scale: f32 },
    /// `amount` added to one token's logit in every row.
    Boost { token: usize, amount: f32 },
    /// Each row's two largest logits exchanged.
    SwapTopTwo,
    /// Every forward from the `n`th (0-based) on fails.
    FailFrom { n: usize },
}

/// The CPU backend with its canvas logits perturbed.
#[derive(Debug)]
struct Perturbed {
    inner: CpuBackend,
    perturbation: Perturbation,
    forwards: usize,
}

/// SplitMix64's output function: a well-mixed hash of `x`.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

impl Backend for Perturbed {
    fn name(&self) -> &'static str {
        "perturbed-cpu"
    }
    fn logits_tolerance(&self) -> f64 {
        self.inner.logits_tolerance()
    }
    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }
    fn reset(&mut self) -> Result<(), BoxError> {
        self.forwards = 0;
        self.inner.reset()
    }
    fn encode(&mut self, ids: &[u32]) -> Result<(), BoxError> {
        self.inner.encode(ids)
    }
    fn canvas_forward(&mut self, canvas: &[u32], sc: Option<&[f32]>, logits: &mut [f32]) -> Result<(), BoxError> {
        let forward = self.forwards;
        self.forwards += 1;
        if let Perturbation::FailFrom { n } = self.perturbation
            && forward >= n
        {
            return Err(format!("forward {forward} fails on purpose").into());
        }
        self.inner.canvas_forward(canvas, sc, logits)?;
        let v = self.vocab_size();
        match self.perturbation {
            Perturbation::Noise { scale } => {
                for (i, x) in logits.iter_mut().enumerate() {
                    let h = mix(((forward as u64) << 40) ^ i as u64);
                    let unit = (h >> 11) as f64 / (1u64 << 53) as f64; // [0, 1)
                    *x += scale * (2.0 * unit - 1.0) as f32;
                }
            }
            Perturbation::Boost { token, amount } => logits.chunks_exact_mut(v).for_each(|row| row[token] += amount),
            Perturbation::SwapTopTwo => {
                for row in logits.chunks_exact_mut(v) {
                    let first = dg_sampler::rows::argmax(row) as usize;
                    let second = (0..v).filter(|&i| i != first).max_by(|&a, &b| row[a].total_cmp(&row[b]).then(b.cmp(&a))).unwrap();
                    row.swap(first, second);
                }
            }
            Perturbation::FailFrom { .. } => {}
        }
        Ok(())
    }
}

const FIXTURE: &str = "tensor-core-shapes";
/// A realistic path tolerance: the F16 tensor-core path's normwise logits bound.
const ALLOWED: f64 = 3e-3;

fn perturbed(f: &Fixture, perturbation: Perturbation) -> Perturbed {
    Perturbed { inner: f.cpu(), perturbation, forwards: 0 }
}

#[test]
fn a_recorded_cpu_generation_repeats_and_equals_plain_generate() {
    let f = fixture(FIXTURE);
    let mut cpu = f.cpu();
    let first = f.record(&mut cpu);
    let second = f.record(&mut cpu);
    assert_eq!(first_divergence(&second, &first, f.config().text.vocab_size, 0.0), None);
    let (c, v) = (f.config().canvas_length, f.config().text.vocab_size);
    let steps = &first.steps;
    assert!(!steps.is_empty() && steps.iter().all(|s| s.uniforms.len() == c && s.scaled_logits.len() == c * v));
    // Recording the uniforms does not change the draws.
    cpu.reset().unwrap();
    let plain = generate(&mut AsModel(&mut cpu), &f.prompt, &f.cfg, c, v, &mut SeededRng::new(7), &mut NoHooks).unwrap();
    assert_eq!(first.outcome.as_ref().unwrap(), &plain.sequence);
    assert_eq!(steps.len(), plain.decoder_passes);
}

#[test]
fn small_logit_noise_gives_the_same_tokens_or_an_explained_divergence() {
    for name in [FIXTURE, "early-stop-eos", "sliding-long-prompt"] {
        let f = fixture(name);
        let reference = f.record(&mut f.cpu());
        let ours = f.record(&mut perturbed(&f, Perturbation::Noise { scale: 1e-3 }));
        match first_divergence(&ours, &reference, f.config().text.vocab_size, ALLOWED) {
            None => {
                eprintln!("{name}: 1e-3 logit noise: identical tokens");
                assert_eq!(ours.outcome, reference.outcome);
            }
            Some(d) => {
                eprintln!("{name}: 1e-3 logit noise: {d}");
                assert!(d.explained, "{name}: {d}");
            }
        }
    }
}

#[test]
fn a_large_logit_error_is_not_explained() {
    let f = fixture(FIXTURE);
    let v = f.config().text.vocab_size;
    let reference = f.record(&mut f.cpu());
    for perturbation in [Perturbation::Boost { token: 5, amount: 5.0 }, Perturbation::SwapTopTwo] {
        let ours = f.record(&mut perturbed(&f, perturbation));
        let d = first_divergence(&ours, &reference, v, ALLOWED).unwrap();
        eprintln!("{perturbation:?}: {d}");
        assert!(d.normwise.unwrap() > ALLOWED, "{perturbation:?}: {d}");
        assert!(!d.explained, "{perturbation:?}: {d}");
    }
}

#[test]
fn a_failed_generation_keeps_its_steps_and_parts_by_length() {
    let f = fixture(FIXTURE);
    let reference = f.record(&mut f.cpu());
    let ours = f.record(&mut perturbed(&f, Perturbation::FailFrom { n: 3 }));
    assert_eq!(ours.steps.len(), 3);
    let error = ours.outcome.as_ref().unwrap_err();
    assert!(error.contains("fails on purpose"), "{error}");
    let d = first_divergence(&ours, &reference, f.config().text.vocab_size, ALLOWED).unwrap();
    eprintln!("{d}");
    let (block, step) = (reference.steps[3].block, reference.steps[3].step);
    assert_eq!((d.kind, d.block, d.step), (DivergenceKind::Length, block, step));
    assert_eq!(d.reference, Decision::At { block, step });
    assert!(matches!(d.ours, Decision::Ended(Err(_))));
    assert!(!d.explained);
}

//! The resident step (`generate_resident`: forward and per-row work in the model) against the
//! host-logits step (`generate`): with the per-row work done by the sampler's own row functions
//! ([`HostRows`]), both must consume the same draws and produce the same tokens, stops and errors.

mod common;

use common::{C, FakeModel, V, cfg, draws, spec};
use dg_model::StoppingConfig;
use dg_sampler::{
    CategoricalRequest, Hooks, HostRows, InputError, NoHooks, RandomSource, Replay, ResidentModel, RowResult, SamplerError, SeededRng,
    StepInfo, generate, generate_resident,
};

/// One step's accepted flags, entropies, draft, canvas and scaled-logits length.
type StepTrace = (Vec<bool>, Vec<f32>, Vec<u32>, Vec<u32>, usize);

/// Every step's trace, for comparing the two paths step by step.
#[derive(Default)]
struct Trace(Vec<StepTrace>);

impl Hooks for Trace {
    fn on_step(&mut self, s: &StepInfo<'_>) {
        self.0.push((s.accepted.to_vec(), s.entropies.to_vec(), s.draft.to_vec(), s.canvas.to_vec(), s.scaled_logits.len()));
    }
}

#[test]
fn resident_replay_equals_host_replay() {
    let prompt = [5u32, 9, 2];
    let cfg = cfg(3, 4);
    let recorded = draws(3, 4, C, V, 1);
    let mut host_trace = Trace::default();
    let host = generate(&mut FakeModel::new(spec()), &prompt, &cfg, C, V, &mut Replay::new(recorded.clone()), &mut host_trace).unwrap();
    let mut model = HostRows::new(FakeModel::new(spec()), V);
    let mut replay = Replay::new(recorded);
    let mut trace = Trace::default();
    let resident = generate_resident(&mut model, &prompt, &cfg, C, V, &mut replay, &mut trace).unwrap();
    assert_eq!(resident, host);
    assert_eq!(replay.remaining(), 0);
    assert_eq!(trace.0.len(), host_trace.0.len());
    for (a, b) in trace.0.iter().zip(&host_trace.0) {
        assert_eq!((&a.0, &a.1, &a.2, &a.3), (&b.0, &b.1, &b.2, &b.3));
        assert_eq!((a.4, b.4), (0, C * V), "resident steps expose no scaled logits");
    }
    // The self-conditioning input of every step after a block's first is the previous step's
    // scaled logits, kept by the model.
    let host_model_calls = {
        let mut m = FakeModel::new(spec());
        generate(&mut m, &prompt, &cfg, C, V, &mut Replay::new(draws(3, 4, C, V, 1)), &mut NoHooks).unwrap();
        m.calls
    };
    assert_eq!(model.model.calls, host_model_calls);
}

#[test]
fn resident_seeded_equals_host_seeded_with_stopping() {
    let mut s = spec();
    s.peak_follows_canvas = false;
    let mut cfg = cfg(2, 6);
    cfg.stopping = Some(StoppingConfig { stability_threshold: 1, confidence_threshold: 10.0 });
    let prompt = [1u32, 2];
    for seed in 0..5 {
        let host = generate(&mut FakeModel::new(s.clone()), &prompt, &cfg, C, V, &mut SeededRng::new(seed), &mut NoHooks).unwrap();
        let resident = generate_resident(
            &mut HostRows::new(FakeModel::new(s.clone()), V),
            &prompt,
            &cfg,
            C,
            V,
            &mut SeededRng::new(seed),
            &mut NoHooks,
        )
        .unwrap();
        assert_eq!(resident, host, "seed {seed}");
        assert!(host.steps_per_canvas.iter().all(|&n| n < 6), "stopping fired: {:?}", host.steps_per_canvas);
    }
}

#[test]
fn resident_non_finite_logit_names_block_step_row_and_column() {
    let mut s = spec();
    s.nan_at = Some((2, 3, 17));
    let err = generate_resident(&mut HostRows::new(FakeModel::new(s), V), &[1], &cfg(1, 4), C, V, &mut SeededRng::new(0), &mut NoHooks)
        .unwrap_err();
    match err {
        SamplerError::Input(InputError::NonFiniteLogit { block: 0, step: 2, row: 3, column: 17, .. }) => {}
        other => panic!("unexpected error: {other}"),
    }
}

/// A device that returns an id past the vocabulary: the sampler rejects it by name.
struct BadDevice;

impl ResidentModel for BadDevice {
    type Error = std::io::Error;
    fn encode(&mut self, _ids: &[u32]) -> Result<(), Self::Error> {
        Ok(())
    }
    fn denoise_rows(
        &mut self,
        _c: &[u32],
        _sc: bool,
        _t: f32,
        _d: CategoricalRequest<'_>,
        rows: &mut [RowResult],
    ) -> Result<(), Self::Error> {
        rows.fill(RowResult { entropy: 0.5, argmax: 1, sampled: V as u32, non_finite: None });
        Ok(())
    }
}

#[test]
fn resident_sample_out_of_range_is_an_error() {
    let err = generate_resident(&mut BadDevice, &[1], &cfg(1, 2), C, V, &mut SeededRng::new(0), &mut NoHooks).unwrap_err();
    assert!(err.to_string().contains("categorical draw"), "{err}");
}

#[test]
fn seeded_request_consumes_the_same_uniforms_as_categorical() {
    let (mut a, mut b) = (SeededRng::new(3), SeededRng::new(3));
    let CategoricalRequest::Uniforms(u) = a.categorical_request(4, V).unwrap() else { panic!("uniforms expected") };
    let u = u.to_vec();
    let want: Vec<f64> = (0..4).map(|_| b.next_f64()).collect();
    assert_eq!(u, want);
    assert_eq!(a.next_u64(), b.next_u64(), "same state afterwards");
}

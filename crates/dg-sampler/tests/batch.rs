//! The batch driver with a fake model: every sequence of a batch gives exactly the tokens, steps,
//! hook calls and errors it gives alone (different prompt lengths, settings, stopping steps, EOS,
//! canvases; sequences admitted later, into freed slots), through both model kinds, with seeded and
//! replayed draws.

mod common;

use common::{C, FakeError, FakeModel, FakeSpec, V, cfg, draws, reference_generate, spec};
use dg_model::{GenerationConfig, StoppingConfig};
use dg_sampler::{
    AdmitError, Batch, BatchDenoiseModel, Finished, Generation, Hooks, HostCanvases, HostRows, InputError, PerSlot, RandomSource, Replay,
    SamplerError, SeededRng, SeqId, StepInfo, StopReason, SwapCache, generate, generate_resident,
};

/// The fake model's sequence state is the length of its cache.
impl SwapCache for FakeModel {
    type Cache = usize;
    type CacheError = FakeError;
    fn take_cache(&mut self) -> usize {
        std::mem::take(&mut self.cache_len)
    }
    fn put_cache(&mut self, cache: usize) -> Result<(), FakeError> {
        self.cache_len = cache;
        Ok(())
    }
}

/// What a step's hook saw: block, step, temperature, draft, next canvas, accepted count.
type StepSeen = (usize, usize, f32, Vec<u32>, Vec<u32>, usize);

/// Every hook call of one sequence.
#[derive(Debug, Default, PartialEq)]
struct Trace {
    steps: Vec<StepSeen>,
    canvases: Vec<(usize, Vec<u32>)>,
    /// Cancel after this many steps.
    cancel_after: Option<usize>,
}

impl Hooks for Trace {
    fn on_step(&mut self, s: &StepInfo<'_>) {
        self.steps.push((s.block, s.step, s.temperature, s.draft.to_vec(), s.canvas.to_vec(), s.num_accepted));
    }
    fn on_canvas(&mut self, block: usize, tokens: &[u32]) {
        self.canvases.push((block, tokens.to_vec()));
    }
    fn should_stop(&mut self) -> bool {
        self.cancel_after.is_some_and(|n| self.steps.len() >= n)
    }
}

/// One sequence of a test: its prompt, settings and seed.
#[derive(Clone)]
struct Job {
    prompt: Vec<u32>,
    cfg: GenerationConfig,
    seed: u64,
    cancel_after: Option<usize>,
}

fn job(prompt_len: usize, cfg: GenerationConfig, seed: u64) -> Job {
    Job { prompt: (0..prompt_len as u32).map(|i| 1 + (i * 5) % (V as u32 - 1)).collect(), cfg, seed, cancel_after: None }
}

fn stopping(stability_threshold: usize) -> Option<StoppingConfig> {
    Some(StoppingConfig { stability_threshold, confidence_threshold: 10.0 })
}

/// A model where every sequence can stop early (the peak ignores the canvas) and row 2 turns to
/// EOS id 3 once the cache holds 14 tokens.
fn eos_spec() -> FakeSpec {
    FakeSpec { eos: Some((2, 3, 14)), peak_follows_canvas: false, ..spec() }
}

/// Sequences with different prompt lengths, canvases, stopping and EOS handling.
fn mixed_jobs() -> Vec<Job> {
    let with_eos = |c: GenerationConfig| GenerationConfig { eos_token_ids: vec![3], ..c };
    vec![
        // EOS in its first canvas (the prompt alone fills 14 positions): leaves first.
        job(15, with_eos(cfg(4, 4)), 1),
        // Every step of 3 canvases, no EOS id.
        job(3, cfg(3, 4), 2),
        // Adaptive stopping after 2 steps; EOS in its second canvas (8 + 6 = 14).
        job(8, GenerationConfig { stopping: stopping(1), ..with_eos(cfg(4, 5)) }, 3),
        // Adaptive stopping after 3 steps; one canvas only.
        job(1, GenerationConfig { stopping: stopping(2), ..cfg(1, 6) }, 4),
    ]
}

fn alone(spec: &FakeSpec, j: &Job) -> (Result<Generation, String>, Trace) {
    let mut trace = Trace { cancel_after: j.cancel_after, ..Trace::default() };
    let g = generate(&mut FakeModel::new(spec.clone()), &j.prompt, &j.cfg, C, V, &mut SeededRng::new(j.seed), &mut trace);
    (g.map_err(|e| e.to_string()), trace)
}

fn alone_resident(spec: &FakeSpec, j: &Job) -> (Result<Generation, String>, Trace) {
    let mut trace = Trace { cancel_after: j.cancel_after, ..Trace::default() };
    let mut model = HostRows::new(FakeModel::new(spec.clone()), V);
    let g = generate_resident(&mut model, &j.prompt, &j.cfg, C, V, &mut SeededRng::new(j.seed), &mut trace);
    (g.map_err(|e| e.to_string()), trace)
}

type Results = Vec<(SeqId, Result<Generation, String>, Trace)>;

fn collect<R, E: std::error::Error>(batch: &mut Batch<R, Trace, E>, out: &mut Results) {
    for f in batch.drain_finished() {
        out.push((f.id, f.result.map_err(|e| e.to_string()), f.hooks));
    }
}

fn admit<R: RandomSource, E: std::error::Error>(batch: &mut Batch<R, Trace, E>, j: &Job, rng: R) -> SeqId {
    batch
        .admit(&j.prompt, &j.cfg, rng, Trace { cancel_after: j.cancel_after, ..Trace::default() })
        .unwrap_or_else(|r| panic!("{}", r.reason))
}

/// Runs `jobs` through one batch of `capacity`: as many as fit at first, each further one as soon
/// as a slot is free (at the step after a sequence left); results in job order.
fn batched(
    capacity: usize,
    jobs: &[Job],
    mut step: impl FnMut(&mut Batch<SeededRng, Trace, FakeError>) -> dg_sampler::StepReport,
) -> Vec<(Result<Generation, String>, Trace)> {
    let mut batch = Batch::new(C, V, capacity).unwrap();
    let mut ids = vec![];
    let mut out = vec![];
    let mut pending = jobs.iter();
    loop {
        while batch.has_room() {
            let Some(j) = pending.next() else { break };
            ids.push(admit(&mut batch, j, SeededRng::new(j.seed)));
        }
        if batch.running() == 0 {
            break;
        }
        let report = step(&mut batch);
        assert!(report.forwarded + report.finished >= 1, "a step with nothing to do");
        collect(&mut batch, &mut out);
    }
    ids.iter().map(|id| out.iter().position(|o| o.0 == *id).map(|i| (out[i].1.clone(), std::mem::take(&mut out[i].2))).unwrap()).collect()
}

#[test]
fn a_batch_gives_each_sequence_its_tokens_alone() {
    let spec = eos_spec();
    let jobs = mixed_jobs();
    let mut model = PerSlot::new(FakeModel::new(spec.clone()));
    let got = batched(jobs.len(), &jobs, |b| b.step(&mut model));
    let stops: Vec<_> = got.iter().map(|g| g.0.as_ref().unwrap().stop_reason).collect();
    assert_eq!(stops, [StopReason::Eos, StopReason::AllCanvases, StopReason::Eos, StopReason::AllCanvases]);
    let steps: Vec<_> = got.iter().map(|g| g.0.as_ref().unwrap().steps_per_canvas.clone()).collect();
    assert_eq!(steps, [vec![4], vec![4, 4, 4], vec![2, 2], vec![3]], "different stopping steps and canvases");
    for (i, (j, g)) in jobs.iter().zip(&got).enumerate() {
        assert_eq!(*g, alone(&spec, j), "sequence {i}");
    }
}

#[test]
fn a_batch_on_a_resident_model_gives_each_sequence_its_tokens_alone() {
    let spec = eos_spec();
    let jobs = mixed_jobs();
    let mut model = PerSlot::new(HostRows::new(FakeModel::new(spec.clone()), V));
    let mut batch: Batch<SeededRng, Trace, _> = Batch::new(C, V, jobs.len()).unwrap();
    let ids: Vec<SeqId> = jobs.iter().map(|j| admit(&mut batch, j, SeededRng::new(j.seed))).collect();
    let mut out = vec![];
    while batch.running() > 0 {
        batch.step_resident(&mut model);
        for f in batch.drain_finished() {
            out.push((f.id, f.result.map_err(|e| e.to_string()), f.hooks));
        }
    }
    for (i, (j, id)) in jobs.iter().zip(&ids).enumerate() {
        let (_, g, trace) = out.iter().find(|o| o.0 == *id).unwrap();
        let want = alone_resident(&spec, j);
        assert_eq!((g, trace), (&want.0, &want.1), "sequence {i}");
        // The host-logits path decides the same.
        assert_eq!(g.as_ref().unwrap().sequence, alone(&spec, j).0.unwrap().sequence, "sequence {i}: resident and host differ");
    }
}

#[test]
fn sequences_admitted_later_into_freed_slots_give_their_tokens_alone() {
    let spec = eos_spec();
    let mut jobs = mixed_jobs();
    jobs.extend([job(2, cfg(2, 3), 9), job(11, GenerationConfig { stopping: stopping(1), ..cfg(2, 4) }, 10)]);
    // Two slots for six sequences: each later one starts when a slot frees, mid-block for the
    // others, in a slot whose cache held another sequence.
    let mut model = PerSlot::new(FakeModel::new(spec.clone()));
    let got = batched(2, &jobs, |b| b.step(&mut model));
    for (i, (j, g)) in jobs.iter().zip(&got).enumerate() {
        assert_eq!(*g, alone(&spec, j), "sequence {i}");
    }
}

#[test]
fn a_sequence_admitted_at_a_block_boundary_of_the_others_gives_its_tokens_alone() {
    let spec = spec();
    let first = [job(4, cfg(3, 3), 1), job(9, cfg(3, 3), 2)];
    let late = job(6, cfg(2, 3), 3);
    let mut model = PerSlot::new(FakeModel::new(spec.clone()));
    let mut batch = Batch::new(C, V, 3).unwrap();
    let mut ids: Vec<SeqId> = first.iter().map(|j| admit(&mut batch, j, SeededRng::new(j.seed))).collect();
    let mut out = vec![];
    for _ in 0..3 {
        // The others' first block: 3 steps.
        assert_eq!(batch.step(&mut model).forwarded, 2);
    }
    ids.push(admit(&mut batch, &late, SeededRng::new(late.seed)));
    while batch.running() > 0 {
        batch.step(&mut model);
        collect(&mut batch, &mut out);
    }
    for (j, id) in first.iter().chain([&late]).zip(&ids) {
        let o = out.iter().find(|o| o.0 == *id).unwrap();
        assert_eq!((&o.1, &o.2), (&alone(&spec, j).0, &alone(&spec, j).1));
    }
}

#[test]
fn replayed_draws_give_the_reference_tokens_per_sequence() {
    let spec = FakeSpec { eos: Some((2, 3, 14)), ..spec() };
    let jobs = [
        (job(3, cfg(3, 4), 0), 3, 4),
        (job(12, GenerationConfig { eos_token_ids: vec![3], ..cfg(3, 2) }, 0), 2, 2),
        (job(5, cfg(1, 5), 0), 1, 5),
    ];
    let mut model = PerSlot::new(FakeModel::new(spec.clone()));
    let mut batch: Batch<Replay, Trace, FakeError> = Batch::new(C, V, 3).unwrap();
    let recorded: Vec<_> = jobs.iter().enumerate().map(|(i, (_, blocks, steps))| draws(*blocks, *steps, C, V, 40 + i as u64)).collect();
    let ids: Vec<SeqId> = jobs.iter().zip(&recorded).map(|((j, ..), r)| admit(&mut batch, j, Replay::new(r.clone()))).collect();
    let mut finished: Vec<Finished<Replay, Trace, FakeError>> = vec![];
    while batch.running() > 0 {
        batch.step(&mut model);
        finished.extend(batch.drain_finished());
    }
    for (((j, ..), r), id) in jobs.iter().zip(&recorded).zip(&ids) {
        let f = finished.iter().find(|f| f.id == *id).unwrap();
        let want = reference_generate(&spec, &j.prompt, &j.cfg, C, r);
        let g = f.result.as_ref().unwrap();
        assert_eq!((&g.sequence, &g.steps_per_canvas), (&want.sequence, &want.steps));
        assert_eq!((f.rng.consumed(), f.rng.remaining()), (want.draws_used, 0), "every recorded draw, in order");
    }
}

#[test]
fn a_failing_sequence_leaves_and_the_others_continue() {
    // The fourth decoder call (the second sequence's second step) gets a NaN.
    let spec = FakeSpec { nan_at: Some((3, 1, 7)), ..spec() };
    let jobs = [job(3, cfg(2, 3), 1), job(5, cfg(2, 3), 2)];
    let mut model = PerSlot::new(FakeModel::new(spec.clone()));
    let got = batched(2, &jobs, |b| b.step(&mut model));
    let e = got[1].0.as_ref().unwrap_err();
    assert!(e.contains("non-finite logit at block 0, step 1, row 1, column 7"), "{e}");
    let clean = FakeSpec { nan_at: None, ..spec };
    assert_eq!(got[0], alone(&clean, &jobs[0]));
}

#[test]
fn a_cancelled_sequence_leaves_and_the_others_continue() {
    let jobs = [job(3, cfg(3, 3), 1), Job { cancel_after: Some(4), ..job(5, cfg(3, 3), 2) }, job(2, cfg(2, 3), 3)];
    let mut model = PerSlot::new(FakeModel::new(spec()));
    let got = batched(3, &jobs, |b| b.step(&mut model));
    let cancelled = got[1].0.as_ref().unwrap();
    assert_eq!((cancelled.stop_reason, &cancelled.steps_per_canvas[..]), (StopReason::Cancelled, &[3, 1][..]));
    for (i, (j, g)) in jobs.iter().zip(&got).enumerate() {
        assert_eq!(*g, alone(&spec(), j), "sequence {i}");
    }
}

/// A batched model whose every call fails after `ok` forwards.
struct Broken {
    inner: PerSlot<FakeModel>,
    ok: usize,
}

impl BatchDenoiseModel for Broken {
    type Error = FakeError;
    fn encode(&mut self, slot: usize, ids: &[u32]) -> Result<(), FakeError> {
        self.inner.encode(slot, ids)
    }
    fn canvas_forward(&mut self, batch: &mut HostCanvases<'_>) -> Result<(), FakeError> {
        if self.ok == 0 {
            return Err(FakeError);
        }
        self.ok -= 1;
        self.inner.canvas_forward(batch)
    }
    fn release(&mut self, slot: usize) {
        self.inner.release(slot)
    }
}

#[test]
fn a_failed_batched_forward_fails_every_canvas_in_it() {
    let mut model = Broken { inner: PerSlot::new(FakeModel::new(spec())), ok: 2 };
    let jobs = [job(3, cfg(2, 3), 1), job(5, cfg(2, 3), 2)];
    let got = batched(2, &jobs, |b| b.step(&mut model));
    let errors: Vec<String> = got.iter().map(|g| g.0.as_ref().unwrap_err().clone()).collect();
    assert_eq!(errors[0], "model canvas forward (step 2) failed at block 0");
    assert!(errors[1].contains("batched canvas forward (step 2) failed at block 0"), "{}", errors[1]);
}

#[test]
fn admission_checks_room_and_inputs_and_hands_back_the_random_source() {
    let mut batch: Batch<SeededRng, Trace, FakeError> = Batch::new(C, V, 1).unwrap();
    let rejected = batch.admit(&[], &cfg(1, 2), SeededRng::new(3), Trace::default()).unwrap_err();
    assert_eq!(rejected.reason, AdmitError::Input(InputError::EmptyPrompt));
    let mut rng = rejected.rng;
    assert_eq!(rng.next_u64(), SeededRng::new(3).next_u64(), "the source comes back unused");
    let bad = batch.admit(&[1, V as u32], &cfg(1, 2), SeededRng::new(3), Trace::default()).unwrap_err();
    assert!(matches!(bad.reason, AdmitError::Input(InputError::TokenOutOfRange { what: "prompt", position: 1, .. })));
    batch.admit(&[1], &cfg(1, 2), SeededRng::new(3), Trace::default()).unwrap();
    let full = batch.admit(&[1], &cfg(1, 2), SeededRng::new(4), Trace::default()).unwrap_err();
    assert_eq!(full.reason, AdmitError::Full { capacity: 1 });
    assert_eq!(full.reason.to_string(), "the batch is full: 1 sequences are running");
    assert!(matches!(Batch::<SeededRng, Trace, FakeError>::new(C, V, 0), Err(InputError::Shape(_))));
    assert!(matches!(SamplerError::<FakeError>::from(InputError::EmptyPrompt), SamplerError::Input(_)));
}

#[test]
fn abandoning_a_batch_frees_every_slot_and_hands_back_each_sequence() {
    let spec = spec();
    let jobs = [job(3, cfg(2, 3), 1), job(5, cfg(2, 3), 2)];
    let mut model = PerSlot::new(FakeModel::new(spec.clone()));
    let mut batch: Batch<SeededRng, Trace, FakeError> = Batch::new(C, V, 2).unwrap();
    let ids: Vec<SeqId> = jobs.iter().map(|j| admit(&mut batch, j, SeededRng::new(j.seed))).collect();
    batch.step(&mut model);
    let taken = batch.abandon();
    assert_eq!(taken.iter().map(|t| t.0).collect::<Vec<_>>(), ids);
    assert!(taken.iter().all(|t| t.2.steps.len() == 1), "each sequence's hooks saw its one step");
    assert_eq!((batch.running(), batch.has_room(), batch.drain_finished().count()), (0, true, 0));
    // The batch goes on: a sequence admitted after (the model's slots reset) gives its tokens alone.
    let mut model = PerSlot::new(FakeModel::new(spec.clone()));
    let id = admit(&mut batch, &jobs[1], SeededRng::new(jobs[1].seed));
    let mut out = vec![];
    while batch.running() > 0 {
        batch.step(&mut model);
        collect(&mut batch, &mut out);
    }
    assert_eq!(out.len(), 1);
    assert_eq!((out[0].0, &out[0].1), (id, &alone(&spec, &jobs[1]).0));
}

/// Counts encodes: block and ids per call.
#[derive(Default)]
struct Encodes(Vec<(usize, usize)>);

impl Hooks for Encodes {
    fn on_encode(&mut self, block: usize, tokens: usize, _took: std::time::Duration) {
        self.0.push((block, tokens));
    }
}

#[test]
fn every_encode_reaches_the_hooks_with_its_block_and_length() {
    let mut hooks = Encodes::default();
    let j = job(5, cfg(3, 2), 1);
    generate(&mut FakeModel::new(spec()), &j.prompt, &j.cfg, C, V, &mut SeededRng::new(1), &mut hooks).unwrap();
    // The prompt, then the first two canvases (the last one is never encoded).
    assert_eq!(hooks.0, [(0, 5), (1, C), (2, C)]);
}

#[test]
fn free_slot_is_the_slot_admit_takes_and_a_slot_state_moves_between_slots() {
    let mut batch: Batch<SeededRng, Trace, FakeError> = Batch::new(C, V, 2).unwrap();
    assert_eq!(batch.free_slot(), Some(0));
    admit(&mut batch, &job(3, cfg(2, 3), 1), SeededRng::new(1));
    assert_eq!(batch.free_slot(), Some(1));
    admit(&mut batch, &job(4, cfg(2, 3), 2), SeededRng::new(2));
    assert_eq!(batch.free_slot(), None);
    // A slot's state (the fake's cache length) comes out whole and continues in another slot.
    let mut model = PerSlot::new(FakeModel::new(spec()));
    BatchDenoiseModel::encode(&mut model, 0, &[1, 2, 3]).unwrap();
    BatchDenoiseModel::encode(&mut model, 1, &[4]).unwrap();
    let state = model.take_slot(0);
    assert_eq!((state, model.take_slot(0)), (Some(3), None), "the slot is left empty");
    model.put_slot(1, 3);
    BatchDenoiseModel::encode(&mut model, 1, &[5, 6]).unwrap();
    assert_eq!(model.take_slot(1), Some(5), "slot 1 continued the state put there, not its own");
    assert_eq!(model.model().cache_len, 0);
}

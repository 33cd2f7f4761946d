//! Batched generation on the CPU with the committed fixtures: in one `dg_sampler::Batch` over one
//! `CpuModel` (each sequence in its own KV cache through `PerSlot`), every sequence gives exactly
//! the tokens it gives alone: the reference's own prompt with the draws transformers recorded (its
//! sequence is the reference's), and seeded sequences with other prompt lengths (shorter, and
//! longer than the sliding window), fewer canvases, adaptive stopping off, and one admitted when
//! another leaves. On the GPU the same batch runs as one forward for all its canvases
//! (`GpuModel`'s `BatchResidentModel`, its vocabulary-sized buffers in groups of canvases), and each
//! sequence still gets the tokens the single-sequence GPU model gives it alone; a batch whose
//! sequences stay creates GPU objects only at the steps where their blocks start.

use dg_cpu::CpuModel;
use dg_gpu::Instrumentation;
use dg_model::{GenerationConfig, ModelDir, StoppingConfig};
use dg_parity::reference::Reference;
use dg_parity::replay::replay_config;
use dg_parity::testing::{fixture, test_context};
use dg_sampler::{
    Batch, CategoricalRequest, DrawError, Generation, HostRows, NoHooks, PerSlot, RandomSource, Replay, RowDistributions, SeededRng, SeqId,
    StepReport, StopReason, generate, generate_resident,
};

/// A sequence's draws: recorded by the reference, or seeded.
enum Draws {
    Seeded(SeededRng),
    Replayed(Replay),
}

impl Draws {
    fn source(&mut self) -> &mut dyn RandomSource {
        match self {
            Draws::Seeded(r) => r,
            Draws::Replayed(r) => r,
        }
    }
}

impl RandomSource for Draws {
    fn uniform_tokens(&mut self, vocab_size: usize, out: &mut [u32]) -> Result<(), DrawError> {
        self.source().uniform_tokens(vocab_size, out)
    }
    fn categorical(&mut self, dists: &RowDistributions<'_>, out: &mut [u32]) -> Result<(), DrawError> {
        self.source().categorical(dists, out)
    }
    fn categorical_request(&mut self, rows: usize, vocab_size: usize) -> Result<CategoricalRequest<'_>, DrawError> {
        self.source().categorical_request(rows, vocab_size)
    }
    fn finish(&mut self) -> Result<(), DrawError> {
        self.source().finish()
    }
}

struct Setup {
    name: &'static str,
    dir: ModelDir,
    reference: Reference,
    prompt: Vec<u32>,
    cfg: GenerationConfig,
}

fn setup(name: &'static str) -> Setup {
    let path = fixture(name);
    let reference = Reference::open(&path).unwrap();
    let dir = ModelDir::open(&path).unwrap();
    let cfg = replay_config(&reference, &dir.generation, &dir.config).unwrap();
    Setup { name, prompt: reference.ids("prompt_ids").unwrap(), reference, dir, cfg }
}

/// One sequence: its prompt, settings and draws (`None`: the reference's recorded draws).
struct Job {
    prompt: Vec<u32>,
    cfg: GenerationConfig,
    seed: Option<u64>,
}

impl Job {
    fn draws(&self, s: &Setup) -> Draws {
        match self.seed {
            Some(seed) => Draws::Seeded(SeededRng::new(seed)),
            None => Draws::Replayed(Replay::new(s.reference.draws().unwrap())),
        }
    }
}

/// The reference's run, and seeded sequences that differ from it and from each other.
fn jobs(s: &Setup) -> Vec<Job> {
    let (c, v) = (s.dir.config.canvas_length, s.dir.config.text.vocab_size as u32);
    let eager = StoppingConfig { stability_threshold: 0, confidence_threshold: 1e3 };
    let longer: Vec<u32> = s.prompt.iter().copied().chain((0..19).map(|i| (i * 7 + 3) % v)).collect();
    vec![
        Job { prompt: s.prompt.clone(), cfg: s.cfg.clone(), seed: None },
        Job { prompt: s.prompt[..3].to_vec(), cfg: s.cfg.clone(), seed: Some(7) },
        // One canvas: leaves while the others continue.
        Job { prompt: longer, cfg: GenerationConfig { max_new_tokens: c, ..s.cfg.clone() }, seed: Some(8) },
        // Every step of every canvas.
        Job { prompt: s.prompt.repeat(2), cfg: GenerationConfig { stopping: None, ..s.cfg.clone() }, seed: Some(9) },
        // Stops each canvas after its first step.
        Job { prompt: s.prompt[2..].to_vec(), cfg: GenerationConfig { stopping: Some(eager), ..s.cfg.clone() }, seed: Some(10) },
    ]
}

fn cpu(s: &Setup) -> CpuModel {
    CpuModel::new(s.dir.config.clone(), s.dir.load_weights().unwrap())
}

/// `jobs` through one batch of `capacity` sequences (the rest admitted as slots free), stepped by
/// `step`; the generations in job order.
fn batched<E: std::error::Error + 'static>(
    s: &Setup,
    jobs: &[Job],
    capacity: usize,
    mut step: impl FnMut(&mut Batch<Draws, NoHooks, E>),
) -> Vec<Generation> {
    let (c, v) = (s.dir.config.canvas_length, s.dir.config.text.vocab_size);
    let mut batch = Batch::new(c, v, capacity).unwrap();
    let (mut ids, mut finished) = (Vec::<SeqId>::new(), vec![]);
    let mut pending = jobs.iter();
    loop {
        while batch.has_room() {
            let Some(j) = pending.next() else { break };
            ids.push(batch.admit(&j.prompt, &j.cfg, j.draws(s), NoHooks).unwrap_or_else(|r| panic!("{}", r.reason)));
        }
        if batch.running() == 0 {
            break;
        }
        step(&mut batch);
        finished.extend(batch.drain_finished().map(|f| (f.id, f.result.unwrap())));
    }
    ids.iter().map(|id| finished.iter().find(|f| f.0 == *id).unwrap().1.clone()).collect()
}

#[test]
fn a_cpu_batch_gives_each_sequence_its_tokens_alone() {
    for name in ["early-stop-eos", "sliding-long-prompt"] {
        let s = setup(name);
        let jobs = jobs(&s);
        let (c, v) = (s.dir.config.canvas_length, s.dir.config.text.vocab_size);
        let mut model = PerSlot::new(cpu(&s));
        let got = batched(&s, &jobs, 3, |b| {
            b.step(&mut model);
        });
        assert_eq!(got[0].sequence, s.reference.ids("gen_sequences").unwrap(), "{name}: the replayed sequence is the reference's");
        let mut alone_model = cpu(&s);
        for (i, (j, g)) in jobs.iter().zip(&got).enumerate() {
            alone_model.reset();
            let want = generate(&mut alone_model, &j.prompt, &j.cfg, c, v, &mut j.draws(&s), &mut NoHooks).unwrap();
            assert_eq!(*g, want, "{name}: sequence {i} in the batch and alone");
        }
        // The sequences really differ in how they end and how long their canvases take.
        let canvases: Vec<usize> = got.iter().map(|g| g.steps_per_canvas.len()).collect();
        assert!(canvases.contains(&1) && canvases.iter().any(|&n| n > 1), "{name}: {canvases:?}");
        let first_steps: Vec<usize> = got.iter().map(|g| g.steps_per_canvas[0]).collect();
        assert!(first_steps.iter().any(|&n| n < s.cfg.max_denoising_steps), "{name}: {first_steps:?}");
        assert!(first_steps.contains(&s.cfg.max_denoising_steps), "{name}: {first_steps:?}");
        if s.name == "early-stop-eos" {
            assert_eq!(got[0].stop_reason, StopReason::Eos, "{name}");
        }
    }
}

#[test]
fn a_resident_cpu_batch_gives_each_sequence_its_tokens_alone() {
    let s = setup("early-stop-eos");
    let jobs = jobs(&s);
    let (c, v) = (s.dir.config.canvas_length, s.dir.config.text.vocab_size);
    let mut model = PerSlot::new(HostRows::new(cpu(&s), v));
    let got = batched(&s, &jobs, 2, |b| {
        b.step_resident(&mut model);
    });
    assert_eq!(got[0].sequence, s.reference.ids("gen_sequences").unwrap(), "the replayed sequence is the reference's");
    let mut alone_model = HostRows::new(cpu(&s), v);
    for (i, (j, g)) in jobs.iter().zip(&got).enumerate() {
        alone_model.model.reset();
        let want = generate_resident(&mut alone_model, &j.prompt, &j.cfg, c, v, &mut j.draws(&s), &mut NoHooks).unwrap();
        assert_eq!(*g, want, "sequence {i} in the batch and alone");
    }
}

/// Cache rows enough for every job of `jobs` (its prompt and all its canvases).
fn max_context(s: &Setup, jobs: &[Job]) -> usize {
    let c = s.dir.config.canvas_length;
    jobs.iter().map(|j| j.prompt.len() + j.cfg.max_new_tokens.next_multiple_of(c)).max().unwrap()
}

#[test]
fn a_gpu_batch_runs_its_canvases_in_one_forward_and_gives_each_sequence_its_tokens_alone() {
    let test = "a_gpu_batch_runs_its_canvases_in_one_forward_and_gives_each_sequence_its_tokens_alone";
    if test_context(test).is_none() {
        return;
    }
    let ctx = || test_context(test).unwrap();
    for name in ["early-stop-eos", "sliding-long-prompt"] {
        let s = setup(name);
        let jobs = jobs(&s);
        let (c, v) = (s.dir.config.canvas_length, s.dir.config.text.vocab_size);
        let weights = s.dir.load_weights().unwrap();
        let context = max_context(&s, &jobs);
        let slots = 3;
        // The vocabulary-sized buffers in groups of two canvases (a group of two and one of one),
        // as on a device whose binding holds two canvases' logits.
        // Its sliding caches hold the window and one forward's rows (encoder chunks of those
        // rows; the model alone encodes in the same chunks), so that each slot's window moves
        // to row 0 as its sequence grows.
        let grouped = {
            let mut opts = dg_gpu::GpuOptions::from_env().unwrap();
            opts.tuning.vocab_binding = Some(dg_gpu::canvas_vocab_bytes(&s.dir.config));
            opts.tuning.prefill_rows = Some(1);
            dg_gpu::GpuContext::new(&opts).unwrap()
        };
        let mut model = dg_gpu::GpuModel::load(
            grouped,
            &s.dir.config,
            &weights,
            dg_gpu::ModelOptions::new(context).slots(slots).format(dg_gpu::WeightFormat::F32),
        )
        .unwrap();
        assert_eq!(model.vocab_group(), 2, "{name}: canvases to a vocabulary buffer");
        assert!(model.sliding_positions() < context, "{name}: {} sliding positions, context {context}", model.sliding_positions());
        let mut reports: Vec<StepReport> = vec![];
        let got = batched(&s, &jobs, slots, |b| {
            reports.push(b.step_resident(&mut model));
        });
        assert_eq!(got[0].sequence, s.reference.ids("gen_sequences").unwrap(), "{name}: the replayed sequence is the reference's");
        let mut alone_model = dg_gpu::GpuModel::load(ctx(), &s.dir.config, &weights, dg_gpu::ModelOptions::new(context)).unwrap();
        alone_model.set_prefill_chunk(slots * c);
        for (i, (j, g)) in jobs.iter().zip(&got).enumerate() {
            alone_model.reset();
            let want = generate_resident(&mut alone_model, &j.prompt, &j.cfg, c, v, &mut j.draws(&s), &mut NoHooks).unwrap();
            assert_eq!(*g, want, "{name}: sequence {i} in the GPU batch and alone");
        }
        // Several canvases went through one forward, the batch was full, and sequences ended
        // while others continued.
        let most = reports.iter().map(|r| r.forwarded).max().unwrap();
        assert_eq!(most, slots, "{name}: the largest forward");
        assert!(reports.iter().any(|r| r.finished > 0 && r.forwarded > 1), "{name}: no sequence ended beside others");
    }
}

#[test]
fn a_gpu_batch_refuses_a_slot_it_does_not_have() {
    let test = "a_gpu_batch_refuses_a_slot_it_does_not_have";
    let Some(ctx) = test_context(test) else { return };
    let s = setup("early-stop-eos");
    let weights = s.dir.load_weights().unwrap();
    let mut model =
        dg_gpu::GpuModel::load(ctx, &s.dir.config, &weights, dg_gpu::ModelOptions::new(64).slots(2).format(dg_gpu::WeightFormat::F32))
            .unwrap();
    let e = dg_sampler::BatchResidentModel::encode(&mut model, 2, &s.prompt).unwrap_err().to_string();
    assert!(e.contains("slot 2") && e.contains("slots the model was loaded with"), "{e}");
    // A batch larger than the model's slots fails its forward, and every sequence in it says so.
    let jobs = jobs(&s);
    let (c, v) = (s.dir.config.canvas_length, s.dir.config.text.vocab_size);
    let mut batch = Batch::new(c, v, 3).unwrap();
    for j in &jobs[..3] {
        batch.admit(&j.prompt, &j.cfg, j.draws(&s), NoHooks).unwrap_or_else(|r| panic!("{}", r.reason));
    }
    while batch.running() > 0 {
        batch.step_resident(&mut model);
    }
    let results: Vec<_> = batch.drain_finished().map(|f| f.result).collect();
    assert!(results.iter().any(|r| r.as_ref().is_err_and(|e| format!("{e:?}").contains("slot 2"))), "{results:?}");
}

#[test]
fn a_gpu_batch_creates_no_gpu_object_between_its_block_boundaries() {
    let test = "a_gpu_batch_creates_no_gpu_object_between_its_block_boundaries";
    let Some(ctx) = test_context(test) else { return };
    let counters = ctx.counters();
    let s = setup("sliding-long-prompt");
    let (c, v) = (s.dir.config.canvas_length, s.dir.config.text.vocab_size);
    // Every block runs all its steps and no EOS ends a sequence early, so the three sequences'
    // blocks start at the same steps: 3 canvases of 6 steps each.
    let steps = 6;
    let cfg =
        GenerationConfig { stopping: None, eos_token_ids: vec![], max_denoising_steps: steps, max_new_tokens: 3 * c, ..s.cfg.clone() };
    let prompts = [s.prompt.clone(), s.prompt[..3].to_vec(), s.prompt.repeat(2)];
    let jobs: Vec<Job> = prompts.into_iter().zip(1..).map(|(prompt, seed)| Job { prompt, cfg: cfg.clone(), seed: Some(seed) }).collect();
    let weights = s.dir.load_weights().unwrap();
    let mut model = dg_gpu::GpuModel::load(
        ctx,
        &s.dir.config,
        &weights,
        dg_gpu::ModelOptions::new(max_context(&s, &jobs)).slots(3).format(dg_gpu::WeightFormat::F32),
    )
    .unwrap();
    let mut batch = Batch::new(c, v, 3).unwrap();
    for j in &jobs {
        batch.admit(&j.prompt, &j.cfg, j.draws(&s), NoHooks).unwrap_or_else(|r| panic!("{}", r.reason));
    }
    let mut step = 0;
    let mut created_at = vec![];
    while batch.running() > 0 {
        let before = counters.get();
        let report = batch.step_resident(&mut model);
        assert_eq!(report.forwarded, 3, "step {step}: the sequences run together");
        if counters.get() != before {
            created_at.push(step);
        }
        step += 1;
    }
    let results: Vec<Generation> = batch.drain_finished().map(|f| f.result.unwrap()).collect();
    assert!(results.iter().all(|g| g.steps_per_canvas == [steps; 3]), "{results:?}");
    // Objects (plans, and the first steps' buffers) only at the blocks' first steps.
    assert_eq!(step, 3 * steps);
    assert!(created_at.iter().all(|k| k % steps == 0), "GPU objects created at steps {created_at:?} (blocks start every {steps})");
    assert!(created_at.contains(&0), "nothing created at the first step? {created_at:?}");
}

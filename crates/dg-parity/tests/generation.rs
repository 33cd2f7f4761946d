//! Generation-level properties on the committed fixtures: seeded runs repeat exactly on each
//! backend, the CPU and GPU backends agree, and a GPU generation creates no buffer, bind group or
//! pipeline after its first denoising step (over a 48-step block).

use std::sync::Arc;

use dg_cpu::CpuModel;
use dg_gpu::{Counters, Created};
use dg_model::{GenerationConfig, ModelDir};
use dg_parity::checks::Backend;
use dg_parity::cpu::CpuBackend;
use dg_parity::gpu::GpuBackend;
use dg_parity::reference::Reference;
use dg_parity::replay::{AsModel, replay_config};
use dg_parity::testing::{fixture, test_context};
use dg_sampler::{Hooks, NoHooks, SeededRng, StepInfo, generate};

struct Setup {
    dir: ModelDir,
    prompt: Vec<u32>,
    cfg: GenerationConfig,
}

fn setup(name: &str) -> Setup {
    let path = fixture(name);
    let reference = Reference::open(&path).unwrap();
    let dir = ModelDir::open(&path).unwrap();
    let cfg = replay_config(&reference, &dir.generation, &dir.config).unwrap();
    Setup { prompt: reference.ids("prompt_ids").unwrap(), dir, cfg }
}

fn run(backend: &mut dyn Backend, s: &Setup, seed: u64, hooks: &mut dyn Hooks) -> Vec<u32> {
    let (c, v) = (s.dir.config.canvas_length, s.dir.config.text.vocab_size);
    backend.reset().unwrap();
    let g = generate(&mut AsModel(backend), &s.prompt, &s.cfg, c, v, &mut SeededRng::new(seed), hooks).unwrap();
    g.sequence
}

fn cpu(s: &Setup) -> CpuBackend {
    CpuBackend(CpuModel::new(s.dir.config.clone(), s.dir.load_weights().unwrap()))
}

#[test]
fn seeded_cpu_generation_repeats() {
    for name in ["sliding-long-prompt", "early-stop-eos"] {
        let s = setup(name);
        let mut b = cpu(&s);
        let first = run(&mut b, &s, 7, &mut NoHooks);
        assert_eq!(first, run(&mut b, &s, 7, &mut NoHooks), "{name}: same seed, different tokens");
        assert_ne!(first, run(&mut b, &s, 8, &mut NoHooks), "{name}: the seed does not matter?");
    }
}

#[test]
fn seeded_gpu_generation_repeats_and_matches_cpu() {
    let Some(ctx) = test_context("seeded_gpu_generation_repeats_and_matches_cpu") else { return };
    let s = setup("sliding-long-prompt");
    let mut gpu = GpuBackend::new(ctx, &s.dir.config, s.dir.load_weights().unwrap(), 512).unwrap();
    let first = run(&mut gpu, &s, 7, &mut NoHooks);
    assert_eq!(first, run(&mut gpu, &s, 7, &mut NoHooks), "GPU: same seed, different tokens");
    // The backends' logits agree to ~2e-6 here, far inside every decision margin of this run.
    assert_eq!(first, run(&mut cpu(&s), &s, 7, &mut NoHooks), "GPU and CPU differ for the same seed");
}

/// The same seeded run through `generate_resident` (encoder, logits, self-conditioning and the
/// per-row work on the GPU): repeats exactly, and equals the host-sampler run on the CPU.
#[test]
fn seeded_resident_gpu_generation_repeats_and_matches_cpu() {
    for name in ["sliding-long-prompt", "early-stop-eos"] {
        let Some(ctx) = test_context("seeded_resident_gpu_generation_repeats_and_matches_cpu") else { return };
        let s = setup(name);
        let mut gpu = GpuBackend::new(ctx, &s.dir.config, s.dir.load_weights().unwrap(), 512).unwrap();
        let first = run_resident(&mut gpu, &s, 7, &mut NoHooks);
        assert_eq!(first, run_resident(&mut gpu, &s, 7, &mut NoHooks), "{name}: GPU resident, same seed, different tokens");
        assert_ne!(first, run_resident(&mut gpu, &s, 8, &mut NoHooks), "{name}: the seed does not matter?");
        // The seeded draw's inverse CDF runs in f32 on the GPU and in f64 on the CPU: the samples
        // could differ only for a uniform within ~1e-7 of a CDF step, which these runs do not hit.
        assert_eq!(first, run(&mut cpu(&s), &s, 7, &mut NoHooks), "{name}: GPU resident and CPU differ for the same seed");
    }
}

fn run_resident(backend: &mut GpuBackend, s: &Setup, seed: u64, hooks: &mut dyn Hooks) -> Vec<u32> {
    backend.generate_resident(&s.prompt, &s.cfg, &mut SeededRng::new(seed), hooks).unwrap().unwrap().sequence
}

/// Bytes read back per denoising step of a resident generation.
struct ReadBack {
    counters: Arc<Counters>,
    last: Option<u64>,
    per_step: Vec<u64>,
    blocks: u64,
}

impl Hooks for ReadBack {
    fn on_step(&mut self, info: &StepInfo<'_>) {
        let now = self.counters.bytes_read_back();
        if info.step == 0 {
            self.blocks += 1;
        }
        if info.step > 0
            && let Some(then) = self.last
        {
            self.per_step.push(now - then);
        }
        self.last = Some(now);
    }
}

/// The sampler needs a few numbers per canvas position, not the logits: a resident step reads back
/// at most 64 bytes per position (16 today: entropy, argmax, sample, non-finite flag).
const MAX_READBACK_PER_POSITION: u64 = 64;

#[test]
fn resident_generation_reads_back_under_64_bytes_per_position() {
    let Some(ctx) = test_context("resident_generation_reads_back_under_64_bytes_per_position") else { return };
    let counters = ctx.counters();
    let s = setup("sliding-long-prompt");
    let c = s.dir.config.canvas_length as u64;
    let mut gpu = GpuBackend::new(ctx, &s.dir.config, s.dir.load_weights().unwrap(), 512).unwrap();
    let before = counters.bytes_read_back();
    let mut hooks = ReadBack { counters: counters.clone(), last: None, per_step: Vec::new(), blocks: 0 };
    run_resident(&mut gpu, &s, 5, &mut hooks);
    assert!(hooks.per_step.len() >= 10, "measured {} steps", hooks.per_step.len());
    for (i, &bytes) in hooks.per_step.iter().enumerate() {
        assert!(bytes > 0, "step {i}: nothing read back?");
        assert!(bytes <= MAX_READBACK_PER_POSITION * c, "step {i}: {bytes} bytes for {c} positions");
    }
    // The whole generation, encodes included, stays within the per-step budget.
    let total = counters.bytes_read_back() - before;
    let steps = hooks.per_step.len() as u64 + hooks.blocks; // + each block's first step
    assert!(total <= MAX_READBACK_PER_POSITION * c * steps, "{total} bytes over {steps} steps");
}

/// Records the creation counters at each block's first step (plans are built per block, when the
/// context grows) and checks them at every later step of the block.
struct NoCreation {
    counters: Arc<Counters>,
    after_first: Option<Created>,
    steps: usize,
    max_block_steps: usize,
}

impl Hooks for NoCreation {
    fn on_step(&mut self, info: &StepInfo<'_>) {
        let now = self.counters.get();
        match (info.step, self.after_first) {
            (0, _) | (_, None) => self.after_first = Some(now),
            (_, Some(then)) => assert_eq!(then, now, "a GPU object was created at block {} step {}", info.block, info.step),
        }
        self.steps += 1;
        self.max_block_steps = self.max_block_steps.max(info.step + 1);
    }
}

#[test]
fn gpu_generation_creates_nothing_after_each_blocks_first_step() {
    let Some(ctx) = test_context("gpu_generation_creates_nothing_after_each_blocks_first_step") else { return };
    let counters = ctx.counters();
    // Its replayed run has a block of all 48 steps (stopping never triggers early there).
    let s = setup("vision-tower-skip");
    let mut gpu = GpuBackend::new(ctx, &s.dir.config, s.dir.load_weights().unwrap(), 512).unwrap();
    let mut hooks = NoCreation { counters, after_first: None, steps: 0, max_block_steps: 0 };
    let mut cfg = s.cfg.clone();
    cfg.stopping = None; // every block runs all N = 48 steps
    let s = Setup { cfg, ..s };
    run(&mut gpu, &s, 3, &mut hooks);
    assert_eq!(hooks.max_block_steps, 48, "expected full 48-step blocks");
    assert!(hooks.steps >= 96, "ran {} steps", hooks.steps);
    // The resident path too (GPU encoder between blocks, sampler rows on the GPU).
    hooks.after_first = None;
    hooks.steps = 0;
    run_resident(&mut gpu, &s, 3, &mut hooks);
    assert!(hooks.steps >= 96, "resident: ran {} steps", hooks.steps);
}

/// `DG_SUBMIT_PARTS`: a canvas forward and a resident generation submitted in several
/// command buffers (down to one dispatch each) run the one pass's dispatches in its order, so the
/// logits are the same to the bit and so are the tokens.
#[test]
fn a_step_submitted_in_parts_gives_the_whole_steps_results() {
    let test = "a_step_submitted_in_parts_gives_the_whole_steps_results";
    let s = setup("sliding-long-prompt");
    let weights = s.dir.load_weights().unwrap();
    let (c, v) = (s.dir.config.canvas_length, s.dir.config.text.vocab_size);
    let canvas: Vec<u32> = (0..c as u32).map(|i| (i * 7 + 3) % v as u32).collect();
    let sc: Vec<f32> = (0..c * v).map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0).collect();
    let mut runs = Vec::new();
    for parts in [1, 3, 100_000] {
        let Some(mut ctx) = test_context(test) else { return };
        ctx.tuning.submit_parts = parts;
        let mut gpu = dg_gpu::GpuModel::load(ctx, &s.dir.config, &weights, dg_gpu::ModelOptions::new(512)).unwrap();
        gpu.encode(&s.prompt).unwrap();
        let mut logits = vec![0f32; c * v];
        gpu.canvas_forward(&canvas, Some(&sc), &mut logits).unwrap();
        let bits: Vec<u32> = logits.iter().map(|x| x.to_bits()).collect();
        assert!(bits.iter().any(|&b| b != 0), "{parts} parts: no logits");
        let Some(mut ctx) = test_context(test) else { return };
        ctx.tuning.submit_parts = parts;
        let mut backend = GpuBackend::new(ctx, &s.dir.config, weights.clone(), 512).unwrap();
        runs.push((parts, bits, run_resident(&mut backend, &s, 7, &mut NoHooks)));
    }
    for (parts, bits, tokens) in &runs[1..] {
        assert!(bits == &runs[0].1, "{parts} parts: the logits differ from one command buffer's");
        assert_eq!(tokens, &runs[0].2, "{parts} parts: the resident generation's tokens differ");
    }
}

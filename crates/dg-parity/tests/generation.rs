//! Generation-level properties on the committed fixtures: seeded runs repeat exactly on each
//! backend, the CPU and GPU backends agree, and a GPU generation creates no buffer, bind group or
//! pipeline after its first denoising step (over a 48-step block).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use dg_cpu::CpuModel;
use dg_gpu::testing::test_context;
use dg_gpu::{Counters, Created};
use dg_model::{GenerationConfig, ModelDir};
use dg_parity::checks::Backend;
use dg_parity::cpu::CpuBackend;
use dg_parity::gpu::GpuBackend;
use dg_parity::reference::Reference;
use dg_parity::replay::{AsModel, replay_config};
use dg_sampler::{Hooks, NoHooks, SeededRng, StepInfo, generate};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures").join(name)
}

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
}

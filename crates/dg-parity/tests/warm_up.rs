//! `GpuModel::warm_up` compiles every kernel a generation uses: after it, generations of prompts
//! of many lengths (several chunks, past the sliding window, canvases committed) compile no
//! pipeline, alone and in a batch of several slots; without it they do.

use std::path::Path;

use dg_gpu::{GpuModel, ModelOptions, WeightFormat};
use dg_model::{GenerationConfig, ModelDir};
use dg_parity::testing::test_context;
use dg_sampler::{Batch, NoHooks, SeededRng, generate_resident};

fn tiny() -> ModelDir {
    ModelDir::open(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/tiny-random")).unwrap()
}

/// Prompts of lengths around the chunks, the canvas and the sliding window.
fn prompts(dir: &ModelDir) -> Vec<Vec<u32>> {
    let (c, w) = (dir.config.canvas_length, dir.config.text.sliding_window);
    [1, 2, 5, c - 1, c + 3, 2 * c + 7, w + 9].map(|n| (0..n as u32).map(|i| 3 + (i * 7) % 500).collect()).into()
}

fn config(dir: &ModelDir) -> GenerationConfig {
    GenerationConfig { max_new_tokens: 3 * dir.config.canvas_length, max_denoising_steps: 3, stopping: None, ..Default::default() }
}

/// Pipelines compiled by generating every prompt alone with `model`.
fn compiled_alone(model: &mut GpuModel, dir: &ModelDir) -> u64 {
    let (c, v) = (dir.config.canvas_length, dir.config.text.vocab_size);
    let counters = model.ctx.counters();
    let before = counters.get().pipelines;
    for (i, prompt) in prompts(dir).iter().enumerate() {
        model.reset();
        generate_resident(model, prompt, &config(dir), c, v, &mut SeededRng::new(i as u64), &mut NoHooks).unwrap();
    }
    counters.get().pipelines - before
}

/// Pipelines compiled by generating every prompt through one batch of `slots` sequences.
fn compiled_batched(model: &mut GpuModel, dir: &ModelDir, slots: usize) -> u64 {
    let (c, v) = (dir.config.canvas_length, dir.config.text.vocab_size);
    let counters = model.ctx.counters();
    let before = counters.get().pipelines;
    let mut batch = Batch::new(c, v, slots).unwrap();
    let mut pending = prompts(dir).into_iter().enumerate();
    loop {
        while batch.has_room() {
            let Some((i, prompt)) = pending.next() else { break };
            batch.admit(&prompt, &config(dir), SeededRng::new(i as u64), NoHooks).unwrap_or_else(|r| panic!("{}", r.reason));
        }
        if batch.running() == 0 {
            break;
        }
        batch.step_resident(model);
        for f in batch.drain_finished() {
            f.result.unwrap();
        }
    }
    counters.get().pipelines - before
}

fn context(dir: &ModelDir) -> usize {
    prompts(dir).iter().map(Vec::len).max().unwrap() + config(dir).max_new_tokens
}

#[test]
fn after_warm_up_a_generation_compiles_no_pipeline() {
    let test = "after_warm_up_a_generation_compiles_no_pipeline";
    let dir = tiny();
    let weights = dir.load_weights().unwrap();
    for format in [WeightFormat::F32, WeightFormat::F16] {
        // Encoder chunks of 40 tokens: prompts of several chunks, and sliding caches whose window
        // moves to row 0.
        let load = |warm: bool| {
            let mut ctx = test_context(test)?;
            ctx.tuning.prefill_rows = Some(40);
            let mut model = GpuModel::load(ctx, &dir.config, &weights, ModelOptions::new(context(&dir)).format(format)).unwrap();
            if warm {
                let w = model.warm_up().unwrap();
                assert!(w.compiled > 0 && w.compiled == w.kernels, "{format:?}: {w:?}");
                assert_eq!(model.warm_up().unwrap().compiled, 0, "{format:?}: a second warm-up compiles nothing");
            }
            Some(model)
        };
        let Some(mut cold) = load(false) else { return };
        assert!(compiled_alone(&mut cold, &dir) > 0, "{format:?}: without a warm-up, the first generation compiles");
        let mut warm = load(true).unwrap();
        assert_eq!(compiled_alone(&mut warm, &dir), 0, "{format:?}: pipelines compiled after the warm-up");
    }
}

#[test]
fn after_warm_up_a_batch_compiles_no_pipeline() {
    let test = "after_warm_up_a_batch_compiles_no_pipeline";
    let dir = tiny();
    let weights = dir.load_weights().unwrap();
    let slots = 3;
    for format in [WeightFormat::F32, WeightFormat::F16] {
        let Some(ctx) = test_context(test) else { return };
        let mut model = GpuModel::load(ctx, &dir.config, &weights, ModelOptions::new(context(&dir)).slots(slots).format(format)).unwrap();
        model.warm_up().unwrap();
        assert_eq!(compiled_batched(&mut model, &dir, slots), 0, "{format:?}: pipelines compiled after the warm-up");
    }
}

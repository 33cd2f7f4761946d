//! `GpuModel::warm_up` compiles every kernel a generation uses: after it, generations of prompts
//! of many lengths (several chunks, past the sliding window, canvases committed) compile no
//! pipeline, alone and in a batch of several slots; without it they do. `GpuModel::warm_up_reads`
//! does the same for typed reads (every width, slot count, batch of reads and pinned steps).

use std::path::Path;

use dg_gpu::{GpuModel, ModelOptions, SlotReader, WeightFormat};
use dg_model::{GenerationConfig, ModelDir};
use dg_parity::testing::test_context;
use dg_sampler::{Batch, NoHooks, ReadRequest, SeededRng, Slot, generate_resident, read_batch};

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

/// Pipelines compiled by the forwards of typed reads in the last slot of `model` (a server's read
/// slot), as the reader runs them: after prompts of three lengths (encoded in two parts, their
/// compilations not counted), of each width 1 and 3 slots read alone and as many as one forward
/// holds, in 1 step and in 3 pinned steps.
fn compiled_by_reads(model: &mut GpuModel, dir: &ModelDir) -> u64 {
    let c = dir.config.canvas_length;
    let slot = model.slots() - 1;
    let counters = model.ctx.counters();
    let settings = GenerationConfig::default();
    let mut compiled = 0;
    for (i, prompt) in prompts(dir).iter().filter(|p| p.len() > 1).step_by(2).enumerate() {
        model.release_slot(slot);
        let half = prompt.len() / 2;
        model.encode_slot(slot, &prompt[..half]).unwrap();
        model.encode_slot(slot, &prompt[half..]).unwrap();
        let mut reader = SlotReader { model: &mut *model, slot };
        for width in dg_gpu::READ_WIDTHS.into_iter().filter(|&w| w <= c) {
            let canvas: Vec<u32> = (0..width as u32).map(|r| 5 + (r * 11 + i as u32) % 400).collect();
            for questions in [1, 3] {
                let slots: Vec<Slot> = (0..questions).map(|q| Slot { position: 2 + q * 3, labels: vec![7, 8, 9] }).collect();
                let pinned: Vec<bool> = (0..width).map(|r| !slots.iter().any(|s| s.position == r)).collect();
                for steps in [1, 3] {
                    let request = ReadRequest { canvas: &canvas, pinned: Some(&pinned), steps, slots: &slots };
                    for n in 1..=reader.model.max_reads(width) {
                        let requests = vec![request; n];
                        let mut rngs: Vec<SeededRng> = (0..n as u64).map(SeededRng::new).collect();
                        let before = counters.get().pipelines;
                        read_batch(&mut reader, &requests, &settings, &mut rngs).unwrap();
                        compiled += counters.get().pipelines - before;
                    }
                }
            }
        }
    }
    compiled
}

#[test]
fn after_warm_up_reads_compile_no_pipeline() {
    let test = "after_warm_up_reads_compile_no_pipeline";
    let dir = tiny();
    let weights = dir.load_weights().unwrap();
    for format in [WeightFormat::F32, WeightFormat::F16] {
        // A server's model: a generation slot and the read slot; only the reads' warm-up.
        let load = |warm: bool| {
            let ctx = test_context(test)?;
            let mut model = GpuModel::load(ctx, &dir.config, &weights, ModelOptions::new(context(&dir)).slots(2).format(format)).unwrap();
            if warm {
                let w = model.warm_up_reads().unwrap();
                assert!(w.compiled > 0 && w.compiled == w.kernels, "{format:?}: {w:?}");
                assert_eq!(model.warm_up_reads().unwrap().compiled, 0, "{format:?}: a second warm-up compiles nothing");
            }
            Some(model)
        };
        let Some(mut cold) = load(false) else { return };
        assert!(compiled_by_reads(&mut cold, &dir) > 0, "{format:?}: without the warm-up, the first reads compile");
        let mut warm = load(true).unwrap();
        assert_eq!(compiled_by_reads(&mut warm, &dir), 0, "{format:?}: pipelines compiled by read forwards after the warm-up");
    }
}

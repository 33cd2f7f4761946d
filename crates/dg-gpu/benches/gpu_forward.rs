//! The GPU canvas forward (self-conditioning on) against a random cached context: the real
//! geometry with 6 layers and a 1024-token context by default, the `sliding-long-prompt` fixture's
//! small config with `DG_BENCH_QUICK=1`. Each iteration writes the ids, replays the plan, submits
//! and waits for the device. Also one resident denoising step (forward + sampler rows) and the GPU
//! encoder's prefill of the context. `cargo xtask bench-gpu --profile` gives the per-kernel
//! breakdown.

use std::path::Path;

use criterion::{Criterion, criterion_group, criterion_main};
use dg_gpu::{GpuContext, GpuModel, GpuOptions, Instrumentation, LayerContext};
use dg_model::{ModelConfig, Weights};
use dg_parity::testing::{random_context, seeded};
use dg_sampler::{CategoricalRequest, RowResult};

fn forward(crit: &mut Criterion) {
    let quick = std::env::var("DG_BENCH_QUICK").as_deref() == Ok("1");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let (path, context) = if quick {
        (root.join("fixtures/sliding-long-prompt/config.json"), 32)
    } else {
        (root.join("bench/configs/real-6layer.json"), 1024)
    };
    let config = ModelConfig::from_file(&path).expect("bench config");
    let options = GpuOptions::from_env().expect("the DG_* variables");
    let ctx = match GpuContext::new(&options) {
        Ok(ctx) => ctx,
        Err(e) => {
            eprintln!("SKIP gpu_forward bench: {e}");
            return;
        }
    };
    let cfg = &config.text;
    let weights = Weights::random(cfg, 0).expect("weights");
    let mut model = GpuModel::load(ctx, &config, &weights, dg_gpu::ModelOptions::new(context)).expect("upload");
    drop(weights);
    let kv = random_context(cfg, context);
    let layers: Vec<LayerContext<'_>> = kv.iter().map(|(k, v)| LayerContext { keys: k, values: v }).collect();
    model.set_context(context, &layers).expect("context");
    let (c, v) = (config.canvas_length, cfg.vocab_size);
    let canvas: Vec<u32> = (0..c as u32).map(|i| (i.wrapping_mul(7919)) % v as u32).collect();
    let sc = seeded(c * v, 9, 8.0);
    let mut logits = vec![0f32; c * v];
    model.canvas_forward(&canvas, Some(&sc), &mut logits).expect("first forward");
    let mut group = crit.benchmark_group("gpu_canvas_forward");
    group.sample_size(10);
    let name = if quick { "tiny_sc" } else { "real6_ctx1024_sc" };
    group.bench_function(name, |b| b.iter(|| model.run_step(&canvas, true, None).expect("forward")));
    group.finish();

    // One resident denoising step (forward + the sampler's per-row work + the 16-byte-per-position
    // readback), self-conditioned on what the previous step left on the device.
    let uniforms: Vec<f64> = (0..c).map(|i| (i as f64 + 0.5) / c as f64).collect();
    let mut rows = vec![RowResult::default(); c];
    let mut step = |model: &mut GpuModel, sc: bool| {
        model.denoise_rows(&canvas, sc, 0.8, CategoricalRequest::Uniforms(&uniforms), &mut rows).expect("step");
    };
    step(&mut model, false);
    let mut group = crit.benchmark_group("gpu_denoise_step");
    group.sample_size(10);
    let name = if quick { "tiny_sc" } else { "real6_ctx1024_sc" };
    group.bench_function(name, |b| b.iter(|| step(&mut model, true)));
    group.finish();

    // Encoder prefill of `context` tokens on the GPU (the plan of each chunk is recorded inside the
    // timed part: that is what a prefill costs).
    let prompt: Vec<u32> = (0..context as u32).map(|i| i.wrapping_mul(2_654_435_761) % v as u32).collect();
    let mut group = crit.benchmark_group("gpu_prefill");
    group.sample_size(10);
    let name = if quick { "tiny_32tok" } else { "real6_1024tok" };
    group.bench_function(name, |b| {
        b.iter(|| {
            model.reset();
            model.encode(&prompt).expect("prefill");
            model.ctx.device.poll(wgpu::PollType::wait_indefinitely()).expect("wait");
        })
    });
    group.finish();
}

criterion_group!(benches, forward);
criterion_main!(benches);

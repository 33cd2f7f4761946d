//! CPU canvas forward at a medium config (`bench/configs/cpu-medium.json`, ~62M parameters):
//! prompt of 256 tokens encoded once, then the timed part is one denoising forward of a 256-token
//! canvas with self-conditioning (the work of every step but the first). The transformers side of
//! this measurement is `bench/torch_forward.py` with the same config. `DG_BENCH_QUICK=1` uses the
//! `sliding-long-prompt` fixture's small config instead (CI smoke run).

use std::path::Path;

use criterion::{Criterion, criterion_group, criterion_main};
use dg_cpu::CpuModel;
use dg_model::{ModelConfig, Weights};

const PROMPT_LEN: usize = 256;

fn setup() -> (CpuModel, Vec<u32>, Vec<f32>) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let path = if std::env::var("DG_BENCH_QUICK").as_deref() == Ok("1") {
        root.join("fixtures/sliding-long-prompt/config.json")
    } else {
        root.join("bench/configs/cpu-medium.json")
    };
    let config = ModelConfig::from_file(&path).expect("bench config");
    let weights = Weights::random(&config.text, 0).expect("random weights");
    let (c, v) = (config.canvas_length, config.text.vocab_size);
    let mut model = CpuModel::new(config, weights);
    let prompt_len = PROMPT_LEN.min(model.config.text.max_position_embeddings / 2);
    let prompt: Vec<u32> = (0..prompt_len as u32).map(|i| (i * 7919) % v as u32).collect();
    model.encode(&prompt).expect("encode");
    let canvas: Vec<u32> = (0..c as u32).map(|i| (i * 104_729 + 13) % v as u32).collect();
    let sc: Vec<f32> = (0..c * v).map(|i| ((i * 2_654_435_761usize) % 1000) as f32 / 100.0 - 5.0).collect();
    (model, canvas, sc)
}

fn canvas_forward(crit: &mut Criterion) {
    let (model, canvas, sc) = setup();
    let mut logits = vec![0f32; sc.len()];
    let mut group = crit.benchmark_group("cpu_canvas_forward");
    group.sample_size(10);
    group.bench_function("canvas_forward_sc", |b| b.iter(|| model.canvas_forward(&canvas, Some(&sc), &mut logits).expect("forward")));
    group.bench_function("canvas_forward_plain", |b| b.iter(|| model.canvas_forward(&canvas, None, &mut logits).expect("forward")));
    group.finish();
}

criterion_group!(benches, canvas_forward);
criterion_main!(benches);

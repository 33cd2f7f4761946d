//! The CPU reference's hot ops at the real model's shapes: the projection GEMMs of both layer
//! kinds (canvas of 256 tokens), the dense MLP, one expert at ~16 tokens, the head and the
//! self-conditioning soft embedding at V = 262144 (16 rows, to keep one iteration short), and
//! attention over a 1024- and a 4096-token context, and the router and experts of one MoE layer
//! (hidden 2816, 128 experts, top-8 of width 704, 256 tokens) on seeded random weights.
//! `DG_BENCH_QUICK=1` divides every dimension by 8 (the CI smoke run of `cargo xtask bench --quick`).

use std::path::Path;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use dg_cpu::attention::{AttnShape, Mask, attention};
use dg_cpu::linalg::{Threads, View, linear_raw, matmul};
use dg_cpu::moe;
use dg_cpu::ops::rms_norm_into;
use dg_model::{ModelConfig, Weights};

fn quick() -> bool {
    std::env::var("DG_BENCH_QUICK").as_deref() == Ok("1")
}

fn data(n: usize) -> Vec<f32> {
    (0..n).map(|i| ((i.wrapping_mul(2_654_435_761) >> 7) % 1000) as f32 / 500.0 - 1.0).collect()
}

fn gemms(crit: &mut Criterion) {
    let s = if quick() { 8 } else { 1 };
    // (name, tokens, out, in)
    let shapes = [
        ("q_proj_sliding", 256, 4096, 2816),
        ("kv_proj_sliding", 256, 2048, 2816),
        ("o_proj_sliding", 256, 2816, 4096),
        ("q_proj_full", 256, 8192, 2816),
        ("k_proj_full", 256, 1024, 2816),
        ("o_proj_full", 256, 2816, 8192),
        ("mlp_gate_up", 256, 4224, 2816),
        ("mlp_down", 256, 2816, 2112),
        ("expert_gate_up_16tok", 16, 1408, 2816),
        ("expert_down_16tok", 16, 2816, 704),
        ("head_16rows", 16, 262_144, 2816),
    ];
    let mut group = crit.benchmark_group("cpu_gemm");
    group.sample_size(10);
    for (name, m, n, k) in shapes {
        let (m, n, k) = ((m / s).max(1), n / s, k / s);
        let (x, w) = (data(m * k), data(n * k));
        let mut out = vec![0f32; m * n];
        group.throughput(Throughput::Elements((2 * m * n * k) as u64));
        group.bench_function(name, |b| b.iter(|| linear_raw(&mut out, &x, m, &w, n, k, Threads::All)));
    }
    // The soft embedding P[16, V] · E[V, H] (row-major E, K = V).
    let (m, v, h) = (16 / s.min(16), 262_144 / s, 2816 / s);
    let (p, e) = (data(m * v), data(v * h));
    let mut out = vec![0f32; m * h];
    group.throughput(Throughput::Elements((2 * m * v * h) as u64));
    group.bench_function("soft_embedding_16rows", |b| {
        b.iter(|| matmul(&mut out, h, View::rows(&p, m, v), View::rows(&e, v, h), false, Threads::All))
    });
    group.finish();
}

fn attentions(crit: &mut Criterion) {
    let s = if quick() { 8 } else { 1 };
    let mut group = crit.benchmark_group("cpu_attention");
    group.sample_size(10);
    for (kind, heads, kv, d) in [("sliding", 16, 8, 256), ("full", 16, 2, 512)] {
        for context in [1024, 4096] {
            // Sliding layers see at most W-1 = 1023 cached tokens in the decoder.
            let cached = if kind == "sliding" { context.min(1023) } else { context };
            let (t, n, d) = (256 / s, (cached + 256) / s, d / s);
            let (q, k, v) = (data(t * heads * d), data(n * kv * d), data(n * kv * d));
            let mut out = vec![0f32; t * heads * d];
            let shape = AttnShape { queries: t, keys: n, heads, kv_heads: kv, head_dim: d };
            group.bench_function(format!("{kind}_ctx{context}"), |b| b.iter(|| attention(&mut out, &q, &k, &v, shape, Mask::None)));
        }
    }
    group.finish();
}

fn moe(crit: &mut Criterion) {
    let s = if quick() { 8 } else { 1 };
    // The real geometry from the bench config, one layer, a tiny vocabulary (only the layer's
    // router and experts are used).
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/configs/real-6layer.json");
    let mut cfg = ModelConfig::from_file(&path).expect("bench config").text;
    cfg.layers.truncate(1);
    cfg.vocab_size = 16;
    cfg.hidden_size /= s;
    cfg.num_experts /= s;
    cfg.moe_intermediate_size /= s;
    cfg.intermediate_size /= s;
    let weights = Weights::random(&cfg, 0).expect("random weights");
    let layer = &weights.layers[0];
    let (t, h) = (256 / s, cfg.hidden_size);
    // The router reads the residual stream, the experts its pre_feedforward_layernorm_2.
    let x = data(t * h);
    let mut u = vec![0f32; t * h];
    rms_norm_into(&mut u, &x, h, Some(&layer.pre_feedforward_layernorm_2), cfg.rms_norm_eps);
    let routing = moe::route(&x, t, layer, &cfg);
    let mut out = vec![0f32; t * h];
    let (e, k, ie) = (cfg.num_experts, cfg.top_k_experts, cfg.moe_intermediate_size);
    let mut group = crit.benchmark_group("cpu_moe");
    group.sample_size(10);
    group.throughput(Throughput::Elements((2 * t * e * h) as u64));
    group.bench_function(format!("router_{t}tok_{e}experts"), |b| b.iter(|| moe::route(&x, t, layer, &cfg)));
    group.throughput(Throughput::Elements((2 * t * k * 3 * h * ie) as u64));
    group.bench_function(format!("experts_{t}tok_top{k}"), |b| b.iter(|| moe::experts(&mut out, &u, t, &routing, layer)));
    group.finish();
}

criterion_group!(benches, gemms, attentions, moe);
criterion_main!(benches);

//! The sampler's own work per denoising step (temperature, softmax, entropy, argmax, categorical
//! sampling, acceptance, renoise, stopping) on synthetic logits, without any model forward.
//!
//! Each timed step starts from a fresh copy of the synthetic raw logits (the copy is not timed), since a
//! step scales its logits in place and keeps them as the next self-conditioning input.

use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use dg_model::GenerationConfig;
use dg_sampler::{Sampler, SeededRng};

/// Softcapped logits: noise in [-12, 12] per entry, and a sharp peak (+22) in every other row.
fn synthetic_logits(c: usize, v: usize) -> Vec<f32> {
    let mut rng = SeededRng::new(1234);
    let mut logits = Vec::with_capacity(c * v);
    for row in 0..c {
        let peak = rng.below(v as u32) as usize;
        for col in 0..v {
            let noise = (rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32 * 24.0 - 12.0;
            let x = if row % 2 == 0 && col == peak { noise + 22.0 } else { noise };
            logits.push(30.0 * (x / 30.0).tanh());
        }
    }
    logits
}

fn bench_size(crit: &mut Criterion, name: &str, c: usize, v: usize, samples: usize) {
    let cfg = GenerationConfig::default();
    let raw = synthetic_logits(c, v);
    let mut sampler = Sampler::new(c, v).unwrap();
    let mut rng = SeededRng::new(7);
    sampler.begin_block(&mut rng).unwrap();
    let mut group = crit.benchmark_group("sampler_step");
    group.sample_size(samples);
    let mut remaining = cfg.max_denoising_steps;
    group.bench_function(name, |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                sampler.logits_mut().copy_from_slice(&raw);
                let start = Instant::now();
                let outcome = sampler.step(&cfg, remaining, &mut rng, 0).unwrap();
                total += start.elapsed();
                std::hint::black_box(outcome);
                remaining = if remaining == 1 { cfg.max_denoising_steps } else { remaining - 1 };
            }
            total
        })
    });
    group.finish();
}

fn benches(crit: &mut Criterion) {
    bench_size(crit, "C32_V4096", 32, 4096, 50);
    // The real canvas and vocabulary; skipped by the CI smoke run (`DG_BENCH_QUICK=1`).
    if std::env::var("DG_BENCH_QUICK").as_deref() != Ok("1") {
        bench_size(crit, "C256_V262144", 256, 262_144, 10);
    }
}

criterion_group!(sampler_step, benches);
criterion_main!(sampler_step);

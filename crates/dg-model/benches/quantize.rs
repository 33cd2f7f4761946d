//! The K-quant quantizers' speed: `quantize` of 1024 blocks (262144 values, Gaussian-like values
//! from a fixed seed) into Q4_K and Q6_K, on one thread and on all of rayon's threads. Criterion
//! reports the rate in values (elements) a second.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use dg_model::{StoredDtype, quantize};

const VALUES: usize = 1024 * 256;

/// Approximately normal values (the sum of four uniforms, centred) from a fixed seed.
fn values(n: usize) -> Vec<f32> {
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut uniform = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 40) as f32 / (1u64 << 24) as f32
    };
    (0..n).map(|_| (uniform() + uniform() + uniform() + uniform() - 2.0) * 0.02).collect()
}

fn quantizers(crit: &mut Criterion) {
    let x = values(VALUES);
    let one = rayon::ThreadPoolBuilder::new().num_threads(1).build().expect("a one-thread pool");
    let mut group = crit.benchmark_group("quantize");
    group.throughput(Throughput::Elements(VALUES as u64));
    group.sample_size(10);
    for (name, dtype) in [("q4_k", StoredDtype::Q4_K), ("q6_k", StoredDtype::Q6_K)] {
        group.bench_function(format!("{name}_1_thread"), |b| b.iter(|| one.install(|| quantize(dtype, &x).expect("finite values"))));
        group.bench_function(format!("{name}_all_threads"), |b| b.iter(|| quantize(dtype, &x).expect("finite values")));
    }
    group.finish();
}

criterion_group!(benches, quantizers);
criterion_main!(benches);

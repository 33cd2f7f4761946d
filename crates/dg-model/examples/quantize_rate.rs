//! The K-quant quantizers' rate in values a second, the best of 40 runs of `quantize` over 1024
//! blocks (the values of `benches/quantize.rs`), on one thread and on all of rayon's threads: on a
//! machine shared with other work the best run is steadier than criterion's mean.
//! `cargo run --release -p dg-model --example quantize_rate`

use std::time::Instant;

use dg_model::{StoredDtype, quantize};

const VALUES: usize = 1024 * 256;
const RUNS: usize = 40;

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

/// Values a second of the fastest of [`RUNS`] runs of `run`.
fn best_rate(run: impl Fn()) -> f64 {
    let fastest = (0..RUNS)
        .map(|_| {
            let start = Instant::now();
            run();
            start.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min);
    VALUES as f64 / fastest
}

fn main() {
    let x = values(VALUES);
    let one = rayon::ThreadPoolBuilder::new().num_threads(1).build().expect("a one-thread pool");
    for (name, dtype) in [("Q4_K", StoredDtype::Q4_K), ("Q6_K", StoredDtype::Q6_K)] {
        let quantize = || {
            std::hint::black_box(quantize(dtype, &x).expect("finite values"));
        };
        let single = best_rate(|| one.install(quantize));
        let all = best_rate(quantize);
        println!("{name}: {:.1}M values/s on 1 thread, {:.1}M on {} threads", single / 1e6, all / 1e6, rayon::current_num_threads());
    }
}

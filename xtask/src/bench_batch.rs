//! `cargo xtask bench-batch`: batched GPU generation (issue: batched canvases) on random weights at
//! a given geometry: for each batch size B, B sequences generate together through one
//! `dg_sampler::Batch` on a `GpuModel` of B slots (one forward a step for all their canvases), each
//! with its own random prompt and seed, `canvases` blocks of `steps` steps with adaptive stopping
//! and EOS off (every block runs every step).
//!
//! Prints per B: the arena's bytes (activations and the B caches) and the bytes each sequence adds,
//! the wall time of the whole generation (prefills, commits and steps), the mean time of a step,
//! and the aggregate generated tokens per second with its ratio to B = 1. A warm-up generation
//! runs first at each B (its plans and pipelines).

use std::time::Instant;

use anyhow::Result;
use dg_gpu::Instrumentation;
use dg_sampler::{Batch, NoHooks, SeededRng};

use crate::bench_generate::{Workload, median};
use crate::random_model;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Each sequence's workload.
    #[command(flatten)]
    work: Workload,
    /// Batch sizes, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
    batch: Vec<usize>,
    /// Timed generations after the warm-up at each batch size (the median is reported).
    #[arg(long, default_value_t = 1)]
    runs: usize,
    /// Storage of the weight matrices (as `bench-gpu --weights`; default f16).
    #[arg(long, value_enum, default_value = "f16")]
    weights: random_model::WeightsArg,
    /// After the runs at each B, profile one batched step (a timestamp around every dispatch) and
    /// print the GPU time by kernel.
    #[arg(long)]
    profile: bool,
}

/// One step's `(scope, kernel, nanoseconds)` per dispatch (`Instrumentation::profile_last_batch`).
type Profile = Vec<(String, String, f64)>;

pub fn run(args: Args) -> Result<bool> {
    anyhow::ensure!(!args.batch.is_empty() && args.batch.iter().all(|&b| b > 0), "--batch: give batch sizes of at least 1");
    let (config, ctx) = args.work.open()?;
    let (c, v) = (config.canvas_length, config.text.vocab_size);
    let (mut model, label) = random_model::upload(ctx, &config, args.weights, args.work.max_context(&config))?;
    println!("weights on the GPU: {:.2} GB ({label})", model.weight_bytes() as f64 / 1e9);
    let settings = args.work.settings(&config);
    println!("| B | arena GB | per extra sequence GB | generation ms | ms a step | tokens/s | × B = 1 |");
    println!("|---|---|---|---|---|---|---|");
    let mut base: Option<(usize, f64)> = None;
    let mut previous: Option<(usize, u64)> = None;
    let mut profiles = Vec::new();
    for &b in &args.batch {
        model.set_slots(b)?;
        let arena = model.arena_bytes();
        let mut runs = Vec::new();
        for run in 0..=args.runs {
            let mut batch = Batch::new(c, v, b)?;
            for s in 0..b {
                let mut rng = SeededRng::new(1000 + s as u64);
                let prompt: Vec<u32> = (0..args.work.prompt).map(|_| rng.below(v as u32)).collect();
                batch.admit(&prompt, &settings, SeededRng::new((run * b + s) as u64), NoHooks).map_err(|r| r.reason)?;
            }
            let (start, mut steps) = (Instant::now(), 0usize);
            while batch.running() > 0 {
                let report = batch.step_resident(&mut model);
                anyhow::ensure!(report.forwarded == b || report.finished > 0, "a step of {} canvases in a batch of {b}", report.forwarded);
                steps += 1;
            }
            let total = start.elapsed().as_secs_f64();
            let mut tokens = 0;
            for f in batch.drain_finished() {
                let g = f.result?;
                anyhow::ensure!(
                    g.decoder_passes == args.work.canvases * args.work.steps,
                    "a sequence ran {} decoder passes",
                    g.decoder_passes
                );
                tokens += g.new_tokens().len();
            }
            if run > 0 {
                runs.push((total * 1e3, total * 1e3 / steps as f64, tokens as f64 / total));
            }
        }
        let col = |f: fn(&(f64, f64, f64)) -> f64| median(runs.iter().map(f).collect());
        let rate = col(|r| r.2);
        let per_sequence = match previous {
            Some((pb, bytes)) if b > pb => format!("{:.3}", (arena - bytes) as f64 / (b - pb) as f64 / 1e9),
            _ => "—".into(),
        };
        let ratio = match base {
            Some((1, r)) => format!("{:.2}", rate / r),
            _ => "—".into(),
        };
        println!("| {b} | {:.3} | {per_sequence} | {:.1} | {:.2} | {rate:.1} | {ratio} |", arena as f64 / 1e9, col(|r| r.0), col(|r| r.1));
        if args.profile {
            profiles.push((b, model.profile_last_batch()?));
        }
        if base.is_none() {
            base = Some((b, rate));
        }
        previous = Some((b, arena));
    }
    println!("(median of {} runs after a warm-up at each B)", args.runs);
    print_profiles(&profiles);
    Ok(true)
}

/// GPU ms of one batched step by kernel (the last step of a run: every canvas self-conditioned),
/// a column per B, the kernels by their time at the largest B.
fn print_profiles(profiles: &[(usize, Profile)]) {
    let Some((_, last)) = profiles.last() else { return };
    let by_kernel = |p: &[(String, String, f64)]| {
        let mut m = std::collections::BTreeMap::<String, f64>::new();
        for (_, kernel, ns) in p {
            *m.entry(kernel.clone()).or_default() += ns / 1e6;
        }
        m
    };
    let mut order: Vec<(String, f64)> = by_kernel(last).into_iter().collect();
    order.sort_by(|a, b| b.1.total_cmp(&a.1));
    let columns: Vec<_> = profiles.iter().map(|(b, p)| (b, by_kernel(p))).collect();
    println!();
    println!("GPU ms of one step by kernel (timestamps around every dispatch):");
    println!("| kernel | {} |", columns.iter().map(|(b, _)| format!("B = {b}")).collect::<Vec<_>>().join(" | "));
    println!("|---|{}", "---|".repeat(columns.len()));
    let total: Vec<f64> = columns.iter().map(|(_, m)| m.values().sum()).collect();
    println!("| all | {} |", total.iter().map(|t| format!("{t:.2}")).collect::<Vec<_>>().join(" | "));
    for (kernel, _) in order.iter().take(16) {
        let cells: Vec<String> = columns.iter().map(|(_, m)| m.get(kernel).map_or("—".into(), |t| format!("{t:.2}"))).collect();
        println!("| {kernel} | {} |", cells.join(" | "));
    }
}

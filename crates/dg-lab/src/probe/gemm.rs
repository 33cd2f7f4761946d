//! Throughput of the f32-arithmetic GEMM kernels on the device, every tile: `dg_kernels::gemm`
//! over given shapes and `dg_kernels::grouped_gemm` (the experts) over a skewed top-k routing.

use dg_gpu::{GpuContext, Pipelines, PlanBuilder};
use dg_kernels::gemm::{self, GemmParams, TILES};
use dg_kernels::grouped_gemm::{self, GroupedGemmParams};

use super::{ProbeError, ProbeOptions};
use dg_parity::testing::{seeded, skewed_counts};

/// Throughput of every GEMM tile on the device (on lavapipe a sanity number, not a benchmark)
/// over [`ProbeOptions::gemm_shapes`], [`ProbeOptions::reps`] dispatches a submit (more on a fast
/// GPU, to amortise the submit and wait).
pub fn gemm_throughput(ctx: &GpuContext, options: &ProbeOptions) -> Result<(), ProbeError> {
    let mut pipelines = Pipelines::default();
    let reps = options.reps;
    for &[m, n, k] in &options.gemm_shapes {
        let ab = ctx.upload("a", &seeded((m * k) as usize, 1, 1.0))?;
        let bb = ctx.upload("b", &seeded((k * n) as usize, 2, 1.0))?;
        let cb = ctx.storage_buffer("c", u64::from(m * n) * 4)?;
        for (label, p) in [("row-major B", GemmParams::new(m, n, k)), ("linear B = Wᵀ", GemmParams::linear(m, n, k))] {
            for &tile in TILES {
                let pipeline = pipelines.get_source(ctx, gemm::source(tile))?;
                let mut plan = PlanBuilder::new(ctx);
                for _ in 0..reps {
                    plan.push(&pipeline, &p, &[&ab, &bb, &cb], gemm::workgroups(tile, m, n, 1));
                }
                let plan = plan.finish(ctx)?;
                plan.run(ctx)?;
                let t0 = std::time::Instant::now();
                plan.run(ctx)?;
                let secs = t0.elapsed().as_secs_f64() / f64::from(reps);
                let gflops = 2.0 * f64::from(m) * f64::from(n) * f64::from(k) / secs / 1e9;
                let chosen = if dg_gpu::planner::portable::choose(m, n, k) == tile { " (chosen)" } else { "" };
                println!("{} {m}x{n}x{k} {label} [{}]{chosen}: {:.3} ms, {gflops:.1} GFLOP/s", ctx.info.name, tile.label(), secs * 1e3);
            }
        }
    }
    Ok(())
}

/// Throughput of the grouped expert GEMMs on the device, every grouped tile, gate‖up then down,
/// over a skewed top-k routing of [`ProbeOptions::grouped`] (tokens, experts, top-k, hidden,
/// expert width; the real model is `256,128,8,2816,704`), [`ProbeOptions::reps`] dispatches a
/// submit.
pub fn grouped_gemm_throughput(ctx: &GpuContext, options: &ProbeOptions) -> Result<(), ProbeError> {
    let mut pipelines = Pipelines::default();
    let [tokens, experts, top_k, hidden, width] = options.grouped;
    let reps = options.reps;
    let counts = skewed_counts(experts, tokens, top_k);
    let mut offsets = vec![0u32];
    for &c in &counts {
        offsets.push(offsets.last().unwrap() + c);
    }
    let slots = *offsets.last().unwrap() as usize;
    let rows: Vec<u32> = (0..slots.max(1)).map(|s| (s % tokens) as u32).collect();
    let ob = ctx.upload("offsets", &offsets)?;
    let rb = ctx.upload("rows", &rows)?;
    for (label, n, k, gather) in [("gate_up", 2 * width, hidden, true), ("down", hidden, width, false)] {
        let a_rows = if gather { tokens } else { slots.max(1) };
        let ab = ctx.upload("a", &seeded(a_rows * k, 1, 1.0))?;
        let wb = ctx.upload("w", &seeded(experts * n * k, 2, 1.0))?;
        let cb = ctx.storage_buffer("c", (slots.max(1) * n * 4) as u64)?;
        let params = GroupedGemmParams {
            n: n as u32,
            k: k as u32,
            groups: experts as u32,
            max_rows: tokens as u32,
            a_rs: k as u32,
            b_group_stride: (n * k) as u32,
            c_rs: n as u32,
            gather: gather as u32,
            ..bytemuck::Zeroable::zeroed()
        };
        for &tile in grouped_gemm::TILES {
            let pipeline = pipelines.get_source(ctx, grouped_gemm::source(tile))?;
            let mut plan = PlanBuilder::new(ctx);
            for _ in 0..reps {
                plan.push(
                    &pipeline,
                    &params,
                    &[&ab, &wb, &ob, &rb, &cb],
                    grouped_gemm::workgroups(tile, n as u32, tokens as u32, experts as u32),
                );
            }
            let plan = plan.finish(ctx)?;
            plan.run(ctx)?;
            let t0 = std::time::Instant::now();
            plan.run(ctx)?;
            let secs = t0.elapsed().as_secs_f64() / f64::from(reps);
            let gflops = 2.0 * (slots * n * k) as f64 / secs / 1e9;
            let chosen = if dg_gpu::planner::portable::choose_grouped(n as u32, k as u32, slots as u32, experts as u32) == tile {
                " (chosen)"
            } else {
                ""
            };
            println!(
                "{} grouped {label} {slots} slots / {experts} experts, n {n} k {k} [{}]{chosen}: {:.3} ms, {gflops:.1} GFLOP/s",
                ctx.info.name,
                tile.label(),
                secs * 1e3
            );
        }
    }
    Ok(())
}

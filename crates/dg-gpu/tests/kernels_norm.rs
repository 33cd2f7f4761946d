//! Kernel-level parity of the norm kernel against dg-cpu's RMSNorm: weighted, weightless,
//! accumulate + scale (the fused residual add and layer scalar), per-head shapes including the
//! real head dims, and a single row.

use dg_gpu::testing::{guarded_output, max_rel_err, read_guarded, seeded, test_context};
use dg_gpu::{GpuContext, PlanBuilder, Pipelines, groups_1d};
use dg_kernels::rmsnorm::{self, ACCUMULATE, RmsNormParams, WEIGHTED};

/// f32 reductions in a different order and `1/sqrt` vs `pow`: a few ulps per element.
const NORM_TOLERANCE: f32 = 2e-6;

fn run(ctx: &GpuContext, rows: usize, dim: usize, flags: u32, scale: f32) {
    let x = seeded(rows * dim, 1 + rows as u64 * 31 + dim as u64, 3.0);
    let w = seeded(dim, 2, 1.5);
    let base = seeded(rows * dim, 3, 2.0);
    let mut pipelines = Pipelines::default();
    let p = pipelines.get(ctx, rmsnorm::source()).unwrap();
    let xb = ctx.upload("x", &x).unwrap();
    let wb = ctx.upload("w", &w).unwrap();
    let out = guarded_output(ctx, "out", rows * dim);
    ctx.queue.write_buffer(&out, 0, bytemuck::cast_slice(&base));
    let mut plan = PlanBuilder::new(ctx);
    let params = RmsNormParams { rows: rows as u32, dim: dim as u32, eps: 1e-6, flags, scale, _pad: [0; 3] };
    plan.push(&p, &params, &[&xb, &wb, &out], groups_1d(rows as u32, ctx.limits.max_compute_workgroups_per_dimension));
    plan.finish(ctx).unwrap().run(ctx).unwrap();
    let got = read_guarded(ctx, &out, rows * dim);

    let mut want = x.clone();
    dg_cpu::ops::rms_norm_rows(&mut want, dim, (flags & WEIGHTED != 0).then_some(&w[..]), 1e-6);
    if flags & ACCUMULATE != 0 {
        want.iter_mut().zip(&base).for_each(|(y, b)| *y += b);
    }
    want.iter_mut().for_each(|y| *y *= scale);
    let (err, at) = max_rel_err(&got, &want);
    assert!(err <= NORM_TOLERANCE, "rows={rows} dim={dim} flags={flags}: rel err {err} at {at}: {} vs {}", got[at], want[at]);
}

#[test]
fn rmsnorm_matches_cpu() {
    let Some(ctx) = test_context("rmsnorm_matches_cpu") else { return };
    for &(rows, dim) in &[(1, 1), (1, 7), (3, 2816), (33, 256), (5, 512), (64, 48), (300, 100)] {
        for (flags, scale) in [(WEIGHTED, 1.0), (0, 1.0), (WEIGHTED | ACCUMULATE, 0.75)] {
            run(&ctx, rows, dim, flags, scale);
        }
    }
}

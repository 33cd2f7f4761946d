//! Kernel-level parity of the norm kernel against dg-cpu's RMSNorm: weighted, weightless,
//! accumulate + scale (the fused residual add and layer scalar), per-head shapes including the
//! real head dims, and a single row.
//!
//! Also the two fused residual-norm kernels of `dg_kernels::residual_norms` (the residual add and
//! norms after attention, and those after the feed-forward blocks), each against the CPU chain of
//! `dg_cpu::ops::rms_norm_rows` steps it stands for and against the three `rmsnorm` dispatches it
//! replaces, run in one plan. Every read-write buffer carries a guard band, and every case also
//! runs with its workgroups folded into y by 3 per dimension (rows that leave dead workgroups
//! included).

use dg_gpu::{GpuContext, Pipelines, PlanBuilder, groups_1d};
use dg_kernels::residual_norms::{self, AttentionResidualNormsParams, FfnResidualNormsParams};
use dg_kernels::rmsnorm::{self, ACCUMULATE, RmsNormParams, WEIGHTED};
use dg_kernels::row_reduce::RowReduce;
use dg_parity::testing::{GUARD, guarded_output, max_rel_err, read_guarded, seeded, test_context};

/// f32 reductions in a different order and `1/sqrt` vs `pow`: a few ulps per element.
const NORM_TOLERANCE: f32 = 2e-6;

fn run(ctx: &GpuContext, (reduce, lanes): (RowReduce, u32), rows: usize, dim: usize, flags: u32, scale: f32) {
    let x = seeded(rows * dim, 1 + rows as u64 * 31 + dim as u64, 3.0);
    let w = seeded(dim, 2, 1.5);
    let base = seeded(rows * dim, 3, 2.0);
    let mut pipelines = Pipelines::default();
    let p = pipelines.get_source(ctx, rmsnorm::source_lanes(reduce, lanes)).unwrap();
    let xb = ctx.upload("x", &x).unwrap();
    let wb = ctx.upload("w", &w).unwrap();
    let out = guarded_output(ctx, "out", rows * dim);
    ctx.queue.write_buffer(&out, 0, bytemuck::cast_slice(&base));
    let mut plan = PlanBuilder::new(ctx);
    let params = RmsNormParams {
        rows: rows as u32,
        dim: dim as u32,
        eps: 1e-6,
        flags,
        scale,
        splits: 1,
        split_stride: 0,
        x_offset: 0,
        out_offset: 0,
        _pad: [0; 3],
    };
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

/// The row kernels' variants a device runs on rows of `dim`: every row reduction, one column at
/// a time and, where `dim` is a multiple of 4, four.
fn variants(ctx: &GpuContext, dim: usize) -> Vec<(RowReduce, u32)> {
    let lanes: &[u32] = if dim.is_multiple_of(4) { &[1, 4] } else { &[1] };
    ctx.row_reduces().into_iter().flat_map(|r| lanes.iter().map(move |&l| (r, l))).collect()
}

#[test]
fn rmsnorm_matches_cpu() {
    let Some(ctx) = test_context("rmsnorm_matches_cpu") else { return };
    eprintln!("rmsnorm_matches_cpu: row reductions {:?}", ctx.row_reduces());
    for &(rows, dim) in &[(1, 1), (1, 7), (3, 2816), (33, 256), (5, 512), (64, 48), (300, 100)] {
        for (flags, scale) in [(WEIGHTED, 1.0), (0, 1.0), (WEIGHTED | ACCUMULATE, 0.75)] {
            for variant in variants(&ctx, dim) {
                run(&ctx, variant, rows, dim, flags, scale);
            }
        }
    }
}

/// `x_offset` and `out_offset` (the decoder's V rows: the second half of a [K | V] product
/// written into the cache at the canvas's rows): the rows read from and written at their
/// offsets, bit for bit what the norm gives without them, every other element of `out` untouched.
#[test]
fn rmsnorm_reads_and_writes_at_offsets() {
    let Some(ctx) = test_context("rmsnorm_reads_and_writes_at_offsets") else { return };
    let (rows, dim) = (6usize, 256usize);
    for (reduce, lanes) in variants(&ctx, dim) {
        let (x_offset, out_offset) = (6 * 256, 3 * 256 + 4);
        let x = seeded(2 * rows * dim, 41, 3.0);
        let mut pipelines = Pipelines::default();
        let p = pipelines.get_source(&ctx, rmsnorm::source_lanes(reduce, lanes)).unwrap();
        let xb = ctx.upload("x", &x).unwrap();
        let plain = guarded_output(&ctx, "plain", rows * dim);
        let placed = guarded_output(&ctx, "placed", out_offset + rows * dim + 100);
        let before = seeded(out_offset + rows * dim + 100, 42, 1.0);
        ctx.queue.write_buffer(&placed, 0, bytemuck::cast_slice(&before));
        let params = |x_offset: usize, out_offset: usize| RmsNormParams {
            rows: rows as u32,
            dim: dim as u32,
            eps: 1e-6,
            flags: 0,
            scale: 1.0,
            splits: 1,
            split_stride: 0,
            x_offset: x_offset as u32,
            out_offset: out_offset as u32,
            _pad: [0; 3],
        };
        let xv = ctx.upload("x second half", &x[x_offset..]).unwrap();
        let mut plan = PlanBuilder::new(&ctx);
        let groups = groups_1d(rows as u32, ctx.limits.max_compute_workgroups_per_dimension);
        plan.push(&p, &params(0, 0), &[&xv, &xb, &plain], groups);
        plan.push(&p, &params(x_offset, out_offset), &[&xb, &xb, &placed], groups);
        plan.finish(&ctx).unwrap().run(&ctx).unwrap();
        let want = read_guarded(&ctx, &plain, rows * dim);
        let got = read_guarded(&ctx, &placed, out_offset + rows * dim + 100);
        assert!(got[out_offset..out_offset + rows * dim] == want[..], "rows at offsets differ from the plain norm");
        assert!(
            got[..out_offset] == before[..out_offset] && got[out_offset + rows * dim..] == before[out_offset + rows * dim..],
            "elements outside the rows changed"
        );
    }
}

// Against the CPU chain of `rms_norm_rows` steps the single-norm `NORM_TOLERANCE` still holds:
// the chain compounds, but each norm rescales its input by that row's own rms, so an input error of
// a few ulps of the row stays a few ulps of the output rather than growing, and each residual sum
// (`hidden + …`, `dense + …`) adds one rounding of its larger term.

/// Against the three `rmsnorm` dispatches a fused kernel replaces: the same operations in the same
/// order (the same per-invocation sums and tree, `1/sqrt`, products and adds), so only the driver's
/// FMA contraction of a multiply-add may differ between the compilations, one rounding that the
/// following norm carries on: an ulp or two of the largest output.
const FUSED_VS_CHAIN_TOLERANCE: f32 = 3e-7;
const EPS: f32 = 1e-6;
/// `(rows, dim)`: a single element, a row shorter than the workgroup, the model's hidden size
/// (2816, eleven elements per invocation), a row of exactly one workgroup, and rows that fold by 3
/// per dimension into several rows of y, some leaving dead workgroups (5 → 3 × 2, 64 → 3 × 22,
/// 300 → 3 × 100).
const RESIDUAL_SHAPES: &[(usize, usize)] = &[(1, 1), (1, 7), (3, 2816), (5, 512), (33, 256), (64, 48), (300, 100)];

/// `rms(x)·w` row by row, the CPU twin of one weighted `rmsnorm` step.
fn normed(x: &[f32], dim: usize, w: &[f32]) -> Vec<f32> {
    let mut y = x.to_vec();
    dg_cpu::ops::rms_norm_rows(&mut y, dim, Some(w), EPS);
    y
}

/// Asserts that every output is within `tolerance` of its reference (relative to the reference's
/// largest value); returns the largest of those errors.
fn check(what: &str, names: &[&str], got: &[Vec<f32>], want: &[Vec<f32>], tolerance: f32) -> f32 {
    let mut worst = 0f32;
    for ((name, g), w) in names.iter().zip(got).zip(want) {
        let (err, at) = max_rel_err(g, w);
        assert!(err <= tolerance, "{what}: {name}: rel err {err} at {at}: {} vs {}", g[at], w[at]);
        worst = worst.max(err);
    }
    worst
}

/// Inputs of one `attention_residual_norms` case.
struct AttentionCase {
    rows: usize,
    dim: usize,
    x: Vec<f32>,
    w_res: Vec<f32>,
    w_a: Vec<f32>,
    w_b: Vec<f32>,
    w_c: Vec<f32>,
    hidden: Vec<f32>,
    scale_a: f32,
    scale_b: f32,
    scale_c: f32,
}

impl AttentionCase {
    fn new(rows: usize, dim: usize) -> Self {
        let seed = 1000 + rows as u64 * 31 + dim as u64;
        let scales = seeded(3, seed + 5, 1.0);
        AttentionCase {
            rows,
            dim,
            x: seeded(rows * dim, seed, 3.0),
            w_res: seeded(dim, seed + 1, 1.5),
            w_a: seeded(dim, seed + 2, 1.5),
            w_b: seeded(dim, seed + 3, 1.5),
            w_c: seeded(dim, seed + 6, 1.5),
            hidden: seeded(rows * dim, seed + 4, 4.0),
            scale_a: 1.0 + 0.5 * scales[0],
            scale_b: 2.0 * scales[1],
            scale_c: 0.5 + scales[2],
        }
    }

    fn params(&self) -> AttentionResidualNormsParams {
        AttentionResidualNormsParams {
            rows: self.rows as u32,
            dim: self.dim as u32,
            eps: EPS,
            scale_a: self.scale_a,
            scale_b: self.scale_b,
            scale_c: self.scale_c,
            splits: 1,
            split_stride: 0,
        }
    }

    /// `[hidden, out_a, out_b, out_c]` on the CPU, step by step.
    fn reference(&self) -> [Vec<f32>; 4] {
        let residual = normed(&self.x, self.dim, &self.w_res);
        let hidden: Vec<f32> = self.hidden.iter().zip(&residual).map(|(h, r)| h + r).collect();
        let out_a = normed(&hidden, self.dim, &self.w_a).iter().map(|v| v * self.scale_a).collect();
        let out_b = normed(&hidden, self.dim, &self.w_b).iter().map(|v| v * self.scale_b).collect();
        let out_c = normed(&hidden, self.dim, &self.w_c).iter().map(|v| v * self.scale_c).collect();
        [hidden, out_a, out_b, out_c]
    }

    /// `[hidden, out_a, out_b, out_c]` from the fused kernel (`out_b`, `out_c` the halves of its
    /// `out_bc`), or from the four `rmsnorm` dispatches it replaces, with workgroups folded at
    /// `max_dim` per dimension.
    fn run(&self, ctx: &GpuContext, (reduce, lanes): (RowReduce, u32), fused: bool, max_dim: u32) -> [Vec<f32>; 4] {
        let n = self.rows * self.dim;
        let mut pipelines = Pipelines::default();
        let x = ctx.upload("x", &self.x).unwrap();
        let w_res = ctx.upload("w_res", &self.w_res).unwrap();
        let w_a = ctx.upload("w_a", &self.w_a).unwrap();
        let w_b = ctx.upload("w_b", &self.w_b).unwrap();
        let w_c = ctx.upload("w_c", &self.w_c).unwrap();
        let hidden = guarded_output(ctx, "hidden", n);
        ctx.queue.write_buffer(&hidden, 0, bytemuck::cast_slice(&self.hidden));
        let out_a = guarded_output(ctx, "out_a", n);
        let out_b = guarded_output(ctx, "out_b", n);
        let out_c = guarded_output(ctx, "out_c", n);
        let out_bc = guarded_output(ctx, "out_bc", 2 * n);
        let groups = groups_1d(residual_norms::workgroups(self.rows as u32), max_dim);
        let mut plan = PlanBuilder::new(ctx);
        if fused {
            let p = pipelines.get_source(ctx, residual_norms::source_attention_lanes(reduce, lanes)).unwrap();
            plan.push(&p, &self.params(), &[&x, &w_res, &w_a, &w_b, &w_c, &hidden, &out_a, &out_bc], groups);
        } else {
            let p = pipelines.get_source(ctx, rmsnorm::source_lanes(reduce, lanes)).unwrap();
            let norm = |flags, scale| RmsNormParams {
                rows: self.rows as u32,
                dim: self.dim as u32,
                eps: EPS,
                flags,
                scale,
                splits: 1,
                split_stride: 0,
                x_offset: 0,
                out_offset: 0,
                _pad: [0; 3],
            };
            plan.push(&p, &norm(WEIGHTED | ACCUMULATE, 1.0), &[&x, &w_res, &hidden], groups);
            plan.push(&p, &norm(WEIGHTED, self.scale_a), &[&hidden, &w_a, &out_a], groups);
            plan.push(&p, &norm(WEIGHTED, self.scale_b), &[&hidden, &w_b, &out_b], groups);
            plan.push(&p, &norm(WEIGHTED, self.scale_c), &[&hidden, &w_c, &out_c], groups);
        }
        plan.finish(ctx).unwrap().run(ctx).unwrap();
        let (b, c) = if fused {
            let bc = read_guarded(ctx, &out_bc, 2 * n);
            (bc[..n].to_vec(), bc[n..].to_vec())
        } else {
            (read_guarded(ctx, &out_b, n), read_guarded(ctx, &out_c, n))
        };
        [read_guarded(ctx, &hidden, n), read_guarded(ctx, &out_a, n), b, c]
    }
}

/// Inputs of one `ffn_residual_norms` case.
struct FfnCase {
    rows: usize,
    dim: usize,
    mlp: Vec<f32>,
    w_1: Vec<f32>,
    moe: Vec<f32>,
    w_2: Vec<f32>,
    w_3: Vec<f32>,
    hidden: Vec<f32>,
    scalar: f32,
    w_next: Vec<f32>,
}

impl FfnCase {
    fn new(rows: usize, dim: usize) -> Self {
        let seed = 2000 + rows as u64 * 37 + dim as u64;
        FfnCase {
            rows,
            dim,
            mlp: seeded(rows * dim, seed, 3.0),
            w_1: seeded(dim, seed + 1, 1.5),
            moe: seeded(rows * dim, seed + 2, 0.5),
            w_2: seeded(dim, seed + 3, 1.5),
            w_3: seeded(dim, seed + 4, 1.5),
            hidden: seeded(rows * dim, seed + 5, 4.0),
            scalar: 1.0 + 0.5 * seeded(1, seed + 6, 1.0)[0],
            w_next: seeded(dim, seed + 7, 1.5),
        }
    }

    fn params(&self, next_norm: bool) -> FfnResidualNormsParams {
        FfnResidualNormsParams {
            rows: self.rows as u32,
            dim: self.dim as u32,
            eps: EPS,
            scalar: self.scalar,
            splits: 1,
            split_stride: 0,
            next_norm: u32::from(next_norm),
            top_k: 0,
        }
    }

    /// `[hidden, normed]` on the CPU, step by step.
    fn reference(&self) -> [Vec<f32>; 2] {
        let mut dense = normed(&self.mlp, self.dim, &self.w_1);
        dense.iter_mut().zip(normed(&self.moe, self.dim, &self.w_2)).for_each(|(d, m)| *d += m);
        let post = normed(&dense, self.dim, &self.w_3);
        let hidden: Vec<f32> = self.hidden.iter().zip(&post).map(|(h, p)| (h + p) * self.scalar).collect();
        let next = normed(&hidden, self.dim, &self.w_next);
        [hidden, next]
    }

    /// `[hidden, normed]` from the fused kernel (with the next norm), or from the four `rmsnorm`
    /// dispatches it replaces, with workgroups folded at `max_dim` per dimension.
    fn run(&self, ctx: &GpuContext, (reduce, lanes): (RowReduce, u32), fused: bool, max_dim: u32) -> [Vec<f32>; 2] {
        let [hidden, normed] = self.run_with(ctx, (reduce, lanes), fused.then_some(true), max_dim);
        [hidden, normed]
    }

    /// `[hidden, normed]` from the fused kernel (`Some(next_norm)`) or the `rmsnorm` chain
    /// (`None`). `normed` starts out holding guard values.
    fn run_with(&self, ctx: &GpuContext, (reduce, lanes): (RowReduce, u32), fused: Option<bool>, max_dim: u32) -> [Vec<f32>; 2] {
        let n = self.rows * self.dim;
        let mut pipelines = Pipelines::default();
        let mlp = ctx.upload("mlp", &self.mlp).unwrap();
        let w_1 = ctx.upload("w_1", &self.w_1).unwrap();
        let moe = ctx.upload("moe", &self.moe).unwrap();
        let w_2 = ctx.upload("w_2", &self.w_2).unwrap();
        let w_3 = ctx.upload("w_3", &self.w_3).unwrap();
        let w_next = ctx.upload("w_next", &self.w_next).unwrap();
        let normed = guarded_output(ctx, "normed", n);
        let dense = guarded_output(ctx, "dense", n);
        let hidden = guarded_output(ctx, "hidden", n);
        ctx.queue.write_buffer(&hidden, 0, bytemuck::cast_slice(&self.hidden));
        let groups = groups_1d(residual_norms::workgroups(self.rows as u32), max_dim);
        let mut plan = PlanBuilder::new(ctx);
        if let Some(next_norm) = fused {
            let p = pipelines.get_source(ctx, residual_norms::source_ffn_lanes(reduce, lanes)).unwrap();
            plan.push(&p, &self.params(next_norm), &[&mlp, &w_1, &moe, &w_2, &w_3, &hidden, &w_next, &normed], groups);
        } else {
            let p = pipelines.get_source(ctx, rmsnorm::source_lanes(reduce, lanes)).unwrap();
            let norm = |flags, scale| RmsNormParams {
                rows: self.rows as u32,
                dim: self.dim as u32,
                eps: EPS,
                flags,
                scale,
                splits: 1,
                split_stride: 0,
                x_offset: 0,
                out_offset: 0,
                _pad: [0; 3],
            };
            plan.push(&p, &norm(WEIGHTED, 1.0), &[&mlp, &w_1, &dense], groups);
            plan.push(&p, &norm(WEIGHTED | ACCUMULATE, 1.0), &[&moe, &w_2, &dense], groups);
            plan.push(&p, &norm(WEIGHTED | ACCUMULATE, self.scalar), &[&dense, &w_3, &hidden], groups);
            plan.push(&p, &norm(WEIGHTED, 1.0), &[&hidden, &w_next, &normed], groups);
        }
        plan.finish(ctx).unwrap().run(ctx).unwrap();
        [read_guarded(ctx, &hidden, n), read_guarded(ctx, &normed, n)]
    }
}

/// A fused norm kernel's case: its outputs by name, on the CPU and on the GPU (fused, or as the
/// chain of `rmsnorm` dispatches it replaces).
trait FusedCase {
    const NAMES: &'static [&'static str];
    fn new(rows: usize, dim: usize) -> Self;
    fn reference(&self) -> Vec<Vec<f32>>;
    fn run(&self, ctx: &GpuContext, variant: (RowReduce, u32), fused: bool, max_dim: u32) -> Vec<Vec<f32>>;
}

impl FusedCase for AttentionCase {
    const NAMES: &'static [&'static str] = &["hidden", "out_a", "out_b", "out_c"];
    fn new(rows: usize, dim: usize) -> Self {
        AttentionCase::new(rows, dim)
    }
    fn reference(&self) -> Vec<Vec<f32>> {
        AttentionCase::reference(self).to_vec()
    }
    fn run(&self, ctx: &GpuContext, (reduce, lanes): (RowReduce, u32), fused: bool, max_dim: u32) -> Vec<Vec<f32>> {
        AttentionCase::run(self, ctx, (reduce, lanes), fused, max_dim).to_vec()
    }
}

impl FusedCase for FfnCase {
    const NAMES: &'static [&'static str] = &["hidden", "normed"];
    fn new(rows: usize, dim: usize) -> Self {
        FfnCase::new(rows, dim)
    }
    fn reference(&self) -> Vec<Vec<f32>> {
        FfnCase::reference(self).to_vec()
    }
    fn run(&self, ctx: &GpuContext, (reduce, lanes): (RowReduce, u32), fused: bool, max_dim: u32) -> Vec<Vec<f32>> {
        FfnCase::run(self, ctx, (reduce, lanes), fused, max_dim).to_vec()
    }
}

/// Every shape of [`RESIDUAL_SHAPES`], with the device's workgroup limit and one of 3 (folding into
/// y): the fused kernel against the CPU chain and against the `rmsnorm` chain on the GPU.
fn check_fused<C: FusedCase>(test: &str) {
    let Some(ctx) = test_context(test) else { return };
    let (mut worst_cpu, mut worst_chain) = (0f32, 0f32);
    for &(rows, dim) in RESIDUAL_SHAPES {
        let case = C::new(rows, dim);
        let want = case.reference();
        for (max_dim, variant) in [ctx.limits.max_compute_workgroups_per_dimension, 3]
            .into_iter()
            .flat_map(|m| variants(&ctx, dim).into_iter().map(move |v| (m, v)))
        {
            let what = format!("rows={rows} dim={dim} fold={max_dim} {variant:?}");
            let got = case.run(&ctx, variant, true, max_dim);
            worst_cpu = worst_cpu.max(check(&format!("{what} vs cpu"), C::NAMES, &got, &want, NORM_TOLERANCE));
            let chain = case.run(&ctx, variant, false, max_dim);
            worst_chain = worst_chain.max(check(&format!("{what} vs the rmsnorm chain"), C::NAMES, &got, &chain, FUSED_VS_CHAIN_TOLERANCE));
        }
    }
    eprintln!("{test}: max rel err {worst_cpu:e} vs cpu, {worst_chain:e} vs the rmsnorm chain");
}

#[test]
fn attention_residual_norms_match_cpu_and_the_chain() {
    check_fused::<AttentionCase>("attention_residual_norms_match_cpu_and_the_chain");
}

#[test]
fn ffn_residual_norms_match_cpu_and_the_chain() {
    check_fused::<FfnCase>("ffn_residual_norms_match_cpu_and_the_chain");
}

/// Without `next_norm` the kernel updates `hidden` to the same bits and leaves `normed` (guard
/// values here) untouched.
#[test]
fn ffn_residual_norms_without_the_next_norm_leave_normed_alone() {
    let Some(ctx) = test_context("ffn_residual_norms_without_the_next_norm_leave_normed_alone") else { return };
    for &(rows, dim) in RESIDUAL_SHAPES {
        let case = FfnCase::new(rows, dim);
        for variant in variants(&ctx, dim) {
            let max_dim = ctx.limits.max_compute_workgroups_per_dimension;
            let [with_hidden, _] = case.run_with(&ctx, variant, Some(true), max_dim);
            let [hidden, normed] = case.run_with(&ctx, variant, Some(false), max_dim);
            assert!(hidden == with_hidden, "rows={rows} dim={dim} {variant:?}: hidden differs without the next norm");
            assert!(normed.iter().all(|&v| v == GUARD), "rows={rows} dim={dim} {variant:?}: normed was written without the next norm");
        }
    }
}

/// The half variant of the norms after attention (`residual_norms::source_attention_half`, the
/// experts' input for tensor cores that read f16) against the f32 kernel: `hidden`, `out_a` and
/// `out_bc[1]` the same bits, and `out_bc[0]` packed from the buffer's start as those f32 values
/// rounded to nearest even (subnormal halves included, as the GEMMs' staging converts them), with
/// the workgroups folded.
#[test]
fn attention_residual_norms_half_packs_the_experts_input_as_f16() {
    let test = "attention_residual_norms_half_packs_the_experts_input_as_f16";
    let Some(ctx) = test_context(test) else { return };
    let mut pipelines = Pipelines::default();
    for (rows, dim) in [(3usize, 8usize), (5, 2816)] {
        let mut case = AttentionCase::new(rows, dim);
        // Outputs small enough to round to subnormal halves, and one past the f16 range.
        case.w_b[0] = 1e-6;
        case.w_b[1] = 1e-3;
        case.w_b[2] = 1e6;
        let n = rows * dim;
        for max_dim in [ctx.limits.max_compute_workgroups_per_dimension, 2] {
            let mut run = |half: bool| -> [Vec<f32>; 3] {
                let up = |name: &str, v: &[f32]| ctx.upload(name, v).unwrap();
                let (x, w_res, w_a, w_b, w_c) =
                    (up("x", &case.x), up("w_res", &case.w_res), up("w_a", &case.w_a), up("w_b", &case.w_b), up("w_c", &case.w_c));
                let hidden = guarded_output(&ctx, "hidden", n);
                ctx.queue.write_buffer(&hidden, 0, bytemuck::cast_slice(&case.hidden));
                let (out_a, out_bc) = (guarded_output(&ctx, "out_a", n), guarded_output(&ctx, "out_bc", 2 * n));
                let source = if half {
                    residual_norms::source_attention_half(RowReduce::ALL[0])
                } else {
                    residual_norms::source_attention_lanes(RowReduce::ALL[0], 4)
                };
                let kernel = pipelines.get_source(&ctx, source).unwrap();
                let mut plan = PlanBuilder::new(&ctx);
                plan.push(
                    &kernel,
                    &case.params(),
                    &[&x, &w_res, &w_a, &w_b, &w_c, &hidden, &out_a, &out_bc],
                    groups_1d(rows as u32, max_dim),
                );
                plan.finish(&ctx).unwrap().run(&ctx).unwrap();
                [read_guarded(&ctx, &hidden, n), read_guarded(&ctx, &out_a, n), read_guarded(&ctx, &out_bc, 2 * n)]
            };
            let (full, half) = (run(false), run(true));
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
            assert_eq!(bits(&half[0]), bits(&full[0]), "{rows}x{dim} fold {max_dim}: hidden");
            assert_eq!(bits(&half[1]), bits(&full[1]), "{rows}x{dim} fold {max_dim}: out_a");
            assert_eq!(bits(&half[2][n..]), bits(&full[2][n..]), "{rows}x{dim} fold {max_dim}: out_bc[1]");
            let want: Vec<u16> = full[2][..n].iter().map(|&v| half::f16::from_f32(v).to_bits()).collect();
            let got: Vec<u16> = half[2][..n / 2]
                .iter()
                .flat_map(|w| {
                    let b = w.to_bits();
                    [b as u16, (b >> 16) as u16]
                })
                .collect();
            let subnormal = want.iter().filter(|&&h| h & 0x7c00 == 0 && h & 0x3ff != 0).count();
            assert!(
                subnormal > 0 && want.iter().any(|&h| h & 0x7fff == 0x7c00),
                "{rows}x{dim}: the case should reach subnormal and infinite halves"
            );
            if let Some(i) = (0..n).find(|&i| got[i] != want[i]) {
                panic!("{rows}x{dim} fold {max_dim}: half {i} is {:#06x}, {} rounds to {:#06x}", got[i], full[2][i], want[i]);
            }
        }
    }
}

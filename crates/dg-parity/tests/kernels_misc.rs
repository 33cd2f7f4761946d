//! Kernel-level parity of the element-wise and row-wise kernels against dg-cpu: RoPE (default and
//! proportional tables at the real head dims), softmax (plain rows up to the vocab width, causal
//! and sliding-window masks, image spans seen whole), the gated GELU (split and fused layouts, huge inputs), the chunked
//! embedding lookup, axpby and the split-K reduction. Every output carries a guard band, and every kernel also runs with
//! its workgroups folded into y (an artificially small per-dimension limit) to exercise the
//! wrap-around indexing and the out-of-range workgroups.

use dg_cpu::attention::Mask;
use dg_gpu::{GpuContext, Pipelines, PlanBuilder, groups_1d};
use dg_kernels::axpby::{self, AxpbyParams};
use dg_kernels::embed::{self, EmbedParams};
use dg_kernels::gelu_glu::{self, GeluGluParams};
use dg_kernels::rope::{self, RopeParams};
use dg_kernels::row_reduce::RowReduce;
use dg_kernels::softmax::{self, MODE_ALL, MODE_CAUSAL, SoftmaxParams};
use dg_kernels::split_k::{self, SplitKParams};
use dg_model::{LayerKind, LayerSpec, RopeSpec};
use dg_parity::testing::{guarded_output, max_rel_err, read_guarded, seeded, test_context};

/// RoPE: two products and a sum per element (possibly fused into an FMA on the GPU): a couple of
/// ulps of the largest element.
const ROPE_TOLERANCE: f32 = 5e-7;
/// Softmax: the GPU merges per-invocation running sums (a different summation order from the
/// CPU's sequential sum) and its `exp` may differ by an ulp or two; relative to the row's largest
/// probability.
const SOFTMAX_TOLERANCE: f32 = 5e-6;
/// Vocab rows (262144 columns) against the CPU: the CPU's sequential f32 sum of 262144 terms
/// drifts by ~1.7e-4 relative (measured against f64), while the GPU's tree of 256 partial sums
/// stays within ~1e-6; so the CPU comparison is loose and the f64 comparison is tight.
const SOFTMAX_VOCAB_CPU_TOLERANCE: f32 = 4e-4;
const SOFTMAX_VOCAB_EXACT_TOLERANCE: f32 = 3e-6;
/// Gated GELU: `tanh` within a few ulps (absolute, next to 1), scaled by `0.5·|x|·|up|`: measured
/// per element against `|x·up|`.
const GELU_TOLERANCE: f32 = 1e-6;
/// Embedding: one multiply, exact up to the rounding of the same product.
const EMBED_TOLERANCE: f32 = 0.0;
/// axpby: two products and a sum (possibly one FMA): an ulp or two of the largest term.
const AXPBY_TOLERANCE: f32 = 3e-7;

/// Split-K reduction: a sum of a few partials in order, alpha, accumulate and `tanh` (a few ulps of
/// the cap): an ulp or two of the largest term, plus the tanh's.
const SPLIT_K_TOLERANCE: f32 = 2e-6;

/// The per-dimension limits to run every case with: the device's own and a tiny one that folds
/// the workgroups into y.
fn limits(ctx: &GpuContext) -> [u32; 2] {
    [ctx.limits.max_compute_workgroups_per_dimension, 3]
}

/// Every fold of [`limits`] with every row reduction the device runs, one column at a time and,
/// for rows of `cols` a multiple of 4, four.
fn folds_and_reduces(ctx: &GpuContext, cols: usize) -> Vec<(u32, (RowReduce, u32))> {
    limits(ctx).into_iter().flat_map(|m| row_variants(ctx, cols).into_iter().map(move |v| (m, v))).collect()
}

/// The row kernels' variants for rows of `cols`: every row reduction, 1 column at a time and, where
/// `cols` is a multiple of 4, 4.
fn row_variants(ctx: &GpuContext, cols: usize) -> Vec<(RowReduce, u32)> {
    let lanes: &[u32] = if cols.is_multiple_of(4) { &[1, 4] } else { &[1] };
    ctx.row_reduces().into_iter().flat_map(|r| lanes.iter().map(move |&l| (r, l))).collect()
}

fn rope_spec(proportional: bool, head_dim: usize) -> LayerSpec {
    let rope = if proportional {
        RopeSpec { theta: 1_000_000.0, proportional: true, partial_rotary_factor: 0.25, factor: 1.0 }
    } else {
        RopeSpec { theta: 10_000.0, proportional: false, partial_rotary_factor: 1.0, factor: 1.0 }
    };
    let kind = if proportional { LayerKind::Full } else { LayerKind::Sliding };
    LayerSpec { kind, head_dim, num_kv_heads: 1, rope }
}

#[test]
fn rope_matches_cpu() {
    let Some(ctx) = test_context("rope_matches_cpu") else { return };
    let mut pipelines = Pipelines::default();
    let p = pipelines.get_source(&ctx, rope::source()).unwrap();
    let cases = [
        // (proportional, head_dim, heads, start, tokens)
        (false, 8, 3, 0, 5),
        (false, 256, 16, 0, 7),
        (false, 256, 8, 4093, 33),
        (true, 512, 16, 0, 3),
        (true, 512, 2, 100_000, 17),
        (false, 8, 1, 7, 1),
    ];
    for (proportional, d, heads, start, tokens) in cases {
        let table = dg_cpu::rope::RopeTable::new(&rope_spec(proportional, d), start, tokens);
        let x = seeded(tokens * heads * d, 11 + d as u64 + tokens as u64, 2.0);
        let mut want = x.clone();
        table.apply(&mut want, heads);
        for max_dim in limits(&ctx) {
            let xb = guarded_output(&ctx, "x", x.len());
            ctx.queue.write_buffer(&xb, 0, bytemuck::cast_slice(&x));
            let cos = ctx.upload("cos", &table.cos).unwrap();
            let sin = ctx.upload("sin", &table.sin).unwrap();
            let params = RopeParams { tokens: tokens as u32, heads: heads as u32, half: (d / 2) as u32, _pad: 0 };
            let mut plan = PlanBuilder::new(&ctx);
            plan.push(&p, &params, &[&xb, &cos, &sin], groups_1d(rope::workgroups(&params), max_dim));
            plan.finish(&ctx).unwrap().run(&ctx).unwrap();
            let got = read_guarded(&ctx, &xb, x.len());
            let (err, at) = max_rel_err(&got, &want);
            assert!(
                err <= ROPE_TOLERANCE,
                "d={d} heads={heads} start={start} tokens={tokens} fold={max_dim}: rel err {err} at {at}: {} vs {}",
                got[at],
                want[at]
            );
            if proportional {
                // Dimensions 64..256 and 320..512 pass through unchanged (cos = 1, sin = 0).
                for (i, (g, v)) in got.iter().zip(&x).enumerate() {
                    let k = i % d % (d / 2);
                    if k >= 64 {
                        assert_eq!(g, v, "proportional pass-through dim {} of element {i}", i % d);
                    }
                }
            }
        }
    }
}

/// Visible key range of query `t`: keys `[lo, hi)` as `dg_cpu::attention::Mask` gives them.
fn visible(p: &SoftmaxParams, t: usize, keys: usize) -> (usize, usize) {
    if p.mode == MODE_ALL {
        return Mask::None.visible(t, keys);
    }
    let span = p.span_start as usize..p.span_end as usize;
    let spans = if span.is_empty() { vec![] } else { vec![span] };
    let window = (p.window != 0).then_some(p.window as usize);
    Mask::Causal { key_start: p.key_start as usize, query_start: p.query_start as usize, window, spans: &spans }.visible(t, keys)
}

/// The CPU twin: `softmax_in_place` over the visible range (without the gap), exact zeros
/// elsewhere.
fn softmax_cpu(x: &[f32], p: &SoftmaxParams) -> Vec<f32> {
    let cols = p.cols as usize;
    let gap = p.gap_start as usize..p.gap_end as usize;
    let mut out = x.to_vec();
    for (r, row) in out.chunks_exact_mut(cols).enumerate() {
        let t = if p.mode == MODE_ALL { 0 } else { r % p.queries as usize };
        let (lo, hi) = visible(p, t, cols);
        let kept: Vec<usize> = (lo..hi).filter(|j| !gap.contains(j)).collect();
        let mut values: Vec<f32> = kept.iter().map(|&j| row[j]).collect();
        dg_cpu::ops::softmax_in_place(&mut values);
        row.fill(0.0);
        for (&j, v) in kept.iter().zip(values) {
            row[j] = v;
        }
    }
    out
}

fn run_softmax(ctx: &GpuContext, (reduce, lanes): (RowReduce, u32), x: &[f32], params: &SoftmaxParams, max_dim: u32) -> Vec<f32> {
    let mut pipelines = Pipelines::default();
    let p = pipelines.get_source(ctx, softmax::source_lanes(reduce, lanes)).unwrap();
    let xb = guarded_output(ctx, "x", x.len());
    ctx.queue.write_buffer(&xb, 0, bytemuck::cast_slice(x));
    let mut plan = PlanBuilder::new(ctx);
    plan.push(&p, params, &[&xb], groups_1d(softmax::workgroups(params), max_dim));
    plan.finish(ctx).unwrap().run(ctx).unwrap();
    read_guarded(ctx, &xb, x.len())
}

/// Per-row comparison (relative to each row's largest value); masked entries must be exactly 0.
fn check_softmax(got: &[f32], want: &[f32], cols: usize, tol: f32, what: &str) {
    for (r, (g, w)) in got.chunks_exact(cols).zip(want.chunks_exact(cols)).enumerate() {
        for (j, (a, b)) in g.iter().zip(w).enumerate() {
            if *b == 0.0 && *a != 0.0 {
                // Underflowed probabilities may be tiny on one side; masked ones are exact zeros.
                assert!(a.abs() < 1e-30, "{what}: row {r} col {j}: {a} where the CPU has 0");
            }
        }
        let (err, at) = max_rel_err(g, w);
        assert!(err <= tol, "{what}: row {r}: rel err {err} at col {at}: {} vs {}", g[at], w[at]);
    }
}

#[test]
fn softmax_plain_rows_match_cpu() {
    let Some(ctx) = test_context("softmax_plain_rows_match_cpu") else { return };
    for &(rows, cols, scale) in &[(1, 1, 3.0), (3, 7, 3.0), (5, 1000, 8.0), (1, 1000, 60.0), (2, 257, 1.0), (300, 9, 4.0)] {
        let x = seeded(rows * cols, 5 + rows as u64 * 7 + cols as u64, scale);
        let params = SoftmaxParams::plain(rows as u32, cols as u32);
        let want = softmax_cpu(&x, &params);
        for (max_dim, variant) in folds_and_reduces(&ctx, cols) {
            let got = run_softmax(&ctx, variant, &x, &params, max_dim);
            check_softmax(&got, &want, cols, SOFTMAX_TOLERANCE, &format!("{rows}x{cols} fold={max_dim} {variant:?}"));
        }
    }
    // Pre-masked scores (-inf) contribute nothing; a row of one finite value gives exactly 1.
    let x = vec![f32::NEG_INFINITY, 2.0, f32::NEG_INFINITY, 1.0, f32::NEG_INFINITY, 5.0, f32::NEG_INFINITY, f32::NEG_INFINITY];
    let params = SoftmaxParams::plain(2, 4);
    for variant in row_variants(&ctx, 4) {
        let got = run_softmax(&ctx, variant, &x, &params, ctx.limits.max_compute_workgroups_per_dimension);
        check_softmax(&got, &softmax_cpu(&x, &params), 4, SOFTMAX_TOLERANCE, &format!("-inf entries {variant:?}"));
        assert_eq!(&got[4..], &[0.0, 1.0, 0.0, 0.0]);
    }
}

#[test]
fn softmax_vocab_rows_match_cpu() {
    let Some(ctx) = test_context("softmax_vocab_rows_match_cpu") else { return };
    let cols = 262_144;
    let rows = 2;
    let x = seeded(rows * cols, 77, 12.0);
    let params = SoftmaxParams::plain(rows as u32, cols as u32);
    let want = softmax_cpu(&x, &params);
    for variant in row_variants(&ctx, cols) {
        let got = run_softmax(&ctx, variant, &x, &params, ctx.limits.max_compute_workgroups_per_dimension);
        check_softmax(&got, &want, cols, SOFTMAX_VOCAB_CPU_TOLERANCE, &format!("vocab rows vs CPU {variant:?}"));
        // Against an f64 softmax the GPU is much closer than the CPU.
        check_against_f64(&got, &x, cols, &format!("vocab {variant:?}"));
    }
}

/// Every row of `got` against an f64 softmax of `x`'s row (within
/// [`SOFTMAX_VOCAB_EXACT_TOLERANCE`]), and summing to 1.
fn check_against_f64(got: &[f32], x: &[f32], cols: usize, what: &str) {
    for (r, (g, xr)) in got.chunks_exact(cols).zip(x.chunks_exact(cols)).enumerate() {
        let m = xr.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
        let z: f64 = xr.iter().map(|&v| (v as f64 - m).exp()).sum();
        let exact: Vec<f32> = xr.iter().map(|&v| ((v as f64 - m).exp() / z) as f32).collect();
        let (err, at) = max_rel_err(g, &exact);
        assert!(err <= SOFTMAX_VOCAB_EXACT_TOLERANCE, "{what} row {r} vs f64: rel err {err} at {at}");
        let total: f64 = g.iter().map(|&v| v as f64).sum();
        assert!((total - 1.0).abs() < 1e-4, "{what} row {r} sums to {total}");
    }
}

/// `Recorder::softmax_rows` on the vocabulary's width: the rows spread over chunks of
/// `softmax_chunked::CHUNK` columns (a last chunk ragged at 20000 columns, one partial chunk of
/// 17000), against the CPU and an f64 softmax within the row kernel's tolerances; and a short row
/// going to the row kernel. Pre-masked -inf entries, one whole chunk of them, stay exact zeros.
#[test]
fn chunked_softmax_rows_match_cpu() {
    use dg_kernels::softmax_chunked::ChunkedSoftmaxParams;
    let Some(ctx) = test_context("chunked_softmax_rows_match_cpu") else { return };
    for &(rows, cols) in &[(2usize, 262_144usize), (3, 20_000), (5, 17_000), (2, 1000)] {
        let mut x = seeded(rows * cols, 91 + cols as u64, 12.0);
        if cols == 20_000 {
            x[cols..cols + 4096].fill(f32::NEG_INFINITY);
        }
        let mut pipelines = Pipelines::default();
        let xb = guarded_output(&ctx, "x", x.len());
        ctx.queue.write_buffer(&xb, 0, bytemuck::cast_slice(&x));
        let part = ctx.storage_buffer("pairs", ChunkedSoftmaxParams::new(rows as u32, cols as u32).pairs() * 8).unwrap();
        let mut rec = dg_gpu::ops::Recorder::new(&ctx, &mut pipelines);
        rec.softmax_rows(&xb, &part, rows, cols).unwrap();
        rec.finish().unwrap().run(&ctx).unwrap();
        let got = read_guarded(&ctx, &xb, x.len());
        let params = SoftmaxParams::plain(rows as u32, cols as u32);
        let tol = if cols >= 100_000 { SOFTMAX_VOCAB_CPU_TOLERANCE } else { SOFTMAX_TOLERANCE };
        check_softmax(&got, &softmax_cpu(&x, &params), cols, tol, &format!("chunked {rows}x{cols}"));
        check_against_f64(&got, &x, cols, &format!("chunked {rows}x{cols}"));
        if cols == 20_000 {
            assert!(got[cols..cols + 4096].iter().all(|&v| v == 0.0), "masked chunk not zero");
        }
    }
    // Both passes by hand with every row reduction the device runs (the Recorder takes the
    // device's own).
    let (rows, cols) = (3usize, 20_000usize);
    let mut x = seeded(rows * cols, 92, 12.0);
    x[cols..cols + 4096].fill(f32::NEG_INFINITY);
    let p = ChunkedSoftmaxParams::new(rows as u32, cols as u32);
    for reduce in ctx.row_reduces() {
        let mut pipelines = Pipelines::default();
        let partials = pipelines.get_source(&ctx, dg_kernels::softmax_chunked::partials(reduce)).unwrap();
        let apply = pipelines.get_source(&ctx, dg_kernels::softmax_chunked::apply(reduce)).unwrap();
        let xb = guarded_output(&ctx, "x", x.len());
        ctx.queue.write_buffer(&xb, 0, bytemuck::cast_slice(&x));
        let part = ctx.storage_buffer("pairs", p.pairs() * 8).unwrap();
        let mut plan = PlanBuilder::new(&ctx);
        let groups = groups_1d(p.workgroups(), ctx.limits.max_compute_workgroups_per_dimension);
        plan.push(&partials, &p, &[&xb, &part], groups);
        plan.push(&apply, &p, &[&xb, &part], groups);
        plan.finish(&ctx).unwrap().run(&ctx).unwrap();
        let got = read_guarded(&ctx, &xb, x.len());
        let what = format!("chunked by hand {rows}x{cols} {reduce:?}");
        check_softmax(&got, &softmax_cpu(&x, &SoftmaxParams::plain(rows as u32, cols as u32)), cols, SOFTMAX_TOLERANCE, &what);
        check_against_f64(&got, &x, cols, &what);
        assert!(got[cols..cols + 4096].iter().all(|&v| v == 0.0), "{what}: masked chunk not zero");
    }
    // A partials buffer too small is refused with the sizes.
    let xb = ctx.storage_buffer("x", 2 * 262_144 * 4).unwrap();
    let small = ctx.storage_buffer("pairs", 8).unwrap();
    let mut pipelines = Pipelines::default();
    let mut rec = dg_gpu::ops::Recorder::new(&ctx, &mut pipelines);
    let err = rec.softmax_rows(&xb, &small, 2, 262_144).unwrap_err().to_string();
    assert!(err.contains("128 pairs") && err.contains("holds 1"), "{err}");
}

#[test]
fn softmax_masks_match_cpu() {
    let Some(ctx) = test_context("softmax_masks_match_cpu") else { return };
    let causal = |queries: u32, key_start: u32, query_start: u32, window: u32| SoftmaxParams {
        rows: 0,
        cols: 0,
        queries,
        mode: MODE_CAUSAL,
        key_start,
        query_start,
        window,
        gap_start: 0,
        gap_end: 0,
        span_start: 0,
        span_end: 0,
        _pad: 0,
    };
    let cases = [
        // (heads, keys, mask): the encoder's prefill (keys = queries, window 1024 and none) ...
        (2, 40, causal(40, 0, 0, 0)),
        (3, 40, causal(40, 0, 0, 16)),
        (1, 1500, causal(1500, 0, 0, 1024)),
        // ... a chunk of queries after cached keys, with and without window ...
        (2, 50, causal(9, 10, 51, 0)),
        (2, 50, causal(9, 10, 51, 3)),
        (4, 300, causal(5, 0, 400, 128)),
        // ... queries before the first key (fully masked rows become zeros) and window 1 ...
        (1, 12, causal(6, 20, 15, 0)),
        (2, 12, causal(4, 0, 3, 1)),
        // ... and the decoder's rows: 1023 cached keys padded to 1024, then the canvas (a gap of
        // one column; of 27 after 5 keys), also with a causal mask around the gap.
        (2, 1024 + 64, SoftmaxParams { queries: 64, gap_start: 1023, gap_end: 1024, ..SoftmaxParams::plain(0, 0) }),
        (3, 32 + 16, SoftmaxParams { queries: 16, gap_start: 5, gap_end: 32, ..SoftmaxParams::plain(0, 0) }),
        (2, 50, SoftmaxParams { gap_start: 20, gap_end: 25, ..causal(9, 10, 51, 0) }),
        // An image's soft tokens (positions 13..25 of a chunk from 10) see their whole span, in a
        // window that ends inside it, and the span reaching the chunk's last query.
        (2, 40, SoftmaxParams { span_start: 13, span_end: 25, ..causal(30, 10, 10, 0) }),
        (3, 40, SoftmaxParams { span_start: 13, span_end: 25, ..causal(30, 0, 10, 6) }),
        (1, 24, SoftmaxParams { span_start: 30, span_end: 34, ..causal(24, 10, 10, 0) }),
    ];
    for (heads, keys, mut params) in cases {
        params.rows = heads * params.queries;
        params.cols = keys;
        let x = seeded((params.rows * keys) as usize, 9 + keys as u64, 5.0);
        let want = softmax_cpu(&x, &params);
        for (max_dim, variant) in folds_and_reduces(&ctx, keys as usize) {
            let got = run_softmax(&ctx, variant, &x, &params, max_dim);
            let what = format!("{params:?} fold={max_dim} {variant:?}");
            for (i, &g) in got.iter().enumerate() {
                let (r, j) = (i / keys as usize, i % keys as usize);
                let (lo, hi) = visible(&params, r % params.queries as usize, keys as usize);
                if j < lo || j >= hi || (params.gap_start as usize..params.gap_end as usize).contains(&j) {
                    assert_eq!(g.to_bits(), 0, "{what}: masked row {r} col {j} = {g}");
                }
            }
            check_softmax(&got, &want, keys as usize, SOFTMAX_TOLERANCE, &what);
        }
    }
}

fn gelu_case(ctx: &GpuContext, rows: usize, inter: usize, gate: &[f32], up: &[f32], max_dim: u32) {
    let mut pipelines = Pipelines::default();
    let fused = pipelines.get_source(ctx, gelu_glu::fused()).unwrap();
    let mut want = gate.to_vec();
    dg_cpu::ops::gelu_glu(&mut want, up);
    let params = GeluGluParams::one(rows as u32, inter as u32, 1, 0);
    let groups = groups_1d(gelu_glu::workgroups(&params), max_dim);

    let mut gate_up = Vec::with_capacity(2 * gate.len());
    for (g, u) in gate.chunks_exact(inter).zip(up.chunks_exact(inter)) {
        gate_up.extend_from_slice(g);
        gate_up.extend_from_slice(u);
    }
    let gub = ctx.upload("gate_up", &gate_up).unwrap();
    let out = guarded_output(ctx, "out", gate.len());
    let out4 = guarded_output(ctx, "out4", gate.len());
    let mut plan = PlanBuilder::new(ctx);
    plan.push(&fused, &params, &[&gub, &out], groups);
    if inter.is_multiple_of(4) {
        // Four columns at a time: the same bits.
        let fused4 = pipelines.get_source(ctx, gelu_glu::fused_lanes(4, false)).unwrap();
        let p4 = params.with_lanes(4);
        plan.push(&fused4, &p4, &[&gub, &out4], groups_1d(gelu_glu::workgroups(&p4), max_dim));
    }
    plan.finish(ctx).unwrap().run(ctx).unwrap();
    if inter.is_multiple_of(4) {
        let bits = |b: &wgpu::Buffer| -> Vec<u32> { read_guarded(ctx, b, gate.len()).iter().map(|v| v.to_bits()).collect() };
        assert!(bits(&out4) == bits(&out), "{rows}x{inter}: four columns at a time differ from one");
    }
    for (name, buf) in [("fused", &out)] {
        let got = read_guarded(ctx, buf, gate.len());
        for (i, (&a, &b)) in got.iter().zip(&want).enumerate() {
            let scale = (gate[i] * up[i]).abs();
            assert!(a.is_finite() == b.is_finite(), "{name} {rows}x{inter}: element {i}: {a} vs {b} (gate {})", gate[i]);
            assert!(
                (a - b).abs() <= GELU_TOLERANCE * scale || a == b,
                "{name} {rows}x{inter} fold={max_dim}: element {i}: {a} vs {b} (gate {}, up {})",
                gate[i],
                up[i]
            );
        }
    }
}

#[test]
fn gelu_glu_matches_cpu() {
    let Some(ctx) = test_context("gelu_glu_matches_cpu") else { return };
    for &(rows, inter) in &[(1, 1), (1, 7), (3, 704), (5, 2112), (64, 33)] {
        let gate = seeded(rows * inter, 21 + inter as u64, 6.0);
        let up = seeded(rows * inter, 22 + rows as u64, 2.0);
        for max_dim in limits(&ctx) {
            gelu_case(&ctx, rows, inter, &gate, &up, max_dim);
        }
    }
    // Large and tiny gates: tanh saturates (clamped) and x³ overflows to inf; nothing goes NaN.
    let gate = vec![
        0.0, -0.0, 1e-30, -1e-30, 1e-3, -1e-3, 8.9, -8.9, 9.5, -9.5, 14.0, -14.0, 20.0, -20.0, 100.0, -100.0, 1e13, -1e13, 1e20, -1e20,
        3e38, -3e38, 4.0, -4.0,
    ];
    let up: Vec<f32> = (0..gate.len()).map(|i| if i % 3 == 0 { -1.5 } else { 0.75 }).collect();
    for max_dim in limits(&ctx) {
        gelu_case(&ctx, 2, gate.len() / 2, &gate, &up, max_dim);
    }
}

/// `gelu_glu_fused_half` stores each output as the f16 its f32 output rounds to (nearest, ties to
/// even, as `dg_kernels::pack_f16` rounds): the activations a tensor-core product reads as f16
/// are bit for bit those it would round from the f32 ones. Also from split-K partials.
#[test]
fn gelu_glu_fused_half_stores_the_rounded_f32_output() {
    let test = "gelu_glu_fused_half_stores_the_rounded_f32_output";
    let Some(ctx) = test_context(test) else { return };
    if !ctx.device.features().contains(wgpu::Features::SHADER_F16) {
        eprintln!("SKIP {test}: adapter {} has no SHADER_F16", ctx.info.name);
        return;
    }
    let mut pipelines = Pipelines::default();
    let fused = pipelines.get_source(&ctx, gelu_glu::fused()).unwrap();
    let half = pipelines.get_source(&ctx, gelu_glu::fused_half()).unwrap();
    for &(rows, inter, splits) in &[(3, 704, 1), (5, 2112, 1), (64, 34, 1), (7, 704, 3)] {
        let n = rows * inter;
        // splits partials of [rows, 2·inter], split_stride apart.
        let gate_up = seeded(splits * 2 * n, 31 + inter as u64, 3.0);
        let params = GeluGluParams::one(rows as u32, inter as u32, splits as u32, (2 * n) as u32);
        let groups = groups_1d(gelu_glu::workgroups(&params), 65535);
        let input = ctx.upload("gate_up", &gate_up).unwrap();
        let out = guarded_output(&ctx, "out", n);
        let halves = ctx.upload("halves", &vec![0u32; n.div_ceil(2)]).unwrap();
        let mut plan = PlanBuilder::new(&ctx);
        plan.push(&fused, &params, &[&input, &out], groups);
        plan.push(&half, &params, &[&input, &halves], groups);
        plan.finish(&ctx).unwrap().run(&ctx).unwrap();
        let want = dg_kernels::unpack_f16(&dg_kernels::pack_f16(&read_guarded(&ctx, &out, n)), n);
        let words: Vec<u32> = ctx.read_f32(&halves, 0, n.div_ceil(2)).unwrap().into_iter().map(f32::to_bits).collect();
        let got = dg_kernels::unpack_f16(&words, n);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                g.to_bits(),
                w.to_bits(),
                "{rows}x{inter} in {splits} partials: element {i}: {g} stored, {w} is the rounded f32 output"
            );
        }
    }
}

/// `gelu_glu_pair`: the two jobs in one dispatch give, bit for bit, what `gelu_glu_fused` gives
/// for the first (also from split-K partials) and `gelu_glu_fused` / `gelu_glu_fused_half` for the
/// second; workgroups folded into y included.
#[test]
fn gelu_glu_pair_gives_the_bits_of_its_two_jobs() {
    let test = "gelu_glu_pair_gives_the_bits_of_its_two_jobs";
    let Some(ctx) = test_context(test) else { return };
    let halves_too = ctx.device.features().contains(wgpu::Features::SHADER_F16);
    if !halves_too {
        eprintln!("{test}: adapter {} has no SHADER_F16: the f32 second job only", ctx.info.name);
    }
    let mut pipelines = Pipelines::default();
    for half_b in [false, true].into_iter().filter(|&h| !h || halves_too) {
        let second_of = |lanes| gelu_glu::fused_lanes(lanes, half_b);
        for (&((rows, inter, splits), (rows_b, inter_b)), lanes) in [
            ((5, 2112, 2), (33, 704)),
            ((3, 7, 1), (1, 1)),
            ((64, 34, 3), (100, 300)),
            ((5, 2112, 2), (33, 704)),
            ((64, 36, 3), (100, 300)),
        ]
        .iter()
        .zip([1u32, 1, 1, 4, 4])
        {
            let (n, n_b) = (rows * inter, rows_b * inter_b);
            let gate_up = ctx.upload("gate_up", &seeded(splits * 2 * n, 41 + inter as u64, 3.0)).unwrap();
            let gate_up_b = ctx.upload("gate_up_b", &seeded(2 * n_b, 42 + inter_b as u64, 3.0)).unwrap();
            let pair = pipelines.get_source(&ctx, gelu_glu::pair_lanes(half_b, lanes)).unwrap();
            let second = pipelines.get_source(&ctx, second_of(lanes)).unwrap();
            let fused = pipelines.get_source(&ctx, gelu_glu::fused_lanes(lanes, false)).unwrap();
            let a = GeluGluParams::one(rows as u32, inter as u32, splits as u32, (2 * n) as u32).with_lanes(lanes);
            let b = GeluGluParams::one(rows_b as u32, inter_b as u32, 1, 0).with_lanes(lanes);
            let both = GeluGluParams::pair(a, (rows_b as u32, inter_b as u32));
            let words_b = if half_b { n_b.div_ceil(2) } else { n_b };
            for max_dim in limits(&ctx) {
                let [out, out_b, want, want_b] = [n, words_b, n, words_b].map(|len| guarded_output(&ctx, "out", len));
                let mut plan = PlanBuilder::new(&ctx);
                plan.push(&pair, &both, &[&gate_up, &out, &gate_up_b, &out_b], groups_1d(gelu_glu::workgroups(&both), max_dim));
                plan.push(&fused, &a, &[&gate_up, &want], groups_1d(gelu_glu::workgroups(&a), max_dim));
                plan.push(&second, &b, &[&gate_up_b, &want_b], groups_1d(gelu_glu::workgroups(&b), max_dim));
                plan.finish(&ctx).unwrap().run(&ctx).unwrap();
                let what = format!(
                    "{rows}x{inter} in {splits} partials, then {rows_b}x{inter_b} (half {half_b}, {lanes} columns a time), fold {max_dim}"
                );
                let bits =
                    |buf: &wgpu::Buffer, len: usize| -> Vec<u32> { read_guarded(&ctx, buf, len).iter().map(|v| v.to_bits()).collect() };
                assert!(bits(&out, n) == bits(&want, n), "{what}: the first job differs from gelu_glu_fused");
                // An odd count of halves leaves the last word's upper half as the guard's bits.
                assert!(bits(&out_b, words_b) == bits(&want_b, words_b), "{what}: the second job differs from its own kernel");
            }
        }
    }
}

#[test]
fn embed_chunks_cover_the_vocab() {
    let Some(ctx) = test_context("embed_chunks_cover_the_vocab") else { return };
    let mut pipelines = Pipelines::default();
    let p = pipelines.get_source(&ctx, embed::source()).unwrap();
    let (vocab, hidden, split) = (1000usize, 300usize, 613usize);
    let table = seeded(vocab * hidden, 31, 1.7);
    let scale = (hidden as f64).sqrt() as f32;
    let ids: Vec<u32> =
        [0u32, 612, 613, 999, 5, 998, 613, 0, 700, 1, 612].into_iter().chain((0..50).map(|i| (i * 37 + 11) % 1000)).collect();
    let tokens = ids.len();
    let base = seeded(tokens * hidden, 32, 1.0);
    let idb = ctx.upload("ids", &ids).unwrap();
    let chunk0 = ctx.upload("chunk0", &table[..split * hidden]).unwrap();
    let chunk1 = ctx.upload("chunk1", &table[split * hidden..]).unwrap();
    let params = |row_start: usize, row_count: usize| EmbedParams {
        tokens: tokens as u32,
        hidden: hidden as u32,
        row_start: row_start as u32,
        row_count: row_count as u32,
        scale,
        _pad: [0; 3],
    };
    let (p0, p1) = (params(0, split), params(split, vocab - split));
    for max_dim in limits(&ctx) {
        // Only the first chunk: tokens of the second keep the previous contents.
        let out = guarded_output(&ctx, "out", tokens * hidden);
        ctx.queue.write_buffer(&out, 0, bytemuck::cast_slice(&base));
        let mut plan = PlanBuilder::new(&ctx);
        plan.push(&p, &p0, &[&idb, &chunk0, &out], groups_1d(embed::workgroups(&p0), max_dim));
        plan.finish(&ctx).unwrap().run(&ctx).unwrap();
        let half = read_guarded(&ctx, &out, tokens * hidden);
        // Then the second chunk completes the lookup.
        let mut plan = PlanBuilder::new(&ctx);
        plan.push(&p, &p1, &[&idb, &chunk1, &out], groups_1d(embed::workgroups(&p1), max_dim));
        plan.finish(&ctx).unwrap().run(&ctx).unwrap();
        let full = read_guarded(&ctx, &out, tokens * hidden);
        for (t, &id) in ids.iter().enumerate() {
            let id = id as usize;
            let want: Vec<f32> = table[id * hidden..(id + 1) * hidden].iter().map(|v| v * scale).collect();
            let row = t * hidden..(t + 1) * hidden;
            let (err, at) = max_rel_err(&full[row.clone()], &want);
            assert!(err <= EMBED_TOLERANCE, "token {t} id {id} fold={max_dim}: rel err {err} at {at}");
            if id < split {
                assert_eq!(&half[row.clone()], &want[..], "token {t} id {id} after chunk 0");
            } else {
                assert_eq!(&half[row.clone()], &base[row], "token {t} id {id} touched by chunk 0");
            }
        }
    }
}

#[test]
fn axpby_matches_cpu() {
    let Some(ctx) = test_context("axpby_matches_cpu") else { return };
    let mut pipelines = Pipelines::default();
    let p = pipelines.get_source(&ctx, axpby::source(axpby::Variant::PLAIN)).unwrap();
    for &(n, alpha, beta) in &[(1usize, 2.0f32, 1.0f32), (7, 1.0, 1.0), (1000, -0.5, 0.25), (2816 * 3, 1.0, 1.0), (70_001, 0.3, -2.0)] {
        let x = seeded(n, 41 + n as u64, 3.0);
        let base = seeded(n, 42, 2.0);
        let want: Vec<f32> = base.iter().zip(&x).map(|(o, v)| o * beta + v * alpha).collect();
        for max_dim in limits(&ctx) {
            let xb = ctx.upload("x", &x).unwrap();
            let out = guarded_output(&ctx, "out", n);
            ctx.queue.write_buffer(&out, 0, bytemuck::cast_slice(&base));
            let params = AxpbyParams { n: n as u32, alpha, beta, row: 0 };
            let mut plan = PlanBuilder::new(&ctx);
            plan.push(&p, &params, &[&xb, &out], groups_1d(axpby::workgroups(&params), max_dim));
            plan.finish(&ctx).unwrap().run(&ctx).unwrap();
            let got = read_guarded(&ctx, &out, n);
            let (err, at) = max_rel_err(&got, &want);
            assert!(err <= AXPBY_TOLERANCE, "n={n} alpha={alpha} beta={beta} fold={max_dim}: rel err {err} at {at}");
        }
    }
    // beta = 0 never reads the output: NaN / guard contents do not leak.
    let n = 300;
    let x = seeded(n, 43, 3.0);
    let xb = ctx.upload("x", &x).unwrap();
    let out = guarded_output(&ctx, "out", n);
    ctx.queue.write_buffer(&out, 0, bytemuck::cast_slice(&vec![f32::NAN; n / 2]));
    let params = AxpbyParams { n: n as u32, alpha: 0.5, beta: 0.0, row: 0 };
    let mut plan = PlanBuilder::new(&ctx);
    plan.push(&p, &params, &[&xb, &out], groups_1d(axpby::workgroups(&params), 65_535));
    plan.finish(&ctx).unwrap().run(&ctx).unwrap();
    let got = read_guarded(&ctx, &out, n);
    assert!(got.iter().zip(&x).all(|(g, v)| *g == v * 0.5), "beta = 0 must overwrite NaN");
}

/// The split-K reduction (`dg_kernels::split_k`) into a strided, batched C: plain, scaled and
/// accumulated, softcapped; the columns between C's rows and the guard band keep their values.
#[test]
fn split_k_reduce_matches_cpu() {
    let Some(ctx) = test_context("split_k_reduce_matches_cpu") else { return };
    let mut pipelines = Pipelines::default();
    let p = pipelines.get_source(&ctx, split_k::source()).unwrap();
    let (m, n, batch, splits) = (5usize, 12usize, 3usize, 4usize);
    let (c_rs, c_offset) = (n + 3, 2usize);
    let c_batch = m * c_rs + 1;
    let c_len = c_offset + batch * c_batch;
    let split_stride = batch * m * n + 5;
    let part = seeded(splits * split_stride, 51, 4.0);
    let c0 = seeded(c_len, 52, 1.0);
    for (alpha, accumulate, epilogue, cap) in [(1.0f32, 0u32, 0u32, 0.0f32), (0.5, 1, 0, 0.0), (2.0, 1, 1, 3.0)] {
        let params = SplitKParams {
            m: m as u32,
            n: n as u32,
            batch: batch as u32,
            splits: splits as u32,
            split_stride: split_stride as u32,
            c_offset: c_offset as u32,
            c_rs: c_rs as u32,
            c_batch: c_batch as u32,
            alpha,
            accumulate,
            epilogue,
            cap,
        };
        let mut want = c0.clone();
        for b in 0..batch {
            for i in 0..m {
                for j in 0..n {
                    let e = (b * m + i) * n + j;
                    let sum: f32 = (0..splits).map(|z| part[z * split_stride + e]).sum();
                    let dst = c_offset + b * c_batch + i * c_rs + j;
                    let mut v = alpha * sum + if accumulate != 0 { c0[dst] } else { 0.0 };
                    if epilogue == 1 {
                        v = cap * (v / cap).tanh();
                    }
                    want[dst] = v;
                }
            }
        }
        for max_dim in limits(&ctx) {
            let pb = ctx.upload("partials", &part).unwrap();
            let out = guarded_output(&ctx, "c", c_len);
            ctx.queue.write_buffer(&out, 0, bytemuck::cast_slice(&c0));
            let mut plan = PlanBuilder::new(&ctx);
            plan.push(&p, &params, &[&pb, &out], groups_1d(split_k::workgroups(&params), max_dim));
            plan.finish(&ctx).unwrap().run(&ctx).unwrap();
            let got = read_guarded(&ctx, &out, c_len);
            let (err, at) = max_rel_err(&got, &want);
            assert!(
                err <= SPLIT_K_TOLERANCE,
                "alpha {alpha} accumulate {accumulate} epilogue {epilogue} fold {max_dim}: rel err {err} at {at}: got {} want {}",
                got[at],
                want[at]
            );
        }
    }
}

/// Folding over the real 65535 limit: more rows than one dimension holds.
#[test]
fn kernels_fold_past_65535_workgroups() {
    let Some(ctx) = test_context("kernels_fold_past_65535_workgroups") else { return };
    let max_dim = ctx.limits.max_compute_workgroups_per_dimension;
    let rows = max_dim as usize + 1000;
    let cols = 3;
    let x = seeded(rows * cols, 51, 4.0);
    let params = SoftmaxParams::plain(rows as u32, cols as u32);
    let got = run_softmax(&ctx, (ctx.row_reduce(), 1), &x, &params, max_dim);
    check_softmax(&got, &softmax_cpu(&x, &params), cols, SOFTMAX_TOLERANCE, "softmax past 65535 rows");

    let mut pipelines = Pipelines::default();
    let p = pipelines.get_source(&ctx, embed::source()).unwrap();
    let tokens = rows;
    let hidden = 2;
    let ids: Vec<u32> = (0..tokens as u32).map(|t| t % 10).collect();
    let table = seeded(10 * hidden, 52, 1.0);
    let idb = ctx.upload("ids", &ids).unwrap();
    let tb = ctx.upload("table", &table).unwrap();
    let out = guarded_output(&ctx, "out", tokens * hidden);
    let params = EmbedParams { tokens: tokens as u32, hidden: hidden as u32, row_start: 0, row_count: 10, scale: 2.0, _pad: [0; 3] };
    let mut plan = PlanBuilder::new(&ctx);
    plan.push(&p, &params, &[&idb, &tb, &out], groups_1d(embed::workgroups(&params), max_dim));
    plan.finish(&ctx).unwrap().run(&ctx).unwrap();
    let got = read_guarded(&ctx, &out, tokens * hidden);
    for (t, row) in got.chunks_exact(hidden).enumerate() {
        let id = t % 10;
        assert_eq!(row, [table[id * hidden] * 2.0, table[id * hidden + 1] * 2.0], "token {t}");
    }
}

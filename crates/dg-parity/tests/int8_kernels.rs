//! The native kernel's int8 mode (`KernelKey::NativeInt8GroupedGemm`, `dg_kernels::native_int8_gemm`:
//! the experts' grouped product with each slot's activations quantized per 32-value block to
//! int8, Q8_0 weights fed as integers, `s8 × s8 → s32` fragments) on every int8 shape the driver
//! lists (lavapipe: 8×8×8 in subgroups of 8) and both A formats, gated against dg-cpu's int8
//! mode (`dg_cpu::int8`: llama.cpp's `quantize_row_q8_1` with f32 scales, then per block
//! `(d_w · d_a) · Σ q_w · q_a`), the same blocks as the host quantizes them.
//!
//! Tolerance ([`tolerance`]): the integer sums are exact (32 products of at most 127 · 128 in
//! s32), and each block's term rounds twice in f32 (the scales' product, its product with the
//! sum) as the reference's does, so what differs is the order of the f32 sum over K's blocks
//! (split across the kernel's subgroups) and the device's division in the scale `d = max|a| / 127`
//! and its inverse (Vulkan allows 2.5 ulps): [`SUM_ULPS`] ulps of the sum of the terms' magnitudes
//! a block, [`SCALE_ULPS`] more for the scales. A division that rounds differently may move an
//! activation that lies within a few ulps of a rounding boundary (`a / d` half-way between two
//! integers) by one step: such values (within [`ROUNDING_WINDOW`] of it, a fraction of about 10⁻⁴
//! of random ones) add one step's product `|w| · d_a` each.
//!
//! Awkward shapes: groups of 0, 1, 5, 31, 32 and 33 slots, n three workgroups wide, K of 7 blocks
//! (the kernel's 4 subgroups take 2, 2, 2 and 1), a block of zeros (`d = 0`) and blocks of large
//! and tiny values, gathered and direct rows, over the `max_rows` grid and the dispatch's tile
//! table, a part of the experts in a binding of its own (`first_group`); then through the Recorder,
//! where the planner hands the int8 kernel out for Q8_0 experts when the mode is asked for.
//!
//! The mode is asked for by this test's own device (`int8_test_context`); on a driver without
//! 8-bit fragments the test prints a visible SKIP (a failure under `DG_REQUIRE_TENSOR_CORES=1`).

use dg_cpu::int8::{BLOCK, BlockQ8_1, Q8_0_BYTES, quantize_row_q8_1};
use dg_gpu::ops::{Operand, Recorder};
use dg_gpu::{GpuContext, MatrixLayout, Pipelines};
use dg_kernels::coop_gemm::AFormat;
use dg_kernels::format::QuantFormat;
use dg_kernels::grouped_gemm::GroupedGemmParams;
use dg_kernels::native_int8_gemm::{self, Int8Shape};
use dg_kernels::{KernelKey, WeightFormat, native_grouped_gemm, pack_f16};
use dg_model::StoredDtype;
use dg_parity::testing::coop_experts::{Buffers, Case, Inputs, f16_round};
use dg_parity::testing::quant::{blocks, dispatch, panelled};
use dg_parity::testing::{GUARD, int8_test_context, read_guarded, seeded};

/// Ulps of f32 (relative to the sum of the terms' magnitudes) each block's term may add through
/// the order of the sum: one rounding of an addition a term, whichever order.
const SUM_ULPS: f64 = 1.0;

/// Ulps the scales may add: the device's `max|a| / 127` and `1 / d` (2.5 ulps each in Vulkan)
/// scale every term of a block alike, and the term's two f32 products round as the reference's.
const SCALE_ULPS: f64 = 8.0;

/// How close `|a / d|` may lie to a half-integer for the device's division to round it to the
/// other integer: `1 / d` within about 5 ulps (6·10⁻⁷ relative) of the host's, times values up
/// to 127.
const ROUNDING_WINDOW: f32 = 2e-4;

const Q8_0: WeightFormat = WeightFormat::Quantized(QuantFormat::Q8_0);

/// The experts of `x` quantized to Q8_0: K panels as the upload stores them (words), and the
/// blocks as ggml stores them, row by row (the reference's).
fn q8_0_experts(x: &Inputs) -> (Vec<u32>, Vec<u8>) {
    let (n, k) = (x.params.n as usize, x.params.k as usize);
    let values = seeded(x.w.len(), x.w.len() as u64 + 34, 1.0);
    let (words, _) = blocks(QuantFormat::Q8_0, &values);
    let bytes = dg_model::quantize(StoredDtype::Q8_0, &values).expect("quantizing test weights");
    (panelled(QuantFormat::Q8_0, &words, n, k), bytes)
}

/// `x` with awkward activation blocks: columns 32..64 zero in every row (`d = 0`), 64..96 large
/// and 96..128 tiny.
fn awkward(mut x: Inputs) -> Inputs {
    let a_rs = x.params.a_rs as usize;
    for row in x.a.chunks_exact_mut(a_rs) {
        row[32..64].fill(0.0);
        row[64..96].iter_mut().for_each(|v| *v *= 300.0);
        row[96..128].iter_mut().for_each(|v| *v *= 1e-3);
    }
    x
}

/// The int8 mode's product of `x` (A as the kernel of `a` reads it) on the Q8_0 `bytes`, and each
/// element's [`tolerance`]: C as `x.c0` holds it, the selected slots' first n columns replaced.
fn reference(x: &Inputs, a: AFormat, bytes: &[u8], pick: impl Fn(usize) -> bool) -> (Vec<f32>, Vec<f64>) {
    let p = &x.params;
    let (n, k, a_rs, c_rs) = (p.n as usize, p.k as usize, p.a_rs as usize, p.c_rs as usize);
    let row_bytes = k / BLOCK * Q8_0_BYTES;
    let mut want = x.c0.clone();
    let mut tol = vec![0f64; want.len()];
    for e in 0..p.groups as usize {
        for s in (x.offsets[e] as usize..x.offsets[e + 1] as usize).filter(|&s| pick(s)) {
            let row = if p.gather != 0 { x.rows[s] as usize } else { s };
            let values = &x.a[row * a_rs..row * a_rs + k];
            let values = match a {
                AFormat::F32 => values.to_vec(),
                AFormat::F16 => f16_round(values),
            };
            let act = quantize_row_q8_1(&values);
            for j in 0..n {
                let w = &bytes[(e * n + j) * row_bytes..][..row_bytes];
                let (sum, t) = expected(w, &act, &values);
                want[s * c_rs + j] = sum as f32;
                tol[s * c_rs + j] = t;
            }
        }
    }
    (want, tol)
}

/// One row's product (f64 sum of the f32 terms `(d_w · d_a) · Σ q_w · q_a`) and its tolerance.
fn expected(w: &[u8], act: &[BlockQ8_1], values: &[f32]) -> (f64, f64) {
    let (mut sum, mut magnitude, mut steps) = (0f64, 0f64, 0f64);
    for ((w, a), v) in w.chunks_exact(Q8_0_BYTES).zip(act).zip(values.chunks_exact(BLOCK)) {
        let d_w = half::f16::from_le_bytes([w[0], w[1]]).to_f32();
        let q_w = w[2..].iter().map(|&b| i32::from(b as i8));
        let dot: i32 = q_w.clone().zip(a.q).map(|(q, qa)| q * i32::from(qa)).sum();
        let term = (d_w * a.d) * dot as f32;
        sum += f64::from(term);
        magnitude += f64::from(term.abs());
        let id = if a.d != 0.0 { 1.0 / a.d } else { 0.0 };
        for (q, &v) in q_w.zip(v) {
            let t = (v * id).abs();
            if (t - t.floor() - 0.5).abs() < ROUNDING_WINDOW {
                steps += f64::from(d_w.abs()) * f64::from(q.unsigned_abs()) * f64::from(a.d);
            }
        }
    }
    (sum, tolerance(act.len(), magnitude) + steps)
}

/// What the kernel may differ by over `blocks` blocks whose terms' magnitudes sum to `magnitude`.
fn tolerance(blocks: usize, magnitude: f64) -> f64 {
    (SUM_ULPS * blocks as f64 + SCALE_ULPS) * f64::from(f32::EPSILON) * magnitude
}

fn check(got: &[f32], (want, tol): &(Vec<f32>, Vec<f64>), x: &Inputs, pick: impl Fn(usize) -> bool, what: &str) {
    let (n, c_rs) = (x.params.n as usize, x.params.c_rs as usize);
    for s in 0..x.slots {
        for j in 0..c_rs {
            let i = s * c_rs + j;
            if j >= n || !pick(s) {
                assert_eq!(got[i].to_bits(), want[i].to_bits(), "{what}: slot {s} column {j} is not the kernel's and was written");
                continue;
            }
            assert_ne!(got[i], GUARD, "{what}: slot {s} column {j} left unwritten");
            let err = (f64::from(got[i]) - f64::from(want[i])).abs();
            assert!(err <= tol[i], "{what}: slot {s} column {j}: got {} want {} (|Δ| {err:e} > {:e})", got[i], want[i], tol[i]);
        }
    }
}

/// The int8 reference differs from the product of the unquantized activations by more than the
/// tolerance (so a kernel that skipped the quantization would fail the gate).
fn the_gate_tells_the_modes_apart(x: &Inputs, bytes: &[u8], (want, tol): &(Vec<f32>, Vec<f64>)) {
    let p = &x.params;
    let (n, k, a_rs, c_rs) = (p.n as usize, p.k as usize, p.a_rs as usize, p.c_rs as usize);
    let w = dg_model::dequantize_bytes(StoredDtype::Q8_0, bytes).unwrap();
    let row = if p.gather != 0 { x.rows[0] as usize } else { 0 };
    let apart = (0..n).filter(|&j| {
        let exact: f64 = (0..k).map(|q| f64::from(x.a[row * a_rs + q]) * f64::from(w[j * k + q])).sum();
        (exact - f64::from(want[j])).abs() > tol[j]
    });
    assert!(apart.count() > n / 2, "the int8 mode's reference is within its tolerance of the f32 activations' product");
    assert!(c_rs > n);
}

/// A as the kernel of `a` reads it: f32 words, or halves two a word.
fn a_words(x: &Inputs, a: AFormat) -> Vec<u32> {
    match a {
        AFormat::F32 => bytemuck::cast_slice(&x.a).to_vec(),
        AFormat::F16 => pack_f16(&x.a),
    }
}

fn shapes(ctx: &GpuContext) -> impl Iterator<Item = Int8Shape> + '_ {
    Int8Shape::ALL.into_iter().filter(|&s| ctx.int8.contains(s))
}

#[test]
fn int8_grouped_gemm_matches_the_cpu_int8_mode_directly_and_through_the_recorder() {
    let test = "int8_grouped_gemm_matches_the_cpu_int8_mode_directly_and_through_the_recorder";
    let Some(ctx) = int8_test_context(test) else { return };
    let mut pipelines = Pipelines::default();
    let counts = vec![5, 0, 33, 1, 31, 32];
    for shape in shapes(&ctx) {
        for gather in [false, true] {
            let case = Case { n: 3 * shape.cols() as usize, k: 7 * BLOCK, counts: counts.clone(), gather };
            let x = awkward(case.inputs(11 + u64::from(gather)));
            let (w_words, bytes) = q8_0_experts(&x);
            for a in [AFormat::F32, AFormat::F16] {
                let want = reference(&x, a, &bytes, |_| true);
                the_gate_tells_the_modes_apart(&x, &bytes, &want);
                for table in [false, true] {
                    let x = if table { x.with_table(native_grouped_gemm::SLOTS) } else { x.clone() };
                    let key = KernelKey::NativeInt8GroupedGemm { shape, w: Q8_0, a };
                    let p = native_grouped_gemm::params_for(&x.params);
                    assert_eq!(p.tiles != 0, table, "the tile table of {} rows is the kernel's", native_grouped_gemm::SLOTS);
                    let groups = native_int8_gemm::workgroups(shape, &p);
                    let got = dispatch(&ctx, &mut pipelines, key, &p, &[&a_words(&x, a), &w_words, &x.offsets, &x.rows], &x.c0, groups);
                    check(&got, &want, &x, |_| true, &format!("{key:?} n {} k {} gather {gather} table {table}", case.n, case.k));
                }
            }
            // Experts split across bindings: a binding holding experts 2.. only.
            let first = 2;
            let part = GroupedGemmParams { groups: x.params.groups - first, first_group: first, ..x.params };
            let skip = w_words.len() * first as usize / x.params.groups as usize;
            let key = KernelKey::NativeInt8GroupedGemm { shape, w: Q8_0, a: AFormat::F32 };
            let groups = native_int8_gemm::workgroups(shape, &part);
            let inputs = [&a_words(&x, AFormat::F32)[..], &w_words[skip..], &x.offsets, &x.rows];
            let got = dispatch(&ctx, &mut pipelines, key, &part, &inputs, &x.c0, groups);
            let theirs = |s: usize| s >= x.offsets[first as usize] as usize;
            check(&got, &reference(&x, AFormat::F32, &bytes, theirs), &x, theirs, &format!("{key:?} experts {first}.. gather {gather}"));
        }
    }
    recorder_runs_q8_0_experts_in_the_int8_kernel(&ctx, &mut pipelines);
}

/// The grouped product through the Recorder: with the mode asked for, Q8_0 experts' short groups
/// go to the int8 kernel of the device's preferred int8 shape.
fn recorder_runs_q8_0_experts_in_the_int8_kernel(ctx: &GpuContext, pipelines: &mut Pipelines) {
    let shape = ctx.int8.preferred().expect("a shape");
    let case = Case { n: 2 * shape.cols() as usize, k: 5 * BLOCK, counts: vec![4, 3, 0, 6, 1, 4, 5, 2], gather: true };
    let x = case.inputs(3);
    let (w_words, bytes) = q8_0_experts(&x);
    let b = Buffers::upload(ctx, &x, native_grouped_gemm::chunk(WeightFormat::F16));
    let wb = ctx.upload("experts", &w_words).unwrap();
    let mut rec = Recorder::new(ctx, pipelines);
    let operand = Operand { buffer: &wb, format: Q8_0, source: MatrixLayout::KPanels.into(), split: None };
    rec.grouped_product((&b.a, AFormat::F32), operand, &b.offsets, &b.rows, &b.c, x.slots, x.params).unwrap();
    let plan = rec.finish().unwrap();
    let int8 = native_int8_gemm::source(shape, Q8_0, AFormat::F32).name;
    assert_eq!(plan.kernel_names(), vec![int8.as_str()], "the planner's kernel");
    plan.run(ctx).unwrap();
    let got = read_guarded(ctx, &b.c, x.c0.len());
    check(&got, &reference(&x, AFormat::F32, &bytes, |_| true), &x, |_| true, "Q8_0 through the Recorder");
}

//! The native kernel's int8 mode (`KernelKey::NativeInt8GroupedGemm`, `dg_kernels::native_int8_gemm`:
//! the experts' grouped product with each slot's activations quantized per 32-value block to
//! int8, Q8_0 and Q4_K weights fed as integers, `s8 × s8 → s32` fragments) on every int8 shape the
//! driver lists (lavapipe: 8×8×8 in subgroups of 8), both formats and both A formats, gated
//! against dg-cpu's int8 mode (`dg_cpu::int8`: llama.cpp's `quantize_row_q8_1` with f32 scales,
//! then per block `(d_w · d_a) · Σ q_w · q_a`, for Q4_K per sub-block
//! `(d·sc · d_a) · Σ q_w · q_a − (dmin·m) · s_a`), the same blocks as the host quantizes them.
//!
//! Tolerance ([`tolerance`]): the integer sums are exact (32 products of at most 127 · 128 in
//! s32), and each block's term rounds in f32 as the reference's does (the scales' product, its
//! product with the sum; Q4_K's min term and the difference), so what differs is the order of the f32 sum over K's blocks
//! (split across the kernel's subgroups) and the device's division in the scale `d = max|a| / 127`
//! and its inverse (Vulkan allows 2.5 ulps): [`SUM_ULPS`] ulps of the sum of the terms' magnitudes
//! a block, [`SCALE_ULPS`] more for the scales. A division that rounds differently may move an
//! activation that lies within a few ulps of a rounding boundary (`a / d` half-way between two
//! integers) by one step: such values (within [`ROUNDING_WINDOW`] of it, a fraction of about 10⁻⁴
//! of random ones) add one step's product `|w| · d_a` each (`w` the dequantized weight: for Q4_K
//! the step moves both the integer sum and `s_a`).
//!
//! Awkward shapes: groups of 0, 1, 5, 31, 32 and 33 slots, n three workgroups wide, K of 7 Q8_0
//! blocks or 5 Q4_K super-blocks (the kernel's 4 subgroups take 2, 2, 2 and 1, or 2, 1, 1, 1), a block of zeros (`d = 0`) and blocks of large
//! and tiny values, gathered and direct rows, over the `max_rows` grid and the dispatch's tile
//! table, a part of the experts in a binding of its own (`first_group`); then through the Recorder,
//! where the planner hands the int8 kernel out for Q8_0 and Q4_K experts when the mode is asked for.
//!
//! The mode is asked for by this test's own device (`int8_test_context`); on a driver without
//! 8-bit fragments the test prints a visible SKIP (a failure under `DG_REQUIRE_TENSOR_CORES=1`).

use dg_cpu::int8::{BLOCK, BlockQ8_1, Q4_K_BYTES, Q8_0_BYTES, q4_k_nibbles, quantize_row_q8_1, scale_min_k4};
use dg_gpu::ops::{Operand, Recorder};
use dg_gpu::{GpuContext, MatrixLayout, Pipelines};
use dg_kernels::coop_gemm::AFormat;
use dg_kernels::format::QuantFormat;
use dg_kernels::grouped_gemm::GroupedGemmParams;
use dg_kernels::native_int8_gemm::{self, Int8Shape};
use dg_kernels::{KernelKey, WeightFormat, native_grouped_gemm};
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

/// The stored type of `q` (the formats the mode reads).
fn dtype(q: QuantFormat) -> StoredDtype {
    match q {
        QuantFormat::Q8_0 => StoredDtype::Q8_0,
        QuantFormat::Q4_K => StoredDtype::Q4_K,
        other => panic!("the int8 mode does not read {other:?}"),
    }
}

/// K of each format's cases: 7 Q8_0 blocks, 5 Q4_K super-blocks.
fn k_for(q: QuantFormat) -> usize {
    match q {
        QuantFormat::Q4_K => 5 * 256,
        _ => 7 * BLOCK,
    }
}

/// The experts of `x` quantized to `q`: K panels as the upload stores them (words), and the
/// blocks as ggml stores them, row by row (the reference's).
fn quantized_experts(q: QuantFormat, x: &Inputs) -> (Vec<u32>, Vec<u8>) {
    let (n, k) = (x.params.n as usize, x.params.k as usize);
    let values = seeded(x.w.len(), x.w.len() as u64 + 34, 1.0);
    let (words, _) = blocks(q, &values);
    let bytes = dg_model::quantize(dtype(q), &values).expect("quantizing test weights");
    (panelled(q, &words, n, k), bytes)
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

/// The int8 mode's product of `x` (A as the kernel of `a` reads it) on the `q` `bytes`, and each
/// element's [`tolerance`]: C as `x.c0` holds it, the selected slots' first n columns replaced.
fn reference(q: QuantFormat, x: &Inputs, a: AFormat, bytes: &[u8], pick: impl Fn(usize) -> bool) -> (Vec<f32>, Vec<f64>) {
    let p = &x.params;
    let (n, k, a_rs, c_rs) = (p.n as usize, p.k as usize, p.a_rs as usize, p.c_rs as usize);
    let row_bytes = k / q.block_len() * q.block_bytes();
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
                let (sum, t) = expected(q, w, &act, &values);
                want[s * c_rs + j] = sum as f32;
                tol[s * c_rs + j] = t;
            }
        }
    }
    (want, tol)
}

/// The f32 terms of one row of `q` blocks `w` times the activation blocks: per 32-value block
/// `(d_w · d_a) · Σ q_w · q_a` (Q8_0), or per sub-block that less `(dmin·m) · s_a` (Q4_K), the
/// parts' magnitudes beside each.
fn terms(q: QuantFormat, w: &[u8], act: &[BlockQ8_1]) -> Vec<(f32, f32)> {
    let f16 = |b: &[u8]| half::f16::from_le_bytes([b[0], b[1]]).to_f32();
    let dot = |q_w: &mut dyn Iterator<Item = i32>, a: &BlockQ8_1| q_w.zip(a.q).map(|(q, qa)| q * i32::from(qa)).sum::<i32>() as f32;
    match q {
        QuantFormat::Q8_0 => w
            .chunks_exact(Q8_0_BYTES)
            .zip(act)
            .map(|(w, a)| {
                let term = (f16(w) * a.d) * dot(&mut w[2..].iter().map(|&b| i32::from(b as i8)), a);
                (term, term.abs())
            })
            .collect(),
        QuantFormat::Q4_K => w
            .chunks_exact(Q4_K_BYTES)
            .zip(act.chunks_exact(8))
            .flat_map(|(w, a)| {
                let (d, dmin) = (f16(w), f16(&w[2..]));
                a.iter().enumerate().map(move |(j, a)| {
                    let (sc, m) = scale_min_k4(j, &w[4..16]);
                    let scaled = (d * f32::from(sc)) * a.d * dot(&mut q4_k_nibbles(w, j).into_iter().map(i32::from), a);
                    let min = (dmin * f32::from(m)) * a.s;
                    (scaled - min, scaled.abs() + min.abs())
                })
            })
            .collect(),
        other => panic!("the int8 mode does not read {other:?}"),
    }
}

/// One row's product (f64 sum of the f32 [`terms`]) and its tolerance.
fn expected(q: QuantFormat, w: &[u8], act: &[BlockQ8_1], values: &[f32]) -> (f64, f64) {
    let terms = terms(q, w, act);
    let sum: f64 = terms.iter().map(|&(t, _)| f64::from(t)).sum();
    let magnitude: f64 = terms.iter().map(|&(_, m)| f64::from(m)).sum();
    let deq = dg_model::dequantize_bytes(dtype(q), w).expect("dequantizing test weights");
    let mut steps = 0f64;
    for ((w, a), v) in deq.chunks_exact(BLOCK).zip(act).zip(values.chunks_exact(BLOCK)) {
        let id = if a.d != 0.0 { 1.0 / a.d } else { 0.0 };
        for (&w, &v) in w.iter().zip(v) {
            let t = (v * id).abs();
            if (t - t.floor() - 0.5).abs() < ROUNDING_WINDOW {
                steps += f64::from(w.abs()) * f64::from(a.d);
            }
        }
    }
    (sum, tolerance(terms.len(), magnitude) + steps)
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
fn the_gate_tells_the_modes_apart(q: QuantFormat, x: &Inputs, bytes: &[u8], (want, tol): &(Vec<f32>, Vec<f64>)) {
    let p = &x.params;
    let (n, k, a_rs, c_rs) = (p.n as usize, p.k as usize, p.a_rs as usize, p.c_rs as usize);
    let w = dg_model::dequantize_bytes(dtype(q), bytes).unwrap();
    let row = if p.gather != 0 { x.rows[0] as usize } else { 0 };
    let apart = (0..n).filter(|&j| {
        let exact: f64 = (0..k).map(|q| f64::from(x.a[row * a_rs + q]) * f64::from(w[j * k + q])).sum();
        (exact - f64::from(want[j])).abs() > tol[j]
    });
    assert!(apart.count() > n / 2, "the int8 mode's reference is within its tolerance of the f32 activations' product");
    assert!(c_rs > n);
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
    for (shape, w) in shapes(&ctx).flat_map(|s| native_int8_gemm::FORMATS.map(|w| (s, w))) {
        let WeightFormat::Quantized(q) = w else { unreachable!("the int8 mode reads quantized blocks") };
        for gather in [false, true] {
            let case = Case { n: 3 * shape.cols() as usize, k: k_for(q), counts: counts.clone(), gather };
            let x = awkward(case.inputs(11 + u64::from(gather)));
            let (w_words, bytes) = quantized_experts(q, &x);
            for a in [AFormat::F32, AFormat::F16] {
                let want = reference(q, &x, a, &bytes, |_| true);
                the_gate_tells_the_modes_apart(q, &x, &bytes, &want);
                for table in [false, true] {
                    let x = if table { x.with_table(native_grouped_gemm::SLOTS) } else { x.clone() };
                    let key = KernelKey::NativeInt8GroupedGemm { shape, w, a };
                    let p = native_grouped_gemm::params_for(&x.params);
                    assert_eq!(p.tiles != 0, table, "the tile table of {} rows is the kernel's", native_grouped_gemm::SLOTS);
                    let groups = native_int8_gemm::workgroups(shape, &p);
                    let got = dispatch(&ctx, &mut pipelines, key, &p, &[&x.a_words(a), &w_words, &x.offsets, &x.rows], &x.c0, groups);
                    check(&got, &want, &x, |_| true, &format!("{key:?} n {} k {} gather {gather} table {table}", case.n, case.k));
                }
            }
            // Experts split across bindings: a binding holding experts 2.. only.
            let first = 2;
            let part = GroupedGemmParams { groups: x.params.groups - first, first_group: first, ..x.params };
            let skip = w_words.len() * first as usize / x.params.groups as usize;
            let key = KernelKey::NativeInt8GroupedGemm { shape, w, a: AFormat::F32 };
            let groups = native_int8_gemm::workgroups(shape, &part);
            let inputs = [&x.a_words(AFormat::F32)[..], &w_words[skip..], &x.offsets, &x.rows];
            let got = dispatch(&ctx, &mut pipelines, key, &part, &inputs, &x.c0, groups);
            let theirs = |s: usize| s >= x.offsets[first as usize] as usize;
            check(&got, &reference(q, &x, AFormat::F32, &bytes, theirs), &x, theirs, &format!("{key:?} experts {first}.. gather {gather}"));
        }
    }
    for q in [QuantFormat::Q8_0, QuantFormat::Q4_K] {
        recorder_runs_experts_in_the_int8_kernel(&ctx, &mut pipelines, q);
    }
}

/// The grouped product through the Recorder: with the mode asked for, `q` experts' short groups
/// go to the int8 kernel of the device's preferred int8 shape.
fn recorder_runs_experts_in_the_int8_kernel(ctx: &GpuContext, pipelines: &mut Pipelines, q: QuantFormat) {
    let shape = ctx.int8.preferred().expect("a shape");
    let case = Case { n: 2 * shape.cols() as usize, k: k_for(q), counts: vec![4, 3, 0, 6, 1, 4, 5, 2], gather: true };
    let x = case.inputs(3);
    let (w_words, bytes) = quantized_experts(q, &x);
    let w = WeightFormat::Quantized(q);
    let b = Buffers::upload(ctx, &x, native_grouped_gemm::chunk(WeightFormat::F16));
    let wb = ctx.upload("experts", &w_words).unwrap();
    let mut rec = Recorder::new(ctx, pipelines);
    let operand = Operand { buffer: &wb, format: w, source: MatrixLayout::KPanels.into(), split: None };
    rec.grouped_product((&b.a, AFormat::F32), operand, &b.offsets, &b.rows, &b.c, x.slots, x.params).unwrap();
    let plan = rec.finish().unwrap();
    let int8 = native_int8_gemm::source(shape, w, AFormat::F32).name;
    assert_eq!(plan.kernel_names(), vec![int8.as_str()], "{q:?}: the planner's kernel");
    plan.run(ctx).unwrap();
    let got = read_guarded(ctx, &b.c, x.c0.len());
    check(&got, &reference(q, &x, AFormat::F32, &bytes, |_| true), &x, |_| true, &format!("{q:?} through the Recorder"));
}

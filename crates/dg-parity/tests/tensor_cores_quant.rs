//! The tensor-core kernels on ggml blocks (`WeightFormat::Quantized`: blocks as a GGUF file stores
//! them), dequantized into the f16 tiles as they are staged: the dense
//! product (`dg_kernels::coop_gemm`, every tile, staged and single-staged, several prefetch depths,
//! blocks row-major and, for the 32-value formats, in K panels) and the experts' grouped product
//! (`dg_kernels::coop_grouped_gemm`, blocks in K panels one block wide, every tile, both paths, and
//! through `Recorder::grouped_product` as the forward records it). Tiles whose invocations stage
//! whole 32-value runs of a step (`format::CoopW`: the grouped 32 × 128 and 64 × 128, the dense
//! 64 × 128 and 64 × 64 with K steps of 64) dequantize a run at a time, the others (the grouped
//! 32 × 64, the dense 64 × 64 and 128 × 128) a vec4 at a time, so both units are gated; Q6_K has
//! only the vec4 one.
//!
//! Each is gated twice: against the exact (f64) product of the f16-rounded operands (the host's
//! dequantization of the same blocks, bit-exact against gguf-py, rounded to f16) at the F16
//! tensor-core tolerance (`coop_experts::tolerance`); and against the F16 kernel of the same tile
//! and path on those f16 weights, bit for bit: the same f16 values reach the same fragment
//! products in the same order. Q4_K's `d·sc·q − dmin·m` may be contracted into one fused
//! multiply-add by the device (see `kernels_quant.rs`), which can move a weight by one f16 ulp
//! where its f32 value lies at a rounding boundary; there the comparison takes the tolerance.
//!
//! Those sweeps take Q8_0, Q5_0, Q4_K and Q6_K (the types dg quantizes to). Every other type
//! (random blocks with sane scales: `testing::quant::random_blocks`) takes the generic vec4 unit
//! on its element loader (`format::QuantFormat::coop_w`), the same on every tile: one dense tile
//! (row-major blocks, and K panels for the 32-value types) and one grouped tile gate each
//! (`every_other_type_on_the_tensor_cores`), the same two ways. The types whose dequantization
//! has an `a·b ± c` (Q5_K, Q2_K, Q4_1, Q5_1, as Q4_K) take the tolerance against the F16 kernel.
//!
//! On a device without cooperative matrices (lavapipe) these tests print a visible SKIP:
//! `kernels_quant.rs` covers the portable kernels that run there.

use dg_gpu::ops::{Operand, Recorder};
use dg_gpu::{GpuContext, MatrixLayout, Pipelines};
use dg_kernels::coop_gemm::{self, AFormat, BLayout, CoopTile, WPath};
use dg_kernels::coop_grouped_gemm::{self, EXPERT_DEPTH};
use dg_kernels::format::QuantFormat;
use dg_kernels::gemm::GemmParams;
use dg_kernels::{CoopGemmKey, KernelKey, WeightFormat, pack_f16};
use dg_parity::testing::coop_experts::{Buffers, Case, Inputs, check, f16_round, grouped_reference, run_tile, tolerance};
use dg_parity::testing::quant::{blocks, dispatch, panelled, random_blocks};
use dg_parity::testing::{coop_test_context, gemm_reference, max_rel_err, on_device, read_guarded, seeded};

/// Rows of two super-blocks (K = 512) for the 256-value formats, else 22 blocks of 32 (the
/// experts' down projection, K = 704).
fn k_for(q: QuantFormat) -> usize {
    if q.block_len() == 256 { 512 } else { 704 }
}

/// The types dg quantizes to: the sweeps' (the others' blocks are random).
const WRITTEN: [QuantFormat; 4] = [QuantFormat::Q8_0, QuantFormat::Q5_0, QuantFormat::Q4_K, QuantFormat::Q6_K];

/// `n` values of `q`'s blocks from `seed`: seeded values quantized for the types dg writes, else
/// random blocks; the blocks and their dequantization.
fn weights(q: QuantFormat, n: usize, seed: u64) -> (Vec<u32>, Vec<f32>) {
    match WRITTEN.contains(&q) {
        true => blocks(q, &seeded(n, seed, 1.0)),
        false => random_blocks(q, n / q.block_len(), seed),
    }
}

/// `got` (blocks) against `f16_out` (the F16 kernel on the f16-rounded dequantization): bit for bit,
/// or within the tensor-core tolerance for the types with an `a·b ± c` (see the module
/// documentation).
fn same_as_f16(q: QuantFormat, got: &[f32], f16_out: &[f32], k: usize, what: &str) {
    if matches!(q, QuantFormat::Q4_K | QuantFormat::Q5_K | QuantFormat::Q2_K | QuantFormat::Q4_1 | QuantFormat::Q5_1) {
        let (err, at) = max_rel_err(got, f16_out);
        assert!(err <= tolerance(k), "{what}: rel err {err} against the F16 kernel at {at}: {} vs {}", got[at], f16_out[at]);
    } else if let Some(i) = got.iter().zip(f16_out).position(|(x, y)| x.to_bits() != y.to_bits()) {
        panic!("{what}: element {i}: {} from the blocks vs {} from F16 weights", got[i], f16_out[i]);
    }
}

fn check_dense(ctx: &GpuContext, pipelines: &mut Pipelines, q: QuantFormat, key: CoopGemmKey, (m, n, k): (usize, usize, usize)) {
    let key = CoopGemmKey { tile: on_device(ctx, key.tile), ..key };
    let p = GemmParams::linear(m as u32, n as u32, k as u32);
    let a = seeded(m * k, (m + n) as u64, 1.0);
    let (w_blocks, w) = weights(q, n * k, (n * k) as u64 + q.block_bytes() as u64);
    let w16 = f16_round(&w);
    // In K panels the product's n is the matrix's rows and b_cs its k, as for F16 panels.
    let (w_blocks, w16_words) = match key.layout {
        BLayout::NkPanels => (panelled(q, &w_blocks, n, k), pack_f16(&panel_values(&w16, n, k))),
        _ => (w_blocks, pack_f16(&w16)),
    };
    let c0 = vec![0f32; m * n];
    let groups = coop_gemm::workgroups(key.tile, p.m, p.n, 1);
    let what = format!("{} coop gemm [{} {:?}] {m}x{n}x{k}", q.name(), key.tile.label(), key.path);
    let a_words: Vec<u32> = bytemuck::cast_slice(&a).to_vec();
    let got = dispatch(ctx, pipelines, KernelKey::CoopGemm(key), &p, &[&a_words, &w_blocks], &c0, groups);
    let want = gemm_reference(&p, &f16_round(&a), &w16, &c0);
    let (err, at) = max_rel_err(&got, &want);
    assert!(err <= tolerance(k), "{what}: rel err {err} against the exact product at {at}: {} vs {}", got[at], want[at]);
    let f16_key = CoopGemmKey { w: WeightFormat::F16, ..key };
    let f16_out = dispatch(ctx, pipelines, KernelKey::CoopGemm(f16_key), &p, &[&a_words, &w16_words], &c0, groups);
    same_as_f16(q, &got, &f16_out, k, &what);
}

#[test]
fn quantized_coop_gemm_matches_the_exact_product_and_the_f16_kernel() {
    let test = "quantized_coop_gemm_matches_the_exact_product_and_the_f16_kernel";
    let Some(ctx) = coop_test_context(test) else { return };
    let mut pipelines = Pipelines::default();
    let shared = ctx.limits.max_compute_workgroup_storage_size;
    for q in WRITTEN {
        let k = k_for(q);
        for &tile in coop_gemm::TILES {
            for depth in [1, 3] {
                for path in [WPath::Staged, WPath::Single] {
                    for layout in [BLayout::Nk, BLayout::NkPanels] {
                        let w = WeightFormat::Quantized(q);
                        let key = CoopGemmKey { tile: tile.with_depth(depth), path, w, layout, a: AFormat::F32 };
                        if !key.is_valid() || tile.dense_shared_bytes() > shared || !k.is_multiple_of(tile.bk as usize) {
                            continue;
                        }
                        // 37 rows: a partial m tile; 256 columns: whole n tiles of every tile.
                        check_dense(&ctx, &mut pipelines, q, key, (37, 256, k));
                    }
                }
            }
        }
    }
}

/// `w` (`[n, k]` row-major) in F16 K panels of `coop_gemm::PANEL` columns, as values.
fn panel_values(w: &[f32], n: usize, k: usize) -> Vec<f32> {
    let panel = coop_gemm::PANEL as usize;
    (0..k / panel).flat_map(|p| (0..n).flat_map(move |j| (0..panel).map(move |c| w[j * k + p * panel + c]))).collect()
}

/// `x` with its experts quantized to `q`: the blocks in K panels as the upload stores them, and
/// `x` holding their f16-rounded dequantization (what the F16 kernels and the reference multiply).
fn quantized_experts(q: QuantFormat, x: &Inputs) -> (Vec<u32>, Inputs) {
    let (w_blocks, w) = weights(q, x.w.len(), x.w.len() as u64 + q.block_bytes() as u64);
    let (n, k) = (x.params.n as usize, x.params.k as usize);
    (panelled(q, &w_blocks, n, k), Inputs { w: f16_round(&w), ..x.clone() })
}

fn run_blocks(
    ctx: &GpuContext,
    pipelines: &mut Pipelines,
    q: QuantFormat,
    (tile, path): (CoopTile, WPath),
    w_blocks: &[u32],
    x: &Inputs,
) -> Vec<f32> {
    let key = KernelKey::CoopGroupedGemm { tile: on_device(ctx, tile), path, w: WeightFormat::Quantized(q), a: AFormat::F32 };
    let a: Vec<u32> = bytemuck::cast_slice(&x.a).to_vec();
    let p = coop_grouped_gemm::params_for(tile, &x.params);
    dispatch(ctx, pipelines, key, &p, &[&a, w_blocks, &x.offsets, &x.rows], &x.c0, coop_grouped_gemm::workgroups(tile, &p))
}

#[test]
fn quantized_coop_grouped_gemm_matches_the_exact_product_and_the_f16_kernel() {
    let test = "quantized_coop_grouped_gemm_matches_the_exact_product_and_the_f16_kernel";
    let Some(ctx) = coop_test_context(test) else { return };
    let mut pipelines = Pipelines::default();
    // Full, partial and empty m tiles of every tile's rows, and several m tiles of one expert.
    let counts = vec![31, 0, 33, 1, 64, 5];
    for q in WRITTEN {
        let k = k_for(q);
        for &tile in coop_grouped_gemm::TILES.iter() {
            for gather in [false, true] {
                let case = Case { n: 3 * tile.bn as usize, k, counts: counts.clone(), gather };
                let (w_blocks, x) = quantized_experts(q, &case.inputs(11 + tile.bm as u64));
                let want = grouped_reference(&x, |_| true);
                for depth in [1, EXPERT_DEPTH] {
                    for path in [WPath::Staged, WPath::Single].into_iter().filter(|&path| coop_grouped_gemm::runs(tile, path)) {
                        let tile = tile.with_depth(depth);
                        let what = format!("{} coop grouped [{} {path:?}] n {} k {k} gather {gather}", q.name(), tile.label(), case.n);
                        let got = run_blocks(&ctx, &mut pipelines, q, (tile, path), &w_blocks, &x);
                        check(&got, &want, &x, |_| true, &what);
                        let f16_out = run_tile(&ctx, &mut pipelines, tile, path, &x);
                        same_as_f16(q, &got, &f16_out, k, &what);
                    }
                }
            }
        }
    }
}

#[test]
fn the_recorder_runs_quantized_experts_on_the_tensor_cores() {
    let test = "the_recorder_runs_quantized_experts_on_the_tensor_cores";
    let Some(ctx) = coop_test_context(test) else { return };
    let mut pipelines = Pipelines::default();
    for q in WRITTEN {
        // The decoder's expert shapes at a reduced width: 16 experts of ~16 slots, gathered rows.
        let case = Case { n: 256, k: k_for(q), counts: vec![16, 14, 0, 19, 16, 15, 17, 1], gather: true };
        let (w_blocks, x) = quantized_experts(q, &case.inputs(3));
        let b = Buffers::upload(&ctx, &x, coop_grouped_gemm::PANEL);
        let wb = ctx.upload("experts", &w_blocks).unwrap();
        let mut rec = Recorder::new(&ctx, &mut pipelines);
        let w = Operand { buffer: &wb, format: WeightFormat::Quantized(q), source: MatrixLayout::KPanels.into(), split: None };
        rec.grouped_product((&b.a, AFormat::F32), w, &b.offsets, &b.rows, &b.c, x.slots, x.params).unwrap();
        rec.finish().unwrap().run(&ctx).unwrap();
        let got = read_guarded(&ctx, &b.c, x.c0.len());
        check(&got, &grouped_reference(&x, |_| true), &x, |_| true, &format!("{} through the Recorder", q.name()));
    }
}

/// Every type beyond the four of the sweeps, on one dense tile (blocks row-major, and in K panels
/// for the 32-value types) and one grouped tile, against the exact product and the F16 kernel.
#[test]
fn every_other_type_on_the_tensor_cores() {
    let Some(ctx) = coop_test_context("every_other_type_on_the_tensor_cores") else { return };
    let mut pipelines = Pipelines::default();
    let shared = ctx.limits.max_compute_workgroup_storage_size;
    let dense = *coop_gemm::TILES.iter().find(|t| t.dense_shared_bytes() <= shared).expect("a dense tile fits lavapipe");
    let grouped = coop_grouped_gemm::TILES[0];
    for q in QuantFormat::ALL.into_iter().filter(|q| !WRITTEN.contains(q)) {
        // 22 blocks of 32 (the experts' K = 704), 11 of 64, or 2 super-blocks.
        let k = k_for(q);
        for layout in [BLayout::Nk, BLayout::NkPanels] {
            let key = CoopGemmKey { tile: dense, path: WPath::Staged, w: WeightFormat::Quantized(q), layout, a: AFormat::F32 };
            if key.is_valid() && k.is_multiple_of(dense.bk as usize) {
                check_dense(&ctx, &mut pipelines, q, key, (37, 256, k));
            }
        }
        let case = Case { n: 2 * grouped.bn as usize, k, counts: vec![31, 0, 33, 1], gather: true };
        let (w_blocks, x) = quantized_experts(q, &case.inputs(5));
        let want = grouped_reference(&x, |_| true);
        let what = format!("{} coop grouped [{}] n {} k {k}", q.name(), grouped.label(), case.n);
        let got = run_blocks(&ctx, &mut pipelines, q, (grouped, WPath::Staged), &w_blocks, &x);
        check(&got, &want, &x, |_| true, &what);
        let f16_out = run_tile(&ctx, &mut pipelines, grouped, WPath::Staged, &x);
        same_as_f16(q, &got, &f16_out, k, &what);
    }
}

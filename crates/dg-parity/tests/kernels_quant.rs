//! Kernel-level parity of the quantized-weight variants (`WeightFormat::Quantized`: ggml's blocks
//! as a GGUF file stores them): the kernel reading the blocks must give what the f32 kernel gives
//! on the host's dequantization of the same blocks (`dg_model::dequantize_bytes`, bit-exact against
//! gguf-py): bit for bit where the dequantization is products only; within `fma_tolerance` for the
//! types whose `a·b ± c` (Q4_K's and Q5_K's `d·sc·q − dmin·m`, Q2_K's, Q4_1's and Q5_1's `d·q + m`)
//! a driver may contract into one fused multiply-add. The f32 runs are also checked against the
//! CPU, so that a kernel writing nothing cannot pass.
//!
//! Q8_0, Q5_0, Q4_K and Q6_K (the types dg quantizes to, from seeded values) run on every portable
//! GEMM tile and every grouped expert tile; every other type (random blocks with sane scales:
//! `testing::quant::random_blocks`) on one tile of each, 37 rows of weights: their loaders are
//! the format's, not the tile's.
//!
//! The weights are `[n, k]` rows of whole blocks (the linear layout the upload keeps), experts
//! `[e, n, k]`; the rows start at alternating halves of a word wherever a block's bytes are not a
//! multiple of four (Q8_0's 34, Q5_0's 22, Q6_K's 210), and MXFP4's 17-byte blocks start at every
//! byte of a word.

use dg_gpu::{GpuContext, Pipelines};
use dg_kernels::format::QuantFormat;
use dg_kernels::gemm::{self, GemmParams, GemmTile};
use dg_kernels::grouped_gemm::{self, GroupedGemmParams, GroupedTile};
use dg_kernels::{KernelKey, WeightFormat};
use dg_parity::testing::quant::{blocks, dispatch as run, random_blocks};
use dg_parity::testing::{gemm_reference, max_rel_err, seeded, test_context};

/// f32 GPU GEMM against the CPU (kernels_gemm.rs): f32 sums of k products in another order.
fn tolerance(k: usize) -> f32 {
    1e-6 * (k as f32).sqrt().max(4.0)
}

/// A weight the device computes as `fma(d1, q, −m1)` instead of `d1·q − m1` differs from the
/// host's by at most half an ulp of the weight, relative to max |C| at most ~2⁻²⁴·√k summed over
/// the k products of a row: the f32 GEMM's own tolerance covers it.
fn fma_tolerance(k: usize) -> f32 {
    tolerance(k)
}

/// Whether `q`'s dequantization has an `a·b ± c` a driver may fuse.
fn fusable(q: QuantFormat) -> bool {
    matches!(q, QuantFormat::Q4_K | QuantFormat::Q5_K | QuantFormat::Q2_K | QuantFormat::Q4_1 | QuantFormat::Q5_1)
}

/// The types dg quantizes to (every tile), and the others (one tile of each product).
fn written(q: QuantFormat) -> bool {
    matches!(q, QuantFormat::Q8_0 | QuantFormat::Q5_0 | QuantFormat::Q4_K | QuantFormat::Q6_K)
}

/// Weights of `q` for `values.len()` values: `values` quantized where dg writes `q`, else random
/// blocks (`seed`); the blocks and their dequantization.
fn quantized(q: QuantFormat, values: &[f32], seed: u64) -> (Vec<u32>, Vec<f32>) {
    match written(q) {
        true => blocks(q, values),
        false => random_blocks(q, values.len() / q.block_len(), seed),
    }
}

fn compare(q: QuantFormat, got: &[f32], f32_out: &[f32], k: usize, what: &str) {
    if fusable(q) {
        let (err, at) = max_rel_err(got, f32_out);
        assert!(err <= fma_tolerance(k), "{what}: rel err {err} at {at}: {} vs {}", got[at], f32_out[at]);
    } else {
        for (i, (x, y)) in got.iter().zip(f32_out).enumerate() {
            assert!(x.to_bits() == y.to_bits(), "{what}: element {i}: quantized kernel {x} vs f32 kernel {y}");
        }
    }
}

fn check_gemm(ctx: &GpuContext, pipelines: &mut Pipelines, q: QuantFormat, tile: GemmTile, (m, n, k): (u32, u32, u32)) {
    let p = GemmParams::linear(m, n, k);
    let a = seeded((m * k) as usize, u64::from(m + n), 1.0);
    let (w_blocks, w) = quantized(q, &seeded((n * k) as usize, u64::from(n * k), 1.0), 7);
    let c0 = seeded((m * n) as usize, 5, 2.0);
    let groups = gemm::workgroups(tile, m, n, 1);
    let what = format!("{} gemm [{}] {m}x{n}x{k}", q.name(), tile.label());
    let a_words: Vec<u32> = bytemuck::cast_slice(&a).to_vec();
    let w_words: Vec<u32> = bytemuck::cast_slice(&w).to_vec();
    let f32_out = run(ctx, pipelines, KernelKey::Gemm { tile, w: WeightFormat::F32 }, &p, &[&a_words, &w_words], &c0, groups);
    let want = gemm_reference(&p, &a, &w, &c0);
    let (err, at) = max_rel_err(&f32_out, &want);
    assert!(err <= tolerance(k as usize), "{what}: f32 kernel vs CPU: rel err {err} at {at}");
    let got = run(ctx, pipelines, KernelKey::Gemm { tile, w: WeightFormat::Quantized(q) }, &p, &[&a_words, &w_blocks], &c0, groups);
    compare(q, &got, &f32_out, k as usize, &what);
}

fn check_grouped(ctx: &GpuContext, pipelines: &mut Pipelines, q: QuantFormat, tile: GroupedTile, (n, k): (u32, u32)) {
    let counts = [5u32, 0, 19, 1];
    let mut offsets = vec![0u32];
    for c in counts {
        offsets.push(offsets.last().unwrap() + c);
    }
    let slots = *offsets.last().unwrap();
    let rows: Vec<u32> = (0..slots).map(|s| (s * 7 + 3) % slots).collect();
    let a = seeded((slots * k) as usize, 31, 1.0);
    let (w_blocks, w) = quantized(q, &seeded(counts.len() * (n * k) as usize, 32, 1.0), 8);
    let c0 = seeded((slots * n) as usize, 33, 2.0);
    let p = GroupedGemmParams {
        n,
        k,
        groups: counts.len() as u32,
        max_rows: *counts.iter().max().unwrap(),
        a_rs: k,
        b_group_stride: n * k,
        c_rs: n,
        gather: 1,
        ..bytemuck::Zeroable::zeroed()
    };
    let groups = grouped_gemm::workgroups(tile, n, p.max_rows, p.groups);
    let what = format!("{} grouped [{}] n {n} k {k}", q.name(), tile.label());
    let a_words: Vec<u32> = bytemuck::cast_slice(&a).to_vec();
    let w_words: Vec<u32> = bytemuck::cast_slice(&w).to_vec();
    let inputs = |w: &[u32]| [a_words.clone(), w.to_vec(), offsets.clone(), rows.clone()];
    let [a0, w0, o0, r0] = inputs(&w_words);
    let f32_out = run(ctx, pipelines, KernelKey::GroupedGemm { tile, w: WeightFormat::F32 }, &p, &[&a0, &w0, &o0, &r0], &c0, groups);
    let mut want = c0.clone();
    for e in 0..counts.len() {
        for s in offsets[e]..offsets[e + 1] {
            let row = rows[s as usize] as usize;
            for j in 0..n as usize {
                let w_row = &w[(e * n as usize + j) * k as usize..][..k as usize];
                let sum: f64 = w_row.iter().enumerate().map(|(i, &x)| f64::from(a[row * k as usize + i]) * f64::from(x)).sum();
                want[s as usize * n as usize + j] = sum as f32;
            }
        }
    }
    let (err, at) = max_rel_err(&f32_out, &want);
    assert!(err <= tolerance(k as usize), "{what}: f32 kernel vs naive: rel err {err} at {at}");
    let [a1, w1, o1, r1] = inputs(&w_blocks);
    let got = run(ctx, pipelines, KernelKey::GroupedGemm { tile, w: WeightFormat::Quantized(q) }, &p, &[&a1, &w1, &o1, &r1], &c0, groups);
    compare(q, &got, &f32_out, k as usize, &what);
}

#[test]
fn quantized_gemms_equal_f32_on_the_dequantized_weights() {
    let Some(ctx) = test_context("kernels_quant") else { return };
    let mut pipelines = Pipelines::default();
    for q in QuantFormat::ALL {
        // Rows of two super-blocks (K = 512), or of 22 blocks of 32 (the experts' K = 704); 11
        // blocks of 64 for NVFP4.
        let k = if q.block_len() == 256 { 512 } else { 704 };
        let (gemm_tiles, grouped_tiles) = match written(q) {
            true => (gemm::TILES, grouped_gemm::TILES),
            false => (&gemm::TILES[..1], &grouped_gemm::TILES[..1]),
        };
        for &tile in gemm_tiles {
            check_gemm(&ctx, &mut pipelines, q, tile, (37, 67, k));
        }
        for &tile in grouped_tiles {
            check_grouped(&ctx, &mut pipelines, q, tile, (40, k));
        }
    }
}

//! Kernel-level parity of the quantized-weight variants (`WeightFormat::Quantized`: ggml's Q8_0,
//! Q5_0, Q4_K, Q6_K blocks as a GGUF file stores them): for every portable GEMM tile and every
//! grouped expert tile, the kernel reading the blocks must give what the f32 kernel gives on the
//! host's dequantization of the same blocks (`dg_model::dequantize_bytes`, bit-exact against
//! gguf-py): bit for bit for Q8_0, Q5_0 and Q6_K, whose dequantization is products only; within
//! `Q4_K_TOLERANCE` for Q4_K, whose `d·sc·q − dmin·m` a driver may contract into one fused
//! multiply-add. The f32 runs are also checked against the CPU, so that a kernel writing nothing
//! cannot pass.
//!
//! The weights are `[n, k]` rows of whole blocks (the linear layout the upload keeps), experts
//! `[e, n, k]`; the rows start at alternating halves of a word wherever a block's bytes are not a
//! multiple of four (Q8_0's 34, Q5_0's 22, Q6_K's 210).

use dg_gpu::{GpuContext, Pipelines};
use dg_kernels::format::QuantFormat;
use dg_kernels::gemm::{self, GemmParams, GemmTile};
use dg_kernels::grouped_gemm::{self, GroupedGemmParams, GroupedTile};
use dg_kernels::{KernelKey, WeightFormat};
use dg_parity::testing::quant::{blocks as quantized, dispatch as run};
use dg_parity::testing::{gemm_reference, max_rel_err, seeded, test_context};

/// f32 GPU GEMM against the CPU (kernels_gemm.rs): f32 sums of k products in another order.
fn tolerance(k: usize) -> f32 {
    1e-6 * (k as f32).sqrt().max(4.0)
}

/// A Q4_K weight the device computes as `fma(d1, q, −m1)` instead of `d1·q − m1` differs from the
/// host's by at most half an ulp of the weight, relative to max |C| at most ~2⁻²⁴·√k summed over
/// the k products of a row: the f32 GEMM's own tolerance covers it.
fn q4_k_tolerance(k: usize) -> f32 {
    tolerance(k)
}

fn compare(q: QuantFormat, got: &[f32], f32_out: &[f32], k: usize, what: &str) {
    if q == QuantFormat::Q4_K {
        let (err, at) = max_rel_err(got, f32_out);
        assert!(err <= q4_k_tolerance(k), "{what}: rel err {err} at {at}: {} vs {}", got[at], f32_out[at]);
    } else {
        for (i, (x, y)) in got.iter().zip(f32_out).enumerate() {
            assert!(x.to_bits() == y.to_bits(), "{what}: element {i}: quantized kernel {x} vs f32 kernel {y}");
        }
    }
}

fn check_gemm(ctx: &GpuContext, pipelines: &mut Pipelines, q: QuantFormat, tile: GemmTile, (m, n, k): (u32, u32, u32)) {
    let p = GemmParams::linear(m, n, k);
    let a = seeded((m * k) as usize, u64::from(m + n), 1.0);
    let (w_blocks, w) = quantized(q, &seeded((n * k) as usize, u64::from(n * k), 1.0));
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
    let (w_blocks, w) = quantized(q, &seeded(counts.len() * (n * k) as usize, 32, 1.0));
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
        // Rows of two super-blocks (K = 512), or of 22 blocks of 32 (the experts' K = 704).
        let k = if q.block_len() == 256 { 512 } else { 704 };
        for &tile in gemm::TILES {
            check_gemm(&ctx, &mut pipelines, q, tile, (37, 67, k));
        }
        for &tile in grouped_gemm::TILES {
            check_grouped(&ctx, &mut pipelines, q, tile, (40, k));
        }
    }
}

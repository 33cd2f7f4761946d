//! Activations quantized to int8 per 32-value block, the numerics of products on int8 tensor
//! cores (llama.cpp's MMQ kernels, which quantize the activations with `quantize_row_q8_1` and
//! multiply integer weight blocks by them): the CPU reference of that mode.
//!
//! No HF module has it (transformers runs the experts' `nn.Linear`s in the weights' own
//! precision); it changes what the experts of `DiffusionGemmaTextExperts` compute. A row of K
//! activations is cut into 32-value blocks along K ([`quantize_row_q8_1`]): per block a scale
//! `d = max|a| / 127` (f32: MMQ keeps it in f32 for the 8-bit types' products), `q = round(a / d)`
//! (half away from zero, C's `roundf`) and the sum term `s = d · Σ q` (what Q4_K's mins need).
//! A weight block times an activation block is then an integer dot product scaled per block:
//!
//! ```text
//! Q8_0:  Σ_b d_a · d_w · (Σ q_a · q_w)                          (32-value blocks)
//! Q4_K:  Σ_sub d·sc · d_a · (Σ q_a · q_w)  −  dmin·m · s_a       (32-value sub-blocks)
//! ```
//!
//! ([`dot_q8_0`], [`dot_q4_k`]: the reference the int8 kernels are gated against). Both equal the
//! f32 product of the dequantized weights with the dequantized activations `d · q` up to f32
//! rounding, so the forward's mode ([`ActivationQuant::Int8`]) rounds the experts' inputs to
//! [`fake_quantize_rows`] and keeps its GEMM.

use half::f16;

/// Values of one activation block (ggml's `QK8_1`).
pub const BLOCK: usize = 32;

/// The largest |q| of a block: `d = max|a| / Q_MAX`.
const Q_MAX: f32 = 127.0;

/// How the experts' products take their activations: the one place the forward's mode is named.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ActivationQuant {
    /// As computed, f32 (the reference).
    #[default]
    F32,
    /// Quantized per 32-value block of K to int8 with an f32 scale ([`quantize_row_q8_1`]), in
    /// every expert product whose K is whole blocks (every one a quantized type stores: its rows
    /// are whole 32-value blocks).
    Int8,
}

impl ActivationQuant {
    /// The mode's name in reports (`f32`, `int8`).
    pub fn name(self) -> &'static str {
        match self {
            ActivationQuant::F32 => "f32",
            ActivationQuant::Int8 => "int8",
        }
    }
}

/// One quantized activation block: `a ≈ d · q`, `s = d · Σ q`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockQ8_1 {
    pub d: f32,
    pub s: f32,
    pub q: [i8; BLOCK],
}

/// One block of `x` (at most [`BLOCK`] values; missing ones count as 0), as llama.cpp's
/// `quantize_row_q8_1_ref` computes it with the scales kept in f32.
pub fn quantize_block_q8_1(x: &[f32]) -> BlockQ8_1 {
    assert!(x.len() <= BLOCK, "a block holds at most {BLOCK} values, got {}", x.len());
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / Q_MAX;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut q = [0i8; BLOCK];
    let mut sum = 0i32;
    for (q, &v) in q.iter_mut().zip(x) {
        // |v · id| ≤ 127 up to rounding of id; the clamp keeps a value at 127.0000x in range.
        *q = (v * id).round().clamp(-Q_MAX, Q_MAX) as i8;
        sum += i32::from(*q);
    }
    BlockQ8_1 { d, s: sum as f32 * d, q }
}

/// `x` in 32-value blocks along its length (a short last block where the length is not whole
/// blocks).
pub fn quantize_row_q8_1(x: &[f32]) -> Vec<BlockQ8_1> {
    x.chunks(BLOCK).map(quantize_block_q8_1).collect()
}

/// Rows of `k` values rounded to their blocks' `d · q`, in place: the activations the int8
/// products multiply, for an f32 product on the dequantized weights. Rows whose `k` is not
/// whole blocks are left as they are (no int8 kernel takes them).
pub fn fake_quantize_rows(x: &mut [f32], k: usize) {
    if k == 0 || !k.is_multiple_of(BLOCK) {
        return;
    }
    for block in x.chunks_exact_mut(BLOCK) {
        let b = quantize_block_q8_1(block);
        block.iter_mut().zip(b.q).for_each(|(v, q)| *v = b.d * f32::from(q));
    }
}

/// Bytes of a `block_q8_0` (f16 `d`, 32 i8).
pub const Q8_0_BYTES: usize = 34;

/// Bytes of a `block_q4_K` (f16 `d`, f16 `dmin`, 12 bytes of 6-bit scales and mins, 128 bytes of
/// nibbles) of 256 values.
pub const Q4_K_BYTES: usize = 144;

fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// One row's Q8_0 blocks (`blocks.len() = 34 · a.len()`) times the activation blocks `a`:
/// `Σ_b d_a · d_w · Σ q_a · q_w`, the integer sums exact, the scales' products in f32 (in the
/// order an int8 kernel applies them: `(d_w · d_a) · sum`), accumulated over blocks in f32.
pub fn dot_q8_0(blocks: &[u8], a: &[BlockQ8_1]) -> f32 {
    assert_eq!(blocks.len(), a.len() * Q8_0_BYTES, "Q8_0 bytes of {} blocks", a.len());
    blocks.chunks_exact(Q8_0_BYTES).zip(a).fold(0f32, |acc, (w, a)| {
        let sum: i32 = w[2..].iter().zip(a.q).map(|(&qw, qa)| i32::from(qw as i8) * i32::from(qa)).sum();
        acc + (f16_at(w, 0) * a.d) * sum as f32
    })
}

/// ggml's `get_scale_min_k4`: sub-block `j`'s 6-bit scale and min from a Q4_K block's 12 bytes.
pub fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 { (q[j] & 63, q[j + 4] & 63) } else { ((q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4)) }
}

/// Sub-block `j` (32 values) of a Q4_K block: its nibbles as unsigned integers 0..=15.
pub fn q4_k_nibbles(block: &[u8], j: usize) -> [u8; BLOCK] {
    let qs = &block[16 + 32 * (j / 2)..16 + 32 * (j / 2) + 32];
    std::array::from_fn(|l| if j.is_multiple_of(2) { qs[l] & 15 } else { qs[l] >> 4 })
}

/// One row's Q4_K blocks (`blocks.len() = 144 · a.len() / 8`) times the activation blocks `a`:
/// per 32-value sub-block `d·sc · d_a · Σ q_a · q_w − dmin·m · s_a`, accumulated in f32.
pub fn dot_q4_k(blocks: &[u8], a: &[BlockQ8_1]) -> f32 {
    assert_eq!(blocks.len() * 8, a.len() * Q4_K_BYTES, "Q4_K bytes of {} activation blocks", a.len());
    let mut acc = 0f32;
    for (w, a) in blocks.chunks_exact(Q4_K_BYTES).zip(a.chunks_exact(8)) {
        let (d, dmin) = (f16_at(w, 0), f16_at(w, 2));
        for (j, a) in a.iter().enumerate() {
            let (sc, m) = scale_min_k4(j, &w[4..16]);
            let sum: i32 = q4_k_nibbles(w, j).iter().zip(a.q).map(|(&qw, qa)| i32::from(qw) * i32::from(qa)).sum();
            acc += (d * f32::from(sc)) * a.d * sum as f32 - (dmin * f32::from(m)) * a.s;
        }
    }
    acc
}

#[cfg(test)]
mod tests {
    use dg_model::{StoredDtype, dequantize_bytes, quantize};

    use super::*;

    /// Seeded values with a spread of magnitudes (a block of zeros, tiny and large ones).
    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..n)
            .map(|i| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                let u = (s >> 11) as f64 / (1u64 << 53) as f64 - 0.5;
                let scale = [1.0, 1e-3, 30.0, 0.0][(i / BLOCK) % 4];
                (u * scale) as f32
            })
            .collect()
    }

    /// The product of the dequantized blocks, in f64.
    fn direct(w: &[f32], a: &[BlockQ8_1]) -> f64 {
        let a: Vec<f64> = a.iter().flat_map(|b| b.q.map(|q| f64::from(b.d) * f64::from(q))).collect();
        w.iter().zip(&a).map(|(&w, a)| f64::from(w) * a).sum()
    }

    /// f32 accumulation over `k` terms of magnitude up to `scale`: a few ulps a term.
    fn bound(k: usize, scale: f64) -> f64 {
        4.0 * k as f64 * f64::from(f32::EPSILON) * scale
    }

    #[test]
    fn blocks_follow_quantize_row_q8_1() {
        let x: Vec<f32> = (0..40).map(|i| (i as f32 - 20.5) * 0.37).collect();
        let blocks = quantize_row_q8_1(&x);
        assert_eq!(blocks.len(), 2, "a short last block");
        for (b, x) in blocks.iter().zip(x.chunks(BLOCK)) {
            let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
            assert_eq!(b.d, amax / 127.0);
            assert!(b.q.iter().any(|&q| q.abs() == 127), "the largest value takes ±127");
            for (&q, &v) in b.q.iter().zip(x) {
                assert!((f32::from(q) * b.d - v).abs() <= 0.5 * b.d * (1.0 + 1e-6), "{v} → {q}·{}", b.d);
            }
            assert_eq!(b.s, b.q.iter().map(|&q| i32::from(q)).sum::<i32>() as f32 * b.d);
        }
        // Halves round away from zero (C's roundf), and a block of zeros has d = 0, q = 0.
        let half = quantize_block_q8_1(&[127.0, 0.5, -0.5, 1.5]);
        assert_eq!(&half.q[..4], &[127, 1, -1, 2]);
        let zero = quantize_block_q8_1(&[0.0; BLOCK]);
        assert_eq!((zero.d, zero.s, zero.q), (0.0, 0.0, [0; BLOCK]));
    }

    #[test]
    fn fake_quantization_is_the_blocks_values_and_skips_partial_rows() {
        let mut x = values(3 * 64, 5);
        let blocks = quantize_row_q8_1(&x);
        fake_quantize_rows(&mut x, 64);
        let want: Vec<f32> = blocks.iter().flat_map(|b| b.q.map(|q| b.d * f32::from(q))).collect();
        assert_eq!(x, want);
        let mut odd = values(3 * 48, 6);
        let before = odd.clone();
        fake_quantize_rows(&mut odd, 48);
        assert_eq!(odd, before);
    }

    #[test]
    fn q8_0_products_match_the_dequantized_product() {
        // K of 1, 3 and 9 blocks (odd, not powers of two), rows of several magnitudes.
        for (k, seed) in [(32, 1), (96, 2), (288, 3)] {
            for row in 0..5u64 {
                let w = values(k, seed * 100 + row);
                let bytes = quantize(StoredDtype::Q8_0, &w).unwrap();
                let wd = dequantize_bytes(StoredDtype::Q8_0, &bytes).unwrap();
                let a = quantize_row_q8_1(&values(k, seed * 1000 + row + 7));
                let got = f64::from(dot_q8_0(&bytes, &a));
                let want = direct(&wd, &a);
                let scale: f64 = wd
                    .iter()
                    .zip(a.iter().flat_map(|b| b.q.map(|q| f64::from(b.d) * f64::from(q))))
                    .map(|(&w, a)| (f64::from(w) * a).abs())
                    .sum();
                assert!((got - want).abs() <= bound(k, scale.max(f64::MIN_POSITIVE)), "k {k} row {row}: {got} vs {want}");
            }
        }
    }

    #[test]
    fn q4_k_products_match_the_dequantized_product() {
        for (k, seed) in [(256, 1), (768, 2)] {
            for row in 0..4u64 {
                let w = values(k, seed * 100 + row);
                let bytes = quantize(StoredDtype::Q4_K, &w).unwrap();
                let wd = dequantize_bytes(StoredDtype::Q4_K, &bytes).unwrap();
                let a = quantize_row_q8_1(&values(k, seed * 1000 + row + 3));
                let got = f64::from(dot_q4_k(&bytes, &a));
                let want = direct(&wd, &a);
                // The min term subtracts a sum of up to 32 terms: bound by the magnitudes of both parts.
                let av: Vec<f64> = a.iter().flat_map(|b| b.q.map(|q| f64::from(b.d) * f64::from(q))).collect();
                let scale: f64 = wd.iter().zip(&av).map(|(&w, a)| (f64::from(w) * a).abs()).sum::<f64>()
                    + w.iter().zip(&av).map(|(_, a)| a.abs()).sum::<f64>() * wd.iter().fold(0f64, |m, &v| m.max(f64::from(v).abs()));
                assert!((got - want).abs() <= bound(k, scale.max(f64::MIN_POSITIVE)), "k {k} row {row}: {got} vs {want}");
            }
        }
    }

    #[test]
    fn the_int8_mode_changes_the_product_by_the_activations_rounding() {
        // Against the f32 activations the error is the activations' rounding: at most d/2 a value.
        let k = 160;
        let w = values(k, 11);
        let x = values(k, 12);
        let a = quantize_row_q8_1(&x);
        let bytes = quantize(StoredDtype::Q8_0, &w).unwrap();
        let wd = dequantize_bytes(StoredDtype::Q8_0, &bytes).unwrap();
        let exact: f64 = wd.iter().zip(&x).map(|(&w, &x)| f64::from(w) * f64::from(x)).sum();
        let limit: f64 = wd.iter().enumerate().map(|(i, &w)| f64::from(w).abs() * 0.5 * f64::from(a[i / BLOCK].d)).sum();
        let got = f64::from(dot_q8_0(&bytes, &a));
        assert!((got - exact).abs() <= limit * 1.001 + 1e-9, "{got} vs {exact} (limit {limit})");
        assert_ne!(got, exact, "the mode changes the numerics");
    }
}

//! Element-wise and row-wise ops of the reference, in f32 with the reference's formulas.
//!
//! `DiffusionGemmaRMSNorm` (weight multiplies directly, `pow(mean(x²) + eps, −0.5)` which torch
//! evaluates as `1/sqrt`), `gelu_pytorch_tanh`, softmax over the last axis, the final softcap.

use rayon::prelude::*;

/// `x · (mean(x²) + eps)^(−1/2)`, times `weight` when given; in place over each row of `dim`.
pub fn rms_norm_rows(x: &mut [f32], dim: usize, weight: Option<&[f32]>, eps: f32) {
    debug_assert_eq!(x.len() % dim, 0);
    if let Some(w) = weight {
        debug_assert_eq!(w.len(), dim);
    }
    for row in x.chunks_exact_mut(dim) {
        let inv = inv_rms(row, eps);
        match weight {
            Some(w) => row.iter_mut().zip(w).for_each(|(v, &w)| *v = (*v * inv) * w),
            None => row.iter_mut().for_each(|v| *v *= inv),
        }
    }
}

/// RMSNorm from `src` into `dst` (same shape).
pub fn rms_norm_into(dst: &mut [f32], src: &[f32], dim: usize, weight: Option<&[f32]>, eps: f32) {
    dst.copy_from_slice(src);
    rms_norm_rows(dst, dim, weight, eps);
}

fn inv_rms(row: &[f32], eps: f32) -> f32 {
    let mut acc = [0f32; 8];
    let mut chunks = row.chunks_exact(8);
    for c in &mut chunks {
        for i in 0..8 {
            acc[i] += c[i] * c[i];
        }
    }
    let mut sum: f32 = chunks.remainder().iter().map(|v| v * v).sum();
    sum += acc.iter().sum::<f32>();
    let mean = sum / row.len() as f32 + eps;
    1.0 / mean.sqrt()
}

/// `gelu_pytorch_tanh`: `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`.
#[inline]
pub fn gelu_tanh(x: f32) -> f32 {
    const BETA: f32 = 0.797_884_6; // sqrt(2/pi)
    const KAPPA: f32 = 0.044715;
    let inner = BETA * (x + KAPPA * (x * x * x));
    0.5 * x * (1.0 + inner.tanh())
}

/// `gate ← gelu_tanh(gate) ⊙ up`, the gated-MLP activation.
pub fn gelu_glu(gate: &mut [f32], up: &[f32]) {
    gate.iter_mut().zip(up).for_each(|(g, &u)| *g = gelu_tanh(*g) * u);
}

/// Softmax of one row in place (subtract the max, exponentiate, divide by the sum). The sum is
/// accumulated in f64: rows as long as the vocabulary (262144) would otherwise lose ~1e-4
/// relative in a sequential f32 sum, far more than torch's vectorised reduction does.
pub fn softmax_in_place(row: &mut [f32]) {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f64;
    for v in row.iter_mut() {
        *v = (*v - max).exp();
        sum += *v as f64;
    }
    let inv = (1.0 / sum) as f32;
    row.iter_mut().for_each(|v| *v *= inv);
}

/// Final logit softcap `cap · tanh(x / cap)` (divide, tanh, multiply, in f32), in parallel chunks
/// (a [256 × 262144] logits block is 67M tanh evaluations).
pub fn softcap_in_place(x: &mut [f32], cap: f32) {
    x.par_chunks_mut(1 << 14).for_each(|chunk| chunk.iter_mut().for_each(|v| *v = (*v / cap).tanh() * cap));
}

/// Row softmax of `src: [rows, cols]` into `dst`, rows in parallel.
pub fn softmax_rows_into(dst: &mut [f32], src: &[f32], cols: usize) {
    dst.par_chunks_mut(cols).zip(src.par_chunks(cols)).for_each(|(d, s)| {
        d.copy_from_slice(s);
        softmax_in_place(d);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_gives_unit_rms_times_weight() {
        let mut x = vec![3.0, 4.0, 0.0, 0.0];
        rms_norm_rows(&mut x, 4, Some(&[1.0, 2.0, 1.0, 1.0]), 0.0);
        // mean(x²) = 25/4 → rms 2.5.
        assert_eq!(x, vec![1.2, 3.2, 0.0, 0.0]);
    }

    #[test]
    fn gelu_tanh_reference_values() {
        // torch.nn.functional.gelu(x, approximate="tanh")
        for (x, want) in [(1.0f32, 0.841_192), (-2.0, -0.045_402_3), (0.0, 0.0), (3.0, 2.996_363_7)] {
            assert!((gelu_tanh(x) - want).abs() < 1e-6, "{x}: {} vs {want}", gelu_tanh(x));
        }
    }

    #[test]
    fn softmax_and_softcap() {
        let mut r = vec![0.0, f32::ln(3.0)];
        softmax_in_place(&mut r);
        assert!((r[0] - 0.25).abs() < 1e-7 && (r[1] - 0.75).abs() < 1e-7);
        let mut l = vec![0.0, 30.0, -1000.0];
        softcap_in_place(&mut l, 30.0);
        assert!((l[1] - 30.0 * 1f32.tanh()).abs() < 1e-5 && l[2] == -30.0 && l[0] == 0.0);
    }
}

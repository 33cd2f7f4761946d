//! ggml's `Q6_K` (`block_q6_K` in `ggml/src/ggml-common.h`): 256 values in 210 bytes, 128 bytes of
//! low nibbles `ql`, 64 bytes of high 2-bit pairs `qh`, sixteen `int8_t` sub-block scales and an
//! f16 super scale `d`. Value `i` of sub-block `j` (16 values) is `d * scales[j] * (q[i] - 32)`
//! with `q` in 0..64; each half of 128 values takes 64 bytes of `ql` (values `l` and `l + 64` in
//! byte `l`'s low and high nibbles, `l + 32` and `l + 96` in byte `l + 32`'s) and 32 of `qh`
//! (values `l`, `l + 32`, `l + 64`, `l + 96` in bits 0-1, 2-3, 4-5, 6-7 of byte `l`).
//!
//! Dequantization is ggml's `dequantize_row_q6_K` (as gguf-py's `Q6_K.dequantize_blocks`).
//! Quantization is ggml's `quantize_row_q6_K_ref` with `make_qx_quants` (gguf-py has no Q6_K
//! quantizer), operation for operation and without fused multiply-adds: the bytes of ggml's C built
//! without floating-point contraction (`-ffp-contract=off`, or baseline x86-64). A native build
//! that contracts `make_qx_quants`'s sums into FMAs rounds them differently and can pick other levels.

use super::{f16_at, f16_le, f16_round, nearest_int};

const BLOCK_LEN: usize = 256;
const BLOCK_BYTES: usize = 210;
/// Values per sub-block (one 8-bit scale).
const SUB: usize = 16;
/// ggml's `GROUP_MAX_EPS`: below this a group counts as all zero.
const GROUP_MAX_EPS: f32 = 1e-15;

/// One block's 256 values.
pub(super) fn dequantize_block(block: &[u8; BLOCK_BYTES], out: &mut [f32; BLOCK_LEN]) {
    let d = f16_at(block, 208);
    for half in 0..2 {
        let ql = &block[64 * half..64 * (half + 1)];
        let qh = &block[128 + 32 * half..128 + 32 * (half + 1)];
        let sc = &block[192 + 8 * half..192 + 8 * (half + 1)];
        let out = &mut out[128 * half..128 * (half + 1)];
        for l in 0..32 {
            let is = l / 16;
            let q = [
                (ql[l] & 0x0f) | ((qh[l] & 3) << 4),
                (ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4),
                (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4),
                (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4),
            ];
            for (k, q) in q.into_iter().enumerate() {
                out[l + 32 * k] = d * f32::from(sc[is + 2 * k] as i8) * f32::from(q as i8 - 32);
            }
        }
    }
}

/// 256 finite values as one block (`quantize_row_q6_K_ref`).
pub(super) fn quantize_block(x: &[f32; BLOCK_LEN]) -> [u8; BLOCK_BYTES] {
    let mut levels = [0u8; BLOCK_LEN];
    let mut scales = [0f32; BLOCK_LEN / SUB];
    let (mut max_scale, mut max_abs_scale) = (0f32, 0f32);
    for (ib, (xs, ls)) in x.chunks_exact(SUB).zip(levels.chunks_exact_mut(SUB)).enumerate() {
        scales[ib] = make_qx_quants(32, xs, ls);
        if scales[ib].abs() > max_abs_scale {
            max_abs_scale = scales[ib].abs();
            max_scale = scales[ib];
        }
    }
    let mut block = [0u8; BLOCK_BYTES];
    if max_abs_scale < GROUP_MAX_EPS {
        return block;
    }
    let iscale = -128.0 / max_scale;
    block[208..].copy_from_slice(&f16_le(1.0 / iscale));
    let d_all = f16_round(1.0 / iscale);
    for (ib, &scale) in scales.iter().enumerate() {
        // ggml stores MIN(127, nearest_int(...)) in an int8_t.
        block[192 + ib] = nearest_int(iscale * scale).min(127) as i8 as u8;
    }
    for j in 0..BLOCK_LEN / SUB {
        let d = d_all * f32::from(block[192 + j] as i8);
        if d == 0.0 {
            continue;
        }
        for i in SUB * j..SUB * (j + 1) {
            levels[i] = (nearest_int(x[i] / d).clamp(-32, 31) + 32) as u8;
        }
    }
    for half in 0..2 {
        let ls = &levels[128 * half..128 * (half + 1)];
        for l in 0..32 {
            block[64 * half + l] = (ls[l] & 0x0f) | ((ls[l + 64] & 0x0f) << 4);
            block[64 * half + l + 32] = (ls[l + 32] & 0x0f) | ((ls[l + 96] & 0x0f) << 4);
            block[128 + 32 * half + l] = (ls[l] >> 4) | ((ls[l + 32] >> 4) << 2) | ((ls[l + 64] >> 4) << 4) | ((ls[l + 96] >> 4) << 6);
        }
    }
    block
}

/// ggml's `make_qx_quants` as `quantize_row_q6_K_ref` calls it (`rmse_type` 1, no importance
/// weights, so each value weighs `x * x`): the scale of a symmetric `2 * nmax`-level grid for `x`,
/// trying 19 grid widths around `nmax`, and the levels (offset by `nmax`) in `levels`.
fn make_qx_quants(nmax: i32, x: &[f32], levels: &mut [u8]) -> f32 {
    let (mut max, mut amax) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        levels.fill(0);
        return 0.0;
    }
    let level = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-nmax, nmax - 1);
    let sums = |iscale: f32| {
        let (mut sumlx, mut suml2) = (0f32, 0f32);
        for &v in x {
            let l = level(iscale, v) as f32;
            let w = v * v;
            sumlx += w * v * l;
            suml2 += w * l * l;
        }
        (sumlx, suml2)
    };
    let set_levels = |levels: &mut [u8], iscale: f32| {
        for (q, &v) in levels.iter_mut().zip(x) {
            *q = (level(iscale, v) + nmax) as u8;
        }
    };
    let iscale = -(nmax as f32) / max;
    set_levels(levels, iscale);
    let (sumlx, suml2) = sums(iscale);
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in (-9..=9).filter(|&is| is != 0) {
        let iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        let (sumlx, suml2) = sums(iscale);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            set_levels(levels, iscale);
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{gaussian, hex, worst_relative_rms};

    /// Worst per-block RMS error of a Gaussian block after the round trip, relative to its RMS: a
    /// 64-level symmetric grid over a 16-value sub-block's largest magnitude (about 2 sigma) steps
    /// 0.0625 sigma, whose rounding error has RMS step / sqrt(12) = 0.018 sigma (ggml's own
    /// reference lands at 0.0177 on average, 0.0208 at worst over 400 blocks).
    const Q6_K_GAUSSIAN_RMS: f32 = 0.025;

    #[test]
    fn an_exactly_representable_block_takes_the_obvious_grid() {
        // Sub-block ib holds (k - 8) * s for k in 0..16, s = 2^(ib/2 - 4): make_qx_quants' first
        // grid is exact (scale s/4, levels 4(k - 8)), the largest scale 2 gives d = 2 / -128, and
        // sub-block scales -16 s (-1 for s = 1/16 ... -128 for s = 8); stored levels are 4k.
        let x: [f32; BLOCK_LEN] = std::array::from_fn(|i| ((i % 16) as f32 - 8.0) * 2f32.powi(i as i32 / 32 - 4));
        let b = quantize_block(&x);
        assert_eq!(hex(&b[208..]), "00a4");
        assert_eq!(hex(&b[192..208]), "fffffefefcfcf8f8f0f0e0e0c0c08080");
        assert_eq!(hex(&b[..8]), "004488cc004488cc");
        assert_eq!(hex(&b[128..136]), "0000000055555555");
        let mut out = [f32::NAN; BLOCK_LEN];
        dequantize_block(&b, &mut out);
        assert_eq!(out, x);
    }

    #[test]
    fn a_block_quantizes_to_ggml_reference_bytes() {
        // quantize_row_q6_K_ref's bytes for this input (ggml's C built without FP contraction).
        let x: [f32; BLOCK_LEN] = std::array::from_fn(|i| ((i * 37) % 256) as f32 / 64.0 - 2.0);
        let want = "0079d34ca51e97016ad33da60f88f25bc33da7117be04ab42e98f26cd14bb51f9903ad31db650faa14be42ec7610aa25a2\
                    4de3993fd50bb15cf2984ee41ab06b10b60ba14ee4892fc51bb05df3993ed4fb51ab0167ce24ea40aaf057bd13d93098f1\
                    5bb41dc62f89e24ba40eb7107ad34cb52f88f06ad33da61079e15ac43d97f82c1d514286f7f82c1d514286fbe82c115d4e\
                    8bf7e420115d4ebbf7e420115db27544081bdfeeb17544081bdfe2b17574382bef92814574382fdf92814574387f75738b\
                    85807a718f897f7b758d8b811010";
        assert_eq!(hex(&quantize_block(&x)), want);
    }

    #[test]
    fn gaussian_blocks_round_trip_within_the_grid_error() {
        let x = gaussian(64 * BLOCK_LEN, 0x2545_f491_4f6c_dd1d);
        let mut y = vec![0f32; x.len()];
        for (xs, ys) in x.as_chunks::<BLOCK_LEN>().0.iter().zip(y.as_chunks_mut::<BLOCK_LEN>().0) {
            dequantize_block(&quantize_block(xs), ys);
        }
        let worst = worst_relative_rms(&x, &y, BLOCK_LEN);
        assert!(worst < Q6_K_GAUSSIAN_RMS, "worst block's relative RMS error {worst}");
    }
}

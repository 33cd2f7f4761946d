//! ggml's `Q6_K` (`block_q6_K` in `ggml/src/ggml-common.h`): 256 values in 210 bytes, 128 bytes of
//! low nibbles `ql`, 64 bytes of high 2-bit pairs `qh`, sixteen `int8_t` sub-block scales and an
//! f16 super scale `d`. Value `i` of sub-block `j` (16 values) is `d * scales[j] * (q[i] - 32)`
//! with `q` in 0..64; each half of 128 values takes 64 bytes of `ql` (values `l` and `l + 64` in
//! byte `l`'s low and high nibbles, `l + 32` and `l + 96` in byte `l + 32`'s) and 32 of `qh`
//! (values `l`, `l + 32`, `l + 64`, `l + 96` in bits 0-1, 2-3, 4-5, 6-7 of byte `l`).
//!
//! Dequantization is ggml's `dequantize_row_q6_K` (as gguf-py's `Q6_K.dequantize_blocks`).
//! Quantization is ggml's `quantize_row_q6_K_ref` with `make_qx_quants` (gguf-py has no Q6_K
//! quantizer), operation for operation.

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

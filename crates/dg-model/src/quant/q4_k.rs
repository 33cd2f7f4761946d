//! ggml's `Q4_K` (`block_q4_K` in `ggml/src/ggml-common.h`): 256 values in 144 bytes, an f16 super
//! scale `d` and super min `dmin`, 12 bytes of eight 6-bit sub-block scales and mins (unpacked by
//! `get_scale_min_k4`), and 128 bytes of nibbles; each 64 values share 32 bytes (the first 32
//! values in the low nibbles, the next 32 in the high ones). Value `i` of sub-block `j` (32 values)
//! is `d * sc[j] * q[i] - dmin * m[j]`.
//!
//! Dequantization is ggml's `dequantize_row_q4_K` (as gguf-py's `Q4_K.dequantize_blocks`).
//! Quantization is ggml's `quantize_row_q4_K_ref` with `make_qkx2_quants` (gguf-py has no Q4_K
//! quantizer), operation for operation.

use super::{f16_at, f16_le, f16_round, nearest_int};

const BLOCK_LEN: usize = 256;
const BLOCK_BYTES: usize = 144;
/// Values per sub-block (one 6-bit scale and min).
const SUB: usize = 32;

/// ggml's `get_scale_min_k4`: sub-block `j`'s 6-bit scale and min from the 12 packed bytes.
fn scale_min(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// One block's 256 values.
pub(super) fn dequantize_block(block: &[u8; BLOCK_BYTES], out: &mut [f32; BLOCK_LEN]) {
    let (d, dmin) = (f16_at(block, 0), f16_at(block, 2));
    let scales = &block[4..16];
    for (pair, (qs, out)) in block[16..].chunks_exact(SUB).zip(out.chunks_exact_mut(2 * SUB)).enumerate() {
        let (sc1, m1) = scale_min(2 * pair, scales);
        let (sc2, m2) = scale_min(2 * pair + 1, scales);
        let (d1, m1) = (d * f32::from(sc1), dmin * f32::from(m1));
        let (d2, m2) = (d * f32::from(sc2), dmin * f32::from(m2));
        for (l, &q) in qs.iter().enumerate() {
            out[l] = d1 * f32::from(q & 0x0f) - m1;
            out[l + SUB] = d2 * f32::from(q >> 4) - m2;
        }
    }
}

/// 256 finite values as one block (`quantize_row_q4_K_ref`).
pub(super) fn quantize_block(x: &[f32; BLOCK_LEN]) -> [u8; BLOCK_BYTES] {
    let mut levels = [0u8; BLOCK_LEN];
    let mut scales = [0f32; BLOCK_LEN / SUB];
    let mut mins = [0f32; BLOCK_LEN / SUB];
    let (mut max_scale, mut max_min) = (0f32, 0f32);
    for (j, (xs, ls)) in x.chunks_exact(SUB).zip(levels.chunks_exact_mut(SUB)).enumerate() {
        let mut sum_x2 = 0f32;
        for &v in xs {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        let weights: [f32; SUB] = std::array::from_fn(|l| av_x + xs[l].abs());
        (scales[j], mins[j]) = make_qkx2_quants(15, xs, &weights, ls, -1.0, 0.1, 20, false);
        if scales[j] > max_scale {
            max_scale = scales[j];
        }
        if mins[j] > max_min {
            max_min = mins[j];
        }
    }

    let mut block = [0u8; BLOCK_BYTES];
    let inv_scale = if max_scale > 0.0 { 63.0 / max_scale } else { 0.0 };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let packed = &mut block[4..16];
    for j in 0..BLOCK_LEN / SUB {
        // ggml stores nearest_int's int in a uint8_t, then caps it at 63.
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            packed[j] = ls;
            packed[j + 4] = lm;
        } else {
            packed[j + 4] = (ls & 0x0f) | ((lm & 0x0f) << 4);
            packed[j - 4] |= (ls >> 4) << 6;
            packed[j] |= (lm >> 4) << 6;
        }
    }
    block[..2].copy_from_slice(&f16_le(max_scale / 63.0));
    block[2..4].copy_from_slice(&f16_le(max_min / 63.0));

    let (d_all, dmin_all) = (f16_round(max_scale / 63.0), f16_round(max_min / 63.0));
    for j in 0..BLOCK_LEN / SUB {
        let (sc, m) = scale_min(j, &block[4..16]);
        let d = d_all * f32::from(sc);
        if d == 0.0 {
            continue;
        }
        let dm = dmin_all * f32::from(m);
        for i in SUB * j..SUB * (j + 1) {
            levels[i] = nearest_int((x[i] + dm) / d).clamp(0, 15) as u8;
        }
    }
    for (pair, qs) in block[16..].chunks_exact_mut(SUB).enumerate() {
        let ls = &levels[2 * SUB * pair..2 * SUB * (pair + 1)];
        for (l, q) in qs.iter_mut().enumerate() {
            *q = ls[l] | (ls[l + SUB] << 4);
        }
    }
    block
}

/// ggml's `make_qkx2_quants`: the scale and (negated) min of an affine `nmax + 1`-level grid for
/// `x` under `weights`, searching `nstep + 1` grid widths from `nmax + rmin` in steps of `rdelta`,
/// and the levels in `levels`. Returns `(scale, -min)`.
#[allow(clippy::too_many_arguments)] // ggml's signature, kept so the port reads against it
fn make_qkx2_quants(nmax: i32, x: &[f32], weights: &[f32; SUB], levels: &mut [u8], rmin: f32, rdelta: f32, nstep: i32, use_mad: bool) -> (f32, f32) {
    let n = x.len();
    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        levels.fill(0);
        return (0.0, -min);
    }
    let error = |diff: f32| if use_mad { diff.abs() } else { diff * diff };
    // `min` changes as better grids are found and later widths start from it, as in ggml.
    let level = |iscale: f32, v: f32, min: f32| nearest_int(iscale * (v - min)).clamp(0, nmax) as u8;
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0f32;
    for i in 0..n {
        levels[i] = level(iscale, x[i], min);
        best_error += weights[i] * error(scale * f32::from(levels[i]) + min - x[i]);
    }
    if nstep < 1 {
        return (scale, -min);
    }
    let mut aux = [0u8; SUB];
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0f32, 0f32, 0f32);
        for i in 0..n {
            aux[i] = level(iscale, x[i], min);
            let (w, l) = (weights[i], f32::from(aux[i]));
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * x[i];
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0f32;
            for i in 0..n {
                cur_error += weights[i] * error(this_scale * f32::from(aux[i]) + this_min - x[i]);
            }
            if cur_error < best_error {
                levels[..n].copy_from_slice(&aux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

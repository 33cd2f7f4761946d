//! ggml's `Q4_K` (`block_q4_K` in `ggml/src/ggml-common.h`): 256 values in 144 bytes, an f16 super
//! scale `d` and super min `dmin`, 12 bytes of eight 6-bit sub-block scales and mins (unpacked by
//! `get_scale_min_k4`), and 128 bytes of nibbles; each 64 values share 32 bytes (the first 32
//! values in the low nibbles, the next 32 in the high ones). Value `i` of sub-block `j` (32 values)
//! is `d * sc[j] * q[i] - dmin * m[j]`.
//!
//! Dequantization is ggml's `dequantize_row_q4_K` (as gguf-py's `Q4_K.dequantize_blocks`).
//! Quantization is ggml's `quantize_row_q4_K_ref` with `make_qkx2_quants` (gguf-py has no Q4_K
//! quantizer), operation for operation and without fused multiply-adds: the bytes of ggml's C built
//! without floating-point contraction (`-ffp-contract=off`, or baseline x86-64). A native build
//! that contracts `make_qkx2_quants`'s sums into FMAs rounds them differently and can pick other levels.

use super::{f16_at, f16_le, f16_round, nearest_int};

const BLOCK_LEN: usize = 256;
const BLOCK_BYTES: usize = 144;
/// Values per sub-block (one 6-bit scale and min).
const SUB: usize = 32;

/// ggml's `get_scale_min_k4`: sub-block `j`'s 6-bit scale and min from the 12 packed bytes.
fn scale_min(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 { (q[j] & 63, q[j + 4] & 63) } else { ((q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4)) }
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
fn make_qkx2_quants(
    nmax: i32,
    x: &[f32],
    weights: &[f32; SUB],
    levels: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> (f32, f32) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{gaussian, hex, worst_relative_rms};

    /// Worst per-block RMS error of a Gaussian block after the round trip, relative to its RMS: a
    /// 16-level grid over a 32-value sub-block's range (about 4 sigma) steps 0.27 sigma, whose
    /// rounding error has RMS step / sqrt(12) = 0.08 sigma; the 6-bit sub-block scales and mins add
    /// a little (ggml's own reference lands at 0.071 on average, 0.086 at worst over 400 blocks).
    const Q4_K_GAUSSIAN_RMS: f32 = 0.1;

    #[test]
    fn the_packed_scales_unpack_as_ggml_reads_them() {
        // Sub-block j's scale is 2^(j-4) over the levels -8..7: exact on a 15-step grid, so the
        // scales are 63 * 2^(j-7) rounded half to even (0, 1, 2, 4, 8, 16, 32, 63) and the mins
        // the same; 6-bit values above 15 put their top bits in bytes 0-7's top two bits.
        let x: [f32; BLOCK_LEN] = std::array::from_fn(|i| ((i % 16) as f32 - 8.0) * 2f32.powi(i as i32 / 32 - 4));
        let b = quantize_block(&x);
        assert_eq!(hex(&b[..16]), "1030103c004182c4004182c4880000ff");
        let got: Vec<(u8, u8)> = (0..8).map(|j| scale_min(j, &b[4..16])).collect();
        assert_eq!(got, [(0, 0), (1, 1), (2, 2), (4, 4), (8, 8), (16, 16), (32, 32), (63, 63)]);
        // Sub-block 0 gets scale 0, so ggml keeps make_qkx2_quants' levels 0..15 there.
        assert_eq!(hex(&b[16..32]), "00112233445566778899aabbccddeeff");
        let mut out = [f32::NAN; BLOCK_LEN];
        dequantize_block(&b, &mut out);
        assert_eq!(out[..32], [0.0; 32]);
        let d = half::f16::from_le_bytes([b[0], b[1]]).to_f32();
        let dmin = half::f16::from_le_bytes([b[2], b[3]]).to_f32();
        assert_eq!(out[255], d * 63.0 * 15.0 - dmin * 63.0);
    }

    #[test]
    fn a_block_quantizes_to_ggml_reference_bytes() {
        // quantize_row_q4_K_ref's bytes for this input (ggml's C built without FP contraction).
        let x: [f32; BLOCK_LEN] = std::array::from_fn(|i| ((i * 37) % 256) as f32 / 64.0 - 2.0);
        let want = "9c1c1c28f4f4fff5fef7fffb44df9423a0c2f5072a5c7fa0c3f5083a5d8fa0d3f5083a5d8fa1d3f5183a6d8fa1d3f618e4\
                    06285a7caec2e406385a7caec2f406385a8caec2f406385a8ca0d2f416386a274a6c8fa0c2e5274a6c8fa0c305284a6c8f\
                    a0c305284a6d8fa1c305284a6d8f5c7fa0c2f5073a5c8fa0d3f5083a5c8fa0d3f5083a5d8fa1d3f5183a6d8fb1d3";
        assert_eq!(hex(&quantize_block(&x)), want);
    }

    #[test]
    fn gaussian_blocks_round_trip_within_the_grid_error() {
        let x = gaussian(64 * BLOCK_LEN, 0x9e37_79b9_7f4a_7c15);
        let mut y = vec![0f32; x.len()];
        for (xs, ys) in x.as_chunks::<BLOCK_LEN>().0.iter().zip(y.as_chunks_mut::<BLOCK_LEN>().0) {
            dequantize_block(&quantize_block(xs), ys);
        }
        let worst = worst_relative_rms(&x, &y, BLOCK_LEN);
        assert!(worst < Q4_K_GAUSSIAN_RMS, "worst block's relative RMS error {worst}");
    }
}

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
//! The eight sub-blocks' searches run side by side, one lane each ([`super::lanes`]), every lane
//! in ggml's order; the tests hold the bytes to the one-sub-block-at-a-time port (`reference`).

use super::lanes::{self, F32s};
use super::{f16_at, f16_le, f16_round, nearest_int};

pub(super) const BLOCK_LEN: usize = 256;
pub(super) const BLOCK_BYTES: usize = 144;
/// Values per sub-block (one 6-bit scale and min).
pub(super) const SUB: usize = 32;

/// ggml's `get_scale_min_k4`: sub-block `j`'s 6-bit scale and min from the 12 packed bytes.
pub(super) fn scale_min(j: usize, q: &[u8]) -> (u8, u8) {
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

/// Sub-blocks per block: the lanes [`sub_block_grids`] searches side by side.
const LANES: usize = BLOCK_LEN / SUB;
/// One f32 per sub-block, operated on side by side.
type Lanes = F32s<LANES>;

// 256 finite values as one block (`quantize_row_q4_K_ref`), AVX2 where the CPU has it.
lanes::quantize_block_with_avx2!(quantize_block_portable);

/// `quantize_row_q4_K_ref` for one block: [`sub_block_grids`] for the eight sub-blocks' grids, then
/// ggml's packing of the scales and its final levels.
#[inline(always)]
fn quantize_block_portable(x: &[f32; BLOCK_LEN]) -> [u8; BLOCK_BYTES] {
    let (subs, _) = x.as_chunks::<SUB>();
    let xt: [Lanes; SUB] = lanes::transposed(x);
    let grids = sub_block_grids(&xt);
    let (scales, mins) = (grids.scale, grids.neg_min);
    let (mut max_scale, mut max_min) = (0f32, 0f32);
    for j in 0..LANES {
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
    for j in 0..LANES {
        // ggml stores nearest_int's int in a uint8_t, then caps it at 63.
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        pack_scale_min(packed, j, ls, lm);
    }
    block[..2].copy_from_slice(&f16_le(max_scale / 63.0));
    block[2..4].copy_from_slice(&f16_le(max_min / 63.0));

    let (d_all, dmin_all) = (f16_round(max_scale / 63.0), f16_round(max_min / 63.0));
    let mut levels = [[0u8; SUB]; LANES];
    for (j, (ls, xs)) in levels.iter_mut().zip(subs).enumerate() {
        let (sc, m) = scale_min(j, &block[4..16]);
        let d = d_all * f32::from(sc);
        if d == 0.0 {
            // ggml keeps make_qkx2_quants' levels where the sub-block's scale rounds to zero.
            let (iscale, min) = (grids.level_iscale[j], grids.level_min[j]);
            for (q, &v) in ls.iter_mut().zip(xs) {
                *q = grid_level(iscale, v, min) as u8;
            }
            continue;
        }
        let dm = dmin_all * f32::from(m);
        for (q, &v) in ls.iter_mut().zip(xs) {
            *q = nearest_int((v + dm) / d).clamp(0, 15) as u8;
        }
    }
    for (pair, qs) in block[16..].as_chunks_mut::<SUB>().0.iter_mut().enumerate() {
        let (lo, hi) = (&levels[2 * pair], &levels[2 * pair + 1]);
        for l in 0..SUB {
            qs[l] = lo[l] | (hi[l] << 4);
        }
    }
    block
}

/// `make_qkx2_quants`' `nmax` as `quantize_row_q4_K_ref` calls it: levels 0..=15.
const NMAX: i32 = 15;

/// `make_qkx2_quants`' level of `v` at inverse scale `iscale` above `min`.
#[inline(always)]
fn grid_level(iscale: f32, v: f32, min: f32) -> i32 {
    nearest_int(iscale * (v - min)).clamp(0, NMAX)
}

/// What [`sub_block_grids`] finds for each sub-block.
struct Grids {
    /// `make_qkx2_quants`' scale.
    scale: [f32; LANES],
    /// Its negated min (its `the_min`, which `quantize_row_q4_K_ref` keeps).
    neg_min: [f32; LANES],
    /// The inverse scale and min the kept levels were rounded with (`grid_level`).
    level_iscale: [f32; LANES],
    level_min: [f32; LANES],
}

/// `quantize_row_q4_K_ref`'s weights and `make_qkx2_quants(15, x, weights, L, &the_min, Laux, -1,
/// 0.1, 20, false)` for the eight sub-blocks at once: `xt[l]` holds value `l` of each sub-block.
/// Each lane runs ggml's operations on its own sub-block in ggml's order (every sum is sequential
/// over the 32 values, as in C), so each lane's results are the scalar port's bit for bit; ggml's
/// branches are per-lane selects. The levels are not kept, only the grid they were rounded on.
#[inline(always)]
fn sub_block_grids(xt: &[Lanes; SUB]) -> Grids {
    const RMIN: f32 = -1.0;
    const RDELTA: f32 = 0.1;
    const NSTEP: i32 = 20;
    let zero = Lanes::splat(0.0);
    let nmax = NMAX as f32;
    let level = |iscale: Lanes, x: Lanes, min: Lanes| (iscale * (x - min)).nearest_int_clamped(0, NMAX);
    let mut sum_x2 = zero;
    for &x in xt {
        sum_x2 = sum_x2 + x * x;
    }
    let av_x = (sum_x2 / Lanes::splat(32.0)).sqrt();
    let w: [Lanes; SUB] = std::array::from_fn(|l| av_x + xt[l].abs());

    let (mut min, mut max) = (xt[0], xt[0]);
    let mut sum_w = w[0];
    let mut sum_x = w[0] * xt[0];
    for l in 1..SUB {
        let x = xt[l];
        min = x.lt(min).select(x, min);
        max = x.gt(max).select(x, max);
        sum_w = sum_w + w[l];
        sum_x = sum_x + w[l] * x;
    }
    min = min.gt(zero).select(zero, min);
    // A flat sub-block (max == min) gets scale 0 and levels 0; its lane computes garbage that is
    // never selected.
    let flat = max.eq(min);

    let mut iscale = Lanes::splat(nmax) / (max - min);
    let mut scale = Lanes::splat(1.0) / iscale;
    let mut best_error = zero;
    for (&x, &w) in xt.iter().zip(&w) {
        let diff = scale * level(iscale, x, min) + min - x;
        best_error = best_error + w * (diff * diff);
    }
    let (mut level_iscale, mut level_min) = (iscale, min);
    let mut aux = [zero; SUB];
    for is in 0..=NSTEP {
        iscale = Lanes::splat(RMIN + RDELTA * is as f32 + nmax) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (zero, zero, zero);
        for l in 0..SUB {
            let level = level(iscale, xt[l], min);
            aux[l] = level;
            // w * l * l and w * l * x, as ggml's C groups them.
            let wl = w[l] * level;
            sum_l = sum_l + wl;
            sum_l2 = sum_l2 + wl * level;
            sum_xl = sum_xl + wl * xt[l];
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        let this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
        let this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
        let clamped = this_min.gt(zero);
        let this_scale = clamped.select(sum_xl / sum_l2, this_scale);
        let this_min = clamped.select(zero, this_min);
        let mut cur_error = zero;
        for ((&x, &w), &l) in xt.iter().zip(&w).zip(&aux) {
            let diff = this_scale * l + this_min - x;
            cur_error = cur_error + w * (diff * diff);
        }
        let better = det.gt(zero).and(cur_error.lt(best_error)).and(flat.not());
        level_iscale = better.select(iscale, level_iscale);
        level_min = better.select(min, level_min);
        best_error = better.select(cur_error, best_error);
        scale = better.select(this_scale, scale);
        min = better.select(this_min, min);
    }
    Grids {
        scale: flat.select(zero, scale).0,
        neg_min: (zero - min).0,
        level_iscale: flat.select(zero, level_iscale).0,
        level_min: level_min.0,
    }
}

/// Sub-block `j`'s 6-bit scale `ls` and min `lm` into the 12 packed bytes of a Q4_K or Q5_K
/// super-block (ggml's `quantize_row_q4_K_ref` and `quantize_row_q5_K_ref` pack them alike).
pub(super) fn pack_scale_min(packed: &mut [u8], j: usize, ls: u8, lm: u8) {
    if j < 4 {
        packed[j] = ls;
        packed[j + 4] = lm;
    } else {
        packed[j + 4] = (ls & 0x0f) | ((lm & 0x0f) << 4);
        packed[j - 4] |= (ls >> 4) << 6;
        packed[j] |= (lm >> 4) << 6;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{gaussian, hex, reference, worst_relative_rms};

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

    /// Blocks compared with the scalar port (the test profile is optimized, so this takes a second).
    const REFERENCE_BLOCKS: usize = 40_000;

    #[test]
    fn blocks_quantize_to_the_scalar_ports_bytes() {
        for (i, (kind, x)) in reference::awkward_blocks(REFERENCE_BLOCKS, 0x5851_f42d_4c95_7f2d).iter().enumerate() {
            let want = reference::q4_k::quantize_block(x);
            assert_eq!(hex(&quantize_block(x)), hex(&want), "block {i} ({kind}): {x:?}");
            if i % 8 == 0 {
                assert_eq!(hex(&quantize_block_portable(x)), hex(&want), "portable path, block {i} ({kind}): {x:?}");
            }
        }
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

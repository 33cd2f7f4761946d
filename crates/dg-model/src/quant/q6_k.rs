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
//! The sixteen sub-blocks' searches run side by side, one lane each ([`super::lanes`]), every lane
//! in ggml's order; the tests hold the bytes to the one-sub-block-at-a-time port (`reference`).

use super::lanes::{self, F32s};
use super::{f16_at, f16_le, f16_round, nearest_int};

pub(super) const BLOCK_LEN: usize = 256;
pub(super) const BLOCK_BYTES: usize = 210;
/// Values per sub-block (one 8-bit scale).
pub(super) const SUB: usize = 16;
/// ggml's `GROUP_MAX_EPS`: below this a group counts as all zero.
pub(super) const GROUP_MAX_EPS: f32 = 1e-15;

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

/// Sub-blocks per block: the lanes [`sub_block_scales`] searches side by side.
const LANES: usize = BLOCK_LEN / SUB;
/// One f32 per sub-block, operated on side by side.
type Lanes = F32s<LANES>;

// 256 finite values as one block (`quantize_row_q6_K_ref`), AVX2 where the CPU has it.
lanes::quantize_block_with_avx2!(quantize_block_portable);

/// `quantize_row_q6_K_ref` for one block: [`sub_block_scales`] for the sixteen sub-blocks'
/// scales, then ggml's 8-bit scales and its final levels.
#[inline(always)]
fn quantize_block_portable(x: &[f32; BLOCK_LEN]) -> [u8; BLOCK_BYTES] {
    let (subs, _) = x.as_chunks::<SUB>();
    let xt: [Lanes; SUB] = lanes::transposed(x);
    let found = sub_block_scales(&xt);
    let scales = found.scale;
    let (mut max_scale, mut max_abs_scale) = (0f32, 0f32);
    for &scale in &scales {
        if scale.abs() > max_abs_scale {
            max_abs_scale = scale.abs();
            max_scale = scale;
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
    let mut levels = [[0u8; SUB]; LANES];
    for (j, (ls, xs)) in levels.iter_mut().zip(subs).enumerate() {
        let d = d_all * f32::from(block[192 + j] as i8);
        if d == 0.0 {
            // ggml keeps make_qx_quants' levels where the sub-block's scale rounds to zero (all
            // zeros for a sub-block below GROUP_MAX_EPS).
            if !found.negligible[j] {
                let iscale = found.level_iscale[j];
                for (q, &v) in ls.iter_mut().zip(xs) {
                    *q = (nearest_int(iscale * v).clamp(-NMAX, NMAX - 1) + NMAX) as u8;
                }
            }
            continue;
        }
        for (q, &v) in ls.iter_mut().zip(xs) {
            *q = (nearest_int(v / d).clamp(-32, 31) + 32) as u8;
        }
    }
    let levels: &[u8; BLOCK_LEN] = levels.as_flattened().try_into().expect("16 sub-blocks of 16");
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

/// `make_qx_quants`' `nmax` as `quantize_row_q6_K_ref` calls it: levels -32..=31.
const NMAX: i32 = 32;

/// What [`sub_block_scales`] finds for each sub-block.
struct Scales {
    /// `make_qx_quants`' scale.
    scale: [f32; LANES],
    /// Whether the sub-block's largest magnitude is below `GROUP_MAX_EPS` (levels all 0).
    negligible: [bool; LANES],
    /// The inverse scale the kept levels were rounded with.
    level_iscale: [f32; LANES],
}

/// `make_qx_quants(16, 32, x, L, 1, NULL)` for the sixteen sub-blocks at once: `xt[l]` holds value
/// `l` of each sub-block. Each lane runs ggml's operations on its own sub-block in ggml's order
/// (every sum is sequential over the 16 values, as in C), so each lane's results are the scalar
/// port's bit for bit; ggml's branches are per-lane selects. The levels are not kept, only the
/// inverse scale they were rounded with.
#[inline(always)]
fn sub_block_scales(xt: &[Lanes; SUB]) -> Scales {
    let zero = Lanes::splat(0.0);
    let nmax = NMAX as f32;
    let (mut max, mut amax) = (zero, zero);
    for &x in xt {
        let bigger = x.abs().gt(amax);
        amax = bigger.select(x.abs(), amax);
        max = bigger.select(x, max);
    }
    let negligible = amax.lt(Lanes::splat(GROUP_MAX_EPS));
    // Each value weighs x * x; the sums take (x * x) * x and x * x as ggml's loop forms them.
    let wx: [Lanes; SUB] = std::array::from_fn(|l| xt[l] * xt[l] * xt[l]);
    let w: [Lanes; SUB] = std::array::from_fn(|l| xt[l] * xt[l]);
    let sums = |iscale: Lanes| {
        let (mut sumlx, mut suml2) = (zero, zero);
        for ((&x, &wx), &w) in xt.iter().zip(&wx).zip(&w) {
            let l = (iscale * x).nearest_int_clamped(-NMAX, NMAX - 1);
            sumlx = sumlx + wx * l;
            suml2 = suml2 + w * l * l;
        }
        (sumlx, suml2)
    };
    let mut level_iscale = Lanes::splat(-nmax) / max;
    let (sumlx, suml2) = sums(level_iscale);
    let mut scale = suml2.eq(zero).select(zero, sumlx / suml2);
    let mut best = scale * sumlx;
    for is in (-9..=9).filter(|&is| is != 0) {
        let iscale = Lanes::splat(-(nmax + 0.1 * is as f32)) / max;
        let (sumlx, suml2) = sums(iscale);
        let better = suml2.gt(zero).and((sumlx * sumlx).gt(best * suml2));
        level_iscale = better.select(iscale, level_iscale);
        scale = better.select(sumlx / suml2, scale);
        best = better.select(scale * sumlx, best);
    }
    Scales { scale: negligible.select(zero, scale).0, negligible: negligible.lanes(), level_iscale: level_iscale.0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{gaussian, hex, reference, worst_relative_rms};

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

    /// Blocks compared with the scalar port (the test profile is optimized, so this takes a second).
    const REFERENCE_BLOCKS: usize = 40_000;

    #[test]
    fn blocks_quantize_to_the_scalar_ports_bytes() {
        for (i, (kind, x)) in reference::awkward_blocks(REFERENCE_BLOCKS, 0x2f6b_9c3e_81d4_a557).iter().enumerate() {
            let want = reference::q6_k::quantize_block(x);
            assert_eq!(hex(&quantize_block(x)), hex(&want), "block {i} ({kind}): {x:?}");
            if i % 8 == 0 {
                assert_eq!(hex(&quantize_block_portable(x)), hex(&want), "portable path, block {i} ({kind}): {x:?}");
            }
        }
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

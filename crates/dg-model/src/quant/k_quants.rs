//! ggml's `Q2_K`, `Q3_K` and `Q5_K` (`block_q2_K`, `block_q3_K`, `block_q5_K` in
//! `ggml/src/ggml-common.h`): 256 values a block, in sub-blocks with their own scales under an f16
//! super scale. Each half of 128 values takes 32 bytes of 2-bit quants (`Q2_K`, `Q3_K`): value
//! `32 s + l` of the half in bits `2 s, 2 s + 1` of byte `l`.
//!
//! - `Q2_K` (84 bytes): 16 bytes of sub-block scale (low nibble) and min (high nibble) for 16
//!   values each, 64 bytes of quants, f16 `d` and `dmin`; value `d * sc * q - dmin * m`.
//! - `Q3_K` (110 bytes): 32 bytes of high bits `hmask` (value `32 b + l` in bit `b` of byte `l`), 64
//!   bytes of quants, 12 bytes of sixteen 6-bit scales (low nibbles in bytes 0..8, two high bits in
//!   bytes 8..12), an f16 `d`; value `d * (sc - 32) * (q - 4 * !h)`.
//! - `Q5_K` (176 bytes): `Q4_K`'s `d`, `dmin` and packed scales and mins, 32 bytes of fifth bits
//!   (value `32 j + l` in bit `j` of byte `l`), 128 bytes of nibbles as `Q4_K`'s; value
//!   `d * sc * q - dmin * m` with `q` in 0..32.
//!
//! Dequantization is ggml's `dequantize_row_q2_K`, `_q3_K`, `_q5_K` (as gguf-py's
//! `dequantize_blocks`), with the f32 operations in their order.

use super::f16_at;

pub(super) mod q2_k {
    use super::*;

    /// One block's 256 values.
    pub(in crate::quant) fn dequantize_block(block: &[u8; 84], out: &mut [f32; 256]) {
        let (d, dmin) = (f16_at(block, 80), f16_at(block, 82));
        let (scales, qs) = (&block[..16], &block[16..80]);
        for (group, out) in out.chunks_exact_mut(16).enumerate() {
            let sc = scales[group];
            let (dl, ml) = (d * f32::from(sc & 0x0f), dmin * f32::from(sc >> 4));
            let (half, shift, first) = (group / 8, 2 * ((group / 2) % 4), 16 * (group % 2));
            for (l, o) in out.iter_mut().enumerate() {
                let q = (qs[32 * half + first + l] >> shift) & 3;
                *o = dl * f32::from(q) - ml;
            }
        }
    }
}

pub(super) mod q3_k {
    use super::*;

    /// Sub-block `s`'s 6-bit scale, less 32.
    pub(in crate::quant) fn scale(s: usize, packed: &[u8]) -> i8 {
        let low = if s < 8 { packed[s] & 0x0f } else { packed[s - 8] >> 4 };
        let high = (packed[8 + s % 4] >> (2 * (s / 4))) & 3;
        (low | (high << 4)) as i8 - 32
    }

    /// One block's 256 values.
    pub(in crate::quant) fn dequantize_block(block: &[u8; 110], out: &mut [f32; 256]) {
        let d = f16_at(block, 108);
        let (hmask, qs, packed) = (&block[..32], &block[32..96], &block[96..108]);
        for (group, out) in out.chunks_exact_mut(16).enumerate() {
            let dl = d * f32::from(scale(group, packed));
            let (half, shift, first) = (group / 8, 2 * ((group / 2) % 4), 16 * (group % 2));
            let bit = group / 2;
            for (l, o) in out.iter_mut().enumerate() {
                let low = ((qs[32 * half + first + l] >> shift) & 3) as i8;
                let h = (hmask[first + l] >> bit) & 1;
                *o = dl * f32::from(low - if h == 0 { 4 } else { 0 });
            }
        }
    }
}

pub(super) mod q5_k {
    use super::*;
    use crate::quant::q4_k::scale_min;

    /// One block's 256 values.
    pub(in crate::quant) fn dequantize_block(block: &[u8; 176], out: &mut [f32; 256]) {
        let (d, dmin) = (f16_at(block, 0), f16_at(block, 2));
        let (packed, qh, qs) = (&block[4..16], &block[16..48], &block[48..]);
        for (j, out) in out.chunks_exact_mut(32).enumerate() {
            let (sc, m) = scale_min(j, packed);
            let (dl, ml) = (d * f32::from(sc), dmin * f32::from(m));
            for (l, o) in out.iter_mut().enumerate() {
                let low = (qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0x0f;
                let q = low | (((qh[l] >> j) & 1) << 4);
                *o = dl * f32::from(q) - ml;
            }
        }
    }
}

/// ggml's `make_q3_quants` with `do_rmse`: a symmetric `2 nmax`-level grid for `x` (levels
/// `l + nmax` into `levels`), refined by up to five passes of single-level moves that raise the
/// weighted fit (weights `x²`). Returns the scale.
fn make_q3_quants(nmax: i32, x: &[f32], levels: &mut [i8]) -> f32 {
    let (mut max, mut amax) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < super::q6_k::GROUP_MAX_EPS {
        levels.fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let (mut sumlx, mut suml2) = (0f32, 0f32);
    for (i, &v) in x.iter().enumerate() {
        let l = super::nearest_int(iscale * v).clamp(-nmax, nmax - 1);
        levels[i] = l as i8;
        let w = v * v;
        sumlx += w * v * l as f32;
        suml2 += w * (l * l) as f32;
    }
    for _ in 0..5 {
        let mut changed = 0;
        for (i, &v) in x.iter().enumerate() {
            let w = v * v;
            let li = f32::from(levels[i]);
            let mut slx = sumlx - w * v * li;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * li * li;
                let new_l = super::nearest_int(v * sl2 / slx).clamp(-nmax, nmax - 1);
                if new_l != i32::from(levels[i]) {
                    slx += w * v * new_l as f32;
                    sl2 += w * (new_l * new_l) as f32;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        levels[i] = new_l as i8;
                        sumlx = slx;
                        suml2 = sl2;
                        changed += 1;
                    }
                }
            }
        }
        if changed == 0 {
            break;
        }
    }
    for l in levels.iter_mut() {
        *l += nmax as i8;
    }
    if suml2 > 0.0 { sumlx / suml2 } else { 0.0 }
}

/// Two-bit levels packed as `Q2_K` and `Q3_K` store them: each half of 128 values in 32 bytes, value
/// `32 s + l` of the half in bits `2 s, 2 s + 1` of byte `l`.
fn pack_2bit(levels: &[u8; 256], qs: &mut [u8]) {
    for half in 0..2 {
        let (l, q) = (&levels[128 * half..], &mut qs[32 * half..32 * (half + 1)]);
        for j in 0..32 {
            q[j] = l[j] | (l[j + 32] << 2) | (l[j + 64] << 4) | (l[j + 96] << 6);
        }
    }
}

pub(super) mod q2_k_quantize {
    use crate::quant::qkx::make_qkx2_quants;
    use crate::quant::{f16_le, f16_round, nearest_int};

    /// 256 finite values as one block: ggml's `quantize_row_q2_K_ref`.
    pub(in crate::quant) fn quantize_block(x: &[f32; 256]) -> [u8; 84] {
        const Q4SCALE: f32 = 15.0;
        let mut levels = [0u8; 256];
        let (mut scales, mut mins) = ([0f32; 16], [0f32; 16]);
        let (mut max_scale, mut max_min) = (0f32, 0f32);
        for j in 0..16 {
            let xs = &x[16 * j..16 * (j + 1)];
            let weights: [f32; 16] = std::array::from_fn(|l| xs[l].abs());
            (scales[j], mins[j]) = make_qkx2_quants(3, xs, &weights, &mut levels[16 * j..16 * (j + 1)], -0.5, 0.1, 15, true);
            if scales[j] > max_scale {
                max_scale = scales[j];
            }
            if mins[j] > max_min {
                max_min = mins[j];
            }
        }
        let mut block = [0u8; 84];
        let (mut d, mut dmin) = (0f32, 0f32);
        if max_scale > 0.0 {
            let iscale = Q4SCALE / max_scale;
            for j in 0..16 {
                block[j] = nearest_int(iscale * scales[j]) as u8;
            }
            d = max_scale / Q4SCALE;
        }
        if max_min > 0.0 {
            let iscale = Q4SCALE / max_min;
            for j in 0..16 {
                block[j] |= (nearest_int(iscale * mins[j]) << 4) as u8;
            }
            dmin = max_min / Q4SCALE;
        }
        block[80..82].copy_from_slice(&f16_le(d));
        block[82..84].copy_from_slice(&f16_le(dmin));
        let (d, dmin) = (f16_round(d), f16_round(dmin));
        let packed: [u8; 16] = block[..16].try_into().expect("16 scale bytes");
        for (j, sc) in packed.into_iter().enumerate() {
            let dl = d * f32::from(sc & 0x0f);
            if dl == 0.0 {
                continue;
            }
            let dm = dmin * f32::from(sc >> 4);
            for i in 16 * j..16 * (j + 1) {
                levels[i] = nearest_int((x[i] + dm) / dl).clamp(0, 3) as u8;
            }
        }
        super::pack_2bit(&levels, &mut block[16..80]);
        block
    }
}

pub(super) mod q3_k_quantize {
    use crate::quant::{f16_le, nearest_int};

    /// 256 finite values as one block: ggml's `quantize_row_q3_K_ref`.
    pub(in crate::quant) fn quantize_block(x: &[f32; 256]) -> [u8; 110] {
        let mut signed = [0i8; 256];
        let mut scales = [0f32; 16];
        let (mut max_scale, mut amax) = (0f32, 0f32);
        for j in 0..16 {
            scales[j] = super::make_q3_quants(4, &x[16 * j..16 * (j + 1)], &mut signed[16 * j..16 * (j + 1)]);
            if scales[j].abs() > amax {
                amax = scales[j].abs();
                max_scale = scales[j];
            }
        }
        let mut block = [0u8; 110];
        let packed = 96..108;
        if max_scale != 0.0 {
            let iscale = -32.0 / max_scale;
            for j in 0..16 {
                // ggml keeps nearest_int's int in an int8_t before clamping it.
                let l = (nearest_int(iscale * scales[j]) as i8).clamp(-32, 31) + 32;
                let l = l as u8;
                if j < 8 {
                    block[96 + j] = l & 0x0f;
                } else {
                    block[96 + j - 8] |= (l & 0x0f) << 4;
                }
                block[96 + 8 + j % 4] |= (l >> 4) << (2 * (j / 4));
            }
            block[108..110].copy_from_slice(&f16_le(1.0 / iscale));
        } else {
            block[108..110].copy_from_slice(&f16_le(0.0));
        }
        let d_all = crate::quant::f16_at(&block, 108);
        let mut levels = [0u8; 256];
        for (i, l) in levels.iter_mut().enumerate() {
            *l = signed[i] as u8;
        }
        for j in 0..16 {
            let d = d_all * f32::from(super::q3_k::scale(j, &block[packed.clone()]));
            if d == 0.0 {
                continue;
            }
            for i in 16 * j..16 * (j + 1) {
                levels[i] = (nearest_int(x[i] / d).clamp(-4, 3) + 4) as u8;
            }
        }
        for (j, l) in levels.iter_mut().enumerate() {
            if *l > 3 {
                block[j % 32] |= 1 << (j / 32);
                *l -= 4;
            }
        }
        super::pack_2bit(&levels, &mut block[32..96]);
        block
    }
}

pub(super) mod q5_k_quantize {
    use crate::quant::q4_k::scale_min;
    use crate::quant::qkx::make_qkx2_quants;
    use crate::quant::{f16_le, f16_round, nearest_int};

    /// 256 finite values as one block: ggml's `quantize_row_q5_K_ref`.
    pub(in crate::quant) fn quantize_block(x: &[f32; 256]) -> [u8; 176] {
        let mut levels = [0u8; 256];
        let (mut scales, mut mins) = ([0f32; 8], [0f32; 8]);
        let (mut max_scale, mut max_min) = (0f32, 0f32);
        for j in 0..8 {
            let xs = &x[32 * j..32 * (j + 1)];
            let mut sum_x2 = 0f32;
            for &v in xs {
                sum_x2 += v * v;
            }
            let av_x = (sum_x2 / 32.0).sqrt();
            let weights: [f32; 32] = std::array::from_fn(|l| av_x + xs[l].abs());
            (scales[j], mins[j]) = make_qkx2_quants(31, xs, &weights, &mut levels[32 * j..32 * (j + 1)], -0.5, 0.1, 15, false);
            if scales[j] > max_scale {
                max_scale = scales[j];
            }
            if mins[j] > max_min {
                max_min = mins[j];
            }
        }
        let mut block = [0u8; 176];
        let inv_scale = if max_scale > 0.0 { 63.0 / max_scale } else { 0.0 };
        let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
        let packed = &mut block[4..16];
        for j in 0..8 {
            // ggml stores nearest_int's int in a uint8_t, then caps it at 63.
            let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
            let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
            crate::quant::q4_k::pack_scale_min(packed, j, ls, lm);
        }
        block[..2].copy_from_slice(&f16_le(max_scale / 63.0));
        block[2..4].copy_from_slice(&f16_le(max_min / 63.0));
        let (d_all, dmin_all) = (f16_round(max_scale / 63.0), f16_round(max_min / 63.0));
        for j in 0..8 {
            let (sc, m) = scale_min(j, &block[4..16]);
            let d = d_all * f32::from(sc);
            if d == 0.0 {
                continue;
            }
            let dm = dmin_all * f32::from(m);
            for i in 32 * j..32 * (j + 1) {
                levels[i] = nearest_int((x[i] + dm) / d).clamp(0, 31) as u8;
            }
        }
        for n in 0..4 {
            for j in 0..32 {
                let (mut l1, mut l2) = (levels[64 * n + j], levels[64 * n + j + 32]);
                if l1 > 15 {
                    l1 -= 16;
                    block[16 + j] |= 1 << (2 * n);
                }
                if l2 > 15 {
                    l2 -= 16;
                    block[16 + j] |= 2 << (2 * n);
                }
                block[48 + 32 * n + j] = l1 | (l2 << 4);
            }
        }
        block
    }
}

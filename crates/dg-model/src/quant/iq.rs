//! ggml's i-quants (`block_iq2_xxs` ... `block_iq4_xs` in `ggml/src/ggml-common.h`): 256 values a
//! block (32 for `IQ4_NL`) under an f16 super scale `d`, in sub-blocks of 32 with their own 4-bit
//! (3-bit for `IQ1_*`, 6-bit for `IQ4_XS`) scales. The 2- and 3-bit formats store indices into
//! fixed grids of 8 (or 4) magnitudes ([`super::iq_grids`]) and sign bits, either seven per 8
//! values with the eighth their parity (`KSIGNS_IQ2XS`) or all eight; the 1-bit formats index a
//! grid of -1, 0, 1 and add a delta of ±1/8; the 4-bit formats index 16 non-linear levels.
//!
//! Dequantization only: ggml's `dequantize_row_iq*` (as gguf-py's `dequantize_blocks`), with the f32
//! operations in their order: `db * grid * sign` is `(db * grid) * ±1.0`, [`signed`]'s product.

use super::f16_at;
use super::iq_grids::{IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS, KVALUES_IQ4NL};

/// `p * -1.0` (for `negative`) or `p * 1.0`, as the CPU multiplies: a NaN keeps its sign (a compiler
/// may turn a product by -1 into a negation, which flips it).
fn signed(p: f32, negative: bool) -> f32 {
    if negative && !p.is_nan() { -p } else { p }
}

/// Byte `j` of a grid entry.
fn byte(entry: u64, j: usize) -> u8 {
    (entry >> (8 * j)) as u8
}

/// The little-endian u16 at `bytes[at..at + 2]`.
fn u16_at(bytes: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([bytes[at], bytes[at + 1]])
}

/// The little-endian u32 at `bytes[at..at + 4]`.
fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

/// 8 values of an 8-wide grid entry scaled by `db`, sign bit `j` of `signs` negating value `j`.
fn grid8(out: &mut [f32], db: f32, entry: u64, signs: u8) {
    for (j, o) in out[..8].iter_mut().enumerate() {
        *o = signed(db * f32::from(byte(entry, j)), signs >> j & 1 != 0);
    }
}

/// `IQ2_XXS` (66 bytes): `d`, then per sub-block two little-endian u32: four grid indices (bytes of
/// the first), and four 7-bit sign indices and a 4-bit scale (the second, scale in its top bits).
pub(super) mod iq2_xxs {
    use super::*;

    pub(in crate::quant) fn dequantize_block(block: &[u8; 66], out: &mut [f32; 256]) {
        let d = f16_at(block, 0);
        for (ib, out) in out.chunks_exact_mut(32).enumerate() {
            let (aux0, aux1) = (u32_at(block, 2 + 8 * ib), u32_at(block, 6 + 8 * ib));
            let db = d * (0.5 + (aux1 >> 28) as f32) * 0.25;
            for (l, out) in out.chunks_exact_mut(8).enumerate() {
                let signs = KSIGNS_IQ2XS[((aux1 >> (7 * l)) & 127) as usize];
                grid8(out, db, IQ2XXS_GRID[((aux0 >> (8 * l)) & 0xff) as usize], signs);
            }
        }
    }
}

/// `IQ2_XS` (74 bytes): `d`, 32 little-endian u16 (a 9-bit grid index and a 7-bit sign index per 8
/// values), 8 bytes of two 4-bit scales per sub-block (16 values each).
pub(super) mod iq2_xs {
    use super::*;

    pub(in crate::quant) fn dequantize_block(block: &[u8; 74], out: &mut [f32; 256]) {
        let d = f16_at(block, 0);
        for (k, out) in out.chunks_exact_mut(8).enumerate() {
            let scale = (block[66 + k / 4] >> (4 * ((k / 2) % 2))) & 0x0f;
            let db = d * (0.5 + f32::from(scale)) * 0.25;
            let q = u16_at(block, 2 + 2 * k);
            grid8(out, db, IQ2XS_GRID[usize::from(q & 511)], KSIGNS_IQ2XS[usize::from(q >> 9)]);
        }
    }
}

/// `IQ2_S` (82 bytes): `d`, 32 grid indices' low bytes, 32 bytes of sign bits (one per value), 8
/// bytes of the indices' two high bits, 8 bytes of two 4-bit scales per sub-block.
pub(super) mod iq2_s {
    use super::*;

    pub(in crate::quant) fn dequantize_block(block: &[u8; 82], out: &mut [f32; 256]) {
        let d = f16_at(block, 0);
        for (k, out) in out.chunks_exact_mut(8).enumerate() {
            let scale = (block[74 + k / 4] >> (4 * ((k / 2) % 2))) & 0x0f;
            let db = d * (0.5 + f32::from(scale)) * 0.25;
            let high = (block[66 + k / 4] >> (2 * (k % 4))) & 3;
            let index = usize::from(block[2 + k]) | usize::from(high) << 8;
            grid8(out, db, IQ2S_GRID[index], block[34 + k]);
        }
    }
}

/// `IQ3_XXS` (98 bytes): `d`, 64 grid indices (4 values each), then per sub-block a little-endian
/// u32 of four 7-bit sign indices and a 4-bit scale (top bits).
pub(super) mod iq3_xxs {
    use super::*;

    pub(in crate::quant) fn dequantize_block(block: &[u8; 98], out: &mut [f32; 256]) {
        let d = f16_at(block, 0);
        for (ib, out) in out.chunks_exact_mut(32).enumerate() {
            let aux = u32_at(block, 66 + 4 * ib);
            let db = d * (0.5 + (aux >> 28) as f32) * 0.5;
            for (l, out) in out.chunks_exact_mut(8).enumerate() {
                let signs = KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize];
                let (g1, g2) = (IQ3XXS_GRID[usize::from(block[2 + 8 * ib + 2 * l])], IQ3XXS_GRID[usize::from(block[3 + 8 * ib + 2 * l])]);
                let entry = u64::from(g1) | u64::from(g2) << 32;
                grid8(out, db, entry, signs);
            }
        }
    }
}

/// `IQ3_S` (110 bytes): `d`, 64 grid indices' low bytes, 8 bytes of their ninth bits, 32 bytes of
/// sign bits (one per value), 4 bytes of two 4-bit scales (odd: `1 + 2 s`) per pair of sub-blocks.
pub(super) mod iq3_s {
    use super::*;

    pub(in crate::quant) fn dequantize_block(block: &[u8; 110], out: &mut [f32; 256]) {
        let d = f16_at(block, 0);
        for (ib, out) in out.chunks_exact_mut(32).enumerate() {
            let scale = (block[106 + ib / 2] >> (4 * (ib % 2))) & 0x0f;
            let db = d * f32::from(1 + 2 * scale);
            for (l, out) in out.chunks_exact_mut(8).enumerate() {
                let index = |t: usize| {
                    let k = 8 * ib + 2 * l + t;
                    usize::from(block[2 + k]) | usize::from((block[66 + k / 8] >> (k % 8)) & 1) << 8
                };
                let entry = u64::from(IQ3S_GRID[index(0)]) | u64::from(IQ3S_GRID[index(1)]) << 32;
                grid8(out, db, entry, block[74 + 4 * ib + l]);
            }
        }
    }
}

/// `IQ1_S` (50 bytes): `d`, 32 grid indices' low bytes, then per sub-block a little-endian u16: the
/// indices' three high bits (four times), a 3-bit scale (odd: `2 s + 1`) and the delta's sign (top bit).
pub(super) mod iq1_s {
    use super::*;
    use crate::quant::iq::iq1::{DELTA, grid_plus_delta};

    pub(in crate::quant) fn dequantize_block(block: &[u8; 50], out: &mut [f32; 256]) {
        let d = f16_at(block, 0);
        for (ib, out) in out.chunks_exact_mut(32).enumerate() {
            let qh = u16_at(block, 34 + 2 * ib);
            let dl = d * f32::from(2 * ((qh >> 12) & 7) + 1);
            let delta = if qh & 0x8000 != 0 { -DELTA } else { DELTA };
            for (l, out) in out.chunks_exact_mut(8).enumerate() {
                let index = usize::from(block[2 + 4 * ib + l]) | usize::from((qh >> (3 * l)) & 7) << 8;
                grid_plus_delta(out, dl, index, delta);
            }
        }
    }
}

/// `IQ1_M` (56 bytes): 32 grid indices' low bytes, 16 bytes of a nibble per 8 values (the index's
/// three high bits, the delta's sign), 4 little-endian u16 of 3-bit scales (odd: `2 s + 1`, one per
/// 16 values) whose top nibbles together are the f16 `d`.
pub(super) mod iq1_m {
    use super::*;
    use crate::quant::iq::iq1::{DELTA, grid_plus_delta};

    pub(in crate::quant) fn dequantize_block(block: &[u8; 56], out: &mut [f32; 256]) {
        let sc: [u16; 4] = std::array::from_fn(|k| u16_at(block, 48 + 2 * k));
        let d_bits = (sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000);
        let d = half::f16::from_bits(d_bits).to_f32();
        for (k, out) in out.chunks_exact_mut(8).enumerate() {
            let s = k / 2; // the 16 values' scale
            let dl = d * f32::from(2 * ((sc[s / 4] >> (3 * (s % 4))) & 7) + 1);
            let nibble = (block[32 + k / 2] >> (4 * (k % 2))) & 0x0f;
            let index = usize::from(block[k]) | usize::from(nibble & 7) << 8;
            grid_plus_delta(out, dl, index, if nibble & 8 != 0 { -DELTA } else { DELTA });
        }
    }
}

/// What `IQ1_S` and `IQ1_M` share.
mod iq1 {
    use super::*;

    /// ggml's `IQ1S_DELTA`.
    pub(super) const DELTA: f32 = 0.125;

    /// 8 values `dl * (grid + delta)` of `IQ1S_GRID[index]`.
    pub(super) fn grid_plus_delta(out: &mut [f32], dl: f32, index: usize, delta: f32) {
        let entry = IQ1S_GRID[index];
        for (j, o) in out[..8].iter_mut().enumerate() {
            *o = dl * (f32::from(byte(entry, j) as i8) + delta);
        }
    }
}

/// `IQ4_NL` (18 bytes, 32 values): an f16 `d`, 16 bytes of nibbles (value `j` low, `j + 16` high)
/// indexing `KVALUES_IQ4NL`; value `d * kvalue`.
pub(super) mod iq4_nl {
    use super::*;

    pub(in crate::quant) fn dequantize_block(block: &[u8; 18], out: &mut [f32; 32]) {
        let d = f16_at(block, 0);
        for (j, &q) in block[2..].iter().enumerate() {
            out[j] = d * f32::from(KVALUES_IQ4NL[usize::from(q & 0x0f)]);
            out[j + 16] = d * f32::from(KVALUES_IQ4NL[usize::from(q >> 4)]);
        }
    }
}

/// `IQ4_XS` (136 bytes): an f16 `d`, a little-endian u16 of the 8 sub-block scales' two high bits, 4
/// bytes of their low nibbles, 128 bytes of nibbles (16 per sub-block, as `IQ4_NL`'s); value
/// `d * (ls - 32) * kvalue`.
pub(super) mod iq4_xs {
    use super::*;

    pub(in crate::quant) fn dequantize_block(block: &[u8; 136], out: &mut [f32; 256]) {
        let d = f16_at(block, 0);
        let scales_h = u16_at(block, 2);
        for (ib, out) in out.chunks_exact_mut(32).enumerate() {
            let low = (block[4 + ib / 2] >> (4 * (ib % 2))) & 0x0f;
            let ls = i32::from(low) | (i32::from((scales_h >> (2 * ib)) & 3) << 4);
            let dl = d * (ls - 32) as f32;
            for (j, &q) in block[8 + 16 * ib..24 + 16 * ib].iter().enumerate() {
                out[j] = dl * f32::from(KVALUES_IQ4NL[usize::from(q & 0x0f)]);
                out[j + 16] = dl * f32::from(KVALUES_IQ4NL[usize::from(q >> 4)]);
            }
        }
    }
}

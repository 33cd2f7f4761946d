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
    fn scale(s: usize, packed: &[u8]) -> i8 {
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

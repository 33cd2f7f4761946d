//! ggml's first block formats besides `Q8_0` and `Q5_0` (`block_q4_0`, `block_q4_1`, `block_q5_1` in
//! `ggml/src/ggml-common.h`): 32 values a block, 16 bytes of nibbles (value `j` in the low nibble of
//! byte `j`, value `j + 16` in its high nibble) after an f16 scale `d` (and for the `_1` formats an
//! f16 minimum `m`); `Q5_1` adds the fifth bits as `Q5_0` does (a little-endian u32, bit `i` for
//! value `i`).
//!
//! - `Q4_0` (18 bytes): value `(q - 8) * d`.
//! - `Q4_1` (20 bytes): value `q * d + m`.
//! - `Q5_1` (24 bytes): value `q * d + m` with `q` in 0..32.
//!
//! Dequantization is ggml's `dequantize_row_q4_0`, `_q4_1`, `_q5_1` (as gguf-py's
//! `dequantize_blocks`), with the f32 operations in their order. `Q4_0` and `Q5_1` (the fallbacks
//! of the `q2_k`, `q3_k_m` schemes where a row is not whole super-blocks) quantize as gguf-py's
//! `quantize_blocks` do (its bytes are the oracle, as for `Q5_0`): `Q4_0` with `d = max / -8`
//! (`max` the first value of largest magnitude) and `q = min(15, trunc(x / d + 8.5))`, `Q5_1` with
//! `d = (max - min) / 31`, `m = min` and `q = min(31, trunc((x - min) / d + 0.5))`.

use super::{f16_at, f16_le, numpy_int_byte};

pub(super) mod q4_0 {
    use super::*;

    /// One block's 32 values.
    pub(in crate::quant) fn dequantize_block(block: &[u8; 18], out: &mut [f32; 32]) {
        let d = f16_at(block, 0);
        for (j, &q) in block[2..].iter().enumerate() {
            out[j] = (i32::from(q & 0x0f) - 8) as f32 * d;
            out[j + 16] = (i32::from(q >> 4) - 8) as f32 * d;
        }
    }

    /// 32 finite values as one block (gguf-py's `Q4_0.quantize_blocks`).
    pub(in crate::quant) fn quantize_block(x: &[f32; 32]) -> [u8; 18] {
        let mut max = x[0];
        for &v in &x[1..] {
            if v.abs() > max.abs() {
                max = v;
            }
        }
        let d = max / -8.0;
        let id = if d == 0.0 { 0.0 } else { 1.0 / d };
        let q: [u8; 32] = std::array::from_fn(|i| numpy_int_byte((x[i] * id + 8.5).trunc()).min(15));
        let mut block = [0u8; 18];
        block[..2].copy_from_slice(&f16_le(d));
        for j in 0..16 {
            block[2 + j] = q[j] | (q[j + 16] << 4);
        }
        block
    }
}

pub(super) mod q4_1 {
    use super::*;

    /// One block's 32 values.
    pub(in crate::quant) fn dequantize_block(block: &[u8; 20], out: &mut [f32; 32]) {
        let (d, m) = (f16_at(block, 0), f16_at(block, 2));
        for (j, &q) in block[4..].iter().enumerate() {
            out[j] = f32::from(q & 0x0f) * d + m;
            out[j + 16] = f32::from(q >> 4) * d + m;
        }
    }
}

pub(super) mod q5_1 {
    use super::*;

    /// One block's 32 values.
    pub(in crate::quant) fn dequantize_block(block: &[u8; 24], out: &mut [f32; 32]) {
        let (d, m) = (f16_at(block, 0), f16_at(block, 2));
        let qh = u32::from_le_bytes([block[4], block[5], block[6], block[7]]);
        let high = |i: usize| (((qh >> i) & 1) << 4) as u8;
        for (j, &q) in block[8..].iter().enumerate() {
            out[j] = f32::from((q & 0x0f) | high(j)) * d + m;
            out[j + 16] = f32::from((q >> 4) | high(j + 16)) * d + m;
        }
    }

    /// 32 finite values as one block (gguf-py's `Q5_1.quantize_blocks`).
    pub(in crate::quant) fn quantize_block(x: &[f32; 32]) -> [u8; 24] {
        let (mut max, mut min) = (x[0], x[0]);
        for &v in &x[1..] {
            if v > max {
                max = v;
            }
            if v < min {
                min = v;
            }
        }
        // numpy's vectorised max and min give +0 where the block holds both zeros (the vectors'
        // zero rows with one -0 show it); -0 only where every zero is -0.
        let has_plus_zero = x.iter().any(|&v| v == 0.0 && v.is_sign_positive());
        if has_plus_zero {
            (max, min) = (if max == 0.0 { 0.0 } else { max }, if min == 0.0 { 0.0 } else { min });
        }
        let d = (max - min) / 31.0;
        let id = if d == 0.0 { 0.0 } else { 1.0 / d };
        let q: [u8; 32] = std::array::from_fn(|i| numpy_int_byte(((x[i] - min) * id + 0.5).trunc()).min(31));
        let mut block = [0u8; 24];
        block[..2].copy_from_slice(&f16_le(d));
        block[2..4].copy_from_slice(&f16_le(min));
        let qh = q.iter().enumerate().fold(0u32, |qh, (i, &q)| qh | (u32::from(q >> 4) << i));
        block[4..8].copy_from_slice(&qh.to_le_bytes());
        for j in 0..16 {
            block[8 + j] = (q[j] & 0x0f) | (q[j + 16] << 4);
        }
        block
    }
}

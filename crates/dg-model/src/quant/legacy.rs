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
//! Dequantization only: ggml's `dequantize_row_q4_0`, `_q4_1`, `_q5_1` (as gguf-py's
//! `dequantize_blocks`), with the f32 operations in their order.

use super::f16_at;

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
}

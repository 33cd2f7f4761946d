//! ggml's `Q5_0` (`block_q5_0` in `ggml/src/ggml-common.h`): 32 values in 22 bytes, an f16 scale
//! `d`, the quants' fifth bits `qh` (a little-endian u32, bit `i` for value `i`) and 16 bytes of
//! nibbles `qs` (value `j` in the low nibble of byte `j`, value `j + 16` in its high nibble);
//! value `i` is `(q[i] - 16) * d` with `q` in 0..32.
//!
//! Dequantization is ggml's `dequantize_row_q5_0`. Quantization is gguf-py's
//! `Q5_0.quantize_blocks`, ggml's `quantize_row_q5_0_ref` but for two corners where gguf-py is the
//! oracle: `d = max / -16` with `max` the first value of largest magnitude (`argmax`), so a block of
//! zeros whose first value is `-0.0` stores `d = +0` where ggml's C (which starts from `max = 0`)
//! stores `-0`; and a block whose `1 / d` overflows stores gguf-py's x86-64 bytes (all quants 0).
//! Otherwise `q = min(31, trunc(x / d + 16.5))`, as both compute it.

use super::{f16_at, f16_le, numpy_int_byte};

const BLOCK_LEN: usize = 32;
const BLOCK_BYTES: usize = 22;

/// One block's 32 values.
pub(super) fn dequantize_block(block: &[u8; BLOCK_BYTES], out: &mut [f32; BLOCK_LEN]) {
    let d = f16_at(block, 0);
    let qh = u32::from_le_bytes([block[2], block[3], block[4], block[5]]);
    let high = |i: usize| (((qh >> i) & 1) << 4) as u8;
    for (j, &qs) in block[6..].iter().enumerate() {
        let q0 = (qs & 0x0f) | high(j);
        let q1 = (qs >> 4) | high(j + 16);
        out[j] = (i32::from(q0) - 16) as f32 * d;
        out[j + 16] = (i32::from(q1) - 16) as f32 * d;
    }
}

/// 32 finite values as one block.
pub(super) fn quantize_block(x: &[f32; BLOCK_LEN]) -> [u8; BLOCK_BYTES] {
    let mut max = x[0];
    for &v in &x[1..] {
        if v.abs() > max.abs() {
            max = v;
        }
    }
    let d = max / -16.0;
    let id = if d == 0.0 { 0.0 } else { 1.0 / d };
    let q: [u8; BLOCK_LEN] = std::array::from_fn(|i| numpy_int_byte((x[i] * id + 16.5).trunc()).min(31));
    let mut block = [0u8; BLOCK_BYTES];
    block[..2].copy_from_slice(&f16_le(d));
    let qh = q.iter().enumerate().fold(0u32, |qh, (i, &q)| qh | (u32::from(q >> 4) << i));
    block[2..6].copy_from_slice(&qh.to_le_bytes());
    for j in 0..BLOCK_LEN / 2 {
        block[6 + j] = (q[j] & 0x0f) | (q[j + 16] << 4);
    }
    block
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::hex;

    #[test]
    fn a_hand_made_block_dequantizes_with_its_fifth_bits() {
        let mut block = [0u8; BLOCK_BYTES];
        block[..2].copy_from_slice(&half::f16::from_f32(-0.25).to_le_bytes());
        // value 0: q = 0x1f (nibble 0xf, bit 0 set); value 16: q = 0x03 (high nibble, bit 16 clear);
        // value 31: q = 0x10 (nibble 0, bit 31 set); value 1: q = 0x00.
        block[2..6].copy_from_slice(&(1u32 | 1 << 31).to_le_bytes());
        block[6] = 0x3f;
        let mut out = [f32::NAN; BLOCK_LEN];
        dequantize_block(&block, &mut out);
        assert_eq!([out[0], out[1], out[16], out[31]], [-3.75, 4.0, 3.25, -0.0]);
    }

    #[test]
    fn a_ramp_quantizes_to_gguf_py_bytes() {
        // x = (i - 10) / 4: max = 5.25, d = -0.328125 (f16 0xb540); the bytes are gguf-py's.
        let x: [f32; BLOCK_LEN] = std::array::from_fn(|i| (i as f32 - 10.0) * 0.25);
        let b = quantize_block(&x);
        assert_eq!(hex(&b), "40b5ff070000b8b7a695858473625251403f2e2e1d0c");
        let mut out = [0f32; BLOCK_LEN];
        dequantize_block(&b, &mut out);
        assert_eq!([out[0], out[10], out[31]], [-2.625, -0.0, 5.25]);
    }

    #[test]
    fn zero_blocks_keep_the_sign_gguf_py_gives_their_scale() {
        let mut x = [0f32; BLOCK_LEN];
        assert_eq!(hex(&quantize_block(&x)), "0080ffffffff00000000000000000000000000000000");
        x[0] = -0.0;
        assert_eq!(hex(&quantize_block(&x)), "0000ffffffff00000000000000000000000000000000");
    }
}

//! ggml's `Q8_0` (`block_q8_0` in `ggml/src/ggml-common.h`): 32 values in 34 bytes, an f16 scale
//! `d` and 32 `int8_t` quants `qs`; value `i` is `qs[i] * d`.
//!
//! Dequantization is ggml's `dequantize_row_q8_0`. Quantization is gguf-py's
//! `Q8_0.quantize_blocks`, which is ggml's `quantize_row_q8_0_ref`: `d = max|x| / 127` and
//! `qs = round(x / d)` with ties away from zero (`roundf`, numpy's `np_roundf`). The two differ only
//! where ggml's C is undefined (a block whose `1 / d` overflows casts infinities to `int8_t`);
//! there the bytes are gguf-py's on x86-64 (all quants 0, under an f16 scale of 0).

use super::{f16_at, f16_le, numpy_int_byte};

const BLOCK_LEN: usize = 32;
const BLOCK_BYTES: usize = 34;

/// One block's 32 values.
pub(super) fn dequantize_block(block: &[u8; BLOCK_BYTES], out: &mut [f32; BLOCK_LEN]) {
    let d = f16_at(block, 0);
    for (o, &q) in out.iter_mut().zip(&block[2..]) {
        *o = f32::from(q as i8) * d;
    }
}

/// 32 finite values as one block.
pub(super) fn quantize_block(x: &[f32; BLOCK_LEN]) -> [u8; BLOCK_BYTES] {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d == 0.0 { 0.0 } else { 1.0 / d };
    let mut block = [0u8; BLOCK_BYTES];
    block[..2].copy_from_slice(&f16_le(d));
    for (q, &v) in block[2..].iter_mut().zip(x) {
        *q = numpy_int_byte((v * id).round());
    }
    block
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::hex;

    #[test]
    fn a_hand_made_block_dequantizes_to_q_times_d() {
        let mut block = [0u8; BLOCK_BYTES];
        block[..2].copy_from_slice(&half::f16::from_f32(0.5).to_le_bytes());
        block[2] = 127;
        block[3] = (-128i8) as u8;
        block[4] = (-3i8) as u8;
        block[33] = 1;
        let mut out = [f32::NAN; BLOCK_LEN];
        dequantize_block(&block, &mut out);
        assert_eq!(out[..3], [63.5, -64.0, -1.5]);
        assert_eq!(out[3..31], [0.0; 28]);
        assert_eq!(out[31], 0.5);
    }

    #[test]
    fn a_ramp_quantizes_to_gguf_py_bytes() {
        // x = (i - 10) / 4: d = 5.25 / 127 (f16 0x294b); -2.5 / d = -60.48 -> -60 (0xc4), and
        // 5.25 / d = 127. The bytes are gguf-py's `quantize(x, Q8_0)`.
        let x: [f32; BLOCK_LEN] = std::array::from_fn(|i| (i as f32 - 10.0) * 0.25);
        let want = "4b29c4cad0d6dce2e8eef4fa00060c12181e242a30363c43494f555b61676d73797f";
        assert_eq!(hex(&quantize_block(&x)), want);
    }

    #[test]
    fn ties_round_away_from_zero() {
        // max 127 makes d = 1 exactly, so x / d is x and 0.5, 2.5, -0.5 are ties.
        let mut x = [0f32; BLOCK_LEN];
        x[..4].copy_from_slice(&[127.0, 0.5, 2.5, -0.5]);
        let b = quantize_block(&x);
        assert_eq!(b[..2], half::f16::from_f32(1.0).to_le_bytes());
        assert_eq!(b[2..6], [127, 1, 3, 0xff]);
    }
}

//! ggml's FP4 formats (`block_mxfp4`, `block_nvfp4` in `ggml/src/ggml-common.h`): nibbles indexing
//! the E2M1 values doubled (`KVALUES_MXFP4`), under a scale that holds half the block's scale.
//!
//! - `MXFP4` (17 bytes, 32 values): an E8M0 exponent byte `e` (`ggml_e8m0_to_fp32_half`: 2^(e - 128)),
//!   16 bytes of nibbles (value `j` low, `j + 16` high).
//! - `NVFP4` (36 bytes, 64 values): four UE4M3 scale bytes (`ggml_ue4m3_to_fp32`, halved; the bytes
//!   0 and 0x7F read as 0, the top bit is ignored) for 16 values each, then 8 bytes of nibbles per
//!   16 values (value `j` low, `j + 8` high).
//!
//! Dequantization only: ggml's `dequantize_row_mxfp4` and `_nvfp4` (as gguf-py's
//! `dequantize_blocks`). Every scale and product is exact but where it overflows.

use super::iq_grids::KVALUES_MXFP4;

/// Nibble `q`'s level.
fn level(q: u8) -> f32 {
    f32::from(KVALUES_MXFP4[usize::from(q & 0x0f)])
}

pub(super) mod mxfp4 {
    use super::*;

    /// ggml's `ggml_e8m0_to_fp32_half`: 2^(e - 128), subnormal for `e` 0 and 1.
    pub(in crate::quant) fn e8m0_half(e: u8) -> f32 {
        f32::from_bits(if e < 2 { 0x0020_0000 << e } else { u32::from(e - 1) << 23 })
    }

    pub(in crate::quant) fn dequantize_block(block: &[u8; 17], out: &mut [f32; 32]) {
        let d = e8m0_half(block[0]);
        for (j, &q) in block[1..].iter().enumerate() {
            out[j] = level(q) * d;
            out[j + 16] = level(q >> 4) * d;
        }
    }
}

pub(super) mod nvfp4 {
    use super::*;

    /// ggml's `ggml_ue4m3_to_fp32`: the unsigned E4M3 byte `x` (bias 7) halved.
    pub(in crate::quant) fn ue4m3_half(x: u8) -> f32 {
        if x == 0 || x == 0x7f {
            return 0.0;
        }
        let (exp, man) = (i32::from((x >> 3) & 0x0f), f32::from(x & 7));
        let raw = if exp == 0 { man * (2f32).powi(-9) } else { (1.0 + man / 8.0) * (2f32).powi(exp - 7) };
        raw * 0.5
    }

    pub(in crate::quant) fn dequantize_block(block: &[u8; 36], out: &mut [f32; 64]) {
        for (s, out) in out.chunks_exact_mut(16).enumerate() {
            let d = ue4m3_half(block[s]);
            for (j, &q) in block[4 + 8 * s..12 + 8 * s].iter().enumerate() {
                out[j] = d * level(q);
                out[j + 8] = d * level(q >> 4);
            }
        }
    }
}

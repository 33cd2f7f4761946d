//! ggml's other k-quants (`block_q2_K`, `block_q3_K`, `block_q5_K` in `ggml/src/ggml-common.h`,
//! 256 values a super-block): the element loaders of [`super::WeightFormat::operand`], each
//! `dequantize_row_*` of `ggml/src/ggml-quants.c` for one value, in the order of operations of
//! gguf-py's `gguf/quants.py` (`Q2_K.dequantize_blocks` ...), which dg-model's host dequantization
//! matches bit for bit.

use super::QuantFormat;

/// The body of `load_NAME(i)` for `q` (see `QuantFormat::load_body`).
pub(super) fn load_body(q: QuantFormat) -> &'static str {
    match q {
        // 84 bytes: 16 scale bytes (low nibble the scale, high the min of 16 values), 64 bytes of
        // 2-bit quants (value e: bits 2·((e % 128) / 32) of byte 32·(e / 128) + e % 32), f16 d and
        // dmin; x = d·sc·q − dmin·m.
        QuantFormat::Q2_K => {
            "let at = (i / 256u) * 84u;
    let e = i % 256u;
    let sc = byte_NAME(at + e / 16u);
    let q = (byte_NAME(at + 16u + 32u * (e / 128u) + e % 32u) >> (2u * ((e % 128u) / 32u))) & 3u;
    let dl = f16_NAME(at + 80u) * f32(sc & 15u);
    let ml = f16_NAME(at + 82u) * f32(sc >> 4u);
    return dl * f32(q) - ml;"
        }
        // 110 bytes: 32 bytes of high bits hmask (value e: bit e / 32 of byte e % 32), 64 bytes of
        // 2-bit quants (as Q2_K's), 12 bytes of 6-bit scales (scale j: nibble j / 8 of byte j % 8,
        // and bits 2·(j / 4) of byte 8 + j % 4 above it), f16 d; x = d·(sc − 32)·(q − 4 when the
        // high bit is clear).
        QuantFormat::Q3_K => {
            "let at = (i / 256u) * 110u;
    let e = i % 256u;
    let j = e / 16u;
    let ls = (byte_NAME(at + 96u + j % 8u) >> (4u * (j / 8u))) & 15u;
    let hs = (byte_NAME(at + 104u + j % 4u) >> (2u * (j / 4u))) & 3u;
    let dl = f16_NAME(at + 108u) * f32(i32(ls | (hs << 4u)) - 32);
    let ql = (byte_NAME(at + 32u + 32u * (e / 128u) + e % 32u) >> (2u * ((e % 128u) / 32u))) & 3u;
    let hb = (byte_NAME(at + e % 32u) >> (e / 32u)) & 1u;
    return dl * f32(i32(ql) - 4 * i32(hb ^ 1u));"
        }
        // 176 bytes: f16 d and dmin, Q4_K's 12 bytes of 6-bit scales and mins, 32 bytes of high
        // bits qh (value e: bit e / 32 of byte e % 32), 128 bytes of nibbles (Q4_K's order);
        // x = d·sc·q − dmin·m per 32-value sub-block.
        QuantFormat::Q5_K => {
            "let at = (i / 256u) * 176u;
    let e = i % 256u;
    let j = e / 32u;
    let qs = byte_NAME(at + 48u + 32u * (e / 64u) + e % 32u);
    let low = select(qs & 15u, qs >> 4u, (j & 1u) != 0u);
    let q = low | (((byte_NAME(at + 16u + e % 32u) >> j) & 1u) << 4u);
    var sc: u32;
    var m: u32;
    if (j < 4u) {
        sc = byte_NAME(at + 4u + j) & 63u;
        m = byte_NAME(at + 8u + j) & 63u;
    } else {
        sc = (byte_NAME(at + 8u + j) & 15u) | ((byte_NAME(at + j) >> 6u) << 4u);
        m = (byte_NAME(at + 8u + j) >> 4u) | ((byte_NAME(at + 4u + j) >> 6u) << 4u);
    }
    let dl = f16_NAME(at) * f32(sc);
    let ml = f16_NAME(at + 2u) * f32(m);
    return dl * f32(q) - ml;"
        }
        _ => unreachable!("{} is not one of these k-quants", q.name()),
    }
}

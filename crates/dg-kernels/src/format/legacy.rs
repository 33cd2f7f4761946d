//! ggml's other 32-value formats (`block_q4_0`, `block_q4_1`, `block_q5_1` in
//! `ggml/src/ggml-common.h`): the element loaders of [`super::WeightFormat::operand`], each
//! `dequantize_row_*` of `ggml/src/ggml-quants.c` for one value, in the order of operations of
//! gguf-py's `gguf/quants.py` (`Q4_0.dequantize_blocks` ...), which dg-model's host dequantization
//! matches bit for bit.

use super::QuantFormat;

/// The body of `load_NAME(i)` for `q` (see `QuantFormat::load_body`).
pub(super) fn load_body(q: QuantFormat) -> &'static str {
    match q {
        // 18 bytes: f16 d, 16 bytes of nibbles (value e in nibble e / 16 of byte e % 16);
        // x = (q − 8)·d.
        QuantFormat::Q4_0 => {
            "let at = (i / 32u) * 18u;
    let e = i % 32u;
    let qs = byte_NAME(at + 2u + e % 16u);
    let q = select(qs & 15u, qs >> 4u, e >= 16u);
    return f16_NAME(at) * f32(i32(q) - 8);"
        }
        // 20 bytes: f16 d and m, 16 bytes of nibbles; x = d·q + m.
        QuantFormat::Q4_1 => {
            "let at = (i / 32u) * 20u;
    let e = i % 32u;
    let qs = byte_NAME(at + 4u + e % 16u);
    let q = select(qs & 15u, qs >> 4u, e >= 16u);
    return f16_NAME(at) * f32(q) + f16_NAME(at + 2u);"
        }
        // 24 bytes: f16 d and m, 32 high bits qh, 16 bytes of nibbles; x = d·q + m.
        QuantFormat::Q5_1 => {
            "let at = (i / 32u) * 24u;
    let e = i % 32u;
    let qs = byte_NAME(at + 8u + e % 16u);
    let low = select(qs & 15u, qs >> 4u, e >= 16u);
    let q = low | (((u32_NAME(at + 4u) >> e) & 1u) << 4u);
    return f16_NAME(at) * f32(q) + f16_NAME(at + 2u);"
        }
        _ => unreachable!("{} is not a legacy format", q.name()),
    }
}

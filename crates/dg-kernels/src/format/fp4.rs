//! ggml's 4-bit floating-point formats (`block_mxfp4`, `block_nvfp4` in `ggml/src/ggml-common.h`):
//! the element loaders of [`super::WeightFormat::operand`], in the order of operations of gguf-py's
//! `gguf/quants.py` (`MXFP4.dequantize_blocks`, `NVFP4.dequantize_blocks`), which dg-model's host
//! dequantization matches bit for bit.
//!
//! No tables: E2M1 (ggml's `kvalues_mxfp4`, the values doubled: 0, 1, 2, 3, 4, 6, 8, 12 and their
//! negatives) is a nibble of one constant word picked by the low 3 bits, the sign bit 3; the
//! E8M0 and UE4M3 scales (halved, as ggml's `ggml_e8m0_to_fp32_half` and gguf-py's
//! `ue4m3_to_fp32`) are built as f32 bits. An E8M0 byte below 2 is an f32 subnormal, which a
//! device that flushes subnormals reads as 0.

use super::QuantFormat;

/// The E2M1 helper both formats share.
macro_rules! e2m1 {
    () => {
        "// ggml's kvalues_mxfp4[q]: E2M1 doubled (magnitudes 0, 1, 2, 3, 4, 6, 8, 12 as nibbles of one
// word; negated as an integer, so that 8 is +0 as in ggml).
fn e2m1_NAME(q: u32) -> f32 {
    let v = i32((0xc8643210u >> (4u * (q & 7u))) & 15u);
    return f32(select(v, -v, (q & 8u) != 0u));
}
"
    };
}

/// Module-scope WGSL the loaders of `q` call (`NAME` the operand's name).
pub(super) fn decls(q: QuantFormat) -> &'static str {
    match q {
        QuantFormat::MXFP4 => concat!(
            e2m1!(),
            "// ggml_e8m0_to_fp32_half: 2^(e − 128) as f32 bits.
fn e8m0_half_NAME(e: u32) -> f32 {
    return bitcast<f32>(select((e - 1u) << 23u, 0x00200000u << e, e < 2u));
}
"
        ),
        QuantFormat::NVFP4 => concat!(
            e2m1!(),
            "// gguf-py's ue4m3_to_fp32, halved: bits 3..7 the exponent (bias 7), 0..3 the mantissa; 0 and
// 0x7f (NaN) read as 0.
fn ue4m3_half_NAME(x: u32) -> f32 {
    let e = (x >> 3u) & 15u;
    let m = x & 7u;
    if (x == 0u || x == 0x7fu) {
        return 0.0;
    }
    if (e == 0u) {
        return f32(m) * 0.0009765625;
    }
    return bitcast<f32>(((e + 119u) << 23u) | (m << 20u));
}
"
        ),
        _ => unreachable!("{} is not an FP4 format", q.name()),
    }
}

/// The body of `load_NAME(i)` for `q` (see `QuantFormat::load_body`).
pub(super) fn load_body(q: QuantFormat) -> &'static str {
    match q {
        // 17 bytes: an E8M0 scale e, 16 bytes of nibbles (value l in nibble l / 16 of byte l % 16);
        // x = d·kvalues[q].
        QuantFormat::MXFP4 => {
            "let at = (i / 32u) * 17u;
    let e = i % 32u;
    let qs = byte_NAME(at + 1u + e % 16u);
    return e8m0_half_NAME(byte_NAME(at)) * e2m1_NAME(select(qs & 15u, qs >> 4u, e >= 16u));"
        }
        // 36 bytes for 64 values: 4 UE4M3 scales (one per 16 values), 32 bytes of nibbles (value
        // l of sub-block s in nibble l / 8 of byte 8·s + l % 8); x = d_s·kvalues[q].
        QuantFormat::NVFP4 => {
            "let at = (i / 64u) * 36u;
    let e = i % 64u;
    let s = e / 16u;
    let l = e % 16u;
    let qs = byte_NAME(at + 4u + 8u * s + l % 8u);
    return ue4m3_half_NAME(byte_NAME(at + s)) * e2m1_NAME(select(qs & 15u, qs >> 4u, l >= 8u));"
        }
        _ => unreachable!("{} is not an FP4 format", q.name()),
    }
}

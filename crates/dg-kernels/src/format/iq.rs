//! ggml's IQ formats (`block_iq4_nl`, `block_iq4_xs`, `block_iq2_xxs`, `block_iq2_xs`,
//! `block_iq2_s`, `block_iq3_xxs`, `block_iq3_s`, `block_iq1_s`, `block_iq1_m` in
//! `ggml/src/ggml-common.h`): the element loaders of [`super::WeightFormat::operand`], each
//! `dequantize_row_*` of `ggml/src/ggml-quants.c` for one value, in the order of operations of
//! gguf-py's `gguf/quants.py` (`IQ2_XXS.dequantize_blocks` ...), which dg-model's host
//! dequantization matches bit for bit.
//!
//! Tables. The grids travel with the weights: the device buffer of an IQ type holds its grid
//! after the blocks ([`QuantFormat::table`], in gguf-py's packing, 16 bits a row:
//! [`super::grids`]), 128 words for IQ2_XXS and IQ3_XXS, 256 for IQ2_XS and IQ3_S, 512 for IQ2_S,
//! 1024 for IQ1_S and IQ1_M (a quarter of ggml's u64, or u32 for IQ3, rows), and the loader reads
//! row `r` at `arrayLength(&NAME) − words + r / 2`: a storage load like the blocks', no new
//! binding and no kernel change. WGSL module-scope `const` arrays were measured first and refused:
//! naga's SPIR-V copies a constant array into a function variable at every run-time index (one
//! copy per inlined load), and lavapipe's LLVM then took 0.3 s (IQ2_XS), 37 s (IQ3_S) and more
//! than 4 minutes (IQ1_S) to compile one GEMM, against 0.1 s for Q4_K; `var<private>` copies
//! (5 to 18 s) and a `switch` of constant vec4s (3.5 to 13 s) fared no better. A grid row's value
//! is its index into the grid's map (a `vec2<u32>` of i8 bytes). Tables with structure are
//! arithmetic: ggml's `ksigns_iq2xs[i]` is `i` with bit 7 its parity (`countOneBits`), and
//! `kvalues_iq4nl` is 16 i8 bytes in one `vec4<u32>` (dynamically indexed vectors, which every
//! backend indexes without a copy).

use super::{QuantFormat, grids};

/// The words the device buffer of `q` holds after its blocks: its grid, or none.
pub(super) fn table(q: QuantFormat) -> &'static [u32] {
    grid(q).map_or(&[], |(words, _, _)| words)
}

/// ggml's `kvalues_iq4nl`.
const IQ4NL: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

/// i8 values packed four to a little-endian u32 word.
fn i8_words(values: &[i32]) -> Vec<u32> {
    values.chunks(4).map(|c| c.iter().enumerate().fold(0u32, |w, (k, &v)| w | (u32::from(v as i8 as u8) << (8 * k)))).collect()
}

fn wgsl_u32s(words: &[u32]) -> String {
    words.iter().map(|w| format!("0x{w:08x}u")).collect::<Vec<_>>().join(", ")
}

/// The grid of `q`, its map and the bits of a row's value indices.
fn grid(q: QuantFormat) -> Option<(&'static [u32], &'static [i32], u32)> {
    Some(match q {
        QuantFormat::IQ2_XXS => (&grids::IQ2XXS, &grids::IQ2XXS_MAP, 2),
        QuantFormat::IQ2_XS => (&grids::IQ2XS, &grids::IQ2XS_MAP, 2),
        QuantFormat::IQ2_S => (&grids::IQ2S, &grids::IQ2S_MAP, 2),
        QuantFormat::IQ3_XXS => (&grids::IQ3XXS, &grids::IQ3XXS_MAP, 4),
        QuantFormat::IQ3_S => (&grids::IQ3S, &grids::IQ3S_MAP, 4),
        QuantFormat::IQ1_S | QuantFormat::IQ1_M => (&grids::IQ1S, &grids::IQ1S_MAP, 2),
        _ => return None,
    })
}

/// Module-scope WGSL the loaders of `q` call (`NAME` the operand's name): the grid and its
/// readers, the sign table, or the IQ4 values.
pub(super) fn decls(q: QuantFormat) -> String {
    let Some((words, map, bits)) = grid(q) else {
        let kv = i8_words(&IQ4NL.map(i32::from));
        return format!(
            "// ggml's kvalues_iq4nl, four i8 a word.\nconst kvalues_NAME = vec4<u32>({});\n\
             fn kvalue_NAME(q: u32) -> f32 {{\n    return f32(bitcast<i32>((kvalues_NAME[q >> 2u] >> (8u * (q & 3u))) << 24u) >> 24);\n}}\n",
            wgsl_u32s(&kv)
        );
    };
    let mut map = map.to_vec();
    map.resize(8, 0);
    format!(
        "// The values a row's indices stand for, four i8 a word.\nconst grid_map_NAME = vec2<u32>({map});\n\
         // Row r of the {name} grid, the buffer's last {n} words (gguf-py's packing: row r in half r % 2 of word r / 2).\n\
         fn grid_NAME_row(r: u32) -> u32 {{\n    return (NAME[arrayLength(&NAME) - {n}u + (r >> 1u)] >> (16u * (r & 1u))) & 0xffffu;\n}}\n\
         // Value k of a grid row.\n\
         fn grid_NAME_value(row: u32, k: u32) -> f32 {{\n    let c = (row >> ({bits}u * k)) & {mask}u;\n    \
         return f32(bitcast<i32>((grid_map_NAME[c >> 2u] >> (8u * (c & 3u))) << 24u) >> 24);\n}}\n\
         // ggml's ksigns_iq2xs[i]: i and its parity in bit 7.\n\
         fn ksign_NAME(i: u32) -> u32 {{\n    return i | ((countOneBits(i) & 1u) << 7u);\n}}\n",
        name = q.name(),
        n = words.len(),
        map = wgsl_u32s(&i8_words(&map)),
        mask = (1u32 << bits) - 1,
    )
}

/// The body of `load_NAME(i)` for `q` (see `QuantFormat::load_body`). `v` is the grid value
/// before its sign, as gguf-py's `db * grid * signs`.
pub(super) fn load_body(q: QuantFormat) -> &'static str {
    match q {
        // 18 bytes: f16 d, 16 bytes of nibbles (Q4_0's order); x = d·kvalues[q].
        QuantFormat::IQ4_NL => {
            "let at = (i / 32u) * 18u;
    let e = i % 32u;
    let qs = byte_NAME(at + 2u + e % 16u);
    return f16_NAME(at) * kvalue_NAME(select(qs & 15u, qs >> 4u, e >= 16u));"
        }
        // 136 bytes: f16 d, u16 scales_h (2 bits a sub-block), 4 bytes of scales_l (a nibble a
        // sub-block), 128 bytes of nibbles (16 bytes a 32-value sub-block, Q4_0's order);
        // x = d·(sc − 32)·kvalues[q].
        QuantFormat::IQ4_XS => {
            "let at = (i / 256u) * 136u;
    let e = i % 256u;
    let j = e / 32u;
    let l = e % 32u;
    let ls = (byte_NAME(at + 4u + j / 2u) >> (4u * (j % 2u))) & 15u;
    let hs = (u16_NAME(at + 2u) >> (2u * j)) & 3u;
    let dl = f16_NAME(at) * f32(i32(ls | (hs << 4u)) - 32);
    let qs = byte_NAME(at + 8u + 16u * j + l % 16u);
    return dl * kvalue_NAME(select(qs & 15u, qs >> 4u, l >= 16u));"
        }
        // 66 bytes: f16 d, then per 32-value sub-block two u32: 4 grid rows (bytes of the first),
        // and in the second 4 sign indices (7 bits each) and the scale (bits 28..32);
        // x = d·(0.5 + s)·0.25·grid·sign.
        QuantFormat::IQ2_XXS => {
            "let at = (i / 256u) * 66u;
    let e = i % 256u;
    let ib = e / 32u;
    let g = (e % 32u) / 8u;
    let aux = u32_NAME(at + 6u + 8u * ib);
    let db = f16_NAME(at) * (0.5 + f32(aux >> 28u)) * 0.25;
    let sign = (ksign_NAME((aux >> (7u * g)) & 127u) >> (e % 8u)) & 1u;
    let v = db * grid_NAME_value(grid_NAME_row(byte_NAME(at + 2u + 8u * ib + g)), e % 8u);
    return select(v, -v, sign != 0u);"
        }
        // 74 bytes: f16 d, 32 u16 (a grid row in bits 0..9, a sign index in 9..16, per 8
        // values), 8 bytes of scales (a nibble per 16 values); x = d·(0.5 + s)·0.25·grid·sign.
        QuantFormat::IQ2_XS => {
            "let at = (i / 256u) * 74u;
    let e = i % 256u;
    let qs = u16_NAME(at + 2u + 2u * (e / 8u));
    let s = (byte_NAME(at + 66u + e / 32u) >> (4u * ((e / 16u) % 2u))) & 15u;
    let db = f16_NAME(at) * (0.5 + f32(s)) * 0.25;
    let sign = (ksign_NAME(qs >> 9u) >> (e % 8u)) & 1u;
    let v = db * grid_NAME_value(grid_NAME_row(qs & 511u), e % 8u);
    return select(v, -v, sign != 0u);"
        }
        // 82 bytes: f16 d, 32 bytes of grid rows' low 8 bits, 32 bytes of sign bits (one per
        // value), 8 bytes of the rows' bits 8..10 (2 a row), 8 bytes of scales (a nibble per 16
        // values); x = d·(0.5 + s)·0.25·grid·sign.
        QuantFormat::IQ2_S => {
            "let at = (i / 256u) * 82u;
    let e = i % 256u;
    let g = e / 8u;
    let s = (byte_NAME(at + 74u + e / 32u) >> (4u * ((e / 16u) % 2u))) & 15u;
    let db = f16_NAME(at) * (0.5 + f32(s)) * 0.25;
    let row = byte_NAME(at + 2u + g) | (((byte_NAME(at + 66u + g / 4u) >> (2u * (g % 4u))) & 3u) << 8u);
    let sign = (byte_NAME(at + 34u + g) >> (e % 8u)) & 1u;
    let v = db * grid_NAME_value(grid_NAME_row(row), e % 8u);
    return select(v, -v, sign != 0u);"
        }
        // 98 bytes: f16 d, 64 bytes of grid rows (4 values each), per 32-value sub-block a u32
        // of 4 sign indices (7 bits each) and the scale (bits 28..32);
        // x = d·(0.5 + s)·0.5·grid·sign.
        QuantFormat::IQ3_XXS => {
            "let at = (i / 256u) * 98u;
    let e = i % 256u;
    let aux = u32_NAME(at + 66u + 4u * (e / 32u));
    let db = f16_NAME(at) * (0.5 + f32(aux >> 28u)) * 0.5;
    let sign = (ksign_NAME((aux >> (7u * ((e % 32u) / 8u))) & 127u) >> (e % 8u)) & 1u;
    let v = db * grid_NAME_value(grid_NAME_row(byte_NAME(at + 2u + e / 4u)), e % 4u);
    return select(v, -v, sign != 0u);"
        }
        // 110 bytes: f16 d, 64 bytes of grid rows' low 8 bits, 8 bytes of their bit 8 (one a
        // row), 32 bytes of sign bits, 4 bytes of scales (a nibble per 32 values);
        // x = d·(1 + 2s)·grid·sign.
        QuantFormat::IQ3_S => {
            "let at = (i / 256u) * 110u;
    let e = i % 256u;
    let ib = e / 32u;
    let s = (byte_NAME(at + 106u + ib / 2u) >> (4u * (ib % 2u))) & 15u;
    let db = f16_NAME(at) * f32(1u + 2u * s);
    let r = e / 4u;
    let row = byte_NAME(at + 2u + r) | (((byte_NAME(at + 66u + r / 8u) >> (r % 8u)) & 1u) << 8u);
    let sign = (byte_NAME(at + 74u + e / 8u) >> (e % 8u)) & 1u;
    let v = db * grid_NAME_value(grid_NAME_row(row), e % 4u);
    return select(v, -v, sign != 0u);"
        }
        // 50 bytes: f16 d, 32 bytes of grid rows' low 8 bits, per 32-value sub-block a u16 of
        // the rows' bits 8..11 (3 a row), the scale (bits 12..15) and the delta's sign (bit 15);
        // x = d·(2s + 1)·(grid ± 0.125).
        QuantFormat::IQ1_S => {
            "let at = (i / 256u) * 50u;
    let e = i % 256u;
    let ib = e / 32u;
    let g = (e % 32u) / 8u;
    let qh = u16_NAME(at + 34u + 2u * ib);
    let dl = f16_NAME(at) * f32(2u * ((qh >> 12u) & 7u) + 1u);
    let delta = select(0.125, -0.125, (qh & 0x8000u) != 0u);
    let row = byte_NAME(at + 2u + 4u * ib + g) | (((qh >> (3u * g)) & 7u) << 8u);
    return dl * (grid_NAME_value(grid_NAME_row(row), e % 8u) + delta);"
        }
        // 56 bytes: 32 bytes of grid rows' low 8 bits, 16 bytes of nibbles (a row's bits 8..11
        // and the delta's sign, per 8 values), 4 u16 of 3-bit scales (per 16 values) whose top
        // nibbles make the f16 d; x = d·(2s + 1)·(grid ± 0.125).
        QuantFormat::IQ1_M => {
            "let at = (i / 256u) * 56u;
    let e = i % 256u;
    let sc = vec4<u32>(u16_NAME(at + 48u), u16_NAME(at + 50u), u16_NAME(at + 52u), u16_NAME(at + 54u));
    let d = unpack2x16float((sc.x >> 12u) | ((sc.y >> 8u) & 0xf0u) | ((sc.z >> 4u) & 0xf00u) | (sc.w & 0xf000u)).x;
    let j = e / 16u;
    let dl = d * f32(2u * ((sc[j / 4u] >> (3u * (j % 4u))) & 7u) + 1u);
    let g = e / 8u;
    let qh = byte_NAME(at + 32u + g / 2u) >> (4u * (g % 2u));
    let delta = select(0.125, -0.125, (qh & 8u) != 0u);
    let row = byte_NAME(at + g) | ((qh & 7u) << 8u);
    return dl * (grid_NAME_value(grid_NAME_row(row), e % 8u) + delta);"
        }
        _ => unreachable!("{} is not an IQ format", q.name()),
    }
}

//! Weight storage formats as data. Each [`WeightFormat`] is defined once, here: the bytes an
//! element takes, how the host encodes f32 values into them ([`WeightFormat::encode`], what
//! dg-gpu's packing writes), and the WGSL fragments every kernel that reads weights is
//! instantiated with: [`WeightFormat::operand`] for the portable kernels (element `i` widened to
//! f32) and [`WeightFormat::coop_w`] for the tensor-core ones (four elements at a time as f16).
//! Kernels call the fragments' functions and declare their bindings over the fragments' word
//! types; they are never rewritten per format.
//!
//! The quantized formats ([`QuantFormat`]: ggml's block types, [`QuantFormat::ALL`]) hold a GGUF
//! tensor's blocks as stored, concatenated and padded to a whole word; their loaders dequantize
//! the one element asked for with ggml's `dequantize_row_*` arithmetic (so a value may differ from
//! the host's by the rounding of one fused multiply-add). Q8_0, Q5_0, Q4_K and Q6_K are written
//! here; the other types' loaders in `legacy.rs` (Q4_0, Q4_1, Q5_1), `k_quants.rs` (Q2_K, Q3_K,
//! Q5_K), `iq.rs` (the IQ types, their grids in `grids.rs`) and `fp4.rs` (MXFP4, NVFP4). Blocks
//! need not be 4-byte aligned (MXFP4's are 17 bytes): the loaders read bytes, and f16, u16 and
//! u32 fields at even offsets, through the readers of [`WeightFormat::operand`].
//!
//! On the tensor cores ([`WeightFormat::coop_w`]) Q8_0, Q5_0, Q4_K and Q6_K have their own vec4
//! units (and the first three run units and K-panel planes); every other type takes the generic
//! vec4 unit built on its element loader ([`QuantFormat::coop_w`]).

mod fp4;
#[rustfmt::skip]
mod grids;
mod iq;
mod k_quants;
mod legacy;
mod planes;

pub use planes::{MAX_GROUP_BYTES, PLANE_GROUP};

/// How a weight matrix is stored on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum WeightFormat {
    /// One f32 per element.
    #[default]
    F32,
    /// BF16, two per u32 word: element `i` in bits `16·(i & 1) .. 16·(i & 1) + 16` of word `i >> 1`
    /// (little-endian pairs, the checkpoint's own bytes). Widened in the shader as `bits << 16`,
    /// exact; arithmetic stays f32.
    Bf16,
    /// IEEE binary16, the same pair packing as [`WeightFormat::Bf16`] (the layout the tensor-core
    /// kernel [`crate::coop_gemm`] reads). Rounded from f32 to the nearest f16, ties to even:
    /// values beyond ±65504, the largest f16, become ±∞ (from 65520 in magnitude, halfway to the
    /// next power of two), values below 2⁻¹⁴ in magnitude become f16 subnormals (multiples of
    /// 2⁻²⁴; ±0 up to 2⁻²⁵), and a NaN stays a NaN. Widened in the shader with
    /// `unpack2x16float`, exact for every f16, subnormals included on a conforming device (one
    /// that flushes them reads those weights, |w| < 2⁻¹⁴, as ±0); arithmetic stays f32.
    F16,
    /// ggml's quantized blocks, as a GGUF file stores them (see [`QuantFormat`]).
    Quantized(QuantFormat),
}

/// ggml's block formats dg reads (`ggml/src/ggml-common.h`): `block_len` values in
/// `block_bytes` bytes, blocks along each row (a row is whole blocks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum QuantFormat {
    /// `block_q8_0`: an f16 scale `d`, 32 i8 `q`; `x = q·d`.
    Q8_0,
    /// `block_q5_0`: an f16 `d`, 32 high bits `qh`, 16 bytes of low nibbles; `x = (q − 16)·d`.
    Q5_0,
    /// `block_q4_K`: f16 `d`, `dmin`, 12 bytes of 6-bit scales and mins, 128 bytes of nibbles;
    /// `x = d·sc·q − dmin·m` per 32-value sub-block.
    Q4_K,
    /// `block_q6_K`: 128 bytes of low nibbles, 64 of high bit pairs, 16 i8 scales, an f16 `d`;
    /// `x = d·sc·(q − 32)` per 16-value sub-block.
    Q6_K,
    /// `block_q4_0`: an f16 `d`, 16 bytes of nibbles; `x = (q − 8)·d`.
    Q4_0,
    /// `block_q4_1`: f16 `d` and `m`, 16 bytes of nibbles; `x = d·q + m`.
    Q4_1,
    /// `block_q5_1`: f16 `d` and `m`, 32 high bits, 16 bytes of nibbles; `x = d·q + m`.
    Q5_1,
    /// `block_q2_K`: 16 bytes of 4-bit scales and mins, 64 of 2-bit quants, f16 `d`, `dmin`;
    /// `x = d·sc·q − dmin·m` per 16 values.
    Q2_K,
    /// `block_q3_K`: 32 bytes of high bits, 64 of 2-bit quants, 12 of 6-bit scales, an f16 `d`;
    /// `x = d·(sc − 32)·q` per 16 values, q in −4..4.
    Q3_K,
    /// `block_q5_K`: Q4_K's header, 32 bytes of high bits, 128 of nibbles; `x = d·sc·q − dmin·m`.
    Q5_K,
    /// `block_iq2_xxs`: an f16 `d`, per 32 values 4 grid rows, 4 sign indices and a scale.
    IQ2_XXS,
    /// `block_iq2_xs`: an f16 `d`, a u16 (grid row, sign index) per 8 values, 4-bit scales.
    IQ2_XS,
    /// `block_iq3_xxs`: an f16 `d`, a grid row per 4 values, per 32 a u32 of signs and scale.
    IQ3_XXS,
    /// `block_iq1_s`: an f16 `d`, 11-bit grid rows per 8 values, a scale and delta per 32.
    IQ1_S,
    /// `block_iq4_nl`: an f16 `d`, 16 bytes of nibbles indexing `kvalues_iq4nl`.
    IQ4_NL,
    /// `block_iq3_s`: an f16 `d`, 9-bit grid rows per 4 values, sign bits, 4-bit scales.
    IQ3_S,
    /// `block_iq2_s`: an f16 `d`, 10-bit grid rows per 8 values, sign bits, 4-bit scales.
    IQ2_S,
    /// `block_iq4_xs`: an f16 `d`, 6-bit scales per 32 values, nibbles indexing `kvalues_iq4nl`.
    IQ4_XS,
    /// `block_iq1_m`: IQ1_S's grid rows and deltas, 3-bit scales per 16 values holding `d`.
    IQ1_M,
    /// `block_mxfp4`: an E8M0 scale, 16 bytes of E2M1 nibbles.
    MXFP4,
    /// `block_nvfp4`: 64 values, a UE4M3 scale per 16, 32 bytes of E2M1 nibbles.
    NVFP4,
}

impl QuantFormat {
    /// Every type: the four dg's quantizer writes, then the others in ggml's type-id order.
    pub const ALL: [QuantFormat; 21] = [
        QuantFormat::Q8_0,
        QuantFormat::Q5_0,
        QuantFormat::Q4_K,
        QuantFormat::Q6_K,
        QuantFormat::Q4_0,
        QuantFormat::Q4_1,
        QuantFormat::Q5_1,
        QuantFormat::Q2_K,
        QuantFormat::Q3_K,
        QuantFormat::Q5_K,
        QuantFormat::IQ2_XXS,
        QuantFormat::IQ2_XS,
        QuantFormat::IQ3_XXS,
        QuantFormat::IQ1_S,
        QuantFormat::IQ4_NL,
        QuantFormat::IQ3_S,
        QuantFormat::IQ2_S,
        QuantFormat::IQ4_XS,
        QuantFormat::IQ1_M,
        QuantFormat::MXFP4,
        QuantFormat::NVFP4,
    ];

    /// Values in a block (ggml's `QK*`).
    pub const fn block_len(self) -> usize {
        use QuantFormat as Q;
        match self {
            Q::Q8_0 | Q::Q5_0 | Q::Q4_0 | Q::Q4_1 | Q::Q5_1 | Q::IQ4_NL | Q::MXFP4 => 32,
            Q::NVFP4 => 64,
            Q::Q4_K | Q::Q6_K | Q::Q2_K | Q::Q3_K | Q::Q5_K => 256,
            Q::IQ2_XXS | Q::IQ2_XS | Q::IQ3_XXS | Q::IQ1_S | Q::IQ3_S | Q::IQ2_S | Q::IQ4_XS | Q::IQ1_M => 256,
        }
    }

    /// Bytes of a block (`sizeof(block_*)`).
    pub const fn block_bytes(self) -> usize {
        match self {
            QuantFormat::Q8_0 => 34,
            QuantFormat::Q5_0 => 22,
            QuantFormat::Q4_K => 144,
            QuantFormat::Q6_K => 210,
            QuantFormat::Q4_0 => 18,
            QuantFormat::Q4_1 => 20,
            QuantFormat::Q5_1 => 24,
            QuantFormat::Q2_K => 84,
            QuantFormat::Q3_K => 110,
            QuantFormat::Q5_K => 176,
            QuantFormat::IQ2_XXS => 66,
            QuantFormat::IQ2_XS => 74,
            QuantFormat::IQ3_XXS => 98,
            QuantFormat::IQ1_S => 50,
            QuantFormat::IQ4_NL => 18,
            QuantFormat::IQ3_S => 110,
            QuantFormat::IQ2_S => 82,
            QuantFormat::IQ4_XS => 136,
            QuantFormat::IQ1_M => 56,
            QuantFormat::MXFP4 => 17,
            QuantFormat::NVFP4 => 36,
        }
    }

    /// ggml's name of the type (`Q8_0`, ...).
    pub fn name(self) -> &'static str {
        match self {
            QuantFormat::Q8_0 => "Q8_0",
            QuantFormat::Q5_0 => "Q5_0",
            QuantFormat::Q4_K => "Q4_K",
            QuantFormat::Q6_K => "Q6_K",
            QuantFormat::Q4_0 => "Q4_0",
            QuantFormat::Q4_1 => "Q4_1",
            QuantFormat::Q5_1 => "Q5_1",
            QuantFormat::Q2_K => "Q2_K",
            QuantFormat::Q3_K => "Q3_K",
            QuantFormat::Q5_K => "Q5_K",
            QuantFormat::IQ2_XXS => "IQ2_XXS",
            QuantFormat::IQ2_XS => "IQ2_XS",
            QuantFormat::IQ3_XXS => "IQ3_XXS",
            QuantFormat::IQ1_S => "IQ1_S",
            QuantFormat::IQ4_NL => "IQ4_NL",
            QuantFormat::IQ3_S => "IQ3_S",
            QuantFormat::IQ2_S => "IQ2_S",
            QuantFormat::IQ4_XS => "IQ4_XS",
            QuantFormat::IQ1_M => "IQ1_M",
            QuantFormat::MXFP4 => "MXFP4",
            QuantFormat::NVFP4 => "NVFP4",
        }
    }

    /// Suffix of the name of a kernel variant reading this type (`_q8_0`, `_iq2_xxs`, ...).
    pub fn suffix(self) -> &'static str {
        match self {
            QuantFormat::Q8_0 => "_q8_0",
            QuantFormat::Q5_0 => "_q5_0",
            QuantFormat::Q4_K => "_q4_k",
            QuantFormat::Q6_K => "_q6_k",
            QuantFormat::Q4_0 => "_q4_0",
            QuantFormat::Q4_1 => "_q4_1",
            QuantFormat::Q5_1 => "_q5_1",
            QuantFormat::Q2_K => "_q2_k",
            QuantFormat::Q3_K => "_q3_k",
            QuantFormat::Q5_K => "_q5_k",
            QuantFormat::IQ2_XXS => "_iq2_xxs",
            QuantFormat::IQ2_XS => "_iq2_xs",
            QuantFormat::IQ3_XXS => "_iq3_xxs",
            QuantFormat::IQ1_S => "_iq1_s",
            QuantFormat::IQ4_NL => "_iq4_nl",
            QuantFormat::IQ3_S => "_iq3_s",
            QuantFormat::IQ2_S => "_iq2_s",
            QuantFormat::IQ4_XS => "_iq4_xs",
            QuantFormat::IQ1_M => "_iq1_m",
            QuantFormat::MXFP4 => "_mxfp4",
            QuantFormat::NVFP4 => "_nvfp4",
        }
    }

    /// The words a device buffer of this type holds after its blocks (and their padding to a
    /// whole word), which its loader reads from the end of the binding: the IQ types' grids
    /// (`iq.rs`); none for the others.
    pub fn table(self) -> &'static [u32] {
        iq::table(self)
    }

    /// Whether the loader reads u16 and u32 fields (`u16_NAME`, `u32_NAME`): every type but the
    /// four written here, whose kernels stay without the readers.
    const fn needs_wide_readers(self) -> bool {
        !matches!(self, QuantFormat::Q8_0 | QuantFormat::Q5_0 | QuantFormat::Q4_K | QuantFormat::Q6_K)
    }

    /// Module-scope WGSL the loader of this type calls (tables and helpers, `NAME` the operand's
    /// name): empty for the types without any.
    fn decls(self) -> String {
        use QuantFormat as Q;
        match self {
            Q::MXFP4 | Q::NVFP4 => fp4::decls(self).to_string(),
            Q::IQ2_XXS | Q::IQ2_XS | Q::IQ3_XXS | Q::IQ1_S | Q::IQ4_NL | Q::IQ3_S | Q::IQ2_S | Q::IQ4_XS | Q::IQ1_M => iq::decls(self),
            _ => String::new(),
        }
    }

    /// The body of `fn load_{name}(i: u32) -> f32` over the block bytes in `{name}` (u32 words),
    /// with the readers `byte_{name}`, `f16_{name}`, `u16_{name}`, `u32_{name}`, `i8_{name}` and
    /// the type's [`Self::decls`] in scope.
    fn load_body(self) -> &'static str {
        use QuantFormat as Q;
        match self {
            Q::Q4_0 | Q::Q4_1 | Q::Q5_1 => legacy::load_body(self),
            Q::Q2_K | Q::Q3_K | Q::Q5_K => k_quants::load_body(self),
            Q::MXFP4 | Q::NVFP4 => fp4::load_body(self),
            Q::IQ2_XXS | Q::IQ2_XS | Q::IQ3_XXS | Q::IQ1_S | Q::IQ4_NL | Q::IQ3_S | Q::IQ2_S | Q::IQ4_XS | Q::IQ1_M => iq::load_body(self),
            QuantFormat::Q8_0 => {
                "let at = (i / 32u) * 34u;
    return f32(i8_NAME(byte_NAME(at + 2u + i % 32u))) * f16_NAME(at);"
            }
            QuantFormat::Q5_0 => {
                "let at = (i / 32u) * 22u;
    let e = i % 32u;
    let qh = byte_NAME(at + 2u) | (byte_NAME(at + 3u) << 8u) | (byte_NAME(at + 4u) << 16u) | (byte_NAME(at + 5u) << 24u);
    let qs = byte_NAME(at + 6u + e % 16u);
    let low = select(qs & 15u, qs >> 4u, e >= 16u);
    let q = low | (((qh >> e) & 1u) << 4u);
    return f32(i32(q) - 16) * f16_NAME(at);"
            }
            QuantFormat::Q4_K => {
                "let at = (i / 256u) * 144u;
    let e = i % 256u;
    let pair = e / 64u;
    let high = (e % 64u) >= 32u;
    let j = 2u * pair + select(0u, 1u, high);
    let qs = byte_NAME(at + 16u + 32u * pair + e % 32u);
    let q = select(qs & 15u, qs >> 4u, high);
    var sc: u32;
    var m: u32;
    if (j < 4u) {
        sc = byte_NAME(at + 4u + j) & 63u;
        m = byte_NAME(at + 8u + j) & 63u;
    } else {
        sc = (byte_NAME(at + 8u + j) & 15u) | ((byte_NAME(at + j) >> 6u) << 4u);
        m = (byte_NAME(at + 8u + j) >> 4u) | ((byte_NAME(at + 4u + j) >> 6u) << 4u);
    }
    let d1 = f16_NAME(at) * f32(sc);
    let m1 = f16_NAME(at + 2u) * f32(m);
    return d1 * f32(q) - m1;"
            }
            QuantFormat::Q6_K => {
                "let at = (i / 256u) * 210u;
    let e = i % 256u;
    let half = e / 128u;
    let k = (e % 128u) / 32u;
    let l = e % 32u;
    let ql = byte_NAME(at + 64u * half + l + 32u * (k & 1u)) >> (4u * (k >> 1u));
    let qh = byte_NAME(at + 128u + 32u * half + l) >> (2u * k);
    let q = i32((ql & 15u) | ((qh & 3u) << 4u)) - 32;
    let sc = i8_NAME(byte_NAME(at + 192u + 8u * half + l / 16u + 2u * k));
    return f16_NAME(at + 208u) * f32(sc) * f32(q);"
            }
        }
    }
}

/// The tensor-core kernels' view of a W format: W's binding is an array of `word`; the K loop's
/// ring holds one `elem` per W unit, `vec4s` consecutive vec4s of one row along K (the vec4 `v`:
/// elements `4v .. 4v + 3` of the row-major, or K-panelled, matrix). `fetch_w(v)` loads the unit
/// whose first vec4 is `v` as stored (no arithmetic on the loaded words, so the ring's loads stay
/// in flight); `put_w(at, e, x)` converts unit `x` to f16 and writes it into the stage at `at` as
/// unit `e` of the step's tile (its vec4s `vec4s·e ..` at `dst_w`); `pin_w` parks a prefetched one
/// (F16 in A's stage through `pin_h`, others as f32 words in the scratch) until it is staged
/// (`coop_kloop.rs`).
///
/// Every format has a unit of one vec4 ([`WeightFormat::coop_w`]); Q8_0, Q5_0 and
/// Q4_K also one of a whole 32-value run ([`WeightFormat::coop_w_run`]), which loads a block's
/// scales once for 32 values instead of once per vec4.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoopW {
    pub word: &'static str,
    pub elem: &'static str,
    pub vec4s: u32,
    pub fetch: &'static str,
    pub put: String,
    pub pin_w: &'static str,
}

/// Values in a W unit of [`WeightFormat::coop_w_run`]: one Q8_0 or Q5_0 block, one Q4_K
/// sub-block.
pub const RUN_VALUES: u32 = 32;

/// `put_w` of a one-vec4 unit: `w16` (the format's conversion of one loaded vec4) into the stage.
const PUT_VEC4: &str = "fn put_w(at: u32, e: u32, x: W_ELEM) {\n    put_b(at + dst_w(e), w16(x));\n}\n";

/// A one-vec4 unit from its fetch, its conversion `w16` and its pin.
fn vec4_unit(word: &'static str, elem: &'static str, fetch: &'static str, w16: &str, pin_w: &'static str) -> CoopW {
    CoopW { word, elem, vec4s: 1, fetch, put: format!("{w16}{PUT_VEC4}"), pin_w }
}

/// ggml's dequantization of four values into an f16 vec4, shared by the one-vec4 and the run
/// units of the formats that have both. The quants become f32 without a conversion instruction:
/// the bits `0x4b000000 | b` of an integer `b < 2²³` are the f32 `2²³ + b`, from which the offset
/// (2²³ plus the format's zero point) is subtracted exactly. (NVIDIA issues integer-to-float
/// conversions at a fraction of the arithmetic rate; on the H200 the experts measured the same
/// either way, bound elsewhere.) The arithmetic after that is ggml's in f32 (`q·d`, `(q − 16)·d`,
/// `d·sc·q − dmin·m`), rounded to f16.
const DEQUANT_VEC4: &str = "fn bytes_f32(u: u32, off: f32) -> vec4<f32> {
    let b = vec4<u32>(u, u >> 8u, u >> 16u, u >> 24u) & vec4<u32>(255u);
    return bitcast<vec4<f32>>(b | vec4<u32>(0x4b000000u)) - vec4<f32>(8388608.0 + off);
}
// Four i8 quants (the bytes of q) times d.
fn q8_vec4(q: u32, d: f32) -> vec4<f16> {
    return vec4<f16>(bytes_f32(q ^ 0x80808080u, 128.0) * d);
}
// Four Q5_0 values: their nibbles in bits 0..3 of nib's bytes, their high bits in bits 0..3 of qh.
fn q5_vec4(nib: u32, qh: u32, d: f32) -> vec4<f16> {
    let high = ((qh & 1u) << 4u) | ((qh & 2u) << 11u) | ((qh & 4u) << 18u) | ((qh & 8u) << 25u);
    return vec4<f16>(bytes_f32((nib & 0x0f0f0f0fu) | high, 16.0) * d);
}
// Sub-block j's d·sc and dmin·m from a Q4_K super-block's 4 header words.
fn q4k_scales(head: vec4<u32>, j: u32) -> vec2<f32> {
    let t = 8u * (j % 4u);
    var sc: u32;
    var m: u32;
    if (j < 4u) {
        sc = (head.y >> t) & 63u;
        m = (head.z >> t) & 63u;
    } else {
        sc = ((head.w >> t) & 15u) | ((((head.y >> t) >> 6u) & 3u) << 4u);
        m = (((head.w >> t) >> 4u) & 15u) | ((((head.z >> t) >> 6u) & 3u) << 4u);
    }
    let dm = unpack2x16float(head.x);
    return vec2<f32>(dm.x * f32(sc), dm.y * f32(m));
}
// Four Q4_K values: their nibbles in bits 0..3 of nib's bytes, dm their sub-block's q4k_scales.
fn q4k_vec4(nib: u32, dm: vec2<f32>) -> vec4<f16> {
    return vec4<f16>(dm.x * bytes_f32(nib & 0x0f0f0f0fu, 0.0) - dm.y);
}
";

/// `put_w` of a unit of `vec4s` vec4s along one row (a 32-value run, or half of one): `prologue`
/// (the block's scale `d` and whatever the vec4s share) then, for each vec4 `k`, `vec4(k)` (an
/// expression of the f16 vec4) into the stage.
fn run_put(elem: &str, vec4s: u32, prologue: &str, vec4: impl Fn(u32) -> String) -> String {
    let mut s = format!("{DEQUANT_VEC4}fn put_w(at: u32, e: u32, x: {elem}) {{\n{prologue}");
    for k in 0..vec4s {
        s += &format!("    put_b(at + dst_w({vec4s}u * e + {k}u), {});\n", vec4(k));
    }
    s + "}\n"
}

impl QuantFormat {
    /// The tensor-core fragments of this format (see [`CoopW`]). `fetch_w` loads the words that
    /// hold vec4 `v`'s quants, its block's scales and an index-derived `tag` (never a loaded
    /// value); `w16` dequantizes with ggml's arithmetic in f32 (as [`WeightFormat::operand`]'s
    /// loader) and rounds to f16. A vec4 never straddles a block (blocks are multiples of 4
    /// values). Blocks of 34, 22 and 210 bytes start 2-byte aligned in every other block: those
    /// formats load the two words around an unaligned run and the tag's bit 0 says which half
    /// it starts in. Every other type takes [`generic_unit`].
    fn coop_w(self) -> CoopW {
        match self {
            // Block b at byte 34b: d in half (b & 1) of its word, the 4 quants from byte
            // 34b + 2 + e, 2 bytes into a word when b is even.
            QuantFormat::Q8_0 => vec4_unit(
                "u32",
                "vec4<u32>",
                "fn fetch_w(v: u32) -> vec4<u32> {
    let i = 4u * v;
    let b = i / 32u;
    let at = b * 34u;
    let s = (at + 2u + i % 32u) >> 2u;
    return vec4<u32>(w[at >> 2u], w[s], w[s + 1u], b & 1u);
}
",
                &format!(
                    "{DEQUANT_VEC4}fn w16(x: vec4<u32>) -> vec4<f16> {{
    let q = select((x.y >> 16u) | (x.z << 16u), x.y, x.w != 0u);
    return q8_vec4(q, unpack2x16float(x.x)[x.w]);
}}
"
                ),
                "fn pin_w(l: u32, v: vec4<u32>) {\n    pin_f(l, bitcast<vec4<f32>>(v));\n}\n",
            ),
            // Block b at byte 22b (2 bytes into a word when b is odd): d, then 32 high bits (the
            // word after d's when b is odd), then 16 bytes of nibbles from byte 22b + 6 + e % 16 (2 bytes
            // into a word when b is even).
            QuantFormat::Q5_0 => vec4_unit(
                "u32",
                "QW",
                "struct QW {
    h: vec2<u32>,
    s0: u32,
    s1: u32,
    tag: u32,
}
fn fetch_w(v: u32) -> QW {
    let i = 4u * v;
    let b = i / 32u;
    let e = i % 32u;
    let at = (b * 22u) >> 2u;
    let s = (b * 22u + 6u + e % 16u) >> 2u;
    return QW(vec2<u32>(w[at], w[at + 1u]), w[s], w[s + 1u], (b & 1u) | (e << 1u));
}
",
                &format!(
                    "{DEQUANT_VEC4}fn w16(x: QW) -> vec4<f16> {{
    let odd = (x.tag & 1u) != 0u;
    let e = x.tag >> 1u;
    let qh = select((x.h.x >> 16u) | (x.h.y << 16u), x.h.y, odd) >> e;
    let qs = select((x.s0 >> 16u) | (x.s1 << 16u), x.s0, odd);
    return q5_vec4(select(qs, qs >> 4u, e >= 16u), qh, unpack2x16float(x.h.x)[x.tag & 1u]);
}}
"
                ),
                "fn pin_w(l: u32, v: QW) {\n    pin_f(l, bitcast<vec4<f32>>(vec4<u32>(v.h.x ^ v.h.y, v.s0, v.s1, v.tag)));\n}\n",
            ),
            // Block b at byte 144b (16-byte aligned, so W is bound as vec4s of words: one
            // 16-byte load where u32 words took four): d and dmin, 12 bytes of 6-bit scales and
            // mins, then the nibbles: vec4 e's 4 bytes at 16 + 32·(e / 64) + e % 32, high nibbles
            // for the odd sub-block j = e / 32.
            QuantFormat::Q4_K => vec4_unit(
                "vec4<u32>",
                "QW",
                "struct QW {
    q: u32,
    head: vec4<u32>,
    j: u32,
}
fn fetch_w(v: u32) -> QW {
    let i = 4u * v;
    let at = (i / 256u) * 9u;
    let e = i % 256u;
    return QW(w[at + 1u + 2u * (e / 64u) + (e % 32u) / 16u][(e % 16u) / 4u], w[at], e / 32u);
}
",
                &format!(
                    "{DEQUANT_VEC4}fn w16(x: QW) -> vec4<f16> {{
    return q4k_vec4(select(x.q, x.q >> 4u, (x.j & 1u) != 0u), q4k_scales(x.head, x.j));
}}
"
                ),
                "fn pin_w(l: u32, v: QW) {\n    pin_f(l, bitcast<vec4<f32>>(v.head ^ vec4<u32>(v.q, v.j, 0u, 0u)));\n}\n",
            ),
            // Block b at byte 210b (2 bytes into a word when b is odd): 128 bytes of low nibbles,
            // 64 of high bit pairs, 16 i8 scales, d. Element e: half h = e / 128, quarter k = (e %
            // 128) / 32, l = e % 32; low bits from byte 64h + 32(k & 1) + l (nibble k >> 1), high
            // from 128 + 32h + l (pair k), scale byte 192 + 8h + l / 16 + 2k.
            QuantFormat::Q6_K => vec4_unit(
                "u32",
                "QW",
                "struct QW {
    ql: vec2<u32>,
    qh: vec2<u32>,
    sd: vec2<u32>,
    tag: u32,
}
fn fetch_w(v: u32) -> QW {
    let i = 4u * v;
    let b = i / 256u;
    let at = b * 210u;
    let e = i % 256u;
    let h = e / 128u;
    let k = (e % 128u) / 32u;
    let l = e % 32u;
    let lo = (at + 64u * h + 32u * (k & 1u) + l) >> 2u;
    let hi = (at + 128u + 32u * h + l) >> 2u;
    let sc = at + 192u + 8u * h + l / 16u + 2u * k;
    let tag = (b & 1u) | (k << 1u) | ((sc & 3u) << 3u);
    return QW(vec2<u32>(w[lo], w[lo + 1u]), vec2<u32>(w[hi], w[hi + 1u]), vec2<u32>(w[sc >> 2u], w[(at + 208u) >> 2u]), tag);
}
",
                "fn w16(x: QW) -> vec4<f16> {
    let odd = (x.tag & 1u) != 0u;
    let k = (x.tag >> 1u) & 3u;
    let ql = select(x.ql.x, (x.ql.x >> 16u) | (x.ql.y << 16u), odd) >> (4u * (k >> 1u));
    let qh = select(x.qh.x, (x.qh.x >> 16u) | (x.qh.y << 16u), odd) >> (2u * k);
    let low = vec4<u32>(ql, ql >> 8u, ql >> 16u, ql >> 24u) & vec4<u32>(15u);
    let high = (vec4<u32>(qh, qh >> 8u, qh >> 16u, qh >> 24u) & vec4<u32>(3u)) << vec4<u32>(4u);
    let q = vec4<i32>(low | high) - vec4<i32>(32);
    let sc = bitcast<i32>((x.sd.x >> (8u * (x.tag >> 3u))) << 24u) >> 24u;
    let d = unpack2x16float(x.sd.y)[x.tag & 1u];
    return vec4<f16>(d * f32(sc) * vec4<f32>(q));
}
",
                "fn pin_w(l: u32, v: QW) {\n    pin_f(l, bitcast<vec4<f32>>(vec4<u32>(v.ql.x ^ v.ql.y, v.qh.x ^ v.qh.y, v.sd.x ^ v.sd.y, v.tag)));\n}\n",
            ),
            q => generic_unit(q),
        }
    }
}

/// The one-vec4 W unit of any type, built on its element loader ([`WeightFormat::operand`]'s
/// `load_w` over the binding `w`): `fetch_w` dequantizes the vec4's four values (its loads and
/// ggml's arithmetic in f32, the portable kernels' own), `w16` rounds them to f16, and the pin
/// parks the four f32. Block-agnostic, so it reads blocks row-major and in K panels alike.
fn generic_unit(q: QuantFormat) -> CoopW {
    let loader = WeightFormat::Quantized(q).operand("w");
    vec4_unit(
        "u32",
        "vec4<f32>",
        "fn fetch_w(v: u32) -> vec4<f32> {
    let i = 4u * v;
    return vec4<f32>(load_w(i), load_w(i + 1u), load_w(i + 2u), load_w(i + 3u));
}
",
        &format!("{loader}fn w16(x: vec4<f32>) -> vec4<f16> {{\n    return vec4<f16>(x);\n}}\n"),
        "fn pin_w(l: u32, v: vec4<f32>) {\n    pin_f(l, v);\n}\n",
    )
}

impl QuantFormat {
    /// The 32-value run unit of this format (see [`CoopW`]): `fetch_w(v)` loads the words of the
    /// run from vec4 `v` (a multiple of 8) in as few loads as its block's alignment allows,
    /// `put_w` dequantizes its 8 vec4s with the arithmetic of [`Self::coop_w`]'s `w16` (the same
    /// f16 values) from the block's scales decoded once. Q6_K has none (its runs are spread over
    /// four regions of the block, and no expert of the real model stores it).
    fn coop_w_run(self) -> Option<CoopW> {
        Some(match self {
            // Block b at byte 34b: the 9 words from the one holding d cover it (d in half b & 1 of
            // the first; the quants 2 bytes into a word when b is even, else the 8 words after).
            QuantFormat::Q8_0 => CoopW {
                word: "u32",
                elem: "QR",
                vec4s: 8,
                fetch: "struct QR {
    h: u32,
    q0: vec4<u32>,
    q1: vec4<u32>,
    odd: u32,
}
fn fetch_w(v: u32) -> QR {
    let b = v / 8u;
    let at = (b * 34u) >> 2u;
    return QR(w[at], vec4<u32>(w[at + 1u], w[at + 2u], w[at + 3u], w[at + 4u]), vec4<u32>(w[at + 5u], w[at + 6u], w[at + 7u], w[at + 8u]), b & 1u);
}
",
                put: run_put(
                    "QR",
                    8,
                    "    let odd = x.odd != 0u;\n    let d = unpack2x16float(x.h)[x.odd];\n",
                    |k| {
                        let word = |i: u32| match i {
                            0 => "x.h".to_string(),
                            i => format!("x.q{}.{}", (i - 1) / 4, ["x", "y", "z", "w"][((i - 1) % 4) as usize]),
                        };
                        format!("q8_vec4(select(({} >> 16u) | ({} << 16u), {}, odd), d)", word(k), word(k + 1), word(k + 1))
                    },
                ),
                pin_w: "fn pin_w(l: u32, v: QR) {\n    pin_f(l, bitcast<vec4<f32>>(v.q0 ^ v.q1 ^ vec4<u32>(v.h, v.odd, 0u, 0u)));\n}\n",
            },
            // Block b at byte 22b: the 6 words from the one holding d cover it (d in half b & 1;
            // when b is even, qh and the nibbles 2 bytes into a word, else qh the second word and
            // the nibbles the 4 after).
            QuantFormat::Q5_0 => CoopW {
                word: "u32",
                elem: "QR",
                vec4s: 8,
                fetch: "struct QR {
    h: vec2<u32>,
    s: vec4<u32>,
    odd: u32,
}
fn fetch_w(v: u32) -> QR {
    let b = v / 8u;
    let at = (b * 22u) >> 2u;
    return QR(vec2<u32>(w[at], w[at + 1u]), vec4<u32>(w[at + 2u], w[at + 3u], w[at + 4u], w[at + 5u]), b & 1u);
}
",
                put: run_put(
                    "QR",
                    8,
                    "    let odd = x.odd != 0u;\n    let d = unpack2x16float(x.h.x)[x.odd];\n    let qh = select((x.h.x >> 16u) | (x.h.y << 16u), x.h.y, odd);\n\
                     \x20   let s0 = select((x.h.y >> 16u) | (x.s.x << 16u), x.s.x, odd);\n    let s1 = select((x.s.x >> 16u) | (x.s.y << 16u), x.s.y, odd);\n\
                     \x20   let s2 = select((x.s.y >> 16u) | (x.s.z << 16u), x.s.z, odd);\n    let s3 = select((x.s.z >> 16u) | (x.s.w << 16u), x.s.w, odd);\n",
                    |k| {
                        let nib = if k < 4 { format!("s{k}") } else { format!("(s{} >> 4u)", k - 4) };
                        format!("q5_vec4({nib}, qh >> {}u, d)", 4 * k)
                    },
                ),
                pin_w: "fn pin_w(l: u32, v: QR) {\n    pin_f(l, bitcast<vec4<f32>>(v.s ^ vec4<u32>(v.h, v.odd, 0u)));\n}\n",
            },
            // Super-block b at byte 144b (16-byte aligned; W bound as vec4s of words): its header
            // vec4, and the 2 vec4s of nibbles sub-block j = e / 32 takes its nibbles from (high
            // ones for odd j): three 16-byte loads a run.
            QuantFormat::Q4_K => CoopW {
                word: "vec4<u32>",
                elem: "QR",
                vec4s: 8,
                fetch: "struct QR {
    head: vec4<u32>,
    q0: vec4<u32>,
    q1: vec4<u32>,
    j: u32,
}
fn fetch_w(v: u32) -> QR {
    let i = 4u * v;
    let at = (i / 256u) * 9u;
    let e = i % 256u;
    let s = at + 1u + 2u * (e / 64u);
    return QR(w[at], w[s], w[s + 1u], e / 32u);
}
",
                put: run_put(
                    "QR",
                    8,
                    "    let dm = q4k_scales(x.head, x.j);\n    let shift = select(0u, 4u, (x.j & 1u) != 0u);\n",
                    |k| format!("q4k_vec4(x.q{}.{} >> shift, dm)", k / 4, ["x", "y", "z", "w"][(k % 4) as usize]),
                ),
                pin_w: "fn pin_w(l: u32, v: QR) {\n    pin_f(l, bitcast<vec4<f32>>(v.head ^ v.q0 ^ v.q1 ^ vec4<u32>(v.j, 0u, 0u, 0u)));\n}\n",
            },
            _ => return None,
        })
    }
}

impl WeightFormat {
    /// Every element format (one value per element: what every kernel reads).
    pub const ELEMENTS: [WeightFormat; 3] = [WeightFormat::F32, WeightFormat::Bf16, WeightFormat::F16];

    /// Every format, the quantized ones included.
    pub const ALL: [WeightFormat; 3 + QuantFormat::ALL.len()] = {
        let mut all = [WeightFormat::F32; 3 + QuantFormat::ALL.len()];
        (all[1], all[2]) = (WeightFormat::Bf16, WeightFormat::F16);
        let mut i = 0;
        while i < QuantFormat::ALL.len() {
            all[3 + i] = WeightFormat::Quantized(QuantFormat::ALL[i]);
            i += 1;
        }
        all
    };

    /// Bytes per element of an element format.
    ///
    /// # Panics
    /// On a quantized format, whose elements take no whole number of bytes ([`Self::bytes_for`]).
    pub fn bytes(self) -> usize {
        match self {
            WeightFormat::F32 => 4,
            WeightFormat::Bf16 | WeightFormat::F16 => 2,
            WeightFormat::Quantized(q) => panic!("{} stores blocks of {} values, not elements", q.name(), q.block_len()),
        }
    }

    /// Bytes `elements` elements take (whole blocks of a quantized format); `None` when they are
    /// not whole blocks.
    pub fn bytes_for(self, elements: usize) -> Option<usize> {
        match self {
            WeightFormat::Quantized(q) => elements.is_multiple_of(q.block_len()).then(|| elements / q.block_len() * q.block_bytes()),
            f => Some(elements * f.bytes()),
        }
    }

    /// Mean bytes per element (a quantized format's block bytes over its values).
    pub fn bytes_per_element(self) -> f64 {
        match self {
            WeightFormat::Quantized(q) => q.block_bytes() as f64 / q.block_len() as f64,
            f => f.bytes() as f64,
        }
    }

    /// Whether the format holds ggml blocks.
    pub fn is_quantized(self) -> bool {
        matches!(self, WeightFormat::Quantized(_))
    }

    /// Suffix of the name of a kernel variant that reads its weights in this format: none for
    /// f32 (the original names), `_bf16`, `_f16`, `_q8_0` ([`QuantFormat::suffix`]).
    pub fn suffix(self) -> &'static str {
        match self {
            WeightFormat::F32 => "",
            WeightFormat::Bf16 => "_bf16",
            WeightFormat::F16 => "_f16",
            WeightFormat::Quantized(q) => q.suffix(),
        }
    }

    /// `values` encoded into `out` (little-endian, [`Self::bytes`] each, as the device reads them):
    /// f32 as is, BF16 and F16 rounded to nearest, ties to even (the `half` crate's conversions).
    ///
    /// # Panics
    /// When `out` does not hold exactly `values.len()` elements, or on a quantized format (its
    /// tensors reach the device as the checkpoint stores their blocks).
    pub fn encode(self, values: &[f32], out: &mut [u8]) {
        assert_eq!(out.len(), values.len() * self.bytes(), "{} bytes for {} {self:?} elements", out.len(), values.len());
        match self {
            WeightFormat::F32 => {
                for (o, v) in out.chunks_exact_mut(4).zip(values) {
                    o.copy_from_slice(&v.to_le_bytes());
                }
            }
            WeightFormat::Bf16 => {
                for (o, &v) in out.chunks_exact_mut(2).zip(values) {
                    o.copy_from_slice(&half::bf16::from_f32(v).to_le_bytes());
                }
            }
            WeightFormat::F16 => {
                for (o, &v) in out.chunks_exact_mut(2).zip(values) {
                    o.copy_from_slice(&half::f16::from_f32(v).to_le_bytes());
                }
            }
            WeightFormat::Quantized(q) => panic!("{} tensors are packed as stored, not encoded from f32", q.name()),
        }
    }

    /// The WGSL that makes `name` an operand in this format: the type `{name}_word` the kernel
    /// declares its binding as an array of (`var<storage, read> {name}: array<{name}_word>;`), and
    /// `fn load_{name}(i: u32) -> f32`, element `i` widened exactly to f32, through which the
    /// kernel reads every element.
    pub fn operand(self, name: &str) -> String {
        let (word, body) = match self {
            WeightFormat::F32 => ("f32", format!("return {name}[i];")),
            // bf16 bits << 16 (low half first).
            WeightFormat::Bf16 => {
                ("u32", format!("let w = {name}[i >> 1u];\n    return bitcast<f32>(select(w << 16u, w & 0xffff0000u, (i & 1u) != 0u));"))
            }
            // unpack2x16float: the low half is component 0.
            WeightFormat::F16 => ("u32", format!("return unpack2x16float({name}[i >> 1u])[i & 1u];")),
            WeightFormat::Quantized(q) => {
                let readers = format!(
                    "// Byte `at` of the blocks in `{name}`, and the f16 at the even byte `at`.\n\
                     fn byte_{name}(at: u32) -> u32 {{\n    return ({name}[at >> 2u] >> ((at & 3u) * 8u)) & 255u;\n}}\n\
                     fn f16_{name}(at: u32) -> f32 {{\n    return unpack2x16float({name}[at >> 2u])[(at >> 1u) & 1u];\n}}\n\
                     // A byte as the i8 it stores.\n\
                     fn i8_{name}(b: u32) -> i32 {{\n    return bitcast<i32>(b << 24u) >> 24u;\n}}\n{}\n",
                    match q.needs_wide_readers() {
                        true => format!(
                            "// The u16 at the even byte `at`, and the u32 of the two u16 from it.\n\
                             fn u16_{name}(at: u32) -> u32 {{\n    return ({name}[at >> 2u] >> ((at & 2u) * 8u)) & 0xffffu;\n}}\n\
                             fn u32_{name}(at: u32) -> u32 {{\n    return u16_{name}(at) | (u16_{name}(at + 2u) << 16u);\n}}\n"
                        ),
                        false => String::new(),
                    }
                );
                let decls = q.decls().replace("NAME", name);
                let body = q.load_body().replace("NAME", name);
                return format!(
                    "alias {name}_word = u32;\n\n{readers}{decls}// Element i of the {} operand `{name}` (ggml's dequantization).\nfn load_{name}(i: u32) -> f32 {{\n    {body}\n}}\n",
                    q.name()
                );
            }
        };
        format!(
            "alias {name}_word = {word};\n\n// Element i of the {self:?} operand `{name}`, widened exactly to f32.\nfn load_{name}(i: u32) -> f32 {{\n    {body}\n}}\n"
        )
    }

    /// The tensor-core kernels' fragments for W in this format (see [`CoopW`]): vec4s of f16 as
    /// they are; BF16 pairs in u32 words widened to f32 and rounded to f16 (exact for |w| in f16's
    /// normal range); f32 rounded to f16; ggml blocks dequantized in f32 and rounded to f16
    /// (`QuantFormat::coop_w`; with `panels`, blocks in K panels, as the upload stores them in
    /// planes: `format/planes.rs`).
    pub fn coop_w(self, panels: bool) -> CoopW {
        const FETCH: &str = "fn fetch_w(v: u32) -> W_ELEM {\n    return w[v];\n}\n";
        match self {
            WeightFormat::F16 => vec4_unit(
                "vec4<f16>",
                "vec4<f16>",
                FETCH,
                "fn w16(v: vec4<f16>) -> vec4<f16> {\n    return v;\n}\n",
                "fn pin_w(l: u32, v: vec4<f16>) {\n    pin_h(l, v);\n}\n",
            ),
            WeightFormat::Bf16 => vec4_unit(
                "vec2<u32>",
                "vec2<u32>",
                FETCH,
                "fn w16(v: vec2<u32>) -> vec4<f16> {\n    return vec4<f16>(vec4<f32>(bitcast<f32>(v.x << 16u), bitcast<f32>(v.x & 0xffff0000u), bitcast<f32>(v.y << 16u), bitcast<f32>(v.y & 0xffff0000u)));\n}\n",
                "fn pin_w(l: u32, v: vec2<u32>) {\n    scratch[2u * l] = bitcast<f32>(v.x);\n    scratch[2u * l + 1u] = bitcast<f32>(v.y);\n}\n",
            ),
            WeightFormat::F32 => vec4_unit(
                "vec4<f32>",
                "vec4<f32>",
                FETCH,
                "fn w16(v: vec4<f32>) -> vec4<f16> {\n    return vec4<f16>(v);\n}\n",
                "fn pin_w(l: u32, v: vec4<f32>) {\n    pin_f(l, v);\n}\n",
            ),
            WeightFormat::Quantized(q) if panels && q.planes() => q.coop_w_planes(),
            WeightFormat::Quantized(q) => q.coop_w(),
        }
    }
}

impl WeightFormat {
    /// The W unit of a whole 32-value run along K ([`RUN_VALUES`], see [`CoopW`]), for the
    /// formats that have one (Q8_0, Q5_0, Q4_K); the kernels take it where every invocation
    /// stages whole runs of a step. `panels` as for [`Self::coop_w`].
    pub fn coop_w_run(self, panels: bool) -> Option<CoopW> {
        match self {
            WeightFormat::Quantized(q) if panels && q.planes() => q.coop_w_run_planes(),
            WeightFormat::Quantized(q) => q.coop_w_run(),
            _ => None,
        }
    }

    /// The W unit of half a run (16 values, [`RUN_VALUES`] / 2) of blocks in K panels (`panels`),
    /// for the formats stored there in planes, whose half run is one 16-byte load: the kernels
    /// take it where every invocation stages whole half runs of a step but not whole runs.
    pub fn coop_w_half(self, panels: bool) -> Option<CoopW> {
        match self {
            WeightFormat::Quantized(q) if panels && q.planes() => q.coop_w_half_planes(),
            _ => None,
        }
    }
}

/// `body` (a kernel declaring `var<storage, read> {name}: array<{name}_word>;` and reading it
/// only through `load_{name}`) instantiated for `name` stored as `format`.
pub(crate) fn with_operand(body: &str, name: &str, format: WeightFormat) -> String {
    format!("{}\n{body}", format.operand(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoding_rounds_to_nearest_even_per_format() {
        let values = [1.0f32, 1.0 + 2f32.powi(-9), -65520.0, 3.0e-8];
        let mut out = vec![0u8; 8];
        WeightFormat::F16.encode(&values, &mut out);
        let halves: Vec<u16> = out.chunks_exact(2).map(|b| u16::from_le_bytes([b[0], b[1]])).collect();
        // f16 keeps 10 bits (1 + 2⁻⁹ exact); -65520 is past the overflow threshold; 3e-8 is just
        // over half the smallest subnormal 2⁻²⁴.
        assert_eq!(halves, [0x3C00, 0x3C02, 0xFC00, 0x0001]);
        let mut out = vec![0u8; 8];
        WeightFormat::Bf16.encode(&[1.0 + 2f32.powi(-8), 1.0 + 3.0 * 2f32.powi(-8), -0.0, f32::INFINITY], &mut out);
        let halves: Vec<u16> = out.chunks_exact(2).map(|b| u16::from_le_bytes([b[0], b[1]])).collect();
        // Ties to even: 1 + 2⁻⁸ → 1, 1 + 3·2⁻⁸ → 1 + 2⁻⁶.
        assert_eq!(halves, [0x3F80, 0x3F82, 0x8000, 0x7F80]);
    }

    #[test]
    fn every_operand_fragment_defines_its_word_and_loader() {
        for format in WeightFormat::ALL {
            let f = format.operand("b");
            assert!(f.starts_with("alias b_word = "), "{f}");
            assert!(f.contains("fn load_b(i: u32) -> f32 {"), "{f}");
            assert_eq!(format == WeightFormat::F32, f.contains("alias b_word = f32;"));
        }
    }
}

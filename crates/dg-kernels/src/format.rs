//! Weight storage formats as data. Each [`WeightFormat`] is defined once, here: the bytes an
//! element takes, how the host encodes f32 values into them ([`WeightFormat::encode`], what
//! dg-gpu's packing writes), and the WGSL fragments every kernel that reads weights is
//! instantiated with: [`WeightFormat::operand`] for the portable kernels (element `i` widened to
//! f32) and [`WeightFormat::coop_w`] for the tensor-core ones (four elements at a time as f16).
//! Kernels call the fragments' functions and declare their bindings over the fragments' word
//! types; they are never rewritten per format.
//!
//! The quantized formats ([`QuantFormat`]: ggml's Q8_0, Q5_0, Q4_K, Q6_K) hold a GGUF tensor's
//! blocks as stored, concatenated and padded to a whole word; their loaders dequantize the one
//! element asked for with ggml's `dequantize_row_*` arithmetic (so a value may differ from the
//! host's by the rounding of one fused multiply-add).

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
}

impl QuantFormat {
    pub const ALL: [QuantFormat; 4] = [QuantFormat::Q8_0, QuantFormat::Q5_0, QuantFormat::Q4_K, QuantFormat::Q6_K];

    pub const fn block_len(self) -> usize {
        match self {
            QuantFormat::Q8_0 | QuantFormat::Q5_0 => 32,
            QuantFormat::Q4_K | QuantFormat::Q6_K => 256,
        }
    }

    pub const fn block_bytes(self) -> usize {
        match self {
            QuantFormat::Q8_0 => 34,
            QuantFormat::Q5_0 => 22,
            QuantFormat::Q4_K => 144,
            QuantFormat::Q6_K => 210,
        }
    }

    /// ggml's name of the type (`Q8_0`, ...).
    pub fn name(self) -> &'static str {
        match self {
            QuantFormat::Q8_0 => "Q8_0",
            QuantFormat::Q5_0 => "Q5_0",
            QuantFormat::Q4_K => "Q4_K",
            QuantFormat::Q6_K => "Q6_K",
        }
    }

    /// The body of `fn load_{name}(i: u32) -> f32` over the block bytes in `{name}` (u32 words),
    /// with the byte and f16 readers `byte_{name}`, `f16_{name}` in scope.
    fn load_body(self) -> &'static str {
        match self {
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
/// ring holds one `elem` per four consecutive elements along K (the vec4 `v`: elements `4v ..
/// 4v + 3` of the row-major, or K-panelled, matrix), which `fetch_w(v)` loads as stored (no
/// arithmetic on the loaded words, so the ring's loads stay in flight) and `w16` converts to the
/// f16 vec4 a stage holds as it is staged; `pin_w` parks a prefetched one (F16 in A's stage
/// through `pin_h`, others as f32 words in the scratch) until it is staged (`coop_kloop.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CoopW {
    pub word: &'static str,
    pub elem: &'static str,
    pub fetch: &'static str,
    pub w16: &'static str,
    pub pin_w: &'static str,
}

impl QuantFormat {
    /// The tensor-core fragments of this format (see [`CoopW`]). `fetch_w` loads the words that
    /// hold vec4 `v`'s quants, its block's scales and an index-derived `tag` (never a loaded
    /// value); `w16` dequantizes with ggml's arithmetic in f32 (as [`WeightFormat::operand`]'s
    /// loader) and rounds to f16. A vec4 never straddles a block (blocks are multiples of 4
    /// values). Blocks of 34, 22 and 210 bytes start 2-byte aligned in every other block: those
    /// formats load the two words around an unaligned run and the tag's bit 0 says which half
    /// it starts in.
    fn coop_w(self) -> CoopW {
        match self {
            // Block b at byte 34b: d in half (b & 1) of its word, the 4 quants from byte
            // 34b + 2 + e, 2 bytes into a word when b is even.
            QuantFormat::Q8_0 => CoopW {
                word: "u32",
                elem: "vec4<u32>",
                fetch: "fn fetch_w(v: u32) -> vec4<u32> {
    let i = 4u * v;
    let b = i / 32u;
    let at = b * 34u;
    let s = (at + 2u + i % 32u) >> 2u;
    return vec4<u32>(w[at >> 2u], w[s], w[s + 1u], b & 1u);
}
",
                w16: "fn w16(x: vec4<u32>) -> vec4<f16> {
    let d = unpack2x16float(x.x)[x.w];
    let q = select((x.y >> 16u) | (x.z << 16u), x.y, x.w != 0u);
    let qi = vec4<i32>(bitcast<i32>(q << 24u), bitcast<i32>(q << 16u), bitcast<i32>(q << 8u), bitcast<i32>(q)) >> vec4<u32>(24u);
    return vec4<f16>(vec4<f32>(qi) * d);
}
",
                pin_w: "fn pin_w(l: u32, v: vec4<u32>) {\n    pin_f(l, bitcast<vec4<f32>>(v));\n}\n",
            },
            // Block b at byte 22b (2 bytes into a word when b is odd): d, then 32 high bits (the
            // word after d's when b is odd), then 16 bytes of nibbles from byte 22b + 6 + e % 16 (2 bytes
            // into a word when b is even).
            QuantFormat::Q5_0 => CoopW {
                word: "u32",
                elem: "QW",
                fetch: "struct QW {
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
                w16: "fn w16(x: QW) -> vec4<f16> {
    let odd = (x.tag & 1u) != 0u;
    let e = x.tag >> 1u;
    let d = unpack2x16float(x.h.x)[x.tag & 1u];
    let qh = select((x.h.x >> 16u) | (x.h.y << 16u), x.h.y, odd) >> e;
    let qs = select((x.s0 >> 16u) | (x.s1 << 16u), x.s0, odd);
    let nib = select(qs, qs >> 4u, e >= 16u);
    let low = vec4<u32>(nib, nib >> 8u, nib >> 16u, nib >> 24u) & vec4<u32>(15u);
    let high = (vec4<u32>(qh, qh >> 1u, qh >> 2u, qh >> 3u) & vec4<u32>(1u)) << vec4<u32>(4u);
    return vec4<f16>(vec4<f32>(vec4<i32>(low | high) - vec4<i32>(16)) * d);
}
",
                pin_w: "fn pin_w(l: u32, v: QW) {\n    pin_f(l, bitcast<vec4<f32>>(vec4<u32>(v.h.x ^ v.h.y, v.s0, v.s1, v.tag)));\n}\n",
            },
            // Block b at byte 144b (16-byte aligned): d and dmin, 12 bytes of 6-bit scales and
            // mins, then the nibbles: vec4 e's 4 bytes at 16 + 32·(e / 64) + e % 32, high nibbles
            // for the odd sub-block j = e / 32.
            QuantFormat::Q4_K => CoopW {
                word: "u32",
                elem: "QW",
                fetch: "struct QW {
    q: u32,
    head: vec4<u32>,
    j: u32,
}
fn fetch_w(v: u32) -> QW {
    let i = 4u * v;
    let at = (i / 256u) * 36u;
    let e = i % 256u;
    let head = vec4<u32>(w[at], w[at + 1u], w[at + 2u], w[at + 3u]);
    return QW(w[at + 4u + 8u * (e / 64u) + (e % 32u) / 4u], head, e / 32u);
}
",
                w16: "fn w16(x: QW) -> vec4<f16> {
    let t = 8u * (x.j % 4u);
    var sc: u32;
    var m: u32;
    if (x.j < 4u) {
        sc = (x.head.y >> t) & 63u;
        m = (x.head.z >> t) & 63u;
    } else {
        sc = ((x.head.w >> t) & 15u) | ((((x.head.y >> t) >> 6u) & 3u) << 4u);
        m = (((x.head.w >> t) >> 4u) & 15u) | ((((x.head.z >> t) >> 6u) & 3u) << 4u);
    }
    let dm = unpack2x16float(x.head.x);
    let d1 = dm.x * f32(sc);
    let m1 = dm.y * f32(m);
    let nib = select(x.q, x.q >> 4u, (x.j & 1u) != 0u);
    let q = vec4<u32>(nib, nib >> 8u, nib >> 16u, nib >> 24u) & vec4<u32>(15u);
    return vec4<f16>(d1 * vec4<f32>(q) - m1);
}
",
                pin_w: "fn pin_w(l: u32, v: QW) {\n    pin_f(l, bitcast<vec4<f32>>(v.head ^ vec4<u32>(v.q, v.j, 0u, 0u)));\n}\n",
            },
            // Block b at byte 210b (2 bytes into a word when b is odd): 128 bytes of low nibbles,
            // 64 of high bit pairs, 16 i8 scales, d. Element e: half h = e / 128, quarter k = (e %
            // 128) / 32, l = e % 32; low bits from byte 64h + 32(k & 1) + l (nibble k >> 1), high
            // from 128 + 32h + l (pair k), scale byte 192 + 8h + l / 16 + 2k.
            QuantFormat::Q6_K => CoopW {
                word: "u32",
                elem: "QW",
                fetch: "struct QW {
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
                w16: "fn w16(x: QW) -> vec4<f16> {
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
                pin_w: "fn pin_w(l: u32, v: QW) {\n    pin_f(l, bitcast<vec4<f32>>(vec4<u32>(v.ql.x ^ v.ql.y, v.qh.x ^ v.qh.y, v.sd.x ^ v.sd.y, v.tag)));\n}\n",
            },
        }
    }
}

impl WeightFormat {
    /// Every element format (one value per element: what every kernel reads).
    pub const ELEMENTS: [WeightFormat; 3] = [WeightFormat::F32, WeightFormat::Bf16, WeightFormat::F16];

    /// Every format, the quantized ones included.
    pub const ALL: [WeightFormat; 7] = [
        WeightFormat::F32,
        WeightFormat::Bf16,
        WeightFormat::F16,
        WeightFormat::Quantized(QuantFormat::Q8_0),
        WeightFormat::Quantized(QuantFormat::Q5_0),
        WeightFormat::Quantized(QuantFormat::Q4_K),
        WeightFormat::Quantized(QuantFormat::Q6_K),
    ];

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
    /// f32 (the original names), `_bf16`, `_f16`.
    pub fn suffix(self) -> &'static str {
        match self {
            WeightFormat::F32 => "",
            WeightFormat::Bf16 => "_bf16",
            WeightFormat::F16 => "_f16",
            WeightFormat::Quantized(QuantFormat::Q8_0) => "_q8_0",
            WeightFormat::Quantized(QuantFormat::Q5_0) => "_q5_0",
            WeightFormat::Quantized(QuantFormat::Q4_K) => "_q4_k",
            WeightFormat::Quantized(QuantFormat::Q6_K) => "_q6_k",
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
                     fn i8_{name}(b: u32) -> i32 {{\n    return bitcast<i32>(b << 24u) >> 24u;\n}}\n\n"
                );
                let body = q.load_body().replace("NAME", name);
                return format!(
                    "alias {name}_word = u32;\n\n{readers}// Element i of the {} operand `{name}` (ggml's dequantization).\nfn load_{name}(i: u32) -> f32 {{\n    {body}\n}}\n",
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
    /// (`QuantFormat::coop_w`).
    pub fn coop_w(self) -> CoopW {
        const FETCH: &str = "fn fetch_w(v: u32) -> W_ELEM {\n    return w[v];\n}\n";
        match self {
            WeightFormat::F16 => CoopW {
                word: "vec4<f16>",
                elem: "vec4<f16>",
                fetch: FETCH,
                w16: "fn w16(v: vec4<f16>) -> vec4<f16> {\n    return v;\n}\n",
                pin_w: "fn pin_w(l: u32, v: vec4<f16>) {\n    pin_h(l, v);\n}\n",
            },
            WeightFormat::Bf16 => CoopW {
                word: "vec2<u32>",
                elem: "vec2<u32>",
                fetch: FETCH,
                w16: "fn w16(v: vec2<u32>) -> vec4<f16> {\n    return vec4<f16>(vec4<f32>(bitcast<f32>(v.x << 16u), bitcast<f32>(v.x & 0xffff0000u), bitcast<f32>(v.y << 16u), bitcast<f32>(v.y & 0xffff0000u)));\n}\n",
                pin_w: "fn pin_w(l: u32, v: vec2<u32>) {\n    scratch[2u * l] = bitcast<f32>(v.x);\n    scratch[2u * l + 1u] = bitcast<f32>(v.y);\n}\n",
            },
            WeightFormat::F32 => CoopW {
                word: "vec4<f32>",
                elem: "vec4<f32>",
                fetch: FETCH,
                w16: "fn w16(v: vec4<f32>) -> vec4<f16> {\n    return vec4<f16>(v);\n}\n",
                pin_w: "fn pin_w(l: u32, v: vec4<f32>) {\n    pin_f(l, v);\n}\n",
            },
            WeightFormat::Quantized(q) => q.coop_w(),
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

//! Weight storage formats as data. Each [`WeightFormat`] is defined once, here: the bytes an
//! element takes, how the host encodes f32 values into them ([`WeightFormat::encode`], what
//! dg-gpu's packing writes), and the WGSL fragments every kernel that reads weights is
//! instantiated with: [`WeightFormat::operand`] for the portable kernels (element `i` widened to
//! f32) and [`WeightFormat::coop_w`] for the tensor-core ones (four elements at a time as f16).
//! Kernels call the fragments' functions and declare their bindings over the fragments' word
//! types; they are never rewritten per format.

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
}

/// The tensor-core kernels' view of a W format: W's binding is an array of `elem` (four
/// elements each), `w16` converts one to the f16 vec4 a stage holds, and `pin_w` parks a
/// prefetched one (F16 in A's stage through `pin_h`, others as f32 words through `pin_f` or the
/// scratch) until it is staged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CoopW {
    pub elem: &'static str,
    pub w16: &'static str,
    pub pin_w: &'static str,
}

impl WeightFormat {
    /// Every format.
    pub const ALL: [WeightFormat; 3] = [WeightFormat::F32, WeightFormat::Bf16, WeightFormat::F16];

    /// Bytes per element.
    pub fn bytes(self) -> usize {
        match self {
            WeightFormat::F32 => 4,
            WeightFormat::Bf16 | WeightFormat::F16 => 2,
        }
    }

    /// Suffix of the name of a kernel variant that reads its weights in this format: none for
    /// f32 (the original names), `_bf16`, `_f16`.
    pub fn suffix(self) -> &'static str {
        match self {
            WeightFormat::F32 => "",
            WeightFormat::Bf16 => "_bf16",
            WeightFormat::F16 => "_f16",
        }
    }

    /// `values` encoded into `out` (little-endian, [`Self::bytes`] each, as the device reads them):
    /// f32 as is, BF16 and F16 rounded to nearest, ties to even (the `half` crate's conversions).
    ///
    /// # Panics
    /// When `out` does not hold exactly `values.len()` elements.
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
        };
        format!(
            "alias {name}_word = {word};\n\n// Element i of the {self:?} operand `{name}`, widened exactly to f32.\nfn load_{name}(i: u32) -> f32 {{\n    {body}\n}}\n"
        )
    }

    /// The tensor-core kernels' fragments for W in this format (see [`CoopW`]): vec4s of f16 as
    /// they are; BF16 pairs in u32 words widened to f32 and rounded to f16 (exact for |w| in f16's
    /// normal range); f32 rounded to f16.
    pub fn coop_w(self) -> CoopW {
        match self {
            WeightFormat::F16 => CoopW {
                elem: "vec4<f16>",
                w16: "fn w16(v: vec4<f16>) -> vec4<f16> {\n    return v;\n}\n",
                pin_w: "fn pin_w(l: u32, v: vec4<f16>) {\n    pin_h(l, v);\n}\n",
            },
            WeightFormat::Bf16 => CoopW {
                elem: "vec2<u32>",
                w16: "fn w16(v: vec2<u32>) -> vec4<f16> {\n    return vec4<f16>(vec4<f32>(bitcast<f32>(v.x << 16u), bitcast<f32>(v.x & 0xffff0000u), bitcast<f32>(v.y << 16u), bitcast<f32>(v.y & 0xffff0000u)));\n}\n",
                pin_w: "fn pin_w(l: u32, v: vec2<u32>) {\n    scratch[2u * l] = bitcast<f32>(v.x);\n    scratch[2u * l + 1u] = bitcast<f32>(v.y);\n}\n",
            },
            WeightFormat::F32 => CoopW {
                elem: "vec4<f32>",
                w16: "fn w16(v: vec4<f32>) -> vec4<f16> {\n    return vec4<f16>(v);\n}\n",
                pin_w: "fn pin_w(l: u32, v: vec4<f32>) {\n    pin_f(l, v);\n}\n",
            },
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

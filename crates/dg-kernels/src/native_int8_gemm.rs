//! The int8 mode of the Vulkan-native grouped product of the MoE experts (`DiffusionGemmaMoE`'s
//! `gate_up_proj` and `down_proj`): [`crate::native_grouped_gemm`]'s contract (the same bindings,
//! parameters, K panels, tile table and workgroup tiles) on `s8 × s8 → s32` cooperative matrices,
//! as llama.cpp's MMQ kernels multiply. Each slot's activations are quantized per 32-value block
//! of K to int8 with an f32 scale in the kernel (`dg_cpu::int8::quantize_block_q8_1`), the
//! weights' quants (Q8_0's, Q4_K's unsigned nibbles) enter the fragments as stored, and each
//! block's exact integer sums are scaled by `d_w · d_a` into f32, less Q4_K's min term (the GLSL
//! source, `INT8`, says how):
//!
//! ```text
//! Q8_0: C[s, j] = Σ_b (d_w[j, b] · d_a[s, b]) · Σ_{p in b} q_w[j, p] · q_a[s, p]
//! Q4_K: C[s, j] = Σ_b (d·sc[j, b] · d_a[s, b]) · Σ_{p in b} q_w[j, p] · q_a[s, p] − dmin·m[j, b] · s_a[s, b]
//! ```
//!
//! This changes the numerics (the activations are rounded to 8 bits a value), so it runs only
//! where asked (`Tuning::int8`, `DG_INT8=1`) and the device's driver lists the fragment with 8-bit
//! signed inputs and 32-bit results (wgpu's adapter reports only float fragments: dg-gpu asks the
//! driver).

use crate::coop_gemm::AFormat;
use crate::format::QuantFormat;
use crate::grouped_gemm::GroupedGemmParams;
use crate::native_grouped_gemm::{NativeSource, SLOTS};
use crate::{Access, WeightFormat};

/// An `s8 × s8 → s32` fragment `m × n × k` and the subgroup size a variant is compiled for: the
/// weights' rows on `m`, the slots on `n`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Int8Shape {
    /// Lavapipe's 8 × 8 × 8 (subgroups of 8): four K steps a block.
    I8x8x8,
    /// NVIDIA's 16 × 8 × 32 (subgroups of 32): one K step a block, slots on the 8-wide side.
    I16x8x32,
    /// NVIDIA's 16 × 16 × 32 (subgroups of 32).
    I16x16x32,
}

impl Int8Shape {
    /// Every shape, in the planner's order of preference (narrow slots first).
    pub const ALL: [Int8Shape; 3] = [Int8Shape::I16x8x32, Int8Shape::I16x16x32, Int8Shape::I8x8x8];

    /// `(m, n, k)` of the fragment.
    pub const fn fragment(self) -> (u32, u32, u32) {
        match self {
            Int8Shape::I8x8x8 => (8, 8, 8),
            Int8Shape::I16x8x32 => (16, 8, 32),
            Int8Shape::I16x16x32 => (16, 16, 32),
        }
    }

    /// The subgroup size the variant is compiled for (the device's must be exactly this).
    pub const fn subgroup(self) -> u32 {
        match self {
            Int8Shape::I8x8x8 => 8,
            Int8Shape::I16x8x32 | Int8Shape::I16x16x32 => 32,
        }
    }

    /// Output columns (weight rows) of a workgroup: two fragments' `m`.
    pub const fn cols(self) -> u32 {
        2 * self.fragment().0
    }

    /// Invocations of a workgroup.
    pub const fn workgroup_size(self) -> u32 {
        crate::native_grouped_gemm::SUBGROUPS * self.subgroup()
    }

    /// The label in file and kernel names (`16x8x32`).
    pub const fn label(self) -> &'static str {
        match self {
            Int8Shape::I8x8x8 => "8x8x8",
            Int8Shape::I16x8x32 => "16x8x32",
            Int8Shape::I16x16x32 => "16x16x32",
        }
    }

    const fn bit(self) -> u8 {
        match self {
            Int8Shape::I8x8x8 => 1,
            Int8Shape::I16x8x32 => 2,
            Int8Shape::I16x16x32 => 4,
        }
    }
}

/// The int8 shapes a device runs: a small set, `Copy` for the planner's capabilities.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Int8Shapes(u8);

impl Int8Shapes {
    /// None: the int8 mode is off (the default, or a driver without 8-bit fragments).
    pub const NONE: Int8Shapes = Int8Shapes(0);

    /// These shapes and `shape`.
    pub const fn with(self, shape: Int8Shape) -> Int8Shapes {
        Int8Shapes(self.0 | shape.bit())
    }

    pub const fn contains(self, shape: Int8Shape) -> bool {
        self.0 & shape.bit() != 0
    }

    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The first of [`Int8Shape::ALL`] among these.
    pub fn preferred(self) -> Option<Int8Shape> {
        Int8Shape::ALL.into_iter().find(|&s| self.contains(s))
    }
}

/// The weight formats the int8 mode reads: Q8_0 (integer quants and one scale a 32-value block)
/// and Q4_K (4-bit quants, a scale and a min a 32-value sub-block).
pub const FORMATS: [WeightFormat; 2] = [WeightFormat::Quantized(QuantFormat::Q4_K), WeightFormat::Quantized(QuantFormat::Q8_0)];

/// Values of K a block of activations (and of Q8_0 weights) holds.
pub const BLOCK: u32 = 32;

/// Whether the int8 mode reads experts stored as `w`.
pub fn reads(w: WeightFormat) -> bool {
    FORMATS.contains(&w)
}

/// Whether the int8 kernel of `shape` computes `p` on experts stored as `w`: a format it reads,
/// `n` a multiple of the workgroup's columns, `k` of the format's chunk
/// (`native_grouped_gemm::chunk`: a Q4_K super-block of 256, a Q8_0 block of [`BLOCK`]), `a_rs`
/// and `b_group_stride` multiples of 4 and of the chunk.
pub fn fits(shape: Int8Shape, w: WeightFormat, p: &GroupedGemmParams) -> bool {
    let chunk = crate::native_grouped_gemm::chunk(w);
    reads(w)
        && p.n > 0
        && p.k > 0
        && p.n.is_multiple_of(shape.cols())
        && p.k.is_multiple_of(chunk)
        && p.a_rs.is_multiple_of(4)
        && p.b_group_stride.is_multiple_of(4)
        && p.b_group_stride.is_multiple_of(chunk)
}

/// The dispatch for `p` as [`crate::native_grouped_gemm::params_for`] gives it ([`SLOTS`] rows an
/// m tile, [`Int8Shape::cols`] columns a workgroup).
pub fn workgroups(shape: Int8Shape, p: &GroupedGemmParams) -> [u32; 3] {
    crate::coop_grouped_gemm::workgroups_for(SLOTS, shape.cols(), p)
}

macro_rules! variants {
    ($($shape:literal $w:literal $a:literal),* $(,)?) => {
        &[$(($shape, $w, $a, include_bytes!(concat!("../spirv/native_grouped_gemm_int8_", $shape, "_", $w, "_", $a, ".spv")))),*]
    };
}

/// Every int8 variant `tools/native/build.py` writes: (shape, weights, A, SPIR-V).
const VARIANTS: &[(&str, &str, &str, &[u8])] = variants![
    "8x8x8" "q4_k" "a32", "8x8x8" "q4_k" "a16", "8x8x8" "q8_0" "a32", "8x8x8" "q8_0" "a16",
    "16x8x32" "q4_k" "a32", "16x8x32" "q4_k" "a16", "16x8x32" "q8_0" "a32", "16x8x32" "q8_0" "a16",
    "16x16x32" "q4_k" "a32", "16x16x32" "q4_k" "a16", "16x16x32" "q8_0" "a32", "16x16x32" "q8_0" "a16",
];

fn w_label(w: WeightFormat) -> &'static str {
    match w {
        WeightFormat::Quantized(QuantFormat::Q8_0) => "q8_0",
        WeightFormat::Quantized(QuantFormat::Q4_K) => "q4_k",
        other => panic!("the int8 grouped product does not read {other:?}"),
    }
}

/// The int8 variant of `shape` for experts stored as `w` and A as `a`.
///
/// # Panics
/// Where the mode does not read `w` ([`reads`]).
pub fn source(shape: Int8Shape, w: WeightFormat, a: AFormat) -> NativeSource {
    let (s, wl) = (shape.label(), w_label(w));
    let al = match a {
        AFormat::F32 => "a32",
        AFormat::F16 => "a16",
    };
    let spirv = VARIANTS.iter().find(|v| (v.0, v.1, v.2) == (s, wl, al)).map(|v| v.3).expect("every variant is embedded");
    NativeSource {
        name: format!("native_grouped_gemm_int8_{s}_{wl}_{al}"),
        spirv,
        entry: "main",
        workgroup_size: [shape.workgroup_size(), 1, 1],
        buffers: vec![Access::Read, Access::Read, Access::Read, Access::Read, Access::ReadWrite],
        params_size: size_of::<GroupedGemmParams>() as u64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_variant_is_embedded_spirv() {
        for shape in Int8Shape::ALL {
            for w in FORMATS {
                for a in [AFormat::F32, AFormat::F16] {
                    let source = source(shape, w, a);
                    let magic = source.spirv.get(..4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
                    assert_eq!(magic, Some(0x0723_0203), "{}: not SPIR-V", source.name);
                }
            }
        }
        assert_eq!(VARIANTS.len(), Int8Shape::ALL.len() * FORMATS.len() * 2, "a variant no key names");
    }

    #[test]
    fn the_real_experts_fit_and_other_formats_do_not() {
        let (gate_up, down) = GroupedGemmParams::real_experts();
        let (q4, q8) = (FORMATS[0], FORMATS[1]);
        for shape in Int8Shape::ALL {
            assert!(fits(shape, q8, &gate_up) && fits(shape, q8, &down) && fits(shape, q4, &gate_up));
            // 704 is no multiple of a Q4_K super-block.
            assert!(!fits(shape, q4, &down));
            assert!(!fits(shape, WeightFormat::Quantized(QuantFormat::Q6_K), &gate_up));
            assert!(!fits(shape, WeightFormat::F16, &down));
            assert!(!fits(shape, q8, &GroupedGemmParams { n: 8, ..down }));
            assert!(!fits(shape, q8, &GroupedGemmParams { k: 48, ..down }));
        }
        let nvidia = Int8Shapes::NONE.with(Int8Shape::I16x16x32).with(Int8Shape::I16x8x32);
        assert_eq!(nvidia.preferred(), Some(Int8Shape::I16x8x32));
        assert_eq!(Int8Shapes::NONE.with(Int8Shape::I8x8x8).preferred(), Some(Int8Shape::I8x8x8));
        assert_eq!(Int8Shapes::NONE.preferred(), None);
    }
}

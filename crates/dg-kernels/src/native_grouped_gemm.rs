//! The Vulkan-native grouped product of the MoE experts (`DiffusionGemmaMoE`'s `gate_up_proj` and
//! `down_proj`) for short groups: [`crate::coop_grouped_gemm`]'s contract (the same bindings,
//! [`GroupedGemmParams`], experts in K panels, the dispatch's tile table), compiled from GLSL
//! (`glsl/native_grouped_gemm.comp`) to SPIR-V by the pinned glslang (`tools/native/build.py`)
//! and handed to the driver past WGSL. What WGSL cannot say and this kernel does (the arrangement
//! of Marlin's 4-bit kernels, on Vulkan's cooperative matrices):
//!
//! - non-square fragments with the slots on the narrow side ([`NativeShape::F16x8x16`]: 16 weight
//!   rows × 8 slots), so a group of 4 slots (a 64-token canvas over 128 experts, top-8) wastes 4
//!   of 8 columns rather than 12 of 16;
//! - K split across the workgroup's subgroups, each through whole K chunks (a 256-value
//!   super-block of Q4_K and Q6_K) in its own workgroup memory: no workgroup barrier in the K loop,
//!   one reduction after it;
//! - each weight byte loaded once, by the invocation that dequantizes its 32-value run straight
//!   into the subgroup's f16 tile.
//!
//! ```text
//! C[s, j] = Σ_p f16(A[row(s), p]) · W[e, j, p]     for every slot s of expert e
//! ```
//!
//! A workgroup computes [`NativeShape::cols`] output columns (2 fragments of weight rows) for
//! [`SLOTS`] slots (one m tile of the tile table) in [`SUBGROUPS`] subgroups. Each shape is one
//! SPIR-V variant per weight and activation format, picked by the planner where the adapter lists
//! the shape (`dg_gpu::planner::experts`); WGSL's [`crate::coop_grouped_gemm`] stays the kernel
//! everywhere else.

use crate::coop_gemm::AFormat;
use crate::coop_grouped_gemm::{params_for_rows, workgroups_for};
use crate::format::QuantFormat;
use crate::grouped_gemm::GroupedGemmParams;
use crate::{Access, WeightFormat};

/// The slots of one workgroup's m tile: the decoder's expert tiles' rows, so that a layer's
/// gate/up and down share the dispatch's tile table whichever kernel runs them.
pub const SLOTS: u32 = 32;

/// Subgroups a workgroup splits K across.
pub const SUBGROUPS: u32 = 4;

/// A cooperative-matrix fragment `m × n × k` (f16 inputs, f32 accumulation) and the subgroup size
/// a variant is compiled for: the weights' rows on `m`, the slots on `n`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NativeShape {
    /// Lavapipe's only fragment (subgroups of 8).
    F8x8x8,
    /// NVIDIA's 16 × 8 × 16 (subgroups of 32): slots on the 8-wide side.
    F16x8x16,
    /// NVIDIA's square 16 × 16 × 16 (subgroups of 32).
    F16x16x16,
}

impl NativeShape {
    /// Every shape, in the planner's order of preference (narrow slots first).
    pub const ALL: [NativeShape; 3] = [NativeShape::F16x8x16, NativeShape::F16x16x16, NativeShape::F8x8x8];

    /// `(m, n, k)` of the fragment.
    pub const fn fragment(self) -> (u32, u32, u32) {
        match self {
            NativeShape::F8x8x8 => (8, 8, 8),
            NativeShape::F16x8x16 => (16, 8, 16),
            NativeShape::F16x16x16 => (16, 16, 16),
        }
    }

    /// The subgroup size the variant is compiled for (the device's must be exactly this).
    pub const fn subgroup(self) -> u32 {
        match self {
            NativeShape::F8x8x8 => 8,
            NativeShape::F16x8x16 | NativeShape::F16x16x16 => 32,
        }
    }

    /// Output columns (weight rows) of a workgroup: two fragments' `m`.
    pub const fn cols(self) -> u32 {
        2 * self.fragment().0
    }

    /// Invocations of a workgroup.
    pub const fn workgroup_size(self) -> u32 {
        SUBGROUPS * self.subgroup()
    }

    /// The label in file and kernel names (`16x8x16`).
    pub const fn label(self) -> &'static str {
        match self {
            NativeShape::F8x8x8 => "8x8x8",
            NativeShape::F16x8x16 => "16x8x16",
            NativeShape::F16x16x16 => "16x16x16",
        }
    }

    const fn bit(self) -> u8 {
        match self {
            NativeShape::F8x8x8 => 1,
            NativeShape::F16x8x16 => 2,
            NativeShape::F16x16x16 => 4,
        }
    }
}

/// The shapes a device runs (its adapter lists the fragment with f16 inputs and f32 results, its
/// subgroups are the shape's size, and it takes SPIR-V): a small set, `Copy` for the planner's
/// capabilities.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct NativeShapes(u8);

impl NativeShapes {
    /// None: the native kernels are off (any adapter but Vulkan, or `DG_NATIVE=0`).
    pub const NONE: NativeShapes = NativeShapes(0);

    /// These shapes and `shape`.
    pub const fn with(self, shape: NativeShape) -> NativeShapes {
        NativeShapes(self.0 | shape.bit())
    }

    pub const fn contains(self, shape: NativeShape) -> bool {
        self.0 & shape.bit() != 0
    }

    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The first of [`NativeShape::ALL`] among these.
    pub fn preferred(self) -> Option<NativeShape> {
        NativeShape::ALL.into_iter().find(|&s| self.contains(s))
    }
}

/// The weight formats the kernel reads: F16 and the types of `q4_k_m` and `q8_0` experts (Q4_K,
/// Q6_K, Q8_0), all in K panels as [`crate::coop_grouped_gemm`] reads them.
pub const FORMATS: [WeightFormat; 4] = [
    WeightFormat::F16,
    WeightFormat::Quantized(QuantFormat::Q4_K),
    WeightFormat::Quantized(QuantFormat::Q6_K),
    WeightFormat::Quantized(QuantFormat::Q8_0),
];

/// Whether the kernel reads experts stored as `w`.
pub fn reads(w: WeightFormat) -> bool {
    FORMATS.contains(&w)
}

/// The K values a subgroup takes whole: one block of a quantized format (a K-quant's 256-value
/// super-block), 32 of F16 (a K panel). `k` must be a multiple of it.
pub fn chunk(w: WeightFormat) -> u32 {
    match w {
        WeightFormat::Quantized(q) => q.block_len() as u32,
        _ => 32,
    }
}

/// Whether the kernel of `shape` computes `p` on experts stored as `w`: a format it reads, `n` a
/// multiple of the workgroup's columns, `k` of the format's [`chunk`], `a_rs` and
/// `b_group_stride` multiples of 4 and of the chunk (whole panels and blocks per expert).
pub fn fits(shape: NativeShape, w: WeightFormat, p: &GroupedGemmParams) -> bool {
    let chunk = chunk(w);
    reads(w)
        && p.n > 0
        && p.k > 0
        && p.n.is_multiple_of(shape.cols())
        && p.k.is_multiple_of(chunk)
        && p.a_rs.is_multiple_of(4)
        && p.b_group_stride.is_multiple_of(4)
        && p.b_group_stride.is_multiple_of(chunk)
}

/// `p` as the kernel runs it: with the tile table where its m tiles are [`SLOTS`] rows.
pub fn params_for(p: &GroupedGemmParams) -> GroupedGemmParams {
    params_for_rows(SLOTS, p)
}

/// The dispatch for `p` as [`params_for`] gives it.
pub fn workgroups(shape: NativeShape, p: &GroupedGemmParams) -> [u32; 3] {
    workgroups_for(SLOTS, shape.cols(), p)
}

/// A native kernel as the device compiles it: SPIR-V in place of [`crate::KernelSource`]'s WGSL,
/// the same binding convention (the uniform parameters at binding 0, storage buffers after it).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NativeSource {
    pub name: String,
    /// The module, as glslang wrote it (little-endian words).
    pub spirv: &'static [u8],
    pub entry: &'static str,
    pub workgroup_size: [u32; 3],
    /// Storage bindings `1..=n`.
    pub buffers: Vec<Access>,
    /// Size in bytes of the uniform parameter struct at binding 0.
    pub params_size: u64,
}

macro_rules! variants {
    ($($shape:literal $w:literal $a:literal),* $(,)?) => {
        &[$(($shape, $w, $a, include_bytes!(concat!("../spirv/native_grouped_gemm_", $shape, "_", $w, "_", $a, ".spv")))),*]
    };
}

/// Every variant `tools/native/build.py` writes: (shape, weights, A, SPIR-V).
const VARIANTS: &[(&str, &str, &str, &[u8])] = variants![
    "8x8x8" "f16" "a32", "8x8x8" "f16" "a16", "8x8x8" "q4_k" "a32", "8x8x8" "q4_k" "a16",
    "8x8x8" "q6_k" "a32", "8x8x8" "q6_k" "a16", "8x8x8" "q8_0" "a32", "8x8x8" "q8_0" "a16",
    "16x8x16" "f16" "a32", "16x8x16" "f16" "a16", "16x8x16" "q4_k" "a32", "16x8x16" "q4_k" "a16",
    "16x8x16" "q6_k" "a32", "16x8x16" "q6_k" "a16", "16x8x16" "q8_0" "a32", "16x8x16" "q8_0" "a16",
    "16x16x16" "f16" "a32", "16x16x16" "f16" "a16", "16x16x16" "q4_k" "a32", "16x16x16" "q4_k" "a16",
    "16x16x16" "q6_k" "a32", "16x16x16" "q6_k" "a16", "16x16x16" "q8_0" "a32", "16x16x16" "q8_0" "a16",
];

fn w_label(w: WeightFormat) -> &'static str {
    match w {
        WeightFormat::F16 => "f16",
        WeightFormat::Quantized(QuantFormat::Q4_K) => "q4_k",
        WeightFormat::Quantized(QuantFormat::Q6_K) => "q6_k",
        WeightFormat::Quantized(QuantFormat::Q8_0) => "q8_0",
        other => panic!("the native grouped product does not read {other:?}"),
    }
}

fn a_label(a: AFormat) -> &'static str {
    match a {
        AFormat::F32 => "a32",
        AFormat::F16 => "a16",
    }
}

/// The variant of `shape` for experts stored as `w` and A as `a`.
///
/// # Panics
/// Where the kernel does not read `w` ([`reads`]).
pub fn source(shape: NativeShape, w: WeightFormat, a: AFormat) -> NativeSource {
    let (s, wl, al) = (shape.label(), w_label(w), a_label(a));
    let spirv = VARIANTS.iter().find(|v| (v.0, v.1, v.2) == (s, wl, al)).map(|v| v.3).expect("every variant is embedded");
    NativeSource {
        name: format!("native_grouped_gemm_{s}_{wl}_{al}"),
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
        for shape in NativeShape::ALL {
            for w in FORMATS {
                for a in [AFormat::F32, AFormat::F16] {
                    let source = source(shape, w, a);
                    let magic = source.spirv.get(..4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
                    assert_eq!(magic, Some(0x0723_0203), "{}: not SPIR-V", source.name);
                    assert!(source.spirv.len().is_multiple_of(4), "{}: not whole words", source.name);
                }
            }
        }
        assert_eq!(VARIANTS.len(), NativeShape::ALL.len() * FORMATS.len() * 2, "a variant no key names");
    }

    #[test]
    fn the_real_experts_fit_and_odd_ones_do_not() {
        let (gate_up, down) = GroupedGemmParams::real_experts();
        let (q4, q6, q8) = (FORMATS[1], FORMATS[2], FORMATS[3]);
        for shape in NativeShape::ALL {
            assert!(fits(shape, q4, &gate_up) && fits(shape, WeightFormat::F16, &down) && fits(shape, q8, &down));
            // 704 is no multiple of a K-quant's super-block (q4_k_m stores that down projection
            // in a 32-value type).
            assert!(!fits(shape, q6, &down));
            assert!(!fits(shape, WeightFormat::Quantized(QuantFormat::Q5_0), &down));
            assert!(!fits(shape, WeightFormat::F16, &GroupedGemmParams { n: 8, ..down }));
        }
        let p = GroupedGemmParams { tiles: 6, tile_rows: 32, ..gate_up };
        assert_eq!(params_for(&p).tiles, 6);
        assert_eq!(params_for(&GroupedGemmParams { tile_rows: 64, ..p }).tiles, 0);
        assert_eq!(workgroups(NativeShape::F16x8x16, &p), [6 * 1408 / 32, 1, 1]);
    }

    #[test]
    fn shapes_prefer_narrow_slots() {
        let nvidia = NativeShapes::NONE.with(NativeShape::F16x16x16).with(NativeShape::F16x8x16);
        assert_eq!(nvidia.preferred(), Some(NativeShape::F16x8x16));
        assert_eq!(NativeShapes::NONE.with(NativeShape::F8x8x8).preferred(), Some(NativeShape::F8x8x8));
        assert_eq!(NativeShapes::NONE.preferred(), None);
    }
}

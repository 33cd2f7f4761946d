//! dg-kernels: the WGSL compute kernels of dg, one op per `.wgsl` file, with the `#[repr(C)]`
//! parameter structs they read and the tile tables of their variants.
//!
//! Binding convention, shared by every kernel so that dg-gpu can build layouts generically:
//! `@group(0) @binding(0)` is a uniform holding the kernel's parameter struct (bound with a
//! dynamic offset into one shared uniform buffer), and bindings `1..=n` are storage buffers in
//! the order of [`KernelSource::buffers`]. Every rendering is plain WGSL that naga validates
//! offline (see the tests).

pub mod axpby;
pub mod bf16;
pub mod coop_gemm;
pub mod coop_grouped_gemm;
pub mod coop_kloop;
pub mod embed;
pub mod gelu_glu;
pub mod gemm;
pub mod grouped_gemm;
pub mod moe_combine;
pub mod moe_dispatch;
pub mod norm_rope;
pub mod residual_norms;
pub mod rmsnorm;
pub mod rope;
pub mod router_topk;
pub mod row_reduce;
pub mod sample_rows;
pub mod softmax;
pub mod softmax_chunked;
pub mod split_k;

pub use bf16::{pack_bf16, pack_f16, unpack_bf16, unpack_f16};

/// Every kernel variant dg may compile (validated offline by naga in the tests).
pub fn all_variants() -> Vec<KernelSource> {
    vec![
        rope::source(),
        gelu_glu::split(),
        gelu_glu::fused(),
        gelu_glu::fused_lanes(4, false),
        gelu_glu::pair(false),
        gelu_glu::pair_lanes(false, 4),
        gelu_glu::fused_half(),
        gelu_glu::fused_lanes(4, true),
        gelu_glu::pair(true),
        gelu_glu::pair_lanes(true, 4),
        embed::source(),
        embed::source_for(WeightFormat::Bf16),
        embed::source_for(WeightFormat::F16),
        axpby::source(),
        moe_dispatch::source(),
        moe_combine::source(),
        moe_combine::source_for(4),
        sample_rows::source(),
        split_k::source(),
    ]
    .into_iter()
    .chain(row_reduce::RowReduce::ALL.into_iter().flat_map(|r| {
        [
            rmsnorm::source(r),
            rmsnorm::source_lanes(r, 4),
            softmax::source(r),
            softmax::source_lanes(r, 4),
            softmax_chunked::partials(r),
            softmax_chunked::apply(r),
            router_topk::source(r),
            norm_rope::source(r),
            norm_rope::source_lanes(r, 4),
            residual_norms::source_attention(r),
            residual_norms::source_attention_lanes(r, 4),
            residual_norms::source_attention_half(r),
            residual_norms::source_ffn(r),
            residual_norms::source_ffn_lanes(r, 4),
            residual_norms::source_ffn_combine_lanes(r, 1),
            residual_norms::source_ffn_combine_lanes(r, 4),
        ]
    }))
    .chain(gemm::TILES.iter().map(|&t| gemm::source(t)))
    .chain(gemm::TILES.iter().map(|&t| gemm::source_for(t, WeightFormat::Bf16)))
    .chain(gemm::TILES.iter().map(|&t| gemm::source_for(t, WeightFormat::F16)))
    .chain(grouped_gemm::TILES.iter().map(|&t| grouped_gemm::source(t)))
    .chain(grouped_gemm::TILES.iter().map(|&t| grouped_gemm::source_for(t, WeightFormat::Bf16)))
    .chain(grouped_gemm::TILES.iter().map(|&t| grouped_gemm::source_for(t, WeightFormat::F16)))
    .collect()
}

/// How a weight matrix is stored on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum WeightFormat {
    /// One f32 per element.
    #[default]
    F32,
    /// BF16, two per u32 word: element `i` in bits `16·(i & 1) .. 16·(i & 1) + 16` of word `i >> 1`
    /// (little-endian pairs, the checkpoint's own bytes). Unpacked in the shader as `bits << 16`,
    /// exact; arithmetic stays f32.
    Bf16,
    /// IEEE binary16, the same pair packing as [`WeightFormat::Bf16`] (element `i` in bits
    /// `16·(i & 1) ..` of word `i >> 1`; the layout the tensor-core kernel
    /// [`crate::coop_gemm`] reads). Rounded from f32 to the nearest f16, ties to even
    /// ([`pack_f16`]): values beyond ±65504, the largest f16, become ±∞ (from 65520 in magnitude,
    /// halfway to the next power of two), values below 2⁻¹⁴ in magnitude become f16 subnormals
    /// (multiples of 2⁻²⁴; ±0 up to 2⁻²⁵), and a NaN stays a NaN.
    /// Unpacked in the shader with `unpack2x16float`, exact for every f16 (see [`crate::bf16`]);
    /// arithmetic stays f32.
    F16,
}

impl WeightFormat {
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
}

/// How a kernel uses one of its storage buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Access {
    Read,
    ReadWrite,
}

/// One compilable kernel variant: WGSL source, entry point and storage-buffer accesses.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct KernelSource {
    /// Unique name of this variant (op name plus its tile parameters).
    pub name: String,
    pub wgsl: String,
    pub entry: &'static str,
    /// Storage bindings `1..=n`.
    pub buffers: Vec<Access>,
    /// Size in bytes of the uniform parameter struct at binding 0.
    pub params_size: u64,
}

/// Columns a row kernel takes at a time (its `LANES`: rows viewed as vec4s) for rows whose
/// widths, offsets and strides are `values`: 4 where every one is a multiple of 4, else 1.
pub fn lanes_for(values: &[u32]) -> u32 {
    if values.iter().all(|v| v.is_multiple_of(4)) { 4 } else { 1 }
}

/// Renders a const prelude (`const NAME: u32 = value;` lines) in front of a kernel body.
pub fn with_prelude(consts: &[(&str, u32)], body: &str) -> String {
    let mut s = String::new();
    for (name, value) in consts {
        s.push_str(&format!("const {name}: u32 = {value}u;\n"));
    }
    s.push_str(body);
    s
}

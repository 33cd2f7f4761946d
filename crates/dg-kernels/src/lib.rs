//! dg-kernels: the WGSL compute kernels of dg, one op per `.wgsl` file, with the `#[repr(C)]`
//! parameter structs they read and the tile tables of their variants.
//!
//! Binding convention, shared by every kernel so that dg-gpu can build layouts generically:
//! `@group(0) @binding(0)` is a uniform holding the kernel's parameter struct (bound with a
//! dynamic offset into one shared uniform buffer), and bindings `1..=n` are storage buffers in
//! the order of [`KernelSource::buffers`]. Every variant has a typed [`KernelKey`]; every key's
//! rendering is plain WGSL that naga validates offline (see the tests), but for the Vulkan-native
//! kernels' ([`native_grouped_gemm`]): SPIR-V compiled from `glsl/` by the pinned glslang
//! (`tools/native/build.py`), committed in `spirv/` and embedded, the same binding convention.

pub mod axpby;
pub mod bf16;
pub mod coop_gemm;
pub mod coop_grouped_gemm;
pub mod coop_kloop;
pub mod embed;
pub mod format;
pub mod gelu_glu;
pub mod gemm;
pub mod grouped_gemm;
pub mod key;
pub mod moe_combine;
pub mod moe_dispatch;
pub mod native_grouped_gemm;
pub mod native_int8_gemm;
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
pub use format::WeightFormat;
pub use key::{CoopGemmKey, KernelKey, Lanes};

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

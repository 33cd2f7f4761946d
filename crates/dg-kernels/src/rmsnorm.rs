//! RMSNorm (`DiffusionGemmaRMSNorm`): weighted or weightless, optionally fused with the residual
//! add and the layer scalar. Also the per-head q/k/v norms (rows = tokens × heads).

use bytemuck::{Pod, Zeroable};

use crate::row_reduce::{Part, RowReduce};
use crate::{Access, KernelSource, with_prelude};

/// Workgroup size (one workgroup per row).
pub const WORKGROUP: u32 = 256;
/// `flags` bit: multiply by the weight.
pub const WEIGHTED: u32 = 1;
/// `flags` bit: add to the previous contents of the output (residual add).
pub const ACCUMULATE: u32 = 2;

/// Uniform parameters of `rmsnorm.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable, PartialEq)]
pub struct RmsNormParams {
    pub rows: u32,
    pub dim: u32,
    pub eps: f32,
    pub flags: u32,
    pub scale: f32,
    /// More than 1 when `x` holds that many split-K partials, `split_stride` elements apart
    /// (`crate::split_k::with_reader`).
    pub splits: u32,
    pub split_stride: u32,
    /// Elements before row 0 of `x` (and of each partial).
    pub x_offset: u32,
    /// Elements before row 0 of `out`.
    pub out_offset: u32,
    pub _pad: [u32; 3],
}

/// Bindings: `x` (read, or the split-K partials of the product it would hold), `w` (read; any
/// buffer when unweighted), `out` (read-write). Reduced with `reduce` (`crate::row_reduce`).
pub fn source(reduce: RowReduce) -> KernelSource {
    let body = reduce.render(include_str!("wgsl/rmsnorm.wgsl"), &[Part::Sum("f32")]);
    KernelSource {
        name: format!("rmsnorm{}", reduce.suffix()),
        wgsl: with_prelude(&[("WG", WORKGROUP)], &crate::split_k::with_reader(&body, "x_at", "x")),
        entry: "main",
        buffers: vec![Access::Read, Access::Read, Access::ReadWrite],
        params_size: size_of::<RmsNormParams>() as u64,
    }
}

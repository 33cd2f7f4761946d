//! RMSNorm (`DiffusionGemmaRMSNorm`): weighted or weightless, optionally fused with the residual
//! add and the layer scalar. Also the per-head q/k/v norms (rows = tokens × heads).

use bytemuck::{Pod, Zeroable};

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
    pub _pad: [u32; 3],
}

/// Bindings: `x` (read), `w` (read; any buffer when unweighted), `out` (read-write).
pub fn source() -> KernelSource {
    KernelSource {
        name: "rmsnorm".into(),
        wgsl: with_prelude(&[("WG", WORKGROUP)], include_str!("wgsl/rmsnorm.wgsl")),
        entry: "main",
        buffers: vec![Access::Read, Access::Read, Access::ReadWrite],
        params_size: size_of::<RmsNormParams>() as u64,
    }
}

//! `dst[dst_offset + i] = src[src_offset + i]` for `i < n`: the encoder's append of new K/V rows
//! into the GPU-resident KV cache (`DynamicCache.update`), inside a compute pass.

use bytemuck::{Pod, Zeroable};

use crate::{Access, KernelSource, with_prelude};

/// Invocations per workgroup (one element each).
pub const WORKGROUP: u32 = 256;

/// Uniform parameters of `copy.wgsl` (offsets and length in elements).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable, PartialEq)]
pub struct CopyParams {
    pub n: u32,
    pub src_offset: u32,
    pub dst_offset: u32,
    pub _pad: u32,
}

/// Workgroups to dispatch (fold through `groups_1d`).
pub fn workgroups(p: &CopyParams) -> u32 {
    p.n.div_ceil(WORKGROUP)
}

/// Bindings: `src` (read), `dst` (read-write).
pub fn source() -> KernelSource {
    KernelSource {
        name: "copy".into(),
        wgsl: with_prelude(&[("WG", WORKGROUP)], include_str!("wgsl/copy.wgsl")),
        entry: "main",
        buffers: vec![Access::Read, Access::ReadWrite],
        params_size: size_of::<CopyParams>() as u64,
    }
}

//! `out = out·beta + x·alpha`, element-wise (the self-conditioning add `e + sc_signal`, scaled
//! copies). With `beta == 0` the previous contents of `out` are not read (BLAS convention), so an
//! uninitialised output cannot leak NaN.

use bytemuck::{Pod, Zeroable};

use crate::{Access, KernelSource, with_prelude};

/// Invocations per workgroup (one element each).
pub const WORKGROUP: u32 = 256;

/// Uniform parameters of `axpby.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable, PartialEq)]
pub struct AxpbyParams {
    /// Elements.
    pub n: u32,
    pub alpha: f32,
    pub beta: f32,
    pub _pad: u32,
}

/// Workgroups to dispatch (fold through `groups_1d`).
pub fn workgroups(p: &AxpbyParams) -> u32 {
    p.n.div_ceil(WORKGROUP)
}

/// Bindings: `x` (read, `[n]`), `out` (read-write, `[n]`).
pub fn source() -> KernelSource {
    KernelSource {
        name: "axpby".into(),
        wgsl: with_prelude(&[("WG", WORKGROUP)], include_str!("wgsl/axpby.wgsl")),
        entry: "main",
        buffers: vec![Access::Read, Access::ReadWrite],
        params_size: size_of::<AxpbyParams>() as u64,
    }
}

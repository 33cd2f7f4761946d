//! `out = out·beta + x·alpha`, element-wise (the self-conditioning add `e + sc_signal`, scaled
//! copies). With `beta == 0` the previous contents of `out` are not read (BLAS convention), so an
//! uninitialised output cannot leak NaN. The scaled variant ([`source_scaled`]) multiplies `x`'s
//! rows of `row` elements by `scale[row]` first: the self-conditioning MLP's down projection ran
//! on rows scaled by `crate::gelu_glu::fused_scaled`.

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
    /// Elements a row of `x` (the scaled variant's rows; ignored by the plain one).
    pub row: u32,
}

/// Workgroups to dispatch (fold through `groups_1d`).
pub fn workgroups(p: &AxpbyParams) -> u32 {
    p.n.div_ceil(WORKGROUP)
}

/// Bindings: `x` (read, `[n]`), `out` (read-write, `[n]`).
pub fn source() -> KernelSource {
    KernelSource {
        name: "axpby".into(),
        wgsl: with_prelude(&[("WG", WORKGROUP)], &include_str!("wgsl/axpby.wgsl").replace("//@SCALE\n", "")),
        entry: "main",
        buffers: vec![Access::Read, Access::ReadWrite],
        params_size: size_of::<AxpbyParams>() as u64,
    }
}

/// Bindings: `x` (read, `[n]`), `out` (read-write, `[n]`), `scale` (read, `[n / row]`):
/// `out = out·beta + (x·scale[row of x])·alpha`.
pub fn source_scaled() -> KernelSource {
    let wgsl = include_str!("wgsl/axpby.wgsl")
        .replace("var y = x[i] * p.alpha;", "var y = (x[i] * scale[i / p.row]) * p.alpha;")
        .replace("//@SCALE\n", "@group(0) @binding(3) var<storage, read> scale: array<f32>;\n");
    KernelSource {
        name: "axpby_scaled".into(),
        wgsl: with_prelude(&[("WG", WORKGROUP)], &wgsl),
        entry: "main",
        buffers: vec![Access::Read, Access::ReadWrite, Access::Read],
        params_size: size_of::<AxpbyParams>() as u64,
    }
}

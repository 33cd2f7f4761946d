//! `out = out·beta + x·alpha`, element-wise (the self-conditioning add `e + sc_signal`, scaled
//! copies). With `beta == 0` the previous contents of `out` are not read (BLAS convention), so an
//! uninitialised output cannot leak NaN. The scaled variant ([`source_scaled`]) multiplies `x`'s
//! rows of `row` elements by `scale[row]` first: the self-conditioning MLP's down projection ran
//! on rows scaled by `crate::gelu_glu::fused_scaled`. The gated variants ([`source_gated`]) leave
//! `out` untouched on the rows whose gate is 0: a batched forward adds the self-conditioning
//! signal to the canvases that take it only.

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

/// [`source`] (`scaled`: [`source_scaled`]) on the rows of `row` elements whose gate is non-zero;
/// the other rows of `out` are not written. Bindings: `x`, `out`, with `scaled` `scale` (read,
/// `[n / row]`), then `gate` (read, u32 `[n / row]`). The rows written get the ungated kernel's
/// bits.
pub fn source_gated(scaled: bool) -> KernelSource {
    let base = if scaled { source_scaled() } else { source() };
    let gate_binding = base.buffers.len() + 1;
    let wgsl = base
        .wgsl
        .replace("    if (i >= p.n) {\n        return;\n    }\n", "    if (i >= p.n || gate[i / p.row] == 0u) {\n        return;\n    }\n")
        .replace(
            "@group(0) @binding(2) var<storage, read_write> out: array<f32>;\n",
            &format!(
                "@group(0) @binding(2) var<storage, read_write> out: array<f32>;\n@group(0) @binding({gate_binding}) var<storage, read> gate: array<u32>;\n"
            ),
        );
    let mut buffers = base.buffers;
    buffers.push(Access::Read);
    KernelSource { name: format!("{}_gated", base.name), wgsl, entry: "main", buffers, params_size: base.params_size }
}

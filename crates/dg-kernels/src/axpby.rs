//! `out = out·beta + x·alpha`, element-wise (the self-conditioning add `e + sc_signal`, scaled
//! copies). With `beta == 0` the previous contents of `out` are not read (BLAS convention), so an
//! uninitialised output cannot leak NaN. Its [`Variant`]s: scaled multiplies `x`'s rows of `row`
//! elements by `scale[row]` first (the self-conditioning MLP's down projection ran on rows scaled
//! by `crate::gelu_glu::fused_scaled`); gated leaves `out` untouched on the rows whose gate is 0
//! (a batched forward adds the self-conditioning signal to the canvases that take it only).

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

/// What an axpby does to rows of `row` elements besides `out = out·beta + x·alpha`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Variant {
    /// `x`'s rows multiplied by their factors in `scale` first (a scaled input's product).
    pub scaled: bool,
    /// Only the rows whose u32 `gate` is non-zero written; the other rows of `out` keep their
    /// values, and the rows written get the ungated kernel's bits.
    pub gated: bool,
}

impl Variant {
    /// The plain element-wise kernel.
    pub const PLAIN: Variant = Variant { scaled: false, gated: false };
    pub const ALL: [Variant; 4] = [
        Variant::PLAIN,
        Variant { scaled: true, gated: false },
        Variant { scaled: false, gated: true },
        Variant { scaled: true, gated: true },
    ];
}

/// Bindings: `x` (read, `[n]`), `out` (read-write, `[n]`), then with `scaled` `scale` (read,
/// `[n / row]`: `out = out·beta + (x·scale[row of x])·alpha`), then with `gated` `gate` (read,
/// u32 `[n / row]`).
pub fn source(variant: Variant) -> KernelSource {
    let mut wgsl = include_str!("wgsl/axpby.wgsl").to_string();
    let mut name = "axpby".to_string();
    let mut buffers = vec![Access::Read, Access::ReadWrite];
    let mut bindings = String::new();
    if variant.scaled {
        wgsl = wgsl.replace("var y = x[i] * p.alpha;", "var y = (x[i] * scale[i / p.row]) * p.alpha;");
        buffers.push(Access::Read);
        bindings += &format!("@group(0) @binding({}) var<storage, read> scale: array<f32>;\n", buffers.len());
        name += "_scaled";
    }
    if variant.gated {
        wgsl = wgsl.replace(
            "    if (i >= p.n) {\n        return;\n    }\n",
            "    if (i >= p.n || gate[i / p.row] == 0u) {\n        return;\n    }\n",
        );
        buffers.push(Access::Read);
        bindings += &format!("@group(0) @binding({}) var<storage, read> gate: array<u32>;\n", buffers.len());
        name += "_gated";
    }
    let wgsl = wgsl.replace("//@BINDINGS\n", &bindings);
    KernelSource {
        name,
        wgsl: with_prelude(&[("WG", WORKGROUP)], &wgsl),
        entry: "main",
        buffers,
        params_size: size_of::<AxpbyParams>() as u64,
    }
}

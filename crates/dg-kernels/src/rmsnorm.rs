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

/// `body` (a row kernel written over `V`, `LANES` and `sq`) for `lanes` columns at a time: 1
/// (`V` = f32) or 4 (`V` = `vec4<f32>`, `sq` summing a vec4's squares as `(x² + y²) + (z² + w²)`),
/// and the name suffix (`""` or `"_v4"`). Every row kernel of one width sums its squares the same
/// way, so the fused norms still match the `rmsnorm` chain of the same width.
pub(crate) fn with_lanes(body: &str, lanes: u32) -> (String, &'static str) {
    let (prelude, suffix) = match lanes {
        1 => ("alias V = f32;\nconst LANES: u32 = 1u;\nfn sq(v: V) -> f32 {\n    return v * v;\n}\n", ""),
        4 => (
            "alias V = vec4<f32>;\nconst LANES: u32 = 4u;\nfn sq(v: V) -> f32 {\n    let s = v * v;\n    return (s.x + s.y) + (s.z + s.w);\n}\n",
            "_v4",
        ),
        _ => panic!("row kernels take 1 or 4 columns at a time, not {lanes}"),
    };
    (format!("{prelude}{body}"), suffix)
}

/// Bindings: `x` (read, or the split-K partials of the product it would hold), `w` (read; any
/// buffer when unweighted), `out` (read-write). Reduced with `reduce` (`crate::row_reduce`).
pub fn source(reduce: RowReduce) -> KernelSource {
    source_lanes(reduce, 1)
}

/// [`source`] taking `lanes` columns at a time (1, or 4 for `dim` and both offsets multiples of
/// 4, see [`crate::lanes_for`]).
pub fn source_lanes(reduce: RowReduce, lanes: u32) -> KernelSource {
    let (body, suffix) = with_lanes(&reduce.render(include_str!("wgsl/rmsnorm.wgsl"), &[Part::Sum("f32")]), lanes);
    KernelSource {
        name: format!("rmsnorm{suffix}{}", reduce.suffix()),
        wgsl: with_prelude(&[("WG", WORKGROUP)], &crate::split_k::with_reader_lanes(&body, "x_at", "x")),
        entry: "main",
        buffers: vec![Access::Read, Access::Read, Access::ReadWrite],
        params_size: size_of::<RmsNormParams>() as u64,
    }
}

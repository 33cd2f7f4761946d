//! The second half of a split-K GEMM: the sum of the partial products that the splits of K
//! wrote, with the GEMM's own epilogue, into the strided C of [`crate::gemm::GemmParams`].
//!
//! ```text
//! C[b][i, j] = epilogue(alpha · Σ_z part[z·split_stride + b·m·n + i·n + j] (+ C[b][i, j]))
//! C[b][i, j] = c[c_offset + b·c_batch + i·c_rs + j]
//! ```
//!
//! A tensor-core GEMM with few output tiles ([`crate::coop_gemm`]: the router's 256 × 128
//! product has 8 tiles, the soft embedding's K is the whole vocabulary) runs K in `splits` ranges,
//! each workgroup writing its plain partial product to a scratch buffer; this kernel adds them up in
//! split order (`z = 0, 1, …`, f32) and applies alpha, accumulate and the softcap as the GEMM would.
//! No HF module: `torch.matmul` inside every linear layer is one call there.

use bytemuck::{Pod, Zeroable};

use crate::{Access, KernelSource, with_prelude};

/// Invocations per workgroup (one output element each).
pub const WORKGROUP: u32 = 256;

/// Uniform parameters of `split_k_reduce.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable, PartialEq)]
pub struct SplitKParams {
    pub m: u32,
    pub n: u32,
    pub batch: u32,
    /// Partial products to add.
    pub splits: u32,
    /// Elements between two splits' partials (at least `batch·m·n`).
    pub split_stride: u32,
    pub c_offset: u32,
    pub c_rs: u32,
    pub c_batch: u32,
    pub alpha: f32,
    /// Non-zero: add to the previous contents of C.
    pub accumulate: u32,
    /// [`crate::gemm::EPILOGUE_NONE`] or [`crate::gemm::EPILOGUE_SOFTCAP`].
    pub epilogue: u32,
    pub cap: f32,
}

/// Marker a consumer kernel's WGSL puts where [`with_reader`] defines its split-aware reader.
pub const READER_MARKER: &str = "//@SPLIT_READER\n";

/// `template` with `fn {name}(i: u32) -> f32` in place of its [`READER_MARKER`] line: element `i`
/// of a product that the consumer reads from the storage binding `binding`, either whole
/// (`p.splits ≤ 1`: `binding[i]`) or as the partials of a split-K GEMM that nobody reduced
/// (`Σ_z binding[z·p.split_stride + i]`, from 0 in split order: bit for bit what [`source`]
/// stores for a plain product, alpha 1, no accumulate, no epilogue). The consumer's uniform `p`
/// needs `splits` and `split_stride` (u32). A consumer that reads the partials this way saves the
/// reduction's dispatch and its pass over C.
pub fn with_reader(template: &str, name: &str, binding: &str) -> String {
    assert!(template.contains(READER_MARKER), "a split-K consumer without the reader marker");
    let reader = format!(
        "fn {name}(i: u32) -> f32 {{\n    if (p.splits <= 1u) {{\n        return {binding}[i];\n    }}\n    var v = 0.0;\n    for (var z = 0u; z < p.splits; z++) {{\n        v += {binding}[z * p.split_stride + i];\n    }}\n    return v;\n}}\n"
    );
    template.replacen(READER_MARKER, &reader, 1)
}

/// [`with_reader`] for a kernel that reads `LANES` columns at a time: `fn {name}(i: u32) -> V`
/// (`V` f32 or `vec4<f32>`, `LANES` its width, both defined by the kernel), `i` and the
/// partials' `split_stride` counted in `V`s (the stride a multiple of `LANES`). Per component the
/// same sum, in the same order, as [`with_reader`]'s.
pub fn with_reader_lanes(template: &str, name: &str, binding: &str) -> String {
    assert!(template.contains(READER_MARKER), "a split-K consumer without the reader marker");
    let reader = format!(
        "fn {name}(i: u32) -> V {{\n    if (p.splits <= 1u) {{\n        return {binding}[i];\n    }}\n    var v = V(0.0);\n    for (var z = 0u; z < p.splits; z++) {{\n        v += {binding}[z * (p.split_stride / LANES) + i];\n    }}\n    return v;\n}}\n"
    );
    template.replacen(READER_MARKER, &reader, 1)
}

/// Workgroups to dispatch (fold through `groups_1d`): one invocation per element of C.
pub fn workgroups(p: &SplitKParams) -> u32 {
    (p.batch.max(1) * p.m * p.n).div_ceil(WORKGROUP)
}

/// Bindings: `part` (read, the partials), `c` (read-write).
pub fn source() -> KernelSource {
    KernelSource {
        name: "split_k_reduce".into(),
        wgsl: with_prelude(&[("WG", WORKGROUP)], include_str!("wgsl/split_k_reduce.wgsl")),
        entry: "main",
        buffers: vec![Access::Read, Access::ReadWrite],
        params_size: size_of::<SplitKParams>() as u64,
    }
}

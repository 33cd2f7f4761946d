//! Embedding lookup from one chunk of the table: the `[V, H]` embedding exceeds a storage binding,
//! so it lives in several buffers of consecutive rows and the lookup runs once per chunk. Each
//! token whose id falls in `[row_start, row_start + row_count)` gets
//! `out[t] = table[id − row_start] · scale` (`scale = sqrt(H)` for the model's input embedding);
//! the other tokens' rows are left untouched.

use bytemuck::{Pod, Zeroable};

use crate::{Access, KernelSource, with_prelude};

/// Invocations per workgroup (one workgroup per token, looping over the hidden size).
pub const WORKGROUP: u32 = 256;

/// Uniform parameters of `embed.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable, PartialEq)]
pub struct EmbedParams {
    pub tokens: u32,
    /// H: row width of the table and the output.
    pub hidden: u32,
    /// First vocabulary row held by this chunk.
    pub row_start: u32,
    /// Rows held by this chunk.
    pub row_count: u32,
    pub scale: f32,
    pub _pad: [u32; 3],
}

/// Workgroups to dispatch (one per token; fold through `groups_1d`).
pub fn workgroups(p: &EmbedParams) -> u32 {
    p.tokens
}

/// Bindings: `ids` (read, u32 `[tokens]`), `table` (read, `[row_count, hidden]`), `out`
/// (read-write, `[tokens, hidden]`).
pub fn source() -> KernelSource {
    KernelSource {
        name: "embed".into(),
        wgsl: with_prelude(&[("WG", WORKGROUP)], include_str!("wgsl/embed.wgsl")),
        entry: "main",
        buffers: vec![Access::Read, Access::Read, Access::ReadWrite],
        params_size: size_of::<EmbedParams>() as u64,
    }
}

//! Embedding lookup from one chunk of the table: the `[V, H]` embedding exceeds a storage binding,
//! so it lives in several buffers of consecutive rows and the lookup runs once per chunk. Each
//! token whose id falls in `[row_start, row_start + row_count)` gets
//! `out[t] = table[id − row_start] · scale` (`scale = sqrt(H)` for the model's input embedding);
//! the other tokens' rows are left untouched. The table may be stored as bf16 or f16
//! ([`source_for`]), widened exactly: the output is then the f32 lookup of the 16-bit values
//! upcast, bit for bit.

use bytemuck::{Pod, Zeroable};

use crate::format::with_operand;
use crate::{Access, KernelSource, WeightFormat, with_prelude};

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

/// The lookup from an f32 table: [`source_for`] with [`WeightFormat::F32`], named `embed`.
/// Bindings: `ids` (read, u32 `[tokens]`), `table` (read, `[row_count, hidden]`), `out`
/// (read-write, `[tokens, hidden]`).
pub fn source() -> KernelSource {
    source_for(WeightFormat::F32)
}

/// The lookup from a table chunk stored as `table` (the output stays f32), named `embed` plus the
/// format's suffix (`_bf16`, `_f16`). A bf16 or f16 chunk is bound as `array<u32>` holding its `row_count ·
/// hidden` elements packed from its own first element (see [`crate::bf16`]), so element
/// `(id − row_start)·hidden + c` is read whatever the parity of `hidden`.
pub fn source_for(table: WeightFormat) -> KernelSource {
    KernelSource {
        name: format!("embed{}", table.suffix()),
        wgsl: with_operand(&with_prelude(&[("WG", WORKGROUP)], include_str!("wgsl/embed.wgsl")), "table", table),
        entry: "main",
        buffers: vec![Access::Read, Access::Read, Access::ReadWrite],
        params_size: size_of::<EmbedParams>() as u64,
    }
}

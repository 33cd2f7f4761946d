//! Rotary position embedding, rotate-half convention (`apply_rotary_pos_emb`), in place on q or k:
//! `x' = x·cos + rotate_half(x)·sin`, dimension `i` paired with `i + d/2`, exactly as
//! `dg_cpu::rope::RopeTable::apply`. One invocation per (row, pair); rows = tokens × heads.

use bytemuck::{Pod, Zeroable};

use crate::{Access, KernelSource, with_prelude};

/// Invocations per workgroup (one per rotated pair).
pub const WORKGROUP: u32 = 256;

/// Uniform parameters of `rope.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable, PartialEq)]
pub struct RopeParams {
    /// Rows of the cos/sin tables (token positions).
    pub tokens: u32,
    /// Heads per token; `x` is `[tokens, heads, 2·half]`.
    pub heads: u32,
    /// `head_dim / 2`: the width of the cos/sin tables.
    pub half: u32,
    pub _pad: u32,
}

/// Workgroups to dispatch (fold through `groups_1d`: more than 65535 wrap into y).
pub fn workgroups(p: &RopeParams) -> u32 {
    (p.tokens * p.heads * p.half).div_ceil(WORKGROUP)
}

/// Bindings: `x` (read-write, `[tokens, heads, 2·half]`), `cos` (read, `[tokens, half]`),
/// `sin` (read, `[tokens, half]`).
pub fn source() -> KernelSource {
    KernelSource {
        name: "rope".into(),
        wgsl: with_prelude(&[("WG", WORKGROUP)], include_str!("wgsl/rope.wgsl")),
        entry: "main",
        buffers: vec![Access::ReadWrite, Access::Read, Access::Read],
        params_size: size_of::<RopeParams>() as u64,
    }
}

//! MoE dispatch: a deterministic counting sort of the `[tokens, K]` routing entries by expert, so
//! that each expert's inputs are one contiguous run of slots (the grouped expert GEMMs gather rows
//! by `rows[slot]`).
//!
//! Slots are grouped by ascending expert; within an expert they follow the reference's order
//! (`dg_cpu::moe::experts`): top-k position `k` major, then token `t`. One workgroup does all the
//! work: workgroup-atomic counts, a serial exclusive scan into `offsets`, then each invocation
//! owns one expert and places its entries by scanning the routing table in `(k, t)` order, staged
//! through workgroup memory a block at a time. Entries whose expert is `≥ experts` get no slot
//! and `slot_of = NO_SLOT`.

use bytemuck::{Pod, Zeroable};

use crate::{Access, KernelSource, with_prelude};

/// Invocations of the single workgroup; also the largest expert count supported.
pub const WORKGROUP: u32 = 256;
/// Largest expert count supported (one invocation owns one expert).
pub const MAX_EXPERTS: u32 = WORKGROUP;
/// `slot_of` value of an entry with an out-of-range expert id.
pub const NO_SLOT: u32 = u32::MAX;

/// Uniform parameters of `moe_dispatch.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable, PartialEq)]
pub struct MoeDispatchParams {
    pub tokens: u32,
    /// K: routing entries per token.
    pub k: u32,
    /// E ≤ [`MAX_EXPERTS`].
    pub experts: u32,
    pub _pad: u32,
}

/// Workgroups to dispatch: always exactly one.
pub fn workgroups(_p: &MoeDispatchParams) -> u32 {
    1
}

/// Bindings: `idx` (read, u32 `[tokens, K]`), `offsets` (read-write, u32 `[E + 1]`: expert `e`
/// owns slots `offsets[e]..offsets[e + 1]`), `rows` (read-write, u32 `[tokens·K]`: slot → token),
/// `slot_of` (read-write, u32 `[tokens, K]`: entry → slot).
pub fn source() -> KernelSource {
    KernelSource {
        name: "moe_dispatch".into(),
        wgsl: with_prelude(&[("WG", WORKGROUP)], include_str!("wgsl/moe_dispatch.wgsl")),
        entry: "main",
        buffers: vec![Access::Read, Access::ReadWrite, Access::ReadWrite, Access::ReadWrite],
        params_size: size_of::<MoeDispatchParams>() as u64,
    }
}

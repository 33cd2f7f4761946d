//! MoE dispatch: a deterministic counting sort of the `[tokens, K]` routing entries by expert, so
//! that each expert's inputs are one contiguous run of slots (the grouped expert GEMMs gather rows
//! by `rows[slot]`).
//!
//! Slots are grouped by ascending expert; within an expert they follow the reference's order
//! (`dg_cpu::moe::experts`): top-k position `k` major, then token `t`. One workgroup per expert
//! (plus one for the total), each independent of the others: its invocations split the routing
//! table, in `(k, t)` order, into equal runs, count per run the entries below the expert and
//! those of the expert, scan the counts across the workgroup (which gives the expert's first slot
//! and each run's first slot within the expert), then place their run's entries in order. No
//! atomics and no inter-workgroup communication: the result is fully deterministic. Entries whose
//! expert is `≥ experts` get no slot and `slot_of = NO_SLOT`.
//!
//! With [`MoeDispatchParams::tile_rows`] set, the last workgroup also writes the tensor-core
//! grouped GEMM's tile table after the offsets ([`crate::coop_grouped_gemm::tile_table`]): the
//! experts' m tiles that hold slots, so that the GEMM's grid has one workgroup per such tile
//! instead of covering every expert's worst case.
//!
//! Each workgroup reads the whole table twice (2 · tokens · K words, L2-resident: 16 KiB for 256
//! tokens × top-8), and does ⌈tokens·K / 256⌉ steps per invocation plus an 8-step scan; the
//! previous single-workgroup version had one invocation per expert scan all 2048 entries.

use bytemuck::{Pod, Zeroable};

use crate::{Access, KernelSource, with_prelude};

/// Invocations per workgroup.
pub const WORKGROUP: u32 = 256;
/// Largest expert count supported (one workgroup per expert, plus one, in one grid dimension).
pub const MAX_EXPERTS: u32 = 65_534;
/// Most experts a tile table is written for (the last workgroup counts each expert's entries in
/// workgroup memory: 8 KiB).
pub const TABLE_EXPERTS: u32 = 2048;
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
    /// Non-zero (with E ≤ [`TABLE_EXPERTS`]): also write the tile table of m tiles of this many
    /// slots after the offsets; `offsets` then holds [`offsets_len`] values.
    pub tile_rows: u32,
}

/// Values of `offsets` for `p`: `E + 1`, plus the tile table's
/// [`crate::coop_grouped_gemm::table_len`] where [`MoeDispatchParams::tile_rows`] asks for one.
pub fn offsets_len(p: &MoeDispatchParams) -> u32 {
    match p.tile_rows {
        0 => p.experts + 1,
        rows => p.experts + 1 + crate::coop_grouped_gemm::table_len(p.tokens * p.k, p.experts, rows),
    }
}

/// Workgroups to dispatch: one per expert, plus one that writes `offsets[E]` and marks the
/// out-of-range entries (the kernel also accepts a folded grid of at least that many).
pub fn workgroups(p: &MoeDispatchParams) -> u32 {
    p.experts + 1
}

/// Bindings: `idx` (read, u32 `[tokens, K]`), `offsets` (read-write, u32 `[E + 1]`: expert `e`
/// owns slots `offsets[e]..offsets[e + 1]`; then the tile table, see [`offsets_len`]), `rows` (read-write, u32 `[tokens·K]`: slot → token),
/// `slot_of` (read-write, u32 `[tokens, K]`: entry → slot).
pub fn source() -> KernelSource {
    KernelSource {
        name: "moe_dispatch".into(),
        wgsl: with_prelude(&[("WG", WORKGROUP), ("TABLE_EXPERTS", TABLE_EXPERTS)], include_str!("wgsl/moe_dispatch.wgsl")),
        entry: "main",
        buffers: vec![Access::Read, Access::ReadWrite, Access::ReadWrite, Access::ReadWrite],
        params_size: size_of::<MoeDispatchParams>() as u64,
    }
}

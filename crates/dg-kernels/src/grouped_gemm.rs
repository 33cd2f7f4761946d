//! Grouped GEMM of the MoE experts: the per-expert products of tokens grouped by expert, in one
//! dispatch whose group sizes live on the GPU (no readback).
//!
//! Tokens routed to experts occupy "slots": the slots of expert `e` are
//! `offsets[e] .. offsets[e+1]`. For every slot `s` of expert `e`:
//!
//! ```text
//! C[s, j] = Σ_p A[row(s), p] · W[e, j, p]        row(s) = gather ? rows[s] : s
//! A[r, p] = a[r·a_rs + p]      W[e, j, p] = b[e·b_group_stride + j·k + p]      C[s, j] = c[s·c_rs + j]
//! ```
//!
//! W is `[groups, n, k]`, PyTorch's `[out, in]` per expert, so `C = A·Wᵀ` per expert. Bindings:
//! `a` (read), `b` (read), `offsets` (read, `groups + 1` u32), `rows` (read, one u32 per slot;
//! only read when `gather != 0`, any buffer otherwise), `c` (read-write, `[slots, n]`).
//!
//! Same tiling core as [`crate::gemm`] (shared WGSL, same [`GemmTile`]s). The grid covers
//! `max_rows` rows for every group; workgroups whose m tile starts past their group's count exit
//! at once. With 8 of 128 experts per token the groups are small (2048 slots → 16 per expert on
//! average), so [`crate::gemm::TILE_SKINNY`] or [`crate::gemm::TILE_32`] usually fit best.

use bytemuck::{Pod, Zeroable};

use crate::gemm::{GemmTile, TILE_32, TILE_SKINNY, fold};
use crate::{Access, KernelSource};

/// Uniform parameters of `grouped_gemm.wgsl`. 32 bytes, a multiple of 16, so no padding.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable, PartialEq)]
pub struct GroupedGemmParams {
    pub n: u32,
    pub k: u32,
    /// Number of groups (experts); `offsets` holds `groups + 1` values.
    pub groups: u32,
    /// Upper bound on any group's slot count (sizes the dispatch; larger only costs idle
    /// workgroups, smaller leaves rows uncomputed).
    pub max_rows: u32,
    /// Row stride of A (elements).
    pub a_rs: u32,
    /// Elements per expert in W (`n · k` for a packed `[groups, n, k]` tensor).
    pub b_group_stride: u32,
    /// Row stride of C (elements).
    pub c_rs: u32,
    /// Non-zero: slot `s` reads row `rows[s]` of A; zero: row `s`.
    pub gather: u32,
}

/// The kernel for `tile`, named `grouped_gemm_{label}`.
pub fn source(tile: GemmTile) -> KernelSource {
    KernelSource {
        name: format!("grouped_gemm_{}", tile.label()),
        wgsl: tile.render(include_str!("wgsl/grouped_gemm.wgsl")),
        entry: "main",
        buffers: vec![Access::Read, Access::Read, Access::Read, Access::Read, Access::ReadWrite],
        params_size: size_of::<GroupedGemmParams>() as u64,
    }
}

/// A tile for `slots` rows spread over `groups` groups: by the average group size (not
/// `max_rows`, which only bounds the grid), since every group pays for whole m tiles. The MoE's
/// 2048 slots over 128 experts (16 each on average) get [`TILE_SKINNY`].
pub fn choose(n: u32, k: u32, slots: u32, groups: u32) -> GemmTile {
    let average = slots.div_ceil(groups.max(1));
    if average <= TILE_SKINNY.bm {
        TILE_SKINNY
    } else if average <= TILE_32.bm {
        TILE_32
    } else {
        crate::gemm::choose(average, n, k)
    }
}

/// The dispatch: `⌈max_rows/bm⌉ · ⌈n/bn⌉ · groups` workgroups as a linear index (m tile fastest,
/// then n tile, then group), folded by [`crate::gemm::fold`] when over the per-dimension limit.
pub fn workgroups(tile: GemmTile, n: u32, max_rows: u32, groups: u32) -> [u32; 3] {
    let total = u64::from(max_rows.div_ceil(tile.bm)) * u64::from(n.div_ceil(tile.bn)) * u64::from(groups);
    assert!(total <= u64::from(u32::MAX), "grouped gemm of {max_rows} rows x {n} over {groups} groups: too many workgroups");
    fold(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_are_a_multiple_of_16_bytes() {
        assert_eq!(size_of::<GroupedGemmParams>() % 16, 0);
    }

    #[test]
    fn choose_goes_by_the_average_group() {
        assert_eq!(choose(1408, 2816, 2048, 128), TILE_SKINNY);
        assert_eq!(choose(1408, 2816, 2048, 64), TILE_32);
        assert_eq!(choose(1408, 2816, 0, 0), TILE_SKINNY);
        assert!(crate::gemm::TILES.contains(&choose(1408, 2816, 100_000, 8)));
    }

    #[test]
    fn the_real_moe_dispatch_folds() {
        // 128 experts, 2048 slots bound, gate+up 1408 wide: 128 · 22 · 128 workgroups.
        let [x, y, z] = workgroups(TILE_SKINNY, 1408, 2048, 128);
        assert!(u64::from(x) * u64::from(y) * u64::from(z) >= 128 * 22 * 128);
        assert!(x <= 65_535 && y <= 65_535 && z == 1);
        assert_eq!(workgroups(TILE_32, 10, 0, 8), [1, 1, 1]);
    }
}

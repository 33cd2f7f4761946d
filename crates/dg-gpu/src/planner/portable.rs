//! Which tile runs a product on the portable kernels (`dg_kernels::gemm` for dense and batched
//! products, `dg_kernels::grouped_gemm` for the experts): by the workgroups a tile gives, and for
//! the experts by the mean group size.

use dg_kernels::gemm::{GemmTile, TILE_16_SPLIT, TILE_32, TILE_32_SPLIT, TILE_64, TILE_128, TILE_SKINNY};
use dg_kernels::grouped_gemm::{GroupedTile, TILE_16X128, TILE_16X256, TILE_32X256, TILE_64X256};

/// Workgroups wanted before a larger tile is worth its lower parallelism (about 2 per SM on a
/// 100+ SM GPU: a single wave of 1–1.5 workgroups per SM leaves SMs idle or half-used, e.g.
/// 176 64×64 tiles of `256 × 2816` on 132 SMs).
pub const ENOUGH_WORKGROUPS: u64 = 256;
/// K from which a product with few output tiles splits K inside the workgroup: below it the
/// K loop is short and the final reduction is not worth it.
pub const SPLIT_MIN_K: u32 = 1024;

/// A tile for an `m × n × k` product, single batch (see [`choose_batched`]).
pub fn choose(m: u32, n: u32, k: u32) -> GemmTile {
    choose_batched(m, n, k, 1)
}

/// A tile for `batch` products of `m × n × k`, by the number of workgroups it gives (every batch
/// counts; K only decides whether a split pays):
/// - m ≤ 16: [`TILE_SKINNY`];
/// - the largest square tile with enough workgroups: [`TILE_128`] from 2 · [`ENOUGH_WORKGROUPS`]
///   tiles (it holds fewer workgroups per SM), [`TILE_64`] from [`ENOUGH_WORKGROUPS`];
/// - otherwise a K under [`SPLIT_MIN_K`] gets [`TILE_32`], a longer one splits K:
///   [`TILE_32_SPLIT`] when its 32×32 tiles are enough, else [`TILE_16_SPLIT`].
pub fn choose_batched(m: u32, n: u32, k: u32, batch: u32) -> GemmTile {
    let tiles = |t: GemmTile| u64::from(m.div_ceil(t.bm)) * u64::from(n.div_ceil(t.bn)) * u64::from(batch.max(1));
    if m <= TILE_SKINNY.bm {
        TILE_SKINNY
    } else if tiles(TILE_128) >= 2 * ENOUGH_WORKGROUPS {
        TILE_128
    } else if tiles(TILE_64) >= ENOUGH_WORKGROUPS {
        TILE_64
    } else if k < SPLIT_MIN_K {
        TILE_32
    } else if tiles(TILE_32_SPLIT) >= ENOUGH_WORKGROUPS {
        TILE_32_SPLIT
    } else {
        TILE_16_SPLIT
    }
}

/// A tile for `slots` rows spread over `groups` groups, by the average group size (not
/// `max_rows`, which only bounds the grid), since every group pays for its rows in steps of 8
/// and for whole m tiles in weight reads: 16 rows up to an average of 8, 32 up to 48, else 64;
/// 256 columns unless N fits in 128. Measured on an NVIDIA H200 at the real MoE (2048 slots over
/// 128 experts, ~16 per expert): 32×256 ran gate‖up in 1.31 ms and down in 0.63 ms against
/// 1.71 / 0.83 ms for 16×256, 1.59 / 0.73 for 16×128 and 1.56 / 0.73 for 64×256 (twice the
/// invocations per workgroup hide more latency than the padding rows cost).
pub fn choose_grouped(n: u32, _k: u32, slots: u32, groups: u32) -> GroupedTile {
    let average = slots.div_ceil(groups.max(1));
    if average <= 8 || n <= TILE_16X128.bn {
        if n <= TILE_16X128.bn { TILE_16X128 } else { TILE_16X256 }
    } else if average <= 48 {
        TILE_32X256
    } else {
        TILE_64X256
    }
}

#[cfg(test)]
mod tests {
    use dg_kernels::gemm;

    use super::*;

    #[test]
    fn choose_picks_by_shape() {
        assert_eq!(choose(1, 262_144, 2816), TILE_SKINNY);
        assert_eq!(choose(16, 2048, 2816), TILE_SKINNY);
        // The tied head and q_proj / the dense gate_up at 256 tokens: enough tiles.
        assert_eq!(choose(256, 262_144, 2816), TILE_128);
        assert_eq!(choose(256, 4096, 2816), TILE_64);
        assert_eq!(choose(256, 4224, 2816), TILE_64);
        // k/v_proj, o_proj, the dense down projection, the soft embedding: 128–176 64×64 tiles on
        // a 132-SM GPU, long K.
        assert_eq!(choose(256, 2048, 2816), TILE_32_SPLIT);
        assert_eq!(choose(256, 2816, 4096), TILE_32_SPLIT);
        assert_eq!(choose(256, 2816, 2112), TILE_32_SPLIT);
        assert_eq!(choose(256, 2816, 262_144), TILE_32_SPLIT);
        // The router: 32 tiles of 32×32.
        assert_eq!(choose(256, 128, 2816), TILE_16_SPLIT);
        // Short K, few tiles.
        assert_eq!(choose(40, 70, 5), TILE_32);
        assert_eq!(choose(256, 128, 256), TILE_32);
        assert!(gemm::TILES.contains(&choose(17, 1, 0)));
        // Batches count: attention over 16 heads at 256 tokens, 1024 cached.
        assert_eq!(choose_batched(256, 1024, 256, 16), TILE_64);
        assert_eq!(choose_batched(256, 256, 1024, 16), TILE_64);
        assert_eq!(choose_batched(4096, 4096, 4096, 1), TILE_128);
        assert_eq!(choose_batched(40, 70, 5, 0), TILE_32);
    }

    #[test]
    fn choose_goes_by_the_average_group() {
        // The real MoE: 256 tokens × top-8 over 128 experts, gate‖up 1408 wide, down 2816.
        assert_eq!(choose_grouped(1408, 2816, 2048, 128), TILE_32X256);
        assert_eq!(choose_grouped(2816, 704, 2048, 128), TILE_32X256);
        assert_eq!(choose_grouped(1408, 2816, 512, 128), TILE_16X256);
        assert_eq!(choose_grouped(48, 64, 2048, 128), TILE_16X128);
        assert_eq!(choose_grouped(1408, 2816, 2048, 64), TILE_32X256);
        assert_eq!(choose_grouped(1408, 2816, 0, 0), TILE_16X256);
        assert_eq!(choose_grouped(1408, 2816, 100_000, 8), TILE_64X256);
    }
}

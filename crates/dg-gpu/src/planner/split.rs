//! When a dense tensor-core product splits its K, and how far (`dg_kernels::coop_gemm::Split` runs
//! the split): towards a number of workgroups that fills the device, within the split-K scratch.
//! The thresholds were measured on an H200 (`cargo xtask probe`, bench/HISTORY.md).

use dg_kernels::coop_gemm::{CoopTile, Split};
use dg_kernels::gemm::GemmParams;

/// Workgroups a product is split towards when two workgroups of its tile share a multiprocessor
/// (up to [`PAIR_RESIDENT_SHARED_BYTES`]): about two per multiprocessor of a 132-SM H200, where a product of 264 64×64 tiles already runs a K step on each multiprocessor about as fast as one
/// lone workgroup does (0.36 against 0.55 µs; `cargo xtask probe`,
/// `dense_tensor_core_throughput_by_tile_and_split`). Only products with fewer than half that many
/// tiles split: the router's 256 × 128 (8 tiles: 54 µs whole, 20 µs in 16 splits). A 256-row
/// projection's 176 to 256 tiles of 64×64 do not: splitting it measured slower (q_proj 59 µs
/// whole, 93 in two splits; such projections now take 128×128 tiles, [`super::coop_dense::LARGE_TILE_MIN_ROWS`]).
/// Long products have their own target ([`LONG_K_TARGET_WORKGROUPS`]).
pub const SPLIT_TARGET_WORKGROUPS: u32 = 256;
/// Workgroup memory up to which two workgroups share a multiprocessor of an H200 (its driver gives
/// these pipelines less than 64 KiB a multiprocessor: `cargo xtask probe`,
/// `workgroup_residency_probe`, 24 KiB two, 32 KiB one).
pub const PAIR_RESIDENT_SHARED_BYTES: u32 = 24 * 1024;
/// Fewest K steps one split runs: below that, staging the first step and storing the partial
/// outweigh the steps.
pub const MIN_SPLIT_STEPS: u32 = 4;
/// K steps from which a product is long (the soft embedding's K is the vocabulary: 8192 steps)
/// and is split towards [`LONG_K_TARGET_WORKGROUPS`]: its 176 tiles of 64×64 took 6.7 ms whole
/// and 4.4 ms in 6 splits on an H200.
pub const LONG_K_STEPS: u32 = 512;
/// Most splits of a product split for whole rounds of workgroups ([`choose`] where its
/// tiles are more than half the target): each split adds a partial product to write and read.
pub const MAX_WAVE_SPLITS: u32 = 4;
/// Fewest K steps of a product split for whole rounds of workgroups: shorter products gain less
/// than their consumers pay to read the partials. On an H200 in a 1024-token prefill (layer 0,
/// 176 tiles of 128×128 each, 3 splits): the o projection (128 steps) 191.5 → 155.9 µs and its
/// consumer, the attention residual norms, 20.2 → 26.5; the dense MLP's down projection (66
/// steps) 110.7 → 101.5 µs but the closing norms 47.2 → 66.9. The decoder's full layers' merged
/// q/K/V (144 tiles, 88 steps, 4 splits) 76.8 → 75.8 µs, no gain either.
pub const WAVE_SPLIT_MIN_STEPS: u32 = 128;
/// Workgroups a long product is split towards.
pub const LONG_K_TARGET_WORKGROUPS: u32 = 1024;

/// The workgroups `p` on `tile` is split towards by default on a device of `multiprocessors`
/// multiprocessors: [`LONG_K_TARGET_WORKGROUPS`] for a long K, else
/// [`SPLIT_TARGET_WORKGROUPS`], or one per multiprocessor for a tile that runs alone on one
/// (over [`PAIR_RESIDENT_SHARED_BYTES`] of workgroup memory, as the 128×128 tile's 48 KiB). In
/// the F16 forward on a 132-multiprocessor H200 (decoder, 256 rows, W in K panels, 128×128
/// tiles, µs against splitting towards 256): q 73 → 65, K+V 72 → 64, o 78 → 64, MLP gate/up
/// 85 → 65, down 53 → 41; the layers 1.550 → 1.466 ms each (towards 512: 1.615).
pub fn target(tile: CoopTile, p: &GemmParams, multiprocessors: u32) -> u32 {
    if p.k / tile.bk >= LONG_K_STEPS {
        LONG_K_TARGET_WORKGROUPS
    } else if tile.dense_shared_bytes() > PAIR_RESIDENT_SHARED_BYTES {
        multiprocessors
    } else {
        SPLIT_TARGET_WORKGROUPS
    }
}

/// The split of `p` on `tile` that brings its workgroups up to at most `target` (`target /
/// tiles` splits, rounded down), with every split at least [`MIN_SPLIT_STEPS`] long and the
/// partials (`splits · batch · m · n` f32) within `max_partial` elements; `None` when the tiles
/// are more than half the target or no split of two or more fits.
/// Products with more tiles than that split only where whole waves gain ([`by_waves`])
/// and K is at least [`WAVE_SPLIT_MIN_STEPS`] steps long.
pub fn choose(tile: CoopTile, p: &GemmParams, target: u32, max_partial: u64) -> Option<Split> {
    let tiles = u64::from(tile.tiles(p.m, p.n) * p.batch.max(1));
    let steps = p.k / tile.bk;
    let by_steps = u64::from(steps / MIN_SPLIT_STEPS);
    let by_memory = max_partial / (u64::from(p.batch.max(1)) * u64::from(p.m) * u64::from(p.n)).max(1);
    let most = by_steps.min(by_memory).min(65535) as u32;
    let splits = if 2 * tiles > u64::from(target) {
        if steps < WAVE_SPLIT_MIN_STEPS {
            return None;
        }
        by_waves(tiles, steps, target, most)?
    } else {
        (u64::from(target) / tiles.max(1)).min(u64::from(most)) as u32
    };
    if splits < 2 {
        return None;
    }
    let per = steps.div_ceil(splits);
    Some(Split { splits: steps.div_ceil(per), steps: per })
}

/// For a product of more tiles than half of `target` (the workgroups resident at once): the
/// splits, up to `most` and [`MAX_WAVE_SPLITS`], with the fewest rounds of `target` workgroups
/// times their K steps (the fewest splits among equals), where that is at most three quarters
/// of the whole product's: a last round that is mostly empty idles the GPU. A 1024-row encoder
/// chunk's o projection (176 tiles of 128×128, 128 K steps, on 132 multiprocessors): 2 rounds
/// of 128 steps whole, 4 of 43 in 3 splits.
fn by_waves(tiles: u64, steps: u32, target: u32, most: u32) -> Option<u32> {
    let cost = |s: u32| (tiles * u64::from(s)).div_ceil(u64::from(target.max(1))) * u64::from(steps.div_ceil(s));
    let best = (2..=most.min(MAX_WAVE_SPLITS)).min_by_key(|&s| (cost(s), s))?;
    (4 * cost(best) <= 3 * cost(1)).then_some(best)
}

#[cfg(test)]
mod tests {
    use dg_kernels::coop_gemm::{TILE_64X64, TILE_128X128};

    use super::*;

    #[test]
    fn split_k_reaches_the_target_within_its_limits() {
        // The router: 8 tiles of 64×64, 88 K steps of 32 → 22 splits of 4 steps.
        let router = GemmParams::linear(256, 128, 2816);
        assert_eq!(choose(TILE_64X64, &router, SPLIT_TARGET_WORKGROUPS, u64::MAX), Some(Split { splits: 22, steps: 4 }));
        // 256 tiles at a target of 1024 → 4 splits of 22 steps.
        let q = GemmParams::linear(256, 4096, 2816);
        assert_eq!(choose(TILE_64X64, &q, 1024, u64::MAX), Some(Split { splits: 4, steps: 22 }));
        // Uneven: 90 steps in 4 splits of 23 (the last runs 21).
        let uneven = GemmParams::linear(256, 4096, 2880);
        assert_eq!(choose(TILE_64X64, &uneven, 1024, u64::MAX), Some(Split { splits: 4, steps: 23 }));
        // Enough tiles already (q_proj's 256, mlp down's 176 at the default target), K too
        // short, or no room for two partials: no split.
        assert_eq!(choose(TILE_64X64, &q, SPLIT_TARGET_WORKGROUPS, u64::MAX), None);
        assert_eq!(choose(TILE_64X64, &GemmParams::linear(256, 2816, 2112), SPLIT_TARGET_WORKGROUPS, u64::MAX), None);
        assert_eq!(choose(TILE_64X64, &GemmParams::linear(256, 128, 224), 1024, u64::MAX), None);
        assert_eq!(choose(TILE_64X64, &router, 1024, 256 * 128 * 2 - 1), None);
        assert_eq!(choose(TILE_64X64, &router, 1024, 256 * 128 * 3).map(|s| s.splits), Some(3));
        // The partials replace C's strides; the reduction carries C's own and the epilogue.
        let head = GemmParams { c_rs: 1000, c_offset: 7, epilogue: dg_kernels::gemm::EPILOGUE_SOFTCAP, cap: 30.0, ..router };
        let split = Split { splits: 22, steps: 4 };
        let part = split.partial_params(&head);
        assert_eq!((part.c_offset, part.c_rs, part.epilogue, part.split_steps, part.split_stride), (0, 128, 0, 4, 256 * 128));
        let r = split.reduce_params(&head);
        assert_eq!((r.c_offset, r.c_rs, r.epilogue, r.cap, r.splits), (7, 1000, 1, 30.0, 22));
        assert_eq!(split.partial_len(&head), 22 * 256 * 128);
    }

    #[test]
    fn products_over_a_round_of_workgroups_split_for_whole_rounds() {
        // A 1024-token chunk's o projection on 132 multiprocessors: 176 tiles of 128×128, 128 K
        // steps: 2 rounds × 128 steps whole, 4 × 43 in 3 splits (6 × 32 in 4).
        let o = GemmParams::linear(1024, 2816, 4096);
        assert_eq!(choose(TILE_128X128, &o, 132, u64::MAX), Some(Split { splits: 3, steps: 43 }));
        // No more splits than the partials' room holds.
        assert_eq!(choose(TILE_128X128, &o, 132, 2 * 1024 * 2816).map(|s| s.splits), Some(2));
        // Whole rounds already (264 tiles on 132), or K under WAVE_SPLIT_MIN_STEPS (the MLP's down
        // projection, 66 steps): no split.
        assert_eq!(choose(TILE_128X128, &GemmParams::linear(1024, 4224, 4096), 132, u64::MAX), None);
        assert_eq!(choose(TILE_128X128, &GemmParams::linear(1024, 2816, 2112), 132, u64::MAX), None);
    }
}

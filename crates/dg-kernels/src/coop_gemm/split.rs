//! Split K for the dense tensor-core kernel: a product whose tiles would leave most
//! multiprocessors idle runs its K in ranges, one layer of workgroups each, whose partials
//! `crate::split_k` adds (or the product's consumer, as it reads them).

use super::CoopTile;
use crate::gemm::GemmParams;

/// Workgroups a product is split towards when two workgroups of its tile share a multiprocessor
/// (up to [`PAIR_RESIDENT_SHARED_BYTES`]): about two per multiprocessor of a 132-SM H200, where a product of 264 64×64 tiles already runs a K step on each multiprocessor about as fast as one
/// lone workgroup does (0.36 against 0.55 µs; `cargo xtask probe`,
/// `dense_tensor_core_throughput_by_tile_and_split`). Only products with fewer than half that many
/// tiles split: the router's 256 × 128 (8 tiles: 54 µs whole, 20 µs in 16 splits). A 256-row
/// projection's 176 to 256 tiles of 64×64 do not: splitting it measured slower (q_proj 59 µs
/// whole, 93 in two splits; such projections now take 128×128 tiles, [`LARGE_TILE_MIN_ROWS`]).
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
/// Most splits of a product split for whole rounds of workgroups ([`Split::choose`] where its
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

/// K cut into `splits` ranges of `steps` K steps (the last may be shorter), one layer of
/// workgroups each, whose partial products [`crate::split_k`] adds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Split {
    pub splits: u32,
    pub steps: u32,
}

impl Split {
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
    /// Products with more tiles than that split only where whole waves gain ([`Self::by_waves`])
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
            Self::by_waves(tiles, steps, target, most)?
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

    /// Elements of the partial products.
    pub fn partial_len(self, p: &GemmParams) -> u64 {
        u64::from(self.splits) * self.split_stride(p) as u64
    }

    fn split_stride(self, p: &GemmParams) -> u32 {
        p.batch.max(1) * p.m * p.n
    }

    /// The tensor-core GEMM's parameters for the partials: `p`'s operands, C as contiguous
    /// `[splits][batch][m][n]` at the start of the scratch, a plain product.
    pub fn partial_params(self, p: &GemmParams) -> GemmParams {
        GemmParams {
            c_offset: 0,
            c_rs: p.n,
            c_batch: p.m * p.n,
            alpha: 1.0,
            accumulate: 0,
            epilogue: crate::gemm::EPILOGUE_NONE,
            cap: 0.0,
            split_steps: self.steps,
            split_stride: self.split_stride(p),
            ..*p
        }
    }

    /// The reduction's parameters: `p`'s C, alpha, accumulate and epilogue.
    pub fn reduce_params(self, p: &GemmParams) -> crate::split_k::SplitKParams {
        crate::split_k::SplitKParams {
            m: p.m,
            n: p.n,
            batch: p.batch.max(1),
            splits: self.splits,
            split_stride: self.split_stride(p),
            c_offset: p.c_offset,
            c_rs: p.c_rs,
            c_batch: p.c_batch,
            alpha: p.alpha,
            accumulate: p.accumulate,
            epilogue: p.epilogue,
            cap: p.cap,
        }
    }
}

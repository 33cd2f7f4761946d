//! Which tile runs a dense product on the tensor cores (`dg_kernels::coop_gemm`), and how its K
//! loop names its stages. The kernel says which tiles and layouts it takes
//! (`coop_gemm::layout`, `coop_gemm::takes`); this is the rule among them.

use dg_kernels::coop_gemm::{self, BLayout, CoopTile, MAX_SHARED_BYTES, Stages, TILE_128X128, TILES};
use dg_kernels::gemm::GemmParams;

/// Rows from which a product takes [`TILE_128X128`] where it fits, rather than the first fitting
/// tile of `coop_gemm::TILES`: a K step's throughput is bound by its global loads (`cargo xtask probe`,
/// `tensor_core_step_ceiling_probe`), and a 128×128 step loads 16 KB of A and 8 KB of W for four
/// times the products of a 64×64 step's 8 + 4 KB. A product with few such tiles splits K to fill
/// the GPU ([`super::split`]). In the F16 forward on an H200 (decoder, 256 rows, W in K panels, µs,
/// 64×64 → 128×128 split): q 80 → 70, K+V 81 → 71, o 114 → 78 (full layer 241 → 130), MLP down
/// 62 → 51, gate/up 83 → 83; the layers 1.548 → 1.513 ms each. Without the splits the same tile
/// was slower (1.742 ms).
pub const LARGE_TILE_MIN_ROWS: u32 = 128;

/// The tile and B layout that run `p` on the tensor cores, if the kernel takes the product
/// (`coop_gemm::layout`; with `panels`, B an F16 matrix in K panels): `prefer` where it fits (a
/// lab override), [`TILE_128X128`] for products of at least [`LARGE_TILE_MIN_ROWS`] rows where it
/// fits, else the first tile of `coop_gemm::TILES` the kernel takes on a device with
/// `max_shared` bytes of workgroup memory.
pub fn tile(p: &GemmParams, panels: bool, prefer: Option<CoopTile>, max_shared: u32) -> Option<(CoopTile, BLayout)> {
    let layout = coop_gemm::layout(p, panels)?;
    let takes = |t: &CoopTile| coop_gemm::takes(*t, p, layout, max_shared);
    if let Some(t) = prefer.filter(takes) {
        return Some((t, layout));
    }
    if takes(&TILE_128X128) && p.m >= LARGE_TILE_MIN_ROWS {
        return Some((TILE_128X128, layout));
    }
    TILES.iter().copied().find(takes).map(|t| (t, layout))
}

/// [`tile`] for B not in panels, no preference, the kernel's own workgroup-memory limit: whether
/// (and how) the tensor cores take `p` at all.
pub fn plan(p: &GemmParams) -> Option<(CoopTile, BLayout)> {
    tile(p, false, None, MAX_SHARED_BYTES)
}

/// K steps per multiprocessor from which a product's loop names its stages by constants
/// ([`stages`]).
pub const CONSTANT_STAGES_MIN_STEPS: u64 = 1024;

/// How `tile`'s K loop names its stages for the product `p` on a device with `multiprocessors`:
/// [`Stages::Constant`] where the product runs at least [`CONSTANT_STAGES_MIN_STEPS`] K steps per
/// multiprocessor (all its tiles' steps, however K is split), else [`Stages::Alternating`]. On
/// an H200 the V-sized products (the tied head and the soft embedding, about 2,700 steps per
/// multiprocessor) gained 4–7% from constant stages, and the layers' products (a few hundred at
/// most) lost 2–10% (see [`Stages`]).
pub fn stages(tile: CoopTile, p: &GemmParams, multiprocessors: u32) -> Stages {
    let steps = u64::from(tile.tiles(p.m, p.n)) * u64::from(p.batch.max(1)) * u64::from(p.k / tile.bk);
    match steps >= CONSTANT_STAGES_MIN_STEPS * u64::from(multiprocessors.max(1)) {
        true => Stages::Constant,
        false => Stages::Alternating,
    }
}

#[cfg(test)]
mod tests {
    use dg_kernels::coop_gemm::{TILE_64X64, TILE_64X128};

    use super::super::split;
    use super::*;

    #[test]
    fn plan_takes_the_forward_products_and_refuses_the_rest() {
        // q_proj, the head chunk (strided C), attention's scores (keys [n][k] of a GQA cache) and
        // values ([k][n]).
        let q = GemmParams::linear(256, 4096, 2816);
        assert_eq!(plan(&q).map(|(_, l)| l), Some(BLayout::Nk));
        let scores = GemmParams {
            batch: 16,
            a_rs: 4096,
            a_batch: 256,
            b_rs: 1,
            b_cs: 2048,
            b_batch: 256,
            b_batch_div: 2,
            c_rs: 1280,
            c_batch: 256 * 1280,
            ..GemmParams::new(256, 1024, 256)
        };
        assert_eq!(plan(&scores).map(|(_, l)| l), Some(BLayout::Nk));
        let values = GemmParams {
            batch: 16,
            a_rs: 1280,
            a_batch: 256 * 1280,
            a_offset: 1024,
            b_rs: 2048,
            b_cs: 1,
            b_batch: 256,
            b_batch_div: 2,
            c_rs: 4096,
            c_batch: 256,
            accumulate: 1,
            ..GemmParams::new(256, 256, 256)
        };
        assert_eq!(plan(&values).map(|(_, l)| l), Some(BLayout::Kn));
        assert_eq!(plan(&GemmParams { a_cs: 2, ..q }), None, "A not row-major");
        assert_eq!(plan(&GemmParams { b_rs: 2, ..q }), None, "no unit stride in B");
        assert_eq!(plan(&GemmParams { a_offset: 2, ..q }), None, "A offset not vec4-aligned");
        assert_eq!(plan(&GemmParams::linear(256, 4096, 2800)), None, "k not a multiple of 32");
    }

    #[test]
    fn only_the_v_sized_products_name_their_stages_by_constants() {
        // On an H200's 132 multiprocessors: the tied head (256 × 262144 × 2816) and the soft
        // embedding (256 × 2816 × 262144) against q/K/V and the dense MLP's down projection, in
        // the decoder and in a 1024-token prefill.
        let (sms, tile) = (132, TILE_128X128);
        assert_eq!(stages(tile, &GemmParams::linear(256, 262144, 2816), sms), Stages::Constant);
        assert_eq!(stages(tile, &GemmParams::linear(256, 2816, 262144), sms), Stages::Constant);
        for rows in [256, 1024] {
            assert_eq!(stages(tile, &GemmParams::linear(rows, 8192, 2816), sms), Stages::Alternating);
            assert_eq!(stages(tile, &GemmParams::linear(rows, 2816, 2112), sms), Stages::Alternating);
        }
    }

    #[test]
    fn large_products_take_the_large_tile_and_long_ones_split_further() {
        // The tied head: 256 × 262144 × 2816, 4096 tiles of 128×128.
        let head = GemmParams::linear(256, 262144, 2816);
        assert_eq!(plan(&head).map(|(t, _)| t), Some(TILE_128X128));
        // q_proj: 256 rows, 64 tiles of 128×128, split K 2 ways towards one workgroup per
        // multiprocessor.
        let q = GemmParams::linear(256, 4096, 2816);
        assert_eq!(plan(&q).map(|(t, _)| t), Some(TILE_128X128));
        assert_eq!(TILE_64X64.dense_shared_bytes(), split::PAIR_RESIDENT_SHARED_BYTES);
        assert_eq!(split::target(TILE_128X128, &q, 132), 132);
        assert_eq!(split::choose(TILE_128X128, &q, split::target(TILE_128X128, &q, 132), u64::MAX).map(|s| s.splits), Some(2));
        // Fewer than 128 rows (a short encoder chunk): the first fitting tile.
        assert_eq!(plan(&GemmParams::linear(100, 4096, 2816)).map(|(t, _)| t), Some(TILE_64X64));
        // A preferred tile wins where it fits, and only there.
        assert_eq!(tile(&head, false, Some(TILE_64X128), MAX_SHARED_BYTES).map(|(t, _)| t), Some(TILE_64X128));
        assert_eq!(
            tile(&GemmParams::linear(64, 4160, 2816), false, Some(TILE_128X128), MAX_SHARED_BYTES).map(|(t, _)| t),
            Some(TILE_64X64)
        );
        // A device with less workgroup memory than the 128×128 tile's 48 KiB.
        assert_eq!(tile(&head, false, None, 32 * 1024).map(|(t, _)| t), Some(TILE_64X64));
        // The soft embedding ([k][n], K the vocabulary): long, its 44 tiles split 23 ways towards
        // 1024 workgroups.
        let soft = GemmParams { a_rs: 262144, b_rs: 2816, b_cs: 1, ..GemmParams::new(256, 2816, 262144) };
        let (tile, _) = plan(&soft).unwrap();
        assert_eq!(tile, TILE_128X128);
        assert_eq!(split::target(tile, &soft, 132), split::LONG_K_TARGET_WORKGROUPS);
        assert_eq!(split::choose(tile, &soft, split::target(tile, &soft, 132), u64::MAX).map(|s| s.splits), Some(23));
        assert_eq!(split::target(TILE_64X64, &GemmParams::linear(256, 4096, 2816), 132), split::SPLIT_TARGET_WORKGROUPS);
    }

    #[test]
    fn k_panels_take_f16_linear_weights_on_tiles_of_the_panels_width() {
        let q = GemmParams::linear(256, 4096, 2816);
        assert_eq!(tile(&q, true, None, MAX_SHARED_BYTES), Some((TILE_128X128, BLayout::NkPanels)));
        // The preferred K-64 tile does not match the panels: the rule's tile instead.
        let k64 = CoopTile { bk: 64, ..TILE_64X64 };
        assert_eq!(tile(&q, true, Some(k64), MAX_SHARED_BYTES), Some((TILE_128X128, BLayout::NkPanels)));
        assert_eq!(tile(&GemmParams::linear(1000, 4096, 2816), true, None, MAX_SHARED_BYTES).map(|(_, l)| l), Some(BLayout::NkPanels));
        // Not whole panels, or not one whole [n][k] matrix: refused, never read as row-major.
        assert_eq!(tile(&GemmParams::linear(256, 4096, 2800), true, None, MAX_SHARED_BYTES), None);
        assert_eq!(tile(&GemmParams { b_cs: 4096, ..q }, true, None, MAX_SHARED_BYTES), None);
        let kn = GemmParams { b_rs: 4096, b_cs: 1, ..q };
        assert_eq!(tile(&kn, true, None, MAX_SHARED_BYTES), None);
    }
}

//! The tensor-core tiles no planner rule picks: built, tested and measured, and slower (or no
//! faster) than the product's tiles where they were measured (bench/history). They stay here so
//! that a lab variable (`DG_COOP_TILE`, `DG_COOP_GROUPED_TILE`, `crate::overrides`) or a probe can
//! run them again; dg-kernels renders any valid tile, so a tile is data, not code. Promoting one
//! takes a planner rule and a changed golden plan (docs/architecture.md).

use dg_kernels::coop_gemm::{self, CoopTile, Staging};
use dg_kernels::coop_grouped_gemm;

/// `TILE_64X64` with K steps of 64 (36 KiB): half the barriers.
pub const TILE_64X64_K64: CoopTile = CoopTile { bk: 64, ..coop_gemm::TILE_64X64 };
/// `TILE_64X128` with scalar f16 staging (the plainest WGSL).
pub const TILE_64X128_SCALAR: CoopTile = CoopTile { staging: Staging::Scalar, ..coop_gemm::TILE_64X128 };
/// 128 × 128 in 4 subgroups of 64 × 64 (128 accumulator registers an invocation): built only by
/// the probes (`dense_wide_subgroups_probe`) and validated by naga, never chosen. With f16
/// activations on an H100 it was slower than `TILE_128X128` at every depth and split but one
/// (bench/HISTORY.md, "The driver's own cooperative-matrix GEMM, and 64 × 64 subgroups").
pub const TILE_128X128_W4: CoopTile = CoopTile::vec4(128, 128, 32, 64, 64);
/// `TILE_64X64` with K steps of 16 (16 KiB with the scratch): three workgroups fit a
/// multiprocessor's workgroup memory where `TILE_64X64`'s 24 KiB fit two.
pub const TILE_64X64_K16: CoopTile = CoopTile { bk: 16, ..coop_gemm::TILE_64X64 };
/// `TILE_64X64_K16` with 8 subgroups of 32×16 (256 invocations): twice the subgroups per
/// workgroup to hide the loads' latency.
pub const TILE_64X64_K16_W8: CoopTile = CoopTile { wn: 16, ..TILE_64X64_K16 };

/// The dense tiles of this module a lab variable may name (after the product's
/// `coop_gemm::TILES`).
pub const DENSE: &[CoopTile] = &[TILE_64X64_K64, TILE_64X128_SCALAR, TILE_64X64_K16, TILE_64X64_K16_W8];

/// 16 × 256, 16×64 per subgroup (4 subgroups): wide tiles for short K (the down projection, K 704,
/// N 2816); tested and timed, but not picked by `choose` (32 × 128 measured faster in the forward).
pub const TILE_16X256: CoopTile = CoopTile::vec4(16, 256, 32, 16, 64);
/// 16 × 128, 16×32 per subgroup (4 subgroups): half the accumulators of `TILE_32X128` per
/// subgroup (fewer registers, more workgroups resident); a group over 16 slots takes two m tiles.
pub const TILE_16X128: CoopTile = CoopTile::vec4(16, 128, 32, 16, 32);
/// 32 × 128 in 8 subgroups of 16×32 (256 invocations): `TILE_32X128`'s tile with half the
/// accumulators per subgroup. On an H200 at depth 4 (114 registers against `EXPERT_TILE`'s 216,
/// twice the subgroups resident), F16 experts 493 / 268 µs for gate/up / down against 344 / 198.
pub const TILE_32X128_W8: CoopTile = CoopTile { wm: 16, ..coop_grouped_gemm::TILE_32X128 };
/// 32 × 128 in K steps of 64 (two K panels a step): twice the tensor-core work of
/// `TILE_32X128` per barrier. Single-staged only: its two stages would be over
/// `MAX_SHARED_BYTES` (`runs`). Tested, and measured slower: on an H200 in the real 6-layer
/// forward (µs for gate/up and down, F16) 454 / 291 at depth 1 and 447 / 279 at depth 2 against
/// `EXPERT_TILE`'s 344 / 198 (its larger stage and ring leave fewer workgroups resident;
/// bench/HISTORY.md, "Measured next session").
pub const TILE_32X128_K64: CoopTile = CoopTile { bk: 64, ..coop_grouped_gemm::TILE_32X128 };
/// 32 × 256 in 8 subgroups of 32×32 (256 invocations): `TILE_32X128`'s subgroups twice over,
/// so that each of the activations' tiles is read by half as many workgroups (the down
/// projection, N 2816, in 11 n tiles instead of 22).
/// Measured slower: on an H200 in the real 6-layer forward the F16 down projection took 232.5 µs
/// at depth 4 (282.8 at depth 2) against `EXPERT_TILE`'s 190.2, `q4_k_m`'s Q5_0 down 264.1
/// against 221.4 (one workgroup of 8 subgroups a multiprocessor instead of two of 4).
pub const TILE_32X256: CoopTile = CoopTile::vec4(32, 256, 32, 32, 32);

/// The experts' tiles of this module a lab variable may name (after the product's
/// `coop_grouped_gemm::TILES`).
pub const GROUPED: &[CoopTile] = &[TILE_16X256, TILE_16X128, TILE_32X128_W8, TILE_32X128_K64, TILE_32X256];

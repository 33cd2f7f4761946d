//! Throughput probes of the experts' tensor-core products at the real geometry's shapes: every
//! candidate tile and path, residency by workgroup memory, the grid's empty workgroups, the
//! weights streamed alone, the last wave of workgroups, and f32 against f16 activations (with the
//! dense projections' products too).

use dg_gpu::{GpuContext, Pipelines};
use dg_kernels::coop_gemm::{self, AFormat, CoopTile};
use dg_kernels::coop_grouped_gemm::{self, WPath};
use dg_kernels::coop_kloop::Ring;

use super::best_time;
use super::{ProbeError, ProbeOptions, replaced, time_dispatch};
use dg_parity::testing::coop_experts::{Buffers, Case, Inputs, check, grouped_reference, real_counts, run_grouped, run_tile, tile_plan};
use dg_parity::testing::half_activations::{Dense, Grouped};

/// The real geometry's expert products (gate_up: 1408 × 2816 with gather; down: 2816 × 704), every
/// 13th slot checked against the exact product, then timed: every candidate tile of
/// [`TIMED_TILES`], the direct tile by workgroup memory, the grid with every expert empty, the
/// weights streamed alone, and the time against the experts that have rows.
pub fn coop_grouped_gemm_throughput_at_the_real_expert_shapes(ctx: &GpuContext, _options: &ProbeOptions) -> Result<(), ProbeError> {
    let test = "coop_grouped_gemm_throughput_at_the_real_expert_shapes";
    let mut pipelines = Pipelines::default();
    let counts = real_counts(99);
    for (name, n, k, gather) in [("gate_up", 1408, 2816, true), ("down", 2816, 704, false)] {
        let case = Case { n, k, counts: counts.clone(), gather };
        let x = case.inputs(40 + n as u64);
        let got = run_grouped(ctx, &mut pipelines, &x);
        let pick = |s: usize| s.is_multiple_of(13);
        let want = grouped_reference(&x, pick);
        check(&got, &want, &x, pick, &format!("real {name}"));
        for &(tile, path) in TIMED_TILES {
            if coop_grouped_gemm::shared_bytes_with(tile, path) > ctx.limits.max_compute_workgroup_storage_size || !tile.is_valid() {
                println!("{test}: {name} [{} {path:?}] does not fit this device", tile.label());
                continue;
            }
            if !x.params.n.is_multiple_of(tile.bn) || !x.params.k.is_multiple_of(tile.bk) {
                continue;
            }
            let direct = run_tile(ctx, &mut pipelines, tile, path, &x);
            check(&direct, &want, &x, pick, &format!("real {name} tile {} {path:?}", tile.label()));
            let best = time_tile(ctx, &mut pipelines, tile, path, &x);
            let bytes = (128 * n * k * 2) as f64;
            let flops = 2.0 * (x.slots * n * k) as f64;
            println!(
                "{test}: {name} [{} {path:?}] {:.1} us, {:.0} GB/s of weights, {:.1} TFLOP/s",
                tile.label(),
                best * 1e6,
                bytes / best / 1e9,
                flops / best / 1e12
            );
        }
        // Residency: the direct tile (9 KiB of workgroup memory) with its scratch padded to 20
        // and 34 KiB, so that at most two, then one, workgroups share a multiprocessor.
        let direct = coop_grouped_gemm::source_with(coop_grouped_gemm::TILE_32X128, WPath::Direct);
        let mut line = format!("{test}: {name} [32x128 Direct] by workgroup memory:");
        for (kib, extra) in [(9u32, 0u32), (20, 2816), (34, 6400)] {
            let padded = replaced(
                &direct,
                &format!("pad{kib}"),
                &[("var<workgroup> scratch: array<f32, WT * 8u>;", &format!("var<workgroup> scratch: array<f32, WT * 8u + {extra}u>;"))],
            );
            let pipeline = pipelines.get_source(ctx, padded)?;
            let b = Buffers::upload(ctx, &x, 32);
            let buffers = [&b.a, &b.w.buffer, &b.offsets, &b.rows, &b.c];
            let t = time_dispatch(
                ctx,
                &pipeline,
                &x.params,
                &buffers,
                coop_grouped_gemm::workgroups(coop_grouped_gemm::TILE_32X128, &x.params),
                50,
            )?;
            line += &format!(" | {kib} KiB: {:.1} us", t * 1e6);
        }
        println!("{line}");
        // The same grid with every expert empty: what the workgroups that exit at once cost.
        let (tile, path) = (coop_grouped_gemm::TILE_32X128, WPath::Direct);
        let mut b = Buffers::upload(ctx, &x, tile.bk);
        b.offsets = ctx.upload("offsets", &vec![0u32; x.offsets.len()])?;
        let empty = best_time(ctx, &tile_plan(ctx, &mut pipelines, tile, path, &x, &b, 50), 50);
        println!("{test}: {name} [{} {path:?}] every expert empty: {:.1} us", tile.label(), empty * 1e6);
        // The W bytes alone: every workgroup of the 32 × 128 grid streams its experts' panels
        // (8 KiB a K step) as 16-byte loads with no products: the read ceiling of this layout.
        let stream = {
            let tiles_n = n as u32 / 128;
            let source = dg_kernels::KernelSource {
                name: format!("stream_panels_{name}"),
                wgsl: STREAM_PANELS_WGSL.to_string(),
                entry: "main",
                buffers: vec![dg_kernels::Access::Read, dg_kernels::Access::ReadWrite],
                params_size: 16,
            };
            let pipeline = pipelines.get_source(ctx, source)?;
            let out = ctx.storage_buffer("out", 128 * 4 * u64::from(128 * tiles_n))?;
            let mut line = format!("{test}: {name} W streamed alone (panels; tile-major with 1, 4 tiles a workgroup):");
            for mode in [0u32, 1, 4, 0] {
                let params = [n as u32, k as u32, tiles_n, mode];
                let t = time_dispatch(
                    ctx,
                    &pipeline,
                    &params,
                    &[&b.w.buffer, &out],
                    dg_gpu::groups_1d((128 * tiles_n).div_ceil(mode.max(1)), 65535),
                    20,
                )?;
                line += &format!(" | {:.1} us {:.0} GB/s", t * 1e6, (128 * n * k * 2) as f64 / t / 1e9);
            }
            line
        };
        println!("{stream}");
        // How the time grows with the experts that have rows (16 each, the rest empty): one m
        // tile and n / 128 workgroups an expert; flat while the multiprocessors have room.
        let mut line = format!("{test}: {name} [{} {path:?}] experts of 16 rows (workgroups):", tile.label());
        for active in [1usize, 12, 24, 48, 72, 96, 128] {
            let counts: Vec<u32> = (0..128).map(|e| if e < active { 16 } else { 0 }).collect();
            let y = Case { n, k, counts, gather }.inputs(50);
            let b = Buffers::upload(ctx, &y, tile.bk);
            let t = best_time(ctx, &tile_plan(ctx, &mut pipelines, tile, path, &y, &b, 20), 20);
            line += &format!(" | {active} ({}): {:.1} us", active * n / 128, t * 1e6);
        }
        println!("{line}");
    }
    Ok(())
}

/// Streams the experts' F16 weights in 8 KiB blocks with 16-byte loads and no products, either as
/// the 32 × 128 expert tile's workgroups read the K panels (workgroup `g · tiles_n + t` reads
/// columns `128·t ..` of expert `g`, one block a K step, the blocks a panel apart), or as they
/// would read a tile-major layout (each workgroup's blocks back to back, one or more tiles a
/// workgroup); `p = (n, k, tiles_n, mode)`. The bytes read are the same; only their order differs.
pub const STREAM_PANELS_WGSL: &str = "@group(0) @binding(0) var<uniform> p: vec4<u32>;
@group(0) @binding(1) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;
@compute @workgroup_size(128)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lt: u32) {
    let id = wid.x + nwg.x * wid.y;
    let steps = p.y / 32u;
    // p.w: 0 panels, 1 tile-major (each workgroup's blocks back to back), t > 1 tile-major with
    // t tiles a workgroup.
    let per = max(p.w, 1u);
    if (id * per >= 128u * p.z) {
        return;
    }
    var first = (id * per) * steps * 512u + lt;
    var step = 512u;
    if (p.w == 0u) {
        first = (id / p.z) * (p.x * p.y / 8u) + (id % p.z) * 512u + lt;
        step = p.x * 4u;
    }
    var acc = vec4<u32>();
    for (var s = 0u; s < steps * per; s++) {
        let at = first + s * step;
        acc ^= w[at] ^ w[at + 128u] ^ w[at + 256u] ^ w[at + 384u];
    }
    out[id * 128u + lt] = acc.x ^ acc.y ^ acc.z ^ acc.w;
}
";

/// Tiles timed at the real shapes: the kernel's own and other candidates (K steps of 32 to 128,
/// 16- and 32-row tiles, 4 and 8 subgroups).
const TIMED_TILES: &[(CoopTile, WPath)] = &[
    (coop_grouped_gemm::TILE_32X128, WPath::Direct),
    (coop_grouped_gemm::TILE_32X128, WPath::Single),
    (coop_grouped_gemm::TILE_32X128.with_depth(2), WPath::Single),
    (coop_grouped_gemm::TILE_32X128, WPath::Staged),
    (crate::tiles::TILE_16X128, WPath::Single),
    (coop_grouped_gemm::TILE_32X64, WPath::Single),
    (coop_grouped_gemm::TILE_32X128.with_depth(2), WPath::Direct),
    (crate::tiles::TILE_16X128, WPath::Direct),
    (CoopTile::vec4(32, 256, 32, 32, 32), WPath::Direct),
    (CoopTile::vec4(32, 256, 32, 32, 64), WPath::Direct),
];

/// Best time of one dispatch of `tile` over 5 submissions of 50 replays, in seconds.
fn time_tile(ctx: &GpuContext, pipelines: &mut Pipelines, tile: CoopTile, path: WPath, x: &Inputs) -> f64 {
    let replays = 50;
    let b = Buffers::upload(ctx, x, tile.bk);
    best_time(ctx, &tile_plan(ctx, pipelines, tile, path, x, &b, replays), replays)
}

/// µs per product at the real geometry's shapes with f32 and f16 activations, alternating:
/// the experts' gate/up and down, and the decoder's dense
/// projections on 128 × 128 tiles in the forward's splits.
pub fn f16_activations_throughput_at_the_real_shapes(ctx: &GpuContext, _options: &ProbeOptions) -> Result<(), ProbeError> {
    let test = "f16_activations_throughput_at_the_real_shapes";
    let mut pipelines = Pipelines::default();
    let replays = 20;
    // 256 tokens × top-8 over 128 experts, as evenly as a real routing spreads them.
    let counts: Vec<u32> = (0..128u32).map(|e| 10 + (e * 7) % 13).collect();
    let gate_up = Grouped::new(ctx, 1408, 2816, &counts, true);
    let down = Grouped::new(ctx, 2816, 704, &counts, false);
    // The forward's tile (single-staged 32×128, four steps ahead) against the other format and a
    // shallower ring.
    let tile = coop_grouped_gemm::TILE_32X128;
    let configs = [(AFormat::F32, 4), (AFormat::F16, 4), (AFormat::F32, 2), (AFormat::F16, 2)];
    for (name, g) in [("experts gate_up", &gate_up), ("experts down", &down)] {
        let mut line = format!("{test}: {name} [{} Single] f32 d4 / f16 d4 / f32 d2 / f16 d2:", tile.label());
        for _ in 0..2 {
            for (format, depth) in configs {
                let t = best_time(ctx, &g.plan(ctx, &mut pipelines, tile.with_depth(depth), WPath::Single, format, replays), replays);
                line += &format!(" {:.1}", t * 1e6);
            }
        }
        println!("{line} us");
    }
    for (name, shape, splits) in [
        ("q", (256, 4096, 2816), 2),
        ("o", (256, 2816, 4096), 3),
        ("mlp gate_up", (256, 4224, 2816), 2),
        ("mlp down", (256, 2816, 2112), 3),
    ] {
        // A ring set holds 24 registers with f32 A and 16 with f16 A, so f16 at depth 4 costs
        // what f32 costs at depth 3 (the forward's).
        // The batched ring (every load waited for `depth` steps after its issue, for a second
        // bank of registers) cost the f32 tiles 3–10%; with f16 A a bank is two thirds the size.
        let configs = [
            (AFormat::F32, 3, Ring::Staggered),
            (AFormat::F32, 4, Ring::Staggered),
            (AFormat::F16, 3, Ring::Staggered),
            (AFormat::F16, 4, Ring::Staggered),
            (AFormat::F16, 2, Ring::Batched),
            (AFormat::F16, 3, Ring::Batched),
        ];
        let mut line = format!(
            "{test}: {name} {shape:?} [128x128] {splits} splits, f32 d3 / f32 d4 / f16 d3 / f16 d4 / f16 d2 batched / f16 d3 batched:"
        );
        for _ in 0..2 {
            for (format, depth, ring) in configs {
                let dense = Dense::new(ctx, shape, coop_gemm::TILE_128X128.with_depth(depth), splits);
                let t = best_time(ctx, &dense.plan_ring(ctx, &mut pipelines, format, ring, replays), replays);
                line += &format!(" {:.1}", t * 1e6);
            }
        }
        println!("{line} us");
    }
    Ok(())
}

/// Whether the experts' products lose time to their last wave of workgroups:
/// the forward's gate/up and down tiles timed over 16 slots an
/// expert for a sweep of expert counts. Without a tail the time grows with the experts; where a
/// multiprocessor runs `r` workgroups, it steps every `132 r / n_tiles` experts instead.
pub fn experts_wave_probe(ctx: &GpuContext, _options: &ProbeOptions) -> Result<(), ProbeError> {
    let test = "experts_wave_probe";
    let mut pipelines = Pipelines::default();
    let replays = 20;
    let tile = coop_grouped_gemm::TILE_32X128;
    let depth = coop_grouped_gemm::EXPERT_DEPTH;
    for (name, n, k, gather, format) in [("gate_up", 1408, 2816, true, AFormat::F32), ("down", 2816, 704, false, AFormat::F16)] {
        let mut line = format!("{test}: {name} [{} Single d{depth}], 16 slots an expert, experts:", tile.label());
        for experts in (60u32..=144).step_by(6) {
            let g = Grouped::new(ctx, n, k, &vec![16; experts as usize], gather);
            let t = best_time(ctx, &g.plan(ctx, &mut pipelines, tile.with_depth(depth), WPath::Single, format, replays), replays);
            line += &format!(" | {experts}: {:.1}", t * 1e6);
        }
        println!("{line} us");
    }
    Ok(())
}

/// The dense projections on 128 × 128 tiles in 4 subgroups of 64 × 64 with f16 activations,
/// against the forward's 8 subgroups of 32 × 64 with f32 A at depth 3: 64 × 64 subgroups hold
/// 128 accumulator registers an invocation, and with f16 A a ring set takes 32 registers where
/// f32's takes 48, so two workgroups (two barrier domains) may share a multiprocessor at depth 2.
/// µs per product in the forward's K splits and in twice as many, and the largest difference of C
/// from the forward's tile.
pub fn dense_wide_subgroups_probe(ctx: &GpuContext, _options: &ProbeOptions) -> Result<(), ProbeError> {
    let test = "dense_wide_subgroups_probe";
    let mut pipelines = Pipelines::default();
    let replays = 20;
    let wide = crate::tiles::TILE_128X128_W4;
    let forward = coop_gemm::TILE_128X128.with_depth(3);
    for (name, shape, splits) in [
        ("q", (256, 4096, 2816), 2),
        ("o", (256, 2816, 4096), 3),
        ("mlp gate_up", (256, 4224, 2816), 2),
        ("mlp down", (256, 2816, 2112), 3),
        ("head quarter", (256, 65536, 2816), 1),
    ] {
        let reference = Dense::new(ctx, shape, forward, splits);
        let want = reference.run(ctx, &mut pipelines, AFormat::F32);
        let mut line = format!("{test}: {name} {shape:?} forward's [{}] f32 d3 {splits} splits:", forward.label());
        for _ in 0..2 {
            let t = best_time(ctx, &reference.plan(ctx, &mut pipelines, AFormat::F32, replays), replays);
            line += &format!(" {:.1}", t * 1e6);
        }
        println!("{line} us");
        let configs = [(1, Ring::Staggered), (2, Ring::Staggered), (3, Ring::Staggered), (2, Ring::Batched)];
        for factor in [1, 2] {
            for (depth, ring) in configs {
                let dense = Dense::new(ctx, shape, wide.with_depth(depth), splits * factor);
                let got = dense.run_ring(ctx, &mut pipelines, AFormat::F16, ring);
                let diff = got.iter().zip(&want).map(|(g, w)| (g - w).abs()).fold(0.0f32, f32::max);
                let mut line = format!(
                    "{test}: {name} [{}] f16 d{depth} {ring:?} {} splits (max |C - forward's| {diff:e}):",
                    wide.label(),
                    splits * factor
                );
                for _ in 0..2 {
                    let t = best_time(ctx, &dense.plan_ring(ctx, &mut pipelines, AFormat::F16, ring, replays), replays);
                    line += &format!(" {:.1}", t * 1e6);
                }
                println!("{line} us");
            }
        }
    }
    Ok(())
}

//! The tensor-core kernels as the F16 mode's forward records them, on a device with cooperative
//! matrices: `Recorder::grouped_gemm_matrix` on F16 experts in K panels
//! (`dg_kernels::coop_grouped_gemm`, every tile, W staged and direct), and through
//! `dg_kernels::coop_gemm` `Recorder::batched_linear_format` (K and V in one dispatch),
//! `Recorder::head_linear` (a softcapped vocabulary chunk from F16 or BF16 weights) and
//! `Recorder::gemm_auto` (attention's strided GQA products, ragged columns included) and
//! `Recorder::gemm_matrix` (dense projections in K panels, ragged rows included), each against
//! the exact (f64) product of the f16-rounded operands. Every output has a guard band and values
//! the kernel must not touch.
//!
//! On a device without cooperative matrices (lavapipe) these tests print a visible SKIP: the
//! Recorder takes the f32-arithmetic kernels there, which `kernels_bf16.rs` covers.
//!
//! Throughput at the real expert shapes: `cargo test -p dg-gpu --test tensor_cores --release
//! -- --include-ignored --nocapture`.

use std::sync::Arc;

use dg_gpu::ops::{Batches, Recorder};
use dg_parity::testing::{GUARD, best_time, coop_test_context, guarded_output, max_rel_err, push_product, read_guarded, seeded};
use dg_gpu::{GpuContext, GpuMatrix, MatrixLayout, Pipelines};
use dg_kernels::grouped_gemm::GroupedGemmParams;
use dg_kernels::coop_gemm::{CoopTile, Staging};
use dg_kernels::coop_grouped_gemm::WPath;
use dg_kernels::{WeightFormat, coop_grouped_gemm};

/// Tolerance on max |C − C_ref| / max |C_ref| against the exact product of the f16-rounded
/// operands: products of two f16 values are exact in f32, so the only error is the f32
/// accumulation over k terms, about ε·√k of the largest output (see `coop_gemm.rs`); 16·ε·√k
/// leaves a wide margin while an indexing or staging bug gives errors of order 1.
fn tolerance(k: usize) -> f32 {
    16.0 * f32::EPSILON * (k as f32).sqrt()
}

/// The device's f32 `tanh` against the exact one, relative to the cap: the f32 GEMM's softcap
/// epilogue uses the same `tanh`, and the f32 GPU logits agree with the CPU's to 2.7e-6
/// normwise on an H200.
const TANH_ALLOWANCE: f32 = 4e-6;

fn f16_round(v: &[f32]) -> Vec<f32> {
    v.iter().map(|&x| half::f16::from_f32(x).to_f32()).collect()
}


/// One grouped product's inputs.
struct Case {
    n: usize,
    k: usize,
    counts: Vec<u32>,
    gather: bool,
}

#[derive(Clone)]
struct Inputs {
    params: GroupedGemmParams,
    offsets: Vec<u32>,
    rows: Vec<u32>,
    a: Vec<f32>,
    w: Vec<f32>,
    c0: Vec<f32>,
    slots: usize,
}

impl Case {
    /// Seeded inputs with padded strides: A rows of k + 4, C rows of n + 4 (columns n.. must keep
    /// their values); the experts back to back, as the K-panel upload stores them.
    fn inputs(&self, seed: u64) -> Inputs {
        let (n, k) = (self.n, self.k);
        let mut offsets = vec![0u32];
        for &c in &self.counts {
            offsets.push(offsets.last().unwrap() + c);
        }
        let slots = *offsets.last().unwrap() as usize;
        let tokens = if self.gather { slots.div_ceil(3).max(1) } else { slots.max(1) };
        let rows: Vec<u32> = (0..slots.max(1)).map(|s| ((s * 7 + 3) % tokens) as u32).collect();
        let (a_rs, c_rs, stride) = (k + 4, n + 4, n * k);
        let params = GroupedGemmParams {
            n: n as u32,
            k: k as u32,
            groups: self.counts.len() as u32,
            max_rows: *self.counts.iter().max().unwrap(),
            a_rs: a_rs as u32,
            b_group_stride: stride as u32,
            c_rs: c_rs as u32,
            gather: u32::from(self.gather),
            ..bytemuck::Zeroable::zeroed()
        };
        Inputs {
            params,
            offsets,
            rows,
            a: seeded(tokens * a_rs, seed, 1.0),
            w: f16_round(&seeded(self.counts.len() * stride, seed + 1, 1.0)),
            c0: seeded(slots.max(1) * c_rs, seed + 2, 2.0),
            slots,
        }
    }
}

impl Inputs {
    /// The same product over the tile table of m tiles of `tile_rows` (after the offsets, as
    /// `moe_dispatch` writes it) instead of the `max_rows` grid.
    fn with_table(&self, tile_rows: u32) -> Inputs {
        let groups = self.params.groups as usize;
        let counts: Vec<u32> = self.offsets[..=groups].windows(2).map(|w| w[1] - w[0]).collect();
        let table = coop_grouped_gemm::tile_table(&counts, self.slots as u32, tile_rows);
        let params = GroupedGemmParams { tiles: table.len() as u32, tile_rows, ..self.params };
        Inputs { params, offsets: [&self.offsets[..=groups], &table[..]].concat(), ..self.clone() }
    }
}

/// The experts of `x` as the F16 upload on a tensor-core device stores them: K panels of `panel`
/// columns.
fn panelled(ctx: &GpuContext, x: &Inputs, panel: u32) -> GpuMatrix {
    let (n, k) = (x.params.n as usize, x.params.k as usize);
    let words: Vec<u32> = x.w.chunks_exact(n * k).flat_map(|g| coop_grouped_gemm::pack_f16_panels(g, n, k, panel as usize)).collect();
    GpuMatrix { buffer: ctx.upload("w", &words).unwrap(), format: WeightFormat::F16, layout: MatrixLayout::KPanels }
}

/// The buffers of one grouped product: experts in K panels of `panel` columns, C holding `c0`
/// inside a guard band.
struct Buffers {
    a: wgpu::Buffer,
    w: GpuMatrix,
    offsets: wgpu::Buffer,
    rows: wgpu::Buffer,
    c: wgpu::Buffer,
}

impl Buffers {
    fn upload(ctx: &GpuContext, x: &Inputs, panel: u32) -> Self {
        let c = guarded_output(ctx, "c", x.c0.len());
        ctx.queue.write_buffer(&c, 0, bytemuck::cast_slice(&x.c0));
        Buffers {
            a: ctx.upload("a", &x.a).unwrap(),
            w: panelled(ctx, x, panel),
            offsets: ctx.upload("offsets", &x.offsets).unwrap(),
            rows: ctx.upload("rows", &x.rows).unwrap(),
            c,
        }
    }
}

/// Runs the grouped product through the Recorder on F16 experts in K panels; returns C.
fn run_grouped(ctx: &GpuContext, pipelines: &mut Pipelines, x: &Inputs) -> Vec<f32> {
    let b = Buffers::upload(ctx, x, coop_grouped_gemm::PANEL);
    let mut rec = Recorder::new(ctx, pipelines);
    rec.grouped_gemm_matrix(&b.a, &b.w, &b.offsets, &b.rows, &b.c, x.slots, x.params).unwrap();
    rec.finish().unwrap().run(ctx).unwrap();
    read_guarded(ctx, &b.c, x.c0.len())
}

/// The exact product of the f16-rounded operands over the slots `pick` keeps; C's other values as
/// they were.
fn grouped_reference(x: &Inputs, pick: impl Fn(usize) -> bool) -> Vec<f32> {
    let p = &x.params;
    let (n, k, a_rs, c_rs, stride) = (p.n as usize, p.k as usize, p.a_rs as usize, p.c_rs as usize, p.b_group_stride as usize);
    let a16 = f16_round(&x.a);
    let mut want = x.c0.clone();
    for e in 0..p.groups as usize {
        for s in (x.offsets[e] as usize..x.offsets[e + 1] as usize).filter(|&s| pick(s)) {
            let row = if p.gather != 0 { x.rows[s] as usize } else { s };
            for j in 0..n {
                let sum: f64 = (0..k).map(|q| f64::from(a16[row * a_rs + q]) * f64::from(x.w[e * stride + j * k + q])).sum();
                want[s * c_rs + j] = sum as f32;
            }
        }
    }
    want
}

fn check(got: &[f32], want: &[f32], x: &Inputs, pick: impl Fn(usize) -> bool, what: &str) {
    let c_rs = x.params.c_rs as usize;
    let n = x.params.n as usize;
    for s in 0..x.slots {
        for j in n..c_rs {
            assert_eq!(got[s * c_rs + j].to_bits(), want[s * c_rs + j].to_bits(), "{what}: slot {s} column {j} past n was written");
        }
    }
    let (mut g, mut w) = (Vec::new(), Vec::new());
    for s in (0..x.slots).filter(|&s| pick(s)) {
        g.extend_from_slice(&got[s * c_rs..s * c_rs + n]);
        w.extend_from_slice(&want[s * c_rs..s * c_rs + n]);
    }
    assert!(g.iter().all(|&v| v != GUARD), "{what}: a slot left unwritten");
    let (err, at) = max_rel_err(&g, &w);
    let tol = tolerance(x.params.k as usize);
    assert!(err <= tol, "{what}: rel err {err} > {tol} at {at}: got {} want {}", g[at], w[at]);
}

#[test]
fn coop_grouped_gemm_matches_the_exact_product_on_every_tile() {
    let test = "coop_grouped_gemm_matches_the_exact_product_on_every_tile";
    let Some(ctx) = coop_test_context(test) else { return };
    let mut pipelines = Pipelines::default();
    // Counts around the 32- and 64-row tile edges (full and partial tiles, several m tiles, empty
    // experts), and the uneven counts of a real routing.
    let edges = vec![31, 32, 33, 64, 65, 0, 1, 96];
    let uneven = vec![5, 0, 37, 1, 0, 70, 16, 3];
    for &tile in coop_grouped_gemm::TILES {
        for counts in [&edges, &uneven] {
            for gather in [false, true] {
                // n = 3·bn: 192 fits only the 64-wide tile, 384 the 128-wide ones; 3 or 7 K steps,
                // fewer than some rings and no multiple of any ring's length.
                let case = Case { n: 3 * tile.bn as usize, k: if gather { 224 } else { 96 }, counts: counts.clone(), gather };
                let x = case.inputs(7 + tile.bm as u64);
                // The Recorder chooses by shape; the tile under test also runs directly.
                let got = run_grouped(&ctx, &mut pipelines, &x);
                let want = grouped_reference(&x, |_| true);
                check(&got, &want, &x, |_| true, &format!("n {} counts {counts:?} gather {gather}", case.n));
                // With a table of the chosen tile's rows, and of other rows (the grid then).
                for rows in [32, 64] {
                    let tabled = run_grouped(&ctx, &mut pipelines, &x.with_table(rows));
                    assert!(tabled == got, "n {} counts {counts:?} gather {gather}: other bits with a table of {rows} rows", case.n);
                }
                for path in [WPath::Staged, WPath::Direct, WPath::Single] {
                    let direct = run_tile(&ctx, &mut pipelines, tile, path, &x);
                    check(&direct, &want, &x, |_| true, &format!("tile {} {path:?} counts {counts:?} gather {gather}", tile.label()));
                    // The tile table's grid runs the same tiles.
                    let tabled = run_tile(&ctx, &mut pipelines, tile, path, &x.with_table(tile.bm));
                    assert!(tabled == direct, "tile {} {path:?} counts {counts:?} gather {gather}: other bits over the tile table", tile.label());
                    // Deeper rings add the same products in the same order: the same bits.
                    for depth in 2..=dg_kernels::coop_kloop::MAX_DEPTH {
                        let deeper = run_tile(&ctx, &mut pipelines, tile.with_depth(depth), path, &x);
                        assert!(deeper == direct, "tile {} {path:?} depth {depth} counts {counts:?} gather {gather}: other bits than depth 1", tile.label());
                    }
                }
            }
        }
    }
}

/// A plan of `replays` dispatches of `tile`'s kernel on `b` (bypassing the Recorder's choice).
fn tile_plan(ctx: &GpuContext, pipelines: &mut Pipelines, tile: CoopTile, path: WPath, x: &Inputs, b: &Buffers, replays: u32) -> dg_gpu::Plan {
    let pipeline = pipelines.get(ctx, coop_grouped_gemm::source_with(tile, path)).unwrap();
    let mut plan = dg_gpu::PlanBuilder::new(ctx);
    for _ in 0..replays {
        plan.push(&pipeline, &x.params, &[&b.a, &b.w.buffer, &b.offsets, &b.rows, &b.c], coop_grouped_gemm::workgroups(tile, &x.params));
    }
    plan.finish(ctx).unwrap()
}

/// Runs `tile`'s kernel once; returns C.
fn run_tile(ctx: &GpuContext, pipelines: &mut Pipelines, tile: CoopTile, path: WPath, x: &Inputs) -> Vec<f32> {
    let b = Buffers::upload(ctx, x, tile.bk);
    tile_plan(ctx, pipelines, tile, path, x, &b, 1).run(ctx).unwrap();
    read_guarded(ctx, &b.c, x.c0.len())
}

/// 256 tokens routed top-8 over 128 experts by a seeded hash: the decoder's slot counts.
fn real_counts(seed: u64) -> Vec<u32> {
    let mut counts = vec![0u32; 128];
    let mut s = seed | 1;
    for _ in 0..256 {
        let mut chosen = Vec::new();
        while chosen.len() < 8 {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let e = (s % 128) as usize;
            if !chosen.contains(&e) {
                chosen.push(e);
            }
        }
        for e in chosen {
            counts[e] += 1;
        }
    }
    counts
}

/// The real geometry's expert products (gate_up: 1408 × 2816 with gather; down: 2816 × 704), every
/// 13th slot checked against the exact product; with `--include-ignored` the timing too.
fn real_experts(test: &str, timed: bool) {
    let Some(ctx) = coop_test_context(test) else { return };
    let mut pipelines = Pipelines::default();
    let counts = real_counts(99);
    for (name, n, k, gather) in [("gate_up", 1408, 2816, true), ("down", 2816, 704, false)] {
        let case = Case { n, k, counts: counts.clone(), gather };
        let x = case.inputs(40 + n as u64);
        let got = run_grouped(&ctx, &mut pipelines, &x);
        let pick = |s: usize| s.is_multiple_of(13);
        let want = grouped_reference(&x, pick);
        check(&got, &want, &x, pick, &format!("real {name}"));
        if timed {
            for &(tile, path) in TIMED_TILES {
                if coop_grouped_gemm::shared_bytes_with(tile, path) > ctx.limits.max_compute_workgroup_storage_size || !tile.is_valid() {
                    eprintln!("{test}: {name} [{} {path:?}] does not fit this device", tile.label());
                    continue;
                }
                if !x.params.n.is_multiple_of(tile.bn) || !x.params.k.is_multiple_of(tile.bk) {
                    continue;
                }
                let direct = run_tile(&ctx, &mut pipelines, tile, path, &x);
                check(&direct, &want, &x, pick, &format!("real {name} tile {} {path:?}", tile.label()));
                let best = time_tile(&ctx, &mut pipelines, tile, path, &x);
                let bytes = (128 * n * k * 2) as f64;
                let flops = 2.0 * (x.slots * n * k) as f64;
                eprintln!(
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
                let padded = replaced(&direct, &format!("pad{kib}"), &[("var<workgroup> scratch: array<f32, WT * 8u>;", &format!("var<workgroup> scratch: array<f32, WT * 8u + {extra}u>;"))]);
                let pipeline = pipelines.get(&ctx, padded).unwrap();
                let b = Buffers::upload(&ctx, &x, 32);
                let buffers = [&b.a, &b.w.buffer, &b.offsets, &b.rows, &b.c];
                let t = time_dispatch(&ctx, &pipeline, &x.params, &buffers, coop_grouped_gemm::workgroups(coop_grouped_gemm::TILE_32X128, &x.params), 50);
                line += &format!(" | {kib} KiB: {:.1} us", t * 1e6);
            }
            eprintln!("{line}");
            // The same grid with every expert empty: what the workgroups that exit at once cost.
            let (tile, path) = (coop_grouped_gemm::TILE_32X128, WPath::Direct);
            let mut b = Buffers::upload(&ctx, &x, tile.bk);
            b.offsets = ctx.upload("offsets", &vec![0u32; x.offsets.len()]).unwrap();
            let empty = best_time(&ctx, &tile_plan(&ctx, &mut pipelines, tile, path, &x, &b, 50), 50);
            eprintln!("{test}: {name} [{} {path:?}] every expert empty: {:.1} us", tile.label(), empty * 1e6);
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
                let pipeline = pipelines.get(&ctx, source).unwrap();
                let out = ctx.storage_buffer("out", 128 * 4 * u64::from(128 * tiles_n)).unwrap();
                let mut line = format!("{test}: {name} W streamed alone (panels; tile-major with 1, 4 tiles a workgroup):");
                for mode in [0u32, 1, 4, 0] {
                    let params = [n as u32, k as u32, tiles_n, mode];
                    let t = time_dispatch(&ctx, &pipeline, &params, &[&b.w.buffer, &out], dg_gpu::groups_1d((128 * tiles_n).div_ceil(mode.max(1)), 65535), 20);
                    line += &format!(" | {:.1} us {:.0} GB/s", t * 1e6, (128 * n * k * 2) as f64 / t / 1e9);
                }
                line
            };
            eprintln!("{stream}");
            // How the time grows with the experts that have rows (16 each, the rest empty): one m
            // tile and n / 128 workgroups an expert; flat while the multiprocessors have room.
            let mut line = format!("{test}: {name} [{} {path:?}] experts of 16 rows (workgroups):", tile.label());
            for active in [1usize, 12, 24, 48, 72, 96, 128] {
                let counts: Vec<u32> = (0..128).map(|e| if e < active { 16 } else { 0 }).collect();
                let y = Case { n, k, counts, gather }.inputs(50);
                let b = Buffers::upload(&ctx, &y, tile.bk);
                let t = best_time(&ctx, &tile_plan(&ctx, &mut pipelines, tile, path, &y, &b, 20), 20);
                line += &format!(" | {active} ({}): {:.1} us", active * n / 128, t * 1e6);
            }
            eprintln!("{line}");
        }
    }
}

/// Streams the experts' F16 weights in 8 KiB blocks with 16-byte loads and no products, either as
/// the 32 × 128 expert tile's workgroups read the K panels (workgroup `g · tiles_n + t` reads
/// columns `128·t ..` of expert `g`, one block a K step, the blocks a panel apart), or as they
/// would read a tile-major layout (each workgroup's blocks back to back, one or more tiles a
/// workgroup); `p = (n, k, tiles_n, mode)`. The bytes read are the same; only their order differs.
const STREAM_PANELS_WGSL: &str = "@group(0) @binding(0) var<uniform> p: vec4<u32>;
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
    (coop_grouped_gemm::TILE_16X128, WPath::Single),
    (coop_grouped_gemm::TILE_32X64, WPath::Single),
    (coop_grouped_gemm::TILE_32X128.with_depth(2), WPath::Direct),
    (coop_grouped_gemm::TILE_16X128, WPath::Direct),
    (CoopTile { bm: 32, bn: 256, bk: 32, wm: 32, wn: 32, staging: Staging::Vec4, depth: 1 }, WPath::Direct),
    (CoopTile { bm: 32, bn: 256, bk: 32, wm: 32, wn: 64, staging: Staging::Vec4, depth: 1 }, WPath::Direct),
];

/// Best time of one dispatch of `tile` over 5 submissions of 50 replays, in seconds.
fn time_tile(ctx: &GpuContext, pipelines: &mut Pipelines, tile: CoopTile, path: WPath, x: &Inputs) -> f64 {
    let replays = 50;
    let b = Buffers::upload(ctx, x, tile.bk);
    best_time(ctx, &tile_plan(ctx, pipelines, tile, path, x, &b, replays), replays)
}

/// [`best_time`] of `replays` dispatches of one kernel with the same parameters and buffers.
fn time_dispatch<P: bytemuck::Pod>(ctx: &GpuContext, pipeline: &Arc<dg_gpu::Pipeline>, params: &P, buffers: &[&wgpu::Buffer], groups: [u32; 3], replays: u32) -> f64 {
    let mut plan = dg_gpu::PlanBuilder::new(ctx);
    for _ in 0..replays {
        plan.push(pipeline, params, buffers, groups);
    }
    best_time(ctx, &plan.finish(ctx).unwrap(), replays)
}

/// `k` on `tile` cut into `splits` ranges as even as its K steps allow (1: whole).
fn split_into(tile: CoopTile, k: u32, splits: u32) -> dg_kernels::coop_gemm::Split {
    let steps = k / tile.bk;
    let per = steps.div_ceil(splits);
    dg_kernels::coop_gemm::Split { splits: steps.div_ceil(per), steps: per }
}

#[test]
fn coop_grouped_gemm_matches_at_the_real_expert_shapes() {
    real_experts("coop_grouped_gemm_matches_at_the_real_expert_shapes", false);
}

#[test]
#[ignore = "throughput: run with --include-ignored --nocapture on a GPU with cooperative matrices"]
fn coop_grouped_gemm_throughput_at_the_real_expert_shapes() {
    real_experts("coop_grouped_gemm_throughput_at_the_real_expert_shapes", true);
}

/// K and V of a sliding layer in one batched dispatch (the real shape: 256 × 2048 × 2816, two
/// batches) and a small one, against the exact product; C's batches sit `c_stride` apart with a
/// gap that must keep its values.
#[test]
fn batched_coop_linear_matches_the_exact_product() {
    let test = "batched_coop_linear_matches_the_exact_product";
    let Some(ctx) = coop_test_context(test) else { return };
    let mut pipelines = Pipelines::default();
    for (m, n, k) in [(256usize, 2048usize, 2816usize), (64, 32, 64)] {
        let x = seeded(m * k, 5, 1.0);
        let w = f16_round(&seeded(2 * n * k, 6, 1.0));
        let c_stride = m * n + 8;
        let len = 2 * c_stride;
        let xb = ctx.upload("x", &x).unwrap();
        let wb = ctx.upload("w", &dg_kernels::pack_f16(&w)).unwrap();
        let cb = guarded_output(&ctx, "c", len);
        let mut rec = Recorder::new(&ctx, &mut pipelines);
        let batches = Batches { count: 2, x_stride: 0, w_stride: (n * k) as u32, c_stride: c_stride as u32 };
        rec.batched_linear_format(&xb, &wb, WeightFormat::F16, &cb, m, n, k, batches).unwrap();
        rec.finish().unwrap().run(&ctx).unwrap();
        let got = read_guarded(&ctx, &cb, len);
        let x16 = f16_round(&x);
        for b in 0..2 {
            let gap = &got[b * c_stride + m * n..(b + 1) * c_stride];
            assert!(gap.iter().all(|&v| v == GUARD), "{m}x{n}x{k}: batch {b}: the gap after C was written");
            let mut want = vec![0f32; m * n];
            for i in (0..m).step_by(if m > 64 { 7 } else { 1 }) {
                for j in 0..n {
                    let sum: f64 = (0..k).map(|q| f64::from(x16[i * k + q]) * f64::from(w[b * n * k + j * k + q])).sum();
                    want[i * n + j] = sum as f32;
                }
            }
            let rows: Vec<usize> = (0..m).step_by(if m > 64 { 7 } else { 1 }).collect();
            let g: Vec<f32> = rows.iter().flat_map(|&i| got[b * c_stride + i * n..b * c_stride + (i + 1) * n].to_vec()).collect();
            let wv: Vec<f32> = rows.iter().flat_map(|&i| want[i * n..(i + 1) * n].to_vec()).collect();
            let (err, at) = max_rel_err(&g, &wv);
            assert!(err <= tolerance(k), "{m}x{n}x{k}: batch {b}: rel err {err} at {at}: got {} want {}", g[at], wv[at]);
        }
    }
}

/// The tied head on the tensor cores (`Recorder::head_linear` in the F16 mode): one vocabulary
/// chunk of the logits, softcapped, written at its column offset of rows `c_rs` apart, from F16
/// and from BF16 weights (BF16 values in f16's normal range convert exactly), against
/// `cap·tanh(exact / cap)` of the f16-rounded operands. The columns of other chunks keep their
/// guard values.
#[test]
fn head_linear_on_tensor_cores_matches_the_exact_softcapped_product() {
    let test = "head_linear_on_tensor_cores_matches_the_exact_softcapped_product";
    let Some(ctx) = coop_test_context(test) else { return };
    let mut pipelines = Pipelines::default();
    let (m, n, k, c_rs, c_offset, cap) = (64usize, 256usize, 128usize, 512usize, 128usize, 3.0f32);
    let x = seeded(m * k, 11, 1.0);
    let x16 = f16_round(&x);
    for format in [WeightFormat::F16, WeightFormat::Bf16] {
        let w: Vec<f32> = seeded(n * k, 12, 0.5).iter().map(|&v| half::bf16::from_f32(v).to_f32()).collect();
        let packed = if format == WeightFormat::F16 { dg_kernels::pack_f16(&w) } else { dg_kernels::pack_bf16(&w) };
        let xb = ctx.upload("x", &x).unwrap();
        let wb = ctx.upload("w", &packed).unwrap();
        let cb = guarded_output(&ctx, "logits", m * c_rs);
        let mut rec = Recorder::new(&ctx, &mut pipelines);
        rec.head_linear(&xb, &wb, format, &cb, (m, n, k), (c_rs, c_offset), Some(cap), true).unwrap();
        rec.finish().unwrap().run(&ctx).unwrap();
        let got = read_guarded(&ctx, &cb, m * c_rs);
        let w16 = f16_round(&w);
        assert_eq!(w16, w, "BF16 test weights in f16's normal range convert exactly");
        let (mut g, mut want) = (Vec::new(), Vec::new());
        for i in 0..m {
            for col in 0..c_rs {
                let v = got[i * c_rs + col];
                if col < c_offset || col >= c_offset + n {
                    assert_eq!(v, GUARD, "{format:?}: row {i} column {col} outside the chunk was written");
                    continue;
                }
                let j = col - c_offset;
                let dot: f64 = (0..k).map(|q| f64::from(x16[i * k + q]) * f64::from(w16[j * k + q])).sum();
                g.push(v);
                want.push((f64::from(cap) * (dot / f64::from(cap)).tanh()) as f32);
            }
        }
        assert!(want.iter().any(|v| v.abs() > 0.9 * cap), "the softcap is exercised");
        let (err, at) = max_rel_err(&g, &want);
        let tol = tolerance(k) + TANH_ALLOWANCE;
        assert!(err <= tol, "{format:?}: rel err {err} > {tol} at {at}: got {} want {}", g[at], want[at]);
    }
}

/// Attention's products on the tensor cores (`Recorder::gemm_auto` in the F16 mode, f32 operands
/// rounded to f16 when staged): scores over a GQA cache (`[n][k]` keys from a row offset, written
/// at a column offset, scaled: the epilogue path), values (`[k][n]` from a row offset, read from a
/// column offset of the probabilities, accumulated onto C), ragged columns (a tensor-core body and
/// an f32 tail), each against `gemm_reference` on the f16-rounded operands, over the whole C buffer
/// (what the product must not touch included).
#[test]
fn strided_attention_products_on_tensor_cores_match_the_reference() {
    use dg_parity::testing::{attention_scores_params, attention_values_params, gemm_extent, gemm_reference};
    use dg_kernels::gemm::GemmParams;
    let test = "strided_attention_products_on_tensor_cores_match_the_reference";
    let Some(ctx) = coop_test_context(test) else { return };
    let mut pipelines = Pipelines::default();
    let (t, s, d, heads, kv) = (64u32, 128u32, 64u32, 4u32, 2u32);
    let row = kv * d;
    let cases: [(&str, GemmParams); 4] = [
        // A sliding layer sees W − 1 cached keys: 127 here, a 96-column body and a 31-column tail.
        ("ragged scores", GemmParams { b_offset: 4 * row, ..attention_scores_params(t, 127, d, heads, kv, 1.0) }),
        ("scores", GemmParams { b_offset: 4 * row, c_offset: 64, c_rs: s + 64, c_batch: t * (s + 64), ..attention_scores_params(t, s, d, heads, kv, 1.0) }),
        ("scaled scores", GemmParams { b_offset: 8 * row, ..attention_scores_params(t, s, d, heads, kv, 0.125) }),
        ("values, accumulated", GemmParams { a_offset: 32, a_rs: s + 32, a_batch: t * (s + 32), b_offset: 4 * row, accumulate: 1, ..attention_values_params(t, s, d, heads, kv) }),
    ];
    for (name, p) in cases {
        let body = GemmParams { n: p.n / 32 * 32, ..p };
        assert!(dg_kernels::coop_gemm::plan(&body).is_some(), "{name}: meant for the tensor cores");
        let a_len = gemm_extent(p.a_offset, p.batch, p.a_batch, p.m, p.a_rs, p.k, p.a_cs);
        let b_len = gemm_extent(p.b_offset, p.batch.div_ceil(p.b_batch_div), p.b_batch, p.k, p.b_rs, p.n, p.b_cs);
        let c_len = gemm_extent(p.c_offset, p.batch, p.c_batch, p.m, p.c_rs, p.n, 1);
        let a = f16_round(&seeded(a_len, 31, 1.0));
        let b = f16_round(&seeded(b_len, 32, 1.0));
        let c0 = seeded(c_len, 33, 2.0);
        let ab = ctx.upload("a", &a).unwrap();
        let bb = ctx.upload("b", &b).unwrap();
        let cb = guarded_output(&ctx, "c", c_len);
        ctx.queue.write_buffer(&cb, 0, bytemuck::cast_slice(&c0));
        let mut rec = Recorder::new(&ctx, &mut pipelines);
        rec.gemm_auto(&ab, &bb, WeightFormat::F32, &cb, p, true).unwrap();
        rec.finish().unwrap().run(&ctx).unwrap();
        let got = read_guarded(&ctx, &cb, c_len);
        let want = gemm_reference(&p, &a, &b, &c0);
        let (err, at) = max_rel_err(&got, &want);
        let tol = tolerance(p.k as usize);
        assert!(err <= tol, "{name}: rel err {err} > {tol} at {at}: got {} want {}", got[at], want[at]);
    }
}

/// Runs `p` through `Recorder::gemm_auto` on the tensor cores (with a split-K scratch) on seeded
/// f16-exact operands, B stored as `format`; asserts that the plan dispatched a kernel whose name
/// starts with `expect` and compares the whole C buffer with `gemm_reference`.
fn check_gemm_auto(ctx: &GpuContext, pipelines: &mut Pipelines, scratch: &wgpu::Buffer, name: &str, format: WeightFormat, p: dg_kernels::gemm::GemmParams, expect: &str) {
    use dg_parity::testing::{gemm_extent, gemm_reference};
    let bf16_round = |v: &[f32]| -> Vec<f32> { v.iter().map(|&x| half::bf16::from_f32(x).to_f32()).collect() };
    let a_len = gemm_extent(p.a_offset, p.batch, p.a_batch, p.m, p.a_rs, p.k, p.a_cs);
    let b_len = gemm_extent(p.b_offset, p.batch.div_ceil(p.b_batch_div), p.b_batch, p.k, p.b_rs, p.n, p.b_cs);
    let c_len = gemm_extent(p.c_offset, p.batch, p.c_batch, p.m, p.c_rs, p.n, 1);
    let a = f16_round(&seeded(a_len, 61, 1.0));
    let b = f16_round(&bf16_round(&seeded(b_len, 62, 1.0)));
    let c0 = seeded(c_len, 63, 2.0);
    let packed = if format == WeightFormat::F16 { dg_kernels::pack_f16(&b) } else { dg_kernels::pack_bf16(&b) };
    let ab = ctx.upload("a", &a).unwrap();
    let bb = ctx.upload("b", &packed).unwrap();
    let cb = guarded_output(ctx, "c", c_len);
    ctx.queue.write_buffer(&cb, 0, bytemuck::cast_slice(&c0));
    let mut rec = Recorder::new(ctx, pipelines);
    rec.split_k_scratch(scratch);
    rec.gemm_auto(&ab, &bb, format, &cb, p, true).unwrap();
    let plan = rec.finish().unwrap();
    assert!(plan.kernel_names().iter().any(|k| k.starts_with(expect)), "{name}: no {expect} in {:?}", plan.kernel_names());
    plan.run(ctx).unwrap();
    let got = read_guarded(ctx, &cb, c_len);
    let want = gemm_reference(&p, &a, &b, &c0);
    let (err, at) = max_rel_err(&got, &want);
    let tol = tolerance(p.k as usize) + if p.epilogue == dg_kernels::gemm::EPILOGUE_SOFTCAP { TANH_ALLOWANCE } else { 0.0 };
    assert!(err <= tol, "{name}: rel err {err} > {tol} at {at}: got {} want {}", got[at], want[at]);
}

/// Split K through the Recorder (`Recorder::gemm_auto` with a split-K scratch): products with few
/// tiles run K in ranges whose partials `dg_kernels::split_k` adds with the product's own epilogue.
/// The router's shape (8 tiles, F16 `W[n][k]`), a softcapped head chunk at a column offset (BF16),
/// the soft embedding's `[k][n]` BF16 product read from a column offset of the probabilities,
/// scaled and accumulated onto C, and a batched GQA product whose K does not divide evenly into the
/// splits (89 K steps in 18 splits of 5, the last of 4), each against `gemm_reference` on the
/// f16-rounded operands over the whole C buffer.
#[test]
fn split_k_products_on_tensor_cores_match_the_reference() {
    use dg_kernels::gemm::{EPILOGUE_SOFTCAP, GemmParams};
    let test = "split_k_products_on_tensor_cores_match_the_reference";
    let Some(ctx) = coop_test_context(test) else { return };
    let mut pipelines = Pipelines::default();
    let cases: [(&str, WeightFormat, GemmParams); 4] = [
        ("router", WeightFormat::F16, GemmParams::linear(256, 128, 2816)),
        ("softcapped head chunk", WeightFormat::Bf16, GemmParams { c_rs: 192, c_offset: 64, epilogue: EPILOGUE_SOFTCAP, cap: 3.0, ..GemmParams::linear(64, 64, 1024) }),
        (
            "soft embedding",
            WeightFormat::Bf16,
            GemmParams { a_offset: 512, a_rs: 4096, b_rs: 128, b_cs: 1, alpha: 0.5, accumulate: 1, ..GemmParams::new(64, 128, 2048) },
        ),
        (
            "batched GQA, uneven splits",
            WeightFormat::F16,
            GemmParams { batch: 4, a_batch: 64 * 2848, b_batch: 64 * 2848, b_batch_div: 2, c_rs: 72, c_batch: 64 * 72, ..GemmParams::linear(64, 64, 2848) },
        ),
    ];
    let scratch = ctx.storage_buffer("split partials", 16 << 20).unwrap();
    for (name, format, p) in cases {
        check_gemm_auto(&ctx, &mut pipelines, &scratch, name, format, p, "split_k_reduce");
    }
}

/// Stacked `[n, k]` F16 matrices (`w` holds whole blocks) uploaded as the F16 mode uploads a
/// projection on a tensor-core device: each block in K panels.
fn panelled_projection(ctx: &GpuContext, w: &[f32], n: usize, k: usize) -> GpuMatrix {
    use dg_kernels::coop_grouped_gemm::{PANEL, pack_f16_panels};
    let packed: Vec<u32> = w.chunks_exact(n * k).flat_map(|block| pack_f16_panels(block, n, k, PANEL as usize)).collect();
    GpuMatrix { buffer: ctx.upload("w", &packed).unwrap(), format: WeightFormat::F16, layout: MatrixLayout::KPanels }
}

/// Dense projections uploaded in K panels (`MatrixLayout::KPanels`, the F16 mode's q, K/V, o, MLPs
/// and router on a device with cooperative matrices) through `Recorder::gemm_matrix`, against
/// `gemm_reference` on the row-major f16-rounded operands over the whole C buffer: q_proj's real
/// shape; K and V as two batches of one stacked matrix, each block in its own panels; the router's
/// shape, which splits K; and encoder chunks whose rows do not fill the last m tile (77 rows on
/// 64×64 tiles, 1000 on 128×128 in split K), whose extra rows must not be stored.
#[test]
fn panelled_projections_match_the_exact_product() {
    use dg_kernels::gemm::GemmParams;
    let test = "panelled_projections_match_the_exact_product";
    let Some(ctx) = coop_test_context(test) else { return };
    let mut pipelines = Pipelines::default();
    let scratch = ctx.storage_buffer("split partials", 16 << 20).unwrap();
    let kv = |m: u32, n: u32, k: u32| GemmParams { batch: 2, a_batch: 0, b_batch: n * k, c_batch: m * n + 8, ..GemmParams::linear(m, n, k) };
    let cases: [(&str, GemmParams, &str); 5] = [
        ("q_proj", GemmParams::linear(256, 4096, 2816), "coop_gemm_128x128x32_32x64_v4_d3_kp"),
        ("K and V stacked", kv(256, 256, 512), "coop_gemm_128x128x32_32x64_v4_d3_kp"),
        ("router, split K", GemmParams::linear(256, 128, 2816), "split_k_reduce"),
        ("ragged chunk", GemmParams::linear(77, 256, 512), "coop_gemm_64x64x32_32x32_v4_kp"),
        ("ragged batched chunk", kv(1000, 128, 256), "coop_gemm_128x128x32_32x64_v4_d3_kp"),
    ];
    for (name, p, expect) in cases {
        let (m, n, k) = (p.m as usize, p.n as usize, p.k as usize);
        let blocks = p.batch.max(1) as usize;
        let c_len = dg_parity::testing::gemm_extent(p.c_offset, p.batch, p.c_batch, p.m, p.c_rs, p.n, 1);
        let a = seeded(m * k, 71, 1.0);
        let w = f16_round(&seeded(blocks * n * k, 72, 1.0));
        let c0 = seeded(c_len, 73, 2.0);
        let matrix = panelled_projection(&ctx, &w, n, k);
        let ab = ctx.upload("a", &a).unwrap();
        let cb = guarded_output(&ctx, "c", c_len);
        ctx.queue.write_buffer(&cb, 0, bytemuck::cast_slice(&c0));
        let mut rec = Recorder::new(&ctx, &mut pipelines);
        rec.split_k_scratch(&scratch);
        rec.gemm_matrix(&ab, &matrix, &cb, p).unwrap();
        let plan = rec.finish().unwrap();
        let names = plan.kernel_names();
        assert!(names.iter().any(|k| k.starts_with(expect)) && names.iter().any(|k| k.contains("_kp")), "{name}: expected {expect} on K panels, got {names:?}");
        plan.run(&ctx).unwrap();
        let got = read_guarded(&ctx, &cb, c_len);
        let want = dg_parity::testing::gemm_reference(&p, &f16_round(&a), &w, &c0);
        let (err, at) = max_rel_err(&got, &want);
        assert!(err <= tolerance(k), "{name}: rel err {err} > {} at {at}: got {} want {}", tolerance(k), got[at], want[at]);
    }
}

/// `Recorder::linear_product` on a product that splits K (q_proj's real shape on 128 × 128 tiles,
/// W in K panels) leaves its partials to the consumer: no reduction is recorded, the product view
/// has more than one split, and an RMSNorm reading the partials gives the same bits as one reading
/// the product that `gemm_matrix` reduces.
#[test]
fn linear_product_leaves_split_partials_to_their_consumer() {
    let test = "linear_product_leaves_split_partials_to_their_consumer";
    let Some(ctx) = coop_test_context(test) else { return };
    let mut pipelines = Pipelines::default();
    let scratch = ctx.storage_buffer("split partials", 16 << 20).unwrap();
    let (m, n, k) = (256usize, 4096usize, 2816usize);
    let a = ctx.upload("a", &seeded(m * k, 81, 1.0)).unwrap();
    let w = f16_round(&seeded(n * k, 82, 1.0));
    let matrix = panelled_projection(&ctx, &w, n, k);
    let norm_w = ctx.upload("norm", &seeded(n, 83, 1.0)).unwrap();
    let product = ctx.storage_buffer("product", (m * n * 4) as u64).unwrap();
    let mut outputs = Vec::new();
    for deferred in [false, true] {
        let out = guarded_output(&ctx, "normed", m * n);
        let mut rec = Recorder::new(&ctx, &mut pipelines);
        rec.split_k_scratch(&scratch);
        if deferred {
            let view = rec.linear_product(&a, &matrix, &product, m, n, k, Batches::ONE).unwrap();
            assert!(view.splits > 1, "{test}: q_proj's shape did not split ({} splits)", view.splits);
            rec.rmsnorm(view, Some(&norm_w), &norm_w, &out, m, n, 1e-6, false, 1.0).unwrap();
        } else {
            rec.linear_matrix(&a, &matrix, &product, m, n, k).unwrap();
            rec.rmsnorm(&product, Some(&norm_w), &norm_w, &out, m, n, 1e-6, false, 1.0).unwrap();
        }
        let plan = rec.finish().unwrap();
        assert_eq!(plan.kernel_names().contains(&"split_k_reduce"), !deferred, "{test}: {:?}", plan.kernel_names());
        plan.run(&ctx).unwrap();
        outputs.push(read_guarded(&ctx, &out, m * n));
    }
    let first = outputs[0].iter().zip(&outputs[1]).position(|(x, y)| x.to_bits() != y.to_bits());
    assert!(first.is_none(), "{test}: the consumer of the partials differs at {first:?}");
}

/// A matrix in K panels is read only by the tensor cores: a product no tile takes (k not a whole
/// number of panels, or B strides that are not the whole matrix's) is a clear error naming the
/// shape, never a silent row-major read. Runs on every adapter: without cooperative matrices no
/// tile takes any product.
#[test]
fn panelled_matrix_refuses_products_no_tile_takes() {
    use dg_kernels::gemm::GemmParams;
    let test = "panelled_matrix_refuses_products_no_tile_takes";
    let Some(ctx) = dg_parity::testing::test_context(test) else { return };
    let mut pipelines = Pipelines::default();
    let matrix = GpuMatrix { buffer: ctx.upload("w", &vec![0u32; 64 * 48]).unwrap(), format: WeightFormat::F16, layout: MatrixLayout::KPanels };
    let ab = ctx.upload("a", &vec![0f32; 64 * 96]).unwrap();
    let cb = ctx.upload("c", &vec![0f32; 64 * 64]).unwrap();
    for p in [GemmParams::linear(64, 64, 48), GemmParams { b_cs: 96, ..GemmParams::linear(64, 32, 48) }] {
        let mut rec = Recorder::new(&ctx, &mut pipelines);
        let err = rec.gemm_matrix(&ab, &matrix, &cb, p).expect_err("a panelled product no tile takes must fail").to_string();
        assert!(err.contains("K panels") && err.contains(&format!("k {}", p.k)), "{err}");
    }
}

/// Deeper prefetch rings (`dg_kernels::coop_kloop`) add the same products in the same order: the
/// dense kernel gives the same bits at every depth, staged and direct, whole and in K splits, with
/// a partial last m tile, and K steps (7, or 3 and 4 a split) fewer than some rings and no multiple
/// of any ring's length.
#[test]
fn deeper_prefetch_gives_the_same_bits_in_dense_products() {
    use dg_kernels::coop_gemm::{self, BLayout, Split};
    use dg_kernels::gemm::GemmParams;
    let test = "deeper_prefetch_gives_the_same_bits_in_dense_products";
    let Some(ctx) = coop_test_context(test) else { return };
    let mut pipelines = Pipelines::default();
    let p = GemmParams::linear(200, 256, 224);
    let a = ctx.upload("a", &seeded((p.m * p.k) as usize, 81, 1.0)).unwrap();
    let b = ctx.upload("b", &dg_kernels::pack_f16(&seeded((p.n * p.k) as usize, 82, 1.0))).unwrap();
    let scratch = ctx.storage_buffer("split partials", 1 << 20).unwrap();
    let c = ctx.storage_buffer("c", u64::from(p.m * p.n) * 4).unwrap();
    let reduce = pipelines.get(&ctx, dg_kernels::split_k::source()).unwrap();
    for tile in [coop_gemm::TILE_128X128, coop_gemm::TILE_64X64] {
        for path in [WPath::Staged, WPath::Direct] {
            for split in [Split { splits: 1, steps: 7 }, Split { splits: 2, steps: 4 }] {
                let mut first: Option<Vec<f32>> = None;
                for depth in 1..=dg_kernels::coop_kloop::MAX_DEPTH {
                    let t = tile.with_depth(depth);
                    let kernel = pipelines.get(&ctx, coop_gemm::source_for(t, path, WeightFormat::F16, BLayout::Nk)).unwrap();
                    let mut plan = dg_gpu::PlanBuilder::new(&ctx);
                    push_product(&mut plan, (&kernel, &reduce), t, &p, split, [&a, &b, &scratch, &c]);
                    plan.finish(&ctx).unwrap().run(&ctx).unwrap();
                    let got = ctx.read_f32(&c, 0, (p.m * p.n) as usize).unwrap();
                    match &first {
                        None => first = Some(got),
                        Some(want) => assert!(&got == want, "{} {path:?} {split:?}: other bits than depth 1", t.label()),
                    }
                }
            }
        }
    }
}

/// The Recorder's choices for large products (`coop_gemm::plan`): a head-like product with 512
/// tiles of 128×128 (BF16, softcapped, at a column offset) takes that tile; a long `[k][n]` product
/// (the soft embedding's shape with K = 16384: 512 steps) splits towards
/// `LONG_K_TARGET_WORKGROUPS`. Both against `gemm_reference` over the whole C buffer.
#[test]
fn large_and_long_products_on_tensor_cores_match_the_reference() {
    use dg_kernels::gemm::{EPILOGUE_SOFTCAP, GemmParams};
    let test = "large_and_long_products_on_tensor_cores_match_the_reference";
    let Some(ctx) = coop_test_context(test) else { return };
    let mut pipelines = Pipelines::default();
    let scratch = ctx.storage_buffer("split partials", 64 << 20).unwrap();
    let head = GemmParams { c_rs: 32768 + 64, c_offset: 32, epilogue: EPILOGUE_SOFTCAP, cap: 3.0, ..GemmParams::linear(256, 32768, 64) };
    check_gemm_auto(&ctx, &mut pipelines, &scratch, "head-like", WeightFormat::Bf16, head, "coop_gemm_128x128");
    let soft = GemmParams { a_offset: 32, a_rs: 16384 + 64, b_rs: 256, b_cs: 1, alpha: 0.5, accumulate: 1, ..GemmParams::new(128, 256, 16384) };
    check_gemm_auto(&ctx, &mut pipelines, &scratch, "long soft embedding", WeightFormat::Bf16, soft, "split_k_reduce");
}

/// The decoder's dense products on the tensor cores by tile and K split (`--include-ignored
/// --nocapture`): µs per product (partials and their reduction included) and TFLOP/s; and how a
/// 64×64 tile's time grows with the number of workgroups (flat while the multiprocessors have room:
/// its first value over the K steps is one step's latency).
#[test]
#[ignore = "throughput: run with --include-ignored --nocapture on a GPU with cooperative matrices"]
fn dense_tensor_core_throughput_by_tile_and_split() {
    use dg_kernels::coop_gemm::{self, BLayout};
    use dg_kernels::gemm::GemmParams;
    use dg_kernels::split_k;
    let test = "dense_tensor_core_throughput_by_tile_and_split";
    let Some(ctx) = coop_test_context(test) else { return };
    let mut pipelines = Pipelines::default();
    let scratch = ctx.storage_buffer("split partials", 64 << 20).unwrap();
    // Times the product (and returns C of its last run).
    let time = |pipelines: &mut Pipelines, tile: CoopTile, path: WPath, p: GemmParams, splits: u32| -> (f64, Vec<f32>) {
        let a = ctx.upload("a", &seeded((p.m * p.k) as usize, 71, 1.0)).unwrap();
        let b = ctx.upload("b", &dg_kernels::pack_f16(&seeded((p.n * p.k) as usize, 72, 1.0))).unwrap();
        let c = ctx.storage_buffer("c", u64::from(p.m * p.n) * 4).unwrap();
        let kernel = pipelines.get(&ctx, coop_gemm::source_for(tile, path, WeightFormat::F16, BLayout::Nk)).unwrap();
        let reduce = pipelines.get(&ctx, split_k::source()).unwrap();
        let split = split_into(tile, p.k, splits);
        let replays = 50;
        let mut plan = dg_gpu::PlanBuilder::new(&ctx);
        for _ in 0..replays {
            push_product(&mut plan, (&kernel, &reduce), tile, &p, split, [&a, &b, &scratch, &c]);
        }
        let best = best_time(&ctx, &plan.finish(&ctx).unwrap(), replays);
        (best, ctx.read_f32(&c, 0, (p.m * p.n) as usize).unwrap())
    };
    let big = coop_gemm::TILE_128X128;
    let tiles = [coop_gemm::TILE_64X64, coop_gemm::TILE_64X64.with_depth(2), coop_gemm::TILE_64X128, big.with_depth(1), big.with_depth(2), big.with_depth(3), big.with_depth(4), coop_gemm::TILE_32X64];
    let shapes = [("q", 256, 4096, 2816), ("o", 256, 2816, 4096), ("mlp gate_up", 256, 4224, 2816), ("mlp down", 256, 2816, 2112), ("router", 256, 128, 2816)];
    for (name, m, n, k) in shapes {
        let p = GemmParams::linear(m, n, k);
        let mut wholes = std::collections::HashMap::new();
        for tile in tiles {
            if !tile.fits(m, n, k) || tile.dense_shared_bytes() > ctx.limits.max_compute_workgroup_storage_size {
                continue;
            }
            let flops = 2.0 * f64::from(m) * f64::from(n) * f64::from(k);
            let mut line = format!("{test}: {name} {m}x{n}x{k} [{}]", tile.label());
            let mut whole = Vec::new();
            for splits in [1, 2, 4, 8, 16, 32] {
                if k / tile.bk / splits < 2 || u64::from(splits * m * n) * 4 > scratch.size() {
                    continue;
                }
                let (t, c) = time(&mut pipelines, tile, WPath::Staged, p, splits);
                if splits == 1 {
                    whole = c;
                }
                line += &format!(" | {splits}: {:.1} us {:.0} TF", t * 1e6, flops / t / 1e12);
            }
            // W straight from the buffer: the same products in the same order, so the same C.
            let (t, direct) = time(&mut pipelines, tile, WPath::Direct, p, 1);
            assert!(direct == whole, "{name} [{}]: direct W fragments changed C", tile.label());
            let shallow = wholes.entry(tile.with_depth(1).label()).or_insert(whole);
            assert!(direct == *shallow, "{name} [{}]: a deeper ring changed C", tile.label());
            line += &format!(" | direct: {:.1} us {:.0} TF", t * 1e6, flops / t / 1e12);
            eprintln!("{line}");
        }
    }
    let k = 2816;
    for path in [WPath::Staged, WPath::Direct] {
        let mut line = format!("{test}: 64x64 tile {path:?}, k {k} ({} steps), workgroups:", k / 32);
        for tiles_n in [1u32, 16, 66, 132, 264, 528, 1056, 2112] {
            let (t, _) = time(&mut pipelines, coop_gemm::TILE_64X64, path, GemmParams::linear(64, 64 * tiles_n, k), 1);
            line += &format!(" | {tiles_n}: {:.1} us", t * 1e6);
        }
        eprintln!("{line}");
    }
}

/// What bounds a tensor-core workgroup's K step (`--include-ignored --nocapture`): the 64×64 tile's
/// time over 88 K steps against its number of workgroups, for the kernel as it is and for variants
/// that each take one part away: no global loads in the loop (every step restages the registers of
/// step 0), no matrix products (loads and staging only), only A's or only W's loads, scalar f16
/// staging instead of vec4s, one subgroup of 64×64 per workgroup instead of four of 32×32. The variants compute wrong products;
/// only their times mean something.
#[test]
#[ignore = "throughput: run with --include-ignored --nocapture on a GPU with cooperative matrices"]
fn tensor_core_step_ceiling_probe() {
    use dg_kernels::KernelSource;
    use dg_kernels::coop_gemm::{self, BLayout};
    use dg_kernels::gemm::GemmParams;
    let test = "tensor_core_step_ceiling_probe";
    let Some(ctx) = coop_test_context(test) else { return };
    let mut pipelines = Pipelines::default();
    let k = 2816u32;
    let base = coop_gemm::source_for(coop_gemm::TILE_64X64, WPath::Staged, WeightFormat::F16, BLayout::Nk);
    let renamed = |name: &str, wgsl: String| KernelSource { name: format!("{}_{name}", base.name), wgsl, ..base.clone() };
    let no_loads = base.wgsl.replace("a[a_src[l] + ka]", "ra[l]").replace("load_w(w_src[l] + (s + 1u) * w_step)", "rw[l]");
    assert!(no_loads != base.wgsl, "the loop's loads were not found");
    let a_loads_only = base.wgsl.replace("load_w(w_src[l] + (s + 1u) * w_step)", "rw[l]");
    let w_loads_only = base.wgsl.replace("a[a_src[l] + ka]", "ra[l]");
    let no_products: String = base.wgsl.lines().filter(|line| !line.contains("coopMultiplyAdd")).map(|line| format!("{line}\n")).collect();
    let scalar = CoopTile { staging: Staging::Scalar, ..coop_gemm::TILE_64X64 };
    let one_subgroup = CoopTile { wm: 64, wn: 64, ..coop_gemm::TILE_64X64 };
    let variants: Vec<(&str, CoopTile, KernelSource)> = vec![
        ("as is", coop_gemm::TILE_64X64, base.clone()),
        ("no global loads in the loop", coop_gemm::TILE_64X64, renamed("noloads", no_loads)),
        ("no matrix products", coop_gemm::TILE_64X64, renamed("noproducts", no_products)),
        ("A's loads only (8 KB a step, shared by every workgroup)", coop_gemm::TILE_64X64, renamed("aonly", a_loads_only)),
        ("W's loads only (4 KB a step)", coop_gemm::TILE_64X64, renamed("wonly", w_loads_only)),
        ("scalar staging", scalar, coop_gemm::source_for(scalar, WPath::Staged, WeightFormat::F16, BLayout::Nk)),
        ("one subgroup of 64x64", one_subgroup, coop_gemm::source_for(one_subgroup, WPath::Staged, WeightFormat::F16, BLayout::Nk)),
    ];
    let max_tiles = 2112u32;
    let a = ctx.upload("a", &seeded((64 * k) as usize, 81, 1.0)).unwrap();
    let b = ctx.upload("b", &dg_kernels::pack_f16(&seeded((64 * max_tiles * k) as usize, 82, 1.0))).unwrap();
    let c = ctx.storage_buffer("c", u64::from(64 * 64 * max_tiles) * 4).unwrap();
    for (what, tile, source) in variants {
        let pipeline = pipelines.get(&ctx, source).unwrap();
        let mut line = format!("{test}: {what} [{}]:", tile.label());
        for tiles in [1u32, 66, 132, 264, 528, 1056, 2112] {
            let p = GemmParams::linear(64, 64 * tiles, k);
            let replays = 20;
            let best = time_dispatch(&ctx, &pipeline, &p, &[&a, &b, &c], coop_gemm::workgroups(tile, p.m, p.n, 1), replays);
            let steps_per_us = f64::from(tiles * (k / 32)) / (best * 1e6);
            line += &format!(" | {tiles}: {:.1} us ({steps_per_us:.0} steps/us)", best * 1e6);
        }
        eprintln!("{line}");
    }
}

/// `src` with every `(from, to)` replacement made; panics when one is not found (the probe would
/// time the unchanged kernel).
fn replaced(src: &dg_kernels::KernelSource, tag: &str, edits: &[(&str, &str)]) -> dg_kernels::KernelSource {
    let mut wgsl = src.wgsl.clone();
    for (from, to) in edits {
        assert!(wgsl.contains(from), "{tag}: `{from}` not in {}", src.name);
        wgsl = wgsl.replace(from, to);
    }
    dg_kernels::KernelSource { name: format!("{}_{tag}", src.name), wgsl, ..src.clone() }
}

/// What the operands' traffic costs (`--include-ignored --nocapture`): the q projection's shape
/// (256 × 4096 × 2816) on the 64×64 and 128×128 tiles, and the experts' gate/up (1408 × 2816 over a
/// real routing) on their 32×128 direct tile, each as is and with A read as f16 (half its bytes),
/// W read in tile-major K panels (each workgroup's W one contiguous run), both, or one operand's
/// loop loads removed. The variants read the same buffers with other index maps, so their products
/// are wrong; only their times mean something.
#[test]
#[ignore = "throughput: run with --include-ignored --nocapture on a GPU with cooperative matrices"]
fn tensor_core_operand_traffic_probe() {
    use dg_kernels::coop_gemm::{self, BLayout};
    use dg_kernels::gemm::GemmParams;
    use dg_kernels::split_k;
    let test = "tensor_core_operand_traffic_probe";
    let Some(ctx) = coop_test_context(test) else { return };
    let mut pipelines = Pipelines::default();
    let f16_a: &[(&str, &str)] = &[("var<storage, read> a: array<vec4<f32>>", "var<storage, read> a: array<vec4<f16>>"), ("var ra: array<vec4<f32>, LA>", "var ra: array<vec4<f16>, LA>")];
    let no_a: &[(&str, &str)] = &[("a[a_src[l] + ka]", "ra[l]")];

    // Dense: the decoder's projections, W in COPIES copies used in turn (more than L2 holds, so
    // that W streams from DRAM as in the forward).
    const COPIES: u32 = 8;
    let scratch = ctx.storage_buffer("split partials", 64 << 20).unwrap();
    let staged_panel: &[(&str, &str)] = &[
        ("let w_step = BK4;", "let w_step = BN * BK4;"),
        ("w_src[l] = w_base + (n0 + e / BK4) * (p.b_cs / 4u) + e % BK4 + s0 * w_step;", "w_src[l] = w_base + n0 * (p.k / 4u) + e + s0 * w_step;"),
    ];
    let direct_panel: &[(&str, &str)] = &[
        ("let w_step = BK4;", "let w_step = BN * BK4;"),
        ("let stride_w = p.b_cs / 4u;", "let stride_w = BK4;"),
        ("let w_sub = w_base + (n0 + sn) * stride_w + s0 * w_step;", "let w_sub = w_base + n0 * (p.k / 4u) + sn * BK4 + s0 * w_step;"),
    ];
    for (name, m, n, k) in [("q", 256u32, 4096u32, 2816u32), ("o", 256, 2816, 4096), ("mlp down", 256, 2816, 2112)] {
        let a = ctx.upload("a", &seeded((m * k) as usize, 91, 1.0)).unwrap();
        let b = ctx.upload("b", &dg_kernels::pack_f16(&seeded((COPIES * n * k) as usize, 92, 1.0))).unwrap();
        let c = ctx.storage_buffer("c", u64::from(m * n) * 4).unwrap();
        let flops = 2.0 * f64::from(m) * f64::from(n) * f64::from(k);
        for (tile, splits) in [(coop_gemm::TILE_64X64, 1u32), (coop_gemm::TILE_64X64, 2), (coop_gemm::TILE_128X128, 4)] {
            if tile.dense_shared_bytes() > ctx.limits.max_compute_workgroup_storage_size {
                continue;
            }
            let staged = coop_gemm::source_for(tile, WPath::Staged, WeightFormat::F16, BLayout::Nk);
            let direct = coop_gemm::source_for(tile, WPath::Direct, WeightFormat::F16, BLayout::Nk);
            let both: Vec<(&str, &str)> = staged_panel.iter().chain(f16_a).copied().collect();
            let variants = [
                ("as is", staged.clone()),
                ("f16 A", replaced(&staged, "f16a", f16_a)),
                ("W panels", replaced(&staged, "panel", staged_panel)),
                ("W panels + f16 A", replaced(&staged, "panel_f16a", &both)),
                ("direct", direct.clone()),
                ("direct W panels", replaced(&direct, "panel", direct_panel)),
            ];
            let split = split_into(tile, k, splits);
            let reduce = pipelines.get(&ctx, split_k::source()).unwrap();
            let mut line = format!("{test}: {name} {m}x{n}x{k} [{} split {splits}]", tile.label());
            for (what, source) in variants {
                let kernel = pipelines.get(&ctx, source).unwrap();
                let replays = 48;
                let mut plan = dg_gpu::PlanBuilder::new(&ctx);
                for r in 0..replays {
                    let p = GemmParams { b_offset: (r % COPIES) * n * k, ..GemmParams::linear(m, n, k) };
                    push_product(&mut plan, (&kernel, &reduce), tile, &p, split, [&a, &b, &scratch, &c]);
                }
                let t = best_time(&ctx, &plan.finish(&ctx).unwrap(), replays);
                line += &format!(" | {what}: {:.1} us {:.0} TF", t * 1e6, flops / t / 1e12);
            }
            eprintln!("{line}");
        }
    }

    // Experts: gate/up over a real routing, 32×128 direct.
    let case = Case { n: 1408, k: 2816, counts: real_counts(99), gather: true };
    let x = case.inputs(93);
    let bufs = Buffers::upload(&ctx, &x, coop_grouped_gemm::PANEL);
    let tile_major: &[(&str, &str)] = &[
        ("let w_first = g * (p.b_group_stride / 4u) + n0 * BK4;", "let w_first = g * (p.b_group_stride / 4u) + n0 * (p.k / 4u);"),
        ("let w_step = p.n * BK4;", "let w_step = BN * BK4;"),
    ];
    let w_cached: &[(&str, &str)] = &[("let w_next = w_sub + min(s + 1u, steps - 1u) * w_step;", "let w_next = w_sub;")];
    let both: Vec<(&str, &str)> = tile_major.iter().chain(f16_a).copied().collect();
    for tile in [coop_grouped_gemm::TILE_32X128, CoopTile { bm: 32, bn: 128, bk: 64, wm: 32, wn: 32, staging: Staging::Vec4, depth: 1 }] {
        let grouped = coop_grouped_gemm::source_with(tile, WPath::Direct);
        let variants = [
            ("as is", grouped.clone()),
            ("f16 A", replaced(&grouped, "f16a", f16_a)),
            ("tile-major W", replaced(&grouped, "tilemajor", tile_major)),
            ("tile-major W + f16 A", replaced(&grouped, "tilemajor_f16a", &both)),
            ("no A loads", replaced(&grouped, "noa", no_a)),
            ("W from cache", replaced(&grouped, "wcached", w_cached)),
        ];
        let mut line = format!("{test}: experts gate_up [{} direct]", tile.label());
        for (what, source) in variants {
            let pipeline = pipelines.get(&ctx, source).unwrap();
            let replays = 50;
            let buffers = [&bufs.a, &bufs.w.buffer, &bufs.offsets, &bufs.rows, &bufs.c];
            let t = time_dispatch(&ctx, &pipeline, &x.params, &buffers, coop_grouped_gemm::workgroups(tile, &x.params), replays);
            line += &format!(" | {what}: {:.1} us {:.0} GB/s of W", t * 1e6, (128 * 1408 * 2816 * 2) as f64 / t / 1e9);
        }
        eprintln!("{line}");
    }
}

/// The tensor cores' own ceiling through WGSL cooperative matrices (`--include-ignored
/// --nocapture`): subgroups that only multiply (fragments loaded once from workgroup memory,
/// `acc` independent accumulators each, 4 subgroups a workgroup), then with the A and B fragments
/// reloaded from workgroup memory before every product, then with a workgroup barrier every
/// iteration as well (the GEMMs' K loop has one a step); TFLOP/s by workgroups.
#[test]
#[ignore = "throughput: run with --include-ignored --nocapture on a GPU with cooperative matrices"]
fn tensor_core_peak_probe() {
    use dg_kernels::{Access, KernelSource};
    let test = "tensor_core_peak_probe";
    let Some(ctx) = coop_test_context(test) else { return };
    let mut pipelines = Pipelines::default();
    let iters = 2048u32;
    let seed = ctx.upload("seed", &[0.01f32; 4]).unwrap();
    let max_groups = 132u32 * 8;
    let out = ctx.storage_buffer("out", u64::from(max_groups * 4 * 8 * 256) * 4).unwrap();
    for (label, reload, barrier) in [("multiply only", false, false), ("fragments reloaded", true, false), ("reloaded + barrier", true, true)] {
        for acc in [1u32, 4, 8] {
            let source = KernelSource { name: format!("peak_{acc}_{reload}_{barrier}"), wgsl: peak_probe_wgsl(acc, reload, barrier), entry: "main", buffers: vec![Access::Read, Access::ReadWrite], params_size: 16 };
            let pipeline = pipelines.get(&ctx, source).unwrap();
            let mut line = format!("{test}: {label}, {acc} accumulators a subgroup, workgroups:");
            for groups in [132u32, 264, 528, 1056] {
                let replays = 5;
                let t = time_dispatch(&ctx, &pipeline, &[iters, 0, 0, 0], &[&seed, &out], [groups, 1, 1], replays);
                let flops = f64::from(groups) * 4.0 * f64::from(acc) * f64::from(iters) * 8192.0;
                line += &format!(" | {groups}: {:.0} TFLOP/s", flops / t / 1e12);
            }
            eprintln!("{line}");
        }
    }
}

/// The peak probe's kernel: `acc` accumulators per subgroup (at most 8; the output holds 8 per
/// subgroup of up to 1056 workgroups), fragments reloaded from workgroup memory every iteration
/// or not, a barrier every iteration or not.
fn peak_probe_wgsl(acc: u32, reload: bool, barrier: bool) -> String {
    assert!((1..=8).contains(&acc));
    let decls: String = (0..acc).map(|i| format!("    var acc{i} = coop_mat16x16<f32, C>();\n")).collect();
    let load = "        let fa = coopLoad<coop_mat16x16<f16, A>>(&sa[(s % 2u) * 256u], 16u);\n        let fb = coopLoad<coop_mat16x16<f16, B>>(&sa[256u - (s % 2u) * 256u], 16u);\n";
    let products: String = (0..acc).map(|i| format!("        acc{i} = coopMultiplyAdd(fa, fb, acc{i});\n")).collect();
    let stores: String = (0..acc).map(|i| format!("    let o{i} = ((wid.x * 4u + lt / 32u) * 8u + {i}u) * 256u;\n    coopStore(acc{i}, &out[o{i}], 16u);\n")).collect();
    format!(
        "enable f16;\nenable wgpu_cooperative_matrix;\n\
         @group(0) @binding(0) var<uniform> p: vec4<u32>;\n\
         @group(0) @binding(1) var<storage, read> seed: array<f32>;\n\
         @group(0) @binding(2) var<storage, read_write> out: array<f32>;\n\
         var<workgroup> sa: array<f16, 512>;\n\
         @compute @workgroup_size(128)\n\
         fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lt: u32) {{\n\
         \x20   for (var i = lt; i < 512u; i += 128u) {{ sa[i] = f16(seed[0] * f32(i % 7u)); }}\n\
         \x20   workgroupBarrier();\n\
         {decls}\
         \x20   let fa0 = coopLoad<coop_mat16x16<f16, A>>(&sa[0], 16u);\n\
         \x20   let fb0 = coopLoad<coop_mat16x16<f16, B>>(&sa[256], 16u);\n\
         \x20   for (var s = 0u; s < p.x; s++) {{\n\
         {}\
         {products}\
         {}\
         \x20   }}\n\
         {stores}\
         }}\n",
        if reload { load.to_string() } else { "        let fa = fa0;\n        let fb = fb0;\n".to_string() },
        if barrier { "        workgroupBarrier();\n" } else { "" },
    )
}

/// Whether a workgroup barrier waits for global loads still in flight (`--include-ignored
/// --nocapture`): a loop of 4 fragment products per subgroup that issues one vec4 load from a
/// 64 MiB buffer each iteration and consumes it `distance` iterations later, with and without a
/// barrier each iteration; µs per iteration at 264 workgroups (two a multiprocessor). Loads that
/// stay in flight across barriers cost the same with and without them.
#[test]
#[ignore = "throughput: run with --include-ignored --nocapture on a GPU with cooperative matrices"]
fn barrier_drain_probe() {
    use dg_kernels::{Access, KernelSource};
    let test = "barrier_drain_probe";
    let Some(ctx) = coop_test_context(test) else { return };
    let mut pipelines = Pipelines::default();
    let iters = 1024u32;
    let data = ctx.upload("data", &vec![0.001f32; (DRAIN_PROBE_VEC4S * 4) as usize]).unwrap();
    let groups = DRAIN_PROBE_GROUPS;
    let out = ctx.storage_buffer("out", u64::from(drain_probe_sums_at(groups) + groups * 128) * 4).unwrap();
    for &(label, loads, distance, barrier) in DRAIN_PROBE_CASES {
        let source = KernelSource {
            name: format!("drain_{loads:?}_{distance}_{barrier}"),
            wgsl: drain_probe_wgsl(loads, distance, barrier, groups),
            entry: "main",
            buffers: vec![Access::Read, Access::ReadWrite],
            params_size: 16,
        };
        let pipeline = pipelines.get(&ctx, source).unwrap();
        let replays = 5;
        let t = time_dispatch(&ctx, &pipeline, &[iters, 0, 0, 0], &[&data, &out], [groups, 1, 1], replays);
        eprintln!("{test}: {label}: {:.3} us per iteration", t * 1e6 / f64::from(iters));
    }
}

/// The drain probe's loads: none, one scattered vec4 per invocation per iteration (each in its own
/// sector), or contiguous (each workgroup streams its own run, 2 KiB an iteration, as a GEMM's
/// panel of W).
#[derive(Debug, Clone, Copy, PartialEq)]
enum DrainLoads {
    None,
    Scattered,
    Contiguous,
}

/// The drain probe's cases: label, loads, the distance from a load to its use, a barrier every
/// iteration or not.
const DRAIN_PROBE_CASES: &[(&str, DrainLoads, u32, bool)] = &[
    ("products only", DrainLoads::None, 1, false),
    ("products + barrier", DrainLoads::None, 1, true),
    ("scattered loads consumed 1 later, no barrier", DrainLoads::Scattered, 1, false),
    ("scattered loads consumed 1 later, barrier", DrainLoads::Scattered, 1, true),
    ("scattered loads consumed 4 later, no barrier", DrainLoads::Scattered, 4, false),
    ("scattered loads consumed 4 later, barrier", DrainLoads::Scattered, 4, true),
    ("contiguous loads consumed 1 later, barrier", DrainLoads::Contiguous, 1, true),
    ("contiguous loads consumed 2 later, barrier", DrainLoads::Contiguous, 2, true),
    ("contiguous loads consumed 4 later, barrier", DrainLoads::Contiguous, 4, true),
];
/// vec4s of the probe's data (64 MiB).
const DRAIN_PROBE_VEC4S: u32 = 4 << 20;
/// Workgroups of the probe (two a multiprocessor of a 132-SM H200).
const DRAIN_PROBE_GROUPS: u32 = 264;

/// Where the per-invocation sums start in the output: after four 16×16 accumulators for each of
/// the four subgroups of every workgroup.
fn drain_probe_sums_at(groups: u32) -> u32 {
    groups * 4 * 4 * 256
}

/// The drain probe's kernel for `groups` workgroups.
fn drain_probe_wgsl(loads: DrainLoads, distance: u32, barrier: bool, groups: u32) -> String {
    let len = DRAIN_PROBE_VEC4S;
    // The vec4 an invocation loads at iteration `it` (a WGSL expression).
    let at = |it: &str| match loads {
        DrainLoads::Contiguous => format!("((wid.x * (p.x + {distance}u) + {it}) * 128u + lt) % {len}u"),
        _ => format!("(g * 977u + {it} * 4099u) % {len}u"),
    };
    let ring: String = (0..distance).map(|i| format!("    var r{i} = data[{}];\n", at(&format!("{i}u")))).collect();
    let rotate: String = (0..distance.saturating_sub(1)).map(|i| format!("        r{i} = r{};\n", i + 1)).collect();
    let body_loads = if loads == DrainLoads::None {
        String::new()
    } else {
        format!("        let nx = data[{}];\n        sum += r0;\n{rotate}        r{} = nx;\n", at(&format!("(s + {distance}u)")), distance - 1)
    };
    format!(
        "enable f16;\nenable wgpu_cooperative_matrix;\n\
         @group(0) @binding(0) var<uniform> p: vec4<u32>;\n\
         @group(0) @binding(1) var<storage, read> data: array<vec4<f32>>;\n\
         @group(0) @binding(2) var<storage, read_write> out: array<f32>;\n\
         var<workgroup> sa: array<f16, 512>;\n\
         @compute @workgroup_size(128)\n\
         fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lt: u32) {{\n\
         \x20   let g = wid.x * 128u + lt;\n\
         \x20   for (var i = lt; i < 512u; i += 128u) {{ sa[i] = f16(f32(i % 7u) * 0.01); }}\n\
         \x20   workgroupBarrier();\n\
         \x20   var acc0 = coop_mat16x16<f32, C>();\n    var acc1 = coop_mat16x16<f32, C>();\n    var acc2 = coop_mat16x16<f32, C>();\n    var acc3 = coop_mat16x16<f32, C>();\n\
         \x20   var sum = vec4<f32>();\n\
         {ring}\
         \x20   for (var s = 0u; s < p.x; s++) {{\n\
         \x20       let fa = coopLoad<coop_mat16x16<f16, A>>(&sa[(s % 2u) * 256u], 16u);\n\
         \x20       let fb = coopLoad<coop_mat16x16<f16, B>>(&sa[256u - (s % 2u) * 256u], 16u);\n\
         \x20       acc0 = coopMultiplyAdd(fa, fb, acc0);\n        acc1 = coopMultiplyAdd(fa, fb, acc1);\n        acc2 = coopMultiplyAdd(fa, fb, acc2);\n        acc3 = coopMultiplyAdd(fa, fb, acc3);\n\
         {body_loads}\
         {}\
         \x20   }}\n\
         \x20   let o = (wid.x * 4u + lt / 32u) * 1024u;\n\
         \x20   coopStore(acc0, &out[o], 16u);\n    coopStore(acc1, &out[o + 256u], 16u);\n    coopStore(acc2, &out[o + 512u], 16u);\n    coopStore(acc3, &out[o + 768u], 16u);\n\
         \x20   out[{}u + g] = sum.x + sum.y + sum.z + sum.w;\n\
         }}\n",
        if barrier { "        workgroupBarrier();\n" } else { "" },
        drain_probe_sums_at(groups),
    )
}

/// The probes' generated kernels parse and validate (with cooperative matrices and f16) on every
/// machine, GPU or not, so that a probe run on a GPU fails only on what the GPU does; the drain
/// probe's output covers its last workgroup's stores.
#[test]
fn probe_kernels_validate() {
    let caps = naga::valid::Capabilities::COOPERATIVE_MATRIX | naga::valid::Capabilities::SHADER_FLOAT16;
    let mut kernels: Vec<String> = Vec::new();
    for (reload, barrier) in [(false, false), (true, false), (true, true)] {
        kernels.extend([1u32, 4, 8].map(|acc| peak_probe_wgsl(acc, reload, barrier)));
    }
    kernels.extend(DRAIN_PROBE_CASES.iter().map(|&(_, loads, distance, barrier)| drain_probe_wgsl(loads, distance, barrier, DRAIN_PROBE_GROUPS)));
    kernels.push(STREAM_PANELS_WGSL.to_string());
    for wgsl in &kernels {
        let module = naga::front::wgsl::parse_str(wgsl).unwrap_or_else(|e| panic!("{}\n{wgsl}", e.emit_to_string(wgsl)));
        naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps).validate(&module).unwrap_or_else(|e| panic!("{e:?}\n{wgsl}"));
    }
    // Last subgroup's last accumulator ends where the sums start.
    let last = (DRAIN_PROBE_GROUPS * 4 - 1) * 1024 + 768 + 256;
    assert_eq!(last, drain_probe_sums_at(DRAIN_PROBE_GROUPS));
}

/// How many workgroups of 128 invocations one multiprocessor runs at once, by the workgroup
/// memory they declare (`--include-ignored --nocapture`): each invocation follows a chain of 400
/// dependent loads through an L2-resident permutation (latency-bound, so concurrent workgroups
/// take no longer than one), and the time is read against the number of workgroups. Where it
/// stays flat up to `k ×` the multiprocessors' count, k workgroups run side by side.
#[test]
#[ignore = "throughput: run with --include-ignored --nocapture on a GPU"]
fn workgroup_residency_probe() {
    use dg_kernels::{Access, KernelSource};
    let test = "workgroup_residency_probe";
    let Some(ctx) = dg_parity::testing::test_context(test) else { return };
    let mut pipelines = Pipelines::default();
    let len = 1u32 << 20;
    // A single cycle through all entries with a large odd stride: consecutive loads are far apart.
    let chain: Vec<u32> = (0..len).map(|i| (i + 392_699) % len).collect();
    let chain = ctx.upload("chain", &chain).unwrap();
    let max_groups = 132u32 * 16;
    let out = ctx.storage_buffer("out", u64::from(max_groups * 128) * 4).unwrap();
    for shared_kib in [1u32, 8, 16, 24, 32, 40] {
        let words = shared_kib * 256;
        let wgsl = format!(
            "@group(0) @binding(0) var<uniform> p: vec4<u32>;\n\
             @group(0) @binding(1) var<storage, read> chain: array<u32>;\n\
             @group(0) @binding(2) var<storage, read_write> out: array<u32>;\n\
             var<workgroup> pad: array<u32, {words}>;\n\
             @compute @workgroup_size(128)\n\
             fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lt: u32) {{\n\
             \x20   for (var w = lt; w < {words}u; w += 128u) {{ pad[w] = w; }}\n\
             \x20   workgroupBarrier();\n\
             \x20   var i = (wid.x * 128u + lt) * 977u % {len}u;\n\
             \x20   for (var s = 0u; s < p.x; s++) {{ i = chain[i]; }}\n\
             \x20   out[wid.x * 128u + lt] = i + pad[(lt * 7u + i) % {words}u];\n\
             }}\n"
        );
        let source = KernelSource { name: format!("residency_{shared_kib}k"), wgsl, entry: "main", buffers: vec![Access::Read, Access::ReadWrite], params_size: 16 };
        let pipeline = pipelines.get(&ctx, source).unwrap();
        let mut line = format!("{test}: {shared_kib} KiB of workgroup memory, workgroups:");
        for groups in [66u32, 132, 264, 396, 528, 792, 1056, 2112] {
            let replays = 10;
            let t = time_dispatch(&ctx, &pipeline, &[400u32, 0, 0, 0], &[&chain, &out], [groups, 1, 1], replays);
            line += &format!(" | {groups}: {:.1} us", t * 1e6);
        }
        eprintln!("{line}");
    }
}

/// What one dispatch costs the forward by itself (`--include-ignored --nocapture`): a plan of
/// dispatches of a kernel that writes one word per invocation of the buffer they all share (so
/// that each waits for the one before, as the forward's do), timed per dispatch against its
/// workgroups. The forward runs about 21 dispatches a layer; what this costs each is what fusing
/// two of them can save.
#[test]
#[ignore = "throughput: run with --include-ignored --nocapture on a GPU"]
fn dispatch_overhead_probe() {
    use dg_kernels::{Access, KernelSource};
    let test = "dispatch_overhead_probe";
    let Some(ctx) = dg_parity::testing::test_context(test) else { return };
    let mut pipelines = Pipelines::default();
    let out = ctx.storage_buffer("out", 4096 * 256 * 4).unwrap();
    let wgsl = "@group(0) @binding(0) var<uniform> p: vec4<u32>;\n\
                @group(0) @binding(1) var<storage, read_write> out: array<u32>;\n\
                @compute @workgroup_size(256)\n\
                fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lt: u32) {\n\
                \x20   let i = wid.x * 256u + lt;\n\
                \x20   out[i] = out[i] + p.x;\n\
                }\n";
    let source = KernelSource { name: "dispatch_overhead".into(), wgsl: wgsl.into(), entry: "main", buffers: vec![Access::ReadWrite], params_size: 16 };
    let pipeline = pipelines.get(&ctx, source).unwrap();
    let mut line = format!("{test}: one dispatch after another, by workgroups of 256:");
    for groups in [1u32, 132, 256, 1024, 4096] {
        let t = time_dispatch(&ctx, &pipeline, &[1u32, 0, 0, 0], &[&out], [groups, 1, 1], 200);
        line += &format!(" | {groups}: {:.2} us", t * 1e6);
    }
    eprintln!("{line}");
}

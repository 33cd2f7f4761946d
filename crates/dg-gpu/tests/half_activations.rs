//! Activations stored as f16 for the tensor-core GEMMs (`dg_kernels::coop_gemm::AFormat::F16`):
//! the dense kernel (`coop_gemm`) and the experts' (`coop_grouped_gemm`) give the same bits from
//! f16 activations as from f32 ones rounded as they are staged, reading half A's bytes; and
//! (ignored, timed) what the halved A traffic buys at the real geometry's shapes.
//!
//! Activations are drawn away from f16's subnormal range, where a CPU's and a GPU's rounding might
//! differ (on the GPU, producer and GEMM round with the same conversion).

use dg_parity::testing::{best_time, coop_test_context, push_product, seeded};
use dg_gpu::{GpuContext, Pipelines};
use dg_kernels::coop_gemm::{self, AFormat, BLayout, CoopTile, Split, WPath};
use dg_kernels::coop_grouped_gemm::{self, PANEL, pack_f16_panels};
use dg_kernels::gemm::GemmParams;
use dg_kernels::grouped_gemm::GroupedGemmParams;
use dg_kernels::{KernelSource, WeightFormat, pack_f16, split_k};

/// Seeded activations with no magnitude under 1e-3 (none rounds to an f16 subnormal).
fn activations(n: usize, seed: u64) -> Vec<f32> {
    seeded(n, seed, 1.0).into_iter().map(|x| if x.abs() < 1e-3 { 0.0 } else { x }).collect()
}

/// A in both formats: f32, and f16 as the GPU's producers would store it.
struct Activations {
    f32_: wgpu::Buffer,
    f16_: wgpu::Buffer,
}

impl Activations {
    fn upload(ctx: &GpuContext, a: &[f32]) -> Self {
        Activations { f32_: ctx.upload("a f32", a).unwrap(), f16_: ctx.upload("a f16", &pack_f16(a)).unwrap() }
    }

    fn get(&self, format: AFormat) -> &wgpu::Buffer {
        match format {
            AFormat::F32 => &self.f32_,
            AFormat::F16 => &self.f16_,
        }
    }
}

/// A dense product on panelled F16 weights, whole or split (partials reduced into `c`).
struct Dense {
    p: GemmParams,
    tile: CoopTile,
    split: Split,
    a: Activations,
    w: wgpu::Buffer,
    scratch: wgpu::Buffer,
    c: wgpu::Buffer,
}

impl Dense {
    fn new(ctx: &GpuContext, (m, n, k): (u32, u32, u32), tile: CoopTile, splits: u32) -> Self {
        let p = GemmParams::linear(m, n, k);
        let steps = k / tile.bk;
        let per = steps.div_ceil(splits);
        let w = pack_f16_panels(&seeded((n * k) as usize, 92, 1.0), n as usize, k as usize, PANEL as usize);
        Dense {
            p,
            tile,
            split: Split { splits: steps.div_ceil(per), steps: per },
            a: Activations::upload(ctx, &activations((m * k) as usize, 91)),
            w: ctx.upload("w", &w).unwrap(),
            scratch: ctx.storage_buffer("partials", u64::from(splits * m * n) * 4).unwrap(),
            c: ctx.storage_buffer("c", u64::from(m * n) * 4).unwrap(),
        }
    }

    fn plan(&self, ctx: &GpuContext, pipelines: &mut Pipelines, format: AFormat, replays: u32) -> dg_gpu::Plan {
        let kernel = pipelines.get(ctx, coop_gemm::source_for_a(self.tile, WPath::Staged, WeightFormat::F16, BLayout::NkPanels, format)).unwrap();
        let reduce = pipelines.get(ctx, split_k::source()).unwrap();
        let (p, a) = (&self.p, self.a.get(format));
        let mut plan = dg_gpu::PlanBuilder::new(ctx);
        for _ in 0..replays {
            push_product(&mut plan, (&kernel, &reduce), self.tile, p, self.split, [a, &self.w, &self.scratch, &self.c]);
        }
        plan.finish(ctx).unwrap()
    }

    fn run(&self, ctx: &GpuContext, pipelines: &mut Pipelines, format: AFormat) -> Vec<f32> {
        self.plan(ctx, pipelines, format, 1).run(ctx).unwrap();
        ctx.read_f32(&self.c, 0, (self.p.m * self.p.n) as usize).unwrap()
    }
}

/// The experts' product over `counts` slots an expert (gathered rows when `gather`).
struct Grouped {
    p: GroupedGemmParams,
    a: Activations,
    w: wgpu::Buffer,
    offsets: wgpu::Buffer,
    rows: wgpu::Buffer,
    c: wgpu::Buffer,
    slots: usize,
}

impl Grouped {
    fn new(ctx: &GpuContext, n: u32, k: u32, counts: &[u32], gather: bool) -> Self {
        let mut offsets = vec![0u32];
        for &c in counts {
            offsets.push(offsets.last().unwrap() + c);
        }
        let slots = *offsets.last().unwrap() as usize;
        let tokens = if gather { slots.div_ceil(4).max(1) } else { slots.max(1) };
        let rows: Vec<u32> = (0..slots.max(1)).map(|s| ((s * 5 + 1) % tokens) as u32).collect();
        let p = GroupedGemmParams {
            n,
            k,
            groups: counts.len() as u32,
            max_rows: *counts.iter().max().unwrap(),
            a_rs: k,
            b_group_stride: n * k,
            c_rs: n,
            gather: u32::from(gather),
            ..bytemuck::Zeroable::zeroed()
        };
        let w: Vec<u32> = (0..counts.len()).flat_map(|g| pack_f16_panels(&seeded((n * k) as usize, 100 + g as u64, 1.0), n as usize, k as usize, PANEL as usize)).collect();
        Grouped {
            p,
            a: Activations::upload(ctx, &activations(tokens * k as usize, 93)),
            w: ctx.upload("w", &w).unwrap(),
            offsets: ctx.upload("offsets", &offsets).unwrap(),
            rows: ctx.upload("rows", &rows).unwrap(),
            c: ctx.storage_buffer("c", (slots.max(1) * n as usize * 4) as u64).unwrap(),
            slots,
        }
    }

    fn plan(&self, ctx: &GpuContext, pipelines: &mut Pipelines, tile: CoopTile, path: WPath, format: AFormat, replays: u32) -> dg_gpu::Plan {
        let kernel = pipelines.get(ctx, coop_grouped_gemm::source_with_a(tile, path, format)).unwrap();
        let mut plan = dg_gpu::PlanBuilder::new(ctx);
        for _ in 0..replays {
            plan.push(&kernel, &self.p, &[self.a.get(format), &self.w, &self.offsets, &self.rows, &self.c], coop_grouped_gemm::workgroups(tile, &self.p));
        }
        plan.finish(ctx).unwrap()
    }

    fn run(&self, ctx: &GpuContext, pipelines: &mut Pipelines, tile: CoopTile, path: WPath, format: AFormat) -> Vec<f32> {
        self.plan(ctx, pipelines, tile, path, format, 1).run(ctx).unwrap();
        ctx.read_f32(&self.c, 0, self.slots * self.p.n as usize).unwrap()
    }
}

#[test]
fn f16_activations_give_the_same_bits_as_f32_ones_rounded_when_staged() {
    let test = "f16_activations_give_the_same_bits_as_f32_ones_rounded_when_staged";
    let Some(ctx) = coop_test_context(test) else { return };
    let mut pipelines = Pipelines::default();
    // A partial last m tile, and K steps (7; 4 and 3 a split) no ring length divides.
    for (tile, splits) in [(coop_gemm::TILE_128X128, 1), (coop_gemm::TILE_128X128, 2), (coop_gemm::TILE_64X64, 1)] {
        let dense = Dense::new(&ctx, (200, 256, 224), tile, splits);
        let want = dense.run(&ctx, &mut pipelines, AFormat::F32);
        assert!(want.iter().all(|v| v.is_finite()) && want.iter().any(|&v| v != 0.0), "{}: no product", tile.label());
        let got = dense.run(&ctx, &mut pipelines, AFormat::F16);
        assert!(got == want, "dense {} in {splits} splits: f16 activations gave other bits", tile.label());
    }
    // Full, partial and empty experts, with and without gathered rows.
    let counts = [31, 32, 33, 0, 1, 70, 16, 5];
    for gather in [false, true] {
        let grouped = Grouped::new(&ctx, 256, 224, &counts, gather);
        for (tile, path) in [(coop_grouped_gemm::TILE_32X128, WPath::Direct), (coop_grouped_gemm::TILE_32X128, WPath::Single), (coop_grouped_gemm::TILE_64X128, WPath::Staged)] {
            let want = grouped.run(&ctx, &mut pipelines, tile, path, AFormat::F32);
            let got = grouped.run(&ctx, &mut pipelines, tile, path, AFormat::F16);
            assert!(got == want, "experts {} {path:?} gather {gather}: f16 activations gave other bits", tile.label());
        }
    }
}

/// µs per product at the real geometry's shapes with f32 and f16 activations, alternating
/// (`--include-ignored --nocapture`): the experts' gate/up and down, and the decoder's dense
/// projections on 128 × 128 tiles in the forward's splits.
#[test]
#[ignore = "throughput: run with --include-ignored --nocapture on a GPU with cooperative matrices"]
fn f16_activations_throughput_at_the_real_shapes() {
    let test = "f16_activations_throughput_at_the_real_shapes";
    let Some(ctx) = coop_test_context(test) else { return };
    let mut pipelines = Pipelines::default();
    let replays = 20;
    // 256 tokens × top-8 over 128 experts, as evenly as a real routing spreads them.
    let counts: Vec<u32> = (0..128u32).map(|e| 10 + (e * 7) % 13).collect();
    let gate_up = Grouped::new(&ctx, 1408, 2816, &counts, true);
    let down = Grouped::new(&ctx, 2816, 704, &counts, false);
    // The forward's tile (single-staged 32×128, four steps ahead) against the other format and a
    // shallower ring.
    let tile = coop_grouped_gemm::TILE_32X128;
    let configs = [(AFormat::F32, 4), (AFormat::F16, 4), (AFormat::F32, 2), (AFormat::F16, 2)];
    for (name, g) in [("experts gate_up", &gate_up), ("experts down", &down)] {
        let mut line = format!("{test}: {name} [{} Single] f32 d4 / f16 d4 / f32 d2 / f16 d2:", tile.label());
        for _ in 0..2 {
            for (format, depth) in configs {
                let t = best_time(&ctx, &g.plan(&ctx, &mut pipelines, tile.with_depth(depth), WPath::Single, format, replays), replays);
                line += &format!(" {:.1}", t * 1e6);
            }
        }
        eprintln!("{line} us");
    }
    for (name, shape, splits) in [("q", (256, 4096, 2816), 2), ("o", (256, 2816, 4096), 3), ("mlp gate_up", (256, 4224, 2816), 2), ("mlp down", (256, 2816, 2112), 3)] {
        let mut line = format!("{test}: {name} {shape:?} [128x128] {splits} splits, f32 d3 / f16 d3 / f16 d2 / f16 d4:");
        for _ in 0..2 {
            for (format, depth) in [(AFormat::F32, 3), (AFormat::F16, 3), (AFormat::F16, 2), (AFormat::F16, 4)] {
                let dense = Dense::new(&ctx, shape, coop_gemm::TILE_128X128.with_depth(depth), splits);
                let t = best_time(&ctx, &dense.plan(&ctx, &mut pipelines, format, replays), replays);
                line += &format!(" {:.1}", t * 1e6);
            }
        }
        eprintln!("{line} us");
    }
}

/// f16 activations reach only the tensor-core experts' kernel: the Recorder refuses them, naming
/// the shape, for row-major experts (the f32 kernels', on every adapter).
#[test]
fn f16_activations_for_row_major_experts_are_refused() {
    let test = "f16_activations_for_row_major_experts_are_refused";
    let Some(ctx) = dg_parity::testing::test_context(test) else { return };
    let mut pipelines = Pipelines::default();
    let buffer = |len: usize| ctx.storage_buffer("b", len as u64 * 4).unwrap();
    let (a, offsets, rows, c) = (buffer(64), buffer(3), buffer(4), buffer(64));
    let w = dg_gpu::GpuMatrix { buffer: buffer(64 * 32), format: WeightFormat::F32, layout: dg_gpu::MatrixLayout::RowMajor };
    let p = GroupedGemmParams { n: 64, k: 32, groups: 2, max_rows: 2, a_rs: 32, b_group_stride: 64 * 32, c_rs: 64, gather: 0, ..bytemuck::Zeroable::zeroed() };
    let mut rec = dg_gpu::ops::Recorder::new(&ctx, &mut pipelines);
    let err = rec.grouped_gemm_matrix_a((&a, AFormat::F16), &w, &offsets, &rows, &c, 4, p).expect_err("f16 activations on row-major experts");
    assert!(err.to_string().contains("n 64 k 32"), "{err}");
    rec.grouped_gemm_matrix_a((&a, AFormat::F32), &w, &offsets, &rows, &c, 4, p).expect("f32 activations on row-major experts");
}

/// The kernels this file runs parse and validate on every machine.
#[test]
fn half_activation_kernels_validate() {
    let caps = naga::valid::Capabilities::COOPERATIVE_MATRIX | naga::valid::Capabilities::SHADER_FLOAT16;
    let kernels: Vec<KernelSource> = vec![
        coop_gemm::source_for_a(coop_gemm::TILE_128X128, WPath::Staged, WeightFormat::F16, BLayout::NkPanels, AFormat::F16),
        coop_grouped_gemm::source_with_a(coop_grouped_gemm::TILE_32X128, WPath::Direct, AFormat::F16),
    ];
    for k in kernels {
        let module = naga::front::wgsl::parse_str(&k.wgsl).unwrap_or_else(|e| panic!("{}: {}", k.name, e.emit_to_string(&k.wgsl)));
        naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps).validate(&module).unwrap_or_else(|e| panic!("{}: {e:?}", k.name));
        assert!(k.wgsl.contains("array<vec4<f16>>") && !k.wgsl.contains("A_ELEM"), "{}: A not f16", k.name);
    }
}

/// Whether the experts' products lose time to their last wave of workgroups
/// (`--include-ignored --nocapture`): the forward's gate/up and down tiles timed over 16 slots an
/// expert for a sweep of expert counts. Without a tail the time grows with the experts; where a
/// multiprocessor runs `r` workgroups, it steps every `132 r / n_tiles` experts instead.
#[test]
#[ignore = "throughput: run with --include-ignored --nocapture on a GPU with cooperative matrices"]
fn experts_wave_probe() {
    let test = "experts_wave_probe";
    let Some(ctx) = coop_test_context(test) else { return };
    let mut pipelines = Pipelines::default();
    let replays = 20;
    let tile = coop_grouped_gemm::TILE_32X128;
    let depth = coop_grouped_gemm::EXPERT_DEPTH;
    for (name, n, k, gather, format) in [("gate_up", 1408, 2816, true, AFormat::F32), ("down", 2816, 704, false, AFormat::F16)] {
        let mut line = format!("{test}: {name} [{} Single d{depth}], 16 slots an expert, experts:", tile.label());
        for experts in (60u32..=144).step_by(6) {
            let g = Grouped::new(&ctx, n, k, &vec![16; experts as usize], gather);
            let t = best_time(&ctx, &g.plan(&ctx, &mut pipelines, tile.with_depth(depth), WPath::Single, format, replays), replays);
            line += &format!(" | {experts}: {:.1}", t * 1e6);
        }
        eprintln!("{line} us");
    }
}

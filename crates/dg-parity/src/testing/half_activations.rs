//! Tensor-core products with their activations in both storage formats
//! (`dg_kernels::coop_gemm::AFormat`: f32, and f16 as the GPU's producers store them), as the
//! tests and the throughput probes run them: a dense product on panelled F16 weights ([`Dense`])
//! and the experts' grouped product ([`Grouped`]), on seeded inputs.
//!
//! Activations are drawn away from f16's subnormal range, where a CPU's and a GPU's rounding might
//! differ (on the GPU, producer and GEMM round with the same conversion).

use dg_gpu::{GpuContext, Pipelines};
use dg_kernels::coop_gemm::{self, AFormat, BLayout, CoopTile, Split, WPath};
use dg_kernels::coop_grouped_gemm::{self, PANEL, pack_f16_panels};
use dg_kernels::coop_kloop::Ring;
use dg_kernels::gemm::GemmParams;
use dg_kernels::grouped_gemm::GroupedGemmParams;
use dg_kernels::{WeightFormat, pack_f16, split_k};

use super::{push_product, seeded};

/// Seeded activations with no magnitude under 1e-3 (none rounds to an f16 subnormal).
pub fn activations(n: usize, seed: u64) -> Vec<f32> {
    seeded(n, seed, 1.0).into_iter().map(|x| if x.abs() < 1e-3 { 0.0 } else { x }).collect()
}

/// A in both formats: f32, and f16 as the GPU's producers would store it.
#[derive(Debug)]
pub struct Activations {
    pub f32_: wgpu::Buffer,
    pub f16_: wgpu::Buffer,
}

impl Activations {
    pub fn upload(ctx: &GpuContext, a: &[f32]) -> Self {
        Activations { f32_: ctx.upload("a f32", a).unwrap(), f16_: ctx.upload("a f16", &pack_f16(a)).unwrap() }
    }

    pub fn get(&self, format: AFormat) -> &wgpu::Buffer {
        match format {
            AFormat::F32 => &self.f32_,
            AFormat::F16 => &self.f16_,
        }
    }
}

/// A dense product on panelled F16 weights, whole or split (partials reduced into `c`).
#[derive(Debug)]
pub struct Dense {
    pub p: GemmParams,
    pub tile: CoopTile,
    pub split: Split,
    pub a: Activations,
    pub w: wgpu::Buffer,
    pub scratch: wgpu::Buffer,
    pub c: wgpu::Buffer,
}

impl Dense {
    pub fn new(ctx: &GpuContext, (m, n, k): (u32, u32, u32), tile: CoopTile, splits: u32) -> Self {
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

    pub fn plan(&self, ctx: &GpuContext, pipelines: &mut Pipelines, format: AFormat, replays: u32) -> dg_gpu::Plan {
        self.plan_ring(ctx, pipelines, format, Ring::Staggered, replays)
    }

    /// [`Self::plan`] with the K loop's loads issued by `ring`.
    pub fn plan_ring(&self, ctx: &GpuContext, pipelines: &mut Pipelines, format: AFormat, ring: Ring, replays: u32) -> dg_gpu::Plan {
        let tile = super::on_device(ctx, self.tile);
        let kernel = pipelines
            .get_source(ctx, coop_gemm::source_for_ring(tile, WPath::Staged, WeightFormat::F16, BLayout::NkPanels, format, ring))
            .unwrap();
        let reduce = pipelines.get_source(ctx, split_k::source()).unwrap();
        let (p, a) = (&self.p, self.a.get(format));
        let mut plan = dg_gpu::PlanBuilder::new(ctx);
        for _ in 0..replays {
            push_product(&mut plan, (&kernel, &reduce), self.tile, p, self.split, [a, &self.w, &self.scratch, &self.c]);
        }
        plan.finish(ctx).unwrap()
    }

    pub fn run(&self, ctx: &GpuContext, pipelines: &mut Pipelines, format: AFormat) -> Vec<f32> {
        self.run_ring(ctx, pipelines, format, Ring::Staggered)
    }

    /// [`Self::run`] with the K loop's loads issued by `ring`.
    pub fn run_ring(&self, ctx: &GpuContext, pipelines: &mut Pipelines, format: AFormat, ring: Ring) -> Vec<f32> {
        self.plan_ring(ctx, pipelines, format, ring, 1).run(ctx).unwrap();
        ctx.read_f32(&self.c, 0, (self.p.m * self.p.n) as usize).unwrap()
    }
}

/// The experts' product over `counts` slots an expert (gathered rows when `gather`).
#[derive(Debug)]
pub struct Grouped {
    pub p: GroupedGemmParams,
    pub a: Activations,
    pub w: wgpu::Buffer,
    pub offsets: wgpu::Buffer,
    pub rows: wgpu::Buffer,
    pub c: wgpu::Buffer,
    pub slots: usize,
}

impl Grouped {
    pub fn new(ctx: &GpuContext, n: u32, k: u32, counts: &[u32], gather: bool) -> Self {
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
        let w: Vec<u32> = (0..counts.len())
            .flat_map(|g| pack_f16_panels(&seeded((n * k) as usize, 100 + g as u64, 1.0), n as usize, k as usize, PANEL as usize))
            .collect();
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

    pub fn plan(
        &self,
        ctx: &GpuContext,
        pipelines: &mut Pipelines,
        tile: CoopTile,
        path: WPath,
        format: AFormat,
        replays: u32,
    ) -> dg_gpu::Plan {
        let kernel = pipelines.get_source(ctx, coop_grouped_gemm::source_with_a(super::on_device(ctx, tile), path, format)).unwrap();
        let mut plan = dg_gpu::PlanBuilder::new(ctx);
        for _ in 0..replays {
            plan.push(
                &kernel,
                &self.p,
                &[self.a.get(format), &self.w, &self.offsets, &self.rows, &self.c],
                coop_grouped_gemm::workgroups(tile, &self.p),
            );
        }
        plan.finish(ctx).unwrap()
    }

    pub fn run(&self, ctx: &GpuContext, pipelines: &mut Pipelines, tile: CoopTile, path: WPath, format: AFormat) -> Vec<f32> {
        self.plan(ctx, pipelines, tile, path, format, 1).run(ctx).unwrap();
        ctx.read_f32(&self.c, 0, self.slots * self.p.n as usize).unwrap()
    }
}

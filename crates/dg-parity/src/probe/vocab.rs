//! The two vocabulary-sized products (the tied head, `DiffusionGemmaForBlockDiffusion`'s
//! `lm_head`, and the soft embedding of the self-conditioning input, `P·E`) by how their weight,
//! the embedding, is stored: BF16 rows as the F16 mode keeps it, F16 rows, and F16 in K panels
//! (the layers' dense products' layout). Times only: the layouts that the forward does not use
//! compute products nobody checks here.

use dg_gpu::{GpuContext, Pipelines};
use dg_kernels::WeightFormat;
use dg_kernels::coop_gemm::{self, BLayout, CoopTile};
use dg_kernels::coop_grouped_gemm::{self, WPath};
use dg_kernels::gemm::GemmParams;
use dg_kernels::split_k;

use super::{ProbeError, ProbeOptions};
use crate::testing::{best_time, push_product, seeded};

/// Rows of the vocabulary timed (a quarter of the real 262144: 369 MB of 16-bit weights, far
/// more than the L2 holds, so W streams from DRAM as in the forward).
const VOCAB: u32 = 65536;
/// The model's hidden size and canvas.
const HIDDEN: u32 = 2816;
const CANVAS: u32 = 256;

/// The head (`C[256, V] = A · Eᵀ`, E `[V, H]` read as `W[n][k]`) with E in BF16 rows (as the
/// forward), F16 rows and F16 K panels; the soft embedding (`C[256, H] = P · E`, E read as
/// `B[k][n]`) in BF16 and F16 rows. The forward's tile (128 × 128, depth 3, constant stages); µs,
/// TFLOP/s and the weights' GB/s, twice in alternating order.
pub fn vocab_product_layouts_probe(ctx: &GpuContext, _options: &ProbeOptions) -> Result<(), ProbeError> {
    let test = "vocab_product_layouts_probe";
    let mut pipelines = Pipelines::default();
    let (v, h, m) = (VOCAB, HIDDEN, CANVAS);
    let e = seeded((v * h) as usize, 81, 0.05);
    let bf16 = ctx.upload("e bf16", &dg_kernels::pack_bf16(&e))?;
    let f16 = ctx.upload("e f16", &dg_kernels::pack_f16(&e))?;
    let panels = ctx.upload("e f16 panels", &coop_grouped_gemm::pack_f16_panels(&e, v as usize, h as usize, coop_gemm::PANEL as usize))?;
    drop(e);
    let a_head = ctx.upload("normed", &seeded((m * h) as usize, 82, 1.0))?;
    let a_soft = ctx.upload("probabilities", &seeded((m * v) as usize, 83, 1.0 / v as f32))?;
    let c = ctx.storage_buffer("c", u64::from(m * v) * 4)?;
    let scratch = ctx.storage_buffer("split partials", 4)?;
    let reduce = pipelines.get_source(ctx, split_k::source())?;
    let tile = coop_gemm::TILE_128X128.with_stages(dg_kernels::coop_kloop::Stages::Constant);
    let head = GemmParams::linear(m, v, h);
    let soft = GemmParams::new(m, h, v);
    let cases: [(&str, WeightFormat, BLayout, &wgpu::Buffer, &wgpu::Buffer, GemmParams); 5] = [
        ("head, BF16 rows (the forward's)", WeightFormat::Bf16, BLayout::Nk, &bf16, &a_head, head),
        ("head, F16 rows", WeightFormat::F16, BLayout::Nk, &f16, &a_head, head),
        ("head, F16 K panels", WeightFormat::F16, BLayout::NkPanels, &panels, &a_head, head),
        ("soft embedding, BF16 rows (the forward's)", WeightFormat::Bf16, BLayout::Kn, &bf16, &a_soft, soft),
        ("soft embedding, F16 rows", WeightFormat::F16, BLayout::Kn, &f16, &a_soft, soft),
    ];
    let flops = 2.0 * f64::from(m) * f64::from(v) * f64::from(h);
    let bytes = f64::from(v * h) * 2.0;
    for round in 0..2 {
        let order: Vec<usize> = if round == 0 { (0..cases.len()).collect() } else { (0..cases.len()).rev().collect() };
        for i in order {
            let (what, format, layout, w, a, p) = cases[i];
            let t = time_product(ctx, &mut pipelines, &reduce, tile, format, layout, [a, w, &scratch, &c], &p)?;
            println!(
                "{test}: round {round}, {what} [{}]: {:.1} us, {:.0} TFLOP/s, {:.2} TB/s of weights (x{} for the real vocabulary: {:.3} ms)",
                tile.label(),
                t * 1e6,
                flops / t / 1e12,
                bytes / t / 1e12,
                262144 / v,
                t * 1e3 * f64::from(262144 / v)
            );
        }
    }
    Ok(())
}

/// Best time of `p` on `tile` with W stored as `format` in `layout`, one product per replay.
#[allow(clippy::too_many_arguments)]
fn time_product(
    ctx: &GpuContext,
    pipelines: &mut Pipelines,
    reduce: &std::sync::Arc<dg_gpu::Pipeline>,
    tile: CoopTile,
    format: WeightFormat,
    layout: BLayout,
    buffers: [&wgpu::Buffer; 4],
    p: &GemmParams,
) -> Result<f64, ProbeError> {
    let kernel = pipelines.get_source(ctx, coop_gemm::source_for(tile, WPath::Staged, format, layout))?;
    let replays = 20;
    let mut plan = dg_gpu::PlanBuilder::new(ctx);
    let whole = super::split_into(tile, p.k, 1);
    for _ in 0..replays {
        push_product(&mut plan, (&kernel, reduce), tile, p, whole, buffers);
    }
    Ok(best_time(ctx, &plan.finish(ctx)?, replays))
}

//! The two vocabulary-sized products (the tied head, `DiffusionGemmaForBlockDiffusion`'s
//! `lm_head`, and the soft embedding of the self-conditioning input, `P·E`) by how their weight,
//! the embedding, is stored (BF16 rows as the F16 mode keeps it, F16 rows, and F16 in K panels,
//! the layers' dense products' layout) and, for the soft embedding, by how its probabilities are
//! stored (f32 as the forward writes them, or f16, which the tensor cores round them to anyway).
//! Times only: the variants that the forward does not use compute products nobody checks here.

use dg_gpu::planner::split;
use dg_gpu::{GpuContext, Pipelines};
use dg_kernels::WeightFormat;
use dg_kernels::coop_gemm::{self, AFormat, BLayout, CoopTile};
use dg_kernels::coop_grouped_gemm::{self, WPath};
use dg_kernels::gemm::GemmParams;
use dg_kernels::split_k;

use super::{ProbeError, ProbeOptions, alternating, time_product};
use dg_parity::testing::seeded;

/// Rows of the vocabulary timed (a quarter of the real 262144: 369 MB of 16-bit weights, far
/// more than the L2 holds, so W streams from DRAM as in the forward).
const VOCAB: u32 = 65536;
/// The model's hidden size and canvas.
const HIDDEN: u32 = 2816;
const CANVAS: u32 = 256;

/// The head (`C[256, V] = A · Eᵀ`, E `[V, H]` read as `W[n][k]`) over [`VOCAB`] rows with E in
/// BF16 rows (as the forward), F16 rows and F16 K panels; then the soft embedding (`C[256, H] =
/// P · E`, E `[V, H]` read as `B[k][n]`) over the real vocabulary, split over K as the forward
/// splits it, with P in f32 (as the forward) and in f16. The forward's tile (128 × 128, depth 3,
/// constant stages); µs, TFLOP/s and the weights' TB/s, twice in alternating order.
pub fn vocab_product_layouts_probe(ctx: &GpuContext, _options: &ProbeOptions) -> Result<(), ProbeError> {
    let test = "vocab_product_layouts_probe";
    let mut pipelines = Pipelines::default();
    let reduce = pipelines.get_source(ctx, split_k::source())?;
    let tile = coop_gemm::TILE_128X128.with_stages(dg_kernels::coop_kloop::Stages::Constant);
    let (h, m) = (HIDDEN, CANVAS);
    let no_scratch = ctx.storage_buffer("split partials", 4)?;
    {
        let v = VOCAB;
        let e = seeded((v * h) as usize, 81, 0.05);
        let bf16 = ctx.upload("e bf16", &dg_kernels::pack_bf16(&e))?;
        let f16 = ctx.upload("e f16", &dg_kernels::pack_f16(&e))?;
        let panels =
            ctx.upload("e f16 panels", &coop_grouped_gemm::pack_f16_panels(&e, v as usize, h as usize, coop_gemm::PANEL as usize))?;
        drop(e);
        let normed = seeded((m * h) as usize, 82, 1.0);
        let a = ctx.upload("normed", &normed)?;
        let a16 = ctx.upload("normed f16", &dg_kernels::pack_f16(&normed))?;
        let c = ctx.storage_buffer("logits", u64::from(m * v) * 4)?;
        let p = GemmParams::linear(m, v, h);
        let whole = super::split_into(tile, p.k, 1);
        // A ring set holds 16 registers with f16 A where f32 A takes 24: f16 A at depth 4 costs
        // the registers of the forward's f32 depth 3.
        let cases = [
            ("BF16 rows (the forward's)", WeightFormat::Bf16, BLayout::Nk, &bf16, AFormat::F32, &a, 3),
            ("BF16 rows, f16 A", WeightFormat::Bf16, BLayout::Nk, &bf16, AFormat::F16, &a16, 3),
            ("BF16 rows, f16 A, depth 4", WeightFormat::Bf16, BLayout::Nk, &bf16, AFormat::F16, &a16, 4),
            ("F16 rows", WeightFormat::F16, BLayout::Nk, &f16, AFormat::F32, &a, 3),
            ("F16 K panels", WeightFormat::F16, BLayout::NkPanels, &panels, AFormat::F32, &a, 3),
        ];
        for round in 0..2 {
            for i in alternating(round, cases.len()) {
                let (what, format, layout, w, a_format, a, depth) = cases[i];
                let tile = tile.with_depth(depth);
                let kernel = pipelines.get_source(ctx, coop_gemm::source_for_a(tile, WPath::Staged, format, layout, a_format))?;
                let t = time_product(ctx, (&kernel, &reduce), tile, &p, whole, [a, w, &no_scratch, &c])?;
                report(test, round, &format!("head over {v} rows, E in {what}"), tile, &p, t, 262144 / v);
            }
        }
    }
    let v = 262144;
    let e = seeded((v * h) as usize, 84, 0.05);
    let bf16 = ctx.upload("e bf16", &dg_kernels::pack_bf16(&e))?;
    drop(e);
    let probs = seeded((m * v) as usize, 85, 1.0 / v as f32);
    let p32 = ctx.upload("probabilities f32", &probs)?;
    let p16 = ctx.upload("probabilities f16", &dg_kernels::pack_f16(&probs))?;
    drop(probs);
    let c = ctx.storage_buffer("soft embedding", u64::from(m * h) * 4)?;
    let p = GemmParams::new(m, h, v);
    let scratch_len = 512u64 << 20;
    let scratch = ctx.storage_buffer("split partials", scratch_len)?;
    let split = split::choose(tile, &p, split::target(tile, &p, dg_gpu::planner::ASSUMED_MULTIPROCESSORS), scratch_len / 4)
        .unwrap_or_else(|| super::split_into(tile, p.k, 1));
    let cases = [("f32 (the forward's)", AFormat::F32, &p32, 3), ("f16", AFormat::F16, &p16, 3), ("f16, depth 4", AFormat::F16, &p16, 4)];
    for round in 0..2 {
        for i in alternating(round, cases.len()) {
            let (what, a_format, a, depth) = cases[i];
            let tile = tile.with_depth(depth);
            let kernel =
                pipelines.get_source(ctx, coop_gemm::source_for_a(tile, WPath::Staged, WeightFormat::Bf16, BLayout::Kn, a_format))?;
            let t = time_product(ctx, (&kernel, &reduce), tile, &p, split, [a, &bf16, &scratch, &c])?;
            report(test, round, &format!("soft embedding, {} splits of K, P in {what}", split.splits), tile, &p, t, 1);
        }
    }
    Ok(())
}

/// One line: µs, TFLOP/s and the weights' TB/s of `p` in `t` seconds, and `t` times `scale` (the
/// real vocabulary's share).
fn report(test: &str, round: u32, what: &str, tile: CoopTile, p: &GemmParams, t: f64, scale: u32) {
    let flops = 2.0 * f64::from(p.m) * f64::from(p.n) * f64::from(p.k);
    let bytes = f64::from(p.n) * f64::from(p.k) * 2.0;
    println!(
        "{test}: round {round}, {what} [{}]: {:.1} us, {:.0} TFLOP/s, {:.2} TB/s of weights; x{scale}: {:.3} ms",
        tile.label(),
        t * 1e6,
        flops / t / 1e12,
        bytes / t / 1e12,
        t * 1e3 * f64::from(scale)
    );
}

//! The decoder's two attention products on the tensor cores (`Gemma4TextAttention`'s
//! `q · Kᵀ` and `P · V` over the KV cache, as `dg_gpu::forward` records them per layer), at the
//! real canvas over 1024 cached positions, against variants that each change one thing: twice
//! the keys (twice the workgroups, the same K steps each), twice the head size in the scores
//! (the same workgroups, twice the K steps) and the other attention tile. From these a product's
//! time splits into what its workgroups cost per K step and what they cost besides (filling the
//! ring, storing C): the question behind attention as one kernel. Times only.
//!
//! [`fused_attention_probe`] then times that kernel (`dg_kernels::coop_attention`) against the
//! scores product, the softmax and the values product it replaces, each as the forward records
//! it (`Recorder`), at the real canvas over several contexts, and compares their outputs.

use dg_gpu::{GpuContext, Pipelines};
use dg_kernels::WeightFormat;
use dg_kernels::coop_gemm::{self, BLayout, CoopTile, WPath};
use dg_kernels::gemm::GemmParams;
use dg_kernels::split_k;

use super::{ProbeError, ProbeOptions, alternating, split_into, time_product};
use dg_parity::testing::seeded;

/// Canvas rows (queries) and cached positions of the forward measured in BENCHMARKS.md.
const CANVAS: usize = 256;
const CONTEXT: usize = 1024;
/// Query heads of the real model.
const HEADS: usize = 16;

/// One layer kind's attention: head size and K/V heads.
struct Kind {
    name: &'static str,
    d: usize,
    kv_heads: usize,
}

const KINDS: [Kind; 2] = [Kind { name: "sliding", d: 256, kv_heads: 8 }, Kind { name: "full", d: 512, kv_heads: 2 }];

/// One timed product: what it is, its parameters (from `dg_gpu::ops`' attention helpers), the
/// B layout (keys `[s][kv][d]` read as W rows; values as `B[k][n]`) and the tile.
struct Case {
    what: &'static str,
    p: GemmParams,
    layout: BLayout,
    tile: CoopTile,
}

/// Each layer kind's scores and values at the forward's shape and tiles, and the variants the
/// module doc names; µs and TFLOP/s, twice in alternating order.
pub fn attention_products_probe(ctx: &GpuContext, _options: &ProbeOptions) -> Result<(), ProbeError> {
    let test = "attention_products_probe";
    let mut pipelines = Pipelines::default();
    let keys = CONTEXT + CANVAS;
    let (big, small) = (coop_gemm::TILE_128X128, coop_gemm::ATTENTION_TILE);
    for kind in &KINDS {
        let scores = |s: usize, d: usize| dg_gpu::ops::attention_scores_params(CANVAS, s, d, HEADS, kind.kv_heads);
        let values = |s: usize| dg_gpu::ops::attention_values_params(CANVAS, s, kind.d, HEADS, kind.kv_heads);
        let case = |what, p, layout, tile| Case { what, p, layout, tile };
        let cases = [
            case("scores (the forward's)", scores(keys, kind.d), BLayout::Nk, big),
            case("scores, twice the keys", scores(2 * keys, kind.d), BLayout::Nk, big),
            case("scores, twice the head size", scores(keys, 2 * kind.d), BLayout::Nk, big),
            case("scores, the small tile", scores(keys, kind.d), BLayout::Nk, small),
            case("values, small tile", values(keys), BLayout::Kn, small),
            case("values, large tile, K whole", values(keys), BLayout::Kn, big),
            case("values, twice the keys, small tile", values(2 * keys), BLayout::Kn, small),
        ];
        for round in 0..2 {
            for i in alternating(round, cases.len()) {
                let c = &cases[i];
                let t = time_batched(ctx, &mut pipelines, c)?;
                let flops = 2.0 * f64::from(c.p.m) * f64::from(c.p.n) * f64::from(c.p.k) * f64::from(c.p.batch);
                let groups = coop_gemm::workgroups(c.tile, c.p.m, c.p.n, c.p.batch);
                println!(
                    "{test}: round {round}, {} layer, {} ({} x {} x {}, {} heads) [{}]: {:.1} us, {:.0} TFLOP/s, {} workgroups of {} K steps",
                    kind.name,
                    c.what,
                    c.p.m,
                    c.p.n,
                    c.p.k,
                    c.p.batch,
                    c.tile.label(),
                    t * 1e6,
                    flops / t / 1e12,
                    groups[0] * groups[1],
                    c.p.k / c.tile.bk,
                );
            }
        }
    }
    Ok(())
}

/// Best time of `c`'s product over all its heads at once (one workgroup row a head, as the
/// forward runs it), K unsplit; A f32 and B F16, as the forward's q and cache.
fn time_batched(ctx: &GpuContext, pipelines: &mut Pipelines, c: &Case) -> Result<f64, ProbeError> {
    let p = &c.p;
    let batch = p.batch as usize;
    let div = p.b_batch_div.max(1) as usize;
    // Every element either operand's strides reach, plus the last row's.
    let a_len = p.a_offset as usize + (batch - 1) * p.a_batch as usize + (p.m as usize - 1) * p.a_rs as usize + p.k as usize;
    let b_len = (batch / div - 1) * p.b_batch as usize + (p.k as usize - 1) * p.b_rs as usize + (p.n as usize - 1) * p.b_cs as usize + 1;
    let c_len = (batch - 1) * p.c_batch as usize + (p.m as usize - 1) * p.c_rs as usize + p.n as usize;
    let a = ctx.upload("a", &seeded(a_len, 91, 1.0))?;
    let b = ctx.upload("b", &dg_kernels::pack_f16(&seeded(b_len.next_multiple_of(4), 92, 1.0)))?;
    let out = ctx.storage_buffer("c", (c_len * 4) as u64)?;
    let kernel = pipelines.get_source(ctx, coop_gemm::source_for(c.tile, WPath::Staged, WeightFormat::F16, c.layout))?;
    let reduce = pipelines.get_source(ctx, split_k::source())?;
    // K unsplit: no scratch is bound, `out` stands in its place.
    time_product(ctx, (&kernel, &reduce), c.tile, p, split_into(c.tile, p.k, 1), [&a, &b, &out, &out])
}

/// Cached positions [`fused_attention_probe`] runs at: the forward's, and longer ones where the
/// kernel's workgroups each read their head's whole cache.
const FUSED_CONTEXTS: [usize; 3] = [1024, 4096, 16384];

/// The decoder's attention of a canvas over `FUSED_CONTEXTS` cached positions, both layer kinds:
/// the fused kernel against the scores product, masked softmax and values product as
/// `dg_gpu::ops::Recorder` records them (the planner's tiles); µs twice in alternating order, and
/// the largest difference between the two outputs.
pub fn fused_attention_probe(ctx: &GpuContext, _options: &ProbeOptions) -> Result<(), ProbeError> {
    use dg_gpu::ops::{Operand, Recorder};
    use dg_kernels::coop_attention::{self, AttentionParams};
    use dg_kernels::softmax::SoftmaxParams;
    let test = "fused_attention_probe";
    let mut pipelines = Pipelines::default();
    let replays = 20u32;
    for context in FUSED_CONTEXTS {
        for kind in &KINDS {
            let (d, kv) = (kind.d, kind.kv_heads);
            if !coop_attention::takes(d as u32, CANVAS as u32, 16, ctx.limits.max_compute_workgroup_storage_size) {
                println!("{test}: {} layer: the kernel does not fit this device", kind.name);
                continue;
            }
            // The forward's layout: [visible | dead up to a multiple of 32 | canvas], 7 dead keys.
            let visible = context - 7;
            let keys = context + CANVAS;
            let row = kv * d;
            let a = (12.0 / (d as f32).sqrt()).sqrt();
            let q = ctx.upload("q", &seeded(CANVAS * HEADS * d, 93, a))?;
            let k = ctx.upload("k", &dg_kernels::pack_f16(&seeded(keys * row, 94, a)))?;
            let v = ctx.upload("v", &dg_kernels::pack_f16(&seeded(keys * row, 95, 1.0)))?;
            let scores = ctx.storage_buffer("scores", (HEADS * CANVAS * keys * 4) as u64)?;
            let (fused_out, products_out) =
                (ctx.storage_buffer("o", (CANVAS * HEADS * d * 4) as u64)?, ctx.storage_buffer("o", (CANVAS * HEADS * d * 4) as u64)?);
            let cache = |b| Operand::kv_cache(b, WeightFormat::F16);
            let mask = SoftmaxParams {
                gap_start: visible as u32,
                gap_end: context as u32,
                ..SoftmaxParams::plain((HEADS * CANVAS) as u32, keys as u32)
            };
            let fused = AttentionParams {
                gap_start: mask.gap_start,
                gap_end: mask.gap_end,
                ..dg_gpu::ops::attention_fused_params(CANVAS, keys, d, HEADS, kv)
            };
            let plan = |fused_path: bool, pipelines: &mut Pipelines| -> Result<dg_gpu::Plan, ProbeError> {
                let mut rec = Recorder::new(ctx, pipelines);
                for _ in 0..replays {
                    if fused_path {
                        rec.fused_attention(&q, (&k, &v), &fused_out, fused, (HEADS, d))?;
                    } else {
                        rec.product(&q, cache(&k), &scores, dg_gpu::ops::attention_scores_params(CANVAS, keys, d, HEADS, kv), true)?;
                        rec.softmax(&scores, mask)?;
                        rec.product(
                            &scores,
                            cache(&v),
                            &products_out,
                            dg_gpu::ops::attention_values_params(CANVAS, keys, d, HEADS, kv),
                            true,
                        )?;
                    }
                }
                Ok(rec.finish()?)
            };
            let plans = [plan(false, &mut pipelines)?, plan(true, &mut pipelines)?];
            let key_tile = coop_attention::key_tile_for(d as u32, ctx.limits.max_compute_workgroup_storage_size).expect("checked above");
            let source = coop_attention::source(d as u32, key_tile, ctx.coop_fragment);
            // And without its first pass (each row's maximum): what that pass costs.
            let pass1 = (
                "var row_max = LOWEST;\n    for (var t = 0u; t < tiles; t++) {",
                "var row_max = LOWEST;\n    for (var t = 0u; t < 0u * tiles; t++) {",
            );
            let one_pass = pipelines.get_source(ctx, super::replaced(&source, "one_pass", &[pass1]))?;
            let groups = coop_attention::workgroups(&fused, HEADS as u32);
            let names = ["scores, softmax, values", "fused", "fused, second pass only (timing only)"];
            for round in 0..2 {
                for i in alternating(round, names.len()) {
                    let t = match i {
                        2 => super::time_dispatch(ctx, &one_pass, &fused, &[&q, &k, &v, &fused_out], groups, replays)?,
                        _ => super::best_time(ctx, &plans[i], replays),
                    };
                    println!(
                        "{test}: round {round}, context {context}, {} layer ({keys} keys, d {d}), {}: {:.1} us",
                        kind.name,
                        names[i],
                        t * 1e6
                    );
                }
            }
            // The outputs of the kernel as the forward runs it.
            plans[1].run(ctx)?;
            let (x, y) = (ctx.read_f32(&fused_out, 0, CANVAS * HEADS * d)?, ctx.read_f32(&products_out, 0, CANVAS * HEADS * d)?);
            let diff = x.iter().zip(&y).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            println!("{test}: context {context}, {} layer: outputs differ by at most {diff:.2e} (V in ±1)", kind.name);
        }
    }
    Ok(())
}

//! The decoder's two attention products on the tensor cores (`Gemma4TextAttention`'s
//! `q · Kᵀ` and `P · V` over the KV cache, as `dg_gpu::forward` records them per layer), at the
//! real canvas over 1024 cached positions, against variants that each change one thing: twice
//! the keys (twice the workgroups, the same K steps each), twice the head size in the scores
//! (the same workgroups, twice the K steps) and the other attention tile. From these a product's
//! time splits into what its workgroups cost per K step and what they cost besides (filling the
//! ring, storing C): the question behind attention as one kernel. Times only. (The fused kernel
//! that question led to was measured and not kept: bench/history/attention.md.)

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

//! Kernel-level parity of the mixture-of-experts kernels: the router tail (`router_topk`) against
//! `dg_cpu::moe::route`'s softmax / top-k / renormalise / per-expert-scale, ties included; the
//! dispatch's counting-sort invariants and its exact (expert, k, t) slot order; the combine's
//! fixed ascending-expert sum; and the whole MoE (router_topk → dispatch → per-expert GEMMs on
//! the CPU over the dispatched slots → combine) against `dg_cpu::moe::experts` on random weights.
//! Every output carries a guard band.

use dg_gpu::{GpuContext, Pipelines, PlanBuilder, groups_1d};
use dg_kernels::coop_grouped_gemm;
use dg_kernels::moe_combine::{self, MoeCombineParams};
use dg_kernels::moe_dispatch::{self, MoeDispatchParams, NO_SLOT};
use dg_kernels::router_topk::{self, RouterTopkParams};
use dg_kernels::row_reduce::RowReduce;
use dg_model::{LayerKind, LayerSpec, RopeSpec, TextConfig, Weights};
use dg_parity::testing::{guarded_output, max_rel_err, read_guarded, seeded, test_context};

/// Router weights: the GPU's `exp` may differ from the CPU's by an ulp or two and FMA may fuse
/// the renormalisation; relative to the largest weight of the token.
const ROUTER_TOLERANCE: f32 = 2e-6;
/// Combine: K products summed in the same order as the CPU (possibly fused into FMAs).
const COMBINE_TOLERANCE: f32 = 1e-6;
/// Whole MoE: the router weights' tolerance carried through the weighted sum of expert outputs
/// that are bit-identical to the CPU's (same GEMM over the same rows in the same order).
const MOE_TOLERANCE: f32 = 4e-6;

/// u32 view of a guarded read (the guard check is on the raw bits, so it works for u32 too).
fn read_guarded_u32(ctx: &GpuContext, buffer: &wgpu::Buffer, len: usize) -> Vec<u32> {
    read_guarded(ctx, buffer, len).into_iter().map(f32::to_bits).collect()
}

/// The tail of `dg_cpu::moe::route` (after the projection), verbatim: f32 softmax, top-k by
/// descending probability with ties to the lower index, renormalise, `× per_expert_scale`.
fn route_tail(logits: &[f32], experts: usize, k: usize, per_expert_scale: &[f32]) -> (Vec<u32>, Vec<f32>) {
    let mut idx = Vec::new();
    let mut weights = Vec::new();
    for row in logits.chunks_exact(experts) {
        let mut row = row.to_vec();
        dg_cpu::ops::softmax_in_place(&mut row);
        let mut order: Vec<usize> = (0..experts).collect();
        order.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
        let top = &order[..k];
        let sum: f32 = top.iter().map(|&i| row[i]).sum();
        for &i in top {
            idx.push(i as u32);
            weights.push((row[i] / sum) * per_expert_scale[i]);
        }
    }
    (idx, weights)
}

/// Runs `router_topk`; returns (idx, weights).
#[allow(clippy::too_many_arguments)]
fn run_router(
    ctx: &GpuContext,
    reduce: RowReduce,
    logits: &[f32],
    scale: &[f32],
    tokens: usize,
    experts: usize,
    k: usize,
    max_dim: u32,
) -> (Vec<u32>, Vec<f32>) {
    let mut pipelines = Pipelines::default();
    let p = pipelines.get_source(ctx, router_topk::source(reduce)).unwrap();
    let lb = ctx.upload("logits", logits).unwrap();
    let sb = ctx.upload("per_expert_scale", scale).unwrap();
    let idx = guarded_output(ctx, "idx", tokens * k);
    let w = guarded_output(ctx, "weights", tokens * k);
    let params = RouterTopkParams { tokens: tokens as u32, experts: experts as u32, k: k as u32, splits: 1, split_stride: 0, _pad: [0; 3] };
    let mut plan = PlanBuilder::new(ctx);
    plan.push(&p, &params, &[&lb, &sb, &idx, &w], groups_1d(router_topk::workgroups(&params), max_dim));
    plan.finish(ctx).unwrap().run(ctx).unwrap();
    (read_guarded_u32(ctx, &idx, tokens * k), read_guarded(ctx, &w, tokens * k))
}

fn check_router(got: &(Vec<u32>, Vec<f32>), want: &(Vec<u32>, Vec<f32>), k: usize, what: &str) {
    assert_eq!(got.0.len(), want.0.len());
    for (t, (gi, wi)) in got.0.chunks_exact(k).zip(want.0.chunks_exact(k)).enumerate() {
        assert_eq!(gi, wi, "{what}: token {t}: experts differ");
    }
    for (t, (gw, ww)) in got.1.chunks_exact(k).zip(want.1.chunks_exact(k)).enumerate() {
        let (err, at) = max_rel_err(gw, ww);
        assert!(err <= ROUTER_TOLERANCE, "{what}: token {t}: weight rel err {err} at {at}: {} vs {}", gw[at], ww[at]);
    }
}

#[test]
fn router_topk_matches_cpu() {
    let Some(ctx) = test_context("router_topk_matches_cpu") else { return };
    let fold = [ctx.limits.max_compute_workgroups_per_dimension, 2];
    for &(tokens, experts, k) in &[(1, 8, 2), (5, 8, 3), (64, 8, 2), (300, 128, 8), (7, 1, 1), (9, 5, 5), (33, 128, 1)] {
        let logits = seeded(tokens * experts, 61 + tokens as u64 * 3 + experts as u64, 4.0);
        let scale: Vec<f32> = seeded(experts, 62, 0.2).iter().map(|v| 1.0 + v).collect();
        let want = route_tail(&logits, experts, k, &scale);
        for (max_dim, reduce) in fold.into_iter().flat_map(|m| ctx.row_reduces().into_iter().map(move |r| (m, r))) {
            let got = run_router(&ctx, reduce, &logits, &scale, tokens, experts, k, max_dim);
            check_router(&got, &want, k, &format!("T={tokens} E={experts} K={k} fold={max_dim} {reduce:?}"));
        }
    }
}

#[test]
fn router_topk_breaks_ties_by_lower_expert() {
    let Some(ctx) = test_context("router_topk_breaks_ties_by_lower_expert") else { return };
    let (tokens, experts, k) = (40, 128, 8);
    // Logits on a coarse grid: many exact ties, distinct values far apart (no near-ties that the
    // GPU's and the CPU's exp could order differently).
    let mut logits: Vec<f32> = seeded(tokens * experts, 63, 3.0).iter().map(|v| (v * 2.0).round() * 0.5).collect();
    logits[..experts].fill(0.25); // token 0: all equal → experts 0..8
    let scale = vec![1.0; experts];
    let want = route_tail(&logits, experts, k, &scale);
    assert_eq!(&want.0[..k], &[0, 1, 2, 3, 4, 5, 6, 7]);
    for reduce in ctx.row_reduces() {
        let got = run_router(&ctx, reduce, &logits, &scale, tokens, experts, k, 65_535);
        check_router(&got, &want, k, &format!("ties {reduce:?}"));
        assert!(got.1[..k].iter().all(|&w| (w - 0.125).abs() < 1e-7), "{reduce:?}: equal logits give equal weights: {:?}", &got.1[..k]);
    }
}

/// Runs `moe_dispatch`; returns (offsets, rows, slot_of).
fn run_dispatch(ctx: &GpuContext, idx: &[u32], tokens: usize, k: usize, experts: usize) -> (Vec<u32>, Vec<u32>, Vec<u32>) {
    run_dispatch_folded(ctx, idx, tokens, k, experts, 65_535, 0)
}

/// [`run_dispatch`] with the grid folded at `max_dim` workgroups per dimension, and with the tile
/// table of m tiles of `tile_rows` after the offsets where that is not 0.
fn run_dispatch_folded(
    ctx: &GpuContext,
    idx: &[u32],
    tokens: usize,
    k: usize,
    experts: usize,
    max_dim: u32,
    tile_rows: u32,
) -> (Vec<u32>, Vec<u32>, Vec<u32>) {
    let mut pipelines = Pipelines::default();
    let p = pipelines.get_source(ctx, moe_dispatch::source()).unwrap();
    let ib = ctx.upload("idx", idx).unwrap();
    let params = MoeDispatchParams { tokens: tokens as u32, k: k as u32, experts: experts as u32, tile_rows };
    let offsets_len = moe_dispatch::offsets_len(&params) as usize;
    let offsets = guarded_output(ctx, "offsets", offsets_len);
    let rows = guarded_output(ctx, "rows", tokens * k);
    let slot_of = guarded_output(ctx, "slot_of", tokens * k);
    let mut plan = PlanBuilder::new(ctx);
    plan.push(&p, &params, &[&ib, &offsets, &rows, &slot_of], groups_1d(moe_dispatch::workgroups(&params), max_dim));
    plan.finish(ctx).unwrap().run(ctx).unwrap();
    (read_guarded_u32(ctx, &offsets, offsets_len), read_guarded_u32(ctx, &rows, tokens * k), read_guarded_u32(ctx, &slot_of, tokens * k))
}

/// Checks the dispatch invariants and the exact slot order (expert, then k, then t).
fn check_dispatch(d: &(Vec<u32>, Vec<u32>, Vec<u32>), idx: &[u32], tokens: usize, k: usize, experts: usize, what: &str) {
    let (offsets, rows, slot_of) = d;
    let n = tokens * k;
    assert_eq!(offsets[0], 0, "{what}: offsets[0]");
    assert_eq!(offsets[experts] as usize, n, "{what}: offsets[E]");
    assert!(offsets.windows(2).all(|w| w[0] <= w[1]), "{what}: offsets not monotone: {offsets:?}");
    let mut seen = vec![false; n];
    for t in 0..tokens {
        for kk in 0..k {
            let e = idx[t * k + kk] as usize;
            let slot = slot_of[t * k + kk] as usize;
            assert!(slot < n, "{what}: (t={t}, k={kk}) slot {slot} out of range");
            assert!(!seen[slot], "{what}: slot {slot} used twice");
            seen[slot] = true;
            assert_eq!(rows[slot] as usize, t, "{what}: rows[slot_of[{t}, {kk}]]");
            assert!((offsets[e] as usize..offsets[e + 1] as usize).contains(&slot), "{what}: slot {slot} outside expert {e}'s range");
        }
    }
    // The deterministic order of the reference: per expert, k major then t.
    let mut order: Vec<(u32, usize, usize)> =
        (0..k).flat_map(|kk| (0..tokens).map(move |t| (kk, t))).map(|(kk, t)| (idx[t * k + kk], kk, t)).collect();
    order.sort_by_key(|&(e, kk, _)| (e, kk)); // stable: t ascending within (e, k)
    for (slot, &(_, kk, t)) in order.iter().enumerate() {
        assert_eq!(slot_of[t * k + kk] as usize, slot, "{what}: (t={t}, k={kk}) not in (expert, k, t) order");
    }
}

/// Distinct experts per token, like top-k, with a skew towards the low experts.
fn random_idx(tokens: usize, k: usize, experts: usize, seed: u64) -> Vec<u32> {
    let r = seeded(tokens * experts, seed, 1.0);
    let mut idx = Vec::with_capacity(tokens * k);
    for t in 0..tokens {
        let mut order: Vec<usize> = (0..experts).collect();
        let key = |e: usize| r[t * experts + e] - e as f32 * 0.5 / experts as f32;
        order.sort_by(|&a, &b| key(b).total_cmp(&key(a)));
        idx.extend(order[..k].iter().map(|&e| e as u32));
    }
    idx
}

#[test]
fn moe_dispatch_invariants() {
    let Some(ctx) = test_context("moe_dispatch_invariants") else { return };
    // Tables shorter and longer than a workgroup, not multiples of it, the real 256 × top-8 over
    // 128 experts, and more experts than a workgroup has invocations.
    for &(tokens, k, experts) in
        &[(1, 1, 1), (1, 2, 8), (5, 3, 8), (64, 2, 8), (256, 8, 128), (300, 8, 128), (1000, 8, 128), (31, 5, 256), (97, 4, 300)]
    {
        let idx = random_idx(tokens, k, experts, 70 + tokens as u64);
        let d = run_dispatch(&ctx, &idx, tokens, k, experts);
        check_dispatch(&d, &idx, tokens, k, experts, &format!("T={tokens} K={k} E={experts}"));
    }
    // A folded grid (padding workgroups past E + 1 leave at once).
    let (tokens, k, experts) = (50, 3, 16);
    let idx = random_idx(tokens, k, experts, 78);
    let d = run_dispatch_folded(&ctx, &idx, tokens, k, experts, 4, 0);
    check_dispatch(&d, &idx, tokens, k, experts, "folded grid");
    // Everything to one expert, and repeated experts within a token (not top-k, still sorted).
    let (tokens, k, experts) = (100, 4, 16);
    let idx = vec![9u32; tokens * k];
    let d = run_dispatch(&ctx, &idx, tokens, k, experts);
    check_dispatch(&d, &idx, tokens, k, experts, "all to expert 9");
    let idx: Vec<u32> = (0..tokens * k).map(|i| (i % 3) as u32 * 5).collect();
    let d = run_dispatch(&ctx, &idx, tokens, k, experts);
    check_dispatch(&d, &idx, tokens, k, experts, "repeats");
    // An out-of-range expert id gets no slot.
    let mut idx = random_idx(6, 2, 8, 79);
    idx[3] = 8;
    let (offsets, _, slot_of) = run_dispatch(&ctx, &idx, 6, 2, 8);
    assert_eq!(slot_of[3], NO_SLOT);
    assert_eq!(offsets[8], 11);
}

#[test]
fn moe_dispatch_lists_the_experts_m_tiles_for_the_tensor_core_gemm() {
    let Some(ctx) = test_context("moe_dispatch_lists_the_experts_m_tiles_for_the_tensor_core_gemm") else { return };
    // The real decoder (256 × top-8 over 128) and encoder chunk, more experts than a workgroup
    // has invocations, everything to one expert, and out-of-range ids (no slot, no tile; the
    // table's length still counts them).
    let mut cases: Vec<(usize, usize, usize, Vec<u32>)> = [(256, 8, 128), (1000, 8, 128), (31, 5, 256), (97, 4, 300), (5, 3, 8)]
        .iter()
        .map(|&(t, k, e)| (t, k, e, random_idx(t, k, e, 90 + t as u64)))
        .collect();
    cases.push((100, 4, 16, vec![9u32; 400]));
    let mut bad = random_idx(40, 4, 8, 79);
    for e in bad.iter_mut().step_by(10) {
        *e = 8;
    }
    cases.push((40, 4, 8, bad));
    for (tokens, k, experts, idx) in &cases {
        let (tokens, k, experts) = (*tokens, *k, *experts);
        let plain = run_dispatch(&ctx, idx, tokens, k, experts);
        for tile_rows in [16, 32, 64] {
            let what = format!("T={tokens} K={k} E={experts}, m tiles of {tile_rows}");
            // A folded grid too: the table's workgroup is then not the last of the grid.
            let (offsets, rows, slot_of) = run_dispatch_folded(&ctx, idx, tokens, k, experts, 7, tile_rows);
            assert_eq!(&offsets[..=experts], &plain.0[..], "{what}: offsets");
            assert_eq!((&rows, &slot_of), (&plain.1, &plain.2), "{what}: rows and slots");
            let counts: Vec<u32> = offsets[..=experts].windows(2).map(|w| w[1] - w[0]).collect();
            assert_eq!(
                &offsets[experts + 1..],
                &coop_grouped_gemm::tile_table(&counts, (tokens * k) as u32, tile_rows)[..],
                "{what}: tile table"
            );
        }
    }
}

/// The CPU twin of the combine: from 0, ascending expert order, `+= y·w`.
fn combine_cpu(y: &[f32], idx: &[u32], weights: &[f32], slot_of: &[u32], tokens: usize, k: usize, hidden: usize) -> Vec<f32> {
    let mut out = vec![0f32; tokens * hidden];
    for t in 0..tokens {
        let mut entries: Vec<usize> = (0..k).collect();
        entries.sort_by_key(|&kk| idx[t * k + kk]);
        for kk in entries {
            let (slot, w) = (slot_of[t * k + kk] as usize, weights[t * k + kk]);
            let o = &mut out[t * hidden..(t + 1) * hidden];
            o.iter_mut().zip(&y[slot * hidden..(slot + 1) * hidden]).for_each(|(o, &v)| *o += v * w);
        }
    }
    out
}

#[allow(clippy::too_many_arguments)]
fn run_combine(
    ctx: &GpuContext,
    source: dg_kernels::KernelSource,
    y: &[f32],
    idx: &[u32],
    weights: &[f32],
    slot_of: &[u32],
    tokens: usize,
    k: usize,
    hidden: usize,
    max_dim: u32,
) -> Vec<f32> {
    let mut pipelines = Pipelines::default();
    let p = pipelines.get_source(ctx, source).unwrap();
    let yb = ctx.upload("y", y).unwrap();
    let ib = ctx.upload("idx", idx).unwrap();
    let wb = ctx.upload("weights", weights).unwrap();
    let sb = ctx.upload("slot_of", slot_of).unwrap();
    let out = guarded_output(ctx, "out", tokens * hidden);
    let params = MoeCombineParams { tokens: tokens as u32, k: k as u32, hidden: hidden as u32, _pad: 0 };
    let mut plan = PlanBuilder::new(ctx);
    plan.push(&p, &params, &[&yb, &ib, &wb, &sb, &out], groups_1d(moe_combine::workgroups(&params), max_dim));
    plan.finish(ctx).unwrap().run(ctx).unwrap();
    read_guarded(ctx, &out, tokens * hidden)
}

#[test]
fn moe_combine_sums_in_expert_order() {
    let Some(ctx) = test_context("moe_combine_sums_in_expert_order") else { return };
    for &(tokens, k, experts, hidden) in &[(1, 2, 8, 5), (5, 3, 8, 300), (64, 8, 128, 257), (3, 1, 4, 2816)] {
        let idx = random_idx(tokens, k, experts, 80 + tokens as u64);
        let (_, _, slot_of) = run_dispatch(&ctx, &idx, tokens, k, experts);
        let weights = seeded(tokens * k, 81, 1.0);
        let y = seeded(tokens * k * hidden, 82, 3.0);
        let want = combine_cpu(&y, &idx, &weights, &slot_of, tokens, k, hidden);
        for max_dim in [ctx.limits.max_compute_workgroups_per_dimension, 3] {
            let got = run_combine(&ctx, moe_combine::source(), &y, &idx, &weights, &slot_of, tokens, k, hidden, max_dim);
            let (err, at) = max_rel_err(&got, &want);
            assert!(err <= COMBINE_TOLERANCE, "T={tokens} K={k} H={hidden} fold={max_dim}: rel err {err} at {at}");
            // Four columns at a time where H allows: the same bits.
            let wide = run_combine(&ctx, moe_combine::source_for(hidden as u32), &y, &idx, &weights, &slot_of, tokens, k, hidden, max_dim);
            assert!(
                wide.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits()),
                "T={tokens} K={k} H={hidden} fold={max_dim}: vec4 columns differ"
            );
        }
    }
    // Skipped entries (no slot) contribute nothing.
    let (tokens, k, hidden) = (2, 2, 3);
    let y = vec![1.0, 2.0, 3.0, 10.0, 20.0, 30.0, 100.0, 200.0, 300.0];
    let got =
        run_combine(&ctx, moe_combine::source(), &y, &[0, 1, 1, 0], &[1.0, 0.5, 2.0, 1.0], &[0, NO_SLOT, 1, 2], tokens, k, hidden, 65_535);
    assert_eq!(got, vec![1.0, 2.0, 3.0, 100.0 + 20.0, 200.0 + 40.0, 300.0 + 60.0]);
    // The order is observable: experts (2, 0, 1) in k order with outputs (1, 1e8, −1e8) sum to 1
    // in ascending expert order ((1e8 − 1e8) + 1) but to 0 in k order ((1 + 1e8) − 1e8).
    let y = vec![1e8, -1e8, 1.0];
    let got = run_combine(&ctx, moe_combine::source(), &y, &[2, 0, 1], &[1.0, 1.0, 1.0], &[2, 0, 1], 1, 3, 1, 65_535);
    assert_eq!(got, vec![1.0], "combine must sum in ascending expert order");
    // The same with four columns at a time (each column a copy) and a skipped entry in between.
    let y4: Vec<f32> = [1e8f32, -1e8, 1.0, 5.0].iter().flat_map(|&v| [v; 4]).collect();
    let got =
        run_combine(&ctx, moe_combine::source_for(4), &y4, &[2, 3, 0, 1], &[1.0, 1.0, 1.0, 1.0], &[2, NO_SLOT, 0, 1], 1, 4, 4, 65_535);
    assert_eq!(got, vec![1.0; 4], "vec4 combine must sum in ascending expert order");
}

/// A small config with 8 experts of width 24 over hidden 64.
fn tiny_config(top_k: usize) -> TextConfig {
    TextConfig {
        vocab_size: 16,
        hidden_size: 64,
        intermediate_size: 32,
        num_attention_heads: 2,
        num_experts: 8,
        top_k_experts: top_k,
        moe_intermediate_size: 24,
        rms_norm_eps: 1e-6,
        sliding_window: 8,
        final_logit_softcapping: Some(30.0),
        max_position_embeddings: 64,
        pad_token_id: Some(0),
        layers: vec![LayerSpec {
            kind: LayerKind::Sliding,
            head_dim: 8,
            num_kv_heads: 1,
            rope: RopeSpec { theta: 10_000.0, proportional: false, partial_rotary_factor: 1.0, factor: 1.0 },
        }],
    }
}

#[test]
fn moe_end_to_end_matches_cpu_experts() {
    let Some(ctx) = test_context("moe_end_to_end_matches_cpu_experts") else { return };
    for top_k in [2, 3] {
        let cfg = tiny_config(top_k);
        let weights = Weights::random(&cfg, 90 + top_k as u64).unwrap();
        let lw = &weights.layers[0];
        let (hid, e, inter) = (cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size);
        for tokens in [1, 5, 64] {
            let what = format!("top-{top_k} T={tokens}");
            let h = seeded(tokens * hid, 91 + tokens as u64, 2.0);
            // CPU reference: route, then the experts on pre_feedforward_layernorm_2(h).
            let routing = dg_cpu::moe::route(&h, tokens, lw, &cfg);
            let mut u = vec![0f32; tokens * hid];
            dg_cpu::ops::rms_norm_into(&mut u, &h, hid, Some(&lw.pre_feedforward_layernorm_2), cfg.rms_norm_eps);
            let mut want = vec![0f32; tokens * hid];
            dg_cpu::moe::experts(&mut want, &u, tokens, &routing, lw);

            // The router's logits, computed as `route` does before its softmax.
            let mut r = vec![0f32; tokens * hid];
            dg_cpu::ops::rms_norm_into(&mut r, &h, hid, None, cfg.rms_norm_eps);
            let root = (hid as f64).powf(-0.5) as f32;
            for row in r.chunks_exact_mut(hid) {
                row.iter_mut().zip(&lw.router_scale).for_each(|(x, &s)| *x = (*x * s) * root);
            }
            let mut logits = vec![0f32; tokens * e];
            dg_cpu::linalg::linear(&mut logits, &r, tokens, &lw.router_proj);

            // GPU: router_topk, then dispatch.
            let (idx, w) = run_router(&ctx, ctx.row_reduce(), &logits, &lw.per_expert_scale, tokens, e, top_k, 65_535);
            let want_idx: Vec<u32> = routing.experts.iter().map(|&x| x as u32).collect();
            check_router(&(idx.clone(), w.clone()), &(want_idx, routing.weights.clone()), top_k, &what);
            let d = run_dispatch(&ctx, &idx, tokens, top_k, e);
            check_dispatch(&d, &idx, tokens, top_k, e, &what);
            let (offsets, rows, slot_of) = d;

            // Per-expert GEMMs over the dispatched slots (the grouped GEMMs' job), unweighted.
            let mut y = vec![0f32; tokens * top_k * hid];
            for ex in 0..e {
                let (lo, hi) = (offsets[ex] as usize, offsets[ex + 1] as usize);
                if lo == hi {
                    continue;
                }
                let n = hi - lo;
                let x: Vec<f32> = rows[lo..hi].iter().flat_map(|&t| u[t as usize * hid..(t as usize + 1) * hid].iter().copied()).collect();
                let mut gate_up = vec![0f32; n * 2 * inter];
                let one = dg_cpu::linalg::Threads::One;
                dg_cpu::linalg::linear_raw(&mut gate_up, &x, n, lw.experts.gate_up(ex), 2 * inter, hid, one);
                let mut act = vec![0f32; n * inter];
                for (row, a) in gate_up.chunks_exact(2 * inter).zip(act.chunks_exact_mut(inter)) {
                    a.copy_from_slice(&row[..inter]);
                    dg_cpu::ops::gelu_glu(a, &row[inter..]);
                }
                dg_cpu::linalg::linear_raw(&mut y[lo * hid..hi * hid], &act, n, lw.experts.down(ex), hid, inter, one);
            }

            let got = run_combine(&ctx, moe_combine::source_for(hid as u32), &y, &idx, &w, &slot_of, tokens, top_k, hid, 65_535);
            let (err, at) = max_rel_err(&got, &want);
            assert!(err <= MOE_TOLERANCE, "{what}: rel err {err} at {at}: {} vs {}", got[at], want[at]);
        }
    }
}

/// The combine fused into the closing norms (`residual_norms::source_ffn_combine_lanes`, what
/// `Recorder::ffn_residual_norms` takes with a `Combine` where the adapter allows its 12 storage
/// buffers) against `moe_combine` followed by the plain `ffn_residual_norms`: the same `moe`,
/// `hidden` and `normed`, bit for bit, one and four columns at a time, with skipped entries, every
/// entry of a token skipped, and the workgroups folded.
#[test]
fn ffn_norms_with_the_combine_fused_give_the_two_dispatches_bits() {
    use dg_kernels::residual_norms::{self, FFN_COMBINE_BUFFERS, FfnResidualNormsParams};
    let test = "ffn_norms_with_the_combine_fused_give_the_two_dispatches_bits";
    let Some(ctx) = test_context(test) else { return };
    if ctx.limits.max_storage_buffers_per_shader_stage < FFN_COMBINE_BUFFERS {
        panic!(
            "{test}: the adapter allows {} storage buffers a stage, the fused kernel needs {FFN_COMBINE_BUFFERS}",
            ctx.limits.max_storage_buffers_per_shader_stage
        );
    }
    let mut pipelines = Pipelines::default();
    for &(tokens, k, experts, dim) in &[(6usize, 4usize, 8usize, 12usize), (5, 8, 128, 2816), (3, 3, 8, 7)] {
        let idx = random_idx(tokens, k, experts, 300 + dim as u64);
        let (_, _, mut slot_of) = run_dispatch(&ctx, &idx, tokens, k, experts);
        // One skipped entry, and a token with none.
        slot_of[1] = NO_SLOT;
        slot_of[k..2 * k].fill(NO_SLOT);
        let slots = tokens * k;
        let weights = seeded(slots, 301, 1.0);
        let y = seeded(slots * dim, 302, 3.0);
        let (mlp, hidden0) = (seeded(tokens * dim, 303, 2.0), seeded(tokens * dim, 304, 4.0));
        let norm_weights: Vec<Vec<f32>> = (0..4).map(|i| seeded(dim, 305 + i, 1.5)).collect();
        let lanes = dg_kernels::lanes_for(&[dim as u32]);
        let reduce = RowReduce::ALL[0];
        for max_dim in [ctx.limits.max_compute_workgroups_per_dimension, 2] {
            let run = |fused: bool, pipelines: &mut Pipelines| -> [Vec<f32>; 3] {
                let up = |name: &str, v: &[f32]| ctx.upload(name, v).unwrap();
                let (yb, wb) = (up("y", &y), up("weights", &weights));
                let ib = ctx.upload("idx", &idx).unwrap();
                let sb = ctx.upload("slot_of", &slot_of).unwrap();
                let mlp_b = up("mlp", &mlp);
                let w: Vec<wgpu::Buffer> = norm_weights.iter().map(|v| up("w", v)).collect();
                let (moe, hidden, normed) = (
                    guarded_output(&ctx, "moe", tokens * dim),
                    guarded_output(&ctx, "hidden", tokens * dim),
                    guarded_output(&ctx, "normed", tokens * dim),
                );
                ctx.queue.write_buffer(&hidden, 0, bytemuck::cast_slice(&hidden0));
                let p = FfnResidualNormsParams {
                    rows: tokens as u32,
                    dim: dim as u32,
                    eps: 1e-6,
                    scalar: 0.75,
                    splits: 1,
                    split_stride: 0,
                    next_norm: 1,
                    top_k: k as u32,
                };
                let groups = groups_1d(residual_norms::workgroups(tokens as u32), max_dim);
                let norms = [&mlp_b, &w[0], &moe, &w[1], &w[2], &hidden, &w[3], &normed];
                let mut plan = PlanBuilder::new(&ctx);
                if fused {
                    let kernel = pipelines.get_source(&ctx, residual_norms::source_ffn_combine_lanes(reduce, lanes)).unwrap();
                    plan.push(&kernel, &p, &[&norms[..], &[&yb, &ib, &wb, &sb]].concat(), groups);
                } else {
                    let combine = pipelines.get_source(&ctx, moe_combine::source_for(dim as u32)).unwrap();
                    let cp = MoeCombineParams { tokens: tokens as u32, k: k as u32, hidden: dim as u32, _pad: 0 };
                    plan.push(&combine, &cp, &[&yb, &ib, &wb, &sb, &moe], groups_1d(moe_combine::workgroups(&cp), max_dim));
                    let kernel = pipelines.get_source(&ctx, residual_norms::source_ffn_lanes(reduce, lanes)).unwrap();
                    plan.push(&kernel, &FfnResidualNormsParams { top_k: 0, ..p }, &norms, groups);
                }
                plan.finish(&ctx).unwrap().run(&ctx).unwrap();
                [&moe, &hidden, &normed].map(|b| read_guarded(&ctx, b, tokens * dim))
            };
            let (fused, chain) = (run(true, &mut pipelines), run(false, &mut pipelines));
            for (name, (f, c)) in ["moe", "hidden", "normed"].iter().zip(fused.iter().zip(&chain)) {
                let same = f.iter().zip(c).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "T={tokens} K={k} dim={dim} fold={max_dim}: fused {name} differs from the two dispatches'");
            }
            assert!(fused[0][dim..2 * dim].iter().all(|&v| v == 0.0), "a token with every entry skipped combines to 0");
        }
    }
}

//! Kernel-level parity of the GEMM kernels, for every tile variant:
//! - `gemm` against `dg_cpu::linalg::matmul` on strided views: edge shapes (1×1×1, smaller than a
//!   tile, not multiples of a tile, k = 0, m = 0, a single row or column), row-major, transposed
//!   (linear-layer) and arbitrary strides, strided attention heads with GQA, accumulate with
//!   alpha ≠ 1, the softcap epilogue, operands and outputs at offsets inside larger buffers, a long
//!   K and real-geometry slices;
//!   Split-K tiles (K summed in slices inside the workgroup) run every case too, K shorter than
//!   one step per slice included;
//! - `grouped_gemm` against a naive per-slot loop, for every grouped tile: 8 experts with uneven
//!   counts including empty experts, counts that end mid row block and mid m tile, one expert
//!   holding every slot, N and K off the tile multiples, gather on and off, and a 32-expert
//!   routing shaped like the real MoE's (about 16 slots each).
//!
//! Every output buffer is pre-filled with seeded values (so untouched elements, e.g. the gaps
//! between strided rows, are checked to stay untouched) and followed by a guard band.

use dg_gpu::planner::portable;
use dg_gpu::{GpuContext, Pipelines, PlanBuilder};
use dg_kernels::gemm::{self, EPILOGUE_SOFTCAP, GemmParams, GemmTile, TILES};
use dg_kernels::grouped_gemm::{self, GroupedGemmParams, GroupedTile};
use dg_parity::testing::{
    attention_scores_params, attention_values_params, gemm_extent, gemm_reference, guarded_output, max_rel_err, read_guarded, seeded,
    skewed_counts, test_context,
};

/// f32 sums of k products in a different order (tiles vs the CPU GEMM's blocking): the rounding
/// error relative to max |C| grows like ε·√k on random data (ε ≈ 6e-8), so 1e-6·√k leaves a wide
/// margin; the floor covers the epilogue's few extra roundings (alpha, the accumulate add, tanh).
fn tolerance(k: usize) -> f32 {
    1e-6 * (k as f32).sqrt().max(4.0)
}

/// One strided, batched product, described like `GemmParams` (offsets and strides in elements).
#[derive(Clone, Copy, Debug)]
struct Case {
    name: &'static str,
    p: GemmParams,
}

fn case(name: &'static str, p: GemmParams) -> Case {
    Case { name, p }
}

/// Runs `case` with `tile` and compares the whole output buffer with the reference.
fn check(ctx: &GpuContext, pipelines: &mut Pipelines, tile: GemmTile, c: &Case) {
    let p = c.p;
    let a_len = gemm_extent(p.a_offset, p.batch, p.a_batch, p.m, p.a_rs, p.k, p.a_cs) + 3;
    let b_groups = p.batch.div_ceil(p.b_batch_div.max(1));
    let b_len = gemm_extent(p.b_offset, b_groups, p.b_batch, p.k, p.b_rs, p.n, p.b_cs) + 5;
    let c_len = gemm_extent(p.c_offset, p.batch, p.c_batch, p.m, p.c_rs, p.n, 1) + 2;
    let seed = u64::from(p.m) * 1_000_003 + u64::from(p.n) * 1009 + u64::from(p.k);
    let a = seeded(a_len, seed ^ 0xA, 1.0);
    let b = seeded(b_len, seed ^ 0xB, 1.0);
    let c0 = seeded(c_len, seed ^ 0xC, 2.0);

    let pipeline = pipelines.get_source(ctx, gemm::source(tile)).unwrap();
    let ab = ctx.upload("a", &a).unwrap();
    let bb = ctx.upload("b", &b).unwrap();
    let cb = guarded_output(ctx, "c", c_len);
    ctx.queue.write_buffer(&cb, 0, bytemuck::cast_slice(&c0));
    let mut plan = PlanBuilder::new(ctx);
    plan.push(&pipeline, &p, &[&ab, &bb, &cb], gemm::workgroups(tile, p.m, p.n, p.batch));
    plan.finish(ctx).unwrap().run(ctx).unwrap();
    let got = read_guarded(ctx, &cb, c_len);

    let want = gemm_reference(&p, &a, &b, &c0);
    let (err, at) = max_rel_err(&got, &want);
    let tol = tolerance(p.k as usize);
    assert!(
        err <= tol,
        "gemm {} [{}] {}x{}x{} batch {}: rel err {err} > {tol} at {at}: got {} want {} (was {})",
        c.name,
        tile.label(),
        p.m,
        p.n,
        p.k,
        p.batch,
        got[at],
        want[at],
        c0[at]
    );
}

/// Row-major A and B, contiguous C.
fn plain(m: u32, n: u32, k: u32) -> GemmParams {
    GemmParams::new(m, n, k)
}

/// The named cases every tile runs (lavapipe is slow: the big ones are few).
fn gemm_cases() -> Vec<Case> {
    vec![
        case("1x1x1", plain(1, 1, 1)),
        case("smaller than a tile", plain(3, 5, 7)),
        case("not multiples of a tile", plain(67, 131, 37)),
        case("exact multiples", plain(128, 128, 32)),
        case("single row", plain(1, 300, 70)),
        case("single column", plain(70, 1, 33)),
        case("k = 0", plain(9, 10, 0)),
        case("k = 0, accumulate, softcap", GemmParams { accumulate: 1, epilogue: EPILOGUE_SOFTCAP, cap: 1.5, ..plain(9, 10, 0) }),
        case("m = 0", plain(0, 10, 4)),
        case("linear layout (B = Wᵀ)", GemmParams::linear(45, 77, 100)),
        case("transposed A", GemmParams { a_rs: 1, a_cs: 50, ..plain(50, 33, 29) }),
        case("arbitrary strides", GemmParams { a_rs: 2 * 21 + 1, a_cs: 2, b_rs: 3, b_cs: 3 * 19 + 2, c_rs: 40, ..plain(19, 37, 21) }),
        case(
            "offsets in larger buffers, row gaps",
            GemmParams { a_offset: 5, b_offset: 7, c_offset: 11, c_rs: 50, ..GemmParams::linear(33, 47, 18) },
        ),
        case("accumulate, alpha -0.75", GemmParams { accumulate: 1, alpha: -0.75, ..plain(40, 70, 65) }),
        case("softcap", GemmParams { epilogue: EPILOGUE_SOFTCAP, cap: 3.0, alpha: 0.5, ..GemmParams::linear(20, 150, 90) }),
        case("softcap with accumulate", GemmParams { epilogue: EPILOGUE_SOFTCAP, cap: 2.0, accumulate: 1, ..plain(17, 65, 33) }),
        case("batched contiguous", GemmParams { batch: 3, ..plain(20, 30, 40) }),
        case("GQA scores q·kᵀ (4 heads, 2 kv)", attention_scores_params(33, 70, 72, 4, 2, 0.125)),
        case("GQA probabilities·V (4 heads, 2 kv)", attention_values_params(33, 70, 72, 4, 2)),
        case("scores, head_dim 256", attention_scores_params(20, 40, 256, 4, 2, 1.0)),
        case("long K (soft embedding)", plain(2, 3, 262_144)),
        case("linear 256x512x512", GemmParams::linear(256, 512, 512)),
        case("k_proj slice 64x256x2816", GemmParams::linear(64, 256, 2816)),
        case("K shorter than the slices", GemmParams::linear(37, 41, 20)),
        case("K of a few steps per slice, accumulate", GemmParams { accumulate: 1, alpha: 0.5, ..plain(33, 20, 70) }),
    ]
}

/// Extra cases for the choice: shapes that pick the split tiles at the real geometry's ratios.
fn choose_cases() -> Vec<Case> {
    vec![
        case("router-like 64x128x2816 (16x16 split)", GemmParams::linear(64, 128, 2816)),
        case("k/v-like 256x1024x1024 (32x32 split)", GemmParams::linear(256, 1024, 1024)),
        case(
            "softcap head over few tiles, long K",
            GemmParams { epilogue: EPILOGUE_SOFTCAP, cap: 30.0, ..GemmParams::linear(40, 60, 1500) },
        ),
    ]
}

#[test]
fn gemm_matches_cpu_for_every_tile() {
    let Some(ctx) = test_context("gemm_matches_cpu_for_every_tile") else { return };
    let mut pipelines = Pipelines::default();
    for &tile in TILES {
        for c in gemm_cases() {
            check(&ctx, &mut pipelines, tile, &c);
        }
    }
}

#[test]
fn gemm_choose_covers_the_cases() {
    let Some(ctx) = test_context("gemm_choose_covers_the_cases") else { return };
    let mut pipelines = Pipelines::default();
    let mut chosen = Vec::new();
    for c in gemm_cases().into_iter().filter(|c| c.p.k < 10_000).chain(choose_cases()) {
        let tile = portable::choose_batched(c.p.m, c.p.n, c.p.k, c.p.batch);
        chosen.push(tile);
        check(&ctx, &mut pipelines, tile, &c);
    }
    assert!(chosen.contains(&gemm::TILE_16_SPLIT) && chosen.contains(&gemm::TILE_32_SPLIT), "{chosen:?}");
}

/// One grouped case: per-expert slot counts, with or without gather.
struct Grouped {
    n: u32,
    k: u32,
    counts: Vec<u32>,
    gather: bool,
}

fn check_grouped(ctx: &GpuContext, pipelines: &mut Pipelines, tile: GroupedTile, g: &Grouped) {
    let groups = g.counts.len();
    let (n, k) = (g.n as usize, g.k as usize);
    let mut offsets = vec![0u32];
    for &c in &g.counts {
        offsets.push(offsets.last().unwrap() + c);
    }
    let slots = *offsets.last().unwrap() as usize;
    let max_rows = *g.counts.iter().max().unwrap();
    // Gather: slots read tokens of a smaller activation matrix, in scrambled order, with repeats
    // (each token goes to several experts); a row stride larger than k.
    let tokens = if g.gather { slots.div_ceil(3).max(1) } else { slots.max(1) };
    let a_rs = k + 3;
    let rows: Vec<u32> = (0..slots.max(1)).map(|s| ((s * 7 + 3) % tokens) as u32).collect();
    let a = seeded(tokens * a_rs, 11 + slots as u64, 1.0);
    let w = seeded(groups * n * k, 12 + n as u64, 1.0);
    let c_rs = n + 2;
    let c_len = slots * c_rs;
    let c0 = seeded(c_len, 13, 2.0);

    let pipeline = pipelines.get_source(ctx, grouped_gemm::source(tile)).unwrap();
    let ab = ctx.upload("a", &a).unwrap();
    let wb = ctx.upload("w", &w).unwrap();
    let ob = ctx.upload("offsets", &offsets).unwrap();
    let rb = ctx.upload("rows", &rows).unwrap();
    let cb = guarded_output(ctx, "c", c_len);
    ctx.queue.write_buffer(&cb, 0, bytemuck::cast_slice(&c0));
    let params = GroupedGemmParams {
        n: g.n,
        k: g.k,
        groups: groups as u32,
        max_rows,
        a_rs: a_rs as u32,
        b_group_stride: (n * k) as u32,
        c_rs: c_rs as u32,
        gather: g.gather as u32,
        ..bytemuck::Zeroable::zeroed()
    };
    let mut plan = PlanBuilder::new(ctx);
    plan.push(&pipeline, &params, &[&ab, &wb, &ob, &rb, &cb], grouped_gemm::workgroups(tile, g.n, max_rows, groups as u32));
    plan.finish(ctx).unwrap().run(ctx).unwrap();
    let got = read_guarded(ctx, &cb, c_len);

    let mut want = c0.clone();
    for e in 0..groups {
        for s in offsets[e] as usize..offsets[e + 1] as usize {
            let row = if g.gather { rows[s] as usize } else { s };
            for j in 0..n {
                let sum: f64 = (0..k).map(|p| f64::from(a[row * a_rs + p]) * f64::from(w[(e * n + j) * k + p])).sum();
                want[s * c_rs + j] = sum as f32;
            }
        }
    }
    let (err, at) = max_rel_err(&got, &want);
    let tol = tolerance(k);
    assert!(
        err <= tol,
        "grouped [{}] n {n} k {k} counts {:?} gather {}: rel err {err} > {tol} at {at} (slot {}, col {}): got {} want {}",
        tile.label(),
        g.counts,
        g.gather,
        at / c_rs,
        at % c_rs,
        got[at],
        want[at]
    );
}

#[test]
fn grouped_gemm_matches_naive_for_every_tile() {
    let Some(ctx) = test_context("grouped_gemm_matches_naive_for_every_tile") else { return };
    let mut pipelines = Pipelines::default();
    let uneven = vec![5, 0, 37, 1, 0, 70, 16, 3];
    let all_in_one = vec![0, 0, 0, 0, 0, 130, 0, 0];
    // Counts that end on and just past 8-row blocks and 16/32/64-row tiles.
    let boundaries = vec![8, 9, 17, 24, 33, 63, 65, 0];
    for &tile in grouped_gemm::TILES {
        for gather in [false, true] {
            check_grouped(&ctx, &mut pipelines, tile, &Grouped { n: 72, k: 40, counts: uneven.clone(), gather });
            check_grouped(&ctx, &mut pipelines, tile, &Grouped { n: 33, k: 1, counts: uneven.clone(), gather });
            check_grouped(&ctx, &mut pipelines, tile, &Grouped { n: 200, k: 130, counts: all_in_one.clone(), gather });
            check_grouped(&ctx, &mut pipelines, tile, &Grouped { n: 300, k: 21, counts: boundaries.clone(), gather });
        }
        // Expert-sized slice: width 704 in, 160 out.
        check_grouped(&ctx, &mut pipelines, tile, &Grouped { n: 160, k: 704, counts: vec![16, 9, 0, 33, 17, 1, 0, 24], gather: true });
        // No slots at all, and K = 0.
        check_grouped(&ctx, &mut pipelines, tile, &Grouped { n: 40, k: 16, counts: vec![0, 0, 0], gather: true });
        check_grouped(&ctx, &mut pipelines, tile, &Grouped { n: 40, k: 0, counts: vec![3, 0, 20], gather: true });
    }
}

#[test]
fn grouped_gemm_choose_covers_a_moe_routing() {
    let Some(ctx) = test_context("grouped_gemm_choose_covers_a_moe_routing") else { return };
    let mut pipelines = Pipelines::default();
    // 64 tokens × top-8 over 32 experts (16 slots each on average, like 256 × 8 over 128), the
    // expert widths scaled down: gate‖up then down.
    let counts = skewed_counts(32, 64, 8);
    let slots: u32 = counts.iter().sum();
    for (n, k) in [(352, 256), (256, 176)] {
        let tile = portable::choose_grouped(n, k, slots, counts.len() as u32);
        assert_eq!(tile, grouped_gemm::TILE_32X256);
        check_grouped(&ctx, &mut pipelines, tile, &Grouped { n, k, counts: counts.clone(), gather: true });
    }
}

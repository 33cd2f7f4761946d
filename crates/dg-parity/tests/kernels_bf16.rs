//! Kernel-level parity of the 16-bit-weight variants (`WeightFormat::Bf16` and
//! `WeightFormat::F16`, every case run once per format): for every GEMM tile, every grouped expert
//! tile and the embedding lookup, the packed kernel on a packed weight must give, bit for bit,
//! what the f32 kernel gives on the same weight rounded to the format and upcast
//! (`unpack_bf16(pack_bf16(w))`, `unpack_f16(pack_f16(w))`): the same tile and the same f32
//! arithmetic in the same order, only the loads differ. The f32 runs are also checked against the
//! CPU, so that a kernel writing nothing (both outputs left as pre-filled) cannot pass.
//!
//! Every fifth weight is scaled below 2⁻¹⁴, so the f16 weights hold subnormals (and zeros rounded
//! from below 2⁻²⁵): `unpack2x16float` must widen them exactly, as a device that keeps f16
//! subnormals does.
//!
//! The shapes aim at the packing: B offsets that start at an odd element, odd N and K (so rows
//! and columns of a weight start at alternating halves of a word), odd batch strides with GQA
//! sharing (`b_batch_div`), row-major and transposed (linear-layer) B, arbitrary strides, k = 0,
//! m = 0, accumulate and the softcap epilogue, split-K tiles; experts whose weights start at odd
//! elements (odd `n·k`, padded group strides) with gather on and off; embedding chunks with an
//! odd hidden size and odd row counts (each chunk packed from its own first element, padded).
//! The `Recorder`'s products (`product`, `grouped_product`) and `embed_format` on stored
//! weights are checked against their f32 twins the same way. Every output is pre-filled
//! with seeded values and followed by a guard band.

use dg_gpu::ops::{Operand, Recorder, linear_params};
use dg_gpu::{GpuContext, Pipelines, PlanBuilder, groups_1d};
use dg_kernels::coop_gemm::AFormat;
use dg_kernels::embed::{self, EmbedParams};
use dg_kernels::gemm::{self, EPILOGUE_SOFTCAP, GemmParams, GemmTile, TILES};
use dg_kernels::grouped_gemm::{self, GroupedGemmParams, GroupedTile};
use dg_kernels::{KernelSource, WeightFormat, pack_bf16, pack_f16, unpack_bf16, unpack_f16};
use dg_parity::testing::{
    GUARD_LEN, attention_scores_params, attention_values_params, gemm_extent, gemm_reference, guarded_output, max_rel_err, read_guarded,
    seeded, test_context,
};

/// f32 GPU GEMM against the CPU (as in kernels_gemm.rs): f32 sums of k products in a different
/// order, error relative to max |C| growing like ε·√k on random data (ε ≈ 6e-8); the floor covers
/// the epilogue's few extra roundings.
fn tolerance(k: usize) -> f32 {
    1e-6 * (k as f32).sqrt().max(4.0)
}

/// `values` packed as `format` (bf16 or f16).
fn pack(format: WeightFormat, values: &[f32]) -> Vec<u32> {
    match format {
        WeightFormat::Bf16 => pack_bf16(values),
        WeightFormat::F16 => pack_f16(values),
        WeightFormat::F32 | WeightFormat::Quantized(_) => panic!("{format:?} is not a 16-bit format"),
    }
}

/// The weight `w` packed as `format`, and its 16-bit values upcast to f32 (what the f32 kernel
/// gets).
fn packed_pair(format: WeightFormat, w: &[f32]) -> (Vec<u32>, Vec<f32>) {
    let packed = pack(format, w);
    let upcast = match format {
        WeightFormat::Bf16 => unpack_bf16(&packed, w.len()),
        WeightFormat::F16 => unpack_f16(&packed, w.len()),
        WeightFormat::F32 | WeightFormat::Quantized(_) => unreachable!(),
    };
    (packed, upcast)
}

/// Seeded weights in [-scale, scale) with every fifth one scaled by 2⁻¹⁴: below the smallest
/// normal f16, so an f16 copy holds subnormals (and zeros rounded from below 2⁻²⁵).
fn weights(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut w = seeded(n, seed, scale);
    w.iter_mut().step_by(5).for_each(|v| *v *= 2f32.powi(-14));
    w
}

/// The packed kernel's whole output (guard band included) against the f32 kernel's on the upcast
/// weights: bit for bit, no tolerance. The two renderings differ only in how a weight element is
/// loaded (`bits << 16` and `unpack2x16float` are exact, so both hold the same f32 values); the
/// staging, the products, the accumulation order, the slice reduction and the epilogue are the
/// same code on the same values, and a driver compiles the same arithmetic to the same operations
/// (FMA contraction included) in both.
fn assert_bits_equal(packed: &[f32], f32_: &[f32], what: &str) {
    assert_eq!(packed.len(), f32_.len(), "{what}");
    for (i, (x, y)) in packed.iter().zip(f32_).enumerate() {
        assert!(
            x.to_bits() == y.to_bits(),
            "{what}: element {i}: packed kernel {x} ({:#010x}) vs f32 kernel {y} ({:#010x})",
            x.to_bits(),
            y.to_bits()
        );
    }
}

/// Reads `len` values plus the guard band (checked intact), for a whole-buffer comparison.
fn read_all(ctx: &GpuContext, buffer: &wgpu::Buffer, len: usize) -> Vec<f32> {
    read_guarded(ctx, buffer, len);
    ctx.read_f32(buffer, 0, len + GUARD_LEN).unwrap()
}

/// The operands of one GEMM case: A, B as f32 (already 16-bit values) and packed, C's initial
/// contents, and C's length.
struct GemmData {
    a: Vec<f32>,
    b_up: Vec<f32>,
    b_packed: Vec<u32>,
    c0: Vec<f32>,
    c_len: usize,
}

fn gemm_data(p: &GemmParams, format: WeightFormat) -> GemmData {
    let a_len = gemm_extent(p.a_offset, p.batch, p.a_batch, p.m, p.a_rs, p.k, p.a_cs) + 3;
    let b_groups = p.batch.div_ceil(p.b_batch_div.max(1));
    // An odd number of trailing elements: the packed B ends on a padded half whenever the used
    // extent is even, and on a full word otherwise.
    let b_len = gemm_extent(p.b_offset, b_groups, p.b_batch, p.k, p.b_rs, p.n, p.b_cs) + 5;
    let c_len = gemm_extent(p.c_offset, p.batch, p.c_batch, p.m, p.c_rs, p.n, 1) + 2;
    let seed = u64::from(p.m) * 1_000_003 + u64::from(p.n) * 1009 + u64::from(p.k) + u64::from(p.b_offset) * 7;
    let a = seeded(a_len, seed ^ 0xA, 1.0);
    let (b_packed, b_up) = packed_pair(format, &weights(b_len, seed ^ 0xB, 1.0));
    let c0 = seeded(c_len, seed ^ 0xC, 2.0);
    GemmData { a, b_up, b_packed, c0, c_len }
}

/// Runs one GEMM variant over `b` (f32 values or packed words) and returns the whole C buffer.
fn run_gemm<B: bytemuck::Pod>(
    ctx: &GpuContext,
    pipelines: &mut Pipelines,
    src: KernelSource,
    tile: GemmTile,
    p: &GemmParams,
    d: &GemmData,
    b: &[B],
) -> Vec<f32> {
    let pipeline = pipelines.get_source(ctx, src).unwrap();
    let ab = ctx.upload("a", &d.a).unwrap();
    let bb = ctx.upload("b", b).unwrap();
    let cb = guarded_output(ctx, "c", d.c_len);
    ctx.queue.write_buffer(&cb, 0, bytemuck::cast_slice(&d.c0));
    let mut plan = PlanBuilder::new(ctx);
    plan.push(&pipeline, p, &[&ab, &bb, &cb], gemm::workgroups(tile, p.m, p.n, p.batch));
    plan.finish(ctx).unwrap().run(ctx).unwrap();
    read_all(ctx, &cb, d.c_len)
}

/// The f32 kernel on the upcast B against the CPU, then the `format` kernel on the packed B
/// against the f32 kernel, bit for bit.
fn check_gemm(ctx: &GpuContext, pipelines: &mut Pipelines, format: WeightFormat, tile: GemmTile, name: &str, p: &GemmParams) {
    let d = gemm_data(p, format);
    let what = format!("{format:?} gemm {name} [{}] {}x{}x{} batch {} b_offset {}", tile.label(), p.m, p.n, p.k, p.batch, p.b_offset);
    let f32_out = run_gemm(ctx, pipelines, gemm::source_for(tile, WeightFormat::F32), tile, p, &d, &d.b_up);
    let want = gemm_reference(p, &d.a, &d.b_up, &d.c0);
    let (err, at) = max_rel_err(&f32_out[..d.c_len], &want);
    let tol = tolerance(p.k as usize);
    assert!(err <= tol, "{what}: f32 kernel vs CPU: rel err {err} > {tol} at {at}: got {} want {}", f32_out[at], want[at]);
    let packed_out = run_gemm(ctx, pipelines, gemm::source_for(tile, format), tile, p, &d, &d.b_packed);
    assert_bits_equal(&packed_out, &f32_out, &what);
}

/// Row-major A and B, contiguous C.
fn plain(m: u32, n: u32, k: u32) -> GemmParams {
    GemmParams::new(m, n, k)
}

/// The cases every tile runs, aimed at the packing (odd offsets, odd strides, odd N and K).
fn gemm_cases() -> Vec<(&'static str, GemmParams)> {
    vec![
        ("1x1x1", plain(1, 1, 1)),
        ("1x1x1 at an odd B offset", GemmParams { b_offset: 1, ..plain(1, 1, 1) }),
        ("smaller than a tile, odd", plain(3, 5, 7)),
        ("not multiples of a tile, odd N and K", plain(67, 131, 37)),
        ("exact multiples", plain(128, 128, 32)),
        ("single row, odd B offset", GemmParams { b_offset: 3, ..plain(1, 301, 71) }),
        ("single column", plain(70, 1, 33)),
        ("k = 0, accumulate, softcap", GemmParams { accumulate: 1, epilogue: EPILOGUE_SOFTCAP, cap: 1.5, ..plain(9, 10, 0) }),
        ("m = 0", plain(0, 10, 4)),
        ("linear layout, odd K (rows of W at alternating halves)", GemmParams::linear(45, 77, 101)),
        (
            "linear layout, odd offsets everywhere, row gaps",
            GemmParams { a_offset: 5, b_offset: 7, c_offset: 11, c_rs: 50, ..GemmParams::linear(33, 47, 19) },
        ),
        ("row-major B, odd offset and odd N", GemmParams { b_offset: 9, ..plain(20, 33, 17) }),
        (
            "arbitrary odd strides",
            GemmParams { a_rs: 2 * 21 + 1, a_cs: 2, b_offset: 1, b_rs: 3, b_cs: 3 * 19 + 2, c_rs: 40, ..plain(19, 37, 21) },
        ),
        ("accumulate, alpha -0.75, odd B offset", GemmParams { accumulate: 1, alpha: -0.75, b_offset: 13, ..plain(40, 70, 65) }),
        ("softcap, linear", GemmParams { epilogue: EPILOGUE_SOFTCAP, cap: 3.0, alpha: 0.5, ..GemmParams::linear(20, 151, 91) }),
        ("batched, odd batch stride", GemmParams { batch: 3, ..plain(20, 31, 41) }),
        ("batched, shared B (b_batch_div 3), odd offset", GemmParams { batch: 6, b_batch_div: 3, b_offset: 5, ..plain(9, 17, 23) }),
        ("GQA scores, odd head dim", attention_scores_params(17, 29, 33, 4, 2, 0.3)),
        ("GQA probabilities·V, odd head dim, odd B offset", GemmParams { b_offset: 1, ..attention_values_params(17, 29, 33, 4, 2) }),
        ("K shorter than the slices", GemmParams::linear(37, 41, 21)),
        ("long odd K over few tiles", GemmParams { b_offset: 3, ..GemmParams::linear(24, 40, 2049) }),
    ]
}

/// Every GEMM case on every tile with B stored as `format`.
fn gemm_equals_f32_on_upcast_weights_for_every_tile(test: &str, format: WeightFormat) {
    let Some(ctx) = test_context(test) else { return };
    let mut pipelines = Pipelines::default();
    for &tile in TILES {
        for (name, p) in gemm_cases() {
            check_gemm(&ctx, &mut pipelines, format, tile, name, &p);
        }
    }
}

#[test]
fn bf16_gemm_equals_f32_on_upcast_weights_for_every_tile() {
    gemm_equals_f32_on_upcast_weights_for_every_tile("bf16_gemm_equals_f32_on_upcast_weights_for_every_tile", WeightFormat::Bf16);
}

#[test]
fn f16_gemm_equals_f32_on_upcast_weights_for_every_tile() {
    gemm_equals_f32_on_upcast_weights_for_every_tile("f16_gemm_equals_f32_on_upcast_weights_for_every_tile", WeightFormat::F16);
}

/// One grouped case: per-expert slot counts, gather, and extra elements between experts.
struct Grouped {
    n: u32,
    k: u32,
    counts: Vec<u32>,
    gather: bool,
    /// `b_group_stride − n·k`: padding between experts (odd: experts alternate halves).
    gap: u32,
}

/// Runs one grouped variant over `w` and returns the whole C buffer.
#[allow(clippy::too_many_arguments)]
fn run_grouped<W: bytemuck::Pod>(
    ctx: &GpuContext,
    pipelines: &mut Pipelines,
    src: KernelSource,
    tile: GroupedTile,
    params: &GroupedGemmParams,
    a: &[f32],
    w: &[W],
    offsets: &[u32],
    rows: &[u32],
    c0: &[f32],
) -> Vec<f32> {
    let pipeline = pipelines.get_source(ctx, src).unwrap();
    let ab = ctx.upload("a", a).unwrap();
    let wb = ctx.upload("w", w).unwrap();
    let ob = ctx.upload("offsets", offsets).unwrap();
    let rb = ctx.upload("rows", rows).unwrap();
    let cb = guarded_output(ctx, "c", c0.len());
    ctx.queue.write_buffer(&cb, 0, bytemuck::cast_slice(c0));
    let mut plan = PlanBuilder::new(ctx);
    plan.push(&pipeline, params, &[&ab, &wb, &ob, &rb, &cb], grouped_gemm::workgroups(tile, params.n, params.max_rows, params.groups));
    plan.finish(ctx).unwrap().run(ctx).unwrap();
    read_all(ctx, &cb, c0.len())
}

/// The f32 grouped kernel on the upcast W against a naive per-slot loop, then the `format` kernel
/// on the packed W against the f32 kernel, bit for bit.
fn check_grouped(ctx: &GpuContext, pipelines: &mut Pipelines, format: WeightFormat, tile: GroupedTile, g: &Grouped) {
    let groups = g.counts.len();
    let (n, k) = (g.n as usize, g.k as usize);
    let stride = n * k + g.gap as usize;
    let mut offsets = vec![0u32];
    for &c in &g.counts {
        offsets.push(offsets.last().unwrap() + c);
    }
    let slots = *offsets.last().unwrap() as usize;
    let max_rows = *g.counts.iter().max().unwrap();
    // Gather: slots read a smaller activation matrix in scrambled order, with repeats.
    let tokens = if g.gather { slots.div_ceil(3).max(1) } else { slots.max(1) };
    let a_rs = k + 3;
    let rows: Vec<u32> = (0..slots.max(1)).map(|s| ((s * 7 + 3) % tokens) as u32).collect();
    let a = seeded(tokens * a_rs, 21 + slots as u64, 1.0);
    let (w_packed, w_up) = packed_pair(format, &weights(groups * stride + 1, 22 + n as u64, 1.0));
    let c_rs = n + 2;
    let c0 = seeded(slots * c_rs, 23, 2.0);
    let params = GroupedGemmParams {
        n: g.n,
        k: g.k,
        groups: groups as u32,
        max_rows,
        a_rs: a_rs as u32,
        b_group_stride: stride as u32,
        c_rs: c_rs as u32,
        gather: g.gather as u32,
        ..bytemuck::Zeroable::zeroed()
    };
    let what = format!("{format:?} grouped [{}] n {n} k {k} gap {} counts {:?} gather {}", tile.label(), g.gap, g.counts, g.gather);

    let f32_out =
        run_grouped(ctx, pipelines, grouped_gemm::source_for(tile, WeightFormat::F32), tile, &params, &a, &w_up, &offsets, &rows, &c0);
    let mut want = c0.clone();
    for e in 0..groups {
        for s in offsets[e] as usize..offsets[e + 1] as usize {
            let row = if g.gather { rows[s] as usize } else { s };
            for j in 0..n {
                let sum: f64 = (0..k).map(|p| f64::from(a[row * a_rs + p]) * f64::from(w_up[e * stride + j * k + p])).sum();
                want[s * c_rs + j] = sum as f32;
            }
        }
    }
    let (err, at) = max_rel_err(&f32_out[..c0.len()], &want);
    let tol = tolerance(k);
    assert!(err <= tol, "{what}: f32 kernel vs naive: rel err {err} > {tol} at {at}: got {} want {}", f32_out[at], want[at]);

    let packed_out =
        run_grouped(ctx, pipelines, grouped_gemm::source_for(tile, format), tile, &params, &a, &w_packed, &offsets, &rows, &c0);
    assert_bits_equal(&packed_out, &f32_out, &what);
}

/// Every grouped case on every tile with the expert weights stored as `format`.
fn grouped_gemm_equals_f32_on_upcast_weights_for_every_tile(test: &str, format: WeightFormat) {
    let Some(ctx) = test_context(test) else { return };
    let mut pipelines = Pipelines::default();
    let uneven = vec![5, 0, 37, 1, 0, 70, 16, 3];
    // Counts that end on and just past 8-row blocks and 16/32/64-row tiles.
    let boundaries = vec![8, 9, 17, 24, 33, 63, 65, 0];
    for &tile in grouped_gemm::TILES {
        for gather in [false, true] {
            // n·k odd: every other expert starts at an odd element.
            check_grouped(&ctx, &mut pipelines, format, tile, &Grouped { n: 33, k: 21, counts: uneven.clone(), gather, gap: 0 });
            // Even n·k, odd gap between experts; odd K: rows of W alternate halves.
            check_grouped(&ctx, &mut pipelines, format, tile, &Grouped { n: 72, k: 41, counts: uneven.clone(), gather, gap: 3 });
            check_grouped(&ctx, &mut pipelines, format, tile, &Grouped { n: 301, k: 19, counts: boundaries.clone(), gather, gap: 1 });
        }
        check_grouped(&ctx, &mut pipelines, format, tile, &Grouped { n: 33, k: 1, counts: vec![3, 0, 20, 1], gather: true, gap: 0 });
        check_grouped(
            &ctx,
            &mut pipelines,
            format,
            tile,
            &Grouped { n: 161, k: 705, counts: vec![16, 9, 0, 33, 17, 1, 0, 24], gather: true, gap: 0 },
        );
        // K = 0 (outputs zero) and no slots at all.
        check_grouped(&ctx, &mut pipelines, format, tile, &Grouped { n: 40, k: 0, counts: vec![3, 0, 20], gather: true, gap: 1 });
        check_grouped(&ctx, &mut pipelines, format, tile, &Grouped { n: 40, k: 16, counts: vec![0, 0, 0], gather: true, gap: 0 });
    }
}

#[test]
fn bf16_grouped_gemm_equals_f32_on_upcast_weights_for_every_tile() {
    grouped_gemm_equals_f32_on_upcast_weights_for_every_tile(
        "bf16_grouped_gemm_equals_f32_on_upcast_weights_for_every_tile",
        WeightFormat::Bf16,
    );
}

#[test]
fn f16_grouped_gemm_equals_f32_on_upcast_weights_for_every_tile() {
    grouped_gemm_equals_f32_on_upcast_weights_for_every_tile(
        "f16_grouped_gemm_equals_f32_on_upcast_weights_for_every_tile",
        WeightFormat::F16,
    );
}

/// Runs the lookup over every `(row_start, chunk)` in turn (each chunk a table buffer of its own)
/// into one output pre-filled with `base`; returns the whole output buffer.
#[allow(clippy::too_many_arguments)]
fn run_embed<T: bytemuck::Pod>(
    ctx: &GpuContext,
    pipelines: &mut Pipelines,
    format: WeightFormat,
    ids: &[u32],
    chunks: &[(usize, usize, Vec<T>)],
    hidden: usize,
    scale: f32,
    base: &[f32],
    max_dim: u32,
) -> Vec<f32> {
    let pipeline = pipelines.get_source(ctx, embed::source_for(format)).unwrap();
    let idb = ctx.upload("ids", ids).unwrap();
    let out = guarded_output(ctx, "out", base.len());
    ctx.queue.write_buffer(&out, 0, bytemuck::cast_slice(base));
    let tables: Vec<wgpu::Buffer> = chunks.iter().map(|(_, _, t)| ctx.upload("table", t).unwrap()).collect();
    let mut plan = PlanBuilder::new(ctx);
    for ((row_start, row_count, _), tb) in chunks.iter().zip(&tables) {
        let params = EmbedParams {
            tokens: ids.len() as u32,
            hidden: hidden as u32,
            row_start: *row_start as u32,
            row_count: *row_count as u32,
            scale,
            _pad: [0; 3],
        };
        plan.push(&pipeline, &params, &[&idb, tb, &out], groups_1d(embed::workgroups(&params), max_dim));
    }
    plan.finish(ctx).unwrap().run(ctx).unwrap();
    read_all(ctx, &out, base.len())
}

/// The lookup from chunks stored as `format` against the f32 lookup from the upcast chunks.
fn embed_equals_f32_on_upcast_table_in_chunks(test: &str, format: WeightFormat) {
    let Some(ctx) = test_context(test) else { return };
    let mut pipelines = Pipelines::default();
    let scale = 17.3f32;
    // Odd hidden sizes put every other row at an odd element; odd row counts give chunks of an odd
    // number of elements (a padded last word). Chunk boundaries at rows 0, 1, 612/613, 999.
    for (vocab, hidden, splits) in
        [(1000usize, 301usize, vec![0usize, 613, 1000]), (1000, 300, vec![0, 1, 612, 999, 1000]), (7, 1, vec![0, 3, 7])]
    {
        let table = weights(vocab * hidden, 31 + hidden as u64, 1.7);
        let (_, table_up) = packed_pair(format, &table);
        let ids: Vec<u32> = [0u32, 612, 613, 999, 5, 998, 613, 0, 700, 1, 612, 2, 6, 3]
            .into_iter()
            .filter(|&id| (id as usize) < vocab)
            .chain((0..50).map(|i| (i * 37 + 11) % vocab as u32))
            .collect();
        let base = seeded(ids.len() * hidden, 32, 1.0);
        let ranges: Vec<(usize, usize)> = splits.windows(2).map(|w| (w[0], w[1] - w[0])).collect();
        // Each chunk packed from its own first element (row_start · hidden, odd for odd hidden
        // and odd row_start).
        let packed: Vec<(usize, usize, Vec<u32>)> =
            ranges.iter().map(|&(s, c)| (s, c, pack(format, &table[s * hidden..(s + c) * hidden]))).collect();
        let upcast: Vec<(usize, usize, Vec<f32>)> =
            ranges.iter().map(|&(s, c)| (s, c, table_up[s * hidden..(s + c) * hidden].to_vec())).collect();
        for max_dim in [ctx.limits.max_compute_workgroups_per_dimension, 3] {
            let what = format!("{format:?} embed vocab {vocab} hidden {hidden} chunks {splits:?} fold {max_dim}");
            let f32_out = run_embed(&ctx, &mut pipelines, WeightFormat::F32, &ids, &upcast, hidden, scale, &base, max_dim);
            for (t, &id) in ids.iter().enumerate() {
                let id = id as usize;
                let want: Vec<f32> = table_up[id * hidden..(id + 1) * hidden].iter().map(|v| v * scale).collect();
                assert_eq!(&f32_out[t * hidden..(t + 1) * hidden], &want[..], "{what}: f32 kernel, token {t} id {id}");
            }
            let packed_out = run_embed(&ctx, &mut pipelines, format, &ids, &packed, hidden, scale, &base, max_dim);
            assert_bits_equal(&packed_out, &f32_out, &what);
            // A chunk without a token's id leaves its row as it was.
            let only_first = run_embed(&ctx, &mut pipelines, format, &ids, &packed[..1], hidden, scale, &base, max_dim);
            for (t, &id) in ids.iter().enumerate() {
                let row = t * hidden..(t + 1) * hidden;
                let expected = if (id as usize) < ranges[0].1 { &f32_out[row.clone()] } else { &base[row.clone()] };
                assert_eq!(&only_first[row], expected, "{what}: first chunk only, token {t} id {id}");
            }
        }
    }
}

#[test]
fn bf16_embed_equals_f32_on_upcast_table_in_chunks() {
    embed_equals_f32_on_upcast_table_in_chunks("bf16_embed_equals_f32_on_upcast_table_in_chunks", WeightFormat::Bf16);
}

#[test]
fn f16_embed_equals_f32_on_upcast_table_in_chunks() {
    embed_equals_f32_on_upcast_table_in_chunks("f16_embed_equals_f32_on_upcast_table_in_chunks", WeightFormat::F16);
}

/// The `Recorder` methods pick the `format` variants: `*_format` with `format` weights equal the
/// f32 methods on the upcast weights, bit for bit.
fn recorder_format_methods_match_their_f32_twins(test: &str, format: WeightFormat) {
    let Some(ctx) = test_context(test) else { return };
    let mut pipelines = Pipelines::default();
    // Odd sizes: no tile of the tensor-core GEMM fits them, so `Recorder::product` with f16 weights
    // takes the f32-arithmetic GEMM on a device with cooperative matrices too.
    let (m, n, k) = (37usize, 75usize, 131usize);
    let x = ctx.upload("x", &seeded(m * k, 1, 1.0)).unwrap();
    let (w_packed, w_up) = packed_pair(format, &weights(n * k, 2, 1.0));
    let w_packed = ctx.upload("w_packed", &w_packed).unwrap();
    let w_f32 = ctx.upload("w_f32", &w_up).unwrap();
    // gemm at an odd B offset (row-major B [k, n] after one element).
    let (b_packed, b_up) = packed_pair(format, &weights(1 + k * n, 3, 1.0));
    let b_packed = ctx.upload("b_packed", &b_packed).unwrap();
    let b_f32 = ctx.upload("b_f32", &b_up).unwrap();
    let gp = GemmParams { b_offset: 1, ..GemmParams::new(m as u32, n as u32, k as u32) };
    // Grouped: 3 experts [n, k] back to back (n·k odd), gather.
    let counts = [5u32, 0, 11];
    let offsets: Vec<u32> = vec![0, 5, 5, 16];
    let slots = 16usize;
    let rows: Vec<u32> = (0..slots as u32).map(|s| (s * 5 + 1) % m as u32).collect();
    let (e_packed, e_up) = packed_pair(format, &weights(counts.len() * n * k, 4, 1.0));
    let e_packed = ctx.upload("experts_packed", &e_packed).unwrap();
    let e_f32 = ctx.upload("experts_f32", &e_up).unwrap();
    let ob = ctx.upload("offsets", &offsets).unwrap();
    let rb = ctx.upload("rows", &rows).unwrap();
    let gg = GroupedGemmParams {
        n: n as u32,
        k: k as u32,
        groups: counts.len() as u32,
        max_rows: 11,
        a_rs: k as u32,
        b_group_stride: (n * k) as u32,
        c_rs: n as u32,
        gather: 1,
        ..bytemuck::Zeroable::zeroed()
    };
    // Embedding: a chunk of rows 3..40 of a [50, k] table (k odd).
    let ids: Vec<u32> = (0..20).map(|i| (i * 7) % 50).collect();
    let idb = ctx.upload("ids", &ids).unwrap();
    let (t_packed, t_up) = packed_pair(format, &weights(37 * k, 5, 1.0));
    let t_packed = ctx.upload("table_packed", &t_packed).unwrap();
    let t_f32 = ctx.upload("table_f32", &t_up).unwrap();

    let outs: Vec<[wgpu::Buffer; 4]> = (0..2)
        .map(|_| {
            [
                guarded_output(&ctx, "linear", m * n),
                guarded_output(&ctx, "gemm", m * n),
                guarded_output(&ctx, "grouped", slots * n),
                guarded_output(&ctx, "embed", ids.len() * k),
            ]
        })
        .collect();
    let mut rec = Recorder::new(&ctx, &mut pipelines);
    let [l0, g0, q0, e0] = &outs[0];
    rec.product(&x, &w_f32, l0, linear_params(m, n, k), false).unwrap();
    rec.product(&x, &b_f32, g0, gp, false).unwrap();
    rec.grouped_product((&x, AFormat::F32), &e_f32, &ob, &rb, q0, slots, gg).unwrap();
    rec.embed(&idb, &t_f32, e0, ids.len(), k, 3, 37, 2.5).unwrap();
    let [l1, g1, q1, e1] = &outs[1];
    rec.product(&x, Operand::stored(&w_packed, format), l1, linear_params(m, n, k), format == WeightFormat::F16).unwrap();
    rec.product(&x, Operand::stored(&b_packed, format), g1, gp, false).unwrap();
    rec.grouped_product((&x, AFormat::F32), Operand::stored(&e_packed, format), &ob, &rb, q1, slots, gg).unwrap();
    rec.embed_format(&idb, &t_packed, format, e1, ids.len(), k, 3, 37, 2.5).unwrap();
    rec.finish().unwrap().run(&ctx).unwrap();
    for (i, (name, len)) in [("linear", m * n), ("gemm", m * n), ("grouped", slots * n), ("embed", ids.len() * k)].into_iter().enumerate() {
        let f32_out = read_all(&ctx, &outs[0][i], len);
        let packed_out = read_all(&ctx, &outs[1][i], len);
        assert!(f32_out[..len].iter().any(|&v| v != dg_parity::testing::GUARD && v != 0.0), "{name}: f32 output not written");
        assert_bits_equal(&packed_out, &f32_out, &format!("{format:?} Recorder::{name}_format"));
    }
}

#[test]
fn recorder_bf16_methods_match_their_f32_twins() {
    recorder_format_methods_match_their_f32_twins("recorder_bf16_methods_match_their_f32_twins", WeightFormat::Bf16);
}

#[test]
fn recorder_f16_methods_match_their_f32_twins() {
    recorder_format_methods_match_their_f32_twins("recorder_f16_methods_match_their_f32_twins", WeightFormat::F16);
}

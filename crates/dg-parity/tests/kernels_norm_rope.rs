//! Kernel-level parity of the fused per-head RMSNorm + RoPE kernel (`norm_rope`) against its CPU
//! twins, `dg_cpu::ops::rms_norm_rows` (weighted) then `dg_cpu::rope::RopeTable::apply`, at head
//! dims 8, 24 and the real 256 (default RoPE) and 512 (proportional RoPE), 1, 7 and 256 tokens, 1
//! and 8 heads; and against the two dispatches it replaces (`rmsnorm` then `rope` on the GPU).
//! Every output carries a guard band, and every case also runs with its workgroups folded into y.

use dg_gpu::ops::{HeadRows, Recorder, TokensAt};
use dg_gpu::{GpuContext, Pipelines, PlanBuilder, groups_1d};
use dg_kernels::norm_rope::{self, NormRopeParams};
use dg_kernels::rmsnorm::{self, RmsNormParams, WEIGHTED};
use dg_kernels::rope::{self, RopeParams};
use dg_kernels::row_reduce::RowReduce;
use dg_model::{LayerKind, LayerSpec, RopeSpec};
use dg_parity::testing::{GUARD, guarded_output, max_rel_err, read_guarded, seeded, test_context};

/// Against the CPU: the norm's few ulps (`NORM_TOLERANCE` = 2e-6 in kernels_norm.rs: a different
/// reduction order and `1/sqrt`) enter each rotated output twice, weighted by |cos| + |sin| ≤ √2,
/// while the largest output is at least 1/√2 of the largest normed value (the rotation keeps each
/// pair's norm): 2 × 2e-6; plus the rotation's own couple of ulps (`ROPE_TOLERANCE` = 5e-7 in
/// kernels_misc.rs). Relative to the largest output.
const NORM_ROPE_TOLERANCE: f32 = 4.5e-6;
/// Against the two GPU dispatches: the same operations in the same order (the same per-invocation
/// sums and tree, `1/sqrt`, products and rotation); only the driver's FMA contraction of the
/// rotation (or of the sum of squares) may differ between the two compilations: an ulp or two of
/// the largest output.
const TWO_DISPATCH_TOLERANCE: f32 = 3e-7;
const EPS: f32 = 1e-6;

fn rope_spec(head_dim: usize) -> LayerSpec {
    // The real model: 256 on sliding layers (default RoPE), 512 on full layers (proportional).
    if head_dim == 512 {
        let rope = RopeSpec { theta: 1_000_000.0, proportional: true, partial_rotary_factor: 0.25, factor: 1.0 };
        LayerSpec { kind: LayerKind::Full, head_dim, num_kv_heads: 1, rope }
    } else {
        let rope = RopeSpec { theta: 10_000.0, proportional: false, partial_rotary_factor: 1.0, factor: 1.0 };
        LayerSpec { kind: LayerKind::Sliding, head_dim, num_kv_heads: 1, rope }
    }
}

/// The fused kernel; returns `out`.
#[allow(clippy::too_many_arguments)]
fn run_fused(
    ctx: &GpuContext,
    reduce: (RowReduce, u32),
    x: &[f32],
    w: &[f32],
    cos: &[f32],
    sin: &[f32],
    tokens: usize,
    heads: usize,
    d: usize,
    max_dim: u32,
) -> Vec<f32> {
    run_fused_at(ctx, reduce, x, w, (cos, sin), (tokens, heads, d), max_dim, 0)
}

/// [`run_fused`] with the rows written `out_offset` elements into `out` (the decoder's canvas keys,
/// straight into the cache); returns the whole of `out` (`out_offset + x.len()`, guarded), every
/// element before the rows preset to 7.
#[allow(clippy::too_many_arguments)]
fn run_fused_at(
    ctx: &GpuContext,
    (reduce, lanes): (RowReduce, u32),
    x: &[f32],
    w: &[f32],
    (cos, sin): (&[f32], &[f32]),
    (tokens, heads, d): (usize, usize, usize),
    max_dim: u32,
    out_offset: usize,
) -> Vec<f32> {
    let mut pipelines = Pipelines::default();
    let xb = ctx.upload("x", x).unwrap();
    let wb = ctx.upload("w", w).unwrap();
    let cb = ctx.upload("cos", cos).unwrap();
    let sb = ctx.upload("sin", sin).unwrap();
    let out = guarded_output(ctx, "out", out_offset + x.len());
    ctx.queue.write_buffer(&out, 0, bytemuck::cast_slice(&vec![7.0f32; out_offset]));
    let values = guarded_output(ctx, "values", 4);
    let params = NormRopeParams {
        tokens: tokens as u32,
        heads: heads as u32,
        dim: d as u32,
        eps: EPS,
        splits: 1,
        split_stride: 0,
        out_offset: out_offset as u32,
        v_heads: 0,
        v_offset: 0,
        q_blocks: 0,
        skip_k: 0,
        ..bytemuck::Zeroable::zeroed()
    };
    // The workgroup the forward picks for these rows.
    let p = pipelines.get_source(ctx, norm_rope::source_lanes(reduce, lanes, norm_rope::workgroup_for(&params, lanes))).unwrap();
    let mut plan = PlanBuilder::new(ctx);
    plan.push(&p, &params, &[&xb, &wb, &cb, &sb, &out, &values, &wb, &values], groups_1d(norm_rope::workgroups(&params), max_dim));
    plan.finish(ctx).unwrap().run(ctx).unwrap();
    assert!(read_guarded(ctx, &values, 4).iter().all(|&v| v == GUARD), "values written without V rows");
    read_guarded(ctx, &out, out_offset + x.len())
}

/// `rmsnorm` (weighted, scale 1) then `rope` in place, as the decoder layer records them today.
#[allow(clippy::too_many_arguments)]
fn run_two_dispatches(
    ctx: &GpuContext,
    (reduce, lanes): (RowReduce, u32),
    x: &[f32],
    w: &[f32],
    cos: &[f32],
    sin: &[f32],
    tokens: usize,
    heads: usize,
    d: usize,
) -> Vec<f32> {
    let mut pipelines = Pipelines::default();
    let pn = pipelines.get_source(ctx, rmsnorm::source_lanes(reduce, lanes)).unwrap();
    let pr = pipelines.get_source(ctx, rope::source()).unwrap();
    let xb = ctx.upload("x", x).unwrap();
    let wb = ctx.upload("w", w).unwrap();
    let cb = ctx.upload("cos", cos).unwrap();
    let sb = ctx.upload("sin", sin).unwrap();
    let out = guarded_output(ctx, "out", x.len());
    let max_dim = ctx.limits.max_compute_workgroups_per_dimension;
    let rows = tokens * heads;
    let np = RmsNormParams {
        rows: rows as u32,
        dim: d as u32,
        eps: EPS,
        flags: WEIGHTED,
        scale: 1.0,
        splits: 1,
        split_stride: 0,
        x_offset: 0,
        out_offset: 0,
        _pad: [0; 3],
    };
    let rp = RopeParams { tokens: tokens as u32, heads: heads as u32, half: (d / 2) as u32, _pad: 0 };
    let mut plan = PlanBuilder::new(ctx);
    plan.push(&pn, &np, &[&xb, &wb, &out], groups_1d(rows as u32, max_dim));
    plan.push(&pr, &rp, &[&out, &cb, &sb], groups_1d(rope::workgroups(&rp), max_dim));
    plan.finish(ctx).unwrap().run(ctx).unwrap();
    read_guarded(ctx, &out, x.len())
}

/// Every row reduction the device runs, one column at a time and four (every `d` tested has
/// `d / 2` a multiple of 4, and the offsets too).
fn variants(ctx: &GpuContext) -> Vec<(RowReduce, u32)> {
    ctx.row_reduces().into_iter().flat_map(|r| [(r, 1), (r, 4)]).collect()
}

#[test]
fn norm_rope_matches_cpu_and_the_two_dispatches() {
    let Some(ctx) = test_context("norm_rope_matches_cpu_and_the_two_dispatches") else { return };
    let fold = [ctx.limits.max_compute_workgroups_per_dimension, 3];
    for d in [8, 24, 256, 512] {
        for tokens in [1, 7, 256] {
            for heads in [1, 8] {
                let what = format!("d={d} tokens={tokens} heads={heads}");
                let start = if tokens == 7 { 4093 } else { 0 };
                let table = dg_cpu::rope::RopeTable::new(&rope_spec(d), start, tokens);
                let x = seeded(tokens * heads * d, 100 + d as u64 * 7 + tokens as u64 * 3 + heads as u64, 3.0);
                let w: Vec<f32> = seeded(d, 101 + d as u64, 0.5).iter().map(|v| 1.0 + v).collect();
                let mut want = x.clone();
                dg_cpu::ops::rms_norm_rows(&mut want, d, Some(&w), EPS);
                table.apply(&mut want, heads);
                for (max_dim, reduce) in fold.into_iter().flat_map(|m| variants(&ctx).into_iter().map(move |r| (m, r))) {
                    let got = run_fused(&ctx, reduce, &x, &w, &table.cos, &table.sin, tokens, heads, d, max_dim);
                    let (err, at) = max_rel_err(&got, &want);
                    assert!(
                        err <= NORM_ROPE_TOLERANCE,
                        "{what} fold={max_dim} {reduce:?}: rel err {err} at {at}: {} vs {}",
                        got[at],
                        want[at]
                    );
                }
                for reduce in variants(&ctx) {
                    let got = run_fused(&ctx, reduce, &x, &w, &table.cos, &table.sin, tokens, heads, d, fold[0]);
                    let two = run_two_dispatches(&ctx, reduce, &x, &w, &table.cos, &table.sin, tokens, heads, d);
                    // Written at an offset: the same bits there, the elements before untouched.
                    let placed = run_fused_at(&ctx, reduce, &x, &w, (&table.cos, &table.sin), (tokens, heads, d), fold[0], 3 * d + 4);
                    assert!(
                        placed[3 * d + 4..] == got[..] && placed[..3 * d + 4].iter().all(|&v| v == 7.0),
                        "{what} {reduce:?}: written at an offset"
                    );
                    let (err, at) = max_rel_err(&got, &two);
                    assert!(
                        err <= TWO_DISPATCH_TOLERANCE,
                        "{what} {reduce:?}: vs rmsnorm + rope: rel err {err} at {at}: {} vs {}",
                        got[at],
                        two[at]
                    );
                }
            }
        }
    }
}

/// K and V of one [K | V] product in one dispatch (`Recorder::norm_rope_kv`, the decoder's and
/// encoder's K/V into the cache): the keys bit for bit what `norm_rope` alone writes, the values
/// what the weightless `rmsnorm` of the same width writes from V's half, both at the cache offset, every element
/// around them untouched; V either after K (sliding layers) or K itself (full layers: V is the raw
/// K projection), with workgroups folded into y.
#[test]
fn norm_rope_kv_writes_what_norm_rope_and_rmsnorm_write() {
    let Some(ctx) = test_context("norm_rope_kv_writes_what_norm_rope_and_rmsnorm_write") else { return };
    for (d, tokens, kv, has_v) in [(256usize, 7usize, 2usize, true), (512, 5, 1, false), (8, 300, 3, true)] {
        let table = dg_cpu::rope::RopeTable::new(&rope_spec(d), 11, tokens);
        let n = tokens * kv * d;
        let halves = if has_v { 2 } else { 1 };
        let v_offset = (halves - 1) * n;
        let x = ctx.upload("kv_raw", &seeded(halves * n, 200 + d as u64, 3.0)).unwrap();
        let w = ctx.upload("w", &seeded(d, 201, 0.5).iter().map(|v| 1.0 + v).collect::<Vec<_>>()).unwrap();
        let cb = ctx.upload("cos", &table.cos).unwrap();
        let sb = ctx.upload("sin", &table.sin).unwrap();
        let at = 3 * d + 4;
        let len = at + n + 50;
        let dummy = guarded_output(&ctx, "dummy", 4);
        let [keys, values, keys_alone, values_alone] =
            ["keys", "values", "keys alone", "values alone"].map(|l| guarded_output(&ctx, l, len));
        let mut pipelines = Pipelines::default();
        let mut rec = Recorder::new(&ctx, &mut pipelines);
        rec.norm_rope_kv(&x, &w, (&cb, &sb), (&keys, at), (&values, kv, v_offset), tokens, kv, d, EPS).unwrap();
        rec.norm_rope_kv(&x, &w, (&cb, &sb), (&keys_alone, at), (&dummy, 0, 0), tokens, kv, d, EPS).unwrap();
        rec.finish().unwrap().run(&ctx).unwrap();
        // The weightless norm as many columns at a time as the Recorder's norm_rope takes (four:
        // d / 2 and the offsets are multiples of 4), so that it sums its rows the same way.
        let rms = pipelines.get_source(&ctx, rmsnorm::source_lanes(ctx.row_reduce(), 4)).unwrap();
        let np = RmsNormParams {
            rows: (tokens * kv) as u32,
            dim: d as u32,
            eps: EPS,
            flags: 0,
            scale: 1.0,
            splits: 1,
            split_stride: 0,
            x_offset: v_offset as u32,
            out_offset: at as u32,
            _pad: [0; 3],
        };
        let mut plan = PlanBuilder::new(&ctx);
        plan.push(
            &rms,
            &np,
            &[&x, &dummy, &values_alone],
            groups_1d((tokens * kv) as u32, ctx.limits.max_compute_workgroups_per_dimension),
        );
        plan.finish(&ctx).unwrap().run(&ctx).unwrap();
        let bits = |b: &wgpu::Buffer| -> Vec<u32> { read_guarded(&ctx, b, len).iter().map(|v| v.to_bits()).collect() };
        let what = format!("d={d} tokens={tokens} kv={kv} v after k {has_v}");
        assert!(bits(&keys) == bits(&keys_alone), "{what}: keys differ from norm_rope's");
        assert!(bits(&values) == bits(&values_alone), "{what}: values differ from rmsnorm's");
        let v = read_guarded(&ctx, &values, len);
        assert!(
            v[..at].iter().chain(&v[at + n..]).all(|&e| e == GUARD) && v[at..at + n].iter().all(|e| e.is_finite()),
            "{what}: values outside the rows"
        );
    }
}

/// q, K and V of one product batched over blocks of kv heads (`[q blocks; K; V]`, the decoder's
/// merged `qkv_proj`) in one dispatch (`Recorder::norm_rope_rows`): q bit for bit what the q rows
/// alone write (as the separate q product's dispatch), and that the CPU's norm and rotation of
/// q's heads in token order (`[tokens, heads, d]`) within the kernel's tolerance; the keys and
/// values bit for bit what `norm_rope_kv` writes from the K/V part; and the same rows as the second
/// canvas of a product over two (`TokensAt`) give the same bits.
#[test]
fn norm_rope_rows_of_q_k_and_v_write_what_q_alone_and_norm_rope_kv_write() {
    let test = "norm_rope_rows_of_q_k_and_v_write_what_q_alone_and_norm_rope_kv_write";
    let Some(ctx) = test_context(test) else { return };
    for (d, tokens, kv, group, has_v) in [(256usize, 7usize, 2usize, 2usize, true), (512, 5, 1, 8, false), (8, 300, 3, 2, true)] {
        let table = dg_cpu::rope::RopeTable::new(&rope_spec(d), 11, tokens);
        let n = tokens * kv * d;
        let halves = if has_v { 2 } else { 1 };
        let x_host = seeded((group + halves) * n, 300 + d as u64, 3.0);
        let x = ctx.upload("qkv_raw", &x_host).unwrap();
        let kv_x = ctx.upload("kv_raw", &x_host[group * n..]).unwrap();
        let q_w_host: Vec<f32> = seeded(d, 301, 0.5).iter().map(|v| 1.0 + v).collect();
        let q_w = ctx.upload("q_w", &q_w_host).unwrap();
        let k_w = ctx.upload("k_w", &seeded(d, 302, 0.5).iter().map(|v| 1.0 + v).collect::<Vec<_>>()).unwrap();
        let cb = ctx.upload("cos", &table.cos).unwrap();
        let sb = ctx.upload("sin", &table.sin).unwrap();
        let at = 3 * d + 4;
        let len = at + n + 50;
        let q_len = group * n;
        let dummy = guarded_output(&ctx, "dummy", 4);
        let [q, q_alone] = ["q", "q alone"].map(|l| guarded_output(&ctx, l, q_len));
        let [keys, values, keys_kv, values_kv] = ["keys", "values", "keys kv", "values kv"].map(|l| guarded_output(&ctx, l, len));
        let mut pipelines = Pipelines::default();
        let mut rec = Recorder::new(&ctx, &mut pipelines);
        let all = HeadRows {
            q: Some((&q_w, &q, group)),
            k: Some((&k_w, &keys, at)),
            v: (&values, kv, (group + halves - 1) * n),
            at: TokensAt::WHOLE,
            half_kv: false,
        };
        rec.norm_rope_rows(&x, all, (&cb, &sb), tokens, kv, d, EPS).unwrap();
        // The same dispatch into an f16 cache (q stays f32).
        let [keys_h, values_h] = ["keys f16", "values f16"].map(|l| guarded_output(&ctx, l, len.div_ceil(2)));
        let q_h = guarded_output(&ctx, "q beside an f16 cache", q_len);
        let half_rows =
            HeadRows { q: Some((&q_w, &q_h, group)), k: Some((&k_w, &keys_h, at)), v: (&values_h, kv, all.v.2), half_kv: true, ..all };
        rec.norm_rope_rows(&x, half_rows, (&cb, &sb), tokens, kv, d, EPS).unwrap();
        rec.norm_rope_rows(
            &x,
            HeadRows { q: Some((&q_w, &q_alone, group)), k: None, v: (&dummy, 0, 0), at: TokensAt::WHOLE, half_kv: false },
            (&cb, &sb),
            tokens,
            kv,
            d,
            EPS,
        )
        .unwrap();
        rec.norm_rope_kv(&kv_x, &k_w, (&cb, &sb), (&keys_kv, at), (&values_kv, kv, (halves - 1) * n), tokens, kv, d, EPS).unwrap();
        // The same rows as the second canvas of a product over two (each block `[2·tokens, kv,
        // d]`, the first canvas's rows other values), its RoPE tables after the first canvas's.
        let (x2_host, blocks) = {
            let other = seeded((group + halves) * n, 400 + d as u64, 3.0);
            let mut x2 = Vec::with_capacity(2 * other.len());
            for b in 0..group + halves {
                x2.extend_from_slice(&other[b * n..(b + 1) * n]);
                x2.extend_from_slice(&x_host[b * n..(b + 1) * n]);
            }
            (x2, group + halves)
        };
        assert_eq!(x2_host.len(), 2 * blocks * n);
        let x2 = ctx.upload("two canvases", &x2_host).unwrap();
        let wide = |t: &[f32]| -> Vec<f32> { seeded(t.len(), 401, 1.0).into_iter().chain(t.iter().copied()).collect() };
        let (cb2, sb2) = (ctx.upload("cos2", &wide(&table.cos)).unwrap(), ctx.upload("sin2", &wide(&table.sin)).unwrap());
        let [q2, keys2, values2] = [("q2", q_len), ("keys2", len), ("values2", len)].map(|(l, n)| guarded_output(&ctx, l, n));
        let second = TokensAt { x_offset: n, block_stride: 2 * n, table_row0: tokens, q_offset: 0 };
        let rows2 = HeadRows {
            q: Some((&q_w, &q2, group)),
            k: Some((&k_w, &keys2, at)),
            v: (&values2, kv, (group + halves - 1) * 2 * n + n),
            at: second,
            half_kv: false,
        };
        rec.norm_rope_rows(&x2, rows2, (&cb2, &sb2), tokens, kv, d, EPS).unwrap();
        rec.finish().unwrap().run(&ctx).unwrap();
        let what = format!("d={d} tokens={tokens} kv={kv} group={group} v after k {has_v}");
        let bits = |b: &wgpu::Buffer, len: usize| -> Vec<u32> { read_guarded(&ctx, b, len).iter().map(|v| v.to_bits()).collect() };
        assert!(bits(&q, q_len) == bits(&q_alone, q_len), "{what}: q differs from q's rows alone");
        assert!(bits(&keys, len) == bits(&keys_kv, len), "{what}: keys differ from norm_rope_kv's");
        assert!(bits(&values, len) == bits(&values_kv, len), "{what}: values differ from norm_rope_kv's");
        assert!(read_guarded(&ctx, &dummy, 4).iter().all(|&v| v == GUARD), "{what}: the unused output written");
        assert!(bits(&q2, q_len) == bits(&q, q_len), "{what}: q of a canvas of two differs from q alone");
        assert!(bits(&keys2, len) == bits(&keys, len), "{what}: keys of a canvas of two differ");
        assert!(bits(&values2, len) == bits(&values, len), "{what}: values of a canvas of two differ");
        // The f16 cache holds each f32 value rounded to the nearest f16, and nothing else.
        assert!(bits(&q_h, q_len) == bits(&q, q_len), "{what}: q beside an f16 cache differs");
        let halves_of = |b: &wgpu::Buffer| -> Vec<u16> {
            read_guarded(&ctx, b, len.div_ceil(2)).iter().flat_map(|v| [v.to_bits() as u16, (v.to_bits() >> 16) as u16]).collect()
        };
        let guard = [GUARD.to_bits() as u16, (GUARD.to_bits() >> 16) as u16];
        for (name, full, half) in [("keys", &keys, &keys_h), ("values", &values, &values_h)] {
            let (full, half) = (read_guarded(&ctx, full, len), halves_of(half));
            for (i, &h) in half.iter().enumerate().take(len) {
                let want = if (at..at + n).contains(&i) { half::f16::from_f32(full[i]).to_bits() } else { guard[i % 2] };
                assert_eq!(h, want, "{what}: f16 {name}[{i}] (f32 {})", full[i]);
            }
        }
        // q's heads in token order: head b·kv + j of token t is row (b, t, j) of the blocks.
        let heads = group * kv;
        let mut want = vec![0.0f32; q_len];
        for b in 0..group {
            for t in 0..tokens {
                for j in 0..kv {
                    let src = ((b * tokens + t) * kv + j) * d;
                    let dst = (t * heads + b * kv + j) * d;
                    want[dst..dst + d].copy_from_slice(&x_host[src..src + d]);
                }
            }
        }
        dg_cpu::ops::rms_norm_rows(&mut want, d, Some(&q_w_host), EPS);
        table.apply(&mut want, heads);
        let got = read_guarded(&ctx, &q, q_len);
        let (err, at) = max_rel_err(&got, &want);
        assert!(err <= NORM_ROPE_TOLERANCE, "{what}: q against the CPU: rel err {err} at {at}: {} vs {}", got[at], want[at]);
    }
}

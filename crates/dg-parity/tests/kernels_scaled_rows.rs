//! The row scaling that keeps the tensor cores' f16 activations finite (issue: f16 activations
//! that cannot overflow), kernel by kernel on the GPU:
//!
//! - `gelu_glu::fused_scaled` / `pair_scaled` store each row of `gelu(gate)·up` multiplied by the
//!   power of two that brings its largest magnitude within 2^15 (1 for rows already there), and
//!   the inverse in `scale`: checked bit for bit against the unscaled kernel's f32 output times the
//!   factor the rule gives (f16 outputs: that value rounded to f16), on rows reaching past f16's
//!   65504 and rows well within it.
//! - The consumers multiply the rows back: the closing norms (plain and with the combine), the
//!   MoE combine and the scaled add, on inputs divided by powers of two with those factors, give
//!   the unscaled kernels' bits on the undivided inputs (power-of-two factors are exact); the
//!   gated adds write those bits on the rows they open and nothing elsewhere.

use dg_gpu::{GpuContext, Pipelines, PlanBuilder, groups_1d};
use dg_kernels::axpby::{self, AxpbyParams};
use dg_kernels::gelu_glu::{self, GeluGluParams};
use dg_kernels::moe_combine::{self, MoeCombineParams};
use dg_kernels::residual_norms::{self, FfnResidualNormsParams};
use dg_parity::testing::{guarded_output, read_guarded, seeded, test_context};

/// Largest magnitude a scaled row keeps (`wgsl/scaled_rows.wgsl`).
const LIMIT: f32 = 32768.0;
/// f16's largest finite value.
const F16_MAX: f32 = 65504.0;

/// The factor the rule gives a row whose largest magnitude is `m`: 1 within [`LIMIT`], else
/// `2^(14 - b)` for `m` in `[2^b, 2^(b + 1))`.
fn factor(m: f32) -> f32 {
    if m <= LIMIT {
        return 1.0;
    }
    let b = ((m.to_bits() >> 23) & 0xff) as i32 - 127;
    2f32.powi(14 - b)
}

/// `[rows, 2·inter]` gate‖up rows of four magnitudes in turn: rows 1 and 2 reach past 65504 once
/// activated (gelu(g)·u ≈ g·u for large g), rows 0 and 3 stay within it.
fn gate_up_rows(rows: usize, inter: usize, seed: u64) -> Vec<f32> {
    let mut v = seeded(rows * 2 * inter, seed, 1.0);
    for (r, row) in v.chunks_mut(2 * inter).enumerate() {
        let scale = [3.0, 700.0, 2000.0, 60.0][r % 4];
        row.iter_mut().for_each(|x| *x *= scale);
    }
    v
}

/// Checks one job: `out` (f32, or f16 halves with `half`) and `scale` against the unscaled
/// activation `want` (f32), row by row.
fn check_rows(what: &str, want: &[f32], out_bits: &[u32], scale: &[f32], rows: usize, inter: usize, half: bool) {
    let mut past_f16 = 0;
    for r in 0..rows {
        let row = &want[r * inter..(r + 1) * inter];
        let m = row.iter().fold(0f32, |m, v| m.max(v.abs()));
        past_f16 += usize::from(m > F16_MAX);
        let f = factor(m);
        assert_eq!(scale[r], 1.0 / f, "{what}: row {r} (largest {m}): factor {} stored, the rule gives {}", 1.0 / scale[r], f);
        for (i, &v) in row.iter().enumerate() {
            let expect = v * f;
            let (got, expect_bits) = match half {
                true => {
                    let h = (out_bits[(r * inter + i) >> 1] >> (16 * ((r * inter + i) & 1))) as u16;
                    (half::f16::from_bits(h).to_f32(), half::f16::from_f32(expect).to_bits() as u32)
                }
                false => (f32::from_bits(out_bits[r * inter + i]), expect.to_bits()),
            };
            assert!(got.is_finite() && got.abs() <= LIMIT, "{what}: row {r} element {i}: {got} stored");
            let got_bits = if half { half::f16::from_f32(got).to_bits() as u32 } else { got.to_bits() };
            assert_eq!(got_bits, expect_bits, "{what}: row {r} element {i}: {got} stored, {expect} expected (unscaled {v} × {f})");
        }
    }
    assert!(past_f16 > 0, "{what}: no row reached past f16's range: the case checks nothing");
}

fn words(ctx: &GpuContext, buffer: &wgpu::Buffer, len: usize) -> Vec<u32> {
    read_guarded(ctx, buffer, len).into_iter().map(f32::to_bits).collect()
}

#[test]
fn gelu_glu_scaled_rows_stay_within_f16_and_give_the_unscaled_values_times_their_factor() {
    let test = "gelu_glu_scaled_rows_stay_within_f16_and_give_the_unscaled_values_times_their_factor";
    let Some(ctx) = test_context(test) else { return };
    let halves_too = ctx.device.features().contains(wgpu::Features::SHADER_F16);
    if !halves_too {
        eprintln!("{test}: adapter {} has no SHADER_F16: f32 outputs only", ctx.info.name);
    }
    let mut pipelines = Pipelines::default();
    // (rows, inter, splits of the first job), (rows_b, inter_b) of the pair's second.
    for &((rows, inter, splits), (rows_b, inter_b)) in &[((8, 2112, 2), (12, 704)), ((5, 36, 1), (9, 300)), ((4, 7, 3), (5, 9))] {
        let n = rows * inter;
        let gate_up = gate_up_rows(rows, inter, 51 + inter as u64);
        // The first job's input as `splits` partials that sum to it exactly (halves, quarters).
        let mut partials = vec![0f32; splits * 2 * n];
        for z in 0..splits {
            let share = if z + 1 == splits { 1.0 / (1u32 << z) as f32 } else { 1.0 / (2u32 << z) as f32 };
            partials[z * 2 * n..(z + 1) * 2 * n].iter_mut().zip(&gate_up).for_each(|(p, &g)| *p = g * share);
        }
        let gate_up_b = gate_up_rows(rows_b, inter_b, 52 + inter_b as u64);
        let n_b = rows_b * inter_b;
        let input = ctx.upload("gate_up", &partials).unwrap();
        let input_b = ctx.upload("gate_up_b", &gate_up_b).unwrap();
        let lanes_all: &[u32] = if inter % 4 == 0 && inter_b % 4 == 0 { &[1, 4] } else { &[1] };
        for reduce in ctx.row_reduces() {
            for &lanes in lanes_all {
                // The unscaled activations, f32.
                let fused = pipelines.get_source(&ctx, gelu_glu::fused_lanes(lanes, false)).unwrap();
                let a = GeluGluParams::one(rows as u32, inter as u32, splits as u32, (2 * n) as u32).with_lanes(lanes);
                let b = GeluGluParams::one(rows_b as u32, inter_b as u32, 1, 0).with_lanes(lanes);
                let (want, want_b) = (guarded_output(&ctx, "want", n), guarded_output(&ctx, "want_b", n_b));
                let mut plan = PlanBuilder::new(&ctx);
                plan.push(&fused, &a, &[&input, &want], groups_1d(gelu_glu::workgroups(&a), 65535));
                plan.push(&fused, &b, &[&input_b, &want_b], groups_1d(gelu_glu::workgroups(&b), 65535));
                plan.finish(&ctx).unwrap().run(&ctx).unwrap();
                let (want, want_b) = (read_guarded(&ctx, &want, n), read_guarded(&ctx, &want_b, n_b));
                for half in [false, true].into_iter().filter(|&h| !h || halves_too) {
                    let what = format!("{rows}x{inter} in {splits} partials, {reduce:?}, {lanes} columns a time, f16 {half}");
                    let words_b = if half { n_b.div_ceil(2) } else { n_b };
                    for max_dim in [65535, 3] {
                        // fused_scaled on the first job, stored as f16 with `half`.
                        let kernel = pipelines.get_source(&ctx, gelu_glu::fused_scaled(reduce, lanes, half)).unwrap();
                        let len = if half { n.div_ceil(2) } else { n };
                        let (out, scale) = (guarded_output(&ctx, "out", len), guarded_output(&ctx, "scale", rows));
                        let mut plan = PlanBuilder::new(&ctx);
                        plan.push(&kernel, &a, &[&input, &out, &scale], groups_1d(gelu_glu::workgroups_scaled(&a), max_dim));
                        plan.finish(&ctx).unwrap().run(&ctx).unwrap();
                        let scale = read_guarded(&ctx, &scale, rows);
                        check_rows(
                            &format!("fused_scaled {what}, fold {max_dim}"),
                            &want,
                            &words(&ctx, &out, len),
                            &scale,
                            rows,
                            inter,
                            half,
                        );

                        // pair_scaled: the first job f32, the second f16 with `half`.
                        let kernel = pipelines.get_source(&ctx, gelu_glu::pair_scaled(reduce, lanes, half)).unwrap();
                        let p = GeluGluParams::pair_rows(a, (rows_b as u32, inter_b as u32));
                        let [out, out_b] = [n, words_b].map(|len| guarded_output(&ctx, "out", len));
                        let (scale, scale_b) = (guarded_output(&ctx, "scale", rows), guarded_output(&ctx, "scale_b", rows_b));
                        let mut plan = PlanBuilder::new(&ctx);
                        let buffers = [&input, &out, &input_b, &out_b, &scale, &scale_b];
                        plan.push(&kernel, &p, &buffers, groups_1d(gelu_glu::workgroups_scaled(&p), max_dim));
                        plan.finish(&ctx).unwrap().run(&ctx).unwrap();
                        let (scale, scale_b) = (read_guarded(&ctx, &scale, rows), read_guarded(&ctx, &scale_b, rows_b));
                        let what = format!("pair_scaled {what}, fold {max_dim}");
                        check_rows(&format!("{what}, first job"), &want, &words(&ctx, &out, n), &scale, rows, inter, false);
                        check_rows(&format!("{what}, second job"), &want_b, &words(&ctx, &out_b, words_b), &scale_b, rows_b, inter_b, half);
                    }
                }
            }
        }
    }
}

/// Powers of two a row or slot is divided by in the consumer tests: 1 included.
fn divisor(i: usize) -> f32 {
    [1.0, 2.0, 32.0, 4096.0][i % 4]
}

/// Divides each row of `width` values by its divisor; returns the rows and the factors.
fn divided(values: &[f32], width: usize) -> (Vec<f32>, Vec<f32>) {
    let rows: Vec<f32> = values.chunks(width).enumerate().flat_map(|(r, row)| row.iter().map(move |v| v / divisor(r))).collect();
    (rows, (0..values.len() / width).map(divisor).collect())
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// The scaled closing norms (plain, and with the combine fused), the scaled MoE combine and the
/// scaled add, on rows divided by powers of two with those factors as their scales, give the
/// unscaled kernels' bits on the undivided rows.
#[test]
fn scaled_consumers_multiply_the_rows_back_exactly() {
    let test = "scaled_consumers_multiply_the_rows_back_exactly";
    let Some(ctx) = test_context(test) else { return };
    let storage = ctx.limits.max_storage_buffers_per_shader_stage;
    let mut pipelines = Pipelines::default();
    let (tokens, k, dim) = (6usize, 4usize, 36usize);
    let slots = tokens * k;
    // Every token's K entries in slots t·K.. (experts 0..K), one entry skipped.
    let idx: Vec<u32> = (0..slots as u32).map(|s| s % k as u32).collect();
    let mut slot_of: Vec<u32> = (0..slots as u32).collect();
    slot_of[5] = dg_kernels::moe_dispatch::NO_SLOT;
    let weights = seeded(slots, 61, 1.0);
    let y = seeded(slots * dim, 62, 3.0);
    let (mlp, moe0, hidden0) = (seeded(tokens * dim, 63, 2.0), seeded(tokens * dim, 64, 2.0), seeded(tokens * dim, 65, 4.0));
    let norm_weights: Vec<Vec<f32>> = (0..4).map(|i| seeded(dim, 66 + i, 1.5)).collect();
    let (mlp_div, mlp_scale) = divided(&mlp, dim);
    let (y_div, slot_scale) = divided(&y, dim);
    let up = |name: &str, v: &[f32]| ctx.upload(name, v).unwrap();
    let (ib, sb, wb) = (ctx.upload("idx", &idx).unwrap(), ctx.upload("slot_of", &slot_of).unwrap(), up("weights", &weights));
    let w: Vec<wgpu::Buffer> = norm_weights.iter().map(|v| up("w", v)).collect();
    let (mlp_scale_b, slot_scale_b) = (up("mlp_scale", &mlp_scale), up("slot_scale", &slot_scale));
    for reduce in ctx.row_reduces() {
        for lanes in [1u32, 4] {
            // (combine, scaled): moe, hidden and normed after the closing norms.
            let run = |combine: bool, scaled: bool, pipelines: &mut Pipelines| -> [Vec<f32>; 3] {
                let (mlp_b, y_b) = if scaled { (up("mlp", &mlp_div), up("y", &y_div)) } else { (up("mlp", &mlp), up("y", &y)) };
                let [moe, hidden, normed] = ["moe", "hidden", "normed"].map(|n| guarded_output(&ctx, n, tokens * dim));
                ctx.queue.write_buffer(&moe, 0, bytemuck::cast_slice(&moe0));
                ctx.queue.write_buffer(&hidden, 0, bytemuck::cast_slice(&hidden0));
                let p = FfnResidualNormsParams {
                    rows: tokens as u32,
                    dim: dim as u32,
                    eps: 1e-6,
                    scalar: 0.75,
                    splits: 1,
                    split_stride: 0,
                    next_norm: 1,
                    top_k: if combine { k as u32 } else { 0 },
                };
                let mut buffers = vec![&mlp_b, &w[0], &moe, &w[1], &w[2], &hidden, &w[3], &normed];
                if combine {
                    buffers.extend([&y_b, &ib, &wb, &sb]);
                }
                if scaled {
                    buffers.push(&mlp_scale_b);
                    if combine {
                        buffers.push(&slot_scale_b);
                    }
                }
                let source = match (combine, scaled) {
                    (false, false) => residual_norms::source_ffn_lanes(reduce, lanes),
                    (true, false) => residual_norms::source_ffn_combine_lanes(reduce, lanes),
                    (c, true) => residual_norms::source_ffn_scaled(reduce, lanes, c),
                };
                assert_eq!(source.buffers.len() as u32, residual_norms::ffn_buffers(combine, scaled));
                let kernel = pipelines.get_source(&ctx, source).unwrap();
                let mut plan = PlanBuilder::new(&ctx);
                plan.push(&kernel, &p, &buffers, groups_1d(residual_norms::workgroups(tokens as u32), 65535));
                plan.finish(&ctx).unwrap().run(&ctx).unwrap();
                [&moe, &hidden, &normed].map(|b| read_guarded(&ctx, b, tokens * dim))
            };
            for combine in [false, true] {
                if storage < residual_norms::ffn_buffers(combine, true) {
                    eprintln!(
                        "{test}: the adapter allows {storage} storage buffers a stage: no scaled closing norms with combine {combine}"
                    );
                    continue;
                }
                let (scaled, plain) = (run(combine, true, &mut pipelines), run(combine, false, &mut pipelines));
                for (name, (s, p)) in ["moe", "hidden", "normed"].iter().zip(scaled.iter().zip(&plain)) {
                    assert!(
                        same_bits(s, p),
                        "{reduce:?}, {lanes} columns a time, combine {combine}: scaled {name} differs from the unscaled"
                    );
                }
            }
        }
    }
    // The MoE combine on its own, scaled against unscaled.
    let cp = MoeCombineParams { tokens: tokens as u32, k: k as u32, hidden: dim as u32, _pad: 0 };
    for lanes in [1u32, 4] {
        let mut out = Vec::new();
        for scaled in [false, true] {
            let y_b = up("y", if scaled { &y_div } else { &y });
            let o = guarded_output(&ctx, "out", tokens * dim);
            let source = if scaled { moe_combine::source_scaled(lanes) } else { moe_combine::source_lanes(lanes) };
            let kernel = pipelines.get_source(&ctx, source).unwrap();
            let mut buffers = vec![&y_b, &ib, &wb, &sb, &o];
            if scaled {
                buffers.push(&slot_scale_b);
            }
            let mut plan = PlanBuilder::new(&ctx);
            plan.push(&kernel, &cp, &buffers, groups_1d(moe_combine::workgroups(&cp), 65535));
            plan.finish(&ctx).unwrap().run(&ctx).unwrap();
            out.push(read_guarded(&ctx, &o, tokens * dim));
        }
        assert!(same_bits(&out[0], &out[1]), "{lanes} columns a time: the scaled MoE combine differs from the unscaled");
    }
    // The scaled add: out = out + x·scale[row].
    let (x_div, x_scale) = divided(&mlp, dim);
    let mut out = Vec::new();
    for scaled in [false, true] {
        let x = up("x", if scaled { &x_div } else { &mlp });
        let o = up("out", &hidden0);
        let scale = up("scale", &x_scale);
        let p = AxpbyParams { n: (tokens * dim) as u32, alpha: 1.0, beta: 1.0, row: dim as u32 };
        let kernel = pipelines.get_source(&ctx, axpby::source(axpby::Variant { scaled, gated: false })).unwrap();
        let buffers: Vec<&wgpu::Buffer> = if scaled { vec![&x, &o, &scale] } else { vec![&x, &o] };
        let mut plan = PlanBuilder::new(&ctx);
        plan.push(&kernel, &p, &buffers, groups_1d(axpby::workgroups(&p), 65535));
        plan.finish(&ctx).unwrap().run(&ctx).unwrap();
        out.push(ctx.read_f32(&o, 0, tokens * dim).unwrap());
    }
    assert!(same_bits(&out[0], &out[1]), "the scaled add differs from the unscaled");
}

/// The gated adds (a batch's self-conditioning signal, added to the canvases that take it): rows
/// whose gate is non-zero get the ungated add's bits (plain, and scaled on divided rows), the
/// other rows keep `out` as it was, even where `x` holds NaN.
#[test]
fn gated_adds_write_the_ungated_bits_on_open_rows_only() {
    let test = "gated_adds_write_the_ungated_bits_on_open_rows_only";
    let Some(ctx) = test_context(test) else { return };
    let mut pipelines = Pipelines::default();
    let (rows, dim) = (6usize, 36usize);
    let mut x = seeded(rows * dim, 71, 2.0);
    let out0 = seeded(rows * dim, 72, 4.0);
    let gate: Vec<u32> = (0..rows as u32).map(|r| u32::from(r % 3 != 1)).collect();
    // A closed row's x may be anything: a stale canvas's signal.
    x[dim + 3] = f32::NAN;
    let (x_div, x_scale) = divided(&x, dim);
    let up = |name: &str, v: &[f32]| ctx.upload(name, v).unwrap();
    let gate_b = ctx.upload("gate", &gate).unwrap();
    let p = AxpbyParams { n: (rows * dim) as u32, alpha: 1.0, beta: 1.0, row: dim as u32 };
    let run = |source: dg_kernels::KernelSource, buffers: &[&wgpu::Buffer], o: &wgpu::Buffer, pipelines: &mut Pipelines| {
        let kernel = pipelines.get_source(&ctx, source).unwrap();
        let mut plan = PlanBuilder::new(&ctx);
        plan.push(&kernel, &p, buffers, groups_1d(axpby::workgroups(&p), 65535));
        plan.finish(&ctx).unwrap().run(&ctx).unwrap();
        ctx.read_f32(o, 0, rows * dim).unwrap()
    };
    for scaled in [false, true] {
        let (xb, scale) = (up("x", if scaled { &x_div } else { &x }), up("scale", &x_scale));
        let (o_plain, o_gated) = (up("out", &out0), up("out", &out0));
        let plain_buffers: Vec<&wgpu::Buffer> = if scaled { vec![&xb, &o_plain, &scale] } else { vec![&xb, &o_plain] };
        let plain = run(axpby::source(axpby::Variant { scaled, gated: false }), &plain_buffers, &o_plain, &mut pipelines);
        let gated_buffers: Vec<&wgpu::Buffer> = if scaled { vec![&xb, &o_gated, &scale, &gate_b] } else { vec![&xb, &o_gated, &gate_b] };
        let gated = run(axpby::source(axpby::Variant { scaled, gated: true }), &gated_buffers, &o_gated, &mut pipelines);
        for (r, &open) in gate.iter().enumerate() {
            let span = r * dim..(r + 1) * dim;
            let want = if open != 0 { &plain[span.clone()] } else { &out0[span.clone()] };
            assert!(same_bits(&gated[span], want), "scaled {scaled}: row {r} (gate {open})");
        }
    }
}

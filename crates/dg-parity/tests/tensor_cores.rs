//! The tensor-core kernels as the F16 mode's forward records them, on a device with cooperative
//! matrices: `Recorder::grouped_product` on F16 experts in K panels
//! (`dg_kernels::coop_grouped_gemm`, every tile, W staged and direct), and through
//! `dg_kernels::coop_gemm` `Recorder::product` on batched products (K and V in one dispatch),
//! the tied head (a softcapped vocabulary chunk from F16 or BF16 weights, `ops::head_params`),
//! attention's strided GQA products (ragged columns included) and dense projections in K panels
//! (ragged rows included), each against
//! the exact (f64) product of the f16-rounded operands. Every output has a guard band and values
//! the kernel must not touch.
//!
//! On a device without cooperative matrices (lavapipe) these tests print a visible SKIP: the
//! Recorder takes the f32-arithmetic kernels there, which `kernels_bf16.rs` covers.
//!

use dg_gpu::ops::{Batches, Operand, Recorder, head_params, linear_params};
use dg_gpu::{GpuContext, GpuMatrix, MatrixLayout, Pipelines};
use dg_kernels::coop_grouped_gemm::WPath;
use dg_kernels::{WeightFormat, coop_grouped_gemm};
use dg_parity::testing::coop_experts::{Case, check, f16_round, grouped_reference, real_counts, run_grouped, run_tile, tolerance};
use dg_parity::testing::{GUARD, coop_test_context, guarded_output, max_rel_err, on_device, push_product, read_guarded, seeded};

/// The device's f32 `tanh` against the exact one, relative to the cap: the f32 GEMM's softcap
/// epilogue uses the same `tanh`, and the f32 GPU logits agree with the CPU's to 2.7e-6
/// normwise on an H200.
const TANH_ALLOWANCE: f32 = 4e-6;

#[test]
fn coop_grouped_gemm_matches_the_exact_product_on_every_tile() {
    use dg_kernels::coop_gemm;
    let test = "coop_grouped_gemm_matches_the_exact_product_on_every_tile";
    let Some(ctx) = coop_test_context(test) else { return };
    let mut pipelines = Pipelines::default();
    // Counts around the 32- and 64-row tile edges (full and partial tiles, several m tiles, empty
    // experts), and the uneven counts of a real routing.
    let edges = vec![31, 32, 33, 64, 65, 0, 1, 96];
    let uneven = vec![5, 0, 37, 1, 0, 70, 16, 3];
    for &tile in coop_grouped_gemm::TILES.iter() {
        for counts in [&edges, &uneven] {
            for gather in [false, true] {
                // n = 3·bn: 192 fits only the 64-wide tile, 384 the 128-wide ones; 3 or 7 K steps
                // of 32 (2 or 4 of 64), fewer than some rings and no multiple of any ring's length.
                let k = (if gather { 224usize } else { 96 }).next_multiple_of(tile.bk as usize);
                let case = Case { n: 3 * tile.bn as usize, k, counts: counts.clone(), gather };
                let x = case.inputs(7 + tile.bm as u64);
                // The Recorder chooses by shape; the tile under test also runs directly.
                let got = run_grouped(&ctx, &mut pipelines, &x);
                let want = grouped_reference(&x, |_| true);
                check(&got, &want, &x, |_| true, &format!("n {} counts {counts:?} gather {gather}", case.n));
                // With a table of the chosen tile's rows, and of other rows (the grid then).
                for rows in [32, 64] {
                    let tabled = run_grouped(&ctx, &mut pipelines, &x.with_table(rows));
                    assert!(tabled == got, "n {} counts {counts:?} gather {gather}: other bits with a table of {rows} rows", case.n);
                }
                for path in [WPath::Staged, WPath::Direct, WPath::Single].into_iter().filter(|&path| coop_grouped_gemm::runs(tile, path)) {
                    let direct = run_tile(&ctx, &mut pipelines, tile, path, &x);
                    check(&direct, &want, &x, |_| true, &format!("tile {} {path:?} counts {counts:?} gather {gather}", tile.label()));
                    // The tile table's grid runs the same tiles.
                    let tabled = run_tile(&ctx, &mut pipelines, tile, path, &x.with_table(tile.bm));
                    assert!(
                        tabled == direct,
                        "tile {} {path:?} counts {counts:?} gather {gather}: other bits over the tile table",
                        tile.label()
                    );
                    // Deeper rings and stages named by constants (two-stage paths) add the same
                    // products in the same order: the same bits.
                    let depths = 1..=dg_kernels::coop_kloop::MAX_DEPTH;
                    let variants = depths.flat_map(|d| coop_gemm::Stages::ALL.map(|s| tile.with_depth(d).with_stages(s)));
                    for t in variants.filter(|&t| t != tile && t.on_path(path) == t) {
                        let other = run_tile(&ctx, &mut pipelines, t, path, &x);
                        assert!(
                            other == direct,
                            "tile {} {path:?} counts {counts:?} gather {gather}: other bits than depth 1, alternating stages",
                            t.label()
                        );
                    }
                }
            }
        }
    }
}

/// Every tile of `coop_grouped_gemm::TILES`, and each tile the forward chooses at its loads'
/// depth, on every path it runs, gives the same bits on one product: each output adds the same
/// 16-deep fragment products over K in the same order, whatever the rows and columns its
/// workgroup covers and however far ahead it loads. So a tile is a choice of speed only: a batch of
/// canvases may take the long groups' tile where one canvas takes the decoder's, and each
/// sequence still gets the bits it gets alone.
#[test]
fn every_grouped_tile_gives_the_same_bits() {
    let test = "every_grouped_tile_gives_the_same_bits";
    let Some(ctx) = coop_test_context(test) else { return };
    let mut pipelines = Pipelines::default();
    // Every tile in K steps of 32 (the tuning tiles' too); n a multiple of every tile's columns;
    // K 7 steps of 32; counts around the 16-, 32- and 64-row tile edges and empty experts. The
    // quantized choices' tiles are run here in F16: the quantized kernels give the F16 kernel's
    // bits on the dequantized values (`tensor_cores_quant`).
    let chosen = [
        coop_grouped_gemm::EXPERT_TILE,
        coop_grouped_gemm::GATHERED_EXPERT_TILE,
        coop_grouped_gemm::LONG_GROUP_TILE,
        coop_grouped_gemm::QUANTIZED_EXPERT_TILE,
        coop_grouped_gemm::QUANTIZED_LONG_GROUP_TILE,
    ];
    let tiles: Vec<_> = coop_grouped_gemm::TILES.iter().copied().chain(chosen).collect();
    assert!(tiles.iter().all(|t| t.bk == 32 && 768 % t.bn == 0));
    let counts = vec![15, 16, 17, 31, 0, 33, 64, 65, 1, 100];
    for gather in [false, true] {
        let x = Case { n: 768, k: 224, counts: counts.clone(), gather }.inputs(5 + u64::from(gather));
        let mut first: Option<(String, Vec<f32>)> = None;
        for &tile in &tiles {
            for path in [WPath::Staged, WPath::Direct, WPath::Single].into_iter().filter(|&path| coop_grouped_gemm::runs(tile, path)) {
                let got = run_tile(&ctx, &mut pipelines, tile, path, &x);
                let label = format!("tile {} {path:?} gather {gather}", tile.label());
                match &first {
                    None => first = Some((label, got)),
                    Some((base, bits)) => {
                        let at = bits.iter().zip(&got).position(|(a, b)| a.to_bits() != b.to_bits());
                        assert!(at.is_none(), "{label}: other bits than {base} at output {at:?}");
                    }
                }
            }
        }
    }
}

/// The real geometry's expert products (gate_up: 1408 × 2816 with gather; down: 2816 × 704), every
/// 13th slot checked against the exact product (`cargo xtask probe
/// coop_grouped_gemm_throughput_at_the_real_expert_shapes` times them).
#[test]
fn coop_grouped_gemm_matches_at_the_real_expert_shapes() {
    let test = "coop_grouped_gemm_matches_at_the_real_expert_shapes";
    let Some(ctx) = coop_test_context(test) else { return };
    let mut pipelines = Pipelines::default();
    let counts = real_counts(99);
    // The test's gate/up weights are one binding of 1 GB (the forward splits them; this kernel
    // test does not): a device that binds less (lavapipe, 128 MiB) runs the other tests only.
    let gate_up_bytes = counts.len() as u64 * 1408 * 2816 * 2;
    if gate_up_bytes > ctx.max_binding() {
        eprintln!("SKIP {test}: its {gate_up_bytes}-byte weight binding passes the adapter's {}", ctx.max_binding());
        return;
    }
    for (name, n, k, gather) in [("gate_up", 1408, 2816, true), ("down", 2816, 704, false)] {
        let case = Case { n, k, counts: counts.clone(), gather };
        let x = case.inputs(40 + n as u64);
        let got = run_grouped(&ctx, &mut pipelines, &x);
        let pick = |s: usize| s.is_multiple_of(13);
        let want = grouped_reference(&x, pick);
        check(&got, &want, &x, pick, &format!("real {name}"));
    }
}

/// K and V of a sliding layer in one batched dispatch (the real shape: 256 × 2048 × 2816, two
/// batches) and a small one, against the exact product; C's batches sit `c_stride` apart with a
/// gap that must keep its values.
#[test]
fn batched_coop_linear_matches_the_exact_product() {
    let test = "batched_coop_linear_matches_the_exact_product";
    let Some(ctx) = coop_test_context(test) else { return };
    let mut pipelines = Pipelines::default();
    for (m, n, k) in [(256usize, 2048usize, 2816usize), (64, 32, 64)] {
        let x = seeded(m * k, 5, 1.0);
        let w = f16_round(&seeded(2 * n * k, 6, 1.0));
        let c_stride = m * n + 8;
        let len = 2 * c_stride;
        let xb = ctx.upload("x", &x).unwrap();
        let wb = ctx.upload("w", &dg_kernels::pack_f16(&w)).unwrap();
        let cb = guarded_output(&ctx, "c", len);
        let mut rec = Recorder::new(&ctx, &mut pipelines);
        let batches = Batches { count: 2, x_stride: 0, w_stride: (n * k) as u32, c_stride: c_stride as u32 };
        rec.product(&xb, Operand::stored(&wb, WeightFormat::F16), &cb, batches.linear(m, n, k), true).unwrap();
        rec.finish().unwrap().run(&ctx).unwrap();
        let got = read_guarded(&ctx, &cb, len);
        let x16 = f16_round(&x);
        for b in 0..2 {
            let gap = &got[b * c_stride + m * n..(b + 1) * c_stride];
            assert!(gap.iter().all(|&v| v == GUARD), "{m}x{n}x{k}: batch {b}: the gap after C was written");
            let mut want = vec![0f32; m * n];
            for i in (0..m).step_by(if m > 64 { 7 } else { 1 }) {
                for j in 0..n {
                    let sum: f64 = (0..k).map(|q| f64::from(x16[i * k + q]) * f64::from(w[b * n * k + j * k + q])).sum();
                    want[i * n + j] = sum as f32;
                }
            }
            let rows: Vec<usize> = (0..m).step_by(if m > 64 { 7 } else { 1 }).collect();
            let g: Vec<f32> = rows.iter().flat_map(|&i| got[b * c_stride + i * n..b * c_stride + (i + 1) * n].to_vec()).collect();
            let wv: Vec<f32> = rows.iter().flat_map(|&i| want[i * n..(i + 1) * n].to_vec()).collect();
            let (err, at) = max_rel_err(&g, &wv);
            assert!(err <= tolerance(k), "{m}x{n}x{k}: batch {b}: rel err {err} at {at}: got {} want {}", g[at], wv[at]);
        }
    }
}

/// The tied head on the tensor cores (`Recorder::product` on `ops::head_params` in the F16 mode): one vocabulary
/// chunk of the logits, softcapped, written at its column offset of rows `c_rs` apart, from F16
/// and from BF16 weights (BF16 values in f16's normal range convert exactly), against
/// `cap·tanh(exact / cap)` of the f16-rounded operands. The columns of other chunks keep their
/// guard values.
#[test]
fn head_linear_on_tensor_cores_matches_the_exact_softcapped_product() {
    let test = "head_linear_on_tensor_cores_matches_the_exact_softcapped_product";
    let Some(ctx) = coop_test_context(test) else { return };
    let mut pipelines = Pipelines::default();
    let (m, n, k, c_rs, c_offset, cap) = (64usize, 256usize, 128usize, 512usize, 128usize, 3.0f32);
    let x = seeded(m * k, 11, 1.0);
    let x16 = f16_round(&x);
    for format in [WeightFormat::F16, WeightFormat::Bf16] {
        let w: Vec<f32> = seeded(n * k, 12, 0.5).iter().map(|&v| half::bf16::from_f32(v).to_f32()).collect();
        let packed = if format == WeightFormat::F16 { dg_kernels::pack_f16(&w) } else { dg_kernels::pack_bf16(&w) };
        let xb = ctx.upload("x", &x).unwrap();
        let wb = ctx.upload("w", &packed).unwrap();
        let cb = guarded_output(&ctx, "logits", m * c_rs);
        let mut rec = Recorder::new(&ctx, &mut pipelines);
        rec.product(
            &xb,
            Operand::stored(&wb, format),
            &cb,
            head_params((m, n, k), (c_rs, c_offset), Some(cap)),
            format != WeightFormat::F32,
        )
        .unwrap();
        rec.finish().unwrap().run(&ctx).unwrap();
        let got = read_guarded(&ctx, &cb, m * c_rs);
        let w16 = f16_round(&w);
        assert_eq!(w16, w, "BF16 test weights in f16's normal range convert exactly");
        let (mut g, mut want) = (Vec::new(), Vec::new());
        for i in 0..m {
            for col in 0..c_rs {
                let v = got[i * c_rs + col];
                if col < c_offset || col >= c_offset + n {
                    assert_eq!(v, GUARD, "{format:?}: row {i} column {col} outside the chunk was written");
                    continue;
                }
                let j = col - c_offset;
                let dot: f64 = (0..k).map(|q| f64::from(x16[i * k + q]) * f64::from(w16[j * k + q])).sum();
                g.push(v);
                want.push((f64::from(cap) * (dot / f64::from(cap)).tanh()) as f32);
            }
        }
        assert!(want.iter().any(|v| v.abs() > 0.9 * cap), "the softcap is exercised");
        let (err, at) = max_rel_err(&g, &want);
        let tol = tolerance(k) + TANH_ALLOWANCE;
        assert!(err <= tol, "{format:?}: rel err {err} > {tol} at {at}: got {} want {}", g[at], want[at]);
    }
}

/// Attention's products on the tensor cores (`Recorder::product` in the F16 mode, f32 operands
/// rounded to f16 when staged): scores over a GQA cache (`[n][k]` keys from a row offset, written
/// at a column offset, scaled: the epilogue path), values (`[k][n]` from a row offset, read from a
/// column offset of the probabilities, accumulated onto C), ragged columns (a tensor-core body and
/// an f32 tail), each against `gemm_reference` on the f16-rounded operands, over the whole C buffer
/// (what the product must not touch included).
#[test]
fn strided_attention_products_on_tensor_cores_match_the_reference() {
    use dg_kernels::gemm::GemmParams;
    use dg_parity::testing::{attention_scores_params, attention_values_params, gemm_extent, gemm_reference};
    let test = "strided_attention_products_on_tensor_cores_match_the_reference";
    let Some(ctx) = coop_test_context(test) else { return };
    let mut pipelines = Pipelines::default();
    let (t, s, d, heads, kv) = (64u32, 128u32, 64u32, 4u32, 2u32);
    let row = kv * d;
    let cases: [(&str, GemmParams); 4] = [
        // A sliding layer sees W − 1 cached keys: 127 here, a 96-column body and a 31-column tail.
        ("ragged scores", GemmParams { b_offset: 4 * row, ..attention_scores_params(t, 127, d, heads, kv, 1.0) }),
        (
            "scores",
            GemmParams {
                b_offset: 4 * row,
                c_offset: 64,
                c_rs: s + 64,
                c_batch: t * (s + 64),
                ..attention_scores_params(t, s, d, heads, kv, 1.0)
            },
        ),
        ("scaled scores", GemmParams { b_offset: 8 * row, ..attention_scores_params(t, s, d, heads, kv, 0.125) }),
        (
            "values, accumulated",
            GemmParams {
                a_offset: 32,
                a_rs: s + 32,
                a_batch: t * (s + 32),
                b_offset: 4 * row,
                accumulate: 1,
                ..attention_values_params(t, s, d, heads, kv)
            },
        ),
    ];
    for (name, p) in cases {
        let body = GemmParams { n: p.n / 32 * 32, ..p };
        assert!(dg_gpu::planner::coop_dense::plan(&body).is_some(), "{name}: meant for the tensor cores");
        let a_len = gemm_extent(p.a_offset, p.batch, p.a_batch, p.m, p.a_rs, p.k, p.a_cs);
        let b_len = gemm_extent(p.b_offset, p.batch.div_ceil(p.b_batch_div), p.b_batch, p.k, p.b_rs, p.n, p.b_cs);
        let c_len = gemm_extent(p.c_offset, p.batch, p.c_batch, p.m, p.c_rs, p.n, 1);
        let a = f16_round(&seeded(a_len, 31, 1.0));
        let b = f16_round(&seeded(b_len, 32, 1.0));
        let c0 = seeded(c_len, 33, 2.0);
        let got = f32_product_on_tensor_cores(&ctx, &mut pipelines, p, &a, &b, &c0);
        let want = gemm_reference(&p, &a, &b, &c0);
        let (err, at) = max_rel_err(&got, &want);
        let tol = tolerance(p.k as usize);
        assert!(err <= tol, "{name}: rel err {err} > {tol} at {at}: got {} want {}", got[at], want[at]);
        // The same K or V from an f16 cache (`DG_KV_CACHE`): the tensor cores stage the f32
        // cache's values rounded to f16, which these already are, so the same bits.
        let mut halves: Vec<u16> = b.iter().map(|&x| half::f16::from_f32(x).to_bits()).collect();
        halves.resize(halves.len().next_multiple_of(2), 0);
        let b16 = ctx.upload("b f16", &halves).unwrap();
        let ab = ctx.upload("a", &a).unwrap();
        let cb = guarded_output(&ctx, "c", c0.len());
        ctx.queue.write_buffer(&cb, 0, bytemuck::cast_slice(&c0));
        let mut rec = Recorder::new(&ctx, &mut pipelines);
        rec.product(&ab, dg_gpu::ops::Operand::kv_cache(&b16, WeightFormat::F16), &cb, p, true).unwrap();
        rec.finish().unwrap().run(&ctx).unwrap();
        let from_f16 = read_guarded(&ctx, &cb, c0.len());
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert!(bits(&from_f16) == bits(&got), "{name}: B from an f16 cache differs from the f32 cache's product");
    }
}

/// The encoder's causal attention products on the tensor cores (`GemmParams::causal_n`,
/// `causal_k`): 256 queries over 384 keys, 4 heads on 2 KV heads. Scores with query `i` seeing
/// keys `j < i + causal_n` match `gemm_reference` wherever seen (from position 0, and 96 keys
/// later), and the tiles wholly past every row's keys are skipped: row 0's key 383 keeps C's old
/// value. Values over probabilities that are 0 past `i + causal_k` (from position 0) match the
/// reference on the same probabilities and on V whose rows past the last query's keys are zeros,
/// where the GPU's V holds NaN there: a product that read those rows would not be finite.
#[test]
fn causal_attention_products_on_tensor_cores_skip_the_masked_keys() {
    use dg_kernels::gemm::GemmParams;
    use dg_parity::testing::{attention_scores_params, attention_values_params, gemm_extent, gemm_reference};
    let test = "causal_attention_products_on_tensor_cores_skip_the_masked_keys";
    let Some(ctx) = coop_test_context(test) else { return };
    let mut pipelines = Pipelines::default();
    let (t, s, d, heads, kv) = (256u32, 384u32, 64u32, 4u32, 2u32);
    for causal in [1u32, 97] {
        let p = GemmParams { causal_n: causal, ..attention_scores_params(t, s, d, heads, kv, 1.0) };
        let a = f16_round(&seeded(gemm_extent(0, p.batch, p.a_batch, p.m, p.a_rs, p.k, p.a_cs), 41, 1.0));
        let b = f16_round(&seeded(gemm_extent(0, p.batch.div_ceil(p.b_batch_div), p.b_batch, p.k, p.b_rs, p.n, p.b_cs), 42, 1.0));
        let c0 = seeded(gemm_extent(0, p.batch, p.c_batch, p.m, p.c_rs, p.n, 1), 43, 2.0);
        assert!(dg_gpu::planner::coop_dense::plan(&p).is_some(), "meant for the tensor cores: {p:?}");
        let got = f32_product_on_tensor_cores(&ctx, &mut pipelines, p, &a, &b, &c0);
        let want = gemm_reference(&GemmParams { causal_n: 0, ..p }, &a, &b, &c0);
        let tol = tolerance(p.k as usize);
        for h in 0..heads as usize {
            for i in 0..t as usize {
                for j in 0..(i + causal as usize).min(s as usize) {
                    let at = h * (t * s) as usize + i * s as usize + j;
                    let err = (got[at] - want[at]).abs() / want[at].abs().max(1.0);
                    assert!(err <= tol, "scores, causal {causal}: head {h} query {i} key {j}: got {} want {}", got[at], want[at]);
                }
            }
        }
        if causal == 1 {
            let at = (s - 1) as usize;
            assert_eq!(got[at].to_bits(), c0[at].to_bits(), "scores, causal 1: row 0's key {} was computed", s - 1);
        }
    }
    let causal = 1u32;
    let p = GemmParams { causal_k: causal, ..attention_values_params(t, s, d, heads, kv) };
    let mut probs = f16_round(&seeded(gemm_extent(0, p.batch, p.a_batch, p.m, p.a_rs, p.k, p.a_cs), 44, 1.0));
    for (r, row) in probs.chunks_mut(s as usize).enumerate() {
        let i = r % t as usize;
        row[i + causal as usize..].fill(0.0);
    }
    let v = f16_round(&seeded(gemm_extent(0, p.batch.div_ceil(p.b_batch_div), p.b_batch, p.k, p.b_rs, p.n, p.b_cs), 45, 1.0));
    let live = ((t + causal - 1) * p.b_rs) as usize;
    let (mut v_nan, mut v_zero) = (v.clone(), v);
    v_nan[live..].fill(f32::NAN);
    v_zero[live..].fill(0.0);
    let c0 = seeded(gemm_extent(0, p.batch, p.c_batch, p.m, p.c_rs, p.n, 1), 46, 2.0);
    assert!(dg_gpu::planner::coop_dense::plan(&p).is_some(), "meant for the tensor cores: {p:?}");
    let got = f32_product_on_tensor_cores(&ctx, &mut pipelines, p, &probs, &v_nan, &c0);
    let want = gemm_reference(&GemmParams { causal_k: 0, ..p }, &probs, &v_zero, &c0);
    let (err, at) = max_rel_err(&got, &want);
    let tol = tolerance(p.k as usize);
    assert!(err <= tol, "values, causal {causal}: rel err {err} > {tol} at {at}: got {} want {}", got[at], want[at]);
}

/// Runs `p` through `Recorder::product` in the F16 mode's way (f32 operands, rounded to f16 by
/// the tensor cores) on `a`, `b` and C holding `c0` (a guarded output), and returns C.
fn f32_product_on_tensor_cores(
    ctx: &GpuContext,
    pipelines: &mut Pipelines,
    p: dg_kernels::gemm::GemmParams,
    a: &[f32],
    b: &[f32],
    c0: &[f32],
) -> Vec<f32> {
    let (ab, bb) = (ctx.upload("a", a).unwrap(), ctx.upload("b", b).unwrap());
    let cb = guarded_output(ctx, "c", c0.len());
    ctx.queue.write_buffer(&cb, 0, bytemuck::cast_slice(c0));
    let mut rec = Recorder::new(ctx, pipelines);
    rec.product(&ab, Operand::kv_cache(&bb, WeightFormat::F32), &cb, p, true).unwrap();
    rec.finish().unwrap().run(ctx).unwrap();
    read_guarded(ctx, &cb, c0.len())
}

/// Runs `p` through `Recorder::product` on the tensor cores (with a split-K scratch) on seeded
/// f16-exact operands, B stored as `format` in rows; asserts that the plan dispatched the kernel
/// the device's planner chooses (and the reduction where it splits K) and compares the whole C
/// buffer with `gemm_reference`. Returns whether it split K.
fn check_gemm_auto(
    ctx: &GpuContext,
    pipelines: &mut Pipelines,
    scratch: &wgpu::Buffer,
    name: &str,
    format: WeightFormat,
    p: dg_kernels::gemm::GemmParams,
) -> bool {
    use dg_parity::testing::{gemm_extent, gemm_reference};
    let (expect, splits) = planned_as(ctx, format, MatrixLayout::RowMajor, &p, scratch.size() / 4);
    let bf16_round = |v: &[f32]| -> Vec<f32> { v.iter().map(|&x| half::bf16::from_f32(x).to_f32()).collect() };
    let a_len = gemm_extent(p.a_offset, p.batch, p.a_batch, p.m, p.a_rs, p.k, p.a_cs);
    let b_len = gemm_extent(p.b_offset, p.batch.div_ceil(p.b_batch_div), p.b_batch, p.k, p.b_rs, p.n, p.b_cs);
    let c_len = gemm_extent(p.c_offset, p.batch, p.c_batch, p.m, p.c_rs, p.n, 1);
    let a = f16_round(&seeded(a_len, 61, 1.0));
    let b = f16_round(&bf16_round(&seeded(b_len, 62, 1.0)));
    let c0 = seeded(c_len, 63, 2.0);
    let packed = if format == WeightFormat::F16 { dg_kernels::pack_f16(&b) } else { dg_kernels::pack_bf16(&b) };
    let ab = ctx.upload("a", &a).unwrap();
    let bb = ctx.upload("b", &packed).unwrap();
    let cb = guarded_output(ctx, "c", c_len);
    ctx.queue.write_buffer(&cb, 0, bytemuck::cast_slice(&c0));
    let mut rec = Recorder::new(ctx, pipelines);
    rec.split_k_scratch(scratch);
    rec.product(&ab, Operand::stored(&bb, format), &cb, p, true).unwrap();
    let plan = rec.finish().unwrap();
    let names = plan.kernel_names();
    assert!(
        names.contains(&expect.as_str()) && names.contains(&"split_k_reduce") == splits,
        "{name}: {expect} (split K: {splits}), got {names:?}"
    );
    plan.run(ctx).unwrap();
    let got = read_guarded(ctx, &cb, c_len);
    let want = gemm_reference(&p, &a, &b, &c0);
    let (err, at) = max_rel_err(&got, &want);
    let tol = tolerance(p.k as usize) + if p.epilogue == dg_kernels::gemm::EPILOGUE_SOFTCAP { TANH_ALLOWANCE } else { 0.0 };
    assert!(err <= tol, "{name}: rel err {err} > {tol} at {at}: got {} want {}", got[at], want[at]);
    splits
}

/// Split K through the Recorder (`Recorder::product` with a split-K scratch): products with few
/// tiles run K in ranges whose partials `dg_kernels::split_k` adds with the product's own epilogue.
/// The router's shape (8 tiles, F16 `W[n][k]`), a softcapped head chunk at a column offset (BF16),
/// the soft embedding's `[k][n]` BF16 product read from a column offset of the probabilities,
/// scaled and accumulated onto C, and a batched GQA product whose K does not divide evenly into the
/// splits (89 K steps in 18 splits of 5, the last of 4), each against `gemm_reference` on the
/// f16-rounded operands over the whole C buffer.
#[test]
fn split_k_products_on_tensor_cores_match_the_reference() {
    use dg_kernels::gemm::{EPILOGUE_SOFTCAP, GemmParams};
    let test = "split_k_products_on_tensor_cores_match_the_reference";
    let Some(ctx) = coop_test_context(test) else { return };
    let mut pipelines = Pipelines::default();
    let cases: [(&str, WeightFormat, GemmParams); 4] = [
        ("router", WeightFormat::F16, GemmParams::linear(256, 128, 2816)),
        (
            "softcapped head chunk",
            WeightFormat::Bf16,
            GemmParams { c_rs: 192, c_offset: 64, epilogue: EPILOGUE_SOFTCAP, cap: 3.0, ..GemmParams::linear(64, 64, 1024) },
        ),
        (
            "soft embedding",
            WeightFormat::Bf16,
            GemmParams { a_offset: 512, a_rs: 4096, b_rs: 128, b_cs: 1, alpha: 0.5, accumulate: 1, ..GemmParams::new(64, 128, 2048) },
        ),
        (
            "batched GQA, uneven splits",
            WeightFormat::F16,
            GemmParams {
                batch: 4,
                a_batch: 64 * 2848,
                b_batch: 64 * 2848,
                b_batch_div: 2,
                c_rs: 72,
                c_batch: 64 * 72,
                ..GemmParams::linear(64, 64, 2848)
            },
        ),
    ];
    let scratch = ctx.storage_buffer("split partials", 16 << 20).unwrap();
    for (name, format, p) in cases {
        assert!(check_gemm_auto(&ctx, &mut pipelines, &scratch, name, format, p), "{name}: did not split K");
    }
}

/// Stacked `[n, k]` F16 matrices (`w` holds whole blocks) uploaded as the F16 mode uploads a
/// projection on a tensor-core device: each block in K panels.
fn panelled_projection(ctx: &GpuContext, w: &[f32], n: usize, k: usize) -> GpuMatrix {
    use dg_kernels::coop_grouped_gemm::{PANEL, pack_f16_panels};
    let packed: Vec<u32> = w.chunks_exact(n * k).flat_map(|block| pack_f16_panels(block, n, k, PANEL as usize)).collect();
    GpuMatrix { buffer: ctx.upload("w", &packed).unwrap(), format: WeightFormat::F16, layout: MatrixLayout::KPanels }
}

/// The kernel the device's planner runs `p` on (W: F16 in K panels, `scratch` f32 elements of
/// split-K scratch), and whether it splits K: what the Recorder must record.
fn planned_on(ctx: &GpuContext, p: &dg_kernels::gemm::GemmParams, scratch: u64) -> (String, bool) {
    planned_as(ctx, WeightFormat::F16, MatrixLayout::KPanels, p, scratch)
}

/// [`planned_on`] with W stored as `format` in `layout`.
fn planned_as(
    ctx: &GpuContext,
    format: WeightFormat,
    layout: MatrixLayout,
    p: &dg_kernels::gemm::GemmParams,
    scratch: u64,
) -> (String, bool) {
    use dg_gpu::planner::Dense;
    match ctx.planner().dense(format, layout, p, true, Some(scratch)) {
        Ok(Dense::TensorCores(plan)) => (dg_kernels::KernelKey::CoopGemm(plan.kernel).source().name, plan.split.is_some()),
        other => panic!("m {} n {} k {}: not on the tensor cores: {other:?}", p.m, p.n, p.k),
    }
}

/// Dense projections uploaded in K panels (`MatrixLayout::KPanels`, the F16 mode's q, K/V, o, MLPs
/// and router on a device with cooperative matrices) through `Recorder::product`, against
/// `gemm_reference` on the row-major f16-rounded operands over the whole C buffer: q_proj's real
/// shape; K and V as two batches of one stacked matrix, each block in its own panels; the router's
/// shape, which splits K; and encoder chunks whose rows do not fill the last m tile (77 rows,
/// 1000 in split K on the H200), whose extra rows must not be stored. The Recorder runs the
/// kernel the device's planner chooses (on the H200 the tiles `tests/planner.rs`
/// `kernel_tests_shapes_take_the_h200s_tiles` names).
#[test]
fn panelled_projections_match_the_exact_product() {
    use dg_kernels::gemm::GemmParams;
    let test = "panelled_projections_match_the_exact_product";
    let Some(ctx) = coop_test_context(test) else { return };
    let mut pipelines = Pipelines::default();
    let scratch = ctx.storage_buffer("split partials", 16 << 20).unwrap();
    let kv =
        |m: u32, n: u32, k: u32| GemmParams { batch: 2, a_batch: 0, b_batch: n * k, c_batch: m * n + 8, ..GemmParams::linear(m, n, k) };
    let cases: [(&str, GemmParams); 5] = [
        ("q_proj", GemmParams::linear(256, 4096, 2816)),
        ("K and V stacked", kv(256, 256, 512)),
        ("router, split K", GemmParams::linear(256, 128, 2816)),
        ("ragged chunk", GemmParams::linear(77, 256, 512)),
        ("ragged batched chunk", kv(1000, 128, 256)),
    ];
    for (name, p) in cases {
        let (expect, splits) = planned_on(&ctx, &p, (16 << 20) / 4);
        let (m, n, k) = (p.m as usize, p.n as usize, p.k as usize);
        let blocks = p.batch.max(1) as usize;
        let c_len = dg_parity::testing::gemm_extent(p.c_offset, p.batch, p.c_batch, p.m, p.c_rs, p.n, 1);
        let a = seeded(m * k, 71, 1.0);
        let w = f16_round(&seeded(blocks * n * k, 72, 1.0));
        let c0 = seeded(c_len, 73, 2.0);
        let matrix = panelled_projection(&ctx, &w, n, k);
        let ab = ctx.upload("a", &a).unwrap();
        let cb = guarded_output(&ctx, "c", c_len);
        ctx.queue.write_buffer(&cb, 0, bytemuck::cast_slice(&c0));
        let mut rec = Recorder::new(&ctx, &mut pipelines);
        rec.split_k_scratch(&scratch);
        rec.product(&ab, &matrix, &cb, p, matrix.format == WeightFormat::F16).unwrap();
        let plan = rec.finish().unwrap();
        let names = plan.kernel_names();
        assert!(
            names.contains(&expect.as_str()) && names.contains(&"split_k_reduce") == splits,
            "{name}: expected {expect} (split K: {splits}), got {names:?}"
        );
        plan.run(&ctx).unwrap();
        let got = read_guarded(&ctx, &cb, c_len);
        let want = dg_parity::testing::gemm_reference(&p, &f16_round(&a), &w, &c0);
        let (err, at) = max_rel_err(&got, &want);
        assert!(err <= tolerance(k), "{name}: rel err {err} > {} at {at}: got {} want {}", tolerance(k), got[at], want[at]);
    }
}

/// `Recorder::product_to_consumer` on a product that splits K (W in K panels: q_proj's real shape,
/// which splits on the H200's 128 × 128 tiles, and the router's, which splits on every device's)
/// leaves its partials to the consumer: no reduction is recorded, the product view has more than
/// one split, and an RMSNorm reading the partials gives the same bits as one reading the product
/// that `Recorder::product` reduces.
#[test]
fn linear_product_leaves_split_partials_to_their_consumer() {
    let test = "linear_product_leaves_split_partials_to_their_consumer";
    let Some(ctx) = coop_test_context(test) else { return };
    let mut pipelines = Pipelines::default();
    let scratch = ctx.storage_buffer("split partials", 16 << 20).unwrap();
    let mut split = 0;
    for (name, m, n, k) in [("q_proj", 256usize, 4096usize, 2816usize), ("router", 256, 128, 2816)] {
        if !planned_on(&ctx, &linear_params(m, n, k), (16 << 20) / 4).1 {
            assert!(name != "router", "{test}: the router's shape does not split on {}", ctx.info.name);
            eprintln!("  {test}: {name}'s shape does not split on {}", ctx.info.name);
            continue;
        }
        split += 1;
        let a = ctx.upload("a", &seeded(m * k, 81, 1.0)).unwrap();
        let w = f16_round(&seeded(n * k, 82, 1.0));
        let matrix = panelled_projection(&ctx, &w, n, k);
        let norm_w = ctx.upload("norm", &seeded(n, 83, 1.0)).unwrap();
        let product = ctx.storage_buffer("product", (m * n * 4) as u64).unwrap();
        let mut outputs = Vec::new();
        for deferred in [false, true] {
            let out = guarded_output(&ctx, "normed", m * n);
            let mut rec = Recorder::new(&ctx, &mut pipelines);
            rec.split_k_scratch(&scratch);
            if deferred {
                let view = rec.product_to_consumer(&a, &matrix, &product, linear_params(m, n, k), true).unwrap();
                assert!(view.splits > 1, "{test}: {name}'s shape did not split ({} splits)", view.splits);
                rec.rmsnorm(view, Some(&norm_w), &norm_w, &out, m, n, 1e-6, false, 1.0).unwrap();
            } else {
                rec.product(&a, &matrix, &product, linear_params(m, n, k), true).unwrap();
                rec.rmsnorm(&product, Some(&norm_w), &norm_w, &out, m, n, 1e-6, false, 1.0).unwrap();
            }
            let plan = rec.finish().unwrap();
            assert_eq!(plan.kernel_names().contains(&"split_k_reduce"), !deferred, "{test}: {name}: {:?}", plan.kernel_names());
            plan.run(&ctx).unwrap();
            outputs.push(read_guarded(&ctx, &out, m * n));
        }
        let first = outputs[0].iter().zip(&outputs[1]).position(|(x, y)| x.to_bits() != y.to_bits());
        assert!(first.is_none(), "{test}: {name}: the consumer of the partials differs at {first:?}");
    }
    assert!(split > 0, "{test}: no shape split");
}

/// A matrix in K panels is read only by the tensor cores: a product no tile takes (k not a whole
/// number of panels, or B strides that are not the whole matrix's) is a clear error naming the
/// shape, never a silent row-major read. Runs on every adapter: without cooperative matrices no
/// tile takes any product.
#[test]
fn panelled_matrix_refuses_products_no_tile_takes() {
    use dg_kernels::gemm::GemmParams;
    let test = "panelled_matrix_refuses_products_no_tile_takes";
    let Some(ctx) = dg_parity::testing::test_context(test) else { return };
    let mut pipelines = Pipelines::default();
    let matrix =
        GpuMatrix { buffer: ctx.upload("w", &vec![0u32; 64 * 48]).unwrap(), format: WeightFormat::F16, layout: MatrixLayout::KPanels };
    let ab = ctx.upload("a", &vec![0f32; 64 * 96]).unwrap();
    let cb = ctx.upload("c", &vec![0f32; 64 * 64]).unwrap();
    for p in [GemmParams::linear(64, 64, 48), GemmParams { b_cs: 96, ..GemmParams::linear(64, 32, 48) }] {
        let mut rec = Recorder::new(&ctx, &mut pipelines);
        let err = rec
            .product(&ab, &matrix, &cb, p, matrix.format == WeightFormat::F16)
            .expect_err("a panelled product no tile takes must fail")
            .to_string();
        assert!(err.contains("K panels") && err.contains(&format!("k {}", p.k)), "{err}");
    }
}

/// Deeper prefetch rings (`dg_kernels::coop_kloop`) add the same products in the same order: the
/// dense kernel gives the same bits at every depth and with either naming of its stages
/// (`coop_kloop::Stages`: constant stages double the passes of odd rings), on every path (staged,
/// direct and single-staged give the same bits too), in either ring (`coop_kloop::Ring`), whole and in K splits, with a partial last m
/// tile, and K steps (7, or 3 and 4 a split) fewer than some rings and no multiple of any ring's
/// length.
#[test]
fn deeper_prefetch_gives_the_same_bits_in_dense_products() {
    use dg_kernels::coop_gemm::{self, AFormat, BLayout, Split};
    use dg_kernels::coop_kloop::Ring;
    use dg_kernels::gemm::GemmParams;
    let test = "deeper_prefetch_gives_the_same_bits_in_dense_products";
    let Some(ctx) = coop_test_context(test) else { return };
    let mut pipelines = Pipelines::default();
    let p = GemmParams::linear(200, 256, 224);
    let a = ctx.upload("a", &seeded((p.m * p.k) as usize, 81, 1.0)).unwrap();
    let b = ctx.upload("b", &dg_kernels::pack_f16(&seeded((p.n * p.k) as usize, 82, 1.0))).unwrap();
    let scratch = ctx.storage_buffer("split partials", 1 << 20).unwrap();
    let c = ctx.storage_buffer("c", u64::from(p.m * p.n) * 4).unwrap();
    let reduce = pipelines.get_source(&ctx, dg_kernels::split_k::source()).unwrap();
    for tile in [coop_gemm::TILE_128X128, coop_gemm::TILE_64X64] {
        for split in [Split { splits: 1, steps: 7 }, Split { splits: 2, steps: 4 }] {
            let mut first: Option<Vec<f32>> = None;
            for (path, ring) in [
                (WPath::Staged, Ring::Staggered),
                (WPath::Direct, Ring::Staggered),
                (WPath::Single, Ring::Staggered),
                (WPath::Staged, Ring::Batched),
                (WPath::Single, Ring::Batched),
            ] {
                let depths = 1..=dg_kernels::coop_kloop::MAX_DEPTH;
                for (depth, stages) in depths.flat_map(|d| coop_gemm::Stages::ALL.map(|s| (d, s))) {
                    if path == WPath::Single && stages != coop_gemm::Stages::Alternating {
                        continue; // one stage, nothing to name: the same kernel as alternating
                    }
                    let t = tile.with_depth(depth).with_stages(stages).on_path(path);
                    let source = coop_gemm::source_for_ring(on_device(&ctx, t), path, WeightFormat::F16, BLayout::Nk, AFormat::F32, ring);
                    let kernel = pipelines.get_source(&ctx, source).unwrap();
                    let mut plan = dg_gpu::PlanBuilder::new(&ctx);
                    push_product(&mut plan, (&kernel, &reduce), t, &p, split, [&a, &b, &scratch, &c]);
                    plan.finish(&ctx).unwrap().run(&ctx).unwrap();
                    let got = ctx.read_f32(&c, 0, (p.m * p.n) as usize).unwrap();
                    match &first {
                        None => first = Some(got),
                        Some(want) => {
                            assert!(
                                &got == want,
                                "{} {path:?} {ring:?} {split:?}: other bits than staged at depth 1, alternating stages",
                                t.label()
                            )
                        }
                    }
                }
            }
        }
    }
}

/// Large products through the Recorder, on the kernel the device's planner chooses: a head-like
/// product (BF16, softcapped, at a column offset; on the H200 512 tiles of 128×128) and a long
/// `[k][n]` product (the soft embedding's shape with K = 16384: 512 steps; on the H200 split
/// towards `LONG_K_TARGET_WORKGROUPS`; `tests/planner.rs` `kernel_tests_shapes_take_the_h200s_tiles`).
/// Both against `gemm_reference` over the whole C buffer.
#[test]
fn large_and_long_products_on_tensor_cores_match_the_reference() {
    use dg_kernels::gemm::{EPILOGUE_SOFTCAP, GemmParams};
    let test = "large_and_long_products_on_tensor_cores_match_the_reference";
    let Some(ctx) = coop_test_context(test) else { return };
    let mut pipelines = Pipelines::default();
    let scratch = ctx.storage_buffer("split partials", 64 << 20).unwrap();
    let head = GemmParams { c_rs: 32768 + 64, c_offset: 32, epilogue: EPILOGUE_SOFTCAP, cap: 3.0, ..GemmParams::linear(256, 32768, 64) };
    check_gemm_auto(&ctx, &mut pipelines, &scratch, "head-like", WeightFormat::Bf16, head);
    let soft =
        GemmParams { a_offset: 32, a_rs: 16384 + 64, b_rs: 256, b_cs: 1, alpha: 0.5, accumulate: 1, ..GemmParams::new(128, 256, 16384) };
    check_gemm_auto(&ctx, &mut pipelines, &scratch, "long soft embedding", WeightFormat::Bf16, soft);
}

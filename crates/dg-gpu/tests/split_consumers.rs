//! The kernels that read a split-K product's partials themselves (`ops::Product`,
//! `dg_kernels::split_k::with_reader`): `rmsnorm`, `norm_rope`, `attention_residual_norms`,
//! `ffn_residual_norms`, `gelu_glu_fused` and `router_topk`, each run once on a product written whole and once on three partials of it
//! (`split_stride` apart, with a gap between them), must give the same bits. The whole product is
//! the partials added in split order from 0 in f32, which is what the split-K reduction stores, so
//! a consumer reading the partials computes exactly what it computes after the reduction.
//!
//! On the GPU forward the partials come from the tensor-core GEMM's splits (devices with
//! cooperative matrices); these tests hand-make them, so they run on every adapter.

use dg_gpu::Pipelines;
use dg_gpu::ops::{Product, Recorder};
use dg_parity::testing::{guarded_output, read_guarded, seeded, test_context};

const SPLITS: u32 = 3;

/// `len` values as `SPLITS` partials `stride = len + 8` apart (the gap holds values that must
/// never be read: huge ones), and their sum in split order from 0. The stride stays a multiple of
/// 4 when `len` is one, as a GEMM's partials are (`batch · m · n`), so that the norms read them
/// four columns at a time as they read the whole product.
fn partials(len: usize, seed: u64) -> (Vec<f32>, u32, Vec<f32>) {
    let stride = len + 8;
    let mut parts = vec![1e30f32; SPLITS as usize * stride];
    let mut whole = vec![0f32; len];
    for z in 0..SPLITS as usize {
        let part = seeded(len, seed + z as u64, 1.0);
        parts[z * stride..z * stride + len].copy_from_slice(&part);
        for (w, p) in whole.iter_mut().zip(&part) {
            *w += p;
        }
    }
    (parts, stride as u32, whole)
}

/// Runs `record` once with the whole product and once with its partials; returns both outputs
/// (each read back by `read`).
fn both<R>(
    test: &str,
    len: usize,
    record: impl for<'a> Fn(&mut Recorder<'a>, Product<'a>, &'a Outputs),
    outputs: impl Fn(&dg_gpu::GpuContext) -> Outputs,
    read: impl Fn(&dg_gpu::GpuContext, &Outputs) -> R,
) -> Option<(R, R)> {
    let ctx = test_context(test)?;
    let mut pipelines = Pipelines::default();
    let (parts, stride, whole) = partials(len, 17);
    let parts = ctx.upload("partials", &parts).unwrap();
    let whole = ctx.upload("whole", &whole).unwrap();
    let mut run = |product: Product<'_>| {
        let out = outputs(&ctx);
        let mut rec = Recorder::new(&ctx, &mut pipelines);
        record(&mut rec, product, &out);
        rec.finish().unwrap().run(&ctx).unwrap();
        read(&ctx, &out)
    };
    let from_whole = run((&whole).into());
    let from_parts = run(Product { buffer: &parts, splits: SPLITS, split_stride: stride });
    Some((from_whole, from_parts))
}

/// The output buffers of one run, and the read-only inputs besides the product.
struct Outputs {
    bufs: Vec<wgpu::Buffer>,
    lens: Vec<usize>,
}

impl Outputs {
    fn new(ctx: &dg_gpu::GpuContext, inputs: &[(Vec<f32>, bool)]) -> Self {
        let bufs = inputs
            .iter()
            .map(|(v, out)| if *out { guarded_output(ctx, "out", v.len()) } else { ctx.upload("in", v).unwrap() })
            .collect::<Vec<_>>();
        // Outputs that start with values (read-write inputs) get them written.
        for ((v, out), b) in inputs.iter().zip(&bufs) {
            if *out && v.iter().any(|&x| x != 0.0) {
                ctx.queue.write_buffer(b, 0, bytemuck::cast_slice(v));
            }
        }
        Outputs { bufs, lens: inputs.iter().map(|(v, _)| v.len()).collect() }
    }

    fn read(&self, ctx: &dg_gpu::GpuContext, which: &[usize]) -> Bits {
        which.iter().map(|&i| read_guarded(ctx, &self.bufs[i], self.lens[i]).iter().map(|v| v.to_bits()).collect()).collect()
    }
}

/// The outputs of one run, as bits.
type Bits = Vec<Vec<u32>>;

fn assert_same(test: &str, got: Option<(Bits, Bits)>) {
    let Some((whole, parts)) = got else { return };
    for (i, (w, p)) in whole.iter().zip(&parts).enumerate() {
        let first = w.iter().zip(p).position(|(a, b)| a != b);
        assert!(
            first.is_none(),
            "{test}: output {i} differs at {first:?}: whole {:?} partials {:?}",
            first.map(|j| f32::from_bits(w[j])),
            first.map(|j| f32::from_bits(p[j]))
        );
    }
}

#[test]
fn rmsnorm_reads_split_partials_as_the_reduced_product() {
    let test = "rmsnorm_reads_split_partials_as_the_reduced_product";
    let (rows, dim) = (5usize, 300usize);
    let got = both(
        test,
        rows * dim,
        |rec, x, o| rec.rmsnorm(x, Some(&o.bufs[0]), &o.bufs[0], &o.bufs[1], rows, dim, 1e-6, false, 0.75).unwrap(),
        |ctx| Outputs::new(ctx, &[(seeded(dim, 3, 1.0), false), (vec![0.0; rows * dim], true)]),
        |ctx, o| o.read(ctx, &[1]),
    );
    assert_same(test, got);
}

#[test]
fn norm_rope_reads_split_partials_as_the_reduced_product() {
    let test = "norm_rope_reads_split_partials_as_the_reduced_product";
    let (tokens, heads, d) = (3usize, 4usize, 64usize);
    let got = both(
        test,
        tokens * heads * d,
        |rec, x, o| {
            // K: the first two heads; V: the last two, normed into values.
            let half = tokens * 2 * d;
            rec.norm_rope_kv(x, &o.bufs[0], (&o.bufs[1], &o.bufs[2]), (&o.bufs[3], 0), (&o.bufs[4], 2, half), tokens, 2, d, 1e-6).unwrap()
        },
        |ctx| {
            Outputs::new(
                ctx,
                &[
                    (seeded(d, 4, 1.0), false),
                    (seeded(tokens * d / 2, 5, 1.0), false),
                    (seeded(tokens * d / 2, 6, 1.0), false),
                    (vec![0.0; tokens * heads * d / 2], true),
                    (vec![0.0; tokens * heads * d / 2], true),
                ],
            )
        },
        |ctx, o| o.read(ctx, &[3, 4]),
    );
    assert_same(test, got);
}

#[test]
fn attention_residual_norms_read_split_partials_as_the_reduced_product() {
    let test = "attention_residual_norms_read_split_partials_as_the_reduced_product";
    let (rows, dim) = (4usize, 300usize);
    let got = both(
        test,
        rows * dim,
        |rec, x, o| {
            let [w_res, w_a, w_b, w_c, hidden, out_a, out_bc] = &o.bufs[..] else { unreachable!() };
            rec.attention_residual_norms(
                (x, w_res),
                hidden,
                (w_a, out_a, 1.5),
                (w_b, 0.5, dg_kernels::coop_gemm::AFormat::F32),
                (w_c, 2.0),
                out_bc,
                (rows, dim, 1e-6),
            )
            .unwrap()
        },
        |ctx| {
            let w = |s| (seeded(dim, s, 1.0), false);
            Outputs::new(
                ctx,
                &[
                    w(7),
                    w(8),
                    w(9),
                    w(10),
                    (seeded(rows * dim, 11, 1.0), true),
                    (vec![0.0; rows * dim], true),
                    (vec![0.0; 2 * rows * dim], true),
                ],
            )
        },
        |ctx, o| o.read(ctx, &[4, 5, 6]),
    );
    assert_same(test, got);
}

#[test]
fn gelu_glu_reads_split_partials_as_the_reduced_product() {
    let test = "gelu_glu_reads_split_partials_as_the_reduced_product";
    let (rows, inter) = (5usize, 100usize);
    let got = both(
        test,
        rows * 2 * inter,
        |rec, x, o| rec.gelu_glu_fused(x, &o.bufs[0], rows, inter, None).unwrap(),
        |ctx| Outputs::new(ctx, &[(vec![0.0; rows * inter], true)]),
        |ctx, o| o.read(ctx, &[0]),
    );
    assert_same(test, got);
}

#[test]
fn ffn_residual_norms_read_split_partials_as_the_reduced_product() {
    let test = "ffn_residual_norms_read_split_partials_as_the_reduced_product";
    let (rows, dim) = (4usize, 300usize);
    let got = both(
        test,
        rows * dim,
        |rec, mlp, o| {
            let [w_1, moe, w_2, w_3, hidden, w_next, normed, dummy] = &o.bufs[..] else { unreachable!() };
            rec.ffn_residual_norms((mlp, w_1, None), (moe, w_2), None, w_3, hidden, Some((w_next, normed)), dummy, (rows, dim, 1e-6), 0.5)
                .unwrap()
        },
        |ctx| {
            let w = |s| (seeded(dim, s, 1.0), false);
            let rows_of = |v: Vec<f32>| (v, true);
            Outputs::new(
                ctx,
                &[
                    w(12),
                    (seeded(rows * dim, 13, 1.0), false),
                    w(14),
                    w(15),
                    rows_of(seeded(rows * dim, 16, 1.0)),
                    w(17),
                    rows_of(vec![0.0; rows * dim]),
                    rows_of(vec![0.0; 4]),
                ],
            )
        },
        |ctx, o| o.read(ctx, &[4, 6]),
    );
    assert_same(test, got);
}

#[test]
fn router_topk_reads_split_partials_as_the_reduced_product() {
    let test = "router_topk_reads_split_partials_as_the_reduced_product";
    let (tokens, experts, k) = (6usize, 128usize, 8usize);
    let got = both(
        test,
        tokens * experts,
        |rec, logits, o| {
            let [scale, idx, weights] = &o.bufs[..] else { unreachable!() };
            rec.router_topk(logits, scale, idx, weights, tokens, experts, k).unwrap()
        },
        |ctx| Outputs::new(ctx, &[(seeded(experts, 18, 1.0), false), (vec![0.0; tokens * k], true), (vec![0.0; tokens * k], true)]),
        |ctx, o| o.read(ctx, &[1, 2]),
    );
    assert_same(test, got);
}

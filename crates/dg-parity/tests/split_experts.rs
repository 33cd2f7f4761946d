//! The experts' grouped product over experts split across bindings (`dg_gpu::parts`: one
//! dispatch per part, reading the MoE offsets from the part's first expert) against the same
//! product over the experts in one buffer: bit for bit, C's padding columns untouched. Row-major
//! f32 experts on the portable grouped GEMM (every adapter), F16 experts in K panels on the
//! tensor-core one (adapters with cooperative matrices; skipped elsewhere). Uneven slot counts,
//! an empty expert and gathered rows, split into parts of two experts and one of one.

use dg_gpu::ops::Recorder;
use dg_gpu::parts::{Parts, SplitMatrix};
use dg_gpu::{GpuContext, GpuMatrix, MatrixLayout, Pipelines};
use dg_kernels::WeightFormat;
use dg_kernels::coop_gemm::AFormat;
use dg_kernels::coop_grouped_gemm;
use dg_parity::testing::coop_experts::{Case, Inputs};
use dg_parity::testing::{coop_test_context, guarded_output, read_guarded, test_context};

/// Uploads experts `range` of `x` as one buffer, row-major f32 or F16 in K panels.
fn piece(ctx: &GpuContext, x: &Inputs, range: std::ops::Range<usize>, layout: MatrixLayout) -> GpuMatrix {
    let (n, k) = (x.params.n as usize, x.params.k as usize);
    let w = &x.w[range.start * n * k..range.end * n * k];
    match layout {
        MatrixLayout::RowMajor => GpuMatrix { buffer: ctx.upload("w", w).unwrap(), format: WeightFormat::F32, layout },
        MatrixLayout::KPanels => {
            let words: Vec<u32> = w
                .chunks_exact(n * k)
                .flat_map(|g| coop_grouped_gemm::pack_f16_panels(g, n, k, coop_grouped_gemm::PANEL as usize))
                .collect();
            GpuMatrix { buffer: ctx.upload("w", &words).unwrap(), format: WeightFormat::F16, layout }
        }
    }
}

/// Runs `x` through the Recorder on its experts cut into `parts`; returns C.
fn run(ctx: &GpuContext, pipelines: &mut Pipelines, x: &Inputs, parts: Parts, layout: MatrixLayout) -> Vec<f32> {
    let (n, k) = (x.params.n as usize, x.params.k as usize);
    let pieces = parts.ranges().iter().map(|r| piece(ctx, x, r.clone(), layout)).collect();
    let format = if layout == MatrixLayout::KPanels { WeightFormat::F16 } else { WeightFormat::F32 };
    let w = SplitMatrix { parts, unit_elems: n * k, pieces, format, layout };
    let c = guarded_output(ctx, "c", x.c0.len());
    ctx.queue.write_buffer(&c, 0, bytemuck::cast_slice(&x.c0));
    let (a, offsets, rows) =
        (ctx.upload("a", &x.a).unwrap(), ctx.upload("offsets", &x.offsets).unwrap(), ctx.upload("rows", &x.rows).unwrap());
    let mut rec = Recorder::new(ctx, pipelines);
    rec.grouped_product((&a, AFormat::F32), &w, &offsets, &rows, &c, x.slots, x.params).unwrap();
    rec.finish().unwrap().run(ctx).unwrap();
    read_guarded(ctx, &c, x.c0.len())
}

fn check(ctx: &GpuContext, layout: MatrixLayout, (n, k): (usize, usize)) {
    let mut pipelines = Pipelines::default();
    let x = Case { n, k, counts: vec![5, 0, 17, 3, 9], gather: true }.inputs(11);
    let experts = x.params.groups as usize;
    let expert_bytes = (n * k * 4) as u64;
    let whole = Parts::experts("experts", experts, expert_bytes, u64::MAX).unwrap();
    let split = Parts::experts("experts", experts, expert_bytes, 2 * expert_bytes).unwrap();
    assert_eq!(split.ranges(), &[0..2, 2..4, 4..5]);
    let want = run(ctx, &mut pipelines, &x, whole, layout);
    let got = run(ctx, &mut pipelines, &x, split, layout);
    let c_rs = x.params.c_rs as usize;
    assert!((0..x.slots).all(|s| got[s * c_rs].to_bits() != x.c0[s * c_rs].to_bits()), "{layout:?}: a slot left unwritten");
    let diff = want.iter().zip(&got).position(|(a, b)| a.to_bits() != b.to_bits());
    assert_eq!(diff, None, "{layout:?}: split experts differ from whole at element {diff:?}");
}

#[test]
fn split_row_major_experts_give_the_whole_product() {
    let Some(ctx) = test_context("split_row_major_experts_give_the_whole_product") else { return };
    check(&ctx, MatrixLayout::RowMajor, (64, 48));
}

#[test]
fn split_panelled_experts_give_the_whole_product_on_the_tensor_cores() {
    let Some(ctx) = coop_test_context("split_panelled_experts_give_the_whole_product_on_the_tensor_cores") else { return };
    check(&ctx, MatrixLayout::KPanels, (128, 64));
}

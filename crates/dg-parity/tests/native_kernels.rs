//! The Vulkan-native kernels (SPIR-V past WGSL: `KernelKey::NativeGroupedGemm`,
//! `dg_kernels::native_grouped_gemm`, the experts' grouped product of short groups) on every
//! fragment shape the device runs (lavapipe: 8×8×8 in subgroups of 8), every weight format the
//! kernel reads (F16 in K panels; Q4_K, Q6_K, Q8_0 blocks in K panels one block wide) and both A
//! formats (f32, f16), gated against the exact (f64) product of the f16-rounded operands: the
//! host's dequantization of the same blocks (bit-exact against gguf-py), rounded to f16. The
//! tolerance is the tensor-core one (`coop_experts::tolerance`): f16 products are exact in f32, so
//! the error is the f32 accumulation, which the kernel splits across its subgroups and adds once at
//! the end (no sum of more terms than the WGSL kernel's). Q4_K's `d·sc·q − dmin·m` may be
//! contracted into a fused multiply-add by the device, moving a weight by one f16 ulp where it lies
//! at a rounding boundary (see `tensor_cores_quant.rs`); within the same tolerance.
//!
//! Awkward shapes: groups of 0, 1, 5, 31, 32 and 33 slots (an m tile of one slot after a whole
//! one), n three workgroups wide (not a power of two), K not a power of two and not a multiple of
//! the subgroups' chunks (so some subgroups take more chunks than others, or none), gathered and
//! direct rows, over the `max_rows` grid and over the dispatch's tile table, and a part of the
//! experts in a binding of its own (`first_group`); then through the Recorder, where the planner
//! hands the native kernel out for short groups.
//!
//! On a device that runs no native kernel these tests print a visible SKIP (a failure under
//! `DG_REQUIRE_TENSOR_CORES=1`).

use dg_gpu::ops::{Operand, Recorder};
use dg_gpu::{GpuContext, MatrixLayout, Pipelines};
use dg_kernels::coop_gemm::AFormat;
use dg_kernels::format::QuantFormat;
use dg_kernels::grouped_gemm::GroupedGemmParams;
use dg_kernels::native_grouped_gemm::{self, FORMATS, NativeShape};
use dg_kernels::{KernelKey, WeightFormat};
use dg_parity::testing::coop_experts::{Buffers, Case, Inputs, check, f16_round, grouped_reference};
use dg_parity::testing::quant::{blocks, dispatch, panelled};
use dg_parity::testing::{native_test_context, read_guarded, seeded};

/// K of each format's cases: 5 super-blocks for the K-quants (subgroup 0 of 4 takes two), 7
/// chunks of 32 for the others.
fn k_for(w: WeightFormat) -> usize {
    match native_grouped_gemm::chunk(w) {
        256 => 5 * 256,
        _ => 7 * 32,
    }
}

/// `x`'s experts stored as `w` in K panels as the upload stores them (words), and `x` holding
/// their f16-rounded values (what the reference multiplies).
fn stored(w: WeightFormat, x: &Inputs) -> (Vec<u32>, Inputs) {
    let (n, k) = (x.params.n as usize, x.params.k as usize);
    match w {
        WeightFormat::F16 => {
            let panel = native_grouped_gemm::chunk(w) as usize;
            let words = x.w.chunks_exact(n * k).flat_map(|g| dg_kernels::coop_grouped_gemm::pack_f16_panels(g, n, k, panel)).collect();
            (words, x.clone())
        }
        WeightFormat::Quantized(q) => {
            let (words, values) = blocks(q, &seeded(x.w.len(), x.w.len() as u64 + q.block_bytes() as u64, 1.0));
            (panelled(q, &words, n, k), Inputs { w: f16_round(&values), ..x.clone() })
        }
        other => panic!("no native kernel reads {other:?}"),
    }
}

fn shapes(ctx: &GpuContext) -> impl Iterator<Item = NativeShape> + '_ {
    NativeShape::ALL.into_iter().filter(|&s| ctx.native.contains(s))
}

#[test]
fn native_grouped_gemm_matches_the_exact_product_directly_and_through_the_recorder() {
    let test = "native_grouped_gemm_matches_the_exact_product_directly_and_through_the_recorder";
    let Some(ctx) = native_test_context(test) else { return };
    let mut pipelines = Pipelines::default();
    let counts = vec![5, 0, 33, 1, 31, 32];
    for shape in shapes(&ctx) {
        for w in FORMATS {
            for gather in [false, true] {
                let case = Case { n: 3 * shape.cols() as usize, k: k_for(w), counts: counts.clone(), gather };
                let (w_words, x) = stored(w, &case.inputs(7 + u64::from(gather)));
                let want = grouped_reference(&x, |_| true);
                for a in [AFormat::F32, AFormat::F16] {
                    for table in [false, true] {
                        let x = if table { x.with_table(native_grouped_gemm::SLOTS) } else { x.clone() };
                        let key = KernelKey::NativeGroupedGemm { shape, w, a };
                        let p = native_grouped_gemm::params_for(&x.params);
                        assert_eq!(p.tiles != 0, table, "the tile table of {} rows is the kernel's", native_grouped_gemm::SLOTS);
                        let groups = native_grouped_gemm::workgroups(shape, &p);
                        let got = dispatch(&ctx, &mut pipelines, key, &p, &[&x.a_words(a), &w_words, &x.offsets, &x.rows], &x.c0, groups);
                        let what = format!("{key:?} n {} k {} gather {gather} table {table}", case.n, case.k);
                        check(&got, &want, &x, |_| true, &what);
                    }
                }
                // Experts split across bindings (the Recorder's parts): a binding holding experts
                // 2.. only, their slots read from `offsets[first_group ..]`.
                let first = 2;
                let part = GroupedGemmParams { groups: x.params.groups - first, first_group: first, ..x.params };
                let skip = w_words.len() * first as usize / x.params.groups as usize;
                let key = KernelKey::NativeGroupedGemm { shape, w, a: AFormat::F32 };
                let groups = native_grouped_gemm::workgroups(shape, &part);
                let inputs = [&x.a_words(AFormat::F32)[..], &w_words[skip..], &x.offsets, &x.rows];
                let got = dispatch(&ctx, &mut pipelines, key, &part, &inputs, &x.c0, groups);
                let theirs = |s: usize| s >= x.offsets[first as usize] as usize;
                check(&got, &want, &x, theirs, &format!("{key:?} experts {first}.. gather {gather}"));
            }
        }
    }
    // The pipelines compiled above serve the Recorder's (a cold compile costs lavapipe seconds).
    recorder_runs_short_expert_groups_in_the_native_kernel(&ctx, &mut pipelines);
}

/// The grouped product through the Recorder, where the planner hands short groups to the native
/// kernel of the device's preferred shape.
fn recorder_runs_short_expert_groups_in_the_native_kernel(ctx: &GpuContext, pipelines: &mut Pipelines) {
    let shape = ctx.native.preferred().expect("a shape");
    for w in [WeightFormat::F16, WeightFormat::Quantized(QuantFormat::Q4_K)] {
        // A canvas's groups at a reduced width: a few slots an expert, gathered rows.
        let case = Case { n: 2 * shape.cols() as usize, k: k_for(w), counts: vec![4, 3, 0, 6, 1, 4, 5, 2], gather: true };
        let (w_words, x) = stored(w, &case.inputs(3));
        let b = Buffers::upload(ctx, &x, native_grouped_gemm::chunk(WeightFormat::F16));
        let wb = ctx.upload("experts", &w_words).unwrap();
        let mut rec = Recorder::new(ctx, pipelines);
        let operand = Operand { buffer: &wb, format: w, source: MatrixLayout::KPanels.into(), split: None };
        rec.grouped_product((&b.a, AFormat::F32), operand, &b.offsets, &b.rows, &b.c, x.slots, x.params).unwrap();
        let plan = rec.finish().unwrap();
        let names = plan.kernel_names();
        let native = native_grouped_gemm::source(shape, w, AFormat::F32).name;
        assert_eq!(names, vec![native.as_str()], "{w:?}: the planner's kernel");
        plan.run(ctx).unwrap();
        let got = read_guarded(ctx, &b.c, x.c0.len());
        check(&got, &grouped_reference(&x, |_| true), &x, |_| true, &format!("{w:?} through the Recorder"));
    }
}

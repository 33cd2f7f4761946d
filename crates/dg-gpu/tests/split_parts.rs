//! Weights split across bindings on a device with tensor cores (no device needed): at the real
//! geometry under WebGPU's default 128 MiB binding, every part of the BF16 tied head, of a layer's
//! F16 experts and of a split F16 dense matrix keeps its product on the tensor cores, as the
//! recording runs it (`Recorder` plans a dense part on its own, and runs the experts' parts on the
//! whole product's plan).

use dg_gpu::MatrixLayout;
use dg_gpu::parts::{COOP_PART_ROWS, Parts};
use dg_gpu::planner::{Capabilities, Dense, Grouped, Planner};
use dg_gpu::tuning::Tuning;
use dg_kernels::WeightFormat;
use dg_kernels::gemm::GemmParams;
use dg_kernels::grouped_gemm::GroupedGemmParams;
use dg_kernels::{coop_grouped_gemm, native_grouped_gemm};

/// An H200 with WebGPU's default binding limit.
const CAPS: Capabilities = Capabilities { max_binding: 128 << 20, ..Capabilities::H200 };
const H: usize = 2816;
const VOCAB: usize = 262_144;
const CANVAS: u32 = 256;

#[test]
fn every_part_of_the_tied_head_runs_on_the_tensor_cores() {
    let tuning = Tuning::default();
    let planner = Planner::new(CAPS, &tuning);
    let parts = Parts::rows("embed", VOCAB, 2 * H as u64, VOCAB, true, CAPS.max_binding).unwrap();
    assert!(parts.len() >= 2);
    for r in parts.ranges() {
        let head = GemmParams {
            c_offset: r.start as u32,
            c_rs: VOCAB as u32,
            epilogue: 1,
            cap: 30.0,
            ..GemmParams::linear(CANVAS, r.len() as u32, H as u32)
        };
        let plan = planner.dense(WeightFormat::Bf16, MatrixLayout::RowMajor, &head, true, None).unwrap();
        assert!(matches!(plan, Dense::TensorCores(_)), "head rows {r:?}: {plan:?}");
    }
    // Parts cut by bytes alone (not whole tiles) would leave the tensor cores.
    let ragged = GemmParams::linear(CANVAS, (parts.ranges()[0].len() + 5) as u32, H as u32);
    assert!(matches!(planner.dense(WeightFormat::Bf16, MatrixLayout::RowMajor, &ragged, true, None).unwrap(), Dense::Portable { .. }));
}

#[test]
fn every_part_of_a_split_panelled_matrix_runs_on_the_tensor_cores() {
    let tuning = Tuning::default();
    let planner = Planner::new(CAPS, &tuning);
    // The dense MLP's gate/up [2·2112, 2816] in F16 K panels (23.8 MB) under a 16 MiB cap.
    let rows = 2 * 2112;
    assert_eq!(planner.projection_layout(WeightFormat::F16, rows, H, true), MatrixLayout::KPanels);
    let parts = Parts::rows("mlp.gate_up", rows, 2 * H as u64, rows, true, 16 << 20).unwrap();
    assert!(parts.len() >= 2);
    for r in parts.ranges() {
        assert!(r.start.is_multiple_of(COOP_PART_ROWS));
        let p = GemmParams::linear(CANVAS, r.len() as u32, H as u32);
        let plan = planner.dense(WeightFormat::F16, MatrixLayout::KPanels, &p, true, None).unwrap();
        assert!(matches!(plan, Dense::TensorCores(_)), "rows {r:?}: {plan:?}");
    }
}

#[test]
fn every_part_of_a_layers_experts_takes_the_whole_products_kernel() {
    let tuning = Tuning::default();
    let planner = Planner::new(CAPS, &tuning);
    let (experts, width, slots) = (128usize, 704usize, CANVAS * 8);
    for (n, k) in [(2 * width, H), (H, width)] {
        assert_eq!(planner.experts_layout(WeightFormat::F16, n, k, true), MatrixLayout::KPanels);
        let whole = GroupedGemmParams {
            n: n as u32,
            k: k as u32,
            groups: experts as u32,
            max_rows: CANVAS,
            a_rs: k as u32,
            b_group_stride: (n * k) as u32,
            c_rs: n as u32,
            ..bytemuck::Zeroable::zeroed()
        };
        // The Recorder runs each part by the whole product's plan (`Recorder::grouped_product`).
        let plan = planner.grouped(WeightFormat::F16, MatrixLayout::KPanels, &whole, slots).unwrap();
        let parts = Parts::experts("experts", experts, (2 * n * k) as u64, CAPS.max_binding).unwrap();
        assert!(parts.len() >= 2, "[{n}, {k}]: {parts:?}");
        for r in parts.ranges() {
            let q = GroupedGemmParams { groups: r.len() as u32, first_group: r.start as u32, ..whole };
            let fits = match plan {
                Grouped::TensorCores { tile, .. } => coop_grouped_gemm::fits(tile, &q),
                Grouped::Native { shape } => native_grouped_gemm::fits(shape, WeightFormat::F16, &q),
                Grouped::NativeInt8 { .. } => panic!("F16 experts in the int8 mode"),
                Grouped::Portable { .. } => panic!("experts [{n}, {k}] leave the tensor cores"),
            };
            assert!(fits, "experts {r:?} of [{n}, {k}] in {plan:?}");
        }
    }
}

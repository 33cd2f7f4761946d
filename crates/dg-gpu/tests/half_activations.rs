//! Activations stored as f16 for the tensor-core GEMMs (`dg_kernels::coop_gemm::AFormat::F16`):
//! the dense kernel (`coop_gemm`) and the experts' (`coop_grouped_gemm`) give the same bits from
//! f16 activations as from f32 ones rounded as they are staged, reading half A's bytes (the
//! products and their inputs: `dg_parity::testing::half_activations`). What the halved A traffic
//! buys at the real geometry's shapes: `cargo xtask probe f16_activations_throughput_at_the_real_shapes`.

use dg_gpu::Pipelines;
use dg_kernels::coop_gemm::{self, AFormat, BLayout, WPath};
use dg_kernels::coop_grouped_gemm;
use dg_kernels::grouped_gemm::GroupedGemmParams;
use dg_kernels::{KernelSource, WeightFormat};
use dg_parity::testing::coop_test_context;
use dg_parity::testing::half_activations::{Dense, Grouped};

#[test]
fn f16_activations_give_the_same_bits_as_f32_ones_rounded_when_staged() {
    let test = "f16_activations_give_the_same_bits_as_f32_ones_rounded_when_staged";
    let Some(ctx) = coop_test_context(test) else { return };
    let mut pipelines = Pipelines::default();
    // A partial last m tile, and K steps (7; 4 and 3 a split) no ring length divides.
    for (tile, splits) in [(coop_gemm::TILE_128X128, 1), (coop_gemm::TILE_128X128, 2), (coop_gemm::TILE_64X64, 1)] {
        let dense = Dense::new(&ctx, (200, 256, 224), tile, splits);
        let want = dense.run(&ctx, &mut pipelines, AFormat::F32);
        assert!(want.iter().all(|v| v.is_finite()) && want.iter().any(|&v| v != 0.0), "{}: no product", tile.label());
        let got = dense.run(&ctx, &mut pipelines, AFormat::F16);
        assert!(got == want, "dense {} in {splits} splits: f16 activations gave other bits", tile.label());
    }
    // Full, partial and empty experts, with and without gathered rows.
    let counts = [31, 32, 33, 0, 1, 70, 16, 5];
    for gather in [false, true] {
        let grouped = Grouped::new(&ctx, 256, 224, &counts, gather);
        for (tile, path) in [
            (coop_grouped_gemm::TILE_32X128, WPath::Direct),
            (coop_grouped_gemm::TILE_32X128, WPath::Single),
            (coop_grouped_gemm::TILE_64X128, WPath::Staged),
        ] {
            let want = grouped.run(&ctx, &mut pipelines, tile, path, AFormat::F32);
            let got = grouped.run(&ctx, &mut pipelines, tile, path, AFormat::F16);
            assert!(got == want, "experts {} {path:?} gather {gather}: f16 activations gave other bits", tile.label());
        }
    }
}

/// f16 activations reach only the tensor-core experts' kernel: the Recorder refuses them, naming
/// the shape, for row-major experts (the f32 kernels', on every adapter).
#[test]
fn f16_activations_for_row_major_experts_are_refused() {
    let test = "f16_activations_for_row_major_experts_are_refused";
    let Some(ctx) = dg_parity::testing::test_context(test) else { return };
    let mut pipelines = Pipelines::default();
    let buffer = |len: usize| ctx.storage_buffer("b", len as u64 * 4).unwrap();
    let (a, offsets, rows, c) = (buffer(64), buffer(3), buffer(4), buffer(64));
    let w = dg_gpu::GpuMatrix { buffer: buffer(64 * 32), format: WeightFormat::F32, layout: dg_gpu::MatrixLayout::RowMajor };
    let p = GroupedGemmParams {
        n: 64,
        k: 32,
        groups: 2,
        max_rows: 2,
        a_rs: 32,
        b_group_stride: 64 * 32,
        c_rs: 64,
        gather: 0,
        ..bytemuck::Zeroable::zeroed()
    };
    let mut rec = dg_gpu::ops::Recorder::new(&ctx, &mut pipelines);
    let err = rec.grouped_product((&a, AFormat::F16), &w, &offsets, &rows, &c, 4, p).expect_err("f16 activations on row-major experts");
    assert!(err.to_string().contains("n 64 k 32"), "{err}");
    rec.grouped_product((&a, AFormat::F32), &w, &offsets, &rows, &c, 4, p).expect("f32 activations on row-major experts");
}

/// The kernels this file runs parse and validate on every machine.
#[test]
fn half_activation_kernels_validate() {
    let caps = naga::valid::Capabilities::COOPERATIVE_MATRIX | naga::valid::Capabilities::SHADER_FLOAT16;
    let kernels: Vec<KernelSource> = vec![
        coop_gemm::source_for_a(coop_gemm::TILE_128X128, WPath::Staged, WeightFormat::F16, BLayout::NkPanels, AFormat::F16),
        coop_grouped_gemm::source_with_a(coop_grouped_gemm::TILE_32X128, WPath::Direct, AFormat::F16),
    ];
    for k in kernels {
        let module = naga::front::wgsl::parse_str(&k.wgsl).unwrap_or_else(|e| panic!("{}: {}", k.name, e.emit_to_string(&k.wgsl)));
        naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps)
            .validate(&module)
            .unwrap_or_else(|e| panic!("{}: {e:?}", k.name));
        assert!(k.wgsl.contains("array<vec4<f16>>") && !k.wgsl.contains("A_ELEM"), "{}: A not f16", k.name);
    }
}

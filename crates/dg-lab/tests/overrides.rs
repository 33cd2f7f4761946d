//! The lab's variables as one `Overrides` value (`dg_lab::overrides`): every lab variable parsed,
//! good and bad values, tiles named by shape or label among the product's and the lab's, and the
//! product's variables passed on to `GpuOptions`.

use dg_gpu::overrides::{QkvChoice, RowLanes};
use dg_gpu::tuning::{LAB_VARIABLES, TuningError};
use dg_gpu::{Overrides, Tuning};
use dg_kernels::coop_gemm::{self, WPath};
use dg_kernels::{coop_grouped_gemm, grouped_gemm};
use dg_lab::overrides::{TileName, from_vars, gpu_options_from_vars};
use dg_lab::tiles;

fn one(name: &str, value: &str) -> Result<Overrides, TuningError> {
    from_vars([(name, value)])
}

#[test]
fn no_variables_give_the_products_choices() {
    let o = from_vars(std::iter::empty::<(&str, &str)>()).unwrap();
    assert_eq!(o, Overrides::default());
    assert!(o.fused_combine && o.half_expert_activations && o.scale_rows);
    assert_eq!((o.row_lanes, o.qkv, o.coop_path), (RowLanes::Auto, QkvChoice::Auto, WPath::Staged));
    assert_eq!((o.coop_tile, o.coop_depth, o.split_target, o.grouped_tile), (None, None, None, None));
    assert_eq!((o.coop_grouped_tiles.len(), o.coop_grouped_path, o.coop_grouped_depth), (0, None, None));
}

#[test]
fn every_lab_variable_parses_its_values() {
    assert_eq!(one("DG_ROW_LANES", "1").unwrap().row_lanes, RowLanes::One);
    assert!(!one("DG_UNFUSED_COMBINE", "1").unwrap().fused_combine);
    assert!(!one("DG_F32_ACTIVATIONS", "1").unwrap().half_expert_activations);
    assert!(!one("DG_UNSCALED_ROWS", "1").unwrap().scale_rows);
    assert_eq!(one("DG_QKV", "merged").unwrap().qkv, QkvChoice::Merged);
    assert_eq!(one("DG_QKV", "separate").unwrap().qkv, QkvChoice::Separate);
    assert_eq!(one("DG_COOP_TILE", "64x128").unwrap().coop_tile, Some(coop_gemm::TILE_64X128));
    let label = tiles::TILE_64X64_K16_W8.label();
    assert_eq!(one("DG_COOP_TILE", &label).unwrap().coop_tile, Some(tiles::TILE_64X64_K16_W8));
    assert_eq!(one("DG_ATTENTION_TILE", "128x64").unwrap().attention_tile, Some(coop_gemm::TILE_128X64));
    assert_eq!(one("DG_COOP_PATH", "direct").unwrap().coop_path, WPath::Direct);
    assert_eq!(one("DG_COOP_PATH", "single").unwrap().coop_path, WPath::Single);
    assert_eq!(one("DG_COOP_PATH", "staged").unwrap().coop_path, WPath::Staged);
    assert_eq!(one("DG_COOP_DEPTH", "2").unwrap().coop_depth, Some(2));
    assert_eq!(one("DG_SPLIT_TARGET", "0").unwrap().split_target, Some(0));
    assert_eq!(one("DG_SPLIT_TARGET", "264").unwrap().split_target, Some(264));
    assert_eq!(one("DG_GROUPED_TILE", "32x256").unwrap().grouped_tile, Some(grouped_gemm::TILE_32X256));
    let shape = one("DG_COOP_GROUPED_TILE", "32x128").unwrap().coop_grouped_tiles;
    assert!(shape.contains(&coop_grouped_gemm::TILE_32X128) && shape.contains(&tiles::TILE_32X128_W8), "{shape:?}");
    let label = tiles::TILE_32X128_W8.label();
    assert_eq!(one("DG_COOP_GROUPED_TILE", &label).unwrap().coop_grouped_tiles, vec![tiles::TILE_32X128_W8]);
    let label = tiles::TILE_32X128_K64.label();
    assert_eq!(label, "32x128x64_32x32_v4", "the label docs/tuning.md gives");
    assert_eq!(one("DG_COOP_GROUPED_TILE", &label).unwrap().coop_grouped_tiles, vec![tiles::TILE_32X128_K64]);
    assert_eq!(one("DG_GROUPED_PATH", "direct").unwrap().coop_grouped_path, Some(WPath::Direct));
    assert_eq!(one("DG_COOP_GROUPED_DEPTH", "3").unwrap().coop_grouped_depth, Some(3));
}

#[test]
fn a_shape_names_every_tile_of_it_and_a_label_one() {
    let shape = TileName::Shape { bm: 32, bn: 128 };
    assert!(shape.names(coop_grouped_gemm::TILE_32X128) && shape.names(tiles::TILE_32X128_W8));
    assert!(!shape.names(tiles::TILE_16X128));
    let exact = TileName::Exact(tiles::TILE_32X128_W8);
    assert!(exact.names(tiles::TILE_32X128_W8) && !exact.names(coop_grouped_gemm::TILE_32X128));
}

#[test]
fn depths_apply_only_where_they_make_a_valid_tile() {
    let o = one("DG_COOP_DEPTH", "2").unwrap();
    assert_eq!(o.dense_depth(coop_gemm::TILE_64X64).depth, 2);
    assert_eq!(Overrides::default().dense_depth(coop_gemm::TILE_64X64), coop_gemm::TILE_64X64);
    let g = one("DG_COOP_GROUPED_DEPTH", "2").unwrap();
    assert_eq!(g.grouped_depth(coop_grouped_gemm::TILE_32X128).depth, 2);
    assert_eq!(g.dense_depth(coop_gemm::TILE_64X64), coop_gemm::TILE_64X64, "the experts' depth leaves the dense tile alone");
}

#[test]
fn bad_values_name_the_variable_the_value_and_what_it_accepts() {
    let cases = [
        ("DG_ROW_LANES", "4", "auto or 1"),
        ("DG_UNFUSED_COMBINE", "true", "0 or 1"),
        ("DG_F32_ACTIVATIONS", "on", "0 or 1"),
        ("DG_QKV", "merge", "auto, merged or separate"),
        ("DG_COOP_TILE", "64x96", "64x128"),
        ("DG_ATTENTION_TILE", "64x96", "64x128"),
        ("DG_COOP_PATH", "Direct", "staged, direct or single"),
        ("DG_COOP_DEPTH", "0", "from 1 to"),
        ("DG_COOP_DEPTH", "9", "from 1 to"),
        ("DG_SPLIT_TARGET", "-1", "whole number"),
        ("DG_GROUPED_TILE", "32x32", "32x256"),
        ("DG_COOP_GROUPED_TILE", "128x128", "32x128"),
        ("DG_GROUPED_PATH", "fast", "staged, direct or single"),
        ("DG_COOP_GROUPED_DEPTH", "two", "from 1 to"),
        ("DG_COOP_STAGES", "both", "auto, alternating or constant"),
    ];
    for (name, value, accepts) in cases {
        let err = one(name, value).expect_err(name);
        assert!(matches!(&err, TuningError::BadValue { name: n, value: v, .. } if n == name && v == value), "{err:?}");
        let text = err.to_string();
        assert!(text.contains(name) && text.contains(value) && text.contains(accepts), "{name}: {text}");
    }
    for name in LAB_VARIABLES {
        assert!(matches!(one(name, "\u{1}not a value\u{1}"), Err(TuningError::BadValue { .. })), "{name} not parsed");
    }
}

#[test]
fn the_lab_tools_options_take_both_kinds_of_variable() {
    let opts = gpu_options_from_vars([("DG_ADAPTER", "llvmpipe"), ("DG_QKV", "separate"), ("DG_NO_COOP", "1")]).unwrap();
    assert_eq!(opts.adapter.as_deref(), Some("llvmpipe"));
    let overrides = Overrides { qkv: QkvChoice::Separate, ..Overrides::default() };
    assert_eq!(opts.tuning, Tuning { overrides, tensor_cores: false, ..Tuning::default() });
    let err = gpu_options_from_vars([("DG_SPLIT_TARGET", "many")]).unwrap_err();
    assert!(err.to_string().contains("DG_SPLIT_TARGET"));
    assert!(gpu_options_from_vars([("DG_KV_CACHES", "f16")]).is_err(), "a misspelt variable");
}

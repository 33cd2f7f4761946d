//! The tuning knobs as a value: every `DG_*` variable parsed, good and bad values, unknown names,
//! and a scan proving that no library crate reads the environment on its own.

use dg_gpu::tuning::{OTHER_VARIABLES, QkvChoice, RowLanes, RowReduceChoice, TUNING_VARIABLES, TileName, Tuning, TuningError};
use dg_gpu::{GpuOptions, TuningError as Reexported};
use dg_kernels::coop_gemm::{self, WPath};
use dg_kernels::{coop_grouped_gemm, grouped_gemm};

fn one(name: &str, value: &str) -> Result<Tuning, TuningError> {
    Tuning::from_vars([(name, value)])
}

#[test]
fn no_variables_give_the_defaults() {
    let t = Tuning::from_vars(std::iter::empty::<(&str, &str)>()).unwrap();
    assert_eq!(t, Tuning::default());
    assert!(t.tensor_cores && t.fused_combine && !t.fused_attention && t.half_expert_activations);
    assert_eq!((t.row_reduce, t.row_lanes, t.qkv, t.coop_path), (RowReduceChoice::Auto, RowLanes::Auto, QkvChoice::Auto, WPath::Staged));
    assert_eq!((t.coop_tile, t.coop_depth, t.split_target, t.grouped_tile), (None, None, None, None));
    assert_eq!((t.coop_grouped_tile, t.coop_grouped_path, t.coop_grouped_depth), (None, None, None));
}

#[test]
fn every_knob_parses_its_values() {
    assert!(!one("DG_NO_COOP", "1").unwrap().tensor_cores);
    assert!(one("DG_NO_COOP", "0").unwrap().tensor_cores);
    assert_eq!(one("DG_ROW_REDUCE", "tree").unwrap().row_reduce, RowReduceChoice::Tree);
    assert_eq!(one("DG_ROW_REDUCE", "auto").unwrap().row_reduce, RowReduceChoice::Auto);
    assert_eq!(one("DG_ROW_LANES", "1").unwrap().row_lanes, RowLanes::One);
    assert!(!one("DG_UNFUSED_COMBINE", "1").unwrap().fused_combine);
    assert!(one("DG_FUSED_ATTENTION", "1").unwrap().fused_attention);
    assert!(!one("DG_F32_ACTIVATIONS", "1").unwrap().half_expert_activations);
    assert_eq!(one("DG_QKV", "merged").unwrap().qkv, QkvChoice::Merged);
    assert_eq!(one("DG_QKV", "separate").unwrap().qkv, QkvChoice::Separate);
    assert_eq!(one("DG_COOP_TILE", "64x128").unwrap().coop_tile, Some(coop_gemm::TILE_64X128));
    let label = coop_gemm::TILE_64X64_K16_W8.label();
    assert_eq!(one("DG_COOP_TILE", &label).unwrap().coop_tile, Some(coop_gemm::TILE_64X64_K16_W8));
    assert_eq!(one("DG_ATTENTION_TILE", "128x64").unwrap().attention_tile, Some(coop_gemm::TILE_128X64));
    assert_eq!(one("DG_SCORES_BYTES", "268435456").unwrap().scores_bytes, Some(256 << 20));
    assert_eq!(one("DG_COOP_PATH", "direct").unwrap().coop_path, WPath::Direct);
    assert_eq!(one("DG_COOP_PATH", "single").unwrap().coop_path, WPath::Single);
    assert_eq!(one("DG_COOP_PATH", "staged").unwrap().coop_path, WPath::Staged);
    assert_eq!(one("DG_COOP_DEPTH", "2").unwrap().coop_depth, Some(2));
    assert_eq!(one("DG_SPLIT_TARGET", "0").unwrap().split_target, Some(0));
    assert_eq!(one("DG_SPLIT_TARGET", "264").unwrap().split_target, Some(264));
    assert_eq!(one("DG_GROUPED_TILE", "32x256").unwrap().grouped_tile, Some(grouped_gemm::TILE_32X256));
    assert_eq!(one("DG_COOP_GROUPED_TILE", "32x128").unwrap().coop_grouped_tile, Some(TileName::Shape { bm: 32, bn: 128 }));
    let label = coop_grouped_gemm::TILE_32X128_W8.label();
    assert_eq!(one("DG_COOP_GROUPED_TILE", &label).unwrap().coop_grouped_tile, Some(TileName::Exact(coop_grouped_gemm::TILE_32X128_W8)));
    let label = coop_grouped_gemm::TILE_32X128_K64.label();
    assert_eq!(label, "32x128x64_32x32_v4", "the label the README gives");
    assert_eq!(one("DG_COOP_GROUPED_TILE", &label).unwrap().coop_grouped_tile, Some(TileName::Exact(coop_grouped_gemm::TILE_32X128_K64)));
    assert_eq!(one("DG_GROUPED_PATH", "direct").unwrap().coop_grouped_path, Some(WPath::Direct));
    assert_eq!(one("DG_COOP_GROUPED_DEPTH", "3").unwrap().coop_grouped_depth, Some(3));
    assert_eq!(one("DG_ENCODER_SUBMIT_LAYERS", "30").unwrap().encoder_submit_layers, 30);
    assert_eq!(Tuning::default().encoder_submit_layers, dg_gpu::tuning::ENCODER_SUBMIT_LAYERS);
    assert_eq!(one("DG_SUBMIT_PARTS", "4").unwrap().submit_parts, 4);
    assert_eq!(Tuning::default().submit_parts, dg_gpu::tuning::SUBMIT_PARTS);
}

#[test]
fn a_shape_names_every_tile_of_it_and_a_label_one() {
    let shape = TileName::Shape { bm: 32, bn: 128 };
    assert!(shape.names(coop_grouped_gemm::TILE_32X128) && shape.names(coop_grouped_gemm::TILE_32X128_W8));
    assert!(!shape.names(coop_grouped_gemm::TILE_16X128));
    let exact = TileName::Exact(coop_grouped_gemm::TILE_32X128_W8);
    assert!(exact.names(coop_grouped_gemm::TILE_32X128_W8) && !exact.names(coop_grouped_gemm::TILE_32X128));
}

#[test]
fn depths_apply_only_where_they_make_a_valid_tile() {
    let t = one("DG_COOP_DEPTH", "2").unwrap();
    assert_eq!(t.dense_depth(coop_gemm::TILE_64X64).depth, 2);
    assert_eq!(Tuning::default().dense_depth(coop_gemm::TILE_64X64), coop_gemm::TILE_64X64);
    let g = one("DG_COOP_GROUPED_DEPTH", "2").unwrap();
    assert_eq!(g.grouped_depth(coop_grouped_gemm::TILE_32X128).depth, 2);
    assert_eq!(g.dense_depth(coop_gemm::TILE_64X64), coop_gemm::TILE_64X64, "the experts' depth leaves the dense tile alone");
}

#[test]
fn bad_values_name_the_variable_the_value_and_what_it_accepts() {
    let cases = [
        ("DG_NO_COOP", "yes", "0 or 1"),
        ("DG_ROW_REDUCE", "subgroups", "auto or tree"),
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
        ("DG_ENCODER_SUBMIT_LAYERS", "0", "whole number of layers from 1"),
        ("DG_SUBMIT_PARTS", "0", "whole number of command buffers from 1"),
        ("DG_SUBMIT_PARTS", "two", "whole number of command buffers from 1"),
        ("DG_SCORES_BYTES", "0", "whole number of bytes from 1"),
    ];
    for (name, value, accepts) in cases {
        let err = one(name, value).expect_err(name);
        assert!(matches!(&err, TuningError::BadValue { name: n, value: v, .. } if n == name && v == value), "{err:?}");
        let text = err.to_string();
        assert!(text.contains(name) && text.contains(value) && text.contains(accepts), "{name}: {text}");
    }
}

#[test]
fn every_tuning_variable_is_parsed() {
    // A variable listed but not parsed would be reported as unknown.
    for name in TUNING_VARIABLES {
        let err = one(name, "\u{1}not a value\u{1}").expect_err(name);
        assert!(matches!(err, TuningError::BadValue { .. }), "{name}: {err:?}");
    }
}

#[test]
fn unknown_dg_names_are_errors_and_the_others_pass() {
    let err = one("DG_COOP_TILES", "64x64").expect_err("a misspelt knob");
    let text = err.to_string();
    assert!(matches!(err, TuningError::Unknown { .. }));
    assert!(text.contains("DG_COOP_TILES") && text.contains("DG_COOP_TILE,"), "{text}");
    for name in OTHER_VARIABLES {
        assert_eq!(one(name, "1").unwrap(), Tuning::default(), "{name}");
    }
    assert_eq!(Tuning::from_vars([("PATH", "/bin"), ("XDG_RUNTIME_DIR", "x"), ("DG_QKV", "")]).unwrap(), Tuning::default());
}

#[test]
fn gpu_options_take_the_adapter_and_the_tuning() {
    let opts = GpuOptions::from_vars([("DG_ADAPTER", "llvmpipe"), ("DG_QKV", "separate"), ("DG_NO_COOP", "1")]).unwrap();
    assert_eq!(opts.adapter.as_deref(), Some("llvmpipe"));
    assert_eq!(opts.tuning, Tuning { qkv: QkvChoice::Separate, tensor_cores: false, ..Tuning::default() });
    assert_eq!(GpuOptions::from_vars([("DG_ADAPTER", "")]).unwrap().adapter, None);
    let err: Reexported = GpuOptions::from_vars([("DG_SPLIT_TARGET", "many")]).unwrap_err();
    assert!(err.to_string().contains("DG_SPLIT_TARGET"));
}

/// The library crates, whose `src/` must not read the environment.
const LIBRARY_CRATES: &[&str] = &["dg-model", "dg-kernels", "dg-cpu", "dg-gpu", "dg-sampler", "dg-parity"];

/// The files exempt from the scan, each with its reason.
const EXEMPT: &[(&str, &str)] = &[
    // Test support (the GPU tests' device, which `DG_ALLOW_NO_GPU=1` lets them skip): test code
    // kept in src/ so that the crate's test files share it, not code the library runs.
    ("dg-parity/src/testing/mod.rs", "env::var"),
    // `Tuning::from_env` / `GpuOptions::from_env`: the one reading of the environment, which only
    // applications call (wgpu's `*_from_env` helpers are the model).
    ("dg-gpu/src/tuning.rs", "std::env::vars_os()"),
];

#[test]
fn no_library_crate_reads_the_environment() {
    let crates = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut offenders = Vec::new();
    let mut scanned = 0;
    for name in LIBRARY_CRATES {
        let mut stack = vec![crates.join(name).join("src")];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    stack.push(path);
                    continue;
                }
                if path.extension().is_none_or(|e| e != "rs") {
                    continue;
                }
                scanned += 1;
                let text = std::fs::read_to_string(&path).unwrap();
                let relative = path.strip_prefix(&crates).unwrap().to_string_lossy().replace('\\', "/");
                let reads = text.matches("env::var").count() + text.matches("option_env!").count();
                match EXEMPT.iter().find(|(file, _)| *file == relative) {
                    // The exempt reading exactly once and nothing else.
                    Some((_, allowed)) if relative.ends_with("tuning.rs") && (reads != 1 || text.matches(allowed).count() != 1) => {
                        offenders.push(format!("{relative}: {reads} readings, the one allowed is {allowed}"));
                    }
                    Some(_) => {}
                    None if reads > 0 => offenders.push(relative),
                    None => {}
                }
            }
        }
    }
    assert!(scanned > 20, "only {scanned} files scanned: wrong root {}", crates.display());
    assert!(
        offenders.is_empty(),
        "library code reads the environment (take it from a value the application builds, see dg_gpu::tuning): {offenders:?}"
    );
}

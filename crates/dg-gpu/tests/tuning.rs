//! The tuning knobs with product meaning as a value: every product `DG_*` variable parsed, good
//! and bad values, unknown names, the lab's variables refused with a word of where they belong,
//! and a scan proving that no library crate reads the environment on its own. (The lab's
//! variables are parsed by dg-lab: `crates/dg-lab/tests/overrides.rs`.)

use dg_gpu::tuning::{KvCacheChoice, LAB_VARIABLES, OTHER_VARIABLES, RowReduceChoice, TUNING_VARIABLES, Tuning, TuningError};
use dg_gpu::{GpuOptions, Overrides, TuningError as Reexported};

fn one(name: &str, value: &str) -> Result<Tuning, TuningError> {
    Tuning::from_vars([(name, value)])
}

#[test]
fn no_variables_give_the_defaults() {
    let t = Tuning::from_vars(std::iter::empty::<(&str, &str)>()).unwrap();
    assert_eq!(t, Tuning::default());
    assert!(t.tensor_cores);
    assert_eq!((t.row_reduce, t.kv_cache, t.scores_bytes), (RowReduceChoice::Auto, KvCacheChoice::Auto, None));
    assert_eq!(t.overrides, Overrides::default());
}

#[test]
fn every_knob_parses_its_values() {
    assert!(!one("DG_NO_COOP", "1").unwrap().tensor_cores);
    assert!(one("DG_NO_COOP", "0").unwrap().tensor_cores);
    assert!(!one("DG_NATIVE", "0").unwrap().native);
    assert!(one("DG_NATIVE", "1").unwrap().native && !Tuning::default().native);
    assert_eq!(one("DG_ROW_REDUCE", "tree").unwrap().row_reduce, RowReduceChoice::Tree);
    assert_eq!(one("DG_ROW_REDUCE", "auto").unwrap().row_reduce, RowReduceChoice::Auto);
    assert_eq!(one("DG_KV_CACHE", "f16").unwrap().kv_cache, KvCacheChoice::F16);
    assert_eq!(one("DG_KV_CACHE", "f32").unwrap().kv_cache, KvCacheChoice::F32);
    assert_eq!(one("DG_SCORES_BYTES", "268435456").unwrap().scores_bytes, Some(256 << 20));
    assert_eq!(one("DG_ENCODER_SUBMIT_LAYERS", "30").unwrap().encoder_submit_layers, 30);
    assert_eq!(Tuning::default().encoder_submit_layers, dg_gpu::tuning::ENCODER_SUBMIT_LAYERS);
    assert_eq!(one("DG_SUBMIT_PARTS", "4").unwrap().submit_parts, 4);
    assert_eq!(Tuning::default().submit_parts, dg_gpu::tuning::SUBMIT_PARTS);
}

#[test]
fn bad_values_name_the_variable_the_value_and_what_it_accepts() {
    let cases = [
        ("DG_NO_COOP", "yes", "0 or 1"),
        ("DG_NATIVE", "off", "0 or 1"),
        ("DG_ROW_REDUCE", "subgroups", "auto or tree"),
        ("DG_KV_CACHE", "bf16", "auto, f32 or f16"),
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
fn the_labs_variables_are_refused_saying_where_they_belong() {
    for name in LAB_VARIABLES {
        let err = one(name, "1").expect_err(name);
        assert!(matches!(&err, TuningError::Lab { name: n, .. } if n == name), "{name}: {err:?}");
        assert!(err.to_string().contains("lab"), "{err}");
        assert!(!TUNING_VARIABLES.contains(name) && !OTHER_VARIABLES.contains(name), "{name} listed twice");
    }
}

#[test]
fn unknown_dg_names_are_errors_and_the_others_pass() {
    let err = one("DG_KV_CACHES", "f16").expect_err("a misspelt knob");
    let text = err.to_string();
    assert!(matches!(err, TuningError::Unknown { .. }));
    assert!(text.contains("DG_KV_CACHES") && text.contains("DG_KV_CACHE,"), "{text}");
    for name in OTHER_VARIABLES {
        assert_eq!(one(name, "1").unwrap(), Tuning::default(), "{name}");
    }
    assert_eq!(Tuning::from_vars([("PATH", "/bin"), ("XDG_RUNTIME_DIR", "x"), ("DG_QKV", "")]).unwrap(), Tuning::default());
}

#[test]
fn gpu_options_take_the_adapter_and_the_tuning() {
    let opts = GpuOptions::from_vars([("DG_ADAPTER", "llvmpipe"), ("DG_KV_CACHE", "f32"), ("DG_NO_COOP", "1")]).unwrap();
    assert_eq!(opts.adapter.as_deref(), Some("llvmpipe"));
    assert_eq!(opts.tuning, Tuning { kv_cache: KvCacheChoice::F32, tensor_cores: false, ..Tuning::default() });
    assert_eq!(GpuOptions::from_vars([("DG_ADAPTER", "")]).unwrap().adapter, None);
    let err: Reexported = GpuOptions::from_vars([("DG_SCORES_BYTES", "many")]).unwrap_err();
    assert!(err.to_string().contains("DG_SCORES_BYTES"));
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

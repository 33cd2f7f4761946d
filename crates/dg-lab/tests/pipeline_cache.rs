//! The pipeline-cache measurement (`dg_lab::pipeline_cache`): one process's compilation of the
//! bundled model's generation kernels through the cache file `dg-lab-pipeline-cache.bin` in the
//! system's temporary directory (delete it for a first process). Run it twice and compare;
//! ignored by default.

use std::path::Path;

use dg_gpu::{GpuModel, ModelOptions, WeightFormat};
use dg_model::ModelDir;
use dg_parity::testing::test_context;

#[test]
#[ignore = "a measurement across two processes"]
fn compile_the_generation_kernels_through_a_pipeline_cache_file() {
    let test = "compile_the_generation_kernels_through_a_pipeline_cache_file";
    let dir = ModelDir::open(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/tiny-random")).unwrap();
    let Some(ctx) = test_context(test) else { return };
    let adapter = ctx.info.name.clone();
    let model = GpuModel::load(ctx, &dir.config, &dir.load_weights().unwrap(), ModelOptions::new(256).format(WeightFormat::F16)).unwrap();
    let mut keys: Vec<_> = model.generation_kernels().unwrap().into_iter().collect();
    keys.sort_by_key(|k| format!("{k:?}"));
    drop(model);
    let file = std::env::temp_dir().join("dg-lab-pipeline-cache.bin");
    let m = dg_lab::pipeline_cache::compile_with_cache(Some(&adapter), &keys, &file).unwrap();
    println!(
        "{}: {} kernels compiled in {:.2} s; cache file read {} bytes, wrote {} bytes",
        m.adapter,
        m.kernels,
        m.compile.as_secs_f64(),
        m.loaded_bytes,
        m.saved_bytes
    );
}

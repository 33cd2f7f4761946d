//! `dg_gpu::arena_bytes` counts what the device allocates: for the bundled model at several
//! contexts and batch sizes, the bytes a loaded model's arena took on this adapter
//! (`GpuModel::arena_bytes`) are the bytes `arena_bytes` gives for the adapter's limits.

use std::path::Path;

use dg_gpu::{GpuModel, Instrumentation, WeightFormat};
use dg_model::ModelDir;
use dg_parity::testing::test_context;

#[test]
fn arena_bytes_counts_what_the_device_allocates() {
    let test = "arena_bytes_counts_what_the_device_allocates";
    let dir = ModelDir::open(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/tiny-random")).unwrap();
    let weights = dir.load_weights().unwrap();
    for (context, slots, format) in [(64, 1, WeightFormat::F32), (1000, 1, WeightFormat::F16), (3000, 3, WeightFormat::F32)] {
        let Some(ctx) = test_context(test) else { return };
        let limits = (ctx.max_binding(), ctx.coop_matrix);
        let mut model = GpuModel::load(ctx, &dir.config, &weights, dg_gpu::ModelOptions::new(context).format(format)).unwrap();
        model.set_slots(slots).unwrap();
        let counted = dg_gpu::arena_bytes(&dir.config, context, slots, model.kv_cache_format(), limits).unwrap();
        assert_eq!(model.arena_bytes(), counted, "context {context}, {slots} slots, {format:?}");
    }
}

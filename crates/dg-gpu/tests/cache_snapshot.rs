//! A device-side snapshot of the GPU model's KV cache, restored after another conversation has
//! overwritten the cache, continues exactly: the next generation gives the tokens of an
//! uninterrupted run, also where the sliding caches hold only their window and a chunk.

use std::path::Path;

use dg_gpu::{GpuError, GpuModel, Instrumentation, KvCacheChoice};
use dg_model::{GenerationConfig, ModelDir};
use dg_parity::testing::test_context;
use dg_sampler::{CategoricalRequest, NoHooks, ResidentModel, RowResult, SeededRng, generate_resident};

/// The model with `skip` ids of the prompt already in its cache: the first encode skips them.
struct Continue<'a> {
    model: &'a mut GpuModel,
    skip: usize,
}

impl ResidentModel for Continue<'_> {
    type Error = GpuError;
    fn encode(&mut self, ids: &[u32]) -> Result<(), GpuError> {
        let skip = std::mem::take(&mut self.skip);
        self.model.encode(&ids[skip..])
    }
    fn denoise_rows(
        &mut self,
        canvas: &[u32],
        sc: bool,
        t: f32,
        draw: CategoricalRequest<'_>,
        rows: &mut [RowResult],
    ) -> Result<(), GpuError> {
        self.model.denoise_rows(canvas, sc, t, draw, rows)
    }
}

fn ids(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32).map(|i| 3 + (i * 7 + salt) % 500).collect()
}

#[test]
fn a_restored_snapshot_continues_like_an_uninterrupted_run() {
    let test = "a_restored_snapshot_continues_like_an_uninterrupted_run";
    let dir = ModelDir::open(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/tiny-random")).unwrap();
    let (c, v) = (dir.config.canvas_length, dir.config.text.vocab_size);
    // Two canvases, every step, no EOS: the run's length is fixed.
    let cfg = GenerationConfig { max_new_tokens: 2 * c, max_denoising_steps: 3, stopping: None, ..Default::default() };
    // Longer than the sliding window: the snapshot keeps only the sliding layers' last W−1 rows.
    let a = ids(dir.config.text.sliding_window + 37, 0);
    let next: Vec<u32> = a.iter().copied().chain([11, 12, 13]).collect();
    let continued = |model: &mut GpuModel| {
        let mut m = Continue { model, skip: a.len() };
        generate_resident(&mut m, &next, &cfg, c, v, &mut SeededRng::new(5), &mut NoHooks).unwrap().sequence
    };
    // Caches of every position, then sliding caches of the window and a chunk of 40 (their
    // window moves as the runs grow, and a restore puts it at row 0): the same tokens. Then the
    // latter with K and V stored as f16 (rows of half the bytes to snapshot, restore and move).
    let mut runs = Vec::new();
    for (moving, kv_cache) in [(false, KvCacheChoice::Auto), (true, KvCacheChoice::Auto), (true, KvCacheChoice::F16)] {
        let Some(mut ctx) = test_context(test) else { return };
        ctx.tuning.prefill_rows = moving.then_some(40);
        ctx.tuning.kv_cache = kv_cache;
        let mut model = GpuModel::load(ctx, &dir.config, &dir.load_weights().unwrap(), dg_gpu::ModelOptions::new(512)).unwrap();
        model.set_prefill_chunk(40);

        model.encode(&a).unwrap();
        let uninterrupted = continued(&mut model);

        model.reset();
        model.encode(&a).unwrap();
        let snapshot = model.snapshot_cache().unwrap();
        assert_eq!(snapshot.seq_len(), a.len());
        let per_token: usize = dir.config.text.layers.iter().map(|l| 2 * 4 * l.num_kv_heads * l.head_dim).sum();
        let per_token = if model.kv_cache_format() == dg_gpu::WeightFormat::F16 { per_token / 2 } else { per_token };
        assert!(snapshot.bytes() > 0 && snapshot.bytes() < (a.len() * per_token) as u64, "sliding layers keep W−1 rows");
        // Another conversation, longer, overwrites every row the first one used.
        model.reset();
        let b = ids(2 * a.len(), 3);
        generate_resident(&mut model, &b, &cfg, c, v, &mut SeededRng::new(9), &mut NoHooks).unwrap();
        assert_eq!(moving, model.seq_len() > model.sliding_positions(), "moving {moving}: the window moves");
        model.restore_cache(&snapshot).unwrap();
        assert_eq!(model.seq_len(), a.len());
        assert_eq!(continued(&mut model), uninterrupted, "moving {moving}, {kv_cache:?}: the tokens after the snapshot's restore");
        runs.push(uninterrupted);
    }
    assert_eq!(runs[0], runs[1], "the tokens differ when the sliding window moves");
    assert_eq!(runs[2].len(), runs[0].len());
}

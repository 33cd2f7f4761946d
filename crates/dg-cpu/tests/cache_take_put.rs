//! A cache taken out of the CPU model and put back continues exactly: a generation after the
//! round trip (with another conversation run in between) gives the tokens of an uninterrupted one.

use std::path::Path;

use dg_cpu::{CpuError, CpuModel};
use dg_model::{GenerationConfig, ModelDir};
use dg_sampler::{DenoiseModel, NoHooks, SeededRng, generate};

/// The model with `skip` ids of the prompt already in its cache: the first encode skips them.
struct Continue<'a> {
    model: &'a mut CpuModel,
    skip: usize,
}

impl DenoiseModel for Continue<'_> {
    type Error = CpuError;
    fn encode(&mut self, ids: &[u32]) -> Result<(), CpuError> {
        let skip = std::mem::take(&mut self.skip);
        self.model.encode(&ids[skip..])
    }
    fn canvas_forward(&mut self, canvas: &[u32], sc: Option<&[f32]>, logits: &mut [f32]) -> Result<(), CpuError> {
        self.model.canvas_forward(canvas, sc, logits)
    }
}

fn ids(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32).map(|i| 3 + (i * 7 + salt) % 500).collect()
}

fn bundled() -> ModelDir {
    ModelDir::open(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/tiny-random")).unwrap()
}

#[test]
fn a_cache_put_back_continues_like_an_uninterrupted_run() {
    let dir = bundled();
    let (c, v) = (dir.config.canvas_length, dir.config.text.vocab_size);
    let mut model = CpuModel::new(dir.config.clone(), dir.load_weights().unwrap());
    // Two canvases, every step, no EOS: the run's length is fixed.
    let cfg = GenerationConfig { max_new_tokens: 2 * c, max_denoising_steps: 4, stopping: None, ..Default::default() };
    // Longer than the sliding window, so the sliding layers have dropped tokens.
    let a = ids(dir.config.text.sliding_window + 37, 0);
    let next: Vec<u32> = a.iter().copied().chain([11, 12, 13]).collect();
    let continued = |model: &mut CpuModel| {
        generate(&mut Continue { model, skip: a.len() }, &next, &cfg, c, v, &mut SeededRng::new(5), &mut NoHooks).unwrap().sequence
    };

    model.encode(&a).unwrap();
    let uninterrupted = continued(&mut model);

    model.reset();
    model.encode(&a).unwrap();
    let mut kept = model.take_cache();
    assert_eq!((kept.seq_len, model.seq_len()), (a.len(), 0), "the cache moved out");
    kept.shrink_to_fit();
    assert!(kept.bytes() > 0);
    // Another conversation, longer, on the emptied model.
    let b = ids(2 * a.len(), 3);
    generate(&mut model, &b, &cfg, c, v, &mut SeededRng::new(9), &mut NoHooks).unwrap();
    model.put_cache(kept).unwrap();
    assert_eq!(model.seq_len(), a.len());
    assert_eq!(continued(&mut model), uninterrupted, "the tokens after the round trip");
}

#[test]
fn a_cache_of_another_shape_is_refused_by_name() {
    let dir = bundled();
    let mut model = CpuModel::new(dir.config.clone(), dir.load_weights().unwrap());
    model.encode(&ids(10, 0)).unwrap();
    let mut cache = model.take_cache();
    cache.layers.pop();
    let e = model.put_cache(cache).unwrap_err().to_string();
    assert!(e.contains("does not fit this model") && e.contains("layers"), "{e}");
    model.encode(&ids(10, 0)).unwrap();
    let mut cache = model.take_cache();
    cache.seq_len += 1;
    let e = model.put_cache(cache).unwrap_err().to_string();
    assert!(e.contains("layer 0"), "{e}");
    assert_eq!(model.seq_len(), 0, "a refused cache leaves the model empty");
}

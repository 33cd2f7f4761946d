//! The GPU encoder against the CPU encoder on the cache contents, with the prompt split into chunks
//! of several sizes (1 token, a size that leaves a partial last chunk, one chunk) and a committed
//! block after it: chunk seams must not change the K/V beyond rounding (spec §4.5), in sliding
//! layers (window 8 here, shorter than the prompt) and full layers alike, also where the sliding
//! caches hold only the window and a chunk (the window moves to row 0 as the sequence grows). A
//! chunk recorded and submitted a few layers at a time writes the one plan's cache bit for bit.

use dg_gpu::Instrumentation;
use dg_model::ModelDir;
use dg_parity::checks::Backend;
use dg_parity::gpu::GpuBackend;
use dg_parity::reference::Reference;
use dg_parity::testing::{fixture, test_context};

#[test]
fn gpu_encoder_cache_matches_cpu_for_every_chunk_size() {
    let Some(ctx) = test_context("gpu_encoder_cache_matches_cpu_for_every_chunk_size") else { return };
    let dir = fixture("sliding-long-prompt");
    let model = ModelDir::open(&dir).unwrap();
    let reference = Reference::open(&dir).unwrap();
    let prompt = reference.ids("prompt_ids").unwrap();
    let block2 = reference.ids("block2_ids").unwrap();
    assert!(prompt.len() > model.config.text.sliding_window, "the prompt must outrun the window");
    let mut gpu = GpuBackend::new(ctx, &model.config, model.load_weights().unwrap(), 512).unwrap();
    for chunk in [1, 5, prompt.len()] {
        gpu.gpu.set_prefill_chunk(chunk);
        let r = gpu.cache_check(&[&prompt, &block2]).unwrap().unwrap();
        assert!(r.passed, "chunk {chunk}: {} {}", r.name, r.detail);
    }
}

#[test]
fn gpu_encoder_cache_matches_cpu_when_the_sliding_window_moves() {
    // Sliding caches sized for the window and a chunk of 16 (the canvas): the prompt and the
    // committed block run past them, so the window moves to row 0 before later chunks.
    let test = "gpu_encoder_cache_matches_cpu_when_the_sliding_window_moves";
    let Some(mut ctx) = test_context(test) else { return };
    ctx.tuning.prefill_rows = Some(1);
    let dir = fixture("sliding-long-prompt");
    let model = ModelDir::open(&dir).unwrap();
    let reference = Reference::open(&dir).unwrap();
    let prompt = reference.ids("prompt_ids").unwrap();
    let block2 = reference.ids("block2_ids").unwrap();
    let mut gpu = GpuBackend::new(ctx, &model.config, model.load_weights().unwrap(), 512).unwrap();
    let positions = gpu.gpu.sliding_positions();
    assert!(positions < prompt.len() + block2.len(), "the sliding caches hold {positions} positions: the window would not move");
    for chunk in [1, 5, model.config.canvas_length] {
        gpu.gpu.set_prefill_chunk(chunk);
        let r = gpu.cache_check(&[&prompt, &block2]).unwrap().unwrap();
        assert!(r.passed, "chunk {chunk}: {} {}", r.name, r.detail);
    }
}

#[test]
fn gpu_encoder_rejects_bad_input_by_name() {
    let Some(ctx) = test_context("gpu_encoder_rejects_bad_input_by_name") else { return };
    let dir = fixture("sliding-long-prompt");
    let model = ModelDir::open(&dir).unwrap();
    let v = model.config.text.vocab_size as u32;
    let mut gpu = dg_gpu::GpuModel::load(ctx, &model.config, &model.load_weights().unwrap(), dg_gpu::ModelOptions::new(40)).unwrap();
    let e = gpu.encode(&[1, 2, v]).unwrap_err().to_string();
    assert!(e.contains(&format!("token id {v} at position 2")) && e.contains(&format!("vocab_size {v}")), "{e}");
    let e = gpu.encode(&[1; 41]).unwrap_err().to_string();
    assert!(e.contains("41 tokens") && e.contains("max_context 40"), "{e}");
    assert!(gpu.encode(&[]).unwrap_err().to_string().contains("empty"));
    // Nothing was encoded by the failed calls; a canvas forward without context says so.
    let c = model.config.canvas_length;
    let mut logits = vec![0f32; c * v as usize];
    let e = gpu.canvas_forward(&vec![0; c], None, &mut logits).unwrap_err().to_string();
    assert!(e.contains("encode a prompt"), "{e}");
    gpu.encode(&[1; 40]).unwrap();
    let e = gpu.canvas_forward(&vec![v; c], None, &mut logits).unwrap_err().to_string();
    assert!(e.contains("of the canvas is out of range"), "{e}");
}

#[test]
fn the_encoder_submitted_in_parts_writes_the_whole_plans_bits() {
    // DG_ENCODER_SUBMIT_LAYERS: a chunk's layers recorded and submitted a few at a time run the
    // one plan's dispatches in its order, so the cache is the same to the bit.
    let test = "the_encoder_submitted_in_parts_writes_the_whole_plans_bits";
    let dir = fixture("sliding-long-prompt");
    let model = ModelDir::open(&dir).unwrap();
    let reference = Reference::open(&dir).unwrap();
    let prompt = reference.ids("prompt_ids").unwrap();
    let weights = model.load_weights().unwrap();
    let layers = model.config.text.num_layers();
    let mut caches = Vec::new();
    for per_submit in [layers, 1, 2] {
        let Some(mut ctx) = test_context(test) else { return };
        ctx.tuning.encoder_submit_layers = per_submit;
        let mut gpu = dg_gpu::GpuModel::load(ctx, &model.config, &weights, dg_gpu::ModelOptions::new(512)).unwrap();
        gpu.set_prefill_chunk(5);
        gpu.encode(&prompt).unwrap();
        let cache = gpu.read_visible_cache().unwrap();
        let bits: Vec<u32> = cache.iter().flat_map(|(k, v)| k.iter().chain(v)).map(|x| x.to_bits()).collect();
        assert!(!bits.is_empty() && bits.iter().any(|&b| b != 0), "{per_submit} layers a submit: an empty cache");
        caches.push((per_submit, bits));
    }
    for (per_submit, bits) in &caches[1..] {
        assert!(bits == &caches[0].1, "{per_submit} layers a submit: the cache differs from one plan's");
    }
}

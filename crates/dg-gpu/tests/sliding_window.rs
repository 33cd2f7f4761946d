//! The sliding layers' caches hold a window and a chunk, not the whole context
//! (`Arena::sliding_positions`): as a sequence grows past them, the window moves to row 0 before
//! an encoder chunk. The products then read the same values at other rows, so a generation and
//! its cache are the same bits as with caches that hold every position (a restored snapshot's
//! continuation: `cache_snapshot.rs`), and so are the caches and logits after random runs of
//! chunks and restores.

use std::path::Path;

use dg_gpu::{GpuModel, Instrumentation, KvCacheChoice};
use dg_model::{GenerationConfig, ModelDir};
use dg_parity::testing::test_context;
use dg_sampler::{NoHooks, SeededRng, generate_resident};

/// Tokens of an encoder chunk in both models: the moving model's arena is sized for it, the other
/// encodes in chunks of it too, so that both round alike (chunking changes rounding, spec §4.5).
const CHUNK: usize = 40;
const CONTEXT: usize = 512;

fn ids(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32).map(|i| 3 + (i * 7 + salt) % 500).collect()
}

/// The bundled model with caches of every position (`moving` false) or of a window and a chunk,
/// storing K and V as `kv_cache` says.
fn model(test: &str, dir: &ModelDir, moving: bool, kv_cache: KvCacheChoice) -> Option<GpuModel> {
    let mut ctx = test_context(test)?;
    ctx.tuning.kv_cache = kv_cache;
    if moving {
        ctx.tuning.prefill_rows = Some(CHUNK);
    }
    let mut model = GpuModel::load(ctx, &dir.config, &dir.load_weights().unwrap(), dg_gpu::ModelOptions::new(CONTEXT)).unwrap();
    model.set_prefill_chunk(CHUNK);
    Some(model)
}

fn cache_bits(model: &mut GpuModel) -> Vec<u32> {
    model.read_visible_cache().unwrap().iter().flat_map(|(k, v)| k.iter().chain(v)).map(|x| x.to_bits()).collect()
}

#[test]
fn a_generation_whose_sliding_window_moves_gives_the_same_bits() {
    let test = "a_generation_whose_sliding_window_moves_gives_the_same_bits";
    let dir = ModelDir::open(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/tiny-random")).unwrap();
    let (c, v) = (dir.config.canvas_length, dir.config.text.vocab_size);
    // Three canvases after a prompt of several chunks, every step, no EOS.
    let cfg = GenerationConfig { max_new_tokens: 3 * c, max_denoising_steps: 2, stopping: None, ..Default::default() };
    let prompt = ids(150, 1);
    // f32 caches, then f16 ones (rows of half the bytes to move).
    for kv_cache in [KvCacheChoice::F32, KvCacheChoice::F16] {
        let mut runs = Vec::new();
        for moving in [false, true] {
            let Some(mut model) = model(test, &dir, moving, kv_cache) else { return };
            if moving {
                assert!(
                    model.sliding_positions() < prompt.len() && model.sliding_positions() < CONTEXT,
                    "the sliding caches hold {} positions: the window would not move",
                    model.sliding_positions()
                );
            } else {
                assert_eq!(model.sliding_positions(), CONTEXT);
            }
            let out = generate_resident(&mut model, &prompt, &cfg, c, v, &mut SeededRng::new(3), &mut NoHooks).unwrap();
            runs.push((out.sequence, cache_bits(&mut model)));
        }
        assert_eq!(runs[0].0.len(), prompt.len() + 3 * c);
        assert!(runs[0].0 == runs[1].0, "{kv_cache:?}: the tokens differ when the sliding window moves");
        assert!(runs[0].1 == runs[1].1, "{kv_cache:?}: the visible cache differs when the sliding window moves");
    }
}

/// Random runs of encoder chunks of 1..=CHUNK tokens, with snapshots of one sequence restored
/// after others: after every chunk the moving model's visible cache is the bits of the model
/// whose caches hold every position, and so are the canvas forward's logits now and then.
#[test]
fn random_chunks_and_restores_keep_the_moving_caches_bits() {
    let test = "random_chunks_and_restores_keep_the_moving_caches_bits";
    let dir = ModelDir::open(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/tiny-random")).unwrap();
    let (c, v) = (dir.config.canvas_length, dir.config.text.vocab_size as u32);
    for (seed, kv_cache) in [(1, KvCacheChoice::F32), (2, KvCacheChoice::F16)] {
        let Some(mut every) = model(test, &dir, false, kv_cache) else { return };
        let Some(mut moving) = model(test, &dir, true, kv_cache) else { return };
        let mut rng = SeededRng::new(seed);
        let mut saved = None;
        let (mut moved, mut restored) = (false, 0);
        for step in 0..60 {
            let room = CONTEXT - every.seq_len() - c;
            if room == 0 || rng.below(10) == 0 {
                // Keep this sequence (once), start another; later put the kept one back.
                if saved.is_none() && every.seq_len() > 0 {
                    saved = Some((every.snapshot_cache().unwrap(), moving.snapshot_cache().unwrap()));
                } else if let Some((a, b)) = &saved {
                    every.restore_cache(a).unwrap();
                    moving.restore_cache(b).unwrap();
                    restored += 1;
                    assert!(cache_bits(&mut every) == cache_bits(&mut moving), "seed {seed} step {step}: after a restore");
                    continue;
                }
                every.reset();
                moving.reset();
                continue;
            }
            let n = 1 + rng.below(CHUNK.min(room) as u32) as usize;
            let ids: Vec<u32> = (0..n).map(|_| rng.below(v)).collect();
            every.encode(&ids).unwrap();
            moving.encode(&ids).unwrap();
            moved |= moving.seq_len() > moving.sliding_positions();
            assert!(cache_bits(&mut every) == cache_bits(&mut moving), "seed {seed} step {step}: after a chunk of {n}");
            if step % 7 == 0 {
                let canvas: Vec<u32> = (0..c).map(|_| rng.below(v)).collect();
                let mut logits = [vec![0f32; c * v as usize], vec![0f32; c * v as usize]];
                every.canvas_forward(&canvas, None, &mut logits[0]).unwrap();
                moving.canvas_forward(&canvas, None, &mut logits[1]).unwrap();
                let bits = |l: &[f32]| l.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert!(bits(&logits[0]) == bits(&logits[1]), "seed {seed} step {step}: the canvas forward's logits");
            }
        }
        assert!(moved && restored > 0, "seed {seed}: the window never moved ({moved}) or nothing was restored ({restored})");
    }
}

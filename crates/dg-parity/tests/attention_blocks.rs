//! Attention in blocks of queries (`dg_gpu`'s `Arena::query_block`): where a group's scores would
//! not fit the arena's scores buffer (long contexts), its queries run in blocks whose scores do.
//! With the buffer capped to one block of 16 queries over the most keys of the model's context,
//! canvases of 32 and 64 queries against a cache that fills the context, and a long prompt's
//! encoder chunk, run in blocks; the forward's logits still hold the transformers fixtures'
//! tolerances, the encoder's cache the CPU's, and a seeded generation gives the CPU's tokens.

use dg_gpu::{GpuContext, GpuModel, Instrumentation};
use dg_model::ModelDir;
use dg_parity::checks::{Backend, logits_checks};
use dg_parity::gpu::GpuBackend;
use dg_parity::reference::Reference;
use dg_parity::replay::replay_config;
use dg_parity::testing::{fixture, test_context};
use dg_sampler::{NoHooks, SeededRng};

/// Tokens of the long prompt the encoder's check runs (one chunk), and that check's context.
const LONG: usize = 150;
const LONG_CONTEXT: usize = 512;

/// The test's device with the scores buffer at its least: one block of 16 queries.
fn capped(test: &str) -> Option<GpuContext> {
    let mut ctx = test_context(test)?;
    ctx.tuning.scores_bytes = Some(1);
    Some(ctx)
}

/// Keys of a canvas forward after `cached` tokens (padded as the decoder pads them).
fn canvas_keys(cached: usize, c: usize) -> usize {
    cached.next_multiple_of(32) + c
}

fn blocked(gpu: &GpuModel, queries: usize, keys: usize) -> bool {
    gpu.attention_block(queries, keys).unwrap() < queries
}

#[test]
fn attention_in_blocks_of_queries_holds_the_fixtures_logits_and_cache() {
    let test = "attention_in_blocks_of_queries_holds_the_fixtures_logits_and_cache";
    for name in ["default-pattern-8experts", "tensor-core-shapes"] {
        let dir = fixture(name);
        let model = ModelDir::open(&dir).unwrap();
        let reference = Reference::open(&dir).unwrap();
        let c = model.config.canvas_length;
        let prompt = reference.ids("prompt_ids").unwrap().len();
        // The logits checks' context: the prompt, then a block and its canvas.
        let Some(ctx) = capped(test) else { return };
        let mut gpu = GpuBackend::new(ctx, &model.config, model.load_weights().unwrap(), prompt + 2 * c).unwrap();
        assert!(blocked(gpu.gpu(), c, canvas_keys(prompt + c, c)), "{name}: the second block's canvas would not run in blocks");
        let checks = logits_checks(&reference, &mut gpu).unwrap();
        assert!(checks.iter().any(|r| r.name == "logits_block2"), "{name}: no second block's logits");
        for r in checks {
            assert!(r.passed, "{name}: {} {}", r.name, r.detail);
        }
        // A long prompt, encoded as one chunk.
        let Some(ctx) = capped(test) else { return };
        let mut gpu = GpuBackend::new(ctx, &model.config, model.load_weights().unwrap(), LONG_CONTEXT).unwrap();
        assert!(blocked(gpu.gpu(), LONG, LONG.next_multiple_of(32)), "{name}: the long prompt's chunk would not run in blocks");
        let v = model.config.text.vocab_size as u32;
        let long: Vec<u32> = (0..LONG as u32).map(|i| (i * 31 + 5) % v).collect();
        let r = gpu.cache_check(&[&long, &reference.ids("block2_ids").unwrap()]).unwrap().unwrap();
        assert!(r.passed, "{name}: {} {}", r.name, r.detail);
    }
}

#[test]
fn a_generation_with_attention_in_blocks_gives_the_cpus_tokens() {
    let test = "a_generation_with_attention_in_blocks_gives_the_cpus_tokens";
    let path = fixture("default-pattern-8experts");
    let reference = Reference::open(&path).unwrap();
    let dir = ModelDir::open(&path).unwrap();
    let cfg = replay_config(&reference, &dir.generation, &dir.config).unwrap();
    let prompt = reference.ids("prompt_ids").unwrap();
    let (c, v) = (dir.config.canvas_length, dir.config.text.vocab_size);
    let context = prompt.len() + cfg.max_new_tokens.next_multiple_of(c);
    let Some(ctx) = capped(test) else { return };
    let mut gpu = GpuBackend::new(ctx, &dir.config, dir.load_weights().unwrap(), context).unwrap();
    // The last canvas (cfg.max_new_tokens covers at least two) runs in blocks.
    assert!(cfg.max_new_tokens > c && blocked(gpu.gpu(), c, canvas_keys(context - c, c)), "the last canvas would not run in blocks");
    let ours = gpu.generate_resident(&prompt, &cfg, &mut SeededRng::new(7), &mut NoHooks).unwrap().unwrap().sequence;
    let mut cpu = dg_parity::cpu::CpuBackend(dg_cpu::CpuModel::new(dir.config.clone(), dir.load_weights().unwrap()));
    let theirs = dg_sampler::generate(&mut dg_parity::replay::AsModel(&mut cpu), &prompt, &cfg, c, v, &mut SeededRng::new(7), &mut NoHooks)
        .unwrap()
        .sequence;
    assert_eq!(ours.len(), context, "the run stopped early");
    assert_eq!(ours, theirs, "blocked attention on the GPU and the CPU differ for the same seed");
}

/// Blocks of queries that are not multiples of 16: the scores buffer capped to 26 queries of the
/// second block's canvas (64 queries of `tensor-core-shapes`), which then runs in blocks of 22,
/// 22 and 20 (`Arena::query_block` makes them as even as they fit); the logits still hold the
/// fixtures' tolerances.
#[test]
fn ragged_blocks_of_queries_hold_the_fixtures_logits() {
    let test = "ragged_blocks_of_queries_hold_the_fixtures_logits";
    let dir = fixture("tensor-core-shapes");
    let model = ModelDir::open(&dir).unwrap();
    let reference = Reference::open(&dir).unwrap();
    let (c, heads) = (model.config.canvas_length, model.config.text.num_attention_heads);
    let prompt = reference.ids("prompt_ids").unwrap().len();
    let keys = canvas_keys(prompt + c, c);
    let Some(mut ctx) = test_context(test) else { return };
    ctx.tuning.scores_bytes = Some((4 * heads * 26 * keys) as u64);
    let mut gpu = GpuBackend::new(ctx, &model.config, model.load_weights().unwrap(), prompt + 2 * c).unwrap();
    assert_eq!(gpu.gpu().attention_block(c, keys).unwrap(), 22, "the second block's canvas: not in blocks of 22");
    let checks = logits_checks(&reference, &mut gpu).unwrap();
    assert!(checks.iter().any(|r| r.name == "logits_block2"), "no second block's logits");
    for r in checks {
        assert!(r.passed, "{} {}", r.name, r.detail);
    }
}

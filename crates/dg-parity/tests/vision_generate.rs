//! A generation from a prompt holding an image, replayed on the CPU from the draws transformers'
//! `generate` made (fixtures/vision-generate, tools/oracle/make_vision_generate_fixture.py): the
//! fixture's image through dg's processor, tower and projection, the soft tokens placed by the
//! first encode ([`dg_cpu::ImagePrompt`]), and the sampler fed the recorded draws must give
//! transformers' sequence token for token.

use dg_cpu::vision::{ImagePatches, image_embeddings};
use dg_cpu::{CpuModel, ImagePrompt};
use dg_image::{DecodeLimits, ImageProcessor, decode};
use dg_model::{ModelDir, VisionWeights};
use dg_parity::reference::Reference;
use dg_parity::replay::replay_config;
use dg_parity::testing::fixture;
use dg_sampler::{NoHooks, Replay, generate};

#[derive(serde::Deserialize)]
struct Meta {
    image: String,
    max_soft_tokens: usize,
    soft_tokens: usize,
}

#[test]
fn cpu_replay_of_an_image_prompt_generates_what_transformers_generated() {
    let dir = fixture("vision-generate");
    let model = ModelDir::open(&dir).unwrap();
    let reference = Reference::open_named(&dir, "generate").unwrap();
    let meta: Meta = serde_json::from_str(&std::fs::read_to_string(dir.join("generate.json")).unwrap()).unwrap();
    let vision = model.config.vision.clone().expect("the fixture has a vision tower");
    let weights = VisionWeights::build(&model.checkpoint, &vision, model.config.text.hidden_size).unwrap();
    let processor = ImageProcessor { patch_size: vision.patch_size, pooling_kernel_size: vision.pooling_kernel_size, max_soft_tokens: 0 }
        .with_budget(meta.max_soft_tokens)
        .unwrap();
    let bytes = std::fs::read(fixture("image-processor").join(&meta.image)).unwrap();
    let image = processor.process(&decode(&bytes, DecodeLimits::default()).unwrap()).unwrap();
    assert_eq!(image.num_soft_tokens, meta.soft_tokens, "soft tokens of {}", meta.image);
    let patches = ImagePatches { pixel_values: &image.pixel_values, positions: &image.positions };
    let embeddings = image_embeddings(&vision, &weights, patches).unwrap();

    let prompt = reference.ids("prompt_ids").unwrap();
    let image_token = model.config.image_token_id.unwrap();
    assert_eq!(prompt.iter().filter(|&&id| id == image_token).count(), meta.soft_tokens, "the prompt's soft tokens");
    let cfg = replay_config(&reference, &model.generation, &model.config).unwrap();
    let (c, v) = (model.config.canvas_length, model.config.text.vocab_size);
    let want = reference.ids("gen_sequences").unwrap();
    let cpu = CpuModel::new(model.config.clone(), model.load_weights().unwrap());
    let mut replay = Replay::new(reference.draws().unwrap());
    let mut prompted = ImagePrompt::new(cpu, embeddings);
    let got = generate(&mut prompted, &prompt, &cfg, c, v, &mut replay, &mut NoHooks).unwrap();
    assert_eq!(got.sequence, want, "dg's replay differs from transformers' generate");
    assert_eq!(replay.consumed(), reference.meta.draws.len(), "draws left over");

    // The image matters: the same draws with its soft tokens looked up as pad do not give it.
    let mut blind = CpuModel::new(model.config.clone(), model.load_weights().unwrap());
    let without = generate(&mut blind, &prompt, &cfg, c, v, &mut Replay::new(reference.draws().unwrap()), &mut NoHooks);
    assert!(without.map(|g| g.sequence).ok() != Some(want), "the replay gives transformers' sequence without the image too");
}

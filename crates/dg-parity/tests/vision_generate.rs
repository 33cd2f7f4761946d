//! A generation from a prompt holding an image, replayed on the CPU and on the GPU from the draws
//! transformers' `generate` made (fixtures/vision-generate,
//! tools/oracle/make_vision_generate_fixture.py): the fixture's image through dg's processor, tower
//! and projection, the soft tokens placed by the first encode ([`dg_sampler::ImagePrompt`]), and
//! the sampler fed the recorded draws must give transformers' sequence token for token.

use dg_cpu::CpuModel;
use dg_cpu::vision::{ImagePatches, image_embeddings};
use dg_gpu::{GpuModel, ModelOptions};
use dg_image::{DecodeLimits, ImageProcessor, decode};
use dg_kernels::WeightFormat;
use dg_model::{GenerationConfig, ModelDir, VisionWeights};
use dg_parity::reference::Reference;
use dg_parity::replay::replay_config;
use dg_parity::testing::{fixture, test_context};
use dg_sampler::{ImagePrompt, NoHooks, Replay, generate};

#[derive(serde::Deserialize)]
struct Meta {
    image: String,
    max_soft_tokens: usize,
    soft_tokens: usize,
}

/// The fixture's model, transformers' run, and dg's inputs to replay it.
struct Case {
    model: ModelDir,
    reference: Reference,
    /// The image's rows, `[soft tokens, H]`.
    embeddings: Vec<f32>,
    prompt: Vec<u32>,
    cfg: GenerationConfig,
    want: Vec<u32>,
}

fn case() -> Case {
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
    let want = reference.ids("gen_sequences").unwrap();
    Case { model, reference, embeddings, prompt, cfg, want }
}

#[test]
fn cpu_replay_of_an_image_prompt_generates_what_transformers_generated() {
    let Case { model, reference, embeddings, prompt, cfg, want } = case();
    let (c, v) = (model.config.canvas_length, model.config.text.vocab_size);
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

/// The same replay on the GPU with F32 weights (the image's rows placed after the GPU's lookup, its
/// span bidirectional in the GPU encoder's attention): in one encoder chunk, and in chunks of at
/// most 64 tokens (the text before the image a chunk of its own, the image's 60 soft tokens one of
/// theirs, never cut).
#[test]
fn gpu_replay_of_an_image_prompt_generates_what_transformers_generated() {
    let Case { model, reference, embeddings, prompt, cfg, want } = case();
    let (c, v) = (model.config.canvas_length, model.config.text.vocab_size);
    let positions = prompt.len() + cfg.new_canvases(prompt.len(), c) * c;
    for prefill_rows in [None, Some(64)] {
        let test = "gpu_replay_of_an_image_prompt_generates_what_transformers_generated";
        let Some(mut ctx) = test_context(test) else { return };
        ctx.tuning.prefill_rows = prefill_rows;
        let options = ModelOptions::new(positions).format(WeightFormat::F32);
        let gpu = GpuModel::load(ctx, &model.config, &model.checkpoint, options).unwrap();
        let mut replay = Replay::new(reference.draws().unwrap());
        let mut prompted = ImagePrompt::new(gpu, embeddings.clone());
        let got = generate(&mut prompted, &prompt, &cfg, c, v, &mut replay, &mut NoHooks).unwrap();
        assert_eq!(got.sequence, want, "prefill rows {prefill_rows:?}: the GPU's replay differs from transformers' generate");
        assert_eq!(replay.consumed(), reference.meta.draws.len(), "draws left over");
    }
}

//! The CPU vision tower and projection against transformers (`Gemma4VisionModel` +
//! `embed_vision`) on the vision-encoder fixture (tools/oracle/make_vision_fixture.py): the committed
//! test images through dg's processor, then the tower, soft token by soft token; and the logits of a
//! canvas forward after a prompt holding both images (soft tokens in place, each image's run
//! bidirectional in the encoder), on the CPU and on the GPU.

use dg_cpu::CpuModel;
use dg_cpu::vision::{ImagePatches, embed_vision, vision_tower};
use dg_gpu::{GpuModel, GpuVisionTower, ModelOptions};
use dg_image::{DecodeLimits, ImageProcessor, decode};
use dg_kernels::WeightFormat;
use dg_model::{ModelDir, SafetensorsFile, VisionWeights};
use dg_parity::checks::{ARGMAX_MARGIN, CPU_LOGITS_TOLERANCE, F16_ACTIVATION_TOLERANCES, GPU_LOGITS_TOLERANCE};
use dg_parity::compare::compare;
use dg_parity::testing::{fixture, test_context};

/// Normwise tolerance of the f32 tower against transformers' f32 tower: the same f32 operations in
/// another summation order, as for the text model's logits (the fixture records transformers' own
/// f32-vs-f64 gap, about 3e-7).
const TOWER_TOLERANCE: f64 = CPU_LOGITS_TOLERANCE;

const IMAGES: [&str; 2] = ["wide.png", "tall.png"];

/// The fixture's recorded transformers outputs.
fn reference(dir: &std::path::Path) -> SafetensorsFile {
    SafetensorsFile::open(&dir.join("vision.safetensors")).unwrap()
}

fn ids(reference: &SafetensorsFile, name: &str) -> Vec<u32> {
    reference.tensor_i64(name).unwrap().1.into_iter().map(|v| u32::try_from(v).unwrap()).collect()
}

/// Per test image: the tower's soft tokens and their projection into the text model.
fn encode_images(model: &ModelDir) -> Vec<(Vec<f32>, Vec<f32>)> {
    let vision = model.config.vision.clone().expect("the fixture has a vision_config");
    let weights = VisionWeights::build(&model.checkpoint, &vision, model.config.text.hidden_size).unwrap();
    let processor = ImageProcessor { patch_size: vision.patch_size, pooling_kernel_size: vision.pooling_kernel_size, max_soft_tokens: 70 };
    IMAGES
        .iter()
        .map(|file| {
            let bytes = std::fs::read(fixture("image-processor").join(file)).unwrap();
            let image = processor.process(&decode(&bytes, DecodeLimits::default()).unwrap()).unwrap();
            let patches = ImagePatches { pixel_values: &image.pixel_values, positions: &image.positions };
            let soft = vision_tower(&vision, &weights, patches).unwrap();
            let embedded = embed_vision(&vision, &weights, &soft);
            (soft, embedded)
        })
        .collect()
}

#[test]
fn cpu_vision_tower_matches_transformers_on_the_test_images() {
    let dir = fixture("vision-encoder");
    let model = ModelDir::open(&dir).unwrap();
    let reference = reference(&dir);
    let vision = model.config.vision.clone().unwrap();
    for (i, (file, (soft, embedded))) in IMAGES.iter().zip(encode_images(&model)).enumerate() {
        for (name, ours, cols) in [("soft_tokens", &soft, vision.hidden_size), ("embeddings", &embedded, model.config.text.hidden_size)] {
            let dg_model::Tensor { shape, data: want } = reference.tensor_f32(&format!("image{i}_{name}")).unwrap();
            assert_eq!(shape, [want.len() / cols, cols], "{file} {name}: shape");
            assert_eq!(ours.len(), want.len(), "{file} {name}: soft tokens");
            let c = compare(ours, &want, cols, f32::INFINITY);
            assert!(c.nonfinite_ours == 0 && c.normwise <= TOWER_TOLERANCE, "{file} {name}: {c}");
            eprintln!("{file} {name}: {c}");
        }
    }
}

/// The GPU tower (F32 matrices) on the test images: its rows for the text encoder against
/// transformers' `get_image_features`, normwise within the GPU forward's tolerance; its attention
/// in one block of queries, and in blocks of 64 (scores capped).
#[test]
fn gpu_vision_tower_matches_transformers_on_the_test_images() {
    let Some(mut ctx) = test_context("gpu_vision_tower_matches_transformers_on_the_test_images") else { return };
    let dir = fixture("vision-encoder");
    let model = ModelDir::open(&dir).unwrap();
    let reference = reference(&dir);
    let vision = model.config.vision.clone().unwrap();
    let text_hidden = model.config.text.hidden_size;
    let mut tower = GpuVisionTower::load(&ctx, &vision, text_hidden, &model.checkpoint, WeightFormat::F32).unwrap();
    let processor = ImageProcessor { patch_size: vision.patch_size, pooling_kernel_size: vision.pooling_kernel_size, max_soft_tokens: 70 };
    for blocks_of in [None, Some(64)] {
        for (i, file) in IMAGES.iter().enumerate() {
            let bytes = std::fs::read(fixture("image-processor").join(file)).unwrap();
            let image = processor.process(&decode(&bytes, DecodeLimits::default()).unwrap()).unwrap();
            ctx.tuning.scores_bytes = blocks_of.map(|q: usize| (4 * vision.num_heads * image.positions.len() * q) as u64);
            let ours = tower.image_embeddings(&ctx, &image.pixel_values, &image.positions).unwrap();
            let want = reference.tensor_f32(&format!("image{i}_embeddings")).unwrap().data;
            assert_eq!(ours.len(), want.len(), "{file}: soft tokens");
            let c = compare(&ours, &want, text_hidden, f32::INFINITY);
            eprintln!("{file} GPU embeddings, queries in blocks of {blocks_of:?}: {c}");
            assert!(c.nonfinite_ours == 0 && c.normwise <= GPU_LOGITS_TOLERANCE, "{file}: {c}");
        }
    }
    // Patches that do not pool into whole soft tokens are refused by name.
    let err = tower.image_embeddings(&ctx, &vec![0.5; 4 * vision.patch_width()], &[[0, 0], [1, 0], [0, 1], [1, 1]]).unwrap_err();
    assert!(err.to_string().contains("do not pool"), "{err}");
}

/// The GPU tower with its matrices stored as F16 (the position table as BF16, as the F16 mode
/// keeps an embedding), against the CPU tower on the same rounded weights: where the device has
/// cooperative matrices its weight products run on the tensor cores (activations rounded to f16),
/// held to the F16 mode's tolerance; elsewhere f32 products on the rounded weights, held to the
/// f32 GPU's.
#[test]
fn gpu_vision_tower_in_the_f16_mode_holds_the_f16_tolerances() {
    let Some(ctx) = test_context("gpu_vision_tower_in_the_f16_mode_holds_the_f16_tolerances") else { return };
    let dir = fixture("vision-encoder");
    let model = ModelDir::open(&dir).unwrap();
    let vision = model.config.vision.clone().unwrap();
    let text_hidden = model.config.text.hidden_size;
    let mut weights = VisionWeights::build(&model.checkpoint, &vision, text_hidden).unwrap();
    let f16 = |m: &mut dg_model::Matrix| m.data.iter_mut().for_each(|v| *v = half::f16::from_f32(*v).to_f32());
    f16(&mut weights.input_proj);
    f16(&mut weights.embedding_projection);
    for l in &mut weights.layers {
        for m in [&mut l.q_proj, &mut l.k_proj, &mut l.v_proj, &mut l.o_proj, &mut l.gate_proj, &mut l.up_proj, &mut l.down_proj] {
            f16(m);
        }
    }
    weights.position_embedding_table.iter_mut().for_each(|v| *v = half::bf16::from_f32(*v).to_f32());
    let processor = ImageProcessor { patch_size: vision.patch_size, pooling_kernel_size: vision.pooling_kernel_size, max_soft_tokens: 70 };
    let bytes = std::fs::read(fixture("image-processor").join(IMAGES[0])).unwrap();
    let image = processor.process(&decode(&bytes, DecodeLimits::default()).unwrap()).unwrap();
    let patches = ImagePatches { pixel_values: &image.pixel_values, positions: &image.positions };
    let want = embed_vision(&vision, &weights, &vision_tower(&vision, &weights, patches).unwrap());
    let tolerance = if ctx.coop_matrix { F16_ACTIVATION_TOLERANCES.logits } else { GPU_LOGITS_TOLERANCE };
    let mut tower = GpuVisionTower::load(&ctx, &vision, text_hidden, &model.checkpoint, WeightFormat::F16).unwrap();
    let ours = tower.image_embeddings(&ctx, &image.pixel_values, &image.positions).unwrap();
    let c = compare(&ours, &want, text_hidden, f32::INFINITY);
    eprintln!("{} GPU embeddings, F16 matrices (cooperative matrices: {}): {c}", IMAGES[0], ctx.coop_matrix);
    assert!(c.nonfinite_ours == 0 && c.normwise <= tolerance, "{c}");
}

/// One canvas forward after `prompt` with the images' embeddings in place, the encoder's image runs
/// bidirectional or (to show the mask matters) causal.
fn logits_after_image_prompt(dir: &std::path::Path, bidirectional: bool) -> (Vec<f32>, Vec<f32>, usize) {
    let mut model = ModelDir::open(dir).unwrap();
    let reference = reference(dir);
    let embeddings: Vec<f32> = encode_images(&model).into_iter().flat_map(|(_, e)| e).collect();
    model.config.images_bidirectional = bidirectional;
    let vocab = model.config.text.vocab_size;
    let weights = model.load_weights().unwrap();
    let mut cpu = CpuModel::new(model.config, weights);
    cpu.encode_with_images(&ids(&reference, "prompt_ids"), &embeddings).unwrap();
    let canvas = ids(&reference, "canvas_ids");
    let mut logits = vec![0f32; canvas.len() * vocab];
    cpu.canvas_forward(&canvas, None, &mut logits).unwrap();
    let want = reference.tensor_f32("logits_image_prompt").unwrap().data;
    (logits, want, vocab)
}

#[test]
fn cpu_canvas_logits_after_an_image_prompt_match_transformers() {
    let dir = fixture("vision-encoder");
    let (ours, want, vocab) = logits_after_image_prompt(&dir, true);
    let c = compare(&ours, &want, vocab, ARGMAX_MARGIN);
    eprintln!("logits after the image prompt: {c}");
    assert!(c.nonfinite_ours == 0 && c.normwise <= CPU_LOGITS_TOLERANCE && c.argmax_mismatches.is_empty(), "{c}");
    // The images' bidirectional runs are what the reference holds: causal ones miss it by far.
    let (causal, _, _) = logits_after_image_prompt(&dir, false);
    let off = compare(&causal, &want, vocab, ARGMAX_MARGIN);
    assert!(off.normwise > 100.0 * CPU_LOGITS_TOLERANCE, "causal image runs match too: {off}");
}

/// [`logits_after_image_prompt`] on the GPU with F32 weights, the encoder's prompt in chunks of at
/// most `prefill_rows` tokens (None: the arena's default).
fn gpu_logits_after_image_prompt(dir: &std::path::Path, bidirectional: bool, prefill_rows: Option<usize>) -> Option<Vec<f32>> {
    let mut model = ModelDir::open(dir).unwrap();
    let reference = reference(dir);
    let embeddings: Vec<f32> = encode_images(&model).into_iter().flat_map(|(_, e)| e).collect();
    model.config.images_bidirectional = bidirectional;
    let mut ctx = test_context("gpu_canvas_logits_after_an_image_prompt_match_transformers")?;
    ctx.tuning.prefill_rows = prefill_rows;
    let prompt = ids(&reference, "prompt_ids");
    let canvas = ids(&reference, "canvas_ids");
    let options = ModelOptions::new(prompt.len() + canvas.len()).format(WeightFormat::F32);
    let mut gpu = GpuModel::load(ctx, &model.config, &model.checkpoint, options).unwrap();
    gpu.encode_with_images(&prompt, &embeddings).unwrap();
    let mut logits = vec![0f32; canvas.len() * model.config.text.vocab_size];
    gpu.canvas_forward(&canvas, None, &mut logits).unwrap();
    Some(logits)
}

#[test]
fn gpu_canvas_logits_after_an_image_prompt_match_transformers() {
    let dir = fixture("vision-encoder");
    let want = reference(&dir).tensor_f32("logits_image_prompt").unwrap().data;
    let vocab = ModelDir::open(&dir).unwrap().config.text.vocab_size;
    // One chunk, and chunks of at most 96 tokens (each image's run in a chunk of its own).
    for prefill_rows in [None, Some(96)] {
        let Some(ours) = gpu_logits_after_image_prompt(&dir, true, prefill_rows) else { return };
        let c = compare(&ours, &want, vocab, ARGMAX_MARGIN);
        eprintln!("GPU logits after the image prompt, prefill rows {prefill_rows:?}: {c}");
        assert!(c.nonfinite_ours == 0 && c.normwise <= GPU_LOGITS_TOLERANCE && c.argmax_mismatches.is_empty(), "{c}");
    }
    let Some(causal) = gpu_logits_after_image_prompt(&dir, false, None) else { return };
    let off = compare(&causal, &want, vocab, ARGMAX_MARGIN);
    assert!(off.normwise > 100.0 * GPU_LOGITS_TOLERANCE, "causal image runs match too: {off}");
}

#[test]
fn image_embeddings_must_fill_every_soft_token() {
    let model = ModelDir::open(&fixture("vision-encoder")).unwrap();
    let reference = reference(&fixture("vision-encoder"));
    let hidden = model.config.text.hidden_size;
    let weights = model.load_weights().unwrap();
    let mut cpu = CpuModel::new(model.config.clone(), weights);
    let err = cpu.encode_with_images(&ids(&reference, "prompt_ids"), &vec![0.0; 3 * hidden]).unwrap_err();
    assert!(err.to_string().contains("image embeddings"), "{err}");
    let Some(ctx) = test_context("image_embeddings_must_fill_every_soft_token") else { return };
    let mut gpu = GpuModel::load(ctx, &model.config, &model.checkpoint, ModelOptions::new(512)).unwrap();
    let err = gpu.encode_with_images(&ids(&reference, "prompt_ids"), &vec![0.0; 3 * hidden]).unwrap_err();
    assert!(err.to_string().contains("image embeddings"), "{err}");
    assert_eq!(gpu.seq_len(), 0, "a refused encode encoded something");
}

/// The tower from llama.cpp's projector files of the same tower (`mmproj-f32.gguf`,
/// `mmproj-f16.gguf`: its converter's output, tools/oracle/make_mmproj_fixture.py): the geometry
/// read from the file is the config's, and every weight is the checkpoint's, exactly in the f32
/// file and rounded to f16 where the f16 file stores a matrix as F16.
#[test]
fn the_tower_opens_from_llama_cpp_mmproj_files() {
    use dg_model::gguf::Mmproj;
    let dir = fixture("vision-encoder");
    let model = ModelDir::open(&dir).unwrap();
    let vision = model.config.vision.clone().unwrap();
    let hidden = model.config.text.hidden_size;
    let want = VisionWeights::build(&model.checkpoint, &vision, hidden).unwrap();
    for (file, f16) in [("mmproj-f32.gguf", false), ("mmproj-f16.gguf", true)] {
        let mmproj = Mmproj::open(&dir.join(file)).unwrap();
        // GGUF stores the norms' epsilon as an f32 (the ops take it as one).
        let eps_f32 = |c: &dg_model::VisionConfig| dg_model::VisionConfig { rms_norm_eps: f64::from(c.rms_norm_eps as f32), ..c.clone() };
        assert_eq!(eps_f32(mmproj.config()), eps_f32(&vision), "{file}: geometry");
        assert_eq!(mmproj.projection_dim(), hidden, "{file}: projection");
        let got = VisionWeights::build(&mmproj, mmproj.config(), hidden).unwrap();
        let matrices = |w: &VisionWeights| -> Vec<Vec<f32>> {
            let mut m = vec![w.input_proj.data.clone(), w.embedding_projection.data.clone()];
            for l in &w.layers {
                m.extend([&l.q_proj, &l.k_proj, &l.v_proj, &l.o_proj, &l.gate_proj, &l.up_proj, &l.down_proj].map(|x| x.data.clone()));
            }
            m
        };
        for (i, (g, w)) in matrices(&got).iter().zip(matrices(&want)).enumerate() {
            let rounded: Vec<f32> = w.iter().map(|&v| if f16 { half::f16::from_f32(v).to_f32() } else { v }).collect();
            assert_eq!(g, &rounded, "{file}: matrix {i}");
        }
        // Vectors and the position table stay F32 in both files.
        assert_eq!(got.position_embedding_table, want.position_embedding_table, "{file}");
        assert_eq!(got.standardize, want.standardize, "{file}");
        for (g, w) in got.layers.iter().zip(&want.layers) {
            assert_eq!((&g.input_layernorm, &g.pre_feedforward_layernorm), (&w.input_layernorm, &w.pre_feedforward_layernorm), "{file}");
            assert_eq!(
                (&g.post_attention_layernorm, &g.post_feedforward_layernorm),
                (&w.post_attention_layernorm, &w.post_feedforward_layernorm)
            );
            assert_eq!((&g.q_norm, &g.k_norm), (&w.q_norm, &w.k_norm), "{file}");
        }
    }
}

#[test]
fn a_model_gguf_is_no_mmproj() {
    let path = fixture("gguf-q8_0").join("model.gguf");
    let err = dg_model::gguf::Mmproj::open(&path).unwrap_err().to_string();
    assert!(err.contains("not a multimodal projector") && err.contains("model.gguf"), "{err}");
}

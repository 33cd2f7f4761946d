//! The CPU vision tower and projection against transformers (`Gemma4VisionModel` +
//! `embed_vision`) on the vision-encoder fixture (tools/oracle/make_vision_fixture.py): the committed
//! test images through dg's processor, then the tower, soft token by soft token; and the logits of a
//! canvas forward after a prompt holding both images (soft tokens in place, each image's run
//! bidirectional in the encoder).

use dg_cpu::CpuModel;
use dg_cpu::vision::{ImagePatches, embed_vision, vision_tower};
use dg_image::{DecodeLimits, ImageProcessor, decode};
use dg_model::{ModelDir, SafetensorsFile, VisionWeights};
use dg_parity::checks::{ARGMAX_MARGIN, CPU_LOGITS_TOLERANCE};
use dg_parity::compare::compare;
use dg_parity::testing::fixture;

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

#[test]
fn image_embeddings_must_fill_every_soft_token() {
    let model = ModelDir::open(&fixture("vision-encoder")).unwrap();
    let reference = reference(&fixture("vision-encoder"));
    let hidden = model.config.text.hidden_size;
    let weights = model.load_weights().unwrap();
    let mut cpu = CpuModel::new(model.config, weights);
    let err = cpu.encode_with_images(&ids(&reference, "prompt_ids"), &vec![0.0; 3 * hidden]).unwrap_err();
    assert!(err.to_string().contains("image embeddings"), "{err}");
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

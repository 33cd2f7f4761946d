//! The CPU vision tower and projection against transformers (`Gemma4VisionModel` +
//! `embed_vision`) on the vision-encoder fixture (tools/oracle/make_vision_fixture.py): the committed
//! test images through dg's processor, then the tower, soft token by soft token.

use dg_cpu::vision::{ImagePatches, embed_vision, vision_tower};
use dg_image::{DecodeLimits, ImageProcessor, decode};
use dg_model::{ModelDir, VisionWeights};
use dg_parity::checks::CPU_LOGITS_TOLERANCE;
use dg_parity::compare::compare;
use dg_parity::reference::Reference;
use dg_parity::testing::fixture;

/// Normwise tolerance of the f32 tower against transformers' f32 tower: the same f32 operations in
/// another summation order, as for the text model's logits (the fixture records transformers' own
/// f32-vs-f64 gap, about 3e-7).
const TOWER_TOLERANCE: f64 = CPU_LOGITS_TOLERANCE;

#[test]
fn cpu_vision_tower_matches_transformers_on_the_test_images() {
    let dir = fixture("vision-encoder");
    let model = ModelDir::open(&dir).unwrap();
    let reference = Reference::open(&dir).unwrap();
    let vision = model.config.vision.clone().expect("the fixture has a vision_config");
    let weights = VisionWeights::build(&model.checkpoint, &vision, model.config.text.hidden_size).unwrap();
    let processor = ImageProcessor { patch_size: vision.patch_size, pooling_kernel_size: vision.pooling_kernel_size, max_soft_tokens: 70 };
    for (i, file) in ["wide.png", "tall.png"].iter().enumerate() {
        let bytes = std::fs::read(dir.join("../image-processor").join(file)).unwrap();
        let image = processor.process(&decode(&bytes, DecodeLimits::default()).unwrap()).unwrap();
        let patches = ImagePatches { pixel_values: &image.pixel_values, positions: &image.positions };
        let soft = vision_tower(&vision, &weights, patches).unwrap();
        let embedded = embed_vision(&vision, &weights, &soft);
        for (name, ours, cols) in [("soft_tokens", &soft, vision.hidden_size), ("embeddings", &embedded, model.config.text.hidden_size)] {
            let (shape, want) = reference.floats(&format!("image{i}_{name}")).unwrap();
            assert_eq!(shape, [image.num_soft_tokens, cols], "{file} {name}: shape");
            let c = compare(ours, &want, cols, f32::INFINITY);
            assert!(c.nonfinite_ours == 0 && c.normwise <= TOWER_TOLERANCE, "{file} {name}: {c}");
            eprintln!("{file} {name}: {c}");
        }
    }
}

//! The F16 mode on the GGUF fixtures' ggml blocks, on a device with cooperative matrices: the
//! tensor cores dequantize the blocks into f16 tiles (`dg_kernels::format::CoopW`) and round the
//! activations to f16, the matrices the file keeps unquantized are stored as F16 (the embedding
//! as BF16). The CPU twin computes in f32 on those same weights: the dequantized values rounded to
//! F16 (what the tiles hold) and the rest rounded as the F16 mode stores them
//! (`Weights::round_matrices_for_f16_mode`), so the only difference is the activations' rounding:
//! logits within `F16_ACTIVATION_TOLERANCES` with its argmax rule, every layer and the encoder's
//! cache within its layer and cache bounds, as `half_weights.rs` holds F16 weights.
//!
//! On a device without cooperative matrices this prints a visible SKIP (the quantized matrices
//! then keep f32 arithmetic: `cargo xtask parity --backend gpu` checks them against transformers).
//! `DG_FIXTURES` points the test at another fixtures directory.

use dg_cpu::CpuModel;
use dg_gpu::WeightFormat;
use dg_model::ModelDir;
use dg_parity::checks::Backend;
use dg_parity::compare::compare;
use dg_parity::cpu::CpuBackend;
use dg_parity::gpu::GpuBackend;
use dg_parity::reference::Reference;
use dg_parity::testing::{coop_test_context, fixture};

const FIXTURES: [&str; 3] = ["gguf-q8_0", "gguf-q4_k_m", "gguf-q4_k_m-k256"];

#[test]
fn quantized_blocks_in_the_f16_mode_match_the_cpu_on_the_same_weights() {
    let test = "quantized_blocks_in_the_f16_mode_match_the_cpu_on_the_same_weights";
    for name in FIXTURES {
        let Some(ctx) = coop_test_context(test) else { return };
        let dir = fixture(name);
        let model = ModelDir::open(&dir).unwrap();
        assert!(model.has_quantized_matrices(), "{name}: no quantized matrices");
        let reference = Reference::open(&dir).unwrap();
        let (prompt, canvas) = (reference.ids("prompt_ids").unwrap(), reference.ids("canvas_ids").unwrap());
        let (c, v) = (model.config.canvas_length, model.config.text.vocab_size);
        let mut weights = model.load_weights().unwrap();
        weights.round_matrices_for_f16_mode();
        let mut cpu = CpuBackend(CpuModel::new(model.config.clone(), weights.clone()));
        let mut gpu = GpuBackend::stored(ctx, &model.config, &model.checkpoint, weights, 512, WeightFormat::F16).unwrap();
        assert_eq!(gpu.name(), "gpu-f16");
        // Below 2 bytes a parameter: the blocks stay blocks.
        let per_param = gpu.gpu.weight_bytes() as f64 / gpu.gpu.weight_parameters() as f64;
        assert!(per_param < 2.0, "{name}: {per_param} bytes per parameter");
        let tol = gpu.tolerances();
        let (_, sc) = reference.floats("sc_logits").unwrap();
        for self_conditioning in [None, Some(&sc[..])] {
            let mut out = [vec![0f32; c * v], vec![0f32; c * v]];
            for (b, logits) in [&mut gpu as &mut dyn Backend, &mut cpu].into_iter().zip(&mut out) {
                b.reset().unwrap();
                b.encode(&prompt).unwrap();
                b.canvas_forward(&canvas, self_conditioning, logits).unwrap();
            }
            let cmp = compare(&out[0], &out[1], v, tol.argmax_margin);
            eprintln!("gpu-f16 {name} logits (sc {}): {cmp}", self_conditioning.is_some());
            assert!(cmp.passes(tol.logits), "{name} (sc {}): {cmp}", self_conditioning.is_some());
        }
        let layers = gpu.layer_check(&prompt, &canvas).unwrap().unwrap();
        eprintln!("gpu-f16 {name} {}: {}", layers.name, layers.detail);
        assert!(layers.passed, "{name}: {} {}", layers.name, layers.detail);
        let cache = gpu.cache_check(&[&prompt]).unwrap().unwrap();
        eprintln!("gpu-f16 {name} {}: {}", cache.name, cache.detail);
        assert!(cache.passed, "{name}: {} {}", cache.name, cache.detail);
    }
}

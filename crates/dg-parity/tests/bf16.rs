//! The BF16 weight path (`gpu-bf16`: matrices stored as BF16 on the GPU, unpacked exactly in the
//! kernels, f32 arithmetic) on every committed fixture, against the f32 CPU reference on the same
//! weights (the checkpoint's matrices rounded to BF16, ties to even, kept as f32).
//!
//! Both sides compute in f32 on identical weights, so the f32 GPU path's tolerances apply
//! unchanged: logits within `GPU_LOGITS_TOLERANCE` with the argmax rule, every layer within
//! `LAYER_TOLERANCE`, the encoder's cache within `CACHE_TOLERANCE`, and the same seeded generation
//! (resident on the GPU, host sampler on the CPU). Where the checkpoint itself is BF16 the rounding
//! is the identity and `cargo xtask parity --backend gpu-bf16` checks against the transformers dump.

use std::path::Path;

use dg_cpu::CpuModel;
use dg_gpu::WeightFormat;
use dg_gpu::testing::test_context;
use dg_model::ModelDir;
use dg_parity::checks::{ARGMAX_MARGIN, Backend, GPU_LOGITS_TOLERANCE};
use dg_parity::compare::compare;
use dg_parity::cpu::CpuBackend;
use dg_parity::gpu::GpuBackend;
use dg_parity::reference::Reference;
use dg_parity::replay::{AsModel, replay_config};
use dg_sampler::{NoHooks, SeededRng, generate};

const FIXTURES: [&str; 6] = ["bf16-checkpoint", "default-pattern-8experts", "early-stop-eos", "real-head-dims", "sliding-long-prompt", "vision-tower-skip"];

#[test]
fn bf16_weights_on_the_gpu_match_the_cpu_on_the_same_weights() {
    for name in FIXTURES {
        let Some(ctx) = test_context("bf16_weights_on_the_gpu_match_the_cpu_on_the_same_weights") else { return };
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures").join(name);
        let model = ModelDir::open(&dir).unwrap();
        let reference = Reference::open(&dir).unwrap();
        let (prompt, canvas) = (reference.ids("prompt_ids").unwrap(), reference.ids("canvas_ids").unwrap());
        let (c, v) = (model.config.canvas_length, model.config.text.vocab_size);
        let weights = model.load_weights().unwrap();
        let mut gpu = GpuBackend::with_format(ctx, &model.config, weights, 512, WeightFormat::Bf16).unwrap();
        assert_eq!(gpu.name(), "gpu-bf16");
        // 2 bytes per matrix parameter; the f32 norms and scales are a tiny remainder.
        let per_param = gpu.gpu.weight_bytes() as f64 / gpu.gpu.weight_parameters() as f64;
        assert!((2.0..2.1).contains(&per_param), "{name}: {per_param} bytes per parameter");
        // The CPU reference on the BF16-rounded matrices (the GPU backend's own twin).
        let mut cpu = CpuBackend(CpuModel::new(model.config.clone(), gpu.cpu.weights.clone()));
        let (_, sc) = reference.floats("sc_logits").unwrap();
        for self_conditioning in [None, Some(&sc[..])] {
            let (mut ours, mut want) = (vec![0f32; c * v], vec![0f32; c * v]);
            for (b, out) in [(&mut gpu as &mut dyn Backend, &mut ours), (&mut cpu as &mut dyn Backend, &mut want)] {
                b.reset().unwrap();
                b.encode(&prompt).unwrap();
                b.canvas_forward(&canvas, self_conditioning, out).unwrap();
            }
            let cmp = compare(&ours, &want, v, ARGMAX_MARGIN);
            assert!(cmp.passes(GPU_LOGITS_TOLERANCE), "{name} (sc {}): {cmp}", self_conditioning.is_some());
        }
        let layers = gpu.layer_check(&prompt, &canvas).unwrap().unwrap();
        assert!(layers.passed, "{name}: {} {}", layers.name, layers.detail);
        let cache = gpu.cache_check(&[&prompt]).unwrap().unwrap();
        assert!(cache.passed, "{name}: {} {}", cache.name, cache.detail);
        // Seeded generation: resident on the GPU (BF16 weights) = host sampler on the CPU.
        let cfg = replay_config(&reference, &model.generation, &model.config).unwrap();
        let ours = gpu.generate_resident(&prompt, &cfg, &mut SeededRng::new(7), &mut NoHooks).unwrap().unwrap();
        cpu.reset().unwrap();
        let want = generate(&mut AsModel(&mut cpu), &prompt, &cfg, c, v, &mut SeededRng::new(7), &mut NoHooks).unwrap();
        assert_eq!(ours.sequence, want.sequence, "{name}: seeded generation differs");
    }
}

//! The KV cache stored as f16 (`dg_gpu::cache_format`): the default where the tensor cores
//! run every attention product (they round K and V to f16 as they stage them: the same bits at
//! half the bytes), and on request (`DG_KV_CACHE=f16`) anywhere the device stores f16. Forced on
//! the portable kernels here, the forward's logits hold the F16 activation tolerances against the
//! transformers fixtures, and the encoder's cache (K and V rounded to f16) against the CPU's.

use dg_gpu::{GpuContext, KvCacheChoice, WeightFormat};
use dg_model::ModelDir;
use dg_parity::checks::{Backend, F16_ACTIVATION_TOLERANCES, logits_checks};
use dg_parity::gpu::GpuBackend;
use dg_parity::reference::Reference;
use dg_parity::testing::{fixture, test_context};

fn with_cache(test: &str, choice: KvCacheChoice) -> Option<GpuContext> {
    let mut ctx = test_context(test)?;
    ctx.tuning.kv_cache = choice;
    Some(ctx)
}

#[test]
fn an_f16_kv_cache_holds_the_f16_tolerances() {
    let test = "an_f16_kv_cache_holds_the_f16_tolerances";
    for name in ["sliding-long-prompt", "default-pattern-8experts", "tensor-core-shapes"] {
        let Some(ctx) = with_cache(test, KvCacheChoice::F16) else { return };
        if !ctx.features.contains(wgpu::Features::SHADER_F16) {
            eprintln!("SKIP {test}: adapter {} stores no f16", ctx.info.name);
            return;
        }
        let dir = fixture(name);
        let model = ModelDir::open(&dir).unwrap();
        let reference = Reference::open(&dir).unwrap();
        let mut gpu = GpuBackend::new(ctx, &model.config, model.load_weights().unwrap(), 512).unwrap();
        assert_eq!(gpu.gpu().kv_cache_format(), WeightFormat::F16, "{name}");
        assert_eq!(gpu.tolerances(), F16_ACTIVATION_TOLERANCES, "{name}: an f16 cache is held to the F16 tolerances");
        let checks = logits_checks(&reference, &mut gpu).unwrap();
        assert!(checks.len() >= 3, "{name}: {} logits checks", checks.len());
        for r in checks {
            assert!(r.passed, "{name}: {} {}", r.name, r.detail);
        }
        let blocks = [reference.ids("prompt_ids").unwrap(), reference.ids("block2_ids").unwrap()];
        let r = gpu.cache_check(&[&blocks[0], &blocks[1]]).unwrap().unwrap();
        assert!(r.passed, "{name}: {} {}", r.name, r.detail);
    }
}

/// The default: f16 exactly where the tensor cores run every attention product (the F16 mode,
/// cooperative matrices, head dims and a canvas their tiles take), f32 elsewhere: the fixtures'
/// 16-wide heads and 16-token canvases keep f32 in every mode.
#[test]
fn the_kv_cache_is_f16_where_the_tensor_cores_run_all_attention() {
    let test = "the_kv_cache_is_f16_where_the_tensor_cores_run_all_attention";
    for name in ["sliding-long-prompt", "real-head-dims"] {
        let model = ModelDir::open(&fixture(name)).unwrap();
        for (format, choice) in
            [(WeightFormat::F16, KvCacheChoice::Auto), (WeightFormat::F32, KvCacheChoice::Auto), (WeightFormat::F16, KvCacheChoice::F32)]
        {
            let Some(ctx) = with_cache(test, choice) else { return };
            let gpu =
                dg_gpu::GpuModel::load(ctx, &model.config, &model.load_weights().unwrap(), dg_gpu::ModelOptions::new(64).format(format))
                    .unwrap();
            assert_eq!(gpu.kv_cache_format(), WeightFormat::F32, "{name}: {format:?} weights, {choice:?}");
        }
    }
    let Some(ctx) = with_cache(test, KvCacheChoice::Auto) else { return };
    let coop = ctx.coop_matrix;
    let (config, weights) = real_heads_canvas_32();
    let gpu = dg_gpu::GpuModel::load(ctx, &config, &weights, dg_gpu::ModelOptions::new(64).format(WeightFormat::F16)).unwrap();
    let want = if coop { WeightFormat::F16 } else { WeightFormat::F32 };
    assert_eq!(gpu.kv_cache_format(), want, "real head dims, canvas 32, F16 mode, cooperative matrices {coop}");
}

/// `real-head-dims`' geometry (heads of 256 and 512, a sliding window of 16) with a canvas of 32,
/// random weights: a model whose attention products all take the tensor cores.
fn real_heads_canvas_32() -> (dg_model::ModelConfig, dg_model::Weights) {
    let mut config = ModelDir::open(&fixture("real-head-dims")).unwrap().config;
    config.canvas_length = 32;
    let weights = dg_model::Weights::random(&config.text, 7).unwrap();
    (config, weights)
}

/// Where the tensor cores run every attention product they read K and V rounded to f16 either
/// way: from an f32 cache as they stage them, from an f16 cache as stored. So both caches give
/// the same logits, bit for bit, over a ragged prompt, a committed canvas and the next canvas.
/// SKIPs without cooperative matrices. (On the fixtures, whose 16-wide heads run attention on the
/// portable GEMM, they do not: that is why Auto keeps f32 there.)
#[test]
fn where_the_tensor_cores_run_all_attention_an_f16_cache_gives_the_f32_caches_bits() {
    let test = "where_the_tensor_cores_run_all_attention_an_f16_cache_gives_the_f32_caches_bits";
    let (config, weights) = real_heads_canvas_32();
    let (c, v) = (config.canvas_length, config.text.vocab_size);
    let prompt: Vec<u32> = (0..45).map(|i| (i * 37 + 11) % v as u32).collect();
    let canvas: Vec<u32> = (0..c).map(|i| (i * 53 + 5) as u32 % v as u32).collect();
    let mut runs = Vec::new();
    for (choice, format) in [(KvCacheChoice::Auto, WeightFormat::F16), (KvCacheChoice::F32, WeightFormat::F32)] {
        let Some(mut ctx) = dg_parity::testing::coop_test_context(test) else { return };
        ctx.tuning.kv_cache = choice;
        let mut gpu = dg_gpu::GpuModel::load(ctx, &config, &weights, dg_gpu::ModelOptions::new(512).format(WeightFormat::F16)).unwrap();
        assert_eq!(gpu.kv_cache_format(), format);
        let mut bits = Vec::new();
        let mut logits = vec![0f32; c * v];
        gpu.encode(&prompt).unwrap();
        gpu.canvas_forward(&canvas, None, &mut logits).unwrap();
        bits.extend(logits.iter().map(|x| x.to_bits()));
        gpu.encode(&canvas).unwrap();
        gpu.canvas_forward(&canvas, None, &mut logits).unwrap();
        bits.extend(logits.iter().map(|x| x.to_bits()));
        runs.push(bits);
    }
    let differ = runs[0].iter().zip(&runs[1]).filter(|(a, b)| a != b).count();
    assert!(differ == 0, "{differ} of {} logits differ between an f16 and an f32 cache on the tensor cores", runs[0].len());
}

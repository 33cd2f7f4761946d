//! The KV cache stored as f16 (`dg_gpu::arena::cache_format`): the default where the attention
//! runs on the tensor cores (the F16 mode with cooperative matrices, which round K and V to f16
//! as they stage them), and on request (`DG_KV_CACHE=f16`) anywhere the device stores f16. Forced
//! on the portable kernels here, the forward's logits hold the F16 activation tolerances against
//! the transformers fixtures, and the encoder's cache (K and V rounded to f16) against the CPU's.

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

/// The default: f16 exactly where the F16 mode's attention runs on the tensor cores.
#[test]
fn the_kv_cache_is_f16_where_the_tensor_cores_read_it() {
    let test = "the_kv_cache_is_f16_where_the_tensor_cores_read_it";
    let dir = fixture("sliding-long-prompt");
    let model = ModelDir::open(&dir).unwrap();
    for (format, choice) in
        [(WeightFormat::F16, KvCacheChoice::Auto), (WeightFormat::F32, KvCacheChoice::Auto), (WeightFormat::F16, KvCacheChoice::F32)]
    {
        let Some(ctx) = with_cache(test, choice) else { return };
        let coop = ctx.coop_matrix;
        let gpu = dg_gpu::GpuModel::with_format(ctx, &model.config, &model.load_weights().unwrap(), 64, format).unwrap();
        let want = if format == WeightFormat::F16 && coop && choice == KvCacheChoice::Auto { WeightFormat::F16 } else { WeightFormat::F32 };
        assert_eq!(gpu.kv_cache_format(), want, "{format:?} weights, {choice:?}, cooperative matrices {coop}");
    }
}

/// On the tensor cores the F16 mode's attention reads K and V rounded to f16 either way: from an
/// f32 cache as it stages them, from an f16 cache as stored. So both caches give the same logits,
/// bit for bit, on a fixture whose attention products all take the tensor cores
/// (`tensor-core-shapes`). SKIPs without cooperative matrices.
#[test]
fn on_the_tensor_cores_an_f16_cache_gives_the_f32_caches_bits() {
    let test = "on_the_tensor_cores_an_f16_cache_gives_the_f32_caches_bits";
    let dir = fixture("tensor-core-shapes");
    let model = ModelDir::open(&dir).unwrap();
    let reference = Reference::open(&dir).unwrap();
    let (prompt, canvas) = (reference.ids("prompt_ids").unwrap(), reference.ids("canvas_ids").unwrap());
    let v = model.config.text.vocab_size;
    let mut runs = Vec::new();
    for (choice, format) in [(KvCacheChoice::Auto, WeightFormat::F16), (KvCacheChoice::F32, WeightFormat::F32)] {
        let Some(mut ctx) = dg_parity::testing::coop_test_context(test) else { return };
        ctx.tuning.kv_cache = choice;
        let mut gpu = dg_gpu::GpuModel::with_format(ctx, &model.config, &model.load_weights().unwrap(), 512, WeightFormat::F16).unwrap();
        assert_eq!(gpu.kv_cache_format(), format);
        gpu.encode(&prompt).unwrap();
        let mut logits = vec![0f32; canvas.len() * v];
        gpu.canvas_forward(&canvas, None, &mut logits).unwrap();
        runs.push(logits.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
    }
    assert!(runs[0] == runs[1], "the logits differ between an f16 and an f32 cache on the tensor cores");
}

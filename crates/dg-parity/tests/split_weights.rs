//! Weights split across storage bindings (`dg_gpu::parts`) compute what the same weights in one
//! binding each compute. A weight-binding cap (`Tuning::weight_binding`) small enough that the
//! embedding / tied head, a layer's q/K/V and dense MLP matrices and both expert tensors each take
//! two or more buffers: on `default-pattern-8experts` in f32, BF16 and F16, and on the GGUF
//! fixtures' ggml blocks (the portable kernels, on every adapter).
//!
//! Every product runs per part over the same terms in the same order (a dense product per range
//! of output columns with the whole product's tile, the experts per range of experts), and the
//! lookup reads each row from its part: the encoder's cache, the plain canvas forward's logits
//! and a seeded resident generation are bit for bit the unsplit model's. The one sum a split
//! reorders is the soft embedding (self-conditioning's `P·E`, K = vocabulary, accumulated part
//! after part as the embedding's chunks always were): its logits are held to the GPU logits
//! tolerance instead. A cap below one unit (a row, a q/K/V block) is an error naming the tensor.

use dg_gpu::{GpuContext, GpuModel, GpuOptions, GpuWeights, Instrumentation, WeightFormat};
use dg_model::ModelDir;
use dg_parity::checks::{Backend, GPU_LOGITS_TOLERANCE};
use dg_parity::gpu::GpuBackend;
use dg_parity::reference::Reference;
use dg_parity::replay::replay_config;
use dg_parity::testing::{fixture, test_context};
use dg_sampler::{NoHooks, SeededRng};

const FIXTURE: &str = "default-pattern-8experts";

/// A context like `test_context`'s whose weight buffers are capped at `cap` bytes, with the
/// tensor cores off: the portable kernels on every adapter (on one with cooperative matrices a
/// matrix splits only at whole 128-row tiles, more than these fixtures' matrices have; the
/// tensor-core parts are `tests/split_experts.rs`' and dg-gpu's `tests/split_parts.rs`).
fn capped(cap: Option<u64>) -> GpuContext {
    let mut opts = GpuOptions::from_env().unwrap();
    opts.tuning.weight_binding = cap;
    opts.tuning.tensor_cores = false;
    GpuContext::new(&opts).unwrap()
}

/// Bit patterns, so that -0.0 ≠ 0.0 and NaNs compare.
fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Normwise relative difference.
fn normwise(a: &[f32], b: &[f32]) -> f64 {
    let d: f64 = a.iter().zip(b).map(|(x, y)| (*x as f64 - *y as f64).powi(2)).sum();
    let n: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (d / n).sqrt()
}

/// One split to check: a fixture, the upload format and the weight-binding cap.
struct Case {
    fixture: &'static str,
    format: WeightFormat,
    cap: u64,
}

/// Every format the portable kernels read: f32, BF16 and F16 on `default-pattern-8experts`, and
/// ggml blocks as stored from the GGUF fixtures (Q8_0 matrices and experts with an f32
/// embedding; Q4_K experts, Q8_0 attention and a BF16 embedding widened to f32). Each cap is
/// below the fixture's embedding, q/K/V, MLP gate/up and expert tensors (all but `gguf-q4_k_m`'s
/// Q5_0 down projection, 22 KiB) and at least its largest q/K/V block and expert.
const CASES: [Case; 5] = [
    Case { fixture: FIXTURE, format: WeightFormat::F32, cap: 16 << 10 },
    Case { fixture: FIXTURE, format: WeightFormat::Bf16, cap: 8 << 10 },
    Case { fixture: FIXTURE, format: WeightFormat::F16, cap: 8 << 10 },
    Case { fixture: "gguf-q8_0", format: WeightFormat::F32, cap: 6 << 10 },
    Case { fixture: "gguf-q4_k_m", format: WeightFormat::F32, cap: 24 << 10 },
];

#[test]
fn split_weights_compute_what_whole_weights_do() {
    if test_context("split_weights_compute_what_whole_weights_do").is_none() {
        return;
    }
    for case in &CASES {
        let path = fixture(case.fixture);
        let dir = ModelDir::open(&path).unwrap();
        let prompt = Reference::open(&path).unwrap().ids("prompt_ids").unwrap();
        let (c, v) = (dir.config.canvas_length, dir.config.text.vocab_size);
        let canvas: Vec<u32> = (0..c).map(|i| ((i * 37 + 5) % v) as u32).collect();
        let (format, src) = (case.format, &dir.checkpoint);
        let what = format!("{} {format:?}", case.fixture);
        // The cap splits what the test says it does.
        let split = GpuWeights::upload(&capped(Some(case.cap)), &dir.config.text, src, format).unwrap();
        let whole = GpuWeights::upload(&capped(None), &dir.config.text, src, format).unwrap();
        let l = &split.layers[0];
        let counts = [
            ("embedding", split.embed.len()),
            ("q/K/V", l.qkv_proj.parts.len()),
            ("MLP gate/up", l.mlp_gate_up.parts.len()),
            ("experts gate/up", l.experts_gate_up.parts.len()),
            ("experts down", l.experts_down.parts.len()),
        ];
        let must = if case.fixture == "gguf-q4_k_m" { &counts[..4] } else { &counts[..] };
        assert!(must.iter().all(|(_, n)| *n >= 2), "{what}: parts {counts:?}");
        assert_eq!(whole.embed.len(), 1, "{what}");
        assert!(!whole.layers[0].experts_gate_up.is_split(), "{what}");
        assert_eq!((split.bytes, split.parameters), (whole.bytes, whole.parameters), "{what}: a split adds or loses weights");
        let formats = (l.qkv_proj.format, l.experts_gate_up.format, l.experts_down.format);
        drop((split, whole));

        let mut models: Vec<GpuModel> = [None, Some(case.cap)]
            .into_iter()
            .map(|cap| GpuModel::load(capped(cap), &dir.config, src, dg_gpu::ModelOptions::new(256).format(format)).unwrap())
            .collect();
        let mut outputs = Vec::new();
        for m in &mut models {
            m.encode(&prompt).unwrap();
            let cache = m.read_visible_cache().unwrap();
            let mut plain = vec![0f32; c * v];
            m.canvas_forward(&canvas, None, &mut plain).unwrap();
            let mut sc = vec![0f32; c * v];
            m.canvas_forward(&canvas, Some(&plain), &mut sc).unwrap();
            outputs.push((cache, plain, sc));
        }
        let (whole, split) = (&outputs[0], &outputs[1]);
        for (i, (a, b)) in whole.0.iter().zip(&split.0).enumerate() {
            assert!(bits(&a.0) == bits(&b.0) && bits(&a.1) == bits(&b.1), "{what}: layer {i}'s cache differs");
        }
        assert!(bits(&whole.1) == bits(&split.1), "{what}: plain logits differ (normwise {:e})", normwise(&split.1, &whole.1));
        let err = normwise(&split.2, &whole.2);
        assert!(err <= GPU_LOGITS_TOLERANCE, "{what}: self-conditioned logits {err:e} from the unsplit model's");
        eprintln!(
            "{what}: parts {counts:?} (q/K/V, experts as {formats:?}); self-conditioned logits {err:e} from unsplit ({})",
            if err == 0.0 { "identical" } else { "reordered soft embedding" }
        );
    }
}

#[test]
fn a_split_resident_generation_gives_the_unsplit_tokens() {
    if test_context("a_split_resident_generation_gives_the_unsplit_tokens").is_none() {
        return;
    }
    let dir = ModelDir::open(&fixture(FIXTURE)).unwrap();
    let reference = Reference::open(&fixture(FIXTURE)).unwrap();
    let prompt = reference.ids("prompt_ids").unwrap();
    let cfg = replay_config(&reference, &dir.generation, &dir.config).unwrap();
    let tokens: Vec<Vec<u32>> = [None, Some(CASES[0].cap)]
        .into_iter()
        .map(|cap| {
            let mut gpu = GpuBackend::new(capped(cap), &dir.config, dir.load_weights().unwrap(), 512).unwrap();
            gpu.generate_resident(&prompt, &cfg, &mut SeededRng::new(7), &mut NoHooks).unwrap().unwrap().sequence
        })
        .collect();
    assert!(tokens[0].len() > prompt.len(), "nothing generated");
    assert_eq!(tokens[0], tokens[1], "split weights change the seeded tokens");
}

#[test]
fn a_cap_below_one_unit_is_an_error_naming_the_tensor() {
    if test_context("a_cap_below_one_unit_is_an_error_naming_the_tensor").is_none() {
        return;
    }
    let dir = ModelDir::open(&fixture(FIXTURE)).unwrap();
    let weights = dir.load_weights().unwrap();
    // One embedding row is 48 f32 (192 bytes).
    let e = GpuWeights::upload(&capped(Some(100)), &dir.config.text, &weights, WeightFormat::F32).unwrap_err().to_string();
    assert!(e.contains("embed_tokens") && e.contains("one row") && e.contains("192"), "{e}");
    // A sliding layer's q/K/V blocks are 32 rows of 48 f32 (6 KiB), never cut.
    let e = GpuWeights::upload(&capped(Some(4 << 10)), &dir.config.text, &weights, WeightFormat::F32).unwrap_err().to_string();
    assert!(e.contains("layers.0") && e.contains("32 rows") && e.contains("6144"), "{e}");
}

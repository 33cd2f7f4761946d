//! `dg info` (text and JSON) on the bundled model and a fixture, and the bundled model itself:
//! small, complete, its tokenizer matching its vocabulary and its EOS ids.

mod common;

use common::{bundled, dg, fixture};
use dg_model::ModelDir;

#[test]
fn info_describes_the_bundled_model_and_the_adapters() {
    let run = dg(&["info"]).ok();
    for needle in [
        "tiny-random",
        "random weights, its text is noise",
        "layers     4 (3 sliding, 1 full): S S S F",
        "vocab 986",
        "canvas 32",
        "sliding window 64",
        "4 query; sliding: 2 kv × head_dim 16; full: 1 kv × head_dim 32",
        "experts    4 per layer, top-2, width 32",
        "parameters 342,960",
        "checkpoint BF16",
        "cpu: f32 weights",
        "adapters",
    ] {
        assert!(run.stdout.contains(needle), "info lacks {needle:?}:\n{}", run.stdout);
    }
}

#[test]
fn info_json_matches_the_model_library() {
    for (dir, dtype) in [(bundled(), "BF16"), (fixture("sliding-long-prompt"), "F32")] {
        let v = dg(&["info", "--json", "--model", dir.to_str().unwrap()]).ok().json();
        let model = ModelDir::open(&dir).unwrap();
        let t = &model.config.text;
        assert_eq!(v["parameters"], t.num_parameters());
        assert_eq!(v["vocab_size"], t.vocab_size);
        assert_eq!(v["hidden_size"], t.hidden_size);
        assert_eq!(v["canvas_length"], model.config.canvas_length);
        assert_eq!(v["layers"].as_array().unwrap().len(), t.num_layers());
        assert_eq!(v["memory"]["cpu"]["bytes"], t.num_parameters() * 4);
        // The GPU keeps a BF16 checkpoint's matrices as BF16 (2 bytes per parameter), else f32; the
        // norm vectors f32 (tests/gpu_memory.rs holds the bytes to an upload's).
        let gpu = &v["memory"]["gpu"];
        assert_eq!(gpu["dtype"], if dtype == "BF16" { "bf16" } else { "f32" });
        let by_format = gpu["device_bytes_by_format"].as_object().unwrap();
        assert!(by_format.keys().all(|f| f == dtype || f == "F32"), "{by_format:?}");
        assert_eq!(gpu["device_bytes"], by_format.values().map(|b| b.as_u64().unwrap()).sum::<u64>());
        // With tensor cores (the F16 mode) every matrix takes 2 bytes, the embedding as BF16.
        let coop = &gpu["tensor_cores"];
        assert_eq!(coop["dtype"], "f16");
        assert_eq!(
            coop["device_bytes"],
            coop["device_bytes_by_format"].as_object().unwrap().values().map(|b| b.as_u64().unwrap()).sum::<u64>()
        );
        assert!(
            coop["device_bytes_by_format"]["F16"].as_u64().unwrap() > 0 && coop["device_bytes_by_format"]["BF16"].as_u64().unwrap() > 0
        );
        let per_parameter = gpu["bytes_per_parameter"].as_f64().unwrap();
        assert!((if dtype == "BF16" { 2.0..=2.1 } else { 3.9..=4.0 }).contains(&per_parameter), "{per_parameter}");
        let dtypes = v["checkpoint"]["dtypes"].as_object().unwrap();
        assert_eq!(dtypes.keys().collect::<Vec<_>>(), vec![dtype], "{dtypes:?}");
        for a in v["adapters"].as_array().unwrap() {
            assert!(a["name"].is_string() && a["backend"].is_string() && a["device_type"].is_string());
            assert!(a["max_storage_buffer_binding_size"].as_u64().unwrap() > 0);
            assert!(a["max_buffer_size"].as_u64().unwrap() > 0);
            for f in ["shader_f16", "subgroup", "timestamp_query"] {
                assert!(a[f].is_boolean(), "{f}");
            }
        }
    }
}

#[test]
fn the_bundled_model_is_small_and_consistent() {
    let dir = bundled();
    let total: u64 = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().metadata().unwrap().len()).sum();
    assert!(total < 5 * 1024 * 1024, "models/tiny-random is {total} bytes");
    let model = ModelDir::open(&dir).unwrap();
    let settings = model.generation_config().unwrap();
    assert_eq!(settings.max_denoising_steps, 8);
    assert_eq!(settings.eos_token_ids, vec![1, 6]);
    model.load_weights().unwrap();
    let tokenizer = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    assert_eq!(tokenizer.get_vocab_size(true), model.config.text.vocab_size);
    for (id, token) in [(0, "<pad>"), (1, "<eos>"), (2, "<bos>"), (3, "<unk>"), (5, "<|turn>"), (6, "<turn|>")] {
        assert_eq!(tokenizer.token_to_id(token), Some(id), "{token}");
    }
    for file in ["config.json", "generation_config.json", "tokenizer_config.json", "chat_template.jinja"] {
        assert!(dir.join(file).is_file(), "{file}");
    }
}

#[test]
fn info_counts_the_vision_tower() {
    let dir = fixture("vision-encoder");
    let v = dg(&["info", "--json", "--model", dir.to_str().unwrap()]).ok().json();
    let vision = &v["vision"];
    // Patch embedder 32·48 + 2·64·32, two layers of 4 norms, q/k/v/o, q/k norms and a gated MLP
    // (2 · 7,824), std_bias and std_scale 2·32, embed_vision 32·32: counted by hand.
    assert_eq!(vision["parameters"], 1_536 + 4_096 + 2 * 7_824 + 64 + 1_024, "{vision}");
    assert_eq!(vision["stored_bytes"], 4 * 22_368, "F32 checkpoint: {vision}");
    assert_eq!(vision["missing_tensors"], 0);
    // On the GPU (auto): the F32 checkpoint's matrices in f32 without tensor cores, F16 with; the
    // position table BF16 there; norms f32; and the standardization's 32·32 diagonal and row.
    let (norms, table, matrices, std) = (2 * (4 * 32 + 2 * 8), 4_096, 22_368 - 2 * (4 * 32 + 2 * 8) - 4_096 - 64, 32 * 32 + 32);
    assert_eq!(vision["gpu"]["dtype"], "f32", "{vision}");
    assert_eq!(vision["gpu"]["device_bytes"], 4 * (norms + table + matrices + std), "{vision}");
    assert_eq!(vision["gpu"]["tensor_cores"]["dtype"], "f16", "{vision}");
    assert_eq!(vision["gpu"]["tensor_cores"]["device_bytes"], 4 * (norms + std) + 2 * (table + matrices), "{vision}");
    let text = dg(&["info", "--model", dir.to_str().unwrap()]).ok();
    assert!(text.stdout.contains("vision     2 layers of 32 (4 heads × 8), patch 4 pooled 3×3: 22,368 parameters"), "{}", text.stdout);
    assert!(dg(&["info", "--json"]).ok().json()["vision"].is_null(), "the bundled model has no tower");
}

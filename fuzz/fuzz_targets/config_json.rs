//! Fuzzes `config.json` and `generation_config.json` parsing.
//!
//! The input is split at its first 0xFF byte (never part of UTF-8 text): the part before is parsed
//! as `config.json`, the part after as `generation_config.json`. Without a separator the whole
//! input is tried as both. Everything a parsed config offers cheaply is then exercised; none of it
//! may panic.

#![no_main]

use std::path::Path;

use dg_model::{ModelConfig, RawGenerationConfig, tensor_manifest};
use libfuzzer_sys::fuzz_target;

/// A small valid config, used to resolve generation configs when the fuzzed one does not parse.
const FALLBACK_CONFIG: &str = r#"{"model_type":"diffusion_gemma","eos_token_id":[1,6],"text_config":{
  "vocab_size":32,"hidden_size":12,"intermediate_size":10,"num_hidden_layers":2,"num_attention_heads":2,
  "num_key_value_heads":1,"head_dim":4,"global_head_dim":8,"num_experts":4,"top_k_experts":2,
  "moe_intermediate_size":6}}"#;

/// `RopeSpec::inv_freq` allocates `head_dim / 2` floats; skip absurd head sizes.
const MAX_ROPE_HEAD_DIM: usize = 1 << 16;

fuzz_target!(|data: &[u8]| {
    let (config_bytes, generation_bytes) = match data.iter().position(|&b| b == 0xFF) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, data),
    };

    let parsed = std::str::from_utf8(config_bytes)
        .ok()
        .and_then(|text| ModelConfig::from_json_str(text, Path::new("config.json")).ok());
    if let Some(config) = &parsed {
        exercise_config(config);
    }

    let Ok(text) = std::str::from_utf8(generation_bytes) else {
        return;
    };
    let Ok(raw) = serde_json::from_str::<RawGenerationConfig>(text) else {
        return;
    };
    let model = parsed.unwrap_or_else(|| {
        ModelConfig::from_json_str(FALLBACK_CONFIG, Path::new("config.json")).expect("fallback config is valid")
    });
    let merged = RawGenerationConfig::default().overridden_by(raw.clone());
    for candidate in [raw, merged] {
        if let Ok(generation) = candidate.resolve(&model, Path::new("generation_config.json")) {
            for remaining in [0, 1, generation.max_denoising_steps] {
                let _ = generation.temperature_at(remaining);
            }
            let _ = generation.new_canvases(20, model.canvas_length);
        }
    }
});

fn exercise_config(config: &ModelConfig) {
    let text = &config.text;
    assert_eq!(text.layers.len(), text.num_layers());
    assert!(config.canvas_length > 0);
    let _ = text.num_parameters();
    let _ = text.embed_scale();
    let manifest = tensor_manifest(text);
    assert!(
        manifest.len() >= 2 + 4,
        "embedding, norm and self-conditioning are always listed"
    );
    for layer in &text.layers {
        if layer.head_dim <= MAX_ROPE_HEAD_DIM {
            assert_eq!(layer.rope.inv_freq(layer.head_dim).len(), layer.head_dim / 2);
        }
    }
}

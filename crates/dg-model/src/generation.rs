//! `generation_config.json`: the sampler's parameters, with HF's precedence and defaults.
//!
//! Mirrors `DiffusionGemmaGenerationConfig` in `generation_diffusion_gemma.py`: a null or absent
//! field takes the built-in default of `_get_default_generation_params` (48 steps, entropy bound
//! 0.1, t ∈ [0.4, 0.8], stability 1, confidence 0.005, 256 new tokens). `sampler_config` is a dict
//! with `_cls_name` (only `EntropyBoundSamplerConfig` exists). Unknown sampling keys (`top_k`,
//! `temperature`, ...) are rejected as the reference rejects them.

use std::path::Path;

use serde::Deserialize;

use crate::config::{IdOrList, ModelConfig};
use crate::error::{ModelError, Result};
use crate::json::read_json;

/// Adaptive stopping (`StableAndConfidentStoppingCriteria`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StoppingConfig {
    /// Number of previous argmax canvases that must equal the current one (0: always stable).
    pub stability_threshold: usize,
    /// Stop when the mean entropy (nats) of the processed logits is below this.
    pub confidence_threshold: f32,
}

/// Resolved generation parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationConfig {
    /// Requested new tokens; generation runs `ceil(max_new_tokens / C)` whole canvases.
    pub max_new_tokens: usize,
    /// Total length bound, used only as the reference does (see `new_canvases`).
    pub max_length: Option<usize>,
    /// N: decoder passes per canvas at most.
    pub max_denoising_steps: usize,
    /// B: acceptance budget in nats.
    pub entropy_bound: f32,
    /// Temperature schedule end points (t_min, t_max) as given (Python floats in the reference);
    /// `None` means no temperature processor (T = 1).
    pub temperature: Option<(f64, f64)>,
    /// `None` disables adaptive stopping: every block runs all N steps.
    pub stopping: Option<StoppingConfig>,
    /// Ids that end generation; the first one in a canvas is kept and the rest padded.
    pub eos_token_ids: Vec<u32>,
    pub pad_token_id: Option<u32>,
}

impl Default for GenerationConfig {
    fn default() -> Self {
        GenerationConfig {
            max_new_tokens: 256,
            max_length: None,
            max_denoising_steps: 48,
            entropy_bound: 0.1,
            temperature: Some((0.4, 0.8)),
            stopping: Some(StoppingConfig { stability_threshold: 1, confidence_threshold: 0.005 }),
            eos_token_ids: Vec::new(),
            pad_token_id: None,
        }
    }
}

/// The JSON form: every field nullable. Also used for the `generation` block of `reference.json`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawGenerationConfig {
    pub max_new_tokens: Option<usize>,
    pub max_length: Option<usize>,
    pub max_denoising_steps: Option<usize>,
    pub sampler_config: Option<RawSamplerConfig>,
    /// Flat form used by `reference.json`.
    pub entropy_bound: Option<f64>,
    pub t_min: Option<f64>,
    pub t_max: Option<f64>,
    pub stability_threshold: Option<usize>,
    pub confidence_threshold: Option<f64>,
    pub eos_token_id: Option<IdOrList>,
    pub pad_token_id: Option<u32>,
    pub bos_token_id: Option<u32>,
    pub cache_implementation: Option<String>,
    pub cache_config: Option<serde_json::Value>,
    pub disable_compile: Option<serde_json::Value>,
    pub return_dict_in_generate: Option<bool>,
    pub transformers_version: Option<String>,
    #[serde(rename = "_from_model_config")]
    pub from_model_config: Option<bool>,
    #[serde(rename = "_commit_hash")]
    pub commit_hash: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSamplerConfig {
    #[serde(rename = "_cls_name")]
    pub cls_name: Option<String>,
    pub entropy_bound: f64,
}

impl RawGenerationConfig {
    /// Reads `generation_config.json`.
    pub fn from_file(path: &Path) -> Result<Self> {
        read_json(path)
    }

    /// Fields set in `over` replace those of `self` (kwargs > generation_config > defaults).
    pub fn overridden_by(mut self, over: RawGenerationConfig) -> Self {
        macro_rules! take {
            ($($f:ident),*) => { $( if over.$f.is_some() { self.$f = over.$f; } )* };
        }
        take!(
            max_new_tokens,
            max_length,
            max_denoising_steps,
            sampler_config,
            entropy_bound,
            t_min,
            t_max,
            stability_threshold,
            confidence_threshold,
            eos_token_id,
            pad_token_id
        );
        self
    }

    /// Applies the built-in defaults, falls back to the model config for EOS and pad ids, and
    /// validates like `DiffusionGemmaGenerationConfig.validate`. `path` names the source in errors.
    pub fn resolve(&self, model: &ModelConfig, path: &Path) -> Result<GenerationConfig> {
        let err = |m: String| ModelError::config(path, m);
        let d = GenerationConfig::default();
        if let Some(sc) = &self.sampler_config
            && let Some(name) = &sc.cls_name
            && name != "EntropyBoundSamplerConfig"
        {
            return Err(err(format!("sampler_config._cls_name {name:?} is not supported")));
        }
        let entropy_bound =
            self.entropy_bound.or(self.sampler_config.as_ref().map(|s| s.entropy_bound)).map_or(d.entropy_bound, |b| b as f32);
        if !(entropy_bound > 0.0) {
            return Err(err(format!("entropy_bound must be > 0 (got {entropy_bound})")));
        }
        let max_denoising_steps = self.max_denoising_steps.unwrap_or(d.max_denoising_steps);
        if max_denoising_steps == 0 {
            return Err(err("max_denoising_steps must be > 0".into()));
        }
        let t_min = self.t_min.unwrap_or(0.4);
        let t_max = self.t_max.unwrap_or(0.8);
        if t_min < 0.0 || t_max < 0.0 || t_max <= t_min {
            return Err(err(format!("need 0 <= t_min < t_max (got t_min {t_min}, t_max {t_max})")));
        }
        let stability_threshold = self.stability_threshold.unwrap_or(1);
        let confidence_threshold = self.confidence_threshold.unwrap_or(0.005) as f32;
        if !(confidence_threshold > 0.0) {
            return Err(err(format!("confidence_threshold must be > 0 (got {confidence_threshold})")));
        }
        let max_new_tokens = self.max_new_tokens.unwrap_or(d.max_new_tokens);
        if max_new_tokens == 0 {
            return Err(err("max_new_tokens must be > 0".into()));
        }
        let eos_token_ids = match &self.eos_token_id {
            Some(ids) => ids.clone().into_vec(),
            None => model.eos_token_ids.clone(),
        };
        let vocab = model.text.vocab_size;
        let fields = eos_token_ids.iter().map(|&id| ("eos_token_id", id));
        for (field, id) in fields.chain(self.pad_token_id.map(|id| ("pad_token_id", id))) {
            if id as usize >= vocab {
                return Err(err(format!("{field} {id} is outside the vocabulary (vocab_size {vocab})")));
            }
        }
        Ok(GenerationConfig {
            max_new_tokens,
            max_length: self.max_length,
            max_denoising_steps,
            entropy_bound,
            temperature: Some((t_min, t_max)),
            stopping: Some(StoppingConfig { stability_threshold, confidence_threshold }),
            eos_token_ids,
            pad_token_id: self.pad_token_id.or(model.text.pad_token_id),
        })
    }
}

impl GenerationConfig {
    /// Number of canvases `generate` runs for a prompt of `prompt_len` tokens
    /// (`_prepare_generated_length`: `max_length` counts only while `max_new_tokens` is 256).
    pub fn new_canvases(&self, prompt_len: usize, canvas_length: usize) -> usize {
        let new_tokens = match self.max_length {
            Some(max_len) if self.max_new_tokens == 256 => max_len.saturating_sub(prompt_len),
            _ => self.max_new_tokens,
        };
        new_tokens.div_ceil(canvas_length)
    }

    /// Temperature at `remaining` steps left of N, computed as the reference does:
    /// `t_min + (t_max − t_min) · (n / N)` with the Python-float difference taken in f64 and the
    /// rest in f32 (the step counter is an int32 tensor).
    pub fn temperature_at(&self, remaining: usize) -> f32 {
        match self.temperature {
            None => 1.0,
            Some((t_min, t_max)) => {
                let frac = remaining as f32 / self.max_denoising_steps as f32;
                t_min as f32 + (t_max - t_min) as f32 * frac
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model() -> ModelConfig {
        ModelConfig::from_json_str(
            r#"{"model_type":"diffusion_gemma","eos_token_id":[1,106],"text_config":{"num_experts":4,
                "top_k_experts":2,"moe_intermediate_size":8}}"#,
            Path::new("config.json"),
        )
        .unwrap()
    }

    #[test]
    fn real_generation_config() {
        let raw: RawGenerationConfig = serde_json::from_str(
            r#"{"max_new_tokens":256,"max_denoising_steps":48,"sampler_config":{"_cls_name":"EntropyBoundSamplerConfig",
            "entropy_bound":0.1},"t_min":0.4,"t_max":0.8,"stability_threshold":1,"confidence_threshold":0.005,
            "eos_token_id":[1,106,50],"pad_token_id":0,"transformers_version":"5.8.0.dev0"}"#,
        )
        .unwrap();
        let g = raw.resolve(&model(), Path::new("generation_config.json")).unwrap();
        assert_eq!(g.eos_token_ids, vec![1, 106, 50]);
        assert_eq!(g.pad_token_id, Some(0));
        // Spec §6.2: n=48 → 0.80000001, n=1 → 0.40833333.
        assert_eq!(g.temperature_at(48), 0.8f32);
        assert_eq!(g.temperature_at(1), 0.408_333_33f32);
        assert_eq!(g.temperature_at(24), 0.6f32);
        assert_eq!(g.new_canvases(20, 256), 1);
    }

    #[test]
    fn nulls_mean_defaults_and_model_eos() {
        let raw: RawGenerationConfig =
            serde_json::from_str(r#"{"max_new_tokens":null,"t_min":null,"sampler_config":null,"eos_token_id":null}"#).unwrap();
        let g = raw.resolve(&model(), Path::new("g.json")).unwrap();
        assert_eq!(g.max_denoising_steps, 48);
        assert_eq!(g.entropy_bound, 0.1);
        assert_eq!(g.temperature, Some((0.4, 0.8)));
        assert_eq!(g.eos_token_ids, vec![1, 106]);
        assert_eq!(g.pad_token_id, Some(0), "text_config pad default");
        assert_eq!(GenerationConfig { max_new_tokens: 300, ..g }.new_canvases(5, 256), 2);
    }

    #[test]
    fn invalid_values_are_rejected() {
        for (json, needle) in [
            (r#"{"t_min":0.9,"t_max":0.8}"#, "t_min"),
            (r#"{"max_denoising_steps":0}"#, "max_denoising_steps"),
            (r#"{"confidence_threshold":0.0}"#, "confidence_threshold"),
            (r#"{"sampler_config":{"_cls_name":"Other","entropy_bound":0.1}}"#, "Other"),
            (r#"{"pad_token_id":999999}"#, "outside the vocabulary"),
        ] {
            let raw: RawGenerationConfig = serde_json::from_str(json).unwrap();
            let e = raw.resolve(&model(), Path::new("generation_config.json")).unwrap_err().to_string();
            assert!(e.contains(needle) && e.contains("generation_config.json"), "{json}: {e}");
        }
        assert!(serde_json::from_str::<RawGenerationConfig>(r#"{"top_k":5}"#).is_err());
    }
}

//! The model geometry and sampler defaults as GGUF metadata: read into a [`ModelConfig`] /
//! [`RawGenerationConfig`], and written from them.
//!
//! Mirrors the keys llama.cpp's converter writes for DiffusionGemma (`conversion/diffusion_gemma.py`
//! on `Gemma4Model.set_gguf_parameters`, `Gemma3Model`, `TextModel`): architecture
//! `diffusion-gemma`, `{arch}.block_count`, `.embedding_length`, `.feed_forward_length`,
//! `.attention.head_count`, `.attention.head_count_kv` (one per layer), `.attention.key_length`
//! (full layers) / `.key_length_swa` (sliding), `.attention.sliding_window` and
//! `.sliding_window_pattern` (true = sliding), `.attention.layer_norm_rms_epsilon`, `.expert_count`,
//! `.attention.shared_kv_layers` and `.embedding_length_per_layer_input` (0: Gemma 3n features),
//! `.expert_used_count`, `.expert_feed_forward_length`, `.rope.freq_base` (full) / `.freq_base_swa`,
//! `.rope.dimension_count(_swa)`, `.final_logit_softcapping`, `.context_length`, `.vocab_size`,
//! and `diffusion.canvas_length` plus the entropy-bound sampler's `diffusion.eb_*`. The partial
//! rotary factor of the full layers is not a key: the converter writes it as the `rope_freqs.weight`
//! tensor (factor 1 on the rotated frequency slots, 1e30 on the others). `.final_logit_softcapping`
//! follows llama.cpp (`llama-hparams.h`, `src/models/gemma4.cpp`): absent it is 30 (the converter
//! writes it only when config.json names it; 30 is also transformers' class default), and 0 means
//! no softcap.
//!
//! The metadata becomes a `config.json` document that [`ModelConfig::from_json_str`] validates,
//! so a GGUF and a model directory are checked by the same code.

use serde_json::{Value, json};

use super::GgufFile;
use super::read::{MetaValue, ty};
use crate::config::{LayerKind, ModelConfig};
use crate::error::{ModelError, Result};
use crate::generation::RawGenerationConfig;

/// `general.architecture` of a DiffusionGemma GGUF.
pub const ARCH: &str = "diffusion-gemma";
/// `general.quantization_version`: ggml's `GGML_QNT_VERSION`, which the converter writes.
const GGML_QUANT_VERSION: u32 = 2;
/// The value `rope_freqs.weight` holds for a frequency slot that does not rotate.
const UNROTATED: f32 = 1e30;

impl GgufFile {
    fn missing(&self, key: &str, why: &str) -> ModelError {
        ModelError::GgufMetadata { path: self.path().into(), key: key.into(), message: format!("missing (dg needs it for {why})") }
    }

    fn bad(&self, key: &str, message: String) -> ModelError {
        ModelError::GgufMetadata { path: self.path().into(), key: key.into(), message }
    }

    fn uint(&self, key: &str, why: &str) -> Result<Option<usize>> {
        match self.meta(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|v| usize::try_from(v).ok())
                .map(Some)
                .ok_or_else(|| self.bad(key, format!("expected an unsigned integer ({why}), got {v:?}"))),
        }
    }

    fn need_uint(&self, key: &str, why: &str) -> Result<usize> {
        self.uint(key, why)?.ok_or_else(|| self.missing(key, why))
    }

    /// A number; an F32 as the shortest decimal that rounds to it (`0.4`, not `0.4000000059604645`),
    /// which is what the `config.json` it was written from said.
    fn float(&self, key: &str) -> Result<Option<f64>> {
        match self.meta(key) {
            None => Ok(None),
            Some(MetaValue::F32(v)) => Ok(Some(v.to_string().parse().expect("a float's display parses"))),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| self.bad(key, format!("expected a number, got {v:?}"))),
        }
    }

    /// A per-layer value: one number for every layer, or an array of `n`.
    fn per_layer(&self, key: &str, n: usize, why: &str) -> Result<Vec<usize>> {
        let v = self.meta(key).ok_or_else(|| self.missing(key, why))?;
        let as_usize = |v: &MetaValue| v.as_u64().and_then(|v| usize::try_from(v).ok());
        match v.as_array() {
            None => as_usize(&v).map(|x| vec![x; n]).ok_or_else(|| self.bad(key, format!("expected an integer or an array, got {v:?}"))),
            Some(a) if a.len() == n => {
                a.iter().map(|e| as_usize(e).ok_or_else(|| self.bad(key, format!("element {e:?} is not an unsigned integer")))).collect()
            }
            Some(a) => Err(self.bad(key, format!("has {} entries for {n} layers", a.len()))),
        }
    }

    /// Checks `general.architecture` is DiffusionGemma's.
    pub fn check_architecture(&self) -> Result<()> {
        match self.meta("general.architecture") {
            Some(MetaValue::Str(a)) if a == ARCH => Ok(()),
            Some(other) => Err(self.bad("general.architecture", format!("is {other:?}, dg reads {ARCH:?}"))),
            None => Err(self.missing("general.architecture", "knowing the file holds DiffusionGemma")),
        }
    }

    /// The model's `config.json` equivalent, from the metadata (and `rope_freqs.weight`).
    pub fn model_config(&self) -> Result<ModelConfig> {
        self.check_architecture()?;
        let k = |s: &str| format!("{ARCH}.{s}");
        let n = self.need_uint(&k("block_count"), "the layer count")?;
        if n == 0 || n > 4096 {
            return Err(self.bad(&k("block_count"), format!("{n} layers")));
        }
        let pattern_key = k("attention.sliding_window_pattern");
        let pattern = self.meta(&pattern_key).ok_or_else(|| self.missing(&pattern_key, "the layer types"))?;
        let kinds: Vec<LayerKind> = match pattern.as_array() {
            Some(a) if a.len() == n => a
                .iter()
                .map(|b| b.as_bool().map(|s| if s { LayerKind::Sliding } else { LayerKind::Full }))
                .collect::<Option<_>>()
                .ok_or_else(|| self.bad(&pattern_key, "expected an array of bools".into()))?,
            _ => return Err(self.bad(&pattern_key, format!("expected {n} bools (one per layer), got {pattern:?}"))),
        };
        let kv = self.per_layer(&k("attention.head_count_kv"), n, "the KV heads")?;
        let heads = self.per_layer(&k("attention.head_count"), n, "the query heads")?;
        if heads.iter().any(|&h| h != heads[0]) {
            return Err(self.bad(&k("attention.head_count"), "differs between layers (dg needs one query head count)".into()));
        }
        let head_full = self.need_uint(&k("attention.key_length"), "the full layers' head_dim")?;
        let head_swa = self.need_uint(&k("attention.key_length_swa"), "the sliding layers' head_dim")?;
        for (key, want) in [(k("attention.value_length"), head_full), (k("attention.value_length_swa"), head_swa)] {
            if let Some(v) = self.uint(&key, "the value head size")?
                && v != want
            {
                return Err(self.bad(&key, format!("is {v}, but dg's V heads are as wide as the K heads ({want})")));
            }
        }
        if let Some(rot) = self.uint(&k("rope.dimension_count_swa"), "the sliding layers' RoPE")?
            && rot != head_swa
        {
            return Err(self.bad(&k("rope.dimension_count_swa"), format!("is {rot}: sliding layers rotate all {head_swa} dims")));
        }
        let ff = self.per_layer(&k("feed_forward_length"), n, "the dense MLP width")?;
        if ff.iter().any(|&f| f != ff[0]) {
            return Err(self.bad(&k("feed_forward_length"), "differs between layers (double-wide MLPs are not DiffusionGemma)".into()));
        }
        let per_layer: serde_json::Map<String, Value> = kinds
            .iter()
            .enumerate()
            .map(|(i, kind)| {
                let hd = if *kind == LayerKind::Full { head_full } else { head_swa };
                (i.to_string(), json!({ "head_dim": hd, "num_key_value_heads": kv[i] }))
            })
            .collect();
        let theta_full = self.float(&k("rope.freq_base"))?.ok_or_else(|| self.missing(&k("rope.freq_base"), "the full layers' RoPE"))?;
        let theta_swa =
            self.float(&k("rope.freq_base_swa"))?.ok_or_else(|| self.missing(&k("rope.freq_base_swa"), "the sliding layers' RoPE"))?;
        let vocab = match self.uint(&k("vocab_size"), "the vocabulary size")? {
            Some(v) => v,
            None => self
                .tensor("token_embd.weight")
                .and_then(|t| t.dims.get(1).copied())
                .ok_or_else(|| self.missing(&k("vocab_size"), "the vocabulary size"))?,
        };
        let canvas = self.need_uint("diffusion.canvas_length", "the canvas length")?;
        let mut eos = Vec::new();
        for key in ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"] {
            if let Some(id) = self.uint(key, "the end-of-sequence ids")?
                && !eos.contains(&id)
            {
                eos.push(id);
            }
        }
        let mut text = json!({
            "model_type": "diffusion_gemma_text",
            "vocab_size": vocab,
            "hidden_size": self.need_uint(&k("embedding_length"), "the hidden size")?,
            "intermediate_size": ff[0],
            "num_hidden_layers": n,
            "num_attention_heads": heads[0],
            "num_key_value_heads": kv[0],
            "head_dim": head_swa,
            "layer_types": kinds.iter().map(|k| k.hf_name()).collect::<Vec<_>>(),
            "per_layer_config": per_layer,
            "sliding_window": self.need_uint(&k("attention.sliding_window"), "the sliding window")?,
            "num_experts": self.need_uint(&k("expert_count"), "the expert count")?,
            "top_k_experts": self.need_uint(&k("expert_used_count"), "the experts per token")?,
            "moe_intermediate_size": self.need_uint(&k("expert_feed_forward_length"), "the expert width")?,
            "rms_norm_eps": self.float(&k("attention.layer_norm_rms_epsilon"))?.ok_or_else(|| self.missing(&k("attention.layer_norm_rms_epsilon"), "the norms' epsilon"))?,
            "rope_parameters": {
                "sliding_attention": { "rope_type": "default", "rope_theta": theta_swa },
                "full_attention": self.full_rope(theta_full, head_full, &k("rope.dimension_count"))?,
            },
            "max_position_embeddings": self.need_uint(&k("context_length"), "the position limit")?,
            "pad_token_id": self.uint("tokenizer.ggml.padding_token_id", "the pad id")?,
        });
        match self.float(&k("final_logit_softcapping"))? {
            None => {} // config.json's class default, as llama.cpp's
            Some(0.0) => text["final_logit_softcapping"] = Value::Null,
            Some(cap) => text["final_logit_softcapping"] = json!(cap),
        }
        let config = json!({ "model_type": "diffusion_gemma", "canvas_length": canvas, "eos_token_id": eos, "text_config": text });
        ModelConfig::from_json_str(&config.to_string(), self.path())
    }

    /// The full layers' RoPE: proportional with the factor and partial rotary factor that
    /// `rope_freqs.weight` encodes, or the default rotation of `rope.dimension_count` dims.
    fn full_rope(&self, theta: f64, head_dim: usize, dims_key: &str) -> Result<Value> {
        let Some(t) = self.tensor("rope_freqs.weight") else {
            return match self.uint(dims_key, "the full layers' RoPE")? {
                Some(d) if d != head_dim => {
                    Err(self.bad(dims_key, format!("is {d}; without rope_freqs.weight full layers rotate all {head_dim} dims")))
                }
                _ => Ok(json!({ "rope_type": "default", "rope_theta": theta })),
            };
        };
        let bad = |message: String| ModelError::GgufTensor { path: self.path().into(), name: t.name.clone(), message };
        if t.dims != [head_dim / 2] || t.dtype != crate::stored::StoredDtype::F32 {
            return Err(bad(format!(
                "expected F32 [{}] (head_dim / 2 of the full layers), got {} {:?}",
                head_dim / 2,
                t.dtype.name(),
                t.dims
            )));
        }
        let values = self.stored_gguf(t).to_f32();
        let rotated = values.iter().take_while(|&&v| v != UNROTATED).count();
        let factor = values.first().copied().unwrap_or(1.0);
        if values[rotated..].iter().any(|&v| v != UNROTATED) || values[..rotated].iter().any(|&v| v != factor) || !(factor > 0.0) {
            return Err(bad(format!("expected a factor on the first slots and {UNROTATED:e} on the rest, got {values:?}")));
        }
        // The smallest factor whose slot count (`floor(factor · head_dim / 2)`) is `rotated`.
        let mut partial = (2 * rotated) as f64 / head_dim as f64;
        while ((partial * head_dim as f64 / 2.0).floor() as usize) < rotated {
            partial = partial.next_up();
        }
        Ok(json!({
            "rope_type": "proportional",
            "rope_theta": theta,
            "partial_rotary_factor": partial,
            "factor": factor,
        }))
    }

    /// The sampler's parameters the converter copies from `generation_config.json` (`diffusion.eb_*`),
    /// and the tokenizer's end and pad ids; absent keys stay unset.
    pub fn generation_config(&self) -> Result<RawGenerationConfig> {
        let mut g = RawGenerationConfig {
            max_denoising_steps: self.uint("diffusion.eb_max_steps", "the denoising steps")?,
            t_min: self.float("diffusion.eb_t_min")?,
            t_max: self.float("diffusion.eb_t_max")?,
            entropy_bound: self.float("diffusion.eb_entropy_bound")?,
            stability_threshold: self.uint("diffusion.eb_stability_threshold", "adaptive stopping")?,
            confidence_threshold: self.float("diffusion.eb_confidence_threshold")?,
            ..RawGenerationConfig::default()
        };
        g.pad_token_id = self.uint("tokenizer.ggml.padding_token_id", "the pad id")?.and_then(|v| u32::try_from(v).ok());
        Ok(g)
    }
}

/// The metadata [`GgufFile::model_config`] reads back as `config` (and the sampler keys of
/// `generation`), for dg's writer. Errors for geometry GGUF's keys cannot express.
pub fn model_metadata(
    config: &ModelConfig,
    generation: Option<&RawGenerationConfig>,
) -> std::result::Result<Vec<(String, MetaValue)>, String> {
    let t = &config.text;
    let k = |s: &str| format!("{ARCH}.{s}");
    let u32v = |v: usize| u32::try_from(v).map(MetaValue::U32).map_err(|_| format!("{v} does not fit a uint32"));
    let i32v = |v: usize| i32::try_from(v).map(MetaValue::I32).map_err(|_| format!("{v} does not fit an int32"));
    let layer = |kind: LayerKind| t.layers.iter().find(|l| l.kind == kind);
    let sliding = layer(LayerKind::Sliding).or(layer(LayerKind::Full));
    let full = layer(LayerKind::Full).or(sliding);
    let head = |l: Option<&crate::config::LayerSpec>| l.map_or(0, |l| l.head_dim);
    if let Some(s) = sliding
        && s.rope.proportional
    {
        return Err("sliding layers with proportional RoPE cannot be written to GGUF".into());
    }
    let mut m: Vec<(String, MetaValue)> = vec![
        ("general.architecture".into(), MetaValue::Str(ARCH.into())),
        ("general.type".into(), MetaValue::Str("model".into())),
        ("general.quantization_version".into(), MetaValue::U32(GGML_QUANT_VERSION)),
        (k("vocab_size"), u32v(t.vocab_size)?),
        (k("context_length"), u32v(t.max_position_embeddings)?),
        (k("embedding_length"), u32v(t.hidden_size)?),
        (k("block_count"), u32v(t.num_layers())?),
        (k("feed_forward_length"), u32v(t.intermediate_size)?),
        (k("attention.head_count"), u32v(t.num_attention_heads)?),
        (
            k("attention.head_count_kv"),
            MetaValue::Array(ty::I32, t.layers.iter().map(|l| i32v(l.num_kv_heads)).collect::<std::result::Result<_, _>>()?),
        ),
        (k("attention.key_length"), u32v(head(full))?),
        (k("attention.value_length"), u32v(head(full))?),
        (k("attention.key_length_swa"), u32v(head(sliding))?),
        (k("attention.value_length_swa"), u32v(head(sliding))?),
        (k("attention.sliding_window"), u32v(t.sliding_window)?),
        // Gemma 3n's KV sharing and per-layer inputs, which DiffusionGemma has none of.
        (k("attention.shared_kv_layers"), MetaValue::U32(0)),
        (k("embedding_length_per_layer_input"), MetaValue::U32(0)),
        (
            k("attention.sliding_window_pattern"),
            MetaValue::Array(ty::BOOL, t.layers.iter().map(|l| MetaValue::Bool(l.kind == LayerKind::Sliding)).collect()),
        ),
        (k("attention.layer_norm_rms_epsilon"), MetaValue::F32(t.rms_norm_eps)),
        (k("attention.causal"), MetaValue::Bool(false)),
        (k("expert_count"), u32v(t.num_experts)?),
        (k("expert_used_count"), u32v(t.top_k_experts)?),
        (k("expert_feed_forward_length"), u32v(t.moe_intermediate_size)?),
        (k("rope.freq_base"), MetaValue::F32(full.map_or(1e6, |l| l.rope.theta as f32))),
        (k("rope.freq_base_swa"), MetaValue::F32(sliding.map_or(1e4, |l| l.rope.theta as f32))),
        (k("rope.dimension_count"), u32v(head(full))?),
        (k("rope.dimension_count_swa"), u32v(head(sliding))?),
        ("diffusion.canvas_length".into(), u32v(config.canvas_length)?),
    ];
    // 0 is llama.cpp's "no softcap"; an absent key would read as 30.
    m.push((k("final_logit_softcapping"), MetaValue::F32(t.final_logit_softcapping.unwrap_or(0.0))));
    if let Some(pad) = t.pad_token_id {
        m.push(("tokenizer.ggml.padding_token_id".into(), MetaValue::U32(pad)));
    }
    match config.eos_token_ids.as_slice() {
        [] => {}
        [eos] => m.push(("tokenizer.ggml.eos_token_id".into(), MetaValue::U32(*eos))),
        [eos, eot] => {
            m.push(("tokenizer.ggml.eos_token_id".into(), MetaValue::U32(*eos)));
            m.push(("tokenizer.ggml.eot_token_id".into(), MetaValue::U32(*eot)));
        }
        more => return Err(format!("{} end-of-sequence ids do not fit GGUF's eos and eot keys", more.len())),
    }
    if let Some(g) = generation {
        let entropy = g.entropy_bound.or(g.sampler_config.as_ref().map(|s| s.entropy_bound));
        let opt_u = |key: &str, v: Option<usize>| v.map(|v| u32v(v).map(|v| (key.to_string(), v)));
        let opt_f = |key: &str, v: Option<f64>| v.map(|v| (key.to_string(), MetaValue::F32(v as f32)));
        m.extend(opt_u("diffusion.eb_max_steps", g.max_denoising_steps).transpose()?);
        m.extend(opt_f("diffusion.eb_t_min", g.t_min));
        m.extend(opt_f("diffusion.eb_t_max", g.t_max));
        m.extend(opt_f("diffusion.eb_entropy_bound", entropy));
        m.extend(opt_u("diffusion.eb_stability_threshold", g.stability_threshold).transpose()?);
        m.extend(opt_f("diffusion.eb_confidence_threshold", g.confidence_threshold));
    }
    Ok(m)
}

/// `rope_freqs.weight` for the full layers' RoPE, as `Gemma4Model.generate_extra_tensors` writes
/// it; `None` when no full layer rotates proportionally.
pub fn rope_freqs(config: &ModelConfig) -> Option<Vec<f32>> {
    let full = config.text.layers.iter().find(|l| l.kind == LayerKind::Full && l.rope.proportional)?;
    let half = full.head_dim / 2;
    let rotated = (full.rope.partial_rotary_factor * full.head_dim as f64 / 2.0).floor() as usize;
    Some((0..half).map(|i| if i < rotated { full.rope.factor as f32 } else { UNROTATED }).collect())
}

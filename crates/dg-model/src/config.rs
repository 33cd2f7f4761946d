//! `config.json` of a DiffusionGemma checkpoint, resolved into per-layer geometry.
//!
//! Mirrors `configuration_diffusion_gemma.py` (`DiffusionGemmaConfig`, `DiffusionGemmaTextConfig`):
//! the 5:1 default layer pattern with the last layer forced to full attention, `per_layer_config`
//! overrides (what transformers 5.x writes) or the older `global_head_dim` /
//! `num_global_key_value_heads` keys, and per-layer-type `rope_parameters`.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use crate::error::{ModelError, Result};
use crate::json::read_json;
use crate::vision::{RawVisionConfig, VisionConfig};

/// Attention type of one layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerKind {
    /// Local attention: window `sliding_window` in the encoder, last W−1 cached tokens in the decoder.
    Sliding,
    /// Global attention; K = V (no `v_proj`).
    Full,
}

impl LayerKind {
    fn parse(s: &str) -> Option<Self> {
        match s {
            "sliding_attention" => Some(LayerKind::Sliding),
            "full_attention" => Some(LayerKind::Full),
            _ => None,
        }
    }

    /// The HF name of this layer type (`sliding_attention` / `full_attention`).
    pub fn hf_name(self) -> &'static str {
        match self {
            LayerKind::Sliding => "sliding_attention",
            LayerKind::Full => "full_attention",
        }
    }
}

/// Rotary embedding of one layer type (`modeling_rope_utils.py`).
#[derive(Debug, Clone, PartialEq)]
pub struct RopeSpec {
    pub theta: f64,
    /// `default` rotates every dimension; `proportional` rotates the first
    /// `int(partial_rotary_factor · head_dim / 2)` frequency slots and leaves the rest at 0.
    pub proportional: bool,
    pub partial_rotary_factor: f64,
    /// Divides every inverse frequency (`factor`, proportional only; 1 otherwise).
    pub factor: f64,
}

impl RopeSpec {
    /// Inverse frequencies for a head of `head_dim`, length `head_dim / 2`, computed like the
    /// reference: f32 exponent `2k / head_dim`, `theta ^ exponent` correctly rounded to f32.
    pub fn inv_freq(&self, head_dim: usize) -> Vec<f32> {
        let half = head_dim / 2;
        let rotated = if self.proportional { (self.partial_rotary_factor * head_dim as f64 / 2.0).floor() as usize } else { half };
        let theta = self.theta as f32;
        (0..half)
            .map(|k| {
                if k >= rotated {
                    return 0.0;
                }
                let exponent = (2 * k) as f32 / head_dim as f32;
                let pow = (theta as f64).powf(exponent as f64) as f32;
                let inv = 1.0f32 / pow;
                if self.proportional { inv / self.factor as f32 } else { inv }
            })
            .collect()
    }
}

/// Table entries (positions × frequencies) from which [`RopeSpec::cos_sin`] splits its work over
/// threads: a 1024-token prefill's tables (about 400k entries over both layer types) took 6.5 ms
/// of an H200 host's time on one thread, before the first layer was submitted.
const PARALLEL_ROPE_ENTRIES: usize = 1 << 14;

impl RopeSpec {
    /// cos and sin of `pos · inv_freq` for positions `start..start+tokens`, `[tokens, head_dim/2]`
    /// each: θ is the f32 product (as the reference's f32 matmul), cos/sin rounded from f64. Large
    /// tables are computed by several threads, each its own rows: the same values.
    pub fn cos_sin(&self, head_dim: usize, start: usize, tokens: usize) -> (Vec<f32>, Vec<f32>) {
        let inv_freq = self.inv_freq(head_dim);
        let (mut cos, mut sin) = (vec![0f32; tokens * inv_freq.len()], vec![0f32; tokens * inv_freq.len()]);
        let width = inv_freq.len().max(1);
        let threads =
            if cos.len() >= PARALLEL_ROPE_ENTRIES { std::thread::available_parallelism().map_or(1, |n| n.get()).min(16) } else { 1 };
        let rows = tokens.div_ceil(threads).max(1);
        std::thread::scope(|scope| {
            for (i, (c, s)) in cos.chunks_mut(rows * width).zip(sin.chunks_mut(rows * width)).enumerate() {
                let inv_freq = &inv_freq;
                let first = start + i * rows;
                if threads > 1 {
                    scope.spawn(move || rope_rows(inv_freq, first, c, s));
                } else {
                    rope_rows(inv_freq, first, c, s);
                }
            }
        });
        (cos, sin)
    }
}

/// Fills `cos` and `sin` (whole rows of `inv_freq.len()`) for positions `first..`. A frequency of
/// 0 (the unrotated slots of a proportional RoPE) gives θ = +0: cos 1 and sin +0, taken without
/// the trigonometry.
fn rope_rows(inv_freq: &[f32], first: usize, cos: &mut [f32], sin: &mut [f32]) {
    let width = inv_freq.len().max(1);
    for (t, (c_row, s_row)) in cos.chunks_mut(width).zip(sin.chunks_mut(width)).enumerate() {
        let pos = (first + t) as f32;
        for ((c, s), &f) in c_row.iter_mut().zip(s_row.iter_mut()).zip(inv_freq) {
            if f == 0.0 {
                (*c, *s) = (1.0, 0.0);
            } else {
                let theta = (pos * f) as f64;
                (*c, *s) = (theta.cos() as f32, theta.sin() as f32);
            }
        }
    }
}

/// Geometry of one layer, after `per_layer_config` overrides.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerSpec {
    pub kind: LayerKind,
    pub head_dim: usize,
    pub num_kv_heads: usize,
    pub rope: RopeSpec,
}

impl LayerSpec {
    /// Sliding layers have a separate `v_proj`; full layers take V from the raw K projection.
    pub fn has_v_proj(&self) -> bool {
        self.kind == LayerKind::Sliding
    }
}

/// The text model's configuration, resolved and validated.
#[derive(Debug, Clone, PartialEq)]
pub struct TextConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    /// Width of the dense MLP and of the self-conditioning MLP.
    pub intermediate_size: usize,
    pub num_attention_heads: usize,
    pub num_experts: usize,
    pub top_k_experts: usize,
    pub moe_intermediate_size: usize,
    pub rms_norm_eps: f32,
    /// W: encoder window including the query; the decoder sees the last W−1 cached tokens.
    pub sliding_window: usize,
    pub final_logit_softcapping: Option<f32>,
    pub max_position_embeddings: usize,
    pub pad_token_id: Option<u32>,
    pub layers: Vec<LayerSpec>,
}

impl TextConfig {
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// Cached positions a sliding layer keeps and the decoder sees: W − 1, the dynamic sliding
    /// cache's length (spec §5.2).
    pub fn sliding_kept(&self) -> usize {
        self.sliding_window.saturating_sub(1)
    }

    /// `sqrt(hidden_size)` as the f32 the reference multiplies embeddings by.
    pub fn embed_scale(&self) -> f32 {
        (self.hidden_size as f64).sqrt() as f32
    }

    /// Number of text parameters (embedding counted once, layer scalars excluded). Saturates at
    /// `u64::MAX` for hand-built configs whose sizes overflow (`from_json_str` rejects those).
    pub fn num_parameters(&self) -> u64 {
        self.checked_num_parameters().unwrap_or(u64::MAX)
    }

    /// [`Self::num_parameters`], or `None` when a tensor size or the total overflows `u64`.
    fn checked_num_parameters(&self) -> Option<u64> {
        let mul = |a: u64, b: u64| a.checked_mul(b);
        let h = self.hidden_size as u64;
        let i_d = self.intermediate_size as u64;
        let e = self.num_experts as u64;
        let i_e = self.moe_intermediate_size as u64;
        let dense = mul(mul(3, h)?, i_d)?; // gate, up, down
        let mut n = mul(self.vocab_size as u64, h)?.checked_add(h)?; // embedding + final norm
        n = n.checked_add(h)?.checked_add(dense)?; // self-conditioning
        for layer in &self.layers {
            let head_dim = layer.head_dim as u64;
            let q = mul(self.num_attention_heads as u64, head_dim)?;
            let kv = mul(layer.num_kv_heads as u64, head_dim)?;
            let projections = if layer.has_v_proj() { 2 } else { 1 };
            let terms = [
                mul(7, h)?,                                 // norms
                mul(mul(2, q)?, h)?,                        // q, o
                mul(mul(projections, kv)?, h)?,             // k (and v)
                mul(2, head_dim)?,                          // q_norm, k_norm
                dense,                                      // dense MLP
                mul(e, h)?.checked_add(h)?.checked_add(e)?, // router proj, scale, per_expert_scale
                mul(mul(mul(e, 3)?, i_e)?, h)?,             // experts
            ];
            for term in terms {
                n = n.checked_add(term)?;
            }
        }
        Some(n)
    }
}

/// The top-level `config.json` (`model_type: diffusion_gemma`).
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub text: TextConfig,
    /// C: tokens denoised in parallel per block.
    pub canvas_length: usize,
    /// Top-level `eos_token_id` (one or several ids), if any.
    pub eos_token_ids: Vec<u32>,
    pub image_token_id: Option<u32>,
    /// `<start_of_image>` / `<end_of_image>`, which wrap an image's soft tokens in the prompt.
    pub boi_token_id: Option<u32>,
    pub eoi_token_id: Option<u32>,
    /// The vision tower's config; `None` when `vision_config` is absent or null (text only).
    pub vision: Option<VisionConfig>,
    /// `text_config.use_bidirectional_attention == "vision"`: the encoder attends bidirectionally
    /// within each run of image soft tokens.
    pub images_bidirectional: bool,
}

impl ModelConfig {
    /// Reads and validates `config.json`.
    pub fn from_file(path: &Path) -> Result<Self> {
        let raw: RawConfig = read_json(path)?;
        Self::from_raw(raw, path)
    }

    /// Parses a `config.json` held in memory; `path` only names the source in errors.
    pub fn from_json_str(json: &str, path: &Path) -> Result<Self> {
        let raw: RawConfig = serde_json::from_str(json).map_err(|source| ModelError::Json { path: path.to_path_buf(), source })?;
        Self::from_raw(raw, path)
    }

    fn from_raw(raw: RawConfig, path: &Path) -> Result<Self> {
        match raw.model_type.as_deref() {
            Some("diffusion_gemma") => {}
            Some(other) => {
                return Err(ModelError::UnknownModelType { path: path.into(), found: other.to_string(), expected: "diffusion_gemma" });
            }
            None => return Err(ModelError::config(path, "missing \"model_type\"")),
        }
        let text_raw = raw.text_config.ok_or_else(|| ModelError::config(path, "missing \"text_config\""))?;
        let images_bidirectional = text_raw.use_bidirectional_attention.as_deref() == Some("vision");
        let text = text_raw.resolve(path)?;
        let canvas_length = raw.canvas_length.unwrap_or(256);
        if canvas_length == 0 {
            return Err(ModelError::config(path, "canvas_length must be > 0"));
        }
        let eos_token_ids = raw.eos_token_id.map(IdOrList::into_vec).unwrap_or_default();
        for &id in &eos_token_ids {
            check_id(path, "eos_token_id", id, text.vocab_size)?;
        }
        let vision = raw.vision_config.map(|v| v.resolve(path)).transpose()?;
        Ok(ModelConfig {
            text,
            canvas_length,
            eos_token_ids,
            image_token_id: raw.image_token_id,
            boi_token_id: raw.boi_token_id,
            eoi_token_id: raw.eoi_token_id,
            vision,
            images_bidirectional,
        })
    }
}

fn check_id(path: &Path, field: &str, id: u32, vocab: usize) -> Result<()> {
    if (id as usize) < vocab {
        Ok(())
    } else {
        Err(ModelError::config(path, format!("{field} {id} is outside the vocabulary (vocab_size {vocab})")))
    }
}

/// One id or a list of ids, as HF writes `eos_token_id`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum IdOrList {
    One(u32),
    Many(Vec<u32>),
}

impl IdOrList {
    pub fn into_vec(self) -> Vec<u32> {
        match self {
            IdOrList::One(id) => vec![id],
            IdOrList::Many(ids) => ids,
        }
    }
}

#[derive(Debug, Deserialize)]
struct RawConfig {
    model_type: Option<String>,
    text_config: Option<RawTextConfig>,
    canvas_length: Option<usize>,
    eos_token_id: Option<IdOrList>,
    image_token_id: Option<u32>,
    boi_token_id: Option<u32>,
    eoi_token_id: Option<u32>,
    vision_config: Option<RawVisionConfig>,
}

#[derive(Debug, Deserialize)]
struct RawTextConfig {
    model_type: Option<String>,
    vocab_size: Option<usize>,
    hidden_size: Option<usize>,
    intermediate_size: Option<usize>,
    num_hidden_layers: Option<usize>,
    num_attention_heads: Option<usize>,
    num_key_value_heads: Option<usize>,
    num_global_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    global_head_dim: Option<usize>,
    hidden_activation: Option<String>,
    max_position_embeddings: Option<usize>,
    rms_norm_eps: Option<f64>,
    /// Absent means the class default 0; an explicit null means no pad id.
    #[serde(default, deserialize_with = "explicit_null")]
    pad_token_id: Option<Option<u32>>,
    tie_word_embeddings: Option<bool>,
    rope_parameters: Option<BTreeMap<String, RawRope>>,
    attention_bias: Option<bool>,
    sliding_window: Option<usize>,
    layer_types: Option<Vec<String>>,
    /// `Some(None)` is an explicit null (no softcap); absent means the class default 30.
    #[serde(default, deserialize_with = "explicit_null")]
    final_logit_softcapping: Option<Option<f64>>,
    use_bidirectional_attention: Option<String>,
    num_experts: Option<usize>,
    top_k_experts: Option<usize>,
    moe_intermediate_size: Option<usize>,
    per_layer_config: Option<BTreeMap<String, RawLayerOverride>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLayerOverride {
    head_dim: Option<usize>,
    num_key_value_heads: Option<usize>,
}

#[derive(Debug, Deserialize)]
struct RawRope {
    rope_type: Option<String>,
    rope_theta: Option<f64>,
    partial_rotary_factor: Option<f64>,
    factor: Option<f64>,
}

fn explicit_null<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(d).map(Some)
}

impl RawTextConfig {
    fn resolve(self, path: &Path) -> Result<TextConfig> {
        let err = |m: String| ModelError::config(path, format!("text_config: {m}"));
        if let Some(mt) = &self.model_type
            && mt != "diffusion_gemma_text"
        {
            return Err(ModelError::UnknownModelType { path: path.into(), found: mt.clone(), expected: "diffusion_gemma_text" });
        }
        // Class defaults of DiffusionGemmaTextConfig.
        let vocab_size = self.vocab_size.unwrap_or(262_144);
        let hidden_size = self.hidden_size.unwrap_or(2304);
        let intermediate_size = self.intermediate_size.unwrap_or(9216);
        let num_layers = self.num_hidden_layers.unwrap_or(30);
        let num_heads = self.num_attention_heads.unwrap_or(8);
        let num_kv_heads = self.num_key_value_heads.unwrap_or(4);
        let head_dim = self.head_dim.unwrap_or(256);
        let sliding_window = self.sliding_window.unwrap_or(512);
        let num_experts = self.num_experts.ok_or_else(|| err("num_experts is required".into()))?;
        let top_k = self.top_k_experts.ok_or_else(|| err("top_k_experts is required".into()))?;
        let moe_intermediate_size = self.moe_intermediate_size.ok_or_else(|| err("moe_intermediate_size is required".into()))?;

        for (name, v) in [
            ("vocab_size", vocab_size),
            ("hidden_size", hidden_size),
            ("intermediate_size", intermediate_size),
            ("num_hidden_layers", num_layers),
            ("num_attention_heads", num_heads),
            ("num_key_value_heads", num_kv_heads),
            ("head_dim", head_dim),
            ("sliding_window", sliding_window),
            ("num_experts", num_experts),
            ("top_k_experts", top_k),
            ("moe_intermediate_size", moe_intermediate_size),
        ] {
            if v == 0 {
                return Err(err(format!("{name} must be > 0")));
            }
        }
        if num_layers > MAX_LAYERS {
            return Err(err(format!("num_hidden_layers {num_layers} exceeds the supported maximum {MAX_LAYERS}")));
        }
        if top_k > num_experts {
            return Err(err(format!("top_k_experts {top_k} exceeds num_experts {num_experts}")));
        }
        if vocab_size > u32::MAX as usize {
            return Err(err(format!("vocab_size {vocab_size} does not fit token ids of 32 bits")));
        }
        if let Some(act) = &self.hidden_activation
            && act != "gelu_pytorch_tanh"
        {
            return Err(err(format!("hidden_activation {act:?} is not supported (only gelu_pytorch_tanh)")));
        }
        if self.attention_bias == Some(true) {
            return Err(err("attention_bias = true is not supported".into()));
        }
        if self.tie_word_embeddings == Some(false) {
            return Err(err("tie_word_embeddings = false is not supported (the head is the embedding)".into()));
        }
        match self.use_bidirectional_attention.as_deref() {
            None | Some("vision") => {}
            Some(other) => {
                return Err(err(format!("use_bidirectional_attention {other:?} is not supported (text encoder must be causal)")));
            }
        }
        let rms_norm_eps = self.rms_norm_eps.unwrap_or(1e-6);
        if !(rms_norm_eps > 0.0) {
            return Err(err(format!("rms_norm_eps must be > 0, got {rms_norm_eps}")));
        }

        let kinds = resolve_layer_types(self.layer_types.as_deref(), num_layers).map_err(err)?;
        let ropes = resolve_rope(self.rope_parameters).map_err(err)?;
        let overrides =
            resolve_overrides(self.per_layer_config, &kinds, self.global_head_dim, self.num_global_key_value_heads).map_err(err)?;

        let mut layers = Vec::with_capacity(num_layers);
        for (i, &kind) in kinds.iter().enumerate() {
            let o = overrides.get(&i);
            let hd = o.and_then(|o| o.head_dim).unwrap_or(head_dim);
            let kv = o.and_then(|o| o.num_key_value_heads).unwrap_or(num_kv_heads);
            if hd == 0 || hd % 2 != 0 {
                return Err(err(format!("layer {i}: head_dim {hd} must be even and > 0")));
            }
            if kv == 0 || !num_heads.is_multiple_of(kv) {
                return Err(err(format!("layer {i}: num_attention_heads {num_heads} is not a multiple of num_key_value_heads {kv}")));
            }
            let rope =
                ropes.get(kind.hf_name()).cloned().ok_or_else(|| err(format!("rope_parameters has no entry for {:?}", kind.hf_name())))?;
            layers.push(LayerSpec { kind, head_dim: hd, num_kv_heads: kv, rope });
        }
        // The reference keeps one RoPE table per layer type, built from that type's head_dim.
        for kind in [LayerKind::Sliding, LayerKind::Full] {
            let mut dims = layers.iter().filter(|l| l.kind == kind).map(|l| l.head_dim);
            if let Some(first) = dims.next()
                && dims.any(|d| d != first)
            {
                return Err(err(format!("layers of type {:?} have different head_dim", kind.hf_name())));
            }
        }

        let final_logit_softcapping = match self.final_logit_softcapping {
            None => Some(30.0),
            Some(v) => v.map(|v| v as f32),
        };
        if let Some(cap) = final_logit_softcapping
            && !(cap > 0.0)
        {
            return Err(err(format!("final_logit_softcapping must be > 0, got {cap}")));
        }
        let pad_token_id = self.pad_token_id.unwrap_or(Some(0));
        if let Some(pad) = pad_token_id {
            check_id(path, "text_config.pad_token_id", pad, vocab_size)?;
        }
        let text = TextConfig {
            vocab_size,
            hidden_size,
            intermediate_size,
            num_attention_heads: num_heads,
            num_experts,
            top_k_experts: top_k,
            moe_intermediate_size,
            rms_norm_eps: rms_norm_eps as f32,
            sliding_window,
            final_logit_softcapping,
            max_position_embeddings: self.max_position_embeddings.unwrap_or(131_072),
            pad_token_id,
            layers,
        };
        // Each tensor's element count (and so each shape product) is at most the total.
        match text.checked_num_parameters() {
            Some(n) if usize::try_from(n).is_ok() => Ok(text),
            _ => Err(err("tensor sizes overflow (check hidden_size, vocab_size, head_dim, num_experts, ...)".into())),
        }
    }
}

/// Upper bound on `num_hidden_layers`: the real model has 30; the bound keeps an absurd value
/// from allocating per-layer tables of that length.
const MAX_LAYERS: usize = 4096;

/// `layer_types`, or the default pattern: 5 sliding : 1 full, and the last layer always full.
fn resolve_layer_types(types: Option<&[String]>, num_layers: usize) -> Result<Vec<LayerKind>, String> {
    let mut kinds = match types {
        None => (0..num_layers).map(|i| if (i + 1) % 6 != 0 { LayerKind::Sliding } else { LayerKind::Full }).collect::<Vec<_>>(),
        Some(types) => {
            if types.len() != num_layers {
                return Err(format!("layer_types has {} entries but num_hidden_layers is {num_layers}", types.len()));
            }
            types
                .iter()
                .enumerate()
                .map(|(i, t)| LayerKind::parse(t).ok_or_else(|| format!("layer_types[{i}] = {t:?} is unknown")))
                .collect::<Result<Vec<_>, _>>()?
        }
    };
    if let Some(last) = kinds.last_mut() {
        *last = LayerKind::Full;
    }
    Ok(kinds)
}

fn resolve_rope(raw: Option<BTreeMap<String, RawRope>>) -> Result<BTreeMap<String, RopeSpec>, String> {
    let mut out = BTreeMap::new();
    let Some(raw) = raw else {
        out.insert("sliding_attention".into(), RopeSpec { theta: 10_000.0, proportional: false, partial_rotary_factor: 1.0, factor: 1.0 });
        out.insert("full_attention".into(), RopeSpec { theta: 1_000_000.0, proportional: true, partial_rotary_factor: 0.25, factor: 1.0 });
        return Ok(out);
    };
    for (name, r) in raw {
        let theta = r.rope_theta.ok_or_else(|| format!("rope_parameters.{name}.rope_theta is missing"))?;
        if !(theta > 0.0) {
            return Err(format!("rope_parameters.{name}.rope_theta must be > 0"));
        }
        let prf = r.partial_rotary_factor.unwrap_or(1.0);
        let spec = match r.rope_type.as_deref().unwrap_or("default") {
            "default" => {
                if prf != 1.0 {
                    return Err(format!("rope_parameters.{name}: partial_rotary_factor with rope_type \"default\" is not supported"));
                }
                RopeSpec { theta, proportional: false, partial_rotary_factor: 1.0, factor: 1.0 }
            }
            "proportional" => {
                if !(0.0..=1.0).contains(&prf) {
                    return Err(format!("rope_parameters.{name}.partial_rotary_factor must be in [0, 1]"));
                }
                RopeSpec { theta, proportional: true, partial_rotary_factor: prf, factor: r.factor.unwrap_or(1.0) }
            }
            other => return Err(format!("rope_parameters.{name}.rope_type {other:?} is not supported")),
        };
        out.insert(name, spec);
    }
    Ok(out)
}

/// Per-layer overrides, as `DiffusionGemmaTextConfig.__post_init__` builds them: `per_layer_config`
/// when present (keys are layer indices), else `global_head_dim` (default 512) and
/// `num_global_key_value_heads` applied to every full-attention layer.
fn resolve_overrides(
    per_layer: Option<BTreeMap<String, RawLayerOverride>>,
    kinds: &[LayerKind],
    global_head_dim: Option<usize>,
    global_kv_heads: Option<usize>,
) -> Result<BTreeMap<usize, RawLayerOverride>, String> {
    let mut out = BTreeMap::new();
    match per_layer {
        Some(map) => {
            for (key, o) in map {
                let idx: usize = key.parse().map_err(|_| format!("per_layer_config key {key:?} is not a layer index"))?;
                if idx >= kinds.len() {
                    return Err(format!("per_layer_config names layer {idx}, but there are {} layers", kinds.len()));
                }
                out.insert(idx, o);
            }
        }
        None => {
            for (i, kind) in kinds.iter().enumerate() {
                if *kind == LayerKind::Full {
                    out.insert(
                        i,
                        RawLayerOverride { head_dim: Some(global_head_dim.unwrap_or(512)), num_key_value_heads: global_kv_heads },
                    );
                }
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<ModelConfig> {
        ModelConfig::from_json_str(json, Path::new("config.json"))
    }

    const REAL: &str = r#"{"model_type":"diffusion_gemma","canvas_length":256,"eos_token_id":[1,106],
      "text_config":{"vocab_size":262144,"hidden_size":2816,"intermediate_size":2112,"num_hidden_layers":30,
      "num_attention_heads":16,"num_key_value_heads":8,"num_global_key_value_heads":2,"head_dim":256,
      "global_head_dim":512,"sliding_window":1024,"num_experts":128,"top_k_experts":8,"moe_intermediate_size":704,
      "rope_parameters":{"sliding_attention":{"rope_type":"default","rope_theta":10000.0},
        "full_attention":{"rope_type":"proportional","rope_theta":1000000.0,"partial_rotary_factor":0.25}},
      "final_logit_softcapping":30.0,"use_bidirectional_attention":"vision"}}"#;

    #[test]
    fn rope_tables_are_the_formula_on_one_thread_or_many() {
        let c = parse(REAL).unwrap();
        for layer in [&c.text.layers[0], &c.text.layers[5]] {
            let inv_freq = layer.rope.inv_freq(layer.head_dim);
            // 5 tokens stay on one thread; 1000 from position 3 split (over 2^14 entries).
            for (start, tokens) in [(7, 5), (3, 1000)] {
                let (cos, sin) = layer.rope.cos_sin(layer.head_dim, start, tokens);
                assert_eq!((cos.len(), sin.len()), (tokens * inv_freq.len(), tokens * inv_freq.len()));
                for t in 0..tokens {
                    for (k, &f) in inv_freq.iter().enumerate() {
                        let theta = ((start + t) as f32 * f) as f64;
                        let at = t * inv_freq.len() + k;
                        assert_eq!(cos[at].to_bits(), (theta.cos() as f32).to_bits(), "cos at position {} slot {k}", start + t);
                        assert_eq!(sin[at].to_bits(), (theta.sin() as f32).to_bits(), "sin at position {} slot {k}", start + t);
                    }
                }
            }
        }
        assert_eq!(c.text.layers[0].rope.cos_sin(256, 0, 0), (vec![], vec![]));
    }

    #[test]
    fn real_geometry_resolves() {
        let c = parse(REAL).unwrap();
        let full: Vec<usize> = c.text.layers.iter().enumerate().filter(|(_, l)| l.kind == LayerKind::Full).map(|(i, _)| i).collect();
        assert_eq!(full, vec![5, 11, 17, 23, 29]);
        assert_eq!((c.text.layers[5].head_dim, c.text.layers[5].num_kv_heads), (512, 2));
        assert_eq!((c.text.layers[0].head_dim, c.text.layers[0].num_kv_heads), (256, 8));
        assert_eq!(c.eos_token_ids, vec![1, 106]);
        // §2.4 of the spec: 25,250,986,752 text parameters.
        assert_eq!(c.text.num_parameters(), 25_250_986_752);
        assert_eq!(c.text.embed_scale(), 53.065998);
    }

    #[test]
    fn rope_tables_match_the_spec_examples() {
        let c = parse(REAL).unwrap();
        let s = c.text.layers[0].rope.inv_freq(256);
        assert_eq!(s.len(), 128);
        approx_eq(s[1], 0.930_572_04);
        approx_eq(s[127], 1.0746e-4);
        let f = c.text.layers[5].rope.inv_freq(512);
        assert_eq!(f.len(), 256);
        approx_eq(f[1], 0.947_463_5);
        approx_eq(f[63], 0.033_376_25);
        assert!(f[64..].iter().all(|&x| x == 0.0));
    }

    fn approx_eq(a: f32, b: f32) {
        assert!((a - b).abs() <= 1e-6 * b.abs().max(1e-3), "{a} vs {b}");
    }

    #[test]
    fn per_layer_config_takes_precedence() {
        let json = r#"{"model_type":"diffusion_gemma","text_config":{"num_hidden_layers":3,"num_experts":4,
          "top_k_experts":2,"moe_intermediate_size":8,"head_dim":8,"num_attention_heads":4,"num_key_value_heads":2,
          "global_head_dim":64,"layer_types":["sliding_attention","full_attention","sliding_attention"],
          "per_layer_config":{"1":{"head_dim":16,"num_key_value_heads":1},"2":{"head_dim":16}}}}"#;
        let c = parse(json).unwrap();
        assert_eq!(c.text.layers[2].kind, LayerKind::Full, "last layer is forced to full");
        assert_eq!((c.text.layers[1].head_dim, c.text.layers[1].num_kv_heads), (16, 1));
        assert_eq!((c.text.layers[2].head_dim, c.text.layers[2].num_kv_heads), (16, 2));
        assert_eq!(c.text.layers[0].head_dim, 8);
        assert_eq!(c.canvas_length, 256);
    }

    #[test]
    fn default_pattern_is_five_to_one() {
        let json = r#"{"model_type":"diffusion_gemma","text_config":{"num_hidden_layers":8,"num_experts":4,
          "top_k_experts":2,"moe_intermediate_size":8}}"#;
        let c = parse(json).unwrap();
        let kinds: Vec<bool> = c.text.layers.iter().map(|l| l.kind == LayerKind::Full).collect();
        assert_eq!(kinds, vec![false, false, false, false, false, true, false, true]);
        assert_eq!(c.text.layers[5].head_dim, 512);
        assert_eq!(c.text.final_logit_softcapping, Some(30.0));
    }

    #[test]
    fn bad_configs_name_the_problem() {
        let cases = [
            (r#"{"model_type":"gemma4"}"#, "unsupported model_type"),
            (r#"{"text_config":{}}"#, "missing \"model_type\""),
            (r#"{"model_type":"diffusion_gemma"}"#, "missing \"text_config\""),
            (r#"{"model_type":"diffusion_gemma","text_config":{"top_k_experts":2,"moe_intermediate_size":8}}"#, "num_experts"),
            (r#"{"model_type":"diffusion_gemma","text_config":{"num_experts":2,"top_k_experts":4,"moe_intermediate_size":8}}"#, "exceeds"),
            (
                r#"{"model_type":"diffusion_gemma","text_config":{"num_experts":4,"top_k_experts":2,"moe_intermediate_size":8,"num_hidden_layers":2,"layer_types":["sliding_attention"]}}"#,
                "layer_types has 1",
            ),
            (
                r#"{"model_type":"diffusion_gemma","text_config":{"num_experts":4,"top_k_experts":2,"moe_intermediate_size":8,"hidden_activation":"relu"}}"#,
                "relu",
            ),
            (
                r#"{"model_type":"diffusion_gemma","text_config":{"num_experts":4,"top_k_experts":2,"moe_intermediate_size":8,"num_attention_heads":3}}"#,
                "multiple",
            ),
            (
                r#"{"model_type":"diffusion_gemma","text_config":{"num_experts":4,"top_k_experts":2,"moe_intermediate_size":8,"hidden_size":"big"}}"#,
                "malformed JSON",
            ),
            (
                r#"{"model_type":"diffusion_gemma","eos_token_id":999999,"text_config":{"num_experts":4,"top_k_experts":2,"moe_intermediate_size":8,"vocab_size":10}}"#,
                "outside the vocabulary",
            ),
        ];
        for (json, needle) in cases {
            let e = parse(json).unwrap_err().to_string();
            assert!(e.contains(needle), "{json}: error {e:?} lacks {needle:?}");
            assert!(e.contains("config.json"), "{e:?} does not name the file");
        }
    }
}

//! The Gemma 4 vision tower's config and weights (HF `Gemma4VisionConfig`, `Gemma4VisionModel`'s
//! parameter tree under `model.encoder.vision_tower.*`, and `Gemma4MultimodalEmbedder` under
//! `model.encoder.embed_vision.*`), in f32, linear weights in PyTorch's `[out, in]` layout.
//! The ops that use them are written down in docs/vision.md.

use std::path::Path;

use serde::Deserialize;

use crate::error::{ModelError, Result};
use crate::weights::{Matrix, TensorSource};

pub(crate) const TOWER: &str = "model.encoder.vision_tower";
pub(crate) const EMBED_VISION: &str = "model.encoder.embed_vision";

/// `vision_config` (`model_type: gemma4_vision`), resolved with the class defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct VisionConfig {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    pub patch_size: usize,
    pub pooling_kernel_size: usize,
    /// Rows of each axis of the position-embedding table.
    pub position_embedding_size: usize,
    pub rope_theta: f64,
    /// Soft tokens are standardized with `std_bias` / `std_scale`.
    pub standardize: bool,
}

#[derive(Debug, Deserialize)]
pub(crate) struct RawVisionConfig {
    model_type: Option<String>,
    hidden_size: Option<usize>,
    intermediate_size: Option<usize>,
    num_hidden_layers: Option<usize>,
    num_attention_heads: Option<usize>,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    hidden_activation: Option<String>,
    rms_norm_eps: Option<f64>,
    patch_size: Option<usize>,
    pooling_kernel_size: Option<usize>,
    position_embedding_size: Option<usize>,
    rope_parameters: Option<RawVisionRope>,
    use_clipped_linears: Option<bool>,
    standardize: Option<bool>,
    attention_bias: Option<bool>,
}

#[derive(Debug, Deserialize)]
struct RawVisionRope {
    rope_type: Option<String>,
    rope_theta: Option<f64>,
}

impl RawVisionConfig {
    pub(crate) fn resolve(self, path: &Path) -> Result<VisionConfig> {
        let err = |m: String| ModelError::config(path, format!("vision_config: {m}"));
        if let Some(mt) = &self.model_type
            && mt != "gemma4_vision"
        {
            return Err(ModelError::UnknownModelType { path: path.into(), found: mt.clone(), expected: "gemma4_vision" });
        }
        // Class defaults of Gemma4VisionConfig.
        let c = VisionConfig {
            hidden_size: self.hidden_size.unwrap_or(768),
            intermediate_size: self.intermediate_size.unwrap_or(3072),
            num_layers: self.num_hidden_layers.unwrap_or(16),
            num_heads: self.num_attention_heads.unwrap_or(12),
            num_kv_heads: self.num_key_value_heads.unwrap_or(12),
            head_dim: self.head_dim.unwrap_or(64),
            rms_norm_eps: self.rms_norm_eps.unwrap_or(1e-6),
            patch_size: self.patch_size.unwrap_or(16),
            pooling_kernel_size: self.pooling_kernel_size.unwrap_or(3),
            position_embedding_size: self.position_embedding_size.unwrap_or(10 * 1024),
            rope_theta: self.rope_parameters.as_ref().and_then(|r| r.rope_theta).unwrap_or(100.0),
            standardize: self.standardize.unwrap_or(false),
        };
        c.validate().map_err(err)?;
        if let Some(act) = &self.hidden_activation
            && act != "gelu_pytorch_tanh"
        {
            return Err(err(format!("hidden_activation {act:?} is not supported (only gelu_pytorch_tanh)")));
        }
        if let Some(rope) = self.rope_parameters.as_ref().and_then(|r| r.rope_type.as_deref())
            && rope != "axial"
        {
            return Err(err(format!("rope_type {rope:?} is not supported (only axial)")));
        }
        if self.use_clipped_linears == Some(true) {
            return Err(err("use_clipped_linears = true is not supported".into()));
        }
        if self.attention_bias == Some(true) {
            return Err(err("attention_bias = true is not supported".into()));
        }
        Ok(c)
    }
}

impl VisionConfig {
    /// Checks what the tower's ops need of the geometry, whichever file it came from; the error
    /// names the field.
    pub fn validate(&self) -> std::result::Result<(), String> {
        let c = self;
        for (name, v) in [
            ("hidden_size", c.hidden_size),
            ("intermediate_size", c.intermediate_size),
            ("num_hidden_layers", c.num_layers),
            ("num_attention_heads", c.num_heads),
            ("num_key_value_heads", c.num_kv_heads),
            ("patch_size", c.patch_size),
            ("pooling_kernel_size", c.pooling_kernel_size),
            ("position_embedding_size", c.position_embedding_size),
        ] {
            if v == 0 {
                return Err(format!("{name} must be > 0"));
            }
        }
        // The 2-D RoPE rotates two halves of the head, each in pairs.
        if c.head_dim == 0 || !c.head_dim.is_multiple_of(4) {
            return Err(format!("head_dim {} must be a positive multiple of 4 (2-D rotary halves)", c.head_dim));
        }
        if !c.num_heads.is_multiple_of(c.num_kv_heads) {
            return Err(format!("num_attention_heads {} is not a multiple of num_key_value_heads {}", c.num_heads, c.num_kv_heads));
        }
        if !(c.rms_norm_eps > 0.0) || !(c.rope_theta > 0.0) {
            return Err(format!("rms_norm_eps {} and rope_theta {} must be > 0", c.rms_norm_eps, c.rope_theta));
        }
        Ok(())
    }

    /// Values in one patch row (`3 · patch²`).
    pub fn patch_width(&self) -> usize {
        3 * self.patch_size * self.patch_size
    }
}

/// One encoder layer (`Gemma4VisionEncoderLayer`).
#[derive(Debug, Clone, PartialEq)]
pub struct VisionLayerWeights {
    pub input_layernorm: Vec<f32>,
    pub post_attention_layernorm: Vec<f32>,
    pub pre_feedforward_layernorm: Vec<f32>,
    pub post_feedforward_layernorm: Vec<f32>,
    pub q_proj: Matrix,
    pub k_proj: Matrix,
    pub v_proj: Matrix,
    pub o_proj: Matrix,
    /// `[head_dim]`; the value norm has no weight.
    pub q_norm: Vec<f32>,
    pub k_norm: Vec<f32>,
    pub gate_proj: Matrix,
    pub up_proj: Matrix,
    pub down_proj: Matrix,
}

/// The tower and its projection into the text model (`embed_vision`).
#[derive(Debug, Clone, PartialEq)]
pub struct VisionWeights {
    /// `[hidden, 3·patch²]`.
    pub input_proj: Matrix,
    /// `[2, position_embedding_size, hidden]`: the x table, then the y table.
    pub position_embedding_table: Vec<f32>,
    pub layers: Vec<VisionLayerWeights>,
    /// `std_bias`, `std_scale` (`[hidden]` each) when the config standardizes.
    pub standardize: Option<(Vec<f32>, Vec<f32>)>,
    /// `[text hidden, hidden]`.
    pub embedding_projection: Matrix,
}

/// Every vision tensor's HF name and shape (for loaders, manifests and random builders).
pub fn vision_manifest(c: &VisionConfig, text_hidden: usize) -> Vec<(String, Vec<usize>)> {
    let (h, i, hd) = (c.hidden_size, c.intermediate_size, c.head_dim);
    let mut m = vec![
        (format!("{TOWER}.patch_embedder.input_proj.weight"), vec![h, c.patch_width()]),
        (format!("{TOWER}.patch_embedder.position_embedding_table"), vec![2, c.position_embedding_size, h]),
    ];
    for l in 0..c.num_layers {
        let p = format!("{TOWER}.encoder.layers.{l}");
        for norm in ["input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"] {
            m.push((format!("{p}.{norm}.weight"), vec![h]));
        }
        m.push((format!("{p}.self_attn.q_proj.linear.weight"), vec![c.num_heads * hd, h]));
        m.push((format!("{p}.self_attn.k_proj.linear.weight"), vec![c.num_kv_heads * hd, h]));
        m.push((format!("{p}.self_attn.v_proj.linear.weight"), vec![c.num_kv_heads * hd, h]));
        m.push((format!("{p}.self_attn.o_proj.linear.weight"), vec![h, c.num_heads * hd]));
        m.push((format!("{p}.self_attn.q_norm.weight"), vec![hd]));
        m.push((format!("{p}.self_attn.k_norm.weight"), vec![hd]));
        m.push((format!("{p}.mlp.gate_proj.linear.weight"), vec![i, h]));
        m.push((format!("{p}.mlp.up_proj.linear.weight"), vec![i, h]));
        m.push((format!("{p}.mlp.down_proj.linear.weight"), vec![h, i]));
    }
    if c.standardize {
        m.push((format!("{TOWER}.std_bias"), vec![h]));
        m.push((format!("{TOWER}.std_scale"), vec![h]));
    }
    m.push((format!("{EMBED_VISION}.embedding_projection.weight"), vec![text_hidden, h]));
    m
}

impl VisionWeights {
    /// Loads the tower and the projection, checking names and shapes against `c`.
    pub fn build(src: &(impl TensorSource + ?Sized), c: &VisionConfig, text_hidden: usize) -> Result<Self> {
        let get = |name: String, shape: &[usize]| src.get(&name, shape);
        let mat = |name: String, rows: usize, cols: usize| Ok::<_, ModelError>(Matrix::new(rows, cols, get(name, &[rows, cols])?));
        let (h, i, hd) = (c.hidden_size, c.intermediate_size, c.head_dim);
        let layers = (0..c.num_layers)
            .map(|l| {
                let p = format!("{TOWER}.encoder.layers.{l}");
                let norm = |n: &str| get(format!("{p}.{n}.weight"), &[h]);
                Ok(VisionLayerWeights {
                    input_layernorm: norm("input_layernorm")?,
                    post_attention_layernorm: norm("post_attention_layernorm")?,
                    pre_feedforward_layernorm: norm("pre_feedforward_layernorm")?,
                    post_feedforward_layernorm: norm("post_feedforward_layernorm")?,
                    q_proj: mat(format!("{p}.self_attn.q_proj.linear.weight"), c.num_heads * hd, h)?,
                    k_proj: mat(format!("{p}.self_attn.k_proj.linear.weight"), c.num_kv_heads * hd, h)?,
                    v_proj: mat(format!("{p}.self_attn.v_proj.linear.weight"), c.num_kv_heads * hd, h)?,
                    o_proj: mat(format!("{p}.self_attn.o_proj.linear.weight"), h, c.num_heads * hd)?,
                    q_norm: get(format!("{p}.self_attn.q_norm.weight"), &[hd])?,
                    k_norm: get(format!("{p}.self_attn.k_norm.weight"), &[hd])?,
                    gate_proj: mat(format!("{p}.mlp.gate_proj.linear.weight"), i, h)?,
                    up_proj: mat(format!("{p}.mlp.up_proj.linear.weight"), i, h)?,
                    down_proj: mat(format!("{p}.mlp.down_proj.linear.weight"), h, i)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let standardize =
            if c.standardize { Some((get(format!("{TOWER}.std_bias"), &[h])?, get(format!("{TOWER}.std_scale"), &[h])?)) } else { None };
        Ok(VisionWeights {
            input_proj: mat(format!("{TOWER}.patch_embedder.input_proj.weight"), h, c.patch_width())?,
            position_embedding_table: get(format!("{TOWER}.patch_embedder.position_embedding_table"), &[2, c.position_embedding_size, h])?,
            layers,
            standardize,
            embedding_projection: mat(format!("{EMBED_VISION}.embedding_projection.weight"), text_hidden, h)?,
        })
    }
}

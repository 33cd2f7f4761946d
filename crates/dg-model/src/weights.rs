//! The text model's weights in f32, named and shaped as in the HF checkpoint.
//!
//! Mirrors the parameter tree of `DiffusionGemmaForBlockDiffusion` (spec §2.2–2.3): text weights
//! live under `model.decoder.*` and serve both encoder and decoder; the encoder keeps its own
//! `layer_scalar` buffers under `model.encoder.language_model.layers.N`; `lm_head` is the
//! embedding; the vision tower is skipped. Linear weights keep PyTorch's `[out, in]` layout.

use crate::config::{LayerKind, TextConfig};
use crate::error::{ModelError, Result};
use crate::names::{D, ENC, LayerNames, NORMS, Named, SharedNames};
use crate::stored::{StoredDtype, StoredTensor, f32_bytes};
use crate::tensors::Checkpoint;

/// A row-major `[rows, cols]` matrix; for a linear layer `rows = out`, `cols = in`.
#[derive(Debug, Clone, PartialEq)]
pub struct Matrix {
    pub rows: usize,
    pub cols: usize,
    pub data: Vec<f32>,
}

impl Matrix {
    pub fn new(rows: usize, cols: usize, data: Vec<f32>) -> Self {
        assert_eq!(data.len(), rows * cols, "matrix data does not match {rows}x{cols}");
        Matrix { rows, cols, data }
    }
}

/// The fused expert weights of one layer (`experts.gate_up_proj`, `experts.down_proj`).
#[derive(Debug, Clone, PartialEq)]
pub struct ExpertWeights {
    pub num_experts: usize,
    /// I_e: width of one expert.
    pub intermediate: usize,
    pub hidden: usize,
    /// `[E, 2·I_e, H]`: per expert, gate rows then up rows.
    pub gate_up: Vec<f32>,
    /// `[E, H, I_e]`.
    pub down: Vec<f32>,
}

impl ExpertWeights {
    /// Gate and up projection of expert `e`, as one `[2·I_e, H]` matrix slice.
    pub fn gate_up(&self, e: usize) -> &[f32] {
        let n = 2 * self.intermediate * self.hidden;
        &self.gate_up[e * n..(e + 1) * n]
    }

    /// Down projection of expert `e`, `[H, I_e]`.
    pub fn down(&self, e: usize) -> &[f32] {
        let n = self.hidden * self.intermediate;
        &self.down[e * n..(e + 1) * n]
    }
}

/// One transformer layer (`DiffusionGemma{Encoder,Decoder}TextLayer`, shared weights).
#[derive(Debug, Clone, PartialEq)]
pub struct LayerWeights {
    pub kind: LayerKind,
    pub input_layernorm: Vec<f32>,
    pub post_attention_layernorm: Vec<f32>,
    /// Pre-norm of the dense MLP.
    pub pre_feedforward_layernorm: Vec<f32>,
    /// Post-norm of the dense MLP.
    pub post_feedforward_layernorm_1: Vec<f32>,
    /// Pre-norm of the experts' input.
    pub pre_feedforward_layernorm_2: Vec<f32>,
    /// Post-norm of the MoE output.
    pub post_feedforward_layernorm_2: Vec<f32>,
    /// Norm of (dense + MoE) before the residual add.
    pub post_feedforward_layernorm: Vec<f32>,
    pub q_proj: Matrix,
    pub k_proj: Matrix,
    /// Absent in full-attention layers (V is the raw K projection).
    pub v_proj: Option<Matrix>,
    pub o_proj: Matrix,
    pub q_norm: Vec<f32>,
    pub k_norm: Vec<f32>,
    pub mlp_gate: Matrix,
    pub mlp_up: Matrix,
    pub mlp_down: Matrix,
    pub router_proj: Matrix,
    pub router_scale: Vec<f32>,
    pub per_expert_scale: Vec<f32>,
    pub experts: ExpertWeights,
    /// `model.encoder.language_model.layers.i.layer_scalar`.
    pub encoder_scalar: f32,
    /// `model.decoder.layers.i.layer_scalar`.
    pub decoder_scalar: f32,
}

/// `DiffusionGemmaSelfConditioning` (decoder only).
#[derive(Debug, Clone, PartialEq)]
pub struct SelfConditioningWeights {
    pub pre_norm: Vec<f32>,
    pub gate: Matrix,
    pub up: Matrix,
    pub down: Matrix,
}

/// All text weights.
#[derive(Debug, Clone, PartialEq)]
pub struct Weights {
    /// `[V, H]`, also the tied lm_head.
    pub embed: Matrix,
    pub final_norm: Vec<f32>,
    pub self_conditioning: SelfConditioningWeights,
    pub layers: Vec<LayerWeights>,
}

/// Something that yields named tensors of given shapes: as stored ([`TensorSource::stored`], what
/// the GPU upload packs from) or widened to f32 ([`TensorSource::get`], what the CPU computes in).
pub trait TensorSource {
    /// `name` in its stored dtype; an error when it is missing or its shape is not `shape`.
    fn stored(&self, name: &str, shape: &[usize]) -> Result<StoredTensor<'_>>;

    /// `name` widened to f32.
    fn get(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        Ok(self.stored(name, shape)?.into_f32())
    }
}

impl<T: TensorSource + ?Sized> TensorSource for &T {
    fn stored(&self, name: &str, shape: &[usize]) -> Result<StoredTensor<'_>> {
        (**self).stored(name, shape)
    }
}

impl TensorSource for Checkpoint {
    fn stored(&self, name: &str, shape: &[usize]) -> Result<StoredTensor<'_>> {
        Checkpoint::stored(self, name, shape)
    }
}

/// Weights already in memory serve their tensors by HF name (as F32, borrowed), so that the one
/// upload path that reads a checkpoint also takes weights a test or the parity harness prepared.
impl TensorSource for Weights {
    fn stored(&self, name: &str, shape: &[usize]) -> Result<StoredTensor<'_>> {
        let missing = || ModelError::MissingTensor { name: name.to_string(), location: "the in-memory weights".to_string() };
        let values = self.by_name(name).ok_or_else(missing)?;
        if values.len() != shape.iter().product::<usize>() {
            return Err(ModelError::ShapeMismatch {
                name: name.to_string(),
                path: "the in-memory weights".into(),
                expected: shape.to_vec(),
                got: vec![values.len()],
            });
        }
        Ok(StoredTensor::from_bytes(StoredDtype::F32, shape.to_vec(), f32_bytes(values)))
    }
}

impl Weights {
    /// The values of the tensor HF names `name` (the inverse of [`Weights::build`]'s reads).
    fn by_name(&self, name: &str) -> Option<&[f32]> {
        let sc = &self.self_conditioning;
        if let Some(rest) = name.strip_prefix(&format!("{ENC}.layers.")) {
            let (i, rest) = rest.split_once('.')?;
            let l = self.layers.get(i.parse::<usize>().ok()?)?;
            return (rest == "layer_scalar").then(|| std::slice::from_ref(&l.encoder_scalar));
        }
        let rest = name.strip_prefix(&format!("{D}."))?;
        if let Some(rest) = rest.strip_prefix("layers.") {
            let (i, rest) = rest.split_once('.')?;
            return self.layers.get(i.parse::<usize>().ok()?)?.by_name(rest);
        }
        Some(match rest {
            "embed_tokens.weight" => &self.embed.data,
            "norm.weight" => &self.final_norm,
            "self_conditioning.pre_norm.weight" => &sc.pre_norm,
            "self_conditioning.gate_proj.weight" => &sc.gate.data,
            "self_conditioning.up_proj.weight" => &sc.up.data,
            "self_conditioning.down_proj.weight" => &sc.down.data,
            _ => return None,
        })
    }
}

impl LayerWeights {
    /// The values of the layer tensor named `rest` (the part of its HF name after `layers.N.`).
    fn by_name(&self, rest: &str) -> Option<&[f32]> {
        let norms = [
            &self.input_layernorm,
            &self.post_attention_layernorm,
            &self.pre_feedforward_layernorm,
            &self.post_feedforward_layernorm_1,
            &self.pre_feedforward_layernorm_2,
            &self.post_feedforward_layernorm_2,
            &self.post_feedforward_layernorm,
        ];
        if let Some(norm) = rest.strip_suffix(".weight").and_then(|n| NORMS.iter().position(|&m| m == n)) {
            return Some(norms[norm]);
        }
        Some(match rest {
            "self_attn.q_proj.weight" => &self.q_proj.data,
            "self_attn.k_proj.weight" => &self.k_proj.data,
            "self_attn.v_proj.weight" => &self.v_proj.as_ref()?.data,
            "self_attn.o_proj.weight" => &self.o_proj.data,
            "self_attn.q_norm.weight" => &self.q_norm,
            "self_attn.k_norm.weight" => &self.k_norm,
            "mlp.gate_proj.weight" => &self.mlp_gate.data,
            "mlp.up_proj.weight" => &self.mlp_up.data,
            "mlp.down_proj.weight" => &self.mlp_down.data,
            "router.proj.weight" => &self.router_proj.data,
            "router.scale" => &self.router_scale,
            "router.per_expert_scale" => &self.per_expert_scale,
            "experts.gate_up_proj" => &self.experts.gate_up,
            "experts.down_proj" => &self.experts.down,
            "layer_scalar" => std::slice::from_ref(&self.decoder_scalar),
            _ => return None,
        })
    }
}

impl Weights {
    /// Loads every text tensor from a checkpoint, checking names and shapes against `cfg`.
    pub fn from_checkpoint(ckpt: &Checkpoint, cfg: &TextConfig) -> Result<Self> {
        Self::build(ckpt, cfg)
    }

    /// Assembles the weights from any source of named tensors (a checkpoint, a random generator).
    pub fn build(src: &(impl TensorSource + ?Sized), cfg: &TextConfig) -> Result<Self> {
        let mut w = Self::build_shared(src, cfg)?;
        for i in 0..cfg.num_layers() {
            w.layers.push(LayerWeights::load(src, cfg, i)?);
        }
        Ok(w)
    }

    /// Rounds every matrix (rank ≥ 2: embedding, projections, MLPs, router, experts) to the
    /// nearest BF16, ties to even, kept as f32: the weights a BF16 copy of them holds exactly
    /// (norm weights, scales and scalars are left as they are, as the GPU keeps them in f32).
    pub fn round_matrices_to_bf16(&mut self) {
        self.round_matrices(|x| half::bf16::from_f32(x).to_f32());
    }

    /// Rounds every matrix (the same tensors as [`Self::round_matrices_to_bf16`]) to the nearest
    /// IEEE F16, ties to even, kept as f32: the weights an F16 copy of them holds exactly. Values
    /// beyond ±65504 become ±∞ and values below 2⁻¹⁴ in magnitude f16 subnormals (or ±0); norm
    /// weights, scales and scalars are left as they are.
    pub fn round_matrices_to_f16(&mut self) {
        self.round_matrices(|x| half::f16::from_f32(x).to_f32());
    }

    /// The weights of the GPU's F16 mode: every matrix that runs on tensor cores (q, K/V, o, the
    /// dense and self-conditioning MLPs, the router, the experts) rounded to F16, the embedding
    /// (whose products stay in f32 kernels) to BF16.
    pub fn round_matrices_for_f16_mode(&mut self) {
        self.round_matrices_split(|x| half::f16::from_f32(x).to_f32(), |x| half::bf16::from_f32(x).to_f32());
    }

    /// Applies `round` to every element of every matrix (the tensors the GPU may store in a
    /// 16-bit format), in parallel.
    fn round_matrices(&mut self, round: impl Fn(f32) -> f32 + Sync) {
        self.round_matrices_split(&round, &round);
    }

    /// `embedding` on the embedding, `rest` on every other matrix.
    fn round_matrices_split(&mut self, rest: impl Fn(f32) -> f32 + Sync, embedding: impl Fn(f32) -> f32 + Sync) {
        use rayon::prelude::*;
        let each = |v: &mut Vec<f32>, f: &(dyn Fn(f32) -> f32 + Sync)| v.par_iter_mut().for_each(|x| *x = f(*x));
        each(&mut self.embed.data, &embedding);
        let sc = &mut self.self_conditioning;
        for m in [&mut sc.gate, &mut sc.up, &mut sc.down] {
            each(&mut m.data, &rest);
        }
        for l in &mut self.layers {
            for m in [&mut l.q_proj, &mut l.o_proj, &mut l.mlp_gate, &mut l.mlp_up, &mut l.mlp_down, &mut l.router_proj] {
                each(&mut m.data, &rest);
            }
            each(&mut l.k_proj.data, &rest);
            if let Some(v) = &mut l.v_proj {
                each(&mut v.data, &rest);
            }
            each(&mut l.experts.gate_up, &rest);
            each(&mut l.experts.down, &rest);
        }
    }

    /// The tensors outside the layers (embedding, final norm, self-conditioning), with `layers`
    /// empty: a loader that streams the layers one by one ([`LayerWeights::load`]) starts here.
    pub fn build_shared(src: &(impl TensorSource + ?Sized), cfg: &TextConfig) -> Result<Self> {
        let n = SharedNames::new(cfg);
        let get = |t: &Named| src.get(&t.name, &t.shape);
        Ok(Weights {
            embed: matrix(src, &n.embed)?,
            final_norm: get(&n.final_norm)?,
            self_conditioning: SelfConditioningWeights {
                pre_norm: get(&n.sc_pre_norm)?,
                gate: matrix(src, &n.sc_gate)?,
                up: matrix(src, &n.sc_up)?,
                down: matrix(src, &n.sc_down)?,
            },
            layers: Vec::with_capacity(cfg.num_layers()),
        })
    }
}

/// A rank-2 tensor as a [`Matrix`].
fn matrix(src: &(impl TensorSource + ?Sized), t: &Named) -> Result<Matrix> {
    Ok(Matrix::new(t.shape[0], t.shape[1], src.get(&t.name, &t.shape)?))
}

impl LayerWeights {
    /// Layer `i`'s tensors (and the encoder's layer scalar), checked against `cfg`.
    pub fn load(src: &(impl TensorSource + ?Sized), cfg: &TextConfig, i: usize) -> Result<Self> {
        load_layer(src, cfg, i)
    }
}

fn load_layer(src: &(impl TensorSource + ?Sized), cfg: &TextConfig, i: usize) -> Result<LayerWeights> {
    let n = LayerNames::new(cfg, i);
    let get = |t: &Named| src.get(&t.name, &t.shape);
    let mat = |t: &Named| matrix(src, t);
    let [input_layernorm, post_attention_layernorm, pre_ff, post_ff_1, pre_ff_2, post_ff_2, post_ff] = n.norms.each_ref().map(get);
    let (e, ie, h) = (cfg.num_experts, cfg.moe_intermediate_size, cfg.hidden_size);
    Ok(LayerWeights {
        kind: n.kind,
        input_layernorm: input_layernorm?,
        post_attention_layernorm: post_attention_layernorm?,
        pre_feedforward_layernorm: pre_ff?,
        post_feedforward_layernorm_1: post_ff_1?,
        pre_feedforward_layernorm_2: pre_ff_2?,
        post_feedforward_layernorm_2: post_ff_2?,
        post_feedforward_layernorm: post_ff?,
        q_proj: mat(&n.q_proj)?,
        k_proj: mat(&n.k_proj)?,
        v_proj: n.v_proj.as_ref().map(mat).transpose()?,
        o_proj: mat(&n.o_proj)?,
        q_norm: get(&n.q_norm)?,
        k_norm: get(&n.k_norm)?,
        mlp_gate: mat(&n.mlp_gate)?,
        mlp_up: mat(&n.mlp_up)?,
        mlp_down: mat(&n.mlp_down)?,
        router_proj: mat(&n.router_proj)?,
        router_scale: get(&n.router_scale)?,
        per_expert_scale: get(&n.per_expert_scale)?,
        experts: ExpertWeights {
            num_experts: e,
            intermediate: ie,
            hidden: h,
            gate_up: get(&n.experts_gate_up)?,
            down: get(&n.experts_down)?,
        },
        encoder_scalar: get(&n.encoder_scalar)?[0],
        decoder_scalar: get(&n.decoder_scalar)?[0],
    })
}

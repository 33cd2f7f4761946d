//! The HF names and shapes of the text model's tensors, in one place (spec §2.2–2.3).
//!
//! Mirrors the parameter tree of `DiffusionGemmaForBlockDiffusion`: text weights under
//! `model.decoder.*` (shared by encoder and decoder), the encoder's own `layer_scalar` under
//! `model.encoder.language_model.layers.N`. Every reader (the f32 loader, the GPU upload, the
//! manifest) asks these structs instead of spelling names itself.

use crate::config::{LayerKind, TextConfig};

pub(crate) const D: &str = "model.decoder";
pub(crate) const ENC: &str = "model.encoder.language_model";

/// The seven `[H]` norms of a layer, in the order [`LayerNames::norms`] lists them.
pub(crate) const NORMS: [&str; 7] = [
    "input_layernorm",
    "post_attention_layernorm",
    "pre_feedforward_layernorm",
    "post_feedforward_layernorm_1",
    "pre_feedforward_layernorm_2",
    "post_feedforward_layernorm_2",
    "post_feedforward_layernorm",
];

/// A tensor's HF name and expected shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Named {
    pub name: String,
    pub shape: Vec<usize>,
}

fn named(name: String, shape: &[usize]) -> Named {
    Named { name, shape: shape.to_vec() }
}

/// The tensors outside the layers.
#[derive(Debug, Clone)]
pub struct SharedNames {
    /// `[V, H]`, also the tied lm_head.
    pub embed: Named,
    pub final_norm: Named,
    pub sc_pre_norm: Named,
    pub sc_gate: Named,
    pub sc_up: Named,
    pub sc_down: Named,
}

impl SharedNames {
    pub fn new(cfg: &TextConfig) -> Self {
        let (h, v, i_d) = (cfg.hidden_size, cfg.vocab_size, cfg.intermediate_size);
        SharedNames {
            embed: named(format!("{D}.embed_tokens.weight"), &[v, h]),
            final_norm: named(format!("{D}.norm.weight"), &[h]),
            sc_pre_norm: named(format!("{D}.self_conditioning.pre_norm.weight"), &[h]),
            sc_gate: named(format!("{D}.self_conditioning.gate_proj.weight"), &[i_d, h]),
            sc_up: named(format!("{D}.self_conditioning.up_proj.weight"), &[i_d, h]),
            sc_down: named(format!("{D}.self_conditioning.down_proj.weight"), &[h, i_d]),
        }
    }

    pub fn all(&self) -> Vec<&Named> {
        vec![&self.embed, &self.final_norm, &self.sc_pre_norm, &self.sc_gate, &self.sc_up, &self.sc_down]
    }
}

/// Layer `i`'s tensors (`DiffusionGemma{Encoder,Decoder}TextLayer`) and both layer scalars.
#[derive(Debug, Clone)]
pub struct LayerNames {
    pub kind: LayerKind,
    /// In [`NORMS`]' order: input, post-attention, pre-FF, post-FF 1, pre-FF 2, post-FF 2, post-FF.
    pub norms: [Named; 7],
    pub q_proj: Named,
    pub k_proj: Named,
    /// Sliding layers only (a full layer's V is its raw K projection).
    pub v_proj: Option<Named>,
    pub o_proj: Named,
    pub q_norm: Named,
    pub k_norm: Named,
    pub mlp_gate: Named,
    pub mlp_up: Named,
    pub mlp_down: Named,
    pub router_proj: Named,
    pub router_scale: Named,
    pub per_expert_scale: Named,
    /// `[E, 2·I_e, H]`.
    pub experts_gate_up: Named,
    /// `[E, H, I_e]`.
    pub experts_down: Named,
    /// `model.decoder.layers.i.layer_scalar`.
    pub decoder_scalar: Named,
    /// `model.encoder.language_model.layers.i.layer_scalar`.
    pub encoder_scalar: Named,
}

impl LayerNames {
    pub fn new(cfg: &TextConfig, i: usize) -> Self {
        let spec = &cfg.layers[i];
        let (h, i_d, e, ie) = (cfg.hidden_size, cfg.intermediate_size, cfg.num_experts, cfg.moe_intermediate_size);
        let (q, kv) = (cfg.num_attention_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim);
        let p = format!("{D}.layers.{i}");
        let n = |name: &str, shape: &[usize]| named(format!("{p}.{name}"), shape);
        LayerNames {
            kind: spec.kind,
            norms: NORMS.map(|norm| n(&format!("{norm}.weight"), &[h])),
            q_proj: n("self_attn.q_proj.weight", &[q, h]),
            k_proj: n("self_attn.k_proj.weight", &[kv, h]),
            v_proj: spec.has_v_proj().then(|| n("self_attn.v_proj.weight", &[kv, h])),
            o_proj: n("self_attn.o_proj.weight", &[h, q]),
            q_norm: n("self_attn.q_norm.weight", &[spec.head_dim]),
            k_norm: n("self_attn.k_norm.weight", &[spec.head_dim]),
            mlp_gate: n("mlp.gate_proj.weight", &[i_d, h]),
            mlp_up: n("mlp.up_proj.weight", &[i_d, h]),
            mlp_down: n("mlp.down_proj.weight", &[h, i_d]),
            router_proj: n("router.proj.weight", &[e, h]),
            router_scale: n("router.scale", &[h]),
            per_expert_scale: n("router.per_expert_scale", &[e]),
            experts_gate_up: n("experts.gate_up_proj", &[e, 2 * ie, h]),
            experts_down: n("experts.down_proj", &[e, h, ie]),
            decoder_scalar: n("layer_scalar", &[1]),
            encoder_scalar: named(format!("{ENC}.layers.{i}.layer_scalar"), &[1]),
        }
    }

    pub fn all(&self) -> Vec<&Named> {
        let mut out: Vec<&Named> = self.norms.iter().collect();
        out.extend([&self.q_proj, &self.k_proj]);
        out.extend(&self.v_proj);
        out.extend([
            &self.o_proj,
            &self.q_norm,
            &self.k_norm,
            &self.mlp_gate,
            &self.mlp_up,
            &self.mlp_down,
            &self.router_proj,
            &self.router_scale,
            &self.per_expert_scale,
            &self.experts_gate_up,
            &self.experts_down,
            &self.decoder_scalar,
            &self.encoder_scalar,
        ]);
        out
    }
}

/// Every text tensor the model needs: HF name and expected shape.
pub fn tensor_manifest(cfg: &TextConfig) -> Vec<(String, Vec<usize>)> {
    let shared = SharedNames::new(cfg);
    let layers: Vec<LayerNames> = (0..cfg.num_layers()).map(|i| LayerNames::new(cfg, i)).collect();
    shared.all().into_iter().chain(layers.iter().flat_map(LayerNames::all)).map(|n| (n.name.clone(), n.shape.clone())).collect()
}

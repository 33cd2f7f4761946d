//! One transformer layer, shared by encoder and decoder (`DiffusionGemmaEncoderTextLayer`,
//! `DiffusionGemmaDecoderTextLayer`, their attention modules and `DiffusionGemmaText4MLP`).
//!
//! ```text
//! a = Attention(input_layernorm(h));            h = h + post_attention_layernorm(a)
//! d = post_ff_1(MLP(pre_ff(h)));                m = post_ff_2(Experts(pre_ff_2(h), Router(h)))
//! h = (h + post_feedforward_layernorm(d + m)) · layer_scalar
//! ```

use dg_model::{LayerKind, LayerSpec, LayerWeights, TextConfig};

use crate::attention::{AttnShape, Mask, attention};
use crate::cache::LayerCache;
use crate::int8::ActivationQuant;
use crate::linalg::linear;
use crate::moe::{Routing, experts_in, route_logits, router_input, router_logits};
use crate::ops::{gelu_glu, rms_norm_into, rms_norm_rows};
use crate::rope::RopeTable;

/// Encoder (writes K/V, causal but for the image `spans`, see [`Mask::Causal`]) or decoder (reads
/// the cache, bidirectional) pass of a layer.
#[derive(Debug)]
pub enum Pass<'a> {
    Encode(&'a mut LayerCache, &'a [std::ops::Range<usize>]),
    Decode(&'a LayerCache),
}

/// Projected, normed and rotated attention inputs of the new tokens.
struct Qkv {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
}

fn project_qkv(x: &[f32], t: usize, w: &LayerWeights, spec: &LayerSpec, cfg: &TextConfig, rope: &RopeTable) -> Qkv {
    let (heads, d, kv) = (cfg.num_attention_heads, spec.head_dim, spec.num_kv_heads);
    let eps = cfg.rms_norm_eps;
    let mut q = vec![0f32; t * heads * d];
    linear(&mut q, x, t, &w.q_proj);
    rms_norm_rows(&mut q, d, Some(&w.q_norm), eps);
    rope.apply(&mut q, heads);
    let mut k = vec![0f32; t * kv * d];
    linear(&mut k, x, t, &w.k_proj);
    // Full layers: V is the raw K projection (before k_norm and RoPE).
    let mut v = match &w.v_proj {
        Some(v_proj) => {
            let mut v = vec![0f32; t * kv * d];
            linear(&mut v, x, t, v_proj);
            v
        }
        None => k.clone(),
    };
    rms_norm_rows(&mut k, d, Some(&w.k_norm), eps);
    rope.apply(&mut k, kv);
    rms_norm_rows(&mut v, d, None, eps);
    Qkv { q, k, v }
}

/// What a layer's router saw and chose: its input `[T, H]` (`moe::router_input`), logits `[T, E]`
/// and routing.
#[derive(Debug, Clone)]
pub struct RouterTrace {
    pub input: Vec<f32>,
    pub logits: Vec<f32>,
    pub routing: Routing,
}

/// Runs layer `w` over `h: [T, H]` (tokens at positions `start..start+T`) in place.
/// `attention_only` stops after the K/V are written (the encoder's last layer: the rest of it
/// feeds only the unused final hidden state). The experts are `chosen` (`[T, k]` expert ids,
/// another router's choice; their weights from this router's probabilities,
/// `moe::route_logits`) where given, else this router's; returns what the router saw and chose
/// (`None` with `attention_only`). The experts take their activations as `quant` says.
#[allow(clippy::too_many_arguments)]
pub fn layer_forward(
    h: &mut [f32],
    t: usize,
    start: usize,
    w: &LayerWeights,
    spec: &LayerSpec,
    cfg: &TextConfig,
    pass: Pass<'_>,
    attention_only: bool,
    chosen: Option<&[usize]>,
    quant: ActivationQuant,
) -> Option<RouterTrace> {
    let hid = cfg.hidden_size;
    let eps = cfg.rms_norm_eps;
    let (heads, d, kv_heads) = (cfg.num_attention_heads, spec.head_dim, spec.num_kv_heads);
    let rope = RopeTable::new(spec, start, t);

    let mut x = vec![0f32; t * hid];
    rms_norm_into(&mut x, h, hid, Some(&w.input_layernorm), eps);
    let Qkv { q, k, v } = project_qkv(&x, t, w, spec, cfg, &rope);

    // Keys and values: [visible cache | new tokens].
    let cache: &LayerCache = match &pass {
        Pass::Encode(c, _) => c,
        Pass::Decode(c) => c,
    };
    let keys = [cache.keys.as_slice(), &k].concat();
    let values = [cache.values.as_slice(), &v].concat();
    let (mask, scalar) = match &pass {
        Pass::Encode(c, spans) => {
            let window = (spec.kind == LayerKind::Sliding).then_some(cfg.sliding_window);
            (Mask::Causal { key_start: c.start, query_start: start, window, spans }, w.encoder_scalar)
        }
        Pass::Decode(_) => (Mask::None, w.decoder_scalar),
    };
    let shape = AttnShape { queries: t, keys: cache.len() + t, heads, kv_heads, head_dim: d };
    if let Pass::Encode(c, _) = pass {
        c.append(&k, &v);
    }
    if attention_only {
        return None;
    }
    let mut attn = vec![0f32; t * heads * d];
    attention(&mut attn, &q, &keys, &values, shape, mask);
    let mut a = vec![0f32; t * hid];
    linear(&mut a, &attn, t, &w.o_proj);
    rms_norm_rows(&mut a, hid, Some(&w.post_attention_layernorm), eps);
    h.iter_mut().zip(&a).for_each(|(h, a)| *h += a);

    // Dense MLP and MoE, both reading the post-attention stream h.
    rms_norm_into(&mut x, h, hid, Some(&w.pre_feedforward_layernorm), eps);
    let inter = cfg.intermediate_size;
    let mut gate = vec![0f32; t * inter];
    let mut up = vec![0f32; t * inter];
    linear(&mut gate, &x, t, &w.mlp_gate);
    linear(&mut up, &x, t, &w.mlp_up);
    gelu_glu(&mut gate, &up);
    let mut dense = vec![0f32; t * hid];
    linear(&mut dense, &gate, t, &w.mlp_down);
    rms_norm_rows(&mut dense, hid, Some(&w.post_feedforward_layernorm_1), eps);

    let input = router_input(h, t, w, cfg);
    let logits = router_logits(&input, t, w, cfg);
    let routing = route_logits(&logits, t, w, cfg, chosen);
    rms_norm_into(&mut x, h, hid, Some(&w.pre_feedforward_layernorm_2), eps);
    let mut moe = vec![0f32; t * hid];
    experts_in(&mut moe, &x, t, &routing, w, quant);
    rms_norm_rows(&mut moe, hid, Some(&w.post_feedforward_layernorm_2), eps);

    dense.iter_mut().zip(&moe).for_each(|(d, m)| *d += m);
    rms_norm_rows(&mut dense, hid, Some(&w.post_feedforward_layernorm), eps);
    h.iter_mut().zip(&dense).for_each(|(h, d)| *h = (*h + d) * scalar);
    Some(RouterTrace { input, logits, routing })
}

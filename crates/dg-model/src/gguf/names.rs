//! The map between dg's HF tensor names (`crate::names`) and the names llama.cpp's DiffusionGemma
//! converter writes into a GGUF file.
//!
//! Mirrors `DiffusionGemmaModel` (llama.cpp `conversion/diffusion_gemma.py`, registered for
//! `DiffusionGemmaForBlockDiffusion`), which rewrites `model.decoder.<x>` to `model.<x>` and hands
//! the backbone to `Gemma4Model` (`conversion/gemma.py`) and gguf-py's Gemma 4 tensor map
//! (`gguf-py/gguf/tensor_mapping.py`, `MODEL_ARCH.GEMMA4`):
//!
//! | HF (`model.decoder.` …) | GGUF | converter line |
//! |---|---|---|
//! | `embed_tokens.weight` | `token_embd.weight` | `TOKEN_EMBD` |
//! | `norm.weight` | `output_norm.weight` | `OUTPUT_NORM` |
//! | `self_conditioning.{pre_norm,gate_proj,up_proj,down_proj}.weight` | `self_cond_{pre_norm,gate,up,down}.weight` | `sc_map` → `SC_PRE_NORM`, `SC_GATE`, `SC_UP`, `SC_DOWN` |
//! | `layers.N.input_layernorm.weight` | `blk.N.attn_norm.weight` | `ATTN_NORM` |
//! | `layers.N.post_attention_layernorm.weight` | `blk.N.post_attention_norm.weight` | `ATTN_POST_NORM` |
//! | `layers.N.pre_feedforward_layernorm.weight` | `blk.N.ffn_norm.weight` | `FFN_PRE_NORM` |
//! | `layers.N.post_feedforward_layernorm_1.weight` | `blk.N.post_ffw_norm_1.weight` | `FFN_POST_NORM_1` |
//! | `layers.N.pre_feedforward_layernorm_2.weight` | `blk.N.pre_ffw_norm_2.weight` | `FFN_PRE_NORM_2` |
//! | `layers.N.post_feedforward_layernorm_2.weight` | `blk.N.post_ffw_norm_2.weight` | `FFN_POST_NORM_2` |
//! | `layers.N.post_feedforward_layernorm.weight` | `blk.N.post_ffw_norm.weight` | `FFN_POST_NORM` |
//! | `layers.N.self_attn.{q,k,v,o}_proj.weight` | `blk.N.attn_{q,k,v,output}.weight` | `ATTN_Q`, `ATTN_K`, `ATTN_V`, `ATTN_OUT` |
//! | `layers.N.self_attn.{q,k}_norm.weight` | `blk.N.attn_{q,k}_norm.weight` | `ATTN_Q_NORM`, `ATTN_K_NORM` |
//! | `layers.N.mlp.{gate,up,down}_proj.weight` | `blk.N.ffn_{gate,up,down}.weight` | `FFN_GATE`, `FFN_UP`, `FFN_DOWN` |
//! | `layers.N.router.proj.weight` | `blk.N.ffn_gate_inp.weight` | `FFN_GATE_INP` |
//! | `layers.N.router.scale` | `blk.N.ffn_gate_inp.scale` | `name.endswith("router.scale")` → `FFN_GATE_INP, ".scale"` |
//! | `layers.N.router.per_expert_scale` | `blk.N.ffn_down_exps.scale` | `".per_expert_scale" in name` → `FFN_DOWN_EXP, ".scale"` |
//! | `layers.N.experts.gate_up_proj` | `blk.N.ffn_gate_up_exps.weight` | `".experts."` gets `.weight`, → `FFN_GATE_UP_EXP` (fused, not split) |
//! | `layers.N.experts.down_proj` | `blk.N.ffn_down_exps.weight` | → `FFN_DOWN_EXP` |
//! | `layers.N.layer_scalar` | `blk.N.layer_output_scale.weight` | `layer_scalar` gets `.weight`, → `LAYER_OUT_SCALE` |
//! | `model.encoder.language_model.layers.N.layer_scalar` | `blk.N.enc_layer_output_scale.weight` | `ENC_LAYER_OUT_SCALE` |
//!
//! Values: the converter changes none of these tensors, so reading undoes nothing.
//! - Norm weights are written as HF stores them: `Gemma4Model.norm_shift` returns 0, so the
//!   `+ 1` of Gemma 3 (`Gemma3Model.modify_tensors`: `data_torch + f_shift`) is not applied.
//! - No permutes: Gemma's RoPE is the NeoX (half-split) layout, the one llama.cpp uses for it.
//! - The experts stay one 3-D tensor each, `[E, 2·I_e, H]` and `[E, H, I_e]` (gate rows then up
//!   rows, as HF fuses them); GGUF stores the dims reversed (`ne = [H, 2·I_e, E]`).
//! - `Gemma3Model.modify_tensors` cuts `embed_tokens` to the tokenizer's length
//!   (`data_torch[:n_vocab_real]`); a GGUF whose `token_embd` has fewer rows than `vocab_size` says
//!   so in the shape error (the geometry read from GGUF metadata takes its `vocab_size`).
//!
//! Ignorable (written by the converter, not read by dg): `rope_freqs.weight`, which
//! `Gemma4Model.generate_extra_tensors` writes to express the proportional RoPE of the full layers
//! (dg reads its partial rotary factor from it, see `gguf::config`). The converter drops the vision
//! tower (`"vision" in name` → `return`) and the encoder's copies of the tied weights.

use crate::names::{D, ENC, NORMS};

/// The GGUF tensors outside the layers that dg reads, by HF suffix under `model.decoder.`.
const SHARED: [(&str, &str); 6] = [
    ("embed_tokens.weight", "token_embd.weight"),
    ("norm.weight", "output_norm.weight"),
    ("self_conditioning.pre_norm.weight", "self_cond_pre_norm.weight"),
    ("self_conditioning.gate_proj.weight", "self_cond_gate.weight"),
    ("self_conditioning.up_proj.weight", "self_cond_up.weight"),
    ("self_conditioning.down_proj.weight", "self_cond_down.weight"),
];

/// GGUF layer norms in the order of [`NORMS`].
const LAYER_NORMS: [&str; 7] =
    ["attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm_1", "pre_ffw_norm_2", "post_ffw_norm_2", "post_ffw_norm"];

/// A layer tensor's HF suffix (after `model.decoder.layers.N.`) and GGUF suffix (after `blk.N.`).
const LAYER: [(&str, &str); 15] = [
    ("self_attn.q_proj.weight", "attn_q.weight"),
    ("self_attn.k_proj.weight", "attn_k.weight"),
    ("self_attn.v_proj.weight", "attn_v.weight"),
    ("self_attn.o_proj.weight", "attn_output.weight"),
    ("self_attn.q_norm.weight", "attn_q_norm.weight"),
    ("self_attn.k_norm.weight", "attn_k_norm.weight"),
    ("mlp.gate_proj.weight", "ffn_gate.weight"),
    ("mlp.up_proj.weight", "ffn_up.weight"),
    ("mlp.down_proj.weight", "ffn_down.weight"),
    ("router.proj.weight", "ffn_gate_inp.weight"),
    ("router.scale", "ffn_gate_inp.scale"),
    ("router.per_expert_scale", "ffn_down_exps.scale"),
    ("experts.gate_up_proj", "ffn_gate_up_exps.weight"),
    ("experts.down_proj", "ffn_down_exps.weight"),
    ("layer_scalar", "layer_output_scale.weight"),
];

/// The encoder's own layer scalar (`ENC_LAYER_OUT_SCALE`).
const ENC_SCALAR: &str = "enc_layer_output_scale.weight";

/// GGUF tensors the converter writes that dg does not read.
pub const IGNORABLE: [&str; 1] = ["rope_freqs.weight"];

/// The GGUF name of the tensor HF names `hf`; `None` for names outside the DiffusionGemma text model.
pub fn to_gguf(hf: &str) -> Option<String> {
    if let Some(rest) = hf.strip_prefix(ENC).and_then(|r| r.strip_prefix(".layers.")) {
        let (i, rest) = split_layer(rest)?;
        return (rest == "layer_scalar").then(|| format!("blk.{i}.{ENC_SCALAR}"));
    }
    let rest = hf.strip_prefix(D)?.strip_prefix('.')?;
    if let Some(rest) = rest.strip_prefix("layers.") {
        let (i, rest) = split_layer(rest)?;
        let suffix = match rest.strip_suffix(".weight").and_then(|n| NORMS.iter().position(|&m| m == n)) {
            Some(k) => format!("{}.weight", LAYER_NORMS[k]),
            None => LAYER.iter().find(|(h, _)| *h == rest)?.1.to_string(),
        };
        return Some(format!("blk.{i}.{suffix}"));
    }
    SHARED.iter().find(|(h, _)| *h == rest).map(|(_, g)| g.to_string())
}

/// The HF name of GGUF tensor `gguf`; `None` for tensors dg does not read.
pub fn to_hf(gguf: &str) -> Option<String> {
    if let Some(rest) = gguf.strip_prefix("blk.") {
        let (i, rest) = split_layer(rest)?;
        if rest == ENC_SCALAR {
            return Some(format!("{ENC}.layers.{i}.layer_scalar"));
        }
        let suffix = match rest.strip_suffix(".weight").and_then(|n| LAYER_NORMS.iter().position(|&m| m == n)) {
            Some(k) => format!("{}.weight", NORMS[k]),
            None => LAYER.iter().find(|(_, g)| *g == rest)?.0.to_string(),
        };
        return Some(format!("{D}.layers.{i}.{suffix}"));
    }
    SHARED.iter().find(|(_, g)| *g == gguf).map(|(h, _)| format!("{D}.{h}"))
}

/// `"N.rest"` as `(N, rest)`, N a plain decimal layer index (no sign, no leading zeros).
fn split_layer(s: &str) -> Option<(usize, &str)> {
    let (i, rest) = s.split_once('.')?;
    if i.is_empty() || !i.bytes().all(|b| b.is_ascii_digit()) || (i.len() > 1 && i.starts_with('0')) {
        return None;
    }
    Some((i.parse().ok()?, rest))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ModelConfig;
    use crate::names::tensor_manifest;

    #[test]
    fn every_manifest_name_maps_both_ways() {
        let json = r#"{"model_type":"diffusion_gemma","text_config":{"num_hidden_layers":12,"num_experts":4,
          "top_k_experts":2,"moe_intermediate_size":8,"hidden_size":16,"intermediate_size":8,"vocab_size":10,
          "head_dim":4,"global_head_dim":8}}"#;
        let cfg = ModelConfig::from_json_str(json, std::path::Path::new("config.json")).unwrap();
        let mut seen = std::collections::HashSet::new();
        for (hf, _) in tensor_manifest(&cfg.text) {
            let g = to_gguf(&hf).unwrap_or_else(|| panic!("{hf} has no GGUF name"));
            assert!(seen.insert(g.clone()), "{g} named twice");
            assert_eq!(to_hf(&g).as_deref(), Some(hf.as_str()), "{g}");
        }
        assert_eq!(to_gguf("model.decoder.layers.11.experts.gate_up_proj").unwrap(), "blk.11.ffn_gate_up_exps.weight");
        assert_eq!(to_gguf("model.decoder.layers.3.pre_feedforward_layernorm.weight").unwrap(), "blk.3.ffn_norm.weight");
        assert_eq!(to_gguf("model.encoder.language_model.layers.0.layer_scalar").unwrap(), "blk.0.enc_layer_output_scale.weight");
    }

    #[test]
    fn names_outside_the_text_model_map_to_nothing() {
        for g in [
            "rope_freqs.weight",
            "output.weight",
            "blk.x.attn_q.weight",
            "blk.01.attn_q.weight",
            "blk.1.attn_qkv.weight",
            "v.blk.0.attn_q.weight",
        ] {
            assert_eq!(to_hf(g), None, "{g}");
        }
        for h in ["model.encoder.vision_tower.x", "model.encoder.language_model.layers.0.self_attn.q_proj.weight", "lm_head.weight"] {
            assert_eq!(to_gguf(h), None, "{h}");
        }
    }
}

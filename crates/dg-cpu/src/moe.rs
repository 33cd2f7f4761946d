//! The mixture of experts: `DiffusionGemmaTextRouter` and `DiffusionGemmaTextExperts`.
//!
//! Router (on the un-normalised stream `h`): weightless RMSNorm, `⊙ scale · H^−½`, projection,
//! f32 softmax over all experts, top-k, renormalise, then `× per_expert_scale`. Experts (on
//! `pre_feedforward_layernorm_2(h)`): per expert `down(gelu(gate(u)) ⊙ up(u)) · w`, accumulated per
//! token in ascending expert order like the reference's `index_add_` loop.

use dg_model::{LayerWeights, TextConfig};
use rayon::prelude::*;

use crate::int8::{ActivationQuant, fake_quantize_rows};
use crate::linalg::{Threads, linear, linear_raw};
use crate::ops::{gelu_glu, rms_norm_into, softmax_in_place};

/// Top-k routing of every token: `[T, K]` expert ids and final weights.
#[derive(Debug, Clone, PartialEq)]
pub struct Routing {
    pub top_k: usize,
    pub experts: Vec<usize>,
    pub weights: Vec<f32>,
}

/// The router of one layer over `h: [T, H]`.
pub fn route(h: &[f32], tokens: usize, w: &LayerWeights, cfg: &TextConfig) -> Routing {
    let logits = router_logits(&router_input(h, tokens, w, cfg), tokens, w, cfg);
    route_logits(&logits, tokens, w, cfg, None)
}

/// The router's input over `h: [T, H]`: weightless RMSNorm, `⊙ scale · H^−½`.
pub fn router_input(h: &[f32], tokens: usize, w: &LayerWeights, cfg: &TextConfig) -> Vec<f32> {
    let hid = cfg.hidden_size;
    let mut r = vec![0f32; tokens * hid];
    rms_norm_into(&mut r, h, hid, None, cfg.rms_norm_eps);
    let root = (hid as f64).powf(-0.5) as f32;
    for row in r.chunks_exact_mut(hid) {
        row.iter_mut().zip(&w.router_scale).for_each(|(x, &s)| *x = (*x * s) * root);
    }
    r
}

/// The router's logits `[T, E]` on its input (`router_input`).
pub fn router_logits(input: &[f32], tokens: usize, w: &LayerWeights, cfg: &TextConfig) -> Vec<f32> {
    let mut logits = vec![0f32; tokens * cfg.num_experts];
    linear(&mut logits, input, tokens, &w.router_proj);
    logits
}

/// Top-k routing from the router's logits: f32 softmax over all experts, the `k` most probable
/// (ties to the lower index) or, with `chosen`, those `[T, k]` experts (another router's choice),
/// renormalised over the chosen, then `× per_expert_scale`.
pub fn route_logits(logits: &[f32], tokens: usize, w: &LayerWeights, cfg: &TextConfig, chosen: Option<&[usize]>) -> Routing {
    let (e, k) = (cfg.num_experts, cfg.top_k_experts);
    let mut probs = logits.to_vec();
    let mut experts = Vec::with_capacity(tokens * k);
    let mut weights = Vec::with_capacity(tokens * k);
    let mut order: Vec<usize> = Vec::with_capacity(e);
    for (t, row) in probs.chunks_exact_mut(e).enumerate() {
        softmax_in_place(row);
        order.clear();
        match chosen {
            Some(chosen) => order.extend_from_slice(&chosen[t * k..(t + 1) * k]),
            None => {
                order.extend(0..e);
                // Descending probability; ties keep the lower expert index first.
                order.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
            }
        }
        let top = &order[..k];
        let sum: f32 = top.iter().map(|&i| row[i]).sum();
        for &i in top {
            experts.push(i);
            weights.push((row[i] / sum) * w.per_expert_scale[i]);
        }
    }
    Routing { top_k: k, experts, weights }
}

/// `out[T, H] = Σ_k w_k · expert_{idx_k}(u)` for `u: [T, H]`.
pub fn experts(out: &mut [f32], u: &[f32], tokens: usize, routing: &Routing, w: &LayerWeights) {
    experts_in(out, u, tokens, routing, w, ActivationQuant::F32);
}

/// [`experts`] with the products' activations (`u` for gate/up, the GLU's output for down) taken
/// as `quant` says ([`ActivationQuant::Int8`]: rounded to their int8 blocks).
pub fn experts_in(out: &mut [f32], u: &[f32], tokens: usize, routing: &Routing, w: &LayerWeights, quant: ActivationQuant) {
    let int8 = quant == ActivationQuant::Int8;
    let ew = &w.experts;
    let (hid, inter) = (ew.hidden, ew.intermediate);
    // Token slots per expert in the reference's order (top-k slot major, then token).
    let mut assigned: Vec<Vec<(usize, f32)>> = vec![Vec::new(); ew.num_experts];
    for slot in 0..routing.top_k {
        for t in 0..tokens {
            let i = t * routing.top_k + slot;
            assigned[routing.experts[i]].push((t, routing.weights[i]));
        }
    }
    let results: Vec<Vec<f32>> = assigned
        .par_iter()
        .enumerate()
        .map(|(e, slots)| {
            if slots.is_empty() {
                return Vec::new();
            }
            let n = slots.len();
            let mut x = Vec::with_capacity(n * hid);
            for &(t, _) in slots {
                x.extend_from_slice(&u[t * hid..(t + 1) * hid]);
            }
            if int8 {
                fake_quantize_rows(&mut x, hid);
            }
            let mut gate_up = vec![0f32; n * 2 * inter];
            linear_raw(&mut gate_up, &x, n, ew.gate_up(e), 2 * inter, hid, Threads::One);
            let mut act = vec![0f32; n * inter];
            for (row, a) in gate_up.chunks_exact(2 * inter).zip(act.chunks_exact_mut(inter)) {
                a.copy_from_slice(&row[..inter]);
                gelu_glu(a, &row[inter..]);
            }
            if int8 {
                fake_quantize_rows(&mut act, inter);
            }
            let mut y = vec![0f32; n * hid];
            linear_raw(&mut y, &act, n, ew.down(e), hid, inter, Threads::One);
            for (row, &(_, weight)) in y.chunks_exact_mut(hid).zip(slots) {
                row.iter_mut().for_each(|v| *v *= weight);
            }
            y
        })
        .collect();
    out.fill(0.0);
    for (slots, y) in assigned.iter().zip(&results) {
        for (&(t, _), row) in slots.iter().zip(y.chunks_exact(hid)) {
            out[t * hid..(t + 1) * hid].iter_mut().zip(row).for_each(|(o, &v)| *o += v);
        }
    }
}

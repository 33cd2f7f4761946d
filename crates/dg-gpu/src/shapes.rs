//! The shapes the planner plans for and the forward lays out, shared by both so that the
//! planner stays a leaf (it imports these, not the arena or the ops): the KV cache's key padding,
//! the attention products' parameters in the forward's layouts (HF's `eager_attention_forward`:
//! scores `q · Kᵀ`, then probabilities `· V`), and how a weight matrix is ordered in its buffer.

use dg_kernels::gemm::GemmParams;

/// The decoder pads its visible cached keys to a multiple of this many columns in a scores row
/// (`forward.rs`): the products then read up to `KEY_PAD − 1` dead cache rows between the visible
/// ones and the canvas's, masked to probability 0 (zeros, or K/V rows an earlier canvas wrote:
/// finite either way, so they add exact zeros to the values).
pub const KEY_PAD: usize = 32;

/// How a matrix's elements are ordered in its buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatrixLayout {
    /// PyTorch's row-major `[out, in]` (per expert for the experts).
    RowMajor,
    /// F16 weights in K panels: expert weights `[experts, in / PANEL, out, PANEL]`, the layout the
    /// tensor-core grouped GEMM streams (`dg_kernels::coop_grouped_gemm`); a dense projection
    /// `[in / PANEL, out, PANEL]` (the stacked K and V projections each on its own), which the
    /// tensor-core GEMM streams as `dg_kernels::coop_gemm::BLayout::NkPanels`. Quantized weights
    /// in panels one ggml block wide (`dg_gpu::pack`: block p of every row together). Only the
    /// tensor cores read it: the upload panels a matrix only where they take its products.
    KPanels,
}

/// Attention's scores: q `[t, heads, d]` · K_{h/g}ᵀ over cache rows `[s, kv_heads, d]` into
/// `[heads, t, s]` (query head `h` reads K/V head `h / (heads / kv_heads)`), alpha 1; the caller
/// adds the offsets and the causal bound.
pub fn attention_scores_params(t: usize, s: usize, d: usize, heads: usize, kv_heads: usize) -> GemmParams {
    let (t, s, d, heads, kv_heads) = (t as u32, s as u32, d as u32, heads as u32, kv_heads as u32);
    GemmParams {
        batch: heads,
        a_rs: heads * d,
        a_batch: d,
        b_rs: 1,
        b_cs: kv_heads * d,
        b_batch: d,
        b_batch_div: heads / kv_heads,
        c_rs: s,
        c_batch: t * s,
        ..GemmParams::new(t, s, d)
    }
}

/// Attention's values: probabilities `[heads, t, s]` · V_{h/g} `[s, kv_heads, d]` into
/// `[t, heads, d]`, alpha 1; the caller adds the offsets and the causal bound.
pub fn attention_values_params(t: usize, s: usize, d: usize, heads: usize, kv_heads: usize) -> GemmParams {
    let (t, s, d, heads, kv_heads) = (t as u32, s as u32, d as u32, heads as u32, kv_heads as u32);
    GemmParams {
        batch: heads,
        a_rs: s,
        a_batch: t * s,
        b_rs: kv_heads * d,
        b_cs: 1,
        b_batch: d,
        b_batch_div: heads / kv_heads,
        c_rs: heads * d,
        c_batch: d,
        ..GemmParams::new(t, d, s)
    }
}

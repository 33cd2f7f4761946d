//! The whole router of the MoE (HF `Gemma4TextRouter` after its input norm; CPU twin
//! `dg_cpu::moe::route`) in one dispatch: the projection `logits = x · Wᵀ` in f32 arithmetic from
//! f16 weights in K panels (the F16 mode's `router.proj`), then [`crate::router_topk`]'s tail: an
//! f32 softmax over the experts, the top K by probability (descending, ties to the lower expert
//! index), renormalised by their sum in chosen order, times `per_expert_scale`.
//!
//! It replaces the tensor-core product (whose 8 tiles split K 22 ways to fill the GPU) and the
//! top-k dispatch reading its partials: each workgroup streams the whole of W (720 KB at the real
//! geometry, from L2) for [`TOKENS`] tokens, so the product has no partials and the top-k no
//! dispatch of its own. See `wgsl/router.wgsl` for the work split.

use bytemuck::{Pod, Zeroable};

use crate::{Access, KernelSource, with_prelude};

/// Largest expert count supported (the model has 128): one invocation per expert and K half.
pub const MAX_EXPERTS: u32 = 128;
/// Largest top-k supported (the model uses 8).
pub const MAX_K: u32 = crate::router_topk::MAX_K;
/// Columns of W's K panels.
pub const PANEL: u32 = 32;
/// Tokens a workgroup routes. Each workgroup streams all of W, so fewer tokens a workgroup read
/// more of L2 in all, and more make each workgroup's f32 products longer: at the real geometry
/// (256 tokens, W 128 × 2816) 4 tokens make 64 workgroups, 46 MB from L2 and 1.4 M products each.
pub const TOKENS: u32 = 4;

/// Uniform parameters of `router.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable, PartialEq)]
pub struct RouterParams {
    pub tokens: u32,
    /// E ≤ [`MAX_EXPERTS`].
    pub experts: u32,
    /// K ≤ [`MAX_K`] and ≤ E.
    pub k: u32,
    /// The input's width, a multiple of [`PANEL`].
    pub hidden: u32,
    /// Element of `x` where token 0's row starts, a multiple of 4.
    pub x_offset: u32,
    pub _pad: [u32; 3],
}

/// Whether the kernel takes a router of `experts` experts, top-`k`, over `hidden` columns.
pub fn fits(experts: u32, k: u32, hidden: u32) -> bool {
    (1..=MAX_EXPERTS).contains(&experts) && (1..=MAX_K.min(experts)).contains(&k) && hidden.is_multiple_of(PANEL) && hidden > 0
}

/// Workgroups to dispatch with `tokens` tokens a workgroup (fold through `groups_1d`).
pub fn workgroups(p: &RouterParams, tokens: u32) -> u32 {
    p.tokens.div_ceil(tokens)
}

/// The kernel routing [`TOKENS`] tokens a workgroup.
pub fn source() -> KernelSource {
    source_for(TOKENS)
}

/// The kernel routing `tokens` (1 to 8) tokens a workgroup. Bindings: `x` (read, f32 `[tokens,
/// hidden]` from `x_offset`), `w` (read, f16 `[hidden / PANEL, experts, PANEL]`, as
/// [`crate::coop_grouped_gemm::pack_f16_panels`] packs `[experts, hidden]`), `per_expert_scale`
/// (read, `[E]`), `idx` (read-write, u32 `[tokens, K]`, by descending probability), `weights`
/// (read-write, `[tokens, K]`).
pub fn source_for(tokens: u32) -> KernelSource {
    assert!((1..=8).contains(&tokens), "the router takes 1 to 8 tokens a workgroup, not {tokens}");
    KernelSource {
        name: format!("router_t{tokens}"),
        wgsl: with_prelude(&[("TOKENS", tokens), ("MAX_K", MAX_K)], include_str!("wgsl/router.wgsl")),
        entry: "main",
        buffers: vec![Access::Read, Access::Read, Access::Read, Access::ReadWrite, Access::ReadWrite],
        params_size: size_of::<RouterParams>() as u64,
    }
}

//! The router's tail (`dg_cpu::moe::route` after its projection): per token, an f32 softmax over
//! all E expert logits, the top K by probability (descending; ties keep the lower expert index),
//! renormalised by their sum (taken in that order), then `× per_expert_scale[expert]`.
//!
//! Through a tree ([`RowReduce::Tree`]): one workgroup per token and one invocation per expert
//! (E ≤ [`MAX_EXPERTS`], K ≤ [`MAX_K`]): reductions for the max and the sum, then K workgroup
//! argmaxes (strictly greater wins, ties to the lower expert index, so the choice is exactly the
//! CPU's sort order), and one invocation renormalises the K chosen in chosen order. Through
//! subgroups ([`RowReduce::Subgroup`]): [`SUBGROUP_TOKENS`] tokens a workgroup, one subgroup a
//! token, the same choice and order from subgroup operations with no barrier between them
//! (`wgsl/router_topk_subgroups.wgsl`).

use bytemuck::{Pod, Zeroable};

use crate::row_reduce::{Part, RowReduce};
use crate::{Access, KernelSource, with_prelude};

/// Largest expert count supported (the model has 128).
pub const MAX_EXPERTS: u32 = 128;
/// Invocations per workgroup: one per expert (one workgroup per token).
pub const WORKGROUP: u32 = MAX_EXPERTS;
/// Largest top-k supported (the model uses 8).
pub const MAX_K: u32 = 8;

/// Uniform parameters of `router_topk.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable, PartialEq)]
pub struct RouterTopkParams {
    pub tokens: u32,
    /// E ≤ [`MAX_EXPERTS`].
    pub experts: u32,
    /// K ≤ [`MAX_K`] and ≤ E.
    pub k: u32,
    /// More than 1 when `logits` holds that many split-K partials of the router's product,
    /// `split_stride` elements apart (`crate::split_k::with_reader`).
    pub splits: u32,
    pub split_stride: u32,
    pub _pad: [u32; 3],
}

/// Tokens a workgroup of the subgroup variant routes (one subgroup each where subgroups are 32
/// wide).
pub const SUBGROUP_TOKENS: u32 = 8;
/// Invocations a workgroup of the subgroup variant.
pub const SUBGROUP_WORKGROUP: u32 = 256;

/// Workgroups to dispatch for `reduce`'s kernel: one per token (tree) or per
/// [`SUBGROUP_TOKENS`] tokens (subgroups); fold through `groups_1d` (more than 65535 wrap into y).
pub fn workgroups(p: &RouterTopkParams, reduce: RowReduce) -> u32 {
    match reduce {
        RowReduce::Tree => p.tokens,
        RowReduce::Subgroup => p.tokens.div_ceil(SUBGROUP_TOKENS),
    }
}

/// Bindings: `logits` (read, `[tokens, E]`, or the split-K partials of the router's product), `per_expert_scale` (read, `[E]`), `idx`
/// (read-write, u32 `[tokens, K]`, by descending probability), `weights` (read-write,
/// `[tokens, K]`).
pub fn source(reduce: RowReduce) -> KernelSource {
    let (body, consts) = match reduce {
        RowReduce::Tree => (reduce.render(include_str!("wgsl/router_topk.wgsl"), &[Part::Sum("f32"), Part::Max]), [("WG", WORKGROUP), ("MAX_E", MAX_EXPERTS), ("MAX_K", MAX_K), ("TOKENS", 1)]),
        RowReduce::Subgroup => (include_str!("wgsl/router_topk_subgroups.wgsl").to_string(), [("WG", SUBGROUP_WORKGROUP), ("MAX_E", MAX_EXPERTS), ("MAX_K", MAX_K), ("TOKENS", SUBGROUP_TOKENS)]),
    };
    KernelSource {
        name: format!("router_topk{}", reduce.suffix()),
        wgsl: with_prelude(&consts, &crate::split_k::with_reader(&body, "logits_at", "logits")),
        entry: "main",
        buffers: vec![Access::Read, Access::Read, Access::ReadWrite, Access::ReadWrite],
        params_size: size_of::<RouterTopkParams>() as u64,
    }
}

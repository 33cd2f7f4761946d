//! The router's tail (`dg_cpu::moe::route` after its projection): per token, an f32 softmax over
//! all E expert logits, the top K by probability (descending; ties keep the lower expert index),
//! renormalised by their sum (taken in that order), then `× per_expert_scale[expert]`.
//!
//! One workgroup per token and one invocation per expert (E ≤ [`MAX_EXPERTS`], K ≤ [`MAX_K`]):
//! tree reductions for the max and the sum, then K workgroup argmaxes (strictly greater wins, ties
//! to the lower expert index, so the choice is exactly the CPU's sort order), and one invocation
//! renormalises the K chosen in chosen order.

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

/// Workgroups to dispatch, one per token (fold through `groups_1d`: more than 65535 wrap into y).
pub fn workgroups(p: &RouterTopkParams) -> u32 {
    p.tokens
}

/// Bindings: `logits` (read, `[tokens, E]`, or the split-K partials of the router's product), `per_expert_scale` (read, `[E]`), `idx`
/// (read-write, u32 `[tokens, K]`, by descending probability), `weights` (read-write,
/// `[tokens, K]`).
pub fn source(reduce: RowReduce) -> KernelSource {
    let body = reduce.render(include_str!("wgsl/router_topk.wgsl"), &[Part::Sum("f32"), Part::Max]);
    KernelSource {
        name: format!("router_topk{}", reduce.suffix()),
        wgsl: with_prelude(
            &[("WG", WORKGROUP), ("MAX_E", MAX_EXPERTS), ("MAX_K", MAX_K)],
            &crate::split_k::with_reader(&body, "logits_at", "logits"),
        ),
        entry: "main",
        buffers: vec![Access::Read, Access::Read, Access::ReadWrite, Access::ReadWrite],
        params_size: size_of::<RouterTopkParams>() as u64,
    }
}

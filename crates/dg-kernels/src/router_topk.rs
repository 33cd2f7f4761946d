//! The router's tail (`dg_cpu::moe::route` after its projection): per token, an f32 softmax over
//! all E expert logits, the top K by probability (descending; ties keep the lower expert index),
//! renormalised by their sum (taken in that order), then `× per_expert_scale[expert]`.
//!
//! One invocation per token, sequential over the experts like the CPU reference (E ≤
//! [`MAX_EXPERTS`], K ≤ [`MAX_K`]); the router is a tiny fraction of a layer's work.

use bytemuck::{Pod, Zeroable};

use crate::{Access, KernelSource, with_prelude};

/// Invocations (tokens) per workgroup.
pub const WORKGROUP: u32 = 64;
/// Largest expert count supported (the model has 128).
pub const MAX_EXPERTS: u32 = 128;
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
    pub _pad: u32,
}

/// Workgroups to dispatch (fold through `groups_1d`).
pub fn workgroups(p: &RouterTopkParams) -> u32 {
    p.tokens.div_ceil(WORKGROUP)
}

/// Bindings: `logits` (read, `[tokens, E]`), `per_expert_scale` (read, `[E]`), `idx`
/// (read-write, u32 `[tokens, K]`, by descending probability), `weights` (read-write,
/// `[tokens, K]`).
pub fn source() -> KernelSource {
    KernelSource {
        name: "router_topk".into(),
        wgsl: with_prelude(
            &[("WG", WORKGROUP), ("MAX_E", MAX_EXPERTS), ("MAX_K", MAX_K)],
            include_str!("wgsl/router_topk.wgsl"),
        ),
        entry: "main",
        buffers: vec![Access::Read, Access::Read, Access::ReadWrite, Access::ReadWrite],
        params_size: size_of::<RouterTopkParams>() as u64,
    }
}

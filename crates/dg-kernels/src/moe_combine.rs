//! MoE combine: `out[t, :] = Σ_k weights[t, k] · y[slot_of[t, k], :]`, summed from 0 in ascending
//! expert order (ties, which top-k never produces, in k order), the fixed order of the reference's
//! per-expert `index_add_` and of `dg_cpu::moe::experts`. One workgroup per token; each output
//! element belongs to one invocation (no atomics). Entries whose `slot_of` is
//! [`crate::moe_dispatch::NO_SLOT`] are skipped. The token's entries are ranked in that order by
//! K invocations at once; the columns are read and written as vec4s where `H` allows
//! ([`source_for`]; the same bits as one at a time). The scaled variant ([`source_scaled`])
//! multiplies each slot's weight by `slot_scale[slot]`: the experts' down projection ran on rows
//! scaled by `crate::gelu_glu::pair_scaled`.

use bytemuck::{Pod, Zeroable};

use crate::{Access, KernelSource, with_prelude};

/// Invocations per workgroup (one workgroup per token, looping over the hidden size).
pub const WORKGROUP: u32 = 256;
/// Largest K supported.
pub const MAX_K: u32 = 8;

/// Uniform parameters of `moe_combine.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable, PartialEq)]
pub struct MoeCombineParams {
    pub tokens: u32,
    /// K ≤ [`MAX_K`].
    pub k: u32,
    /// H: row width of `y` and `out`.
    pub hidden: u32,
    pub _pad: u32,
}

/// Workgroups to dispatch (one per token; fold through `groups_1d`).
pub fn workgroups(p: &MoeCombineParams) -> u32 {
    p.tokens
}

/// Bindings: `y` (read, `[slots, H]`: expert outputs by slot, unweighted), `idx` (read, u32
/// `[tokens, K]`), `weights` (read, `[tokens, K]`), `slot_of` (read, u32 `[tokens, K]`), `out`
/// (read-write, `[tokens, H]`). Columns one at a time (any `H`).
pub fn source() -> KernelSource {
    source_lanes(1)
}

/// The kernel for rows of `hidden` columns: four columns at a time where `hidden` is a multiple
/// of 4 (`y` and `out` then bound as vec4s), else [`source`].
pub fn source_for(hidden: u32) -> KernelSource {
    source_lanes(crate::lanes_for(&[hidden]))
}

/// The kernel taking `lanes` columns at a time (1, or 4 with `hidden` a multiple of 4).
pub fn source_lanes(lanes: u32) -> KernelSource {
    combine_source(lanes, false)
}

/// [`source_lanes`] with a sixth binding, `slot_scale` (read, `[slots]` f32), multiplying each
/// slot's row of `y` (folded into its weight).
pub fn source_scaled(lanes: u32) -> KernelSource {
    combine_source(lanes, true)
}

fn combine_source(lanes: u32, scaled: bool) -> KernelSource {
    let (name, v) = match lanes {
        4 => ("moe_combine_v4", "vec4<f32>"),
        _ => ("moe_combine", "f32"),
    };
    let rank = rank_text("p.k", scaled.then_some(6));
    let mut buffers = vec![Access::Read, Access::Read, Access::Read, Access::Read, Access::ReadWrite];
    if scaled {
        buffers.push(Access::Read);
    }
    KernelSource {
        name: format!("{name}{}", if scaled { "_scaled" } else { "" }),
        wgsl: with_prelude(
            &[("WG", WORKGROUP), ("MAX_K", MAX_K), ("LANES", lanes)],
            &format!("alias V = {v};\n{}", include_str!("wgsl/moe_combine.wgsl").replace("//@RANK\n", &rank)),
        ),
        entry: "main",
        buffers,
        params_size: size_of::<MoeCombineParams>() as u64,
    }
}

/// The entries' ranking and sum (`moe_rank.wgsl`) for a kernel whose K parameter is `top_k` (a
/// WGSL expression); the kernel declares `y`, `idx`, `weights` and `slot_of`. With
/// `slot_scale_binding`, the slots' factors come from a `slot_scale` buffer at that binding, else
/// they are 1.
pub(crate) fn rank_text(top_k: &str, slot_scale_binding: Option<u32>) -> String {
    let factor = match slot_scale_binding {
        Some(b) => format!(
            "@group(0) @binding({b}) var<storage, read> slot_scale: array<f32>;\n\nfn slot_factor(s: u32) -> f32 {{\n    return slot_scale[s];\n}}\n"
        ),
        None => "fn slot_factor(s: u32) -> f32 {\n    return 1.0;\n}\n".to_string(),
    };
    format!("{factor}\n{}", include_str!("wgsl/moe_rank.wgsl").replace("TOP_K", top_k))
}

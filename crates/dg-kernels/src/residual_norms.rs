//! The residual adds and RMSNorms around a decoder layer's two blocks, each fused into one
//! dispatch that replaces a chain of `rmsnorm.wgsl` dispatches with the same arithmetic.
//!
//! After attention ([`source_attention`]; HF `DiffusionGemmaDecoderLayer`:
//! `hidden = residual + post_attention_layernorm(attn_out)`, then three norms of the new stream:
//! `pre_feedforward_layernorm(hidden)` for the dense MLP, `pre_feedforward_layernorm_2(hidden)`
//! for the experts and the router's `rms(hidden)·router_scale·hidden_size^-1/2`):
//!
//! ```text
//! hidden       = hidden + rms(x)·w_res
//! out_a        = (rms(hidden)·w_a)·scale_a
//! out_bc[0, :] = (rms(hidden)·w_b)·scale_b
//! out_bc[1, :] = (rms(hidden)·w_c)·scale_c
//! ```
//!
//! (`out_bc` is `[2, rows, dim]`: two outputs in one binding, as WebGPU's default limit is eight
//! storage buffers.)
//!
//! After the feed-forward blocks ([`source_ffn`]; the same layer's `post_feedforward_layernorm_1`,
//! `post_feedforward_layernorm_2`, `post_feedforward_layernorm` and `layer_scalar`):
//!
//! ```text
//! dense  = rms(mlp)·w_1
//! dense  = dense + rms(moe)·w_2
//! hidden = (hidden + rms(dense)·w_3)·scalar
//! normed = rms(hidden)·w_next          (optional: the next layer's input_layernorm, or the final norm)
//! ```
//!
//! (`dense` stays in registers: each invocation computes its elements once for their squares and
//! again, by the same expression, for the residual add.) Its combine variant
//! ([`source_ffn_combine_lanes`]) also computes `moe` from the experts' outputs by slot, as
//! [`crate::moe_combine`] does (the same adds in the same order), which saves that dispatch: 12
//! storage buffers, so only for adapters that allow them ([`FFN_COMBINE_BUFFERS`]).
//!
//! with `rms(v) = v · (mean(v²) + eps)^-1/2` over a row of `dim`, the CPU twin of which is
//! `dg_cpu::ops::rms_norm_rows`. Each step is the rmsnorm kernel's op (weighted, accumulating where
//! it adds) with the same per-invocation strided sums, the same reduction (`crate::row_reduce`, the same variant as the chain's) and `1/sqrt`, so a
//! fused result matches the chain it replaces to an ulp or two (only the driver's FMA contraction
//! may differ between the compilations).
//!
//! One workgroup per row; rows beyond 65535 workgroups wrap into y (fold [`workgroups`] through
//! `groups_1d`). Every invocation re-reads only the elements of `hidden` that it wrote itself, so
//! the next reduction sees the updated row without a storage barrier.

use bytemuck::{Pod, Zeroable};

use crate::rmsnorm::with_lanes;
use crate::row_reduce::{Part, RowReduce};
use crate::{Access, KernelSource, with_prelude};

/// Workgroup size (one workgroup per row); the same as `rmsnorm::WORKGROUP`, so that the
/// reduction order, and with it every norm, is the rmsnorm kernel's.
pub const WORKGROUP: u32 = crate::rmsnorm::WORKGROUP;

/// Uniform parameters of `attention_residual_norms.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable, PartialEq)]
pub struct AttentionResidualNormsParams {
    pub rows: u32,
    /// Elements per row of every `[rows, dim]` buffer, and the length of the three weights.
    pub dim: u32,
    pub eps: f32,
    /// Multiplies `out_a` (1 for `pre_feedforward_layernorm`).
    pub scale_a: f32,
    /// Multiplies `out_bc[0]`.
    pub scale_b: f32,
    /// Multiplies `out_bc[1]` (`hidden_size^-1/2` for the router's input).
    pub scale_c: f32,
    /// More than 1 when `x` holds that many split-K partials, `split_stride` elements apart
    /// (`crate::split_k::with_reader`).
    pub splits: u32,
    pub split_stride: u32,
}

/// Uniform parameters of `ffn_residual_norms.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable, PartialEq)]
pub struct FfnResidualNormsParams {
    pub rows: u32,
    /// Elements per row of every `[rows, dim]` buffer, and the length of the weights.
    pub dim: u32,
    pub eps: f32,
    /// Multiplies the updated `hidden` (the layer's `layer_scalar`).
    pub scalar: f32,
    /// More than 1 when `mlp` holds that many split-K partials of the dense MLP's down projection,
    /// `split_stride` elements apart (`crate::split_k::with_reader`).
    pub splits: u32,
    pub split_stride: u32,
    /// 1: also write `normed = rms(hidden)·w_next` (the next layer's input norm, or the final
    /// norm); 0: `w_next` and `normed` are not touched.
    pub next_norm: u32,
    /// The combine variant ([`source_ffn_combine_lanes`]): the entries a row in `idx`, `weights`
    /// and `slot_of` (at most [`crate::moe_combine::MAX_K`]); unused otherwise.
    pub top_k: u32,
}

/// Workgroups to dispatch, one per row, for either kernel (fold through `groups_1d`: more than
/// 65535 wrap into y).
pub fn workgroups(rows: u32) -> u32 {
    rows
}

/// Bindings: `x` (read, `[rows, dim]`, the attention output, or the split-K partials of the
/// o-projection that writes it), `w_res`, `w_a`, `w_b`, `w_c` (read,
/// `[dim]`), `hidden` (read-write, `[rows, dim]`, the residual stream, updated in place), `out_a`
/// (read-write, `[rows, dim]`) and `out_bc` (read-write, `[2, rows, dim]`), written only. `x`,
/// `hidden`, `out_a` and `out_bc` must be four different buffers.
pub fn source_attention(reduce: RowReduce) -> KernelSource {
    source_attention_lanes(reduce, 1)
}

/// [`source_attention`] taking `lanes` columns at a time (1, or 4 for `dim` a multiple of 4).
pub fn source_attention_lanes(reduce: RowReduce, lanes: u32) -> KernelSource {
    attention_source(reduce, lanes, false)
}

/// [`source_attention_lanes`] at 4 columns a time storing `out_bc[0]` (the experts' input) as f16
/// (`pack2x16float`, round to nearest even), for the tensor cores' experts, which read half the
/// bytes and round their operands to f16 anyway: the same values to the bit as the f32 ones
/// converted when staged (`tests/kernels_norm.rs` checks the rounding). Its rows are packed from
/// the start of `out_bc` (`rows·dim` halves); `out_bc[1]` stays f32 at element `rows·dim`.
pub fn source_attention_half(reduce: RowReduce) -> KernelSource {
    attention_source(reduce, 4, true)
}

fn attention_source(reduce: RowReduce, lanes: u32, half: bool) -> KernelSource {
    let template = include_str!("wgsl/attention_residual_norms.wgsl");
    let (elem, store) = match half {
        // out_bc as vec2<u32> words: a vec4 of f16 is one, a vec4 of f32 two.
        true => {
            assert_eq!(lanes, 4, "the half variant takes 4 columns at a time");
            (
                "vec2<u32>",
                "fn store_bc(e: u32, b: V, c: V) {\n    out_bc[e] = vec2<u32>(pack2x16float(b.xy), pack2x16float(b.zw));\n    let words = bitcast<vec4<u32>>(c);\n    let at = 2u * (p.rows * (p.dim / LANES) + e);\n    out_bc[at] = words.xy;\n    out_bc[at + 1u] = words.zw;\n}\n",
            )
        }
        false => ("V", "fn store_bc(e: u32, b: V, c: V) {\n    out_bc[e] = b;\n    out_bc[p.rows * (p.dim / LANES) + e] = c;\n}\n"),
    };
    let template = template.replace("BC_ELEM", elem).replace("//@STORE_BC", store);
    let (body, suffix) = with_lanes(&reduce.render(&template, &[Part::Sum("f32")]), lanes);
    let body = crate::split_k::with_reader_lanes(&body, "x_at", "x");
    KernelSource {
        name: format!("attention_residual_norms{}{suffix}{}", if half { "_half" } else { "" }, reduce.suffix()),
        wgsl: with_prelude(&[("WG", WORKGROUP)], &body),
        entry: "main",
        buffers: vec![
            Access::Read,
            Access::Read,
            Access::Read,
            Access::Read,
            Access::Read,
            Access::ReadWrite,
            Access::ReadWrite,
            Access::ReadWrite,
        ],
        params_size: size_of::<AttentionResidualNormsParams>() as u64,
    }
}

/// Bindings: `mlp` (read, `[rows, dim]`, the dense MLP's output, or the split-K partials of its down
/// projection), `w_1` (read, `[dim]`), `moe` (read, `[rows, dim]`, the experts' combined output),
/// `w_2`, `w_3` (read, `[dim]`), `hidden` (read-write, `[rows, dim]`, the residual stream, updated
/// in place), `w_next` (read, `[dim]`) and `normed` (read-write, `[rows, dim]`, written only), the
/// last two touched only with `next_norm`. `mlp`, `moe`, `hidden` and `normed` must be four
/// different buffers.
pub fn source_ffn(reduce: RowReduce) -> KernelSource {
    source_ffn_lanes(reduce, 1)
}

/// [`source_ffn`] taking `lanes` columns at a time (1, or 4 for `dim` a multiple of 4).
pub fn source_ffn_lanes(reduce: RowReduce, lanes: u32) -> KernelSource {
    ffn_source(reduce, lanes, false, false)
}

/// [`source_ffn_lanes`] (or, with `combine`, [`source_ffn_combine_lanes`]) for inputs scaled by
/// rows (`crate::gelu_glu::pair_scaled`): one more binding after the others, `mlp_scale` (read,
/// `[rows]` f32), multiplying each row of `mlp`, and for the combine variant one more again,
/// `slot_scale` (read, `[slots]` f32), multiplying each expert output by slot (folded into its
/// weight, as [`crate::moe_combine::source_scaled`]). Factors of 1 give the unscaled variant's
/// bits.
pub fn source_ffn_scaled(reduce: RowReduce, lanes: u32, combine: bool) -> KernelSource {
    ffn_source(reduce, lanes, combine, true)
}

/// Storage buffers of the combine variant ([`source_ffn_combine_lanes`]): over WebGPU's default
/// limit of 8, so the Recorder takes it only where the adapter allows as many.
pub const FFN_COMBINE_BUFFERS: u32 = 12;

/// Storage buffers of the closing norms' variant: 8, 12 with the combine, one more with `scaled`
/// and another for a scaled combine.
pub fn ffn_buffers(combine: bool, scaled: bool) -> u32 {
    (if combine { FFN_COMBINE_BUFFERS } else { 8 }) + if scaled { 1 + u32::from(combine) } else { 0 }
}

/// [`source_ffn_lanes`] computing `moe` itself (the MoE combine fused in): bindings as
/// [`source_ffn`]'s, but `moe` read-write (`[rows, dim]`, written with the combined rows), then
/// `y` (read, `[slots, dim]`: the experts' outputs by slot, unweighted), `idx` (read, u32
/// `[rows, top_k]`), `weights` (read, `[rows, top_k]`) and `slot_of` (read, u32 `[rows, top_k]`),
/// as `crate::moe_combine::source_for` binds them.
pub fn source_ffn_combine_lanes(reduce: RowReduce, lanes: u32) -> KernelSource {
    ffn_source(reduce, lanes, true, false)
}

fn ffn_source(reduce: RowReduce, lanes: u32, combine: bool, scaled: bool) -> KernelSource {
    let template = include_str!("wgsl/ffn_residual_norms.wgsl");
    // The scale bindings follow every other: 9 (plain) or 13 and 14 (combine).
    let first_scale = if combine { 13 } else { 9 };
    let (template, access, moe_source) = match combine {
        true => (
            template.replace("MOE_ACCESS", "read_write"),
            Access::ReadWrite,
            format!(
                "{}\n{}",
                include_str!("wgsl/ffn_combine.wgsl"),
                crate::moe_combine::rank_text("p.top_k", scaled.then_some(first_scale + 1))
            ),
        ),
        false => (template.replace("MOE_ACCESS", "read"), Access::Read, include_str!("wgsl/ffn_moe_buffer.wgsl").to_string()),
    };
    let mlp_in = match scaled {
        true => format!(
            "@group(0) @binding({first_scale}) var<storage, read> mlp_scale: array<f32>;\n\nfn mlp_in(row: u32, i: u32) -> V {{\n    return mlp_at(i) * mlp_scale[row];\n}}\n"
        ),
        false => "fn mlp_in(row: u32, i: u32) -> V {\n    return mlp_at(i);\n}\n".to_string(),
    };
    let template = template.replace("//@MOE_SOURCE\n", &moe_source).replace("//@MLP_IN\n", &mlp_in);
    let (body, suffix) = with_lanes(&reduce.render(&template, &[Part::Sum("vec2<f32>")]), lanes);
    let mut buffers =
        vec![Access::Read, Access::Read, access, Access::Read, Access::Read, Access::ReadWrite, Access::Read, Access::ReadWrite];
    if combine {
        buffers.extend([Access::Read; 4]);
    }
    if scaled {
        buffers.push(Access::Read);
        if combine {
            buffers.push(Access::Read);
        }
    }
    KernelSource {
        name: format!(
            "ffn_residual_norms{}{}{suffix}{}",
            if combine { "_combine" } else { "" },
            if scaled { "_scaled" } else { "" },
            reduce.suffix()
        ),
        wgsl: with_prelude(
            &[("WG", WORKGROUP), ("MAX_K", crate::moe_combine::MAX_K)],
            &crate::split_k::with_reader_lanes(&body, "mlp_at", "mlp"),
        ),
        entry: "main",
        buffers,
        params_size: size_of::<FfnResidualNormsParams>() as u64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_are_uniform_sized() {
        assert_eq!(size_of::<AttentionResidualNormsParams>() % 16, 0);
        assert_eq!(size_of::<FfnResidualNormsParams>() % 16, 0);
    }

    #[test]
    fn bindings_fit_the_default_limits() {
        // WebGPU's default maxStorageBuffersPerShaderStage.
        for k in RowReduce::ALL.into_iter().flat_map(|r| [source_attention(r), source_ffn(r)]) {
            assert!(k.buffers.len() <= 8, "{}: {} storage buffers", k.name, k.buffers.len());
        }
        for k in RowReduce::ALL.into_iter().map(|r| source_ffn_combine_lanes(r, 4)) {
            assert_eq!(k.buffers.len() as u32, FFN_COMBINE_BUFFERS, "{}", k.name);
        }
    }
}

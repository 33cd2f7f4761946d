//! Per-head RMSNorm fused with RoPE, for q and k: `out = rope(rms(x)·w)` over `x: [tokens, heads,
//! d]`, the same arithmetic as the two dispatches it replaces, `rmsnorm.wgsl` (weighted, not
//! accumulating, scale 1) then `rope.wgsl` in place; CPU twins `dg_cpu::ops::rms_norm_rows` then
//! `dg_cpu::rope::RopeTable::apply` (rotate-half, dimension `i` paired with `i + d/2`).
//!
//! The same dispatch may also take the q rows of a projection batched by blocks of heads ahead of
//! the K rows (`q_blocks`, their own weight and output), and norm the V rows of the product after
//! them (weightless, no rope, the `rmsnorm.wgsl` op; `v_heads`): so that q, K and V of one
//! projection reach the attention and the cache in one dispatch.
//!
//! One workgroup per (token, head) row: the sum of squares is accumulated and reduced as in
//! `rmsnorm.wgsl` (strided per-invocation sums, `row_sum` of the same [`RowReduce`], `1/sqrt`; the
//! same bits for rows of up to 128 columns, see [`workgroup_for`]), then each invocation
//! rotates pairs `j, j + WG, …` of `[0, d/2)`. Any even `d` works (the model has 256 and 512).

use bytemuck::{Pod, Zeroable};

use crate::row_reduce::{Part, RowReduce};
use crate::{Access, KernelSource, with_prelude};

/// The largest workgroup (one workgroup per row): half of `rmsnorm::WORKGROUP`.
pub const MAX_WORKGROUP: u32 = crate::rmsnorm::WORKGROUP / 2;

/// The workgroup sizes the kernel is built for ([`workgroup_for`] picks one).
pub const WORKGROUPS: [u32; 3] = [32, 64, MAX_WORKGROUP];

/// The workgroup for rows of `dim` columns taken `lanes` at a time: one invocation a column,
/// rounded up to whole subgroups of 32, at most [`MAX_WORKGROUP`] (the real model's heads: 64
/// invocations for its 256-wide sliding heads, 128 for the 512-wide full ones, in vec4s). Each
/// invocation then holds at most one column wherever a row has at most 128, and the reductions
/// give the rmsnorm kernel's bits: both only lose invocations whose sums are +0 at the end of
/// their order (the tree's first levels, the subgroups' sums added in order). On an H200 a
/// 1024-token prefill's q/K/V rows had 64 of 256 invocations at work before [`MAX_WORKGROUP`]
/// (70.6 → 42.8 µs a sliding layer), 64 of 128 before this rule (42.9 → 34.7 µs; the decoder's
/// 256 tokens 16.8 → 17.0).
pub fn workgroup_for(p: &NormRopeParams, lanes: u32) -> u32 {
    (p.dim / lanes.max(1)).next_multiple_of(32).clamp(WORKGROUPS[0], MAX_WORKGROUP)
}

/// Uniform parameters of `norm_rope.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable, PartialEq)]
pub struct NormRopeParams {
    /// Rows of the cos/sin tables (token positions).
    pub tokens: u32,
    /// Heads per token; `x` and `out` are `[tokens, heads, dim]`.
    pub heads: u32,
    /// Head dim `d` (even); the cos/sin tables are `[tokens, d/2]`.
    pub dim: u32,
    pub eps: f32,
    /// More than 1 when `x` holds that many split-K partials, `split_stride` elements apart
    /// (`crate::split_k::with_reader`).
    pub splits: u32,
    pub split_stride: u32,
    /// Elements before row 0 of `out` (and of `values`).
    pub out_offset: u32,
    /// V rows per token normed (weightless, no rope) into `values` by the same dispatch, after the
    /// K rows; 0 for none.
    pub v_heads: u32,
    /// Element of `x` (of each partial) where the V rows start.
    pub v_offset: u32,
    /// Blocks of q rows ahead of the K rows, each `[tokens, heads, dim]` (block `b` holds q heads
    /// `b·heads ..`), normed with `q_w` and rotated into `q_out`, `[tokens, q_blocks·heads, dim]`; 0
    /// for none.
    pub q_blocks: u32,
    /// Non-zero: no K rows (the q rows, or the V rows, alone).
    pub skip_k: u32,
    /// Element of `x` (of each partial) where the first q block's (else the K block's) rows start:
    /// one canvas of a product over several (`dg_gpu`'s batched forward).
    pub x_offset: u32,
    /// Elements of `x` from one q block to the next (and from the last to the K block); 0 for
    /// `tokens·heads·dim` (the blocks hold this dispatch's rows alone).
    pub block_stride: u32,
    /// Row of the cos/sin tables that token 0 reads.
    pub table_row0: u32,
    /// Elements before row 0 of `q_out`.
    pub q_offset: u32,
    pub _pad: u32,
}

/// Workgroups to dispatch, one per (token, head) row of q, K and V (fold through `groups_1d`:
/// more than 65535 wrap into y).
pub fn workgroups(p: &NormRopeParams) -> u32 {
    let k_heads = if p.skip_k != 0 { 0 } else { p.heads };
    p.tokens * (p.q_blocks * p.heads + k_heads + p.v_heads)
}

/// Bindings: `x` (read, `[q_blocks, tokens, heads, d]` then `[tokens, heads, d]`, or the split-K
/// partials of the product it would hold; with V rows, those follow from `v_offset`), `w` (read,
/// `[d]`), `cos` (read, `[tokens, d/2]`), `sin` (read, `[tokens, d/2]`), `out` (read-write,
/// `[tokens, heads, d]` from `out_offset`), `values` (read-write, `[tokens, v_heads, d]` from
/// `out_offset`), `q_w` (read, `[d]`), `q_out` (read-write, `[tokens, q_blocks·heads, d]`). An
/// output with no rows is untouched, and may be any buffer the others are not.
pub fn source(reduce: RowReduce) -> KernelSource {
    source_lanes(reduce, 1, MAX_WORKGROUP)
}

/// [`source`] taking `lanes` columns at a time: 1, or 4 with `d / 2`, `out_offset`, `v_offset`
/// and the split stride multiples of 4 ([`lanes_for`]), in workgroups of `wg` (one of
/// [`WORKGROUPS`]: [`workgroup_for`]); the same sums as `rmsnorm`'s of that width.
pub fn source_lanes(reduce: RowReduce, lanes: u32, wg: u32) -> KernelSource {
    source_for(reduce, lanes, wg, false)
}

/// [`source_lanes`], storing K and V (`out`, `values`) as f16 with `half_cache` (packed as
/// `WeightFormat::F16`'s pairs: the cache the tensor-core products read as B). Each stored value
/// is the f32 result rounded to the nearest f16, as the tensor cores round an f32 cache when
/// they stage it.
pub fn source_for(reduce: RowReduce, lanes: u32, wg: u32, half_cache: bool) -> KernelSource {
    assert!(WORKGROUPS.contains(&wg), "norm_rope is built for workgroups of {WORKGROUPS:?}, not {wg}");
    let (body, suffix) = crate::rmsnorm::with_lanes(&reduce.render(include_str!("wgsl/norm_rope.wgsl"), &[Part::Sum("f32")]), lanes);
    let cache = match (half_cache, lanes) {
        (false, _) => "alias CV = V;\n",
        (true, 1) => "alias CV = f16;\n",
        (true, _) => "alias CV = vec4<f16>;\n",
    };
    let wg_suffix = if wg == MAX_WORKGROUP { String::new() } else { format!("_w{wg}") };
    let wgsl = with_prelude(&[("WG", wg)], &crate::split_k::with_reader_lanes(&format!("{cache}{body}"), "x_at", "x"));
    KernelSource {
        name: format!("norm_rope{suffix}{wg_suffix}{}{}", if half_cache { "_h" } else { "" }, reduce.suffix()),
        wgsl: if half_cache { format!("enable f16;\n{wgsl}") } else { wgsl },
        entry: "main",
        buffers: vec![
            Access::Read,
            Access::Read,
            Access::Read,
            Access::Read,
            Access::ReadWrite,
            Access::ReadWrite,
            Access::Read,
            Access::ReadWrite,
        ],
        params_size: size_of::<NormRopeParams>() as u64,
    }
}

/// The columns [`source_lanes`] may take at a time for `p`: 4 where `d / 2` and every offset and
/// stride are multiples of 4, else 1.
pub fn lanes_for(p: &NormRopeParams) -> u32 {
    if p.dim.is_multiple_of(2) {
        crate::lanes_for(&[p.dim / 2, p.out_offset, p.v_offset, p.split_stride, p.x_offset, p.block_stride, p.q_offset])
    } else {
        1
    }
}

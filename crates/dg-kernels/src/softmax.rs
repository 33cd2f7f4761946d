//! Row softmax in place, with the attention masks of `dg_cpu::attention::Mask`.
//!
//! One workgroup per row, looping over the row (any length; the vocab rows are 262144 wide):
//! one pass for the running max and sum of `exp(x − max)` (merged across invocations), one pass
//! that writes `exp(x − max) · (1 / sum)` like `dg_cpu::ops::softmax_in_place`. Masked entries are
//! written as exactly 0 and take no part in the max or the sum; a row with no visible key becomes
//! all zeros. A gap of columns (`gap_start..gap_end`) is masked the same way in every row.

use bytemuck::{Pod, Zeroable};

use crate::row_reduce::{Part, RowReduce};
use crate::{Access, KernelSource, with_prelude};

/// Invocations per workgroup (one workgroup per row). On an H200 (real geometry, `--profile
/// --profile-encoder`, µs a layer; 256 / 128 / 64): a 1024-token prefill's 16384 causal rows of
/// 1024 keys 56.0 / 35.3 / 31.9 (with the masked quads no longer read), the decoder's 4096 rows
/// of 1280 19.6 / 15.8 / 15.2: a row's few vec4s a thread keep more rows in flight. Sums are
/// added in another order than at 256 (within the tolerances, as [`RowReduce`]'s variants).
pub const WORKGROUP: u32 = 64;
/// `mode`: every key is visible (plain softmax; the decoder's bidirectional attention).
pub const MODE_ALL: u32 = 0;
/// `mode`: causal over absolute positions, optionally windowed (`dg_cpu::attention::Mask::Causal`).
pub const MODE_CAUSAL: u32 = 1;

/// Uniform parameters of `softmax.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable, PartialEq)]
pub struct SoftmaxParams {
    pub rows: u32,
    pub cols: u32,
    /// Rows are `[heads, queries]`: the query index of row `r` is `r % queries` (ignored, and may
    /// be 0, in [`MODE_ALL`]).
    pub queries: u32,
    /// [`MODE_ALL`] or [`MODE_CAUSAL`].
    pub mode: u32,
    /// Absolute position of key column 0.
    pub key_start: u32,
    /// Absolute position of query 0.
    pub query_start: u32,
    /// Sliding window including the query (key `j` visible iff `j ≤ p` and `j + window > p`);
    /// 0: no window.
    pub window: u32,
    /// Columns `gap_start..gap_end` are masked in every row, whatever the mode (the padding
    /// between the decoder's cached keys and its canvas, which keeps the canvas part of a row
    /// aligned for the tensor cores); equal: no gap.
    pub gap_start: u32,
    pub gap_end: u32,
    /// [`MODE_CAUSAL`]: a query at an absolute position in `span_start..span_end` (an image's soft
    /// tokens) also sees every key of that span, as `dg_cpu::attention::Mask::Causal`'s spans;
    /// equal: no span.
    pub span_start: u32,
    pub span_end: u32,
    pub _pad: u32,
}

impl SoftmaxParams {
    /// Plain row softmax over `[rows, cols]`.
    pub fn plain(rows: u32, cols: u32) -> Self {
        SoftmaxParams {
            rows,
            cols,
            queries: 0,
            mode: MODE_ALL,
            key_start: 0,
            query_start: 0,
            window: 0,
            gap_start: 0,
            gap_end: 0,
            span_start: 0,
            span_end: 0,
            _pad: 0,
        }
    }
}

/// Workgroups to dispatch (one per row; fold through `groups_1d`).
pub fn workgroups(p: &SoftmaxParams) -> u32 {
    p.rows
}

/// `template` with its `//@ONLINE` line replaced by the online softmax's shared pairs
/// (`wgsl/softmax_online.wgsl`: `LOWEST`, `merge`, `online`).
pub(crate) fn with_online(template: &str) -> String {
    assert!(template.contains("//@ONLINE\n"), "a softmax kernel without the online marker");
    template.replace("//@ONLINE\n", include_str!("wgsl/softmax_online.wgsl"))
}

/// `template` with each `#if LANES4` … `#else` … `#endif` block reduced to its first branch
/// (`four`) or its second.
fn select_lanes(template: &str, four: bool) -> String {
    let mut out = String::new();
    let mut rest = template;
    while let Some((before, block)) = rest.split_once("#if LANES4\n") {
        let (first, after) = block.split_once("#else\n").expect("softmax.wgsl: #if LANES4 without #else");
        let (second, after) = after.split_once("#endif\n").expect("softmax.wgsl: #if LANES4 without #endif");
        out += before;
        out += if four { first } else { second };
        rest = after;
    }
    out + rest
}

/// Bindings: `x` (read-write, `[rows, cols]`).
pub fn source(reduce: RowReduce) -> KernelSource {
    source_lanes(reduce, 1)
}

/// [`source`] reading and writing `lanes` columns at a time: 1, or 4 for `cols` a multiple of 4
/// (`x` then bound as vec4s; each column masked, summed and written as with 1, in another order
/// across the invocation's columns).
pub fn source_lanes(reduce: RowReduce, lanes: u32) -> KernelSource {
    let (suffix, elem) = match lanes {
        1 => ("", "f32"),
        4 => ("_v4", "vec4<f32>"),
        _ => panic!("softmax takes 1 or 4 columns at a time, not {lanes}"),
    };
    let wgsl = with_online(&select_lanes(include_str!("wgsl/softmax.wgsl"), lanes == 4)).replace("XELEM", elem);
    KernelSource {
        name: format!("softmax{suffix}{}", reduce.suffix()),
        wgsl: with_prelude(&[("WG", WORKGROUP)], &reduce.render(&wgsl, &[Part::Pair])),
        entry: "main",
        buffers: vec![Access::ReadWrite],
        params_size: size_of::<SoftmaxParams>() as u64,
    }
}

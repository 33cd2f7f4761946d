//! The per-row work of one denoising step on the GPU, so that the `[rows, V]` logits never leave it:
//! temperature scaling, max and first argmax, the entropy of the row's softmax, and the inverse-CDF
//! draw of the sampled token.
//!
//! Mirrors `dg_sampler::rows`: `process_row` (`proc = x / T` as an f32 division, max and FIRST index
//! of the max, `S = count_at_max + Σ_{x<max} e`, `N = −Σ e·(x − max)`, entropy `ln S + N / S`, with
//! `e = exp(x − max)` by the same Cephes polynomial as `exp_nonpos`) and `RowDistributions::sample`
//! (probabilities `e / S` rounded to f32 in index order; the first index whose running sum exceeds `u`
//! and whose probability is > 0; if rounding leaves `u` above the total, the last index with
//! probability > 0).
//!
//! One workgroup per row, looping over rows of any length `V ≥ 1` (262144 for the vocab). WGSL has no
//! f64, so the sums are f32: per invocation in blocks of [`SUM_BLOCK`] terms (the block sums added
//! into a second accumulator, like the CPU's f32 lanes flushed into f64), then a workgroup tree. The
//! entries equal to the max are counted apart (as an integer) so peaked rows keep `S − 1` exact enough.
//! The draw gives each invocation a contiguous chunk of the row: chunk sums, a workgroup prefix scan,
//! then the invocation whose chunk crosses `u` rescans it entry by entry with the same arithmetic.

use bytemuck::{Pod, Zeroable};

use crate::{Access, KernelSource, with_prelude};

/// Invocations per workgroup (one workgroup per row).
pub const WORKGROUP: u32 = 256;
/// Terms per f32 partial sum before it is added into the invocation's running sum.
pub const SUM_BLOCK: u32 = 32;
/// [`SampleStep::mode`]: draw by inverse CDF with the f32 uniform whose bits are `draws[row]`.
pub const MODE_UNIFORM: u32 = 0;
/// [`SampleStep::mode`]: the ids are given: `sampled = draws[row]` (replay, or ids drawn elsewhere).
/// Any mode other than [`MODE_UNIFORM`] behaves like this one.
pub const MODE_GIVEN: u32 = 1;
/// u32 words per row of `results`.
pub const RESULT_WORDS: usize = 4;
/// `results[row][RESULT_ENTROPY]`: the entropy's f32 bits (a NaN when the row is not finite).
pub const RESULT_ENTROPY: usize = 0;
/// `results[row][RESULT_ARGMAX]`: first index of the maximum scaled logit.
pub const RESULT_ARGMAX: usize = 1;
/// `results[row][RESULT_SAMPLED]`: the sampled id (0 for a row that is not finite in
/// [`MODE_UNIFORM`], as the CPU's draw gives when every probability is NaN).
pub const RESULT_SAMPLED: usize = 2;
/// `results[row][RESULT_NON_FINITE]`: first column whose scaled logit is not finite, plus 1; 0 if
/// the row is all finite.
pub const RESULT_NON_FINITE: usize = 3;

/// Uniform parameters of `sample_rows.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable, PartialEq)]
pub struct SampleRowsParams {
    pub rows: u32,
    /// Row length V ≥ 1.
    pub vocab: u32,
    pub _pad: [u32; 2],
}

/// The per-step inputs, in a small storage buffer the host rewrites every step (so that a recorded
/// plan's uniform parameters stay fixed).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable, PartialEq)]
pub struct SampleStep {
    /// `proc = logits / temperature`.
    pub temperature: f32,
    /// [`MODE_UNIFORM`] or [`MODE_GIVEN`].
    pub mode: u32,
    pub _pad: [u32; 2],
}

impl SampleStep {
    pub fn new(temperature: f32, mode: u32) -> Self {
        SampleStep { temperature, mode, _pad: [0; 2] }
    }
}

/// Workgroups to dispatch (one per row; fold through `groups_1d`).
pub fn workgroups(p: &SampleRowsParams) -> u32 {
    p.rows
}

/// Bindings: `logits` (read, `[rows, V]`), `scaled` (read-write, `[rows, V]`: `logits / T`), `step`
/// (read, one [`SampleStep`]), `draws` (read, u32 `[rows]`: uniform bits or given ids), `results`
/// (read-write, u32 `[rows, RESULT_WORDS]`).
pub fn source() -> KernelSource {
    KernelSource {
        name: "sample_rows".into(),
        wgsl: with_prelude(&[("WG", WORKGROUP), ("BLOCK", SUM_BLOCK)], include_str!("wgsl/sample_rows.wgsl")),
        entry: "main",
        buffers: vec![Access::Read, Access::ReadWrite, Access::Read, Access::Read, Access::ReadWrite],
        params_size: size_of::<SampleRowsParams>() as u64,
    }
}

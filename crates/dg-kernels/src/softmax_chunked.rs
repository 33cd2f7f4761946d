//! Plain row softmax over long rows (the self-conditioning's `softmax` over the 262144-wide
//! vocabulary, `torch.softmax(logits, dim=-1)`), cut into chunks so that every row is spread over
//! many workgroups: [`crate::softmax`] gives a row one workgroup, and its 256 rows then leave most
//! of a large GPU idle.
//!
//! Two dispatches over `rows · chunks` workgroups, workgroup `row · chunks + c` owning columns
//! `c·chunk ..` of its row:
//! 1. [`partials`]: the chunk's `(max, Σ exp(x − max))`, merged as [`crate::softmax`] merges a row
//!    (the same online step and [`crate::row_reduce`] merge),
//!    into `part[row · chunks + c]`;
//! 2. [`apply`]: the row's pairs merged in chunk order, then `x = exp(x − max) · (1 / sum)` over
//!    the chunk, in place.
//!
//! The result is [`crate::softmax`]'s up to the order of the merges (a few ulps).

use bytemuck::{Pod, Zeroable};

use crate::row_reduce::{Part, RowReduce};
use crate::{Access, KernelSource, with_prelude};

/// Invocations per workgroup.
pub const WORKGROUP: u32 = 256;
/// Columns per chunk: 16 per invocation (64 chunks, 16384 workgroups for the real 256 × 262144).
pub const CHUNK: u32 = 4096;
/// Rows from this width up are worth chunking (shorter ones go to [`crate::softmax`]).
pub const MIN_COLS: u32 = 4 * CHUNK;

/// Uniform parameters of both passes.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable, PartialEq)]
pub struct ChunkedSoftmaxParams {
    pub rows: u32,
    pub cols: u32,
    /// Columns per chunk.
    pub chunk: u32,
    /// Chunks per row: `cols.div_ceil(chunk)`.
    pub chunks: u32,
}

impl ChunkedSoftmaxParams {
    /// `[rows, cols]` in chunks of [`CHUNK`].
    pub fn new(rows: u32, cols: u32) -> Self {
        ChunkedSoftmaxParams { rows, cols, chunk: CHUNK, chunks: cols.div_ceil(CHUNK) }
    }

    /// Workgroups of either pass (fold through `groups_1d`).
    pub fn workgroups(&self) -> u32 {
        self.rows * self.chunks
    }

    /// `vec2<f32>` pairs the partials buffer holds.
    pub fn pairs(&self) -> u64 {
        u64::from(self.rows) * u64::from(self.chunks)
    }
}

fn render(template: &str, reduce: RowReduce) -> String {
    let body = crate::softmax::with_online(&template.replace("//@COMMON\n", include_str!("wgsl/softmax_chunk_common.wgsl")));
    with_prelude(&[("WG", WORKGROUP)], &reduce.render(&body, &[Part::Pair]))
}

/// Pass 1, its workgroups' merges by `reduce`. Bindings: `x` (read, `[rows, cols]`), `part`
/// (read-write, [`ChunkedSoftmaxParams::pairs`] `vec2<f32>`).
pub fn partials(reduce: RowReduce) -> KernelSource {
    KernelSource {
        name: format!("softmax_chunk_partials{}", reduce.suffix()),
        wgsl: render(include_str!("wgsl/softmax_chunk_partials.wgsl"), reduce),
        entry: "main",
        buffers: vec![Access::Read, Access::ReadWrite],
        params_size: size_of::<ChunkedSoftmaxParams>() as u64,
    }
}

/// Pass 2, its workgroups' merges by `reduce`. Bindings: `x` (read-write, in place), `part` (read,
/// pass 1's pairs).
pub fn apply(reduce: RowReduce) -> KernelSource {
    KernelSource {
        name: format!("softmax_chunk_apply{}", reduce.suffix()),
        wgsl: render(include_str!("wgsl/softmax_chunk_apply.wgsl"), reduce),
        entry: "main",
        buffers: vec![Access::ReadWrite, Access::Read],
        params_size: size_of::<ChunkedSoftmaxParams>() as u64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_passes_validate() {
        for k in RowReduce::ALL.into_iter().flat_map(|r| [partials(r), apply(r)]) {
            let module = naga::front::wgsl::parse_str(&k.wgsl).unwrap_or_else(|e| panic!("{}: {}", k.name, e.emit_to_string(&k.wgsl)));
            naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::SUBGROUP)
                .validate(&module)
                .unwrap_or_else(|e| panic!("{}: {e:?}", k.name));
        }
    }

    #[test]
    fn the_vocabulary_is_cut_into_64_chunks() {
        let p = ChunkedSoftmaxParams::new(256, 262_144);
        assert_eq!((p.chunks, p.workgroups(), p.pairs()), (64, 16_384, 16_384));
        assert_eq!(ChunkedSoftmaxParams::new(3, CHUNK + 1).chunks, 2);
    }
}

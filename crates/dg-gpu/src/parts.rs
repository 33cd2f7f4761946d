//! Weights larger than one storage binding, split across several (a real layer's BF16 experts are
//! 1 GB, the BF16 embedding 1.47 GB, against 128 MiB on lavapipe and WebGPU's default).
//!
//! [`Parts`] is the one place that decides where a tensor is cut: into ranges of whole units
//! (rows of a dense `W[n][k]` or of the embedding, whole blocks of a stacked q/K/V projection,
//! whole experts), each within [`crate::GpuContext::weight_binding`], and on a device with tensor
//! cores a multiple of [`COOP_PART_ROWS`] rows, so that every part's product keeps whole tiles.
//! The upload ([`crate::weights`]) packs each part from its rows' stored bytes into a buffer of
//! its own ([`SplitMatrix`]), and the recording ([`crate::ops::Recorder`]) runs each product per
//! part: a dense product per range of its output columns (the part's rows of W) into those columns
//! of C, the experts' grouped product per range of experts (the MoE dispatch's offsets read from
//! the part's first expert). Every output element sums the same terms in the same order as
//! unsplit, so a split changes no result.

use std::ops::Range;

use dg_kernels::WeightFormat;
use dg_kernels::gemm::GemmParams;
use dg_model::StoredTensor;

use crate::error::GpuError;
use crate::weights::{GpuMatrix, MatrixLayout};

/// Rows every part of a matrix holds a multiple of on a device with tensor cores: the widest
/// tensor-core tile's columns (`dg_kernels::coop_gemm`'s tiles are 32, 64 or 128 wide), so that a
/// part's product (`n` = its rows) takes the tiles the whole one does, and its panels and offsets
/// stay aligned.
pub const COOP_PART_ROWS: usize = 128;

/// A tensor's units cut into consecutive ranges, one buffer each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parts {
    ranges: Vec<Range<usize>>,
}

impl Parts {
    /// All `units` in one part.
    pub fn whole(units: usize) -> Parts {
        Parts { ranges: std::iter::once(0..units).collect() }
    }

    /// `units` units of `unit_bytes` bytes each (`unit` names one, for the error), in one part
    /// where they fit `limit` bytes, else cut into parts of at most `limit` bytes that each hold a
    /// multiple of `align` units (the last one what is left). An error naming `what` where `align`
    /// units alone exceed the limit.
    pub fn split(what: &str, unit: &str, units: usize, unit_bytes: u64, align: usize, limit: u64) -> Result<Parts, GpuError> {
        // Buffers are whole 4-byte words.
        let limit = limit / 4 * 4;
        if (units as u64 * unit_bytes).next_multiple_of(4) <= limit {
            return Ok(Parts::whole(units));
        }
        let align = align.max(1);
        let per = (limit / unit_bytes.max(1)) as usize / align * align;
        if per == 0 {
            let least = if align == 1 { format!("one {unit}") } else { format!("{align} {unit}s (the least part it is cut into)") };
            return Err(GpuError::Limit {
                what: format!("weight {what} ({units} {unit}s of {unit_bytes} bytes) split across bindings: {least}"),
                needed: align as u64 * unit_bytes,
                limit,
                limit_name: "max_storage_buffer_binding_size, or the tuning's weight_binding",
            });
        }
        Ok(Parts { ranges: (0..units).step_by(per).map(|s| s..(s + per).min(units)).collect() })
    }

    /// A dense matrix of `rows` rows of `row_bytes` bytes, stacked from blocks of `block_rows`
    /// rows that one batched product reads one each (q, K and V's blocks; `rows` itself for a
    /// single matrix): parts of whole blocks, or for a single matrix, on a device with
    /// `tensor_cores`, of whole [`COOP_PART_ROWS`].
    pub fn rows(what: &str, rows: usize, row_bytes: u64, block_rows: usize, tensor_cores: bool, limit: u64) -> Result<Parts, GpuError> {
        let (align, unit) = match (block_rows < rows, tensor_cores) {
            (true, _) => (block_rows, "row"),
            (false, true) => (COOP_PART_ROWS, "row"),
            (false, false) => (1, "row"),
        };
        Parts::split(what, unit, rows, row_bytes, align, limit)
    }

    /// `experts` experts of `expert_bytes` bytes each: parts of whole experts.
    pub fn experts(what: &str, experts: usize, expert_bytes: u64, limit: u64) -> Result<Parts, GpuError> {
        Parts::split(what, "expert", experts, expert_bytes, 1, limit)
    }

    /// The parts' ranges of units, in order.
    pub fn ranges(&self) -> &[Range<usize>] {
        &self.ranges
    }

    /// Number of parts.
    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }
}

/// A weight matrix on the device in one or more parts: part `i` holds units `parts.ranges()[i]`
/// (rows, or experts) of `unit_elems` elements each in `pieces[i]`, every piece in the matrix's
/// format and layout, packed from its own first element.
#[derive(Debug)]
pub struct SplitMatrix {
    pub parts: Parts,
    pub unit_elems: usize,
    pub pieces: Vec<GpuMatrix>,
    pub format: WeightFormat,
    pub layout: MatrixLayout,
}

impl SplitMatrix {
    /// Whether the matrix takes more than one buffer.
    pub fn is_split(&self) -> bool {
        self.pieces.len() > 1
    }

    /// Bytes of its buffers together.
    pub fn bytes(&self) -> u64 {
        self.pieces.iter().map(|p| p.buffer.size()).sum()
    }
}

/// The products that compute `p` (see `dg_kernels::gemm`) over the part of a split `W[n][k]`
/// holding rows `rows` (of `cols` elements each), B read from the part's own first element: the
/// batches whose rows all lie in the part as runs of one product each, and a batch the part
/// holds only some of the rows of as a product of those columns (into the same columns of C).
/// Batches the part holds no row of give nothing. `None` where `p` does not read whole rows of
/// W, one B batch per batch (`b_rs` 1, `b_cs` = `cols`, `b_offset` and `b_batch` whole rows,
/// `b_batch_div` 1).
pub fn part_products(p: &GemmParams, cols: usize, rows: Range<usize>) -> Option<Vec<GemmParams>> {
    let cols = cols as u32;
    let batches = p.batch.max(1);
    let whole_rows = |v: u32| cols > 0 && v.is_multiple_of(cols);
    if p.b_rs != 1 || p.b_cs != cols || !whole_rows(p.b_offset) || (batches > 1 && (!whole_rows(p.b_batch) || p.b_batch_div > 1)) {
        return None;
    }
    let (start, end) = (rows.start as u32, rows.end as u32);
    let first_row = |b: u32| (p.b_offset + b * p.b_batch) / cols;
    let run = |(b0, count): (u32, u32)| GemmParams {
        batch: count,
        a_offset: p.a_offset + b0 * p.a_batch,
        b_offset: (first_row(b0) - start) * cols,
        c_offset: p.c_offset + b0 * p.c_batch,
        ..*p
    };
    let mut products = Vec::new();
    let mut current: Option<(u32, u32)> = None;
    for b in 0..batches {
        let (lo, hi) = (first_row(b).max(start), (first_row(b) + p.n).min(end));
        let whole_batch = lo == first_row(b) && hi == first_row(b) + p.n;
        match current {
            Some((b0, count)) if whole_batch && b0 + count == b => current = Some((b0, count + 1)),
            _ => {
                products.extend(current.take().map(run));
                if whole_batch {
                    current = Some((b, 1));
                } else if lo < hi {
                    products.push(GemmParams {
                        n: hi - lo,
                        batch: 1,
                        a_offset: p.a_offset + b * p.a_batch,
                        b_offset: (lo - start) * cols,
                        c_offset: p.c_offset + b * p.c_batch + (lo - first_row(b)),
                        ..*p
                    });
                }
            }
        }
    }
    products.extend(current.map(run));
    Some(products)
}

/// Rows `rows` of `stacked` (tensors of `cols` columns stacked by rows), as views of their stored
/// bytes; an error naming `what` where a row is not whole blocks of a quantized dtype.
pub(crate) fn stored_rows<'x>(
    what: &str,
    stacked: &[&'x StoredTensor<'_>],
    cols: usize,
    rows: Range<usize>,
) -> Result<Vec<StoredTensor<'x>>, GpuError> {
    let mut views = Vec::new();
    let mut first = 0;
    for t in stacked {
        let len = t.len() / cols.max(1);
        let (lo, hi) = (rows.start.max(first), rows.end.min(first + len));
        if lo < hi {
            let at = |row: usize| {
                t.dtype.bytes_for((row - first) * cols).ok_or_else(|| GpuError::Unsupported {
                    what: format!("{what}: rows of {cols} {} values are not whole blocks", t.dtype.name()),
                })
            };
            let bytes = &t.bytes()[at(lo)?..at(hi)?];
            views.push(StoredTensor::from_bytes(t.dtype, vec![hi - lo, cols], bytes));
        }
        first += len;
    }
    Ok(views)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ranges(p: &Parts) -> Vec<Range<usize>> {
        p.ranges().to_vec()
    }

    #[test]
    fn a_tensor_within_the_limit_stays_whole() {
        assert_eq!(ranges(&Parts::rows("w", 100, 40, 100, false, 4000).unwrap()), vec![0..100]);
        assert_eq!(ranges(&Parts::experts("e", 8, 1000, 8000).unwrap()), vec![0..8]);
    }

    #[test]
    fn portable_parts_are_as_many_rows_as_fit() {
        // 100 rows of 40 bytes under 1000 bytes: 25 rows a part.
        assert_eq!(ranges(&Parts::rows("w", 100, 40, 100, false, 1000).unwrap()), vec![0..25, 25..50, 50..75, 75..100]);
        // A limit that is not whole words counts only its whole words (buffers are).
        assert_eq!(ranges(&Parts::rows("w", 3, 4, 3, false, 11).unwrap()), vec![0..2, 2..3]);
        // Experts: whole experts, the last part the rest.
        assert_eq!(ranges(&Parts::experts("e", 8, 1000, 3500).unwrap()), vec![0..3, 3..6, 6..8]);
    }

    #[test]
    fn stacked_blocks_are_never_cut() {
        // q/K/V blocks of 32 rows of 192 bytes (6 KiB), 16 KiB parts: two blocks a part.
        let p = Parts::rows("qkv", 4 * 32, 192, 32, false, 16 << 10).unwrap();
        assert_eq!(ranges(&p), vec![0..64, 64..128]);
        assert!(p.ranges().iter().all(|r| r.start.is_multiple_of(32) && r.len().is_multiple_of(32)));
    }

    /// The tensor cores' parts: whole 128-row tiles of the real geometry's matrices, under
    /// lavapipe's and WebGPU's default 128 MiB binding.
    #[test]
    fn tensor_core_parts_are_whole_tiles_at_the_real_geometry() {
        const LIMIT: u64 = 128 << 20;
        // The BF16 embedding / tied head, 262144 × 2816: 1.47 GB in 12 parts of 23808 rows.
        let embed = Parts::rows("embed", 262_144, 2 * 2816, 262_144, true, LIMIT).unwrap();
        assert_eq!(embed.len(), 12);
        assert!(embed.ranges().iter().all(|r| r.start.is_multiple_of(COOP_PART_ROWS) && r.len() * 2 * 2816 <= LIMIT as usize));
        assert_eq!(embed.ranges().last().unwrap().end, 262_144);
        let per = embed.ranges()[0].len();
        assert!(
            per.is_multiple_of(COOP_PART_ROWS) && (per + COOP_PART_ROWS) * 2 * 2816 > LIMIT as usize,
            "{per} rows: as many whole tiles as fit"
        );
        // A layer's F16 experts [128, 1408, 2816] (1.01 GB) and [128, 2816, 704]: whole experts.
        let gate_up = Parts::experts("gate_up", 128, 2 * 1408 * 2816, LIMIT).unwrap();
        assert_eq!((gate_up.len(), gate_up.ranges()[0].len()), (8, 16));
        let down = Parts::experts("down", 128, 2 * 2816 * 704, LIMIT).unwrap();
        assert_eq!((down.len(), down.ranges()[0].len()), (4, 33));
        // A dense f32 matrix of 4096 rows of 2816 (46 MB) under a 16 MiB cap: 1489 rows would
        // fit, the tensor cores' parts take 11 tiles of 128 (the portable ones all 1489).
        let dense = Parts::rows("dense", 4096, 4 * 2816, 4096, true, 16 << 20).unwrap();
        assert_eq!(ranges(&dense), vec![0..1408, 1408..2816, 2816..4096]);
        let portable = Parts::rows("dense", 4096, 4 * 2816, 4096, false, 16 << 20).unwrap();
        assert_eq!(portable.ranges()[0].len(), 1489);
    }

    #[test]
    fn a_unit_over_the_limit_is_an_error_naming_the_tensor() {
        let e = Parts::experts("layers.3.experts.gate_up_proj", 128, 8 << 20, 4 << 20).unwrap_err().to_string();
        assert!(e.contains("layers.3.experts.gate_up_proj") && e.contains("one expert") && e.contains("8388608"), "{e}");
        let e = Parts::rows("embed_tokens", 512, 192, 512, false, 100).unwrap_err().to_string();
        assert!(e.contains("embed_tokens") && e.contains("one row") && e.contains("limit 100"), "{e}");
        // On the tensor cores the least part is a tile of rows.
        let e = Parts::rows("o_proj", 512, 1024, 512, true, 64 << 10).unwrap_err().to_string();
        assert!(e.contains("o_proj") && e.contains("128 rows"), "{e}");
        let e = Parts::rows("qkv", 128, 192, 64, false, 8 << 10).unwrap_err().to_string();
        assert!(e.contains("qkv") && e.contains("64 rows") && e.contains("12288"), "{e}");
    }

    #[test]
    fn a_dense_product_runs_per_part_into_its_columns() {
        // x[8, 48] · W[100, 48]ᵀ into C[8, 100] from column 3 of rows of 120, W cut at row 40.
        let p = GemmParams { c_offset: 3, c_rs: 120, ..GemmParams::linear(8, 100, 48) };
        let first = part_products(&p, 48, 0..40).unwrap();
        let second = part_products(&p, 48, 40..100).unwrap();
        assert_eq!(first, vec![GemmParams { n: 40, ..p }]);
        assert_eq!(second, vec![GemmParams { n: 60, b_offset: 0, c_offset: 43, ..p }]);
        // Whole-row strides only.
        assert_eq!(part_products(&GemmParams { b_offset: 5, ..p }, 48, 0..40), None);
        assert_eq!(part_products(&GemmParams::new(8, 100, 48), 48, 0..40), None);
    }

    #[test]
    fn batched_blocks_run_as_runs_of_whole_batches() {
        // q/K/V: 6 blocks of 32 rows of 48; the product of blocks 1..5 (`batch` 4 from row 32),
        // parts of two blocks: blocks 0-1, 2-3, 4-5.
        let (m, rows, h) = (8u32, 32u32, 48u32);
        let p =
            GemmParams { batch: 4, b_offset: rows * h, b_batch: rows * h, c_batch: m * rows, a_batch: 0, ..GemmParams::linear(m, rows, h) };
        let parts: Vec<Vec<GemmParams>> = [0..64, 64..128, 128..192].into_iter().map(|r| part_products(&p, 48, r).unwrap()).collect();
        assert_eq!(parts[0], vec![GemmParams { batch: 1, b_offset: rows * h, ..p }]);
        assert_eq!(parts[1], vec![GemmParams { batch: 2, b_offset: 0, c_offset: m * rows, ..p }]);
        assert_eq!(parts[2], vec![GemmParams { batch: 1, b_offset: 0, c_offset: 3 * m * rows, ..p }]);
        // Every output element is computed once: the batches and columns add up.
        let covered: u32 = parts.iter().flatten().map(|q| q.batch * q.n).sum();
        assert_eq!(covered, p.batch * p.n);
    }

    #[test]
    fn a_batch_cut_by_a_part_boundary_runs_each_side_on_its_own() {
        let p = GemmParams { batch: 2, b_batch: 10 * 4, c_batch: 2 * 10, a_batch: 0, ..GemmParams::linear(2, 10, 4) };
        // Rows 0..20 cut at 15: batch 0 whole in the first part, batch 1 split 10..15 | 15..20.
        let first = part_products(&p, 4, 0..15).unwrap();
        assert_eq!(first, vec![GemmParams { batch: 1, ..p }, GemmParams { n: 5, batch: 1, b_offset: 40, c_offset: 20, ..p }]);
        let second = part_products(&p, 4, 15..20).unwrap();
        assert_eq!(second, vec![GemmParams { n: 5, batch: 1, b_offset: 0, c_offset: 25, ..p }]);
    }
}

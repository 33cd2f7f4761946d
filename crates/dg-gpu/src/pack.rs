//! Host packing of stored checkpoint tensors into the device's weight formats, piece by piece.
//!
//! A [`Packing`] describes one device buffer: the stored tensors it stacks by rows (q, K and V,
//! or gate and up), the [`WeightFormat`] it holds and the element order (PyTorch's row-major, or
//! the K panels the tensor-core kernels stream). [`Packing::fill`] converts any run of the
//! buffer's elements straight from the stored bytes (BF16 → BF16 and F16 → F16 are copies;
//! every other pair goes through f32 with the same round-to-nearest-even as
//! `dg_kernels::pack_bf16`/`pack_f16`), so an upload never holds an f32 copy of a tensor, only
//! the piece being written. A quantized format's buffer is the parts' ggml blocks as stored,
//! concatenated (rows are whole blocks, so stacking rows stacks blocks), or in K panels one block
//! wide: each `[rows, cols]` matrix's blocks as `[cols / block][rows]` (block `p` of every row,
//! then block `p + 1`), each 8 of them in planes (`dg_kernels::format::PLANE_GROUP`), which the
//! tensor-core kernels stream as they stream F16 panels.

use dg_kernels::WeightFormat;
use dg_kernels::format::{MAX_GROUP_BYTES, PLANE_GROUP, QuantFormat};
use dg_model::{StoredDtype, StoredTensor};
use rayon::prelude::*;

/// The device format of `dtype`'s ggml blocks, which the kernels read as stored (every block
/// type dg-model reads); `None` for the floating-point dtypes.
pub fn quant_format(dtype: StoredDtype) -> Option<QuantFormat> {
    use QuantFormat as Q;
    use StoredDtype as S;
    Some(match dtype {
        S::F32 | S::F16 | S::BF16 => return None,
        S::Q8_0 => Q::Q8_0,
        S::Q5_0 => Q::Q5_0,
        S::Q4_K => Q::Q4_K,
        S::Q6_K => Q::Q6_K,
        S::Q4_0 => Q::Q4_0,
        S::Q4_1 => Q::Q4_1,
        S::Q5_1 => Q::Q5_1,
        S::Q2_K => Q::Q2_K,
        S::Q3_K => Q::Q3_K,
        S::Q5_K => Q::Q5_K,
        S::IQ2_XXS => Q::IQ2_XXS,
        S::IQ2_XS => Q::IQ2_XS,
        S::IQ3_XXS => Q::IQ3_XXS,
        S::IQ1_S => Q::IQ1_S,
        S::IQ4_NL => Q::IQ4_NL,
        S::IQ3_S => Q::IQ3_S,
        S::IQ2_S => Q::IQ2_S,
        S::IQ4_XS => Q::IQ4_XS,
        S::IQ1_M => Q::IQ1_M,
        S::MXFP4 => Q::MXFP4,
        S::NVFP4 => Q::NVFP4,
    })
}

/// Elements one parallel task converts (a multiple of every panel width).
const TASK: usize = 1 << 16;

/// How a buffer orders a matrix's elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// The stacked tensors' own row-major order.
    RowMajor,
    /// Each block of `rows` rows of `cols` columns as `[cols / panel][rows][panel]`
    /// (`dg_kernels::coop_grouped_gemm::pack_f16_panels`, block after block).
    KPanels { rows: usize, cols: usize, panel: usize },
}

/// One device buffer's worth of stored tensors, stacked by rows, in a format and order.
#[derive(Debug)]
pub struct Packing<'t, 'a> {
    parts: Vec<&'t StoredTensor<'a>>,
    /// First element of each part in the stacked tensor, and one past the last.
    starts: Vec<usize>,
    pub format: WeightFormat,
    pub order: Order,
    /// Set when a finite value became ±∞ in `format` (F16 past ±65504): [`Packing::overflowed`].
    overflow: std::sync::atomic::AtomicBool,
}

impl<'t, 'a> Packing<'t, 'a> {
    /// `parts` stacked in order, stored as `format` in `order`.
    ///
    /// # Panics
    /// When a K-panel order does not tile the stacked elements (the planner only asks for panels
    /// where whole blocks of whole panels fit), or a quantized format is asked of parts that do
    /// not store it, or in K panels other than one block wide (the upload keeps quantized parts
    /// in their blocks).
    pub fn new(parts: Vec<&'t StoredTensor<'a>>, format: WeightFormat, order: Order) -> Self {
        if let WeightFormat::Quantized(q) = format {
            if let Order::KPanels { panel, rows, .. } = order {
                assert_eq!(panel, q.block_len(), "{} blocks are panelled one block wide", q.name());
                assert!(
                    !q.planes() || rows.is_multiple_of(PLANE_GROUP),
                    "{} panels of {rows} rows are not whole groups of planes",
                    q.name()
                );
            }
            assert!(parts.iter().all(|p| p.dtype.name() == q.name()), "{} packing of parts that store other types", q.name());
        }
        let mut starts = vec![0];
        for p in &parts {
            starts.push(starts.last().unwrap() + p.len());
        }
        let packing = Packing { parts, starts, format, order, overflow: false.into() };
        if let Order::KPanels { rows, cols, panel } = order {
            let block = rows * cols;
            assert!(panel > 0 && cols.is_multiple_of(panel) && TASK.is_multiple_of(panel), "K panels of {panel} for {cols} columns");
            assert!(
                block > 0 && packing.len().is_multiple_of(block),
                "{} elements are not whole blocks of [{rows}, {cols}]",
                packing.len()
            );
        }
        packing
    }

    /// Elements in the buffer.
    pub fn len(&self) -> usize {
        *self.starts.last().unwrap()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes the stacked tensors take in their stored dtypes.
    pub fn stored_bytes(&self) -> usize {
        self.parts.iter().map(|p| p.byte_len()).sum()
    }

    /// Bytes of one element in the buffer.
    pub fn element_bytes(&self) -> usize {
        self.format.bytes()
    }

    /// The buffer's size: every element (or block), padded to whole 4-byte words, then a
    /// quantized type's table (`QuantFormat::table`: the IQ grids its loader reads from the end).
    pub fn bytes(&self) -> usize {
        self.blocks_end() + 4 * self.table().len()
    }

    /// Where the elements and their padding end.
    fn blocks_end(&self) -> usize {
        self.format.bytes_for(self.len()).expect("stored tensors hold whole blocks").next_multiple_of(4)
    }

    /// The words after the padded elements.
    fn table(&self) -> &'static [u32] {
        match self.format {
            WeightFormat::Quantized(q) => q.table(),
            _ => &[],
        }
    }

    /// Whether a finite stored value has become ±∞ in the buffer's format so far (F16 holds at
    /// most ±65504): the bytes written are then not the tensor, and the upload must fail.
    pub fn overflowed(&self) -> bool {
        self.overflow.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Writes the buffer's bytes `offset..offset + dst.len()` (`offset` a multiple of
    /// [`TASK`]'s bytes, as every piece of an upload is) into `dst`, in parallel; padding past
    /// the last element is zero.
    pub fn fill(&self, offset: usize, dst: &mut [u8]) {
        if self.format.is_quantized() {
            self.copy_blocks(offset, dst);
            // The table over the zeros past the blocks.
            let table: &[u8] = bytemuck::cast_slice(self.table());
            let end = self.blocks_end();
            for (i, b) in dst.iter_mut().enumerate().skip(end.saturating_sub(offset)) {
                if let Some(&t) = table.get(offset + i - end) {
                    *b = t;
                }
            }
            return;
        }
        let size = self.element_bytes();
        assert!(offset.is_multiple_of(TASK * size), "pieces start at whole tasks");
        let first = offset / size;
        dst.par_chunks_mut(TASK * size).enumerate().for_each(|(t, chunk)| {
            let start = first + t * TASK;
            let count = (chunk.len() / size).min(self.len().saturating_sub(start));
            let (elements, padding) = chunk.split_at_mut(count * size);
            self.fill_elements(start, elements);
            padding.fill(0);
        });
    }

    /// A quantized buffer's bytes `offset..`: the parts' blocks one after the other (row-major)
    /// or in panels (then in planes: every [`PLANE_GROUP`] blocks rearranged together, for the
    /// formats that have them), then zeros.
    fn copy_blocks(&self, offset: usize, dst: &mut [u8]) {
        let WeightFormat::Quantized(q) = self.format else { unreachable!("blocks of an element format") };
        let Order::KPanels { rows, cols, .. } = self.order else {
            return self.copy_stacked_bytes(offset, dst);
        };
        // Output block b is block (p, row) of matrix m; its source, block p of that row.
        let (size, per_row) = (q.block_bytes(), cols / q.block_len());
        let blocks = self.len() / q.block_len();
        let source_of = |b: usize| {
            let (m, within) = (b / (rows * per_row), b % (rows * per_row));
            (m * rows + within % rows) * per_row + within / rows
        };
        // Output group g (one block, or PLANE_GROUP of them in planes) at bytes g · group_bytes.
        let group = if q.planes() { PLANE_GROUP } else { 1 };
        let group_bytes = group * size;
        const TASK_BLOCKS: usize = 4096;
        // Task t's chunk starts at byte `start` of the buffer; it writes its part of every group
        // it overlaps (the first and last may be cut).
        dst.par_chunks_mut(TASK_BLOCKS * size).enumerate().for_each(|(t, chunk)| {
            let start = offset + t * TASK_BLOCKS * size;
            let end = start + chunk.len();
            let (mut ggml, mut out) = ([0u8; MAX_GROUP_BYTES], [0u8; MAX_GROUP_BYTES]);
            let out = &mut out[..group_bytes];
            for g in start / group_bytes..end.div_ceil(group_bytes) {
                match (g + 1) * group <= blocks {
                    true => {
                        for (i, b) in (g * group..(g + 1) * group).enumerate() {
                            ggml[i * size..(i + 1) * size].copy_from_slice(self.stacked_block(source_of(b)));
                        }
                        match q.planes() {
                            true => q.to_planes(&ggml[..group_bytes], out),
                            false => out.copy_from_slice(&ggml[..group_bytes]),
                        }
                    }
                    false => out.fill(0),
                }
                let (lo, hi) = ((g * group_bytes).max(start), ((g + 1) * group_bytes).min(end));
                chunk[lo - start..hi - start].copy_from_slice(&out[lo - g * group_bytes..hi - g * group_bytes]);
            }
        });
    }

    /// Block `b` of the stacked parts (within one part: rows are whole blocks).
    fn stacked_block(&self, b: usize) -> &[u8] {
        let WeightFormat::Quantized(q) = self.format else { unreachable!("blocks of an element format") };
        let element = b * q.block_len();
        let part = self.starts.partition_point(|&s| s <= element) - 1;
        let local = (element - self.starts[part]) / q.block_len();
        &self.parts[part].bytes()[local * q.block_bytes()..(local + 1) * q.block_bytes()]
    }

    /// The parts' bytes `offset..` one after the other, then zeros.
    fn copy_stacked_bytes(&self, mut offset: usize, mut dst: &mut [u8]) {
        for part in &self.parts {
            let bytes = part.bytes();
            if offset >= bytes.len() {
                offset -= bytes.len();
                continue;
            }
            let n = dst.len().min(bytes.len() - offset);
            let (now, rest) = dst.split_at_mut(n);
            now.copy_from_slice(&bytes[offset..offset + n]);
            (offset, dst) = (0, rest);
        }
        dst.fill(0);
    }

    /// Buffer elements `start..start + dst.len() / size` into `dst`, run by contiguous run of
    /// the stacked source.
    fn fill_elements(&self, start: usize, dst: &mut [u8]) {
        let size = self.element_bytes();
        let mut o = 0;
        let count = dst.len() / size;
        while o < count {
            let (source, run) = match self.order {
                Order::RowMajor => (start + o, count - o),
                Order::KPanels { rows, cols, panel } => {
                    let e = start + o;
                    let (block, within) = (e / (rows * cols), e % (rows * cols));
                    let (p, in_panel) = (within / (rows * panel), within % (rows * panel));
                    let (row, j) = (in_panel / panel, in_panel % panel);
                    ((block * rows + row) * cols + p * panel + j, (panel - j).min(count - o))
                }
            };
            self.convert(source, &mut dst[o * size..(o + run) * size]);
            o += run;
        }
    }

    /// Stacked source elements `source..` converted into `dst` (a whole number of elements).
    fn convert(&self, mut source: usize, mut dst: &mut [u8]) {
        let size = self.element_bytes();
        while !dst.is_empty() {
            let part = self.starts.partition_point(|&s| s <= source) - 1;
            let local = source - self.starts[part];
            let n = (dst.len() / size).min(self.starts[part + 1] - source);
            let (now, rest) = dst.split_at_mut(n * size);
            if convert_run(self.parts[part], local, self.format, now) {
                self.overflow.store(true, std::sync::atomic::Ordering::Relaxed);
            }
            (source, dst) = (source + n, rest);
        }
    }
}

/// Elements `start..` of `t` (as many as `dst` holds) in `format`, little-endian; true when a
/// finite value is beyond the largest finite value of `format` (F16: it became ±∞).
fn convert_run(t: &StoredTensor, start: usize, format: WeightFormat, dst: &mut [u8]) -> bool {
    let same = matches!(
        (t.dtype, format),
        (StoredDtype::F32, WeightFormat::F32) | (StoredDtype::BF16, WeightFormat::Bf16) | (StoredDtype::F16, WeightFormat::F16)
    );
    if same {
        let size = t.dtype.size();
        dst.copy_from_slice(&t.bytes()[start * size..start * size + dst.len()]);
        return false;
    }
    const BATCH: usize = 1024;
    let mut wide = [0f32; BATCH];
    let size = format.bytes();
    let mut overflow = false;
    for (b, out) in dst.chunks_mut(BATCH * size).enumerate() {
        let wide = &mut wide[..out.len() / size];
        t.widen_range(start + b * BATCH, wide);
        if format == WeightFormat::F16 {
            overflow |= wide.iter().any(|v| v.is_finite() && v.abs() >= F16_OVERFLOW);
        }
        format.encode(wide, out);
    }
    overflow
}

/// The smallest magnitude f16 rounds to ±∞: 65504 (the largest f16) plus half its ulp of 32
/// (the tie rounds to even, which is ∞ past 65504's odd mantissa).
const F16_OVERFLOW: f32 = 65520.0;

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, seed: f32) -> Vec<f32> {
        (0..n).map(|i| ((i as f32 * 0.37 + seed).sin() * 3.0) + 1.0e-6 * i as f32).collect()
    }

    fn stored(dtype: StoredDtype, shape: Vec<usize>, v: &[f32]) -> StoredTensor<'static> {
        let bytes: Vec<u8> = match dtype {
            StoredDtype::F32 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            StoredDtype::BF16 => v.iter().flat_map(|&x| half::bf16::from_f32(x).to_le_bytes()).collect(),
            StoredDtype::F16 => v.iter().flat_map(|&x| half::f16::from_f32(x).to_le_bytes()).collect(),
            q => dg_model::quantize(q, v).expect("whole blocks of finite values"),
        };
        StoredTensor::from_bytes(dtype, shape, bytes)
    }

    /// All of a packing's bytes, written in pieces of `piece` bytes as an upload does.
    fn packed(p: &Packing, piece: usize) -> Vec<u8> {
        let mut out = vec![0xAA; p.bytes()];
        for (i, chunk) in out.chunks_mut(piece).enumerate() {
            p.fill(i * piece, chunk);
        }
        out
    }

    fn words(bytes: &[u8]) -> Vec<u32> {
        bytes.chunks_exact(4).map(|b| u32::from_le_bytes(b.try_into().unwrap())).collect()
    }

    /// Every (stored dtype, format) pair gives the words the f32 path's packers give for the
    /// widened values, also for an odd element count split across two stacked parts and pieces.
    #[test]
    fn row_major_packing_equals_packing_the_widened_values() {
        let (a, b) = (values(3 * 5, 0.1), values(2 * 5, 0.7));
        for dtype in [StoredDtype::F32, StoredDtype::BF16, StoredDtype::F16] {
            let (ta, tb) = (stored(dtype, vec![3, 5], &a), stored(dtype, vec![2, 5], &b));
            let wide = [ta.to_f32(), tb.to_f32()].concat();
            for format in [WeightFormat::F32, WeightFormat::Bf16, WeightFormat::F16] {
                let p = Packing::new(vec![&ta, &tb], format, Order::RowMajor);
                let want = match format {
                    WeightFormat::F32 => wide.iter().map(|v| v.to_bits()).collect(),
                    WeightFormat::Bf16 => dg_kernels::pack_bf16(&wide),
                    WeightFormat::F16 => dg_kernels::pack_f16(&wide),
                    WeightFormat::Quantized(_) => unreachable!("element formats only"),
                };
                assert_eq!(words(&packed(&p, 1 << 20)), want, "{dtype:?} → {format:?}");
            }
        }
    }

    #[test]
    fn f16_packing_reports_finite_values_that_become_infinite() {
        // 65519 rounds to 65504, 65520 (the tie) to ∞; ±∞ and NaN are stored as they are.
        for (v, overflows) in [
            (65504.0, false),
            (65519.0, false),
            (-65519.0, false),
            (65520.0, true),
            (-1e6, true),
            (f32::INFINITY, false),
            (f32::NAN, false),
        ] {
            let mut values = values(4 * 8, 0.3);
            values[13] = v;
            for dtype in [StoredDtype::F32, StoredDtype::BF16] {
                let t = stored(dtype, vec![4, 8], &values);
                let held = t.to_f32()[13];
                for order in [Order::RowMajor, Order::KPanels { rows: 4, cols: 8, panel: 8 }] {
                    let p = Packing::new(vec![&t], WeightFormat::F16, order);
                    packed(&p, 1 << 20);
                    // BF16 rounds the value first (65504 to 65536, which overflows).
                    let want = if dtype == StoredDtype::F32 { overflows } else { held.is_finite() && held.abs() >= 65520.0 };
                    assert_eq!(p.overflowed(), want, "{v} stored as {dtype:?} ({held}), {order:?}");
                }
                let p = Packing::new(vec![&t], WeightFormat::Bf16, Order::RowMajor);
                packed(&p, 1 << 20);
                assert!(!p.overflowed(), "BF16 holds f32's range");
            }
        }
    }

    #[test]
    fn k_panels_equal_the_f32_panel_packer_per_block() {
        let (rows, cols, panel) = (6, 64, 32);
        let (q, k) = (values(2 * rows * cols, 0.3), values(rows * cols, 0.9));
        let (tq, tk) = (stored(StoredDtype::BF16, vec![2 * rows, cols], &q), stored(StoredDtype::BF16, vec![rows, cols], &k));
        let wide = [tq.to_f32(), tk.to_f32()].concat();
        let want: Vec<u32> =
            wide.chunks(rows * cols).flat_map(|block| dg_kernels::coop_grouped_gemm::pack_f16_panels(block, rows, cols, panel)).collect();
        let p = Packing::new(vec![&tq, &tk], WeightFormat::F16, Order::KPanels { rows, cols, panel });
        assert_eq!(words(&packed(&p, TASK * 2)), want);
    }

    #[test]
    fn pieces_of_several_tasks_give_the_same_bytes() {
        let v = values(3 * TASK + 7, 0.5);
        let t = stored(StoredDtype::F32, vec![v.len()], &v);
        let p = Packing::new(vec![&t], WeightFormat::Bf16, Order::RowMajor);
        assert_eq!(packed(&p, TASK * 2), packed(&p, p.bytes()));
        assert_eq!(words(&packed(&p, TASK * 2)), dg_kernels::pack_bf16(&v));
    }

    /// Quantized parts keep their blocks: the buffer is their bytes one after the other, whatever
    /// the pieces, then zero padding to a whole word.
    #[test]
    fn quantized_parts_are_their_blocks_concatenated() {
        let (a, b) = (values(2 * 32, 0.3), values(32, 0.9));
        let (ta, tb) = (stored(StoredDtype::Q8_0, vec![2, 32], &a), stored(StoredDtype::Q8_0, vec![1, 32], &b));
        let p = Packing::new(vec![&ta, &tb], WeightFormat::Quantized(dg_kernels::format::QuantFormat::Q8_0), Order::RowMajor);
        let mut want = [ta.bytes(), tb.bytes()].concat();
        assert_eq!(want.len(), 3 * 34);
        want.resize(104, 0);
        assert_eq!(p.bytes(), 104);
        for piece in [4, 8, 1 << 20] {
            let mut out = vec![0xAA; p.bytes()];
            for (i, chunk) in out.chunks_mut(piece).enumerate() {
                p.copy_blocks(i * piece, chunk);
            }
            assert_eq!(out, want, "pieces of {piece}");
        }
    }

    /// `bytes` (a quantized buffer in K panels) with every group of planes back in ggml's order.
    fn from_planes(q: dg_kernels::format::QuantFormat, bytes: &[u8]) -> Vec<u8> {
        let group = PLANE_GROUP * q.block_bytes();
        let whole = bytes.len() / group * group;
        let mut out = bytes.to_vec();
        for (src, dst) in bytes[..whole].chunks_exact(group).zip(out[..whole].chunks_exact_mut(group)) {
            q.from_planes(src, dst);
        }
        out
    }

    #[test]
    fn quantized_panels_put_block_p_of_every_row_together_in_planes() {
        use dg_kernels::format::QuantFormat;
        for (q, dtype) in
            [(QuantFormat::Q5_0, StoredDtype::Q5_0), (QuantFormat::Q4_K, StoredDtype::Q4_K), (QuantFormat::Q6_K, StoredDtype::Q6_K)]
        {
            // Two stacked parts making two [8, 3 blocks] matrices.
            let cols = 3 * q.block_len();
            let (a, b) = (values(10 * cols, 0.1), values(6 * cols, 0.7));
            let (ta, tb) = (stored(dtype, vec![10, cols], &a), stored(dtype, vec![6, cols], &b));
            let order = Order::KPanels { rows: 8, cols, panel: q.block_len() };
            let p = Packing::new(vec![&ta, &tb], WeightFormat::Quantized(q), order);
            let size = q.block_bytes();
            let stacked = [ta.bytes(), tb.bytes()].concat();
            let block = |row: usize, j: usize| &stacked[(row * 3 + j) * size..(row * 3 + j + 1) * size];
            let mut want = Vec::new();
            for m in 0..2 {
                for j in 0..3 {
                    for row in 0..8 {
                        want.extend_from_slice(block(m * 8 + row, j));
                    }
                }
            }
            want.resize(p.bytes(), 0);
            for piece in [4, 8, 44, 1 << 20] {
                let mut out = vec![0xAA; p.bytes()];
                for (i, chunk) in out.chunks_mut(piece).enumerate() {
                    p.copy_blocks(i * piece, chunk);
                }
                assert_eq!(from_planes(q, &out), want, "{q:?}: pieces of {piece}");
                assert_eq!(out != want, q.planes(), "{q:?}: in planes exactly where the format has them");
            }
        }
    }

    #[test]
    fn every_block_dtype_maps_to_the_device_format_of_its_ggml_type() {
        for dtype in StoredDtype::ALL {
            match quant_format(dtype) {
                Some(q) => {
                    assert_eq!((q.name(), q.block_len(), q.block_bytes()), (dtype.name(), dtype.block_len(), dtype.block_bytes()));
                }
                None => assert!(!dtype.is_quantized(), "{dtype:?} has no device format"),
            }
        }
        for q in QuantFormat::ALL {
            assert!(StoredDtype::ALL.into_iter().any(|d| quant_format(d) == Some(q)), "no dtype stores {q:?}");
        }
    }

    #[test]
    fn an_iq_buffer_holds_its_grid_after_its_blocks() {
        use dg_kernels::format::QuantFormat;
        let q = QuantFormat::IQ1_S;
        // 3 rows of 2 blocks (300 bytes, a whole number of words), any bytes.
        let bytes: Vec<u8> = (0..300).map(|i| (i * 7 % 251) as u8).collect();
        let t = StoredTensor::from_bytes(StoredDtype::IQ1_S, vec![3, 512], &bytes);
        for order in [Order::RowMajor, Order::KPanels { rows: 3, cols: 512, panel: 256 }] {
            let p = Packing::new(vec![&t], WeightFormat::Quantized(q), order);
            assert_eq!(p.bytes(), 300 + 4 * q.table().len(), "{order:?}");
            for piece in [4, 44, 1 << 20] {
                let mut out = vec![0xAA; p.bytes()];
                for (i, chunk) in out.chunks_mut(piece).enumerate() {
                    p.fill(i * piece, chunk);
                }
                assert_eq!(&out[300..], bytemuck::cast_slice::<u32, u8>(q.table()), "{order:?}: pieces of {piece}");
                if order == Order::RowMajor {
                    assert_eq!(&out[..300], &bytes[..], "pieces of {piece}");
                }
            }
        }
    }

    #[test]
    fn quantized_panels_across_parallel_tasks_equal_one_piece() {
        use dg_kernels::format::QuantFormat;
        // 72 rows of 64 Q8_0 blocks: 4608 blocks, more than one parallel task's; pieces that start
        // inside a block and a group and span task boundaries.
        let v = values(72 * 64 * 32, 0.4);
        let t = stored(StoredDtype::Q8_0, vec![72, 64 * 32], &v);
        let order = Order::KPanels { rows: 72, cols: 64 * 32, panel: 32 };
        let p = Packing::new(vec![&t], WeightFormat::Quantized(QuantFormat::Q8_0), order);
        let mut whole = vec![0xAA; p.bytes()];
        p.copy_blocks(0, &mut whole);
        // Block (j, p) of the row-major source lands at p · 72 + j.
        let blocks = from_planes(QuantFormat::Q8_0, &whole);
        assert_eq!(&blocks[(5 * 72 + 3) * 34..(5 * 72 + 4) * 34], &t.bytes()[(3 * 64 + 5) * 34..(3 * 64 + 6) * 34]);
        for piece in [4099 * 34 + 5, 1 << 17] {
            let mut out = vec![0xAA; p.bytes()];
            for (i, chunk) in out.chunks_mut(piece).enumerate() {
                p.copy_blocks(i * piece, chunk);
            }
            assert!(out == whole, "pieces of {piece}");
        }
    }
}

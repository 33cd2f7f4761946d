//! The matrix products a [`Recorder`] records: dense and batched products (`dg_kernels::gemm`,
//! on the tensor cores through `dg_kernels::coop_gemm` where the planner says so, split K where it
//! pays), the experts' grouped products (`dg_kernels::grouped_gemm`, `coop_grouped_gemm`, `native_grouped_gemm`), and
//! weights split across bindings (`crate::parts`) run part by part. The operands' types: a
//! weight as stored ([`Operand`]) and a product's output as its consumer reads it ([`Product`]).

use dg_kernels::coop_gemm::AFormat;
use dg_kernels::gemm::{self, GemmParams};
use dg_kernels::grouped_gemm::{self, GroupedGemmParams};
use dg_kernels::{KernelKey as K, WeightFormat, coop_gemm, coop_grouped_gemm, native_grouped_gemm, native_int8_gemm, split_k};

use super::Recorder;
use crate::error::GpuError;
use crate::parts::{SplitMatrix, part_products};
use crate::planner::{BSource, CoopPlan, Dense, Grouped, NoKernel};
use crate::weights::{GpuMatrix, MatrixLayout};

/// Where a consumer kernel reads a product: the buffer that holds it whole, or the split-K
/// scratch holding `splits` partials `split_stride` elements apart, laid out as the product
/// itself (`[batch][m][n]` from element 0), which the consumer adds up as it reads
/// (`dg_kernels::split_k::with_reader`) instead of a reduction dispatch writing the product first.
#[derive(Debug, Clone, Copy)]
pub struct Product<'a> {
    pub buffer: &'a wgpu::Buffer,
    /// 1: the product whole; more: partials to add.
    pub splits: u32,
    pub split_stride: u32,
}

impl<'a> From<&'a wgpu::Buffer> for Product<'a> {
    fn from(buffer: &'a wgpu::Buffer) -> Self {
        Product { buffer, splits: 1, split_stride: 0 }
    }
}

/// A matrix operand as stored: its buffer, element format and what it is (a weight in its layout,
/// or the KV cache; offsets and strides of a product's parameters count elements whatever the
/// format); a weight split across bindings also names its parts, and its products run per part.
#[derive(Debug, Clone, Copy)]
pub struct Operand<'a> {
    pub buffer: &'a wgpu::Buffer,
    pub format: WeightFormat,
    pub source: BSource,
    /// The weight's parts, where it has more than one (`buffer` is then its first).
    pub split: Option<&'a SplitMatrix>,
}

impl<'a> Operand<'a> {
    /// `buffer` holding row-major values stored as `format`.
    pub fn stored(buffer: &'a wgpu::Buffer, format: WeightFormat) -> Self {
        Operand { buffer, format, source: BSource::Weight(MatrixLayout::RowMajor), split: None }
    }

    /// The KV cache's keys or values in `buffer`, row-major, stored as `format`.
    pub fn kv_cache(buffer: &'a wgpu::Buffer, format: WeightFormat) -> Self {
        Operand { source: BSource::KvCache, ..Operand::stored(buffer, format) }
    }
}

impl<'a> From<&'a wgpu::Buffer> for Operand<'a> {
    /// Row-major f32 values.
    fn from(buffer: &'a wgpu::Buffer) -> Self {
        Operand::stored(buffer, WeightFormat::F32)
    }
}

impl<'a> From<&'a GpuMatrix> for Operand<'a> {
    fn from(m: &'a GpuMatrix) -> Self {
        Operand { buffer: &m.buffer, format: m.format, source: m.layout.into(), split: None }
    }
}

impl<'a> From<&'a SplitMatrix> for Operand<'a> {
    fn from(m: &'a SplitMatrix) -> Self {
        Operand { split: m.is_split().then_some(m), ..Operand::from(&m.pieces[0]) }
    }
}

impl<'a> Recorder<'a> {
    /// `c = a · b` with the strides, batches, accumulate and epilogue of `p` (see
    /// `dg_kernels::gemm`; offsets and strides in elements whatever B's format), B as stored (an
    /// uploaded [`GpuMatrix`] or [`SplitMatrix`], or any buffer through [`Operand`]), and C whole. How it runs is the
    /// planner's choice ([`crate::planner::Planner::dense`]): with `tensor_cores` (the F16 mode) on a device with
    /// cooperative matrices, on the tensor cores where a tile takes the product (A and B rounded to
    /// f16 when staged, f32 accumulation; the KV cache with ragged columns as a tensor-core body
    /// and a portable tail), else the portable GEMM. B in K panels that no tensor-core tile takes is an
    /// error, never a misread.
    pub fn product(
        &mut self,
        a: &'a wgpu::Buffer,
        b: impl Into<Operand<'a>>,
        c: &'a wgpu::Buffer,
        p: GemmParams,
        tensor_cores: bool,
    ) -> Result<(), GpuError> {
        self.dense(a, b.into(), c, p, tensor_cores, false).map(|_| ())
    }

    /// [`Self::product`] for a consumer that reads its output through a [`Product`]: where the
    /// tensor-core GEMM splits K, only the partials are written and returned (the consumer adds
    /// them as it reads, no reduction dispatch), otherwise `c` is. The partials live in the
    /// recorder's split-K scratch, which the next split product overwrites: record the product's
    /// consumers before it.
    pub fn product_to_consumer(
        &mut self,
        a: &'a wgpu::Buffer,
        b: impl Into<Operand<'a>>,
        c: &'a wgpu::Buffer,
        p: GemmParams,
        tensor_cores: bool,
    ) -> Result<Product<'a>, GpuError> {
        self.dense(a, b.into(), c, p, tensor_cores, true)
    }

    /// [`Self::product`]; with `defer`, a split product whose partials are laid out as its C (a
    /// plain product into a contiguous `[batch][m][n]`) is left unreduced and returned as such.
    fn dense(
        &mut self,
        a: &'a wgpu::Buffer,
        b: Operand<'a>,
        c: &'a wgpu::Buffer,
        p: GemmParams,
        tensor_cores: bool,
        defer: bool,
    ) -> Result<Product<'a>, GpuError> {
        if let Some(w) = b.split {
            return self.dense_parts(a, w, c, p, tensor_cores);
        }
        match self.planner().dense(b.format, b.source, &self.planned(&p), tensor_cores, self.split_scratch_len()).map_err(unsupported)? {
            Dense::TensorCores(plan) => self.coop_product(a, b, c, p, plan, defer),
            Dense::BodyAndTail { n_body } => {
                self.dense(a, b, c, GemmParams { n: n_body, ..p }, true, false)?;
                let tail = GemmParams { n: p.n - n_body, b_offset: p.b_offset + n_body * p.b_cs, c_offset: p.c_offset + n_body, ..p };
                self.dense(a, b, c, tail, false, false)
            }
            Dense::Portable { tile } => {
                self.push(K::Gemm { tile, w: b.format }, &p, &[a, b.buffer, c], gemm::workgroups(tile, p.m, p.n, p.batch))?;
                Ok(c.into())
            }
        }
    }

    /// [`Self::dense`] over a weight split by rows ([`SplitMatrix`]): B must read `W[n][k]` rows
    /// (`b_rs` 1, `b_cs` the rows' length, offsets at whole rows, one B batch per batch); per
    /// part, the batches whose rows lie in it run as one product, and a batch cut by a part
    /// boundary runs the part's columns on their own, into those columns of C. Where the whole
    /// product runs on the portable GEMM, every part takes its tile (the same arithmetic per
    /// element, so the results are the unsplit product's bit for bit); on the tensor cores each
    /// part is planned on its own (parts of whole tiles, [`crate::parts::COOP_PART_ROWS`]). C is
    /// always written whole (no deferred split-K partials).
    fn dense_parts(
        &mut self,
        a: &'a wgpu::Buffer,
        w: &'a SplitMatrix,
        c: &'a wgpu::Buffer,
        p: GemmParams,
        tensor_cores: bool,
    ) -> Result<Product<'a>, GpuError> {
        let whole =
            self.planner().dense(w.format, w.layout, &self.planned(&p), tensor_cores, self.split_scratch_len()).map_err(unsupported)?;
        for (range, piece) in w.parts.ranges().iter().zip(&w.pieces) {
            let products = part_products(&p, w.unit_elems, range.clone()).ok_or_else(|| GpuError::Unsupported {
                what: format!(
                    "a product over a weight split across {} bindings that does not read whole rows of {} (b_offset {} b_rs {} b_cs {} b_batch {} b_batch_div {})",
                    w.parts.len(),
                    w.unit_elems,
                    p.b_offset,
                    p.b_rs,
                    p.b_cs,
                    p.b_batch,
                    p.b_batch_div
                ),
            })?;
            for q in products {
                match whole {
                    Dense::Portable { tile } => {
                        let g = gemm::workgroups(tile, q.m, q.n, q.batch);
                        self.push(K::Gemm { tile, w: w.format }, &q, &[a, &piece.buffer, c], g)?;
                    }
                    _ => {
                        self.dense(a, piece.into(), c, q, tensor_cores, false)?;
                    }
                }
            }
        }
        Ok(c.into())
    }

    /// `p` on the tensor cores as planned (split K into the split-K scratch where the plan says
    /// so); with `defer`, a split product whose partials are laid out as its C is left unreduced
    /// (see [`Self::dense`]).
    fn coop_product(
        &mut self,
        a: &'a wgpu::Buffer,
        b: Operand<'a>,
        c: &'a wgpu::Buffer,
        p: GemmParams,
        plan: CoopPlan,
        defer: bool,
    ) -> Result<Product<'a>, GpuError> {
        let CoopPlan { kernel, split } = plan;
        let (tile, kernel) = (kernel.tile, K::CoopGemm(kernel));
        let split = self.split_scratch.zip(split).map(|((scratch, _), split)| (scratch, split));
        let Some((scratch, split)) = split else {
            self.push(kernel, &p, &[a, b.buffer, c], coop_gemm::workgroups(tile, p.m, p.n, p.batch))?;
            return Ok(c.into());
        };
        let partial = split.partial_params(&p);
        self.push(kernel, &partial, &[a, b.buffer, scratch], coop_gemm::workgroups_split(tile, p.m, p.n, p.batch, split.splits))?;
        let plain = p.alpha == 1.0 && p.accumulate == 0 && p.epilogue == gemm::EPILOGUE_NONE;
        let as_c = p.c_offset == 0 && p.c_rs == p.n && (p.batch <= 1 || p.c_batch == p.m * p.n);
        if defer && plain && as_c {
            return Ok(Product { buffer: scratch, splits: split.splits, split_stride: partial.split_stride });
        }
        let r = split.reduce_params(&p);
        let g = self.groups(split_k::workgroups(&r));
        self.push(K::SplitK, &r, &[scratch, c], g)?;
        Ok(c.into())
    }

    /// Per-expert products over `slots` grouped slots (see `dg_kernels::grouped_gemm`), the
    /// experts `w` as stored (`b_group_stride` in elements either way) and A stored as
    /// `a_format`: experts in K panels (F16, or ggml blocks) on the tensor-core grouped GEMM,
    /// row-major ones on the portable one ([`crate::planner::Planner::grouped`]); f16 activations only for the
    /// tensor cores, anything else is [`GpuError::Unsupported`]. Experts split across bindings
    /// ([`SplitMatrix`]) run one dispatch per part of experts.
    #[allow(clippy::too_many_arguments)]
    pub fn grouped_product(
        &mut self,
        (a, a_format): (&'a wgpu::Buffer, AFormat),
        w: impl Into<Operand<'a>>,
        offsets: &'a wgpu::Buffer,
        rows: &'a wgpu::Buffer,
        c: &'a wgpu::Buffer,
        slots: usize,
        p: GroupedGemmParams,
    ) -> Result<(), GpuError> {
        let w = w.into();
        let BSource::Weight(layout) = w.source else {
            return Err(GpuError::Unsupported { what: "the KV cache as the experts' weights".into() });
        };
        let plan = match layout {
            // The tensor-core tile by the real slots: every tile gives the same bits (`tensor_cores`
            // `every_grouped_tile_gives_the_same_bits`), so a batch of canvases may take the long
            // groups' tile where one canvas takes the decoder's.
            MatrixLayout::KPanels => self.planner().grouped(w.format, layout, &p, slots as u32),
            // The portable kernel planned for the rows of `Self::plan_rows` (the slots in
            // proportion).
            MatrixLayout::RowMajor => {
                let planned_rows = self.planned_rows(p.max_rows as usize);
                let planned_slots = (slots * planned_rows).checked_div(p.max_rows as usize).unwrap_or(slots);
                let planned = GroupedGemmParams { max_rows: planned_rows as u32, ..p };
                self.planner().grouped(w.format, layout, &planned, planned_slots as u32)
            }
        }
        .map_err(unsupported)?;
        if let Grouped::Portable { .. } = plan
            && a_format != AFormat::F32
        {
            return Err(GpuError::Unsupported {
                what: format!(
                    "{a_format:?} activations for row-major experts (n {} k {}): only the tensor-core kernel reads them",
                    p.n, p.k
                ),
            });
        }
        let Some(split) = w.split else {
            return self.grouped_planned((a, a_format), w.buffer, w.format, (offsets, rows, c), p, plan);
        };
        // Experts split across bindings: the whole product's plan per part of experts, each
        // reading its experts' offsets from the part's first (no tile table: it lists every
        // expert's tiles), the same arithmetic per slot as unsplit.
        for (range, piece) in split.parts.ranges().iter().zip(&split.pieces) {
            let q = GroupedGemmParams { groups: range.len() as u32, first_group: range.start as u32, tiles: 0, ..p };
            self.grouped_planned((a, a_format), &piece.buffer, split.format, (offsets, rows, c), q, plan)?;
        }
        Ok(())
    }

    /// [`Self::grouped_product`] of `p` on experts `w` stored as `format`, as `plan` says.
    fn grouped_planned(
        &mut self,
        (a, a_format): (&'a wgpu::Buffer, AFormat),
        w: &'a wgpu::Buffer,
        format: WeightFormat,
        (offsets, rows, c): (&'a wgpu::Buffer, &'a wgpu::Buffer, &'a wgpu::Buffer),
        p: GroupedGemmParams,
        plan: Grouped,
    ) -> Result<(), GpuError> {
        match plan {
            Grouped::Portable { tile } => {
                let g = grouped_gemm::workgroups(tile, p.n, p.max_rows, p.groups);
                self.push(K::GroupedGemm { tile, w: format }, &p, &[a, w, offsets, rows, c], g)
            }
            Grouped::TensorCores { tile, path } => {
                let p = coop_grouped_gemm::params_for(tile, &p);
                self.push(
                    K::CoopGroupedGemm { tile, path, w: format, a: a_format },
                    &p,
                    &[a, w, offsets, rows, c],
                    coop_grouped_gemm::workgroups(tile, &p),
                )
            }
            Grouped::Native { shape } => {
                let p = native_grouped_gemm::params_for(&p);
                let key = K::NativeGroupedGemm { shape, w: format, a: a_format };
                self.push(key, &p, &[a, w, offsets, rows, c], native_grouped_gemm::workgroups(shape, &p))
            }
            Grouped::NativeInt8 { shape } => {
                let p = native_grouped_gemm::params_for(&p);
                let key = K::NativeInt8GroupedGemm { shape, w: format, a: a_format };
                self.push(key, &p, &[a, w, offsets, rows, c], native_int8_gemm::workgroups(shape, &p))
            }
        }
    }
}

/// A product the planner finds no kernel for, as the GPU backend reports it.
fn unsupported(e: NoKernel) -> GpuError {
    GpuError::Unsupported { what: e.0 }
}

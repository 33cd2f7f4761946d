//! Typed recording of kernel dispatches: one method per op, hiding parameter structs, variant
//! choice and workgroup counts. Everything recorded lands in one [`Plan`].

use dg_kernels::coop_gemm::AFormat;
use dg_kernels::gemm::{self, GemmParams};
use dg_kernels::grouped_gemm::{self, GroupedGemmParams};
use dg_kernels::sample_rows::{self, SampleRowsParams};
use dg_kernels::{
    KernelKey, KernelKey as K, Lanes, WeightFormat, axpby, coop_gemm, coop_grouped_gemm, embed, gelu_glu, moe_combine, moe_dispatch,
    residual_norms, rmsnorm, rope, router_topk, softmax, softmax_chunked, split_k,
};

use crate::context::GpuContext;
use crate::error::GpuError;
use crate::parts::{SplitMatrix, part_products};
use crate::plan::{Pipelines, Plan, PlanBuilder, groups_1d};
use crate::planner::{CoopPlan, Dense, Grouped, NoKernel, Planner};
use crate::tuning::{RowLanes, Tuning};
use crate::weights::{GpuMatrix, MatrixLayout};

/// Records dispatches into a plan.
pub struct Recorder<'a> {
    ctx: &'a GpuContext,
    pipelines: &'a mut Pipelines,
    plan: PlanBuilder<'a>,
    scope: String,
    /// Scratch for split-K partial products and its length in f32 elements (none: no split).
    split_scratch: Option<(&'a wgpu::Buffer, u64)>,
}

impl std::fmt::Debug for Recorder<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder").field("plan", &self.plan).finish()
    }
}

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

/// The experts' outputs a MoE combine sums into a token's row (see [`Recorder::moe_combine`]):
/// `y` (`[slots, H]`, by slot), `idx`, `weights` and `slot_of` (`[tokens, top_k]`).
#[derive(Debug, Clone, Copy)]
pub struct Combine<'a> {
    pub y: &'a wgpu::Buffer,
    pub idx: &'a wgpu::Buffer,
    pub weights: &'a wgpu::Buffer,
    pub slot_of: &'a wgpu::Buffer,
    pub top_k: usize,
}

/// How many products a batched linear runs and where each one's operands start, in elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batches {
    pub count: u32,
    pub x_stride: u32,
    pub w_stride: u32,
    pub c_stride: u32,
}

impl Batches {
    /// A single product.
    pub const ONE: Batches = Batches { count: 1, x_stride: 0, w_stride: 0, c_stride: 0 };
}

impl Batches {
    /// The parameters of `count` linear products `out[b·c_stride..][m, n] = x[b·x_stride..][m, k]
    /// · W[b·w_stride..][n, k]ᵀ` (element strides).
    pub fn linear(self, m: usize, n: usize, k: usize) -> GemmParams {
        GemmParams { batch: self.count, a_batch: self.x_stride, b_batch: self.w_stride, c_batch: self.c_stride, ..linear_params(m, n, k) }
    }
}

/// A matrix operand as stored: its buffer, element format and layout (offsets and strides of a
/// product's parameters count elements whatever the format); a weight split across bindings
/// also names its parts, and its products run per part.
#[derive(Debug, Clone, Copy)]
pub struct Operand<'a> {
    pub buffer: &'a wgpu::Buffer,
    pub format: WeightFormat,
    pub layout: MatrixLayout,
    /// The weight's parts, where it has more than one (`buffer` is then its first).
    pub split: Option<&'a SplitMatrix>,
}

impl<'a> Operand<'a> {
    /// `buffer` holding row-major values stored as `format`.
    pub fn stored(buffer: &'a wgpu::Buffer, format: WeightFormat) -> Self {
        Operand { buffer, format, layout: MatrixLayout::RowMajor, split: None }
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
        Operand { buffer: &m.buffer, format: m.format, layout: m.layout, split: None }
    }
}

impl<'a> From<&'a SplitMatrix> for Operand<'a> {
    fn from(m: &'a SplitMatrix) -> Self {
        Operand { split: m.is_split().then_some(m), ..Operand::from(&m.pieces[0]) }
    }
}

/// The tied head's parameters for one chunk of the vocabulary: `out[i·c_rs + c_offset + j] =
/// softcap(x·Wᵀ)[i, j]` for `W: [n, k]` (`cap` `None`: no softcap).
pub fn head_params((m, n, k): (usize, usize, usize), (c_rs, c_offset): (usize, usize), cap: Option<f32>) -> GemmParams {
    let mut p = GemmParams { c_offset: c_offset as u32, c_rs: c_rs as u32, ..linear_params(m, n, k) };
    if let Some(cap) = cap {
        p.epilogue = 1;
        p.cap = cap;
    }
    p
}

/// The rows of one projection that [`Recorder::norm_rope_rows`] norms, by kind.
#[derive(Debug, Clone, Copy)]
pub struct HeadRows<'a> {
    /// q: its norm weight, the output `[tokens, blocks·heads, d]`, and the blocks of `heads` heads
    /// ahead of the K rows in the input.
    pub q: Option<(&'a wgpu::Buffer, &'a wgpu::Buffer, usize)>,
    /// K: its norm weight, the output and the element of it the rows start at.
    pub k: Option<(&'a wgpu::Buffer, &'a wgpu::Buffer, usize)>,
    /// V: the output (from K's element, or 0), the heads a token (0: none) and the element of the
    /// input they start at.
    pub v: (&'a wgpu::Buffer, usize, usize),
}

/// A plain `[m, k] · Wᵀ` product for `W: [n, k]` (PyTorch linear layout).
pub fn linear_params(m: usize, n: usize, k: usize) -> GemmParams {
    GemmParams::linear(m as u32, n as u32, k as u32)
}

impl<'a> Recorder<'a> {
    pub fn new(ctx: &'a GpuContext, pipelines: &'a mut Pipelines) -> Self {
        Recorder { ctx, pipelines, plan: PlanBuilder::new(ctx), scope: String::new(), split_scratch: None }
    }

    /// Labels the following dispatches (`embed`, `layer3`, `head`) for profiles.
    pub fn scope(&mut self, scope: impl Into<String>) {
        self.scope = scope.into();
    }

    /// Lets tensor-core GEMMs with few tiles split K (`dg_kernels::coop_gemm::Split`), their
    /// partial products in `scratch` (f32, its whole size).
    pub fn split_k_scratch(&mut self, scratch: &'a wgpu::Buffer) {
        self.split_scratch = Some((scratch, scratch.size() / 4));
    }

    /// Creates the plan's uniform buffer and bind groups.
    pub fn finish(self) -> Result<Plan, GpuError> {
        self.plan.finish(self.ctx)
    }

    fn push<P: bytemuck::Pod>(&mut self, key: KernelKey, p: &P, buffers: &[&'a wgpu::Buffer], groups: [u32; 3]) -> Result<(), GpuError> {
        let pipeline = self.pipelines.get(self.ctx, key)?;
        self.plan.push_labeled(self.scope.clone(), &pipeline, p, buffers, groups);
        Ok(())
    }

    fn groups(&self, n: u32) -> [u32; 3] {
        groups_1d(n, self.ctx.limits.max_compute_workgroups_per_dimension)
    }

    /// The knobs this recording follows (the context's).
    pub fn tuning(&self) -> &'a Tuning {
        &self.ctx.tuning
    }

    /// The planner of this recording's device and tuning: how every matrix product runs.
    pub fn planner(&self) -> Planner<'a> {
        Planner::of(self.ctx)
    }

    /// The f32 elements of the split-K scratch (none: products do not split).
    pub fn split_scratch_len(&self) -> Option<u64> {
        self.split_scratch.map(|(_, len)| len)
    }

    /// Columns the row kernels (norms, softmax, gated activations) take at a time for rows whose
    /// widths, offsets and strides are `values` (`dg_kernels::lanes_for`; one with
    /// [`RowLanes::One`]).
    fn row_lanes(&self, values: &[u32]) -> u32 {
        self.lanes_knob(dg_kernels::lanes_for(values))
    }

    /// `lanes`, or one with [`RowLanes::One`].
    fn lanes_knob(&self, lanes: u32) -> u32 {
        match self.ctx.tuning.row_lanes {
            RowLanes::Auto => lanes,
            RowLanes::One => 1,
        }
    }

    /// `out = ((accumulate ? out : 0) + rms(x)[·w]) · scale` over rows of `dim` (`x` a buffer or a
    /// split product, see [`Product`]).
    #[allow(clippy::too_many_arguments)]
    pub fn rmsnorm(
        &mut self,
        x: impl Into<Product<'a>>,
        w: Option<&'a wgpu::Buffer>,
        dummy: &'a wgpu::Buffer,
        out: &'a wgpu::Buffer,
        rows: usize,
        dim: usize,
        eps: f32,
        accumulate: bool,
        scale: f32,
    ) -> Result<(), GpuError> {
        self.rmsnorm_at((x, 0), w, dummy, (out, 0), rows, dim, eps, accumulate, scale)
    }

    /// [`Self::rmsnorm`] with the rows starting `x_offset` elements into `x` (into each partial of
    /// a split product) and `out_offset` into `out`.
    #[allow(clippy::too_many_arguments)]
    pub fn rmsnorm_at(
        &mut self,
        (x, x_offset): (impl Into<Product<'a>>, usize),
        w: Option<&'a wgpu::Buffer>,
        dummy: &'a wgpu::Buffer,
        (out, out_offset): (&'a wgpu::Buffer, usize),
        rows: usize,
        dim: usize,
        eps: f32,
        accumulate: bool,
        scale: f32,
    ) -> Result<(), GpuError> {
        let flags = if w.is_some() { rmsnorm::WEIGHTED } else { 0 } | if accumulate { rmsnorm::ACCUMULATE } else { 0 };
        let x = x.into();
        let p = rmsnorm::RmsNormParams {
            rows: rows as u32,
            dim: dim as u32,
            eps,
            flags,
            scale,
            splits: x.splits,
            split_stride: x.split_stride,
            x_offset: x_offset as u32,
            out_offset: out_offset as u32,
            _pad: [0; 3],
        };
        let g = self.groups(rows as u32);
        let lanes = self.row_lanes(&[p.dim, p.x_offset, p.out_offset, p.split_stride]);
        self.push(K::RmsNorm(self.ctx.row_reduce(), Lanes::of(lanes)), &p, &[x.buffer, w.unwrap_or(dummy), out], g)
    }

    /// After attention, in one dispatch (`dg_kernels::residual_norms`): `hidden += rms(x)·w_res`,
    /// then `out_a = rms(hidden)·w_a·scale_a` and, in `out_bc: [2, rows, dim]`,
    /// `rms(hidden)·w_b·scale_b` and `rms(hidden)·w_c·scale_c`, over rows of `dim` (every buffer
    /// distinct; `x` a buffer or a split product, see [`Product`]). `out_bc[0]` is stored as
    /// `format_b`: f16 (`dg_kernels::residual_norms::source_attention_half`, `dim` a multiple
    /// of 4) packs its rows from the buffer's start, `out_bc[1]` staying at element `rows·dim`.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_residual_norms(
        &mut self,
        (x, w_res): (impl Into<Product<'a>>, &'a wgpu::Buffer),
        hidden: &'a wgpu::Buffer,
        (w_a, out_a, scale_a): (&'a wgpu::Buffer, &'a wgpu::Buffer, f32),
        (w_b, scale_b, format_b): (&'a wgpu::Buffer, f32, AFormat),
        (w_c, scale_c): (&'a wgpu::Buffer, f32),
        out_bc: &'a wgpu::Buffer,
        (rows, dim, eps): (usize, usize, f32),
    ) -> Result<(), GpuError> {
        let x = x.into();
        let p = residual_norms::AttentionResidualNormsParams {
            rows: rows as u32,
            dim: dim as u32,
            eps,
            scale_a,
            scale_b,
            scale_c,
            splits: x.splits,
            split_stride: x.split_stride,
        };
        let g = self.groups(residual_norms::workgroups(rows as u32));
        let lanes = self.row_lanes(&[p.dim, p.split_stride]);
        let key = match format_b {
            AFormat::F16 if lanes == 4 => K::AttentionNorms { reduce: self.ctx.row_reduce(), lanes: Lanes::Four, half_bc: true },
            AFormat::F16 => {
                return Err(GpuError::Unsupported {
                    what: format!(
                        "f16 norms of rows of {dim} (split stride {}): the half kernel takes 4 columns at a time",
                        p.split_stride
                    ),
                });
            }
            AFormat::F32 => K::AttentionNorms { reduce: self.ctx.row_reduce(), lanes: Lanes::of(lanes), half_bc: false },
        };
        self.push(key, &p, &[x.buffer, w_res, w_a, w_b, w_c, hidden, out_a, out_bc], g)
    }

    /// After the feed-forward blocks, in one dispatch (`dg_kernels::residual_norms`):
    /// `dense = rms(mlp)·w_1 + rms(moe)·w_2`, then `hidden = (hidden + rms(dense)·w_3)·scalar`
    /// (`mlp` a buffer or a split product, see [`Product`]); with `next = Some((w_next, normed))`
    /// also `normed = rms(hidden)·w_next`, the norm the next op applies to the new stream.
    /// `dummy` is any buffer none of the others is (bound in `normed`'s place without `next`).
    /// With `combine`, `moe` is first written as [`Self::moe_combine`] computes it from the
    /// experts' outputs: in the same dispatch where the adapter allows the combine variant's
    /// storage buffers (`dg_kernels::residual_norms::FFN_COMBINE_BUFFERS`), else in one of its own.
    /// [`Tuning::fused_combine`] false always takes the two dispatches (the same results).
    #[allow(clippy::too_many_arguments)]
    pub fn ffn_residual_norms(
        &mut self,
        (mlp, w_1): (impl Into<Product<'a>>, &'a wgpu::Buffer),
        (moe, w_2): (&'a wgpu::Buffer, &'a wgpu::Buffer),
        combine: Option<Combine<'a>>,
        w_3: &'a wgpu::Buffer,
        hidden: &'a wgpu::Buffer,
        next: Option<(&'a wgpu::Buffer, &'a wgpu::Buffer)>,
        dummy: &'a wgpu::Buffer,
        (rows, dim, eps): (usize, usize, f32),
        scalar: f32,
    ) -> Result<(), GpuError> {
        let mlp = mlp.into();
        if let Some(c) = combine.filter(|c| c.top_k > moe_combine::MAX_K as usize) {
            return Err(GpuError::Unsupported {
                what: format!("a MoE combine of {} experts a token (at most {})", c.top_k, moe_combine::MAX_K),
            });
        }
        let fused = combine.filter(|_| {
            self.ctx.limits.max_storage_buffers_per_shader_stage >= residual_norms::FFN_COMBINE_BUFFERS && self.ctx.tuning.fused_combine
        });
        if let (Some(c), None) = (combine, fused) {
            self.moe_combine(c.y, c.idx, c.weights, c.slot_of, moe, rows, c.top_k, dim)?;
        }
        let p = residual_norms::FfnResidualNormsParams {
            rows: rows as u32,
            dim: dim as u32,
            eps,
            scalar,
            splits: mlp.splits,
            split_stride: mlp.split_stride,
            next_norm: u32::from(next.is_some()),
            top_k: fused.map_or(0, |c| c.top_k as u32),
        };
        let g = self.groups(residual_norms::workgroups(rows as u32));
        // Without `next`, w_3 (already bound read-only) stands in for w_next.
        let (w_next, normed) = next.unwrap_or((w_3, dummy));
        let lanes = self.row_lanes(&[p.dim, p.split_stride]);
        let reduce = self.ctx.row_reduce();
        let norms = [mlp.buffer, w_1, moe, w_2, w_3, hidden, w_next, normed];
        match fused {
            Some(c) => self.push(
                K::FfnNorms { reduce, lanes: Lanes::of(lanes), combine: true },
                &p,
                &[&norms[..], &[c.y, c.idx, c.weights, c.slot_of]].concat(),
                g,
            ),
            None => self.push(K::FfnNorms { reduce, lanes: Lanes::of(lanes), combine: false }, &p, &norms, g),
        }
    }

    /// `c = a · b` with the strides, batches, accumulate and epilogue of `p` (see
    /// `dg_kernels::gemm`; offsets and strides in elements whatever B's format), B as stored (an
    /// uploaded [`GpuMatrix`] or [`SplitMatrix`], or any buffer through [`Operand`]), and C whole. How it runs is the
    /// planner's choice ([`Planner::dense`]): with `tensor_cores` (the F16 mode) on a device with
    /// cooperative matrices, on the tensor cores where a tile takes the product (A and B rounded to
    /// f16 when staged, f32 accumulation; f32 B with ragged columns as a tensor-core body and a
    /// portable tail), else the portable GEMM. B in K panels that no tensor-core tile takes is an
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
        match self.planner().dense(b.format, b.layout, &p, tensor_cores, self.split_scratch_len()).map_err(unsupported)? {
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
        let whole = self.planner().dense(w.format, w.layout, &p, tensor_cores, self.split_scratch_len()).map_err(unsupported)?;
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
    /// row-major ones on the portable one ([`Planner::grouped`]); f16 activations only for the
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
        let plan = self.planner().grouped(w.format, w.layout, &p, slots as u32).map_err(unsupported)?;
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
        }
    }

    /// RoPE in place on `x: [tokens·heads, 2·half]`.
    pub fn rope(
        &mut self,
        x: &'a wgpu::Buffer,
        cos: &'a wgpu::Buffer,
        sin: &'a wgpu::Buffer,
        tokens: usize,
        heads: usize,
        half: usize,
    ) -> Result<(), GpuError> {
        let p = rope::RopeParams { tokens: tokens as u32, heads: heads as u32, half: half as u32, _pad: 0 };
        let g = self.groups(rope::workgroups(&p));
        self.push(K::Rope, &p, &[x, cos, sin], g)
    }

    /// Per-head RMSNorm fused with RoPE (`dg_kernels::norm_rope`) of `heads` K rows a token from
    /// `x` (a buffer or a split product), written from `out_offset` elements into `out` (the
    /// decoder's canvas keys, straight into the cache), and in the same dispatch `v_heads` V rows a
    /// token from element `v_offset` of `x` normed without weight or rope into `values` from
    /// `out_offset` (what [`Self::rmsnorm_at`] would write there, bit for bit).
    #[allow(clippy::too_many_arguments)]
    pub fn norm_rope_kv(
        &mut self,
        x: impl Into<Product<'a>>,
        w: &'a wgpu::Buffer,
        (cos, sin): (&'a wgpu::Buffer, &'a wgpu::Buffer),
        (out, out_offset): (&'a wgpu::Buffer, usize),
        (values, v_heads, v_offset): (&'a wgpu::Buffer, usize, usize),
        tokens: usize,
        heads: usize,
        d: usize,
        eps: f32,
    ) -> Result<(), GpuError> {
        let rows = HeadRows { q: None, k: Some((w, out, out_offset)), v: (values, v_heads, v_offset) };
        self.norm_rope_rows(x, rows, (cos, sin), tokens, heads, d, eps)
    }

    /// The per-head norms (and RoPE) of one projection's `rows` (`dg_kernels::norm_rope`) from `x`
    /// (a buffer or a split product): q rows in blocks of `heads` heads into their output, K rows
    /// into theirs, V rows normed without weight or rope; in one dispatch.
    #[allow(clippy::too_many_arguments)]
    pub fn norm_rope_rows(
        &mut self,
        x: impl Into<Product<'a>>,
        rows: HeadRows<'a>,
        (cos, sin): (&'a wgpu::Buffer, &'a wgpu::Buffer),
        tokens: usize,
        heads: usize,
        d: usize,
        eps: f32,
    ) -> Result<(), GpuError> {
        use dg_kernels::norm_rope;
        let x = x.into();
        let (values, v_heads, v_offset) = rows.v;
        // An output with no rows is bound to one that has some (never read or written).
        let (q_w, q_out, q_blocks) = rows.q.unwrap_or((cos, values, 0));
        let (w, out, out_offset) = rows.k.unwrap_or((q_w, q_out, 0));
        let p = norm_rope::NormRopeParams {
            tokens: tokens as u32,
            heads: heads as u32,
            dim: d as u32,
            eps,
            splits: x.splits,
            split_stride: x.split_stride,
            out_offset: out_offset as u32,
            v_heads: v_heads as u32,
            v_offset: v_offset as u32,
            q_blocks: q_blocks as u32,
            skip_k: u32::from(rows.k.is_none()),
            _pad: 0,
        };
        let g = self.groups(norm_rope::workgroups(&p));
        let lanes = self.lanes_knob(norm_rope::lanes_for(&p));
        self.push(K::NormRope(self.ctx.row_reduce(), Lanes::of(lanes)), &p, &[x.buffer, w, cos, sin, out, values, q_w, q_out], g)
    }

    /// Row softmax in place (with the attention mask of `p`).
    pub fn softmax(&mut self, x: &'a wgpu::Buffer, p: softmax::SoftmaxParams) -> Result<(), GpuError> {
        let g = self.groups(softmax::workgroups(&p));
        let lanes = self.row_lanes(&[p.cols]);
        self.push(K::Softmax(self.ctx.row_reduce(), Lanes::of(lanes)), &p, &[x], g)
    }

    /// Plain softmax in place over `x: [rows, cols]`: rows of at least
    /// `softmax_chunked::MIN_COLS` (the vocabulary) spread over many workgroups in chunks, their
    /// `(max, sum)` pairs in `part` (at least `ChunkedSoftmaxParams::pairs` `vec2<f32>`); shorter
    /// rows one workgroup each ([`Self::softmax`]).
    pub fn softmax_rows(&mut self, x: &'a wgpu::Buffer, part: &'a wgpu::Buffer, rows: usize, cols: usize) -> Result<(), GpuError> {
        let p = softmax_chunked::ChunkedSoftmaxParams::new(rows as u32, cols as u32);
        if p.cols < softmax_chunked::MIN_COLS {
            return self.softmax(x, softmax::SoftmaxParams::plain(p.rows, p.cols));
        }
        if part.size() < p.pairs() * 8 {
            return Err(GpuError::Unsupported {
                what: format!("chunked softmax of [{rows}, {cols}]: {} pairs, the partials buffer holds {}", p.pairs(), part.size() / 8),
            });
        }
        let g = self.groups(p.workgroups());
        self.push(K::SoftmaxPartials(self.ctx.row_reduce()), &p, &[x, part], g)?;
        self.push(K::SoftmaxApply(self.ctx.row_reduce()), &p, &[x, part], g)
    }

    /// `out[rows, I] = gelu_tanh(in[:, :I]) ⊙ in[:, I:]` for `in: [rows, 2·I]` (a buffer or a
    /// split product, see [`Product`]).
    pub fn gelu_glu_fused(
        &mut self,
        input: impl Into<Product<'a>>,
        out: &'a wgpu::Buffer,
        rows: usize,
        inter: usize,
    ) -> Result<(), GpuError> {
        let input = input.into();
        let lanes = self.row_lanes(&[inter as u32, input.split_stride]);
        let p = gelu_glu::GeluGluParams::one(rows as u32, inter as u32, input.splits, input.split_stride).with_lanes(lanes);
        let g = self.groups(gelu_glu::workgroups(&p));
        self.push(K::GeluGlu { lanes: Lanes::of(lanes), half: false }, &p, &[input.buffer, out], g)
    }

    /// Two gated activations in one dispatch (`dg_kernels::gelu_glu::pair`): `out = gelu_tanh(gate)
    /// ⊙ up` from `input` (`[rows, 2·inter]`, a buffer or a split product) as
    /// [`Self::gelu_glu_fused`] computes it, and `out_b` from `input_b` (`[rows_b, 2·inter_b]`),
    /// stored as `format_b` (f16: rounded by the device's conversion, as
    /// `dg_kernels::gelu_glu::fused_half` stores it).
    pub fn gelu_glu_pair(
        &mut self,
        (input, out, rows, inter): (impl Into<Product<'a>>, &'a wgpu::Buffer, usize, usize),
        (input_b, out_b, rows_b, inter_b, format_b): (&'a wgpu::Buffer, &'a wgpu::Buffer, usize, usize, AFormat),
    ) -> Result<(), GpuError> {
        let half_b = format_b == AFormat::F16;
        if half_b && !self.ctx.device.features().contains(wgpu::Features::SHADER_F16) {
            return Err(GpuError::Unsupported { what: "f16 activations on a device without SHADER_F16".into() });
        }
        let input = input.into();
        let lanes = self.row_lanes(&[inter as u32, inter_b as u32, input.split_stride]);
        let a = gelu_glu::GeluGluParams::one(rows as u32, inter as u32, input.splits, input.split_stride).with_lanes(lanes);
        let p = gelu_glu::GeluGluParams::pair(a, (rows_b as u32, inter_b as u32));
        let g = self.groups(gelu_glu::workgroups(&p));
        self.push(K::GeluGluPair { lanes: Lanes::of(lanes), half_b }, &p, &[input.buffer, out, input_b, out_b], g)
    }

    /// Rows `row_start..row_start+row_count` of the scaled embedding for the ids in that range.
    #[allow(clippy::too_many_arguments)]
    pub fn embed(
        &mut self,
        ids: &'a wgpu::Buffer,
        table: &'a wgpu::Buffer,
        out: &'a wgpu::Buffer,
        tokens: usize,
        hidden: usize,
        row_start: usize,
        row_count: usize,
        scale: f32,
    ) -> Result<(), GpuError> {
        self.embed_format(ids, table, WeightFormat::F32, out, tokens, hidden, row_start, row_count, scale)
    }

    /// [`Self::embed`] from a table chunk stored as `table_format` (packed from the chunk's own
    /// first element).
    #[allow(clippy::too_many_arguments)]
    pub fn embed_format(
        &mut self,
        ids: &'a wgpu::Buffer,
        table: &'a wgpu::Buffer,
        table_format: WeightFormat,
        out: &'a wgpu::Buffer,
        tokens: usize,
        hidden: usize,
        row_start: usize,
        row_count: usize,
        scale: f32,
    ) -> Result<(), GpuError> {
        let p = embed::EmbedParams {
            tokens: tokens as u32,
            hidden: hidden as u32,
            row_start: row_start as u32,
            row_count: row_count as u32,
            scale,
            _pad: [0; 3],
        };
        let g = self.groups(embed::workgroups(&p));
        self.push(K::Embed(table_format), &p, &[ids, table, out], g)
    }

    /// `out = out·beta + x·alpha` over `n` values.
    pub fn axpby(&mut self, x: &'a wgpu::Buffer, out: &'a wgpu::Buffer, n: usize, alpha: f32, beta: f32) -> Result<(), GpuError> {
        let p = axpby::AxpbyParams { n: n as u32, alpha, beta, _pad: 0 };
        let g = self.groups(axpby::workgroups(&p));
        self.push(K::Axpby, &p, &[x, out], g)
    }

    /// Softmax over experts, top-k, renormalise, × per-expert scale.
    #[allow(clippy::too_many_arguments)]
    pub fn router_topk(
        &mut self,
        logits: impl Into<Product<'a>>,
        per_expert_scale: &'a wgpu::Buffer,
        idx: &'a wgpu::Buffer,
        w: &'a wgpu::Buffer,
        tokens: usize,
        experts: usize,
        k: usize,
    ) -> Result<(), GpuError> {
        let logits = logits.into();
        let p = router_topk::RouterTopkParams {
            tokens: tokens as u32,
            experts: experts as u32,
            k: k as u32,
            splits: logits.splits,
            split_stride: logits.split_stride,
            _pad: [0; 3],
        };
        let g = self.groups(router_topk::workgroups(&p));
        self.push(K::RouterTopk(self.ctx.row_reduce()), &p, &[logits.buffer, per_expert_scale, idx, w], g)
    }

    /// Groups the `[tokens, k]` routing entries `idx` by expert (offsets, rows, slot_of; see
    /// `dg_kernels::moe_dispatch`); with `tile_rows` non-zero also the tensor-core grouped GEMM's
    /// tile table of m tiles of that many rows, after the offsets
    /// ([`Planner::expert_tile_rows`]).
    #[allow(clippy::too_many_arguments)]
    pub fn moe_dispatch(
        &mut self,
        idx: &'a wgpu::Buffer,
        offsets: &'a wgpu::Buffer,
        rows: &'a wgpu::Buffer,
        slot_of: &'a wgpu::Buffer,
        tokens: usize,
        k: usize,
        experts: usize,
        tile_rows: u32,
    ) -> Result<(), GpuError> {
        let p = moe_dispatch::MoeDispatchParams { tokens: tokens as u32, k: k as u32, experts: experts as u32, tile_rows };
        let g = self.groups(moe_dispatch::workgroups(&p));
        self.push(K::MoeDispatch, &p, &[idx, offsets, rows, slot_of], g)
    }

    /// Per token, the weighted sum of its experts' outputs in ascending expert order.
    #[allow(clippy::too_many_arguments)]
    pub fn moe_combine(
        &mut self,
        y: &'a wgpu::Buffer,
        idx: &'a wgpu::Buffer,
        w: &'a wgpu::Buffer,
        slot_of: &'a wgpu::Buffer,
        out: &'a wgpu::Buffer,
        tokens: usize,
        k: usize,
        hidden: usize,
    ) -> Result<(), GpuError> {
        let p = moe_combine::MoeCombineParams { tokens: tokens as u32, k: k as u32, hidden: hidden as u32, _pad: 0 };
        let g = self.groups(moe_combine::workgroups(&p));
        self.push(K::MoeCombine(Lanes::of(dg_kernels::lanes_for(&[hidden as u32]))), &p, &[y, idx, w, slot_of, out], g)
    }

    /// The per-row work of a sampler step on `logits: [rows, vocab]`: `scaled = logits / T`, and per row
    /// `results[row] = (entropy bits, argmax, sampled, first non-finite column + 1)` (see
    /// `dg_kernels::sample_rows`). `step` holds the step's `SampleStep` (temperature, mode) and `draws`
    /// the rows' uniforms or given ids; the host rewrites both every step, so the plan replays as is.
    #[allow(clippy::too_many_arguments)]
    pub fn sample_rows(
        &mut self,
        logits: &'a wgpu::Buffer,
        scaled: &'a wgpu::Buffer,
        step: &'a wgpu::Buffer,
        draws: &'a wgpu::Buffer,
        results: &'a wgpu::Buffer,
        rows: usize,
        vocab: usize,
    ) -> Result<(), GpuError> {
        let p = SampleRowsParams { rows: rows as u32, vocab: vocab as u32, _pad: [0; 2] };
        let g = self.groups(sample_rows::workgroups(&p));
        self.push(K::SampleRows, &p, &[logits, scaled, step, draws, results], g)
    }
}

/// A product the planner finds no kernel for, as the GPU backend reports it.
fn unsupported(e: NoKernel) -> GpuError {
    GpuError::Unsupported { what: e.0 }
}

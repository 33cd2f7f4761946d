//! Typed recording of kernel dispatches: one method per op, hiding parameter structs, variant
//! choice and workgroup counts. Everything recorded lands in one [`Plan`], or, for a recorder made
//! by [`Recorder::keys_only`], only the keys of the kernels it would dispatch (what a warm-up
//! compiles ahead). The matrix products and their operand types are in `products.rs`.

mod products;

pub use crate::shapes::{attention_scores_params, attention_values_params};
pub use products::{Operand, Product};

use std::collections::HashSet;

use dg_kernels::coop_gemm::AFormat;
use dg_kernels::gemm::GemmParams;
use dg_kernels::sample_rows::{self, SampleRowsParams};
use dg_kernels::{
    KernelKey, KernelKey as K, Lanes, WeightFormat, axpby, embed, gelu_glu, moe_combine, moe_dispatch, residual_norms, rmsnorm, rope,
    router_topk, softmax, softmax_chunked,
};

use crate::context::GpuContext;
use crate::error::GpuError;
use crate::overrides::RowLanes;
use crate::plan::{Pipelines, Plan, PlanBuilder, groups_1d};
use crate::planner::Planner;
use crate::tuning::Tuning;

/// What [`Recorder::axpby`] does by rows of `row` elements: with `scale`, `x`'s rows multiplied
/// by their factors first (`dg_kernels::axpby::Variant::scaled`); with `gate`, only the rows whose
/// u32 there is non-zero written, the others of `out` keeping their values.
#[derive(Debug, Clone, Copy, Default)]
pub struct AxpbyRows<'a> {
    pub row: usize,
    pub scale: Option<&'a wgpu::Buffer>,
    pub gate: Option<&'a wgpu::Buffer>,
}

/// Where a [`Recorder`]'s dispatches go.
enum Sink<'a> {
    /// Into a plan, each kernel compiled at its first use.
    Plan { pipelines: &'a mut Pipelines, plan: PlanBuilder<'a> },
    /// Only the keys of the kernels dispatched (nothing compiled or created).
    Keys(HashSet<KernelKey>),
}

/// Records dispatches into a plan.
pub struct Recorder<'a> {
    ctx: &'a GpuContext,
    sink: Sink<'a>,
    scope: String,
    /// Scratch for split-K partial products and the length in f32 elements the planner may plan
    /// for (none: no split).
    split_scratch: Option<(&'a wgpu::Buffer, u64)>,
    /// Products of more rows are planned as if they had this many ([`Self::plan_rows`]).
    plan_rows: Option<usize>,
}

impl std::fmt::Debug for Recorder<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let dispatches = match &self.sink {
            Sink::Plan { plan, .. } => plan.len(),
            Sink::Keys(keys) => keys.len(),
        };
        f.debug_struct("Recorder").field("dispatches", &dispatches).finish()
    }
}

/// The experts' outputs a MoE combine sums into a token's row (see [`Recorder::moe_combine`]):
/// `y` (`[slots, H]`, by slot), `idx`, `weights` and `slot_of` (`[tokens, top_k]`), and
/// `slot_scale` (`[slots]`) where the experts' down projection ran on rows scaled by
/// [`Recorder::gelu_glu_pair`]: each slot's output is multiplied by its factor.
#[derive(Debug, Clone, Copy)]
pub struct Combine<'a> {
    pub y: &'a wgpu::Buffer,
    pub idx: &'a wgpu::Buffer,
    pub weights: &'a wgpu::Buffer,
    pub slot_of: &'a wgpu::Buffer,
    pub slot_scale: Option<&'a wgpu::Buffer>,
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
    /// Where the dispatch's tokens sit in the input and the RoPE tables.
    pub at: TokensAt,
    /// K's and V's outputs hold f16 (an f16 KV cache: `crate::arena::cache_format`).
    pub half_kv: bool,
}

/// Where [`Recorder::norm_rope_rows`]'s tokens sit: the whole input from element 0, or one canvas
/// of a product over several (`dg_kernels::norm_rope::NormRopeParams`'s `x_offset`,
/// `block_stride`, `table_row0`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TokensAt {
    /// Element of the input where the first q block (else K's) starts.
    pub x_offset: usize,
    /// Elements from one block of the input to the next (0: the dispatch's rows alone).
    pub block_stride: usize,
    /// Row of the cos/sin tables of the first token.
    pub table_row0: usize,
    /// Element of q's output where the first token's rows go.
    pub q_offset: usize,
}

impl TokensAt {
    /// The input holds this dispatch's rows alone, from element 0; tables from row 0.
    pub const WHOLE: TokensAt = TokensAt { x_offset: 0, block_stride: 0, table_row0: 0, q_offset: 0 };
}

/// A plain `[m, k] · Wᵀ` product for `W: [n, k]` (PyTorch linear layout).
pub fn linear_params(m: usize, n: usize, k: usize) -> GemmParams {
    GemmParams::linear(m as u32, n as u32, k as u32)
}

impl<'a> Recorder<'a> {
    pub fn new(ctx: &'a GpuContext, pipelines: &'a mut Pipelines) -> Self {
        Recorder::with_sink(ctx, Sink::Plan { pipelines, plan: PlanBuilder::new(ctx) })
    }

    /// A recorder that keeps only the keys of the kernels its ops choose ([`Self::into_keys`]):
    /// the planner's choices for a shape, without compiling, allocating or binding anything.
    pub fn keys_only(ctx: &'a GpuContext) -> Self {
        Recorder::with_sink(ctx, Sink::Keys(HashSet::new()))
    }

    fn with_sink(ctx: &'a GpuContext, sink: Sink<'a>) -> Self {
        Recorder { ctx, sink, scope: String::new(), split_scratch: None, plan_rows: None }
    }

    /// The keys a [`Self::keys_only`] recorder saw (none for a plan's recorder).
    pub fn into_keys(self) -> HashSet<KernelKey> {
        match self.sink {
            Sink::Keys(keys) => keys,
            Sink::Plan { .. } => HashSet::new(),
        }
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

    /// [`Self::split_k_scratch`], the planner fitting splits into `planned` elements of it: a
    /// batched forward's scratch holds a canvas's `planned` per canvas, and each product is
    /// planned for one canvas ([`Self::plan_rows`]).
    pub fn split_k_scratch_as(&mut self, scratch: &'a wgpu::Buffer, planned: u64) {
        self.split_scratch = Some((scratch, planned.min(scratch.size() / 4)));
    }

    /// Plans every following product of more than `rows` rows (m, or a portable expert
    /// product's rows) as if it had `rows` (None: as it is): the products of a batch of canvases
    /// then take the kernel, tile and split of one canvas's, and every row gets the bits it gets
    /// alone. The tensor-core experts' tile follows the real slots (every tile gives the same
    /// bits: `Recorder::grouped_product`).
    pub fn plan_rows(&mut self, rows: Option<usize>) {
        self.plan_rows = rows;
    }

    /// The rows a product of `rows` rows is planned for ([`Self::plan_rows`]).
    pub fn planned_rows(&self, rows: usize) -> usize {
        self.plan_rows.map_or(rows, |r| rows.min(r))
    }

    /// `p` as its plan is chosen: m as [`Self::planned_rows`] says.
    pub fn planned(&self, p: &GemmParams) -> GemmParams {
        GemmParams { m: self.planned_rows(p.m as usize) as u32, ..*p }
    }

    /// Creates the plan's uniform buffer and bind groups (an error for a [`Self::keys_only`]
    /// recorder, which has no plan).
    pub fn finish(self) -> Result<Plan, GpuError> {
        match self.sink {
            Sink::Plan { plan, .. } => plan.finish(self.ctx),
            Sink::Keys(_) => Err(GpuError::Unsupported { what: "a plan from a recorder of kernel keys".into() }),
        }
    }

    fn push<P: bytemuck::Pod>(&mut self, key: KernelKey, p: &P, buffers: &[&'a wgpu::Buffer], groups: [u32; 3]) -> Result<(), GpuError> {
        match &mut self.sink {
            Sink::Plan { pipelines, plan } => {
                let pipeline = pipelines.get(self.ctx, key)?;
                plan.push_labeled(self.scope.clone(), &pipeline, p, buffers, groups);
            }
            Sink::Keys(keys) => {
                keys.insert(key);
            }
        }
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
        self.ctx.planner()
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
        match self.ctx.tuning.overrides.row_lanes {
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
    /// `mlp_scale` (`[rows]`): `mlp`'s input rows were scaled ([`Self::gelu_glu_pair`]), and each
    /// row of `mlp` is multiplied by its factor; it comes with the combine's `slot_scale`.
    #[allow(clippy::too_many_arguments)]
    pub fn ffn_residual_norms(
        &mut self,
        (mlp, w_1, mlp_scale): (impl Into<Product<'a>>, &'a wgpu::Buffer, Option<&'a wgpu::Buffer>),
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
        let scaled = mlp_scale.is_some();
        if combine.is_some_and(|c| c.slot_scale.is_some() != scaled) {
            return Err(GpuError::Unsupported {
                what: "a combine whose experts are scaled by rows while the dense MLP is not, or the reverse".into(),
            });
        }
        let limit = self.ctx.limits.max_storage_buffers_per_shader_stage;
        let fused = combine.filter(|_| limit >= residual_norms::ffn_buffers(true, scaled) && self.ctx.tuning.overrides.fused_combine);
        if scaled && limit < residual_norms::ffn_buffers(false, true) {
            return Err(GpuError::Unsupported {
                what: format!(
                    "the scaled closing norms' {} storage buffers (the adapter allows {limit})",
                    residual_norms::ffn_buffers(false, true)
                ),
            });
        }
        if let (Some(c), None) = (combine, fused) {
            self.moe_combine(c, moe, rows, dim)?;
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
        let mut buffers = vec![mlp.buffer, w_1, moe, w_2, w_3, hidden, w_next, normed];
        if let Some(c) = fused {
            buffers.extend([c.y, c.idx, c.weights, c.slot_of]);
        }
        buffers.extend(mlp_scale);
        buffers.extend(fused.and_then(|c| c.slot_scale));
        let key = K::FfnNorms { reduce, lanes: Lanes::of(lanes), combine: fused.is_some(), scaled };
        self.push(key, &p, &buffers, g)
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
        let rows = HeadRows { q: None, k: Some((w, out, out_offset)), v: (values, v_heads, v_offset), at: TokensAt::WHOLE, half_kv: false };
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
            x_offset: rows.at.x_offset as u32,
            block_stride: rows.at.block_stride as u32,
            table_row0: rows.at.table_row0 as u32,
            q_offset: rows.at.q_offset as u32,
            _pad: 0,
        };
        let g = self.groups(norm_rope::workgroups(&p));
        let lanes = self.lanes_knob(norm_rope::lanes_for(&p));
        let wg = norm_rope::workgroup_for(&p, lanes);
        // Without K or V rows, nothing is stored as the cache stores it.
        let half_cache = rows.half_kv && (rows.k.is_some() || v_heads > 0);
        let key = K::NormRope { reduce: self.ctx.row_reduce(), lanes: Lanes::of(lanes), wg, half_cache };
        self.push(key, &p, &[x.buffer, w, cos, sin, out, values, q_w, q_out], g)
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
    /// With `scale` (`[rows]`), each row is scaled into f16's range as it is stored and its
    /// factor written there (`dg_kernels::gelu_glu::fused_scaled`): for a product that rounds
    /// `out` to f16 (the tensor cores), whose consumer multiplies its rows back.
    pub fn gelu_glu_fused(
        &mut self,
        input: impl Into<Product<'a>>,
        out: &'a wgpu::Buffer,
        rows: usize,
        inter: usize,
        scale: Option<&'a wgpu::Buffer>,
    ) -> Result<(), GpuError> {
        let input = input.into();
        let lanes = self.row_lanes(&[inter as u32, input.split_stride]);
        let p = gelu_glu::GeluGluParams::one(rows as u32, inter as u32, input.splits, input.split_stride).with_lanes(lanes);
        match scale {
            Some(scale) => {
                let g = self.groups(gelu_glu::workgroups_scaled(&p));
                let key = K::GeluGluScaled { reduce: self.ctx.row_reduce(), lanes: Lanes::of(lanes), half: false };
                self.push(key, &p, &[input.buffer, out, scale], g)
            }
            None => {
                let g = self.groups(gelu_glu::workgroups(&p));
                self.push(K::GeluGlu { lanes: Lanes::of(lanes), half: false }, &p, &[input.buffer, out], g)
            }
        }
    }

    /// Two gated activations in one dispatch (`dg_kernels::gelu_glu::pair`): `out = gelu_tanh(gate)
    /// ⊙ up` from `input` (`[rows, 2·inter]`, a buffer or a split product) as
    /// [`Self::gelu_glu_fused`] computes it, and `out_b` from `input_b` (`[rows_b, 2·inter_b]`),
    /// stored as `format_b` (f16: rounded by the device's conversion, as
    /// `dg_kernels::gelu_glu::fused_half` stores it).
    /// With `scales` (`[rows]`, `[rows_b]`), both jobs' rows are scaled as
    /// [`Self::gelu_glu_fused`] scales them (`dg_kernels::gelu_glu::pair_scaled`).
    pub fn gelu_glu_pair(
        &mut self,
        (input, out, rows, inter): (impl Into<Product<'a>>, &'a wgpu::Buffer, usize, usize),
        (input_b, out_b, rows_b, inter_b, format_b): (&'a wgpu::Buffer, &'a wgpu::Buffer, usize, usize, AFormat),
        scales: Option<(&'a wgpu::Buffer, &'a wgpu::Buffer)>,
    ) -> Result<(), GpuError> {
        let half_b = format_b == AFormat::F16;
        if half_b && !self.ctx.device.features().contains(wgpu::Features::SHADER_F16) {
            return Err(GpuError::Unsupported { what: "f16 activations on a device without SHADER_F16".into() });
        }
        let input = input.into();
        let lanes = self.row_lanes(&[inter as u32, inter_b as u32, input.split_stride]);
        let a = gelu_glu::GeluGluParams::one(rows as u32, inter as u32, input.splits, input.split_stride).with_lanes(lanes);
        match scales {
            Some((scale, scale_b)) => {
                let p = gelu_glu::GeluGluParams::pair_rows(a, (rows_b as u32, inter_b as u32));
                let g = self.groups(gelu_glu::workgroups_scaled(&p));
                let key = K::GeluGluPairScaled { reduce: self.ctx.row_reduce(), lanes: Lanes::of(lanes), half_b };
                self.push(key, &p, &[input.buffer, out, input_b, out_b, scale, scale_b], g)
            }
            None => {
                let p = gelu_glu::GeluGluParams::pair(a, (rows_b as u32, inter_b as u32));
                let g = self.groups(gelu_glu::workgroups(&p));
                self.push(K::GeluGluPair { lanes: Lanes::of(lanes), half_b }, &p, &[input.buffer, out, input_b, out_b], g)
            }
        }
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

    /// `out = out·beta + x·alpha` over `n` values, by rows as `rows` says.
    pub fn axpby(
        &mut self,
        x: &'a wgpu::Buffer,
        out: &'a wgpu::Buffer,
        n: usize,
        (alpha, beta): (f32, f32),
        rows: AxpbyRows<'a>,
    ) -> Result<(), GpuError> {
        let p = axpby::AxpbyParams { n: n as u32, alpha, beta, row: rows.row as u32 };
        let g = self.groups(axpby::workgroups(&p));
        let variant = axpby::Variant { scaled: rows.scale.is_some(), gated: rows.gate.is_some() };
        let mut buffers = vec![x, out];
        buffers.extend(rows.scale);
        buffers.extend(rows.gate);
        self.push(K::Axpby(variant), &p, &buffers, g)
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

    /// Per token, the weighted sum of its experts' outputs in ascending expert order (each slot's
    /// output multiplied by its factor where the combine has `slot_scale`).
    pub fn moe_combine(&mut self, c: Combine<'a>, out: &'a wgpu::Buffer, tokens: usize, hidden: usize) -> Result<(), GpuError> {
        let p = moe_combine::MoeCombineParams { tokens: tokens as u32, k: c.top_k as u32, hidden: hidden as u32, _pad: 0 };
        let g = self.groups(moe_combine::workgroups(&p));
        let lanes = Lanes::of(dg_kernels::lanes_for(&[hidden as u32]));
        match c.slot_scale {
            Some(scale) => self.push(K::MoeCombineScaled(lanes), &p, &[c.y, c.idx, c.weights, c.slot_of, out, scale], g),
            None => self.push(K::MoeCombine(lanes), &p, &[c.y, c.idx, c.weights, c.slot_of, out], g),
        }
    }

    /// The per-row work of a sampler step on `logits: [rows, vocab]`: `scaled = logits / T`, and per row
    /// `results[row] = (entropy bits, argmax, sampled, first non-finite column + 1)` (see
    /// `dg_kernels::sample_rows`). `step` holds the step's `SampleStep` (temperature, mode) and `draws`
    /// the rows' uniforms or given ids; the host rewrites both every step, so the plan replays as is.
    /// `step` holds one `SampleStep` per `rows_per_step` rows (a batch's canvases); logits row 0
    /// is row `first_row` of `draws`, `results` and the steps.
    #[allow(clippy::too_many_arguments)]
    pub fn sample_rows(
        &mut self,
        logits: &'a wgpu::Buffer,
        scaled: &'a wgpu::Buffer,
        step: &'a wgpu::Buffer,
        draws: &'a wgpu::Buffer,
        results: &'a wgpu::Buffer,
        (rows, rows_per_step, first_row): (usize, usize, usize),
        vocab: usize,
    ) -> Result<(), GpuError> {
        let p =
            SampleRowsParams { rows: rows as u32, vocab: vocab as u32, rows_per_step: rows_per_step as u32, first_row: first_row as u32 };
        let g = self.groups(sample_rows::workgroups(&p));
        self.push(K::SampleRows, &p, &[logits, scaled, step, draws, results], g)
    }
}

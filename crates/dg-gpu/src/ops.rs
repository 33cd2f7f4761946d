//! Typed recording of kernel dispatches: one method per op, hiding parameter structs, variant
//! choice and workgroup counts. Everything recorded lands in one [`Plan`].

use dg_kernels::coop_gemm::AFormat;
use dg_kernels::gemm::{self, GemmParams};
use dg_kernels::grouped_gemm::{self, GroupedGemmParams};
use dg_kernels::sample_rows::{self, SampleRowsParams};
use dg_kernels::{KernelSource, WeightFormat, axpby, coop_gemm, coop_grouped_gemm, embed, gelu_glu, moe_combine, moe_dispatch, residual_norms, rmsnorm, rope, router_topk, softmax, softmax_chunked, split_k};

use crate::context::GpuContext;
use crate::error::GpuError;
use crate::plan::{Pipelines, Plan, PlanBuilder, groups_1d};
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

/// Tuning knob: `DG_GROUPED_TILE=BMxBN` (e.g. `32x256`) forces the experts' grouped tile.
fn grouped_tile_override() -> Option<grouped_gemm::GroupedTile> {
    let wanted = std::env::var("DG_GROUPED_TILE").ok()?;
    grouped_gemm::TILES.iter().copied().find(|t| format!("{}x{}", t.bm, t.bn) == wanted)
}

/// Tuning knob: `DG_COOP_PATH=direct` (or `single`: one stage of workgroup memory) loads the dense tensor-core GEMM's W fragments straight from
/// the buffer instead of staging them (on an H200: 133 µs instead of 83 for q_proj, so staged is
/// the default; the experts' grouped GEMM goes the other way, see `coop_grouped_gemm::choose`).
fn coop_path() -> coop_gemm::WPath {
    match std::env::var("DG_COOP_PATH").as_deref() {
        Ok("direct") => coop_gemm::WPath::Direct,
        Ok("single") => coop_gemm::WPath::Single,
        _ => coop_gemm::WPath::Staged,
    }
}

/// Tuning knobs: `DG_GROUPED_PATH=staged|direct|single` forces the W path of the experts' tensor-core
/// tile and `DG_COOP_GROUPED_TILE=BMxBN` (e.g. `32x128`, or a full label) the tile, where it fits
/// (`coop_grouped_gemm::choose` picks both by default).
fn coop_grouped_override(p: &GroupedGemmParams, (tile, path): (coop_gemm::CoopTile, coop_gemm::WPath)) -> (coop_gemm::CoopTile, coop_gemm::WPath) {
    let path = match std::env::var("DG_GROUPED_PATH").as_deref() {
        Ok("staged") => coop_gemm::WPath::Staged,
        Ok("direct") => coop_gemm::WPath::Direct,
        Ok("single") => coop_gemm::WPath::Single,
        _ => path,
    };
    let wanted = std::env::var("DG_COOP_GROUPED_TILE").ok();
    let tile = coop_grouped_gemm::TILES
        .iter()
        .copied()
        .find(|t| wanted.as_deref().is_some_and(|w| names_tile(w, *t)) && coop_grouped_gemm::fits(*t, p))
        .unwrap_or(tile);
    (depth_override("DG_COOP_GROUPED_DEPTH", tile), path)
}

/// Tuning knobs: `DG_COOP_DEPTH=N` (dense) and `DG_COOP_GROUPED_DEPTH=N` (experts) issue a
/// tensor-core tile's global loads N K steps ahead (`dg_kernels::coop_kloop`; 1 to its
/// `MAX_DEPTH`, otherwise the tile's own).
fn depth_override(knob: &str, tile: coop_gemm::CoopTile) -> coop_gemm::CoopTile {
    match std::env::var(knob).ok().and_then(|v| v.parse().ok()) {
        Some(depth) if tile.with_depth(depth).is_valid() => tile.with_depth(depth),
        _ => tile,
    }
}

/// Tuning knob: `DG_SPLIT_TARGET=N` sets the workgroups a tensor-core GEMM is split towards
/// (default `dg_kernels::coop_gemm::Split::target`; 0 never splits).
fn split_target(tile: coop_gemm::CoopTile, p: &GemmParams) -> u32 {
    std::env::var("DG_SPLIT_TARGET").ok().and_then(|v| v.parse().ok()).unwrap_or_else(|| coop_gemm::Split::target(tile, p))
}

/// Columns the row kernels (norms, softmax, gated activations) take at a time for rows whose
/// widths, offsets and strides are `values` (`dg_kernels::lanes_for`), after the knob.
fn row_lanes(values: &[u32]) -> u32 {
    lanes_knob(dg_kernels::lanes_for(values))
}

/// Tuning knob: `DG_ROW_LANES=1` keeps every row kernel one column at a time (else `lanes`).
fn lanes_knob(lanes: u32) -> u32 {
    match std::env::var("DG_ROW_LANES").as_deref() {
        Ok("1") => 1,
        _ => lanes,
    }
}

/// Tuning knob: `DG_COOP_TILE=BMxBN` (e.g. `64x128`, or a full label) makes the dense tensor-core GEMM take that
/// tile of `dg_kernels::coop_gemm::TILES` wherever it fits (`coop_gemm::plan` chooses otherwise).
fn coop_tile_override() -> Option<coop_gemm::CoopTile> {
    let wanted = std::env::var("DG_COOP_TILE").ok()?;
    coop_gemm::TILES.iter().chain(coop_gemm::TUNING_TILES).copied().find(|t| names_tile(&wanted, *t))
}

/// Whether a tuning knob's value names `tile`: `BMxBN` (the first such tile of a list) or its full
/// label (`64x64x16_32x32_v4`, see `dg_kernels::coop_gemm::CoopTile::label`).
fn names_tile(wanted: &str, tile: coop_gemm::CoopTile) -> bool {
    wanted == format!("{}x{}", tile.bm, tile.bn) || wanted == tile.label()
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

    fn push<P: bytemuck::Pod>(&mut self, src: KernelSource, p: &P, buffers: &[&'a wgpu::Buffer], groups: [u32; 3]) -> Result<(), GpuError> {
        let pipeline = self.pipelines.get(self.ctx, src)?;
        self.plan.push_labeled(self.scope.clone(), &pipeline, p, buffers, groups);
        Ok(())
    }

    fn groups(&self, n: u32) -> [u32; 3] {
        groups_1d(n, self.ctx.limits.max_compute_workgroups_per_dimension)
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
        let lanes = row_lanes(&[p.dim, p.x_offset, p.out_offset, p.split_stride]);
        self.push(rmsnorm::source_lanes(self.ctx.row_reduce(), lanes), &p, &[x.buffer, w.unwrap_or(dummy), out], g)
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
        let lanes = row_lanes(&[p.dim, p.split_stride]);
        let source = match format_b {
            AFormat::F16 if lanes == 4 => residual_norms::source_attention_half(self.ctx.row_reduce()),
            AFormat::F16 => return Err(GpuError::Unsupported { what: format!("f16 norms of rows of {dim} (split stride {}): the half kernel takes 4 columns at a time", p.split_stride) }),
            AFormat::F32 => residual_norms::source_attention_lanes(self.ctx.row_reduce(), lanes),
        };
        self.push(source, &p, &[x.buffer, w_res, w_a, w_b, w_c, hidden, out_a, out_bc], g)
    }

    /// After the feed-forward blocks, in one dispatch (`dg_kernels::residual_norms`):
    /// `dense = rms(mlp)·w_1 + rms(moe)·w_2`, then `hidden = (hidden + rms(dense)·w_3)·scalar`
    /// (`mlp` a buffer or a split product, see [`Product`]); with `next = Some((w_next, normed))`
    /// also `normed = rms(hidden)·w_next`, the norm the next op applies to the new stream.
    /// `dummy` is any buffer none of the others is (bound in `normed`'s place without `next`).
    /// With `combine`, `moe` is first written as [`Self::moe_combine`] computes it from the
    /// experts' outputs: in the same dispatch where the adapter allows the combine variant's
    /// storage buffers (`dg_kernels::residual_norms::FFN_COMBINE_BUFFERS`), else in one of its own.
    /// Tuning knob: `DG_UNFUSED_COMBINE=1` always takes the two dispatches (the same results).
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
            return Err(GpuError::Unsupported { what: format!("a MoE combine of {} experts a token (at most {})", c.top_k, moe_combine::MAX_K) });
        }
        let fused = combine.filter(|_| {
            self.ctx.limits.max_storage_buffers_per_shader_stage >= residual_norms::FFN_COMBINE_BUFFERS && std::env::var("DG_UNFUSED_COMBINE").as_deref() != Ok("1")
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
        let lanes = row_lanes(&[p.dim, p.split_stride]);
        let reduce = self.ctx.row_reduce();
        let norms = [mlp.buffer, w_1, moe, w_2, w_3, hidden, w_next, normed];
        match fused {
            Some(c) => self.push(residual_norms::source_ffn_combine_lanes(reduce, lanes), &p, &[&norms[..], &[c.y, c.idx, c.weights, c.slot_of]].concat(), g),
            None => self.push(residual_norms::source_ffn_lanes(reduce, lanes), &p, &norms, g),
        }
    }

    /// A GEMM with explicit strides (see `dg_kernels::gemm`), f32 operands.
    pub fn gemm(&mut self, a: &'a wgpu::Buffer, b: &'a wgpu::Buffer, c: &'a wgpu::Buffer, p: GemmParams) -> Result<(), GpuError> {
        self.gemm_format(a, b, WeightFormat::F32, c, p)
    }

    /// [`Self::gemm`] with B stored as `b_format` (offsets and strides of `p` in elements either
    /// way); the tile is chosen as for f32.
    pub fn gemm_format(&mut self, a: &'a wgpu::Buffer, b: &'a wgpu::Buffer, b_format: WeightFormat, c: &'a wgpu::Buffer, p: GemmParams) -> Result<(), GpuError> {
        let tile = gemm::choose_batched(p.m, p.n, p.k, p.batch);
        let g = gemm::workgroups(tile, p.m, p.n, p.batch);
        self.push(gemm::source_for(tile, b_format), &p, &[a, b, c], g)
    }

    /// `out[m, n] = x[m, k] · Wᵀ`.
    pub fn linear(&mut self, x: &'a wgpu::Buffer, w: &'a wgpu::Buffer, out: &'a wgpu::Buffer, m: usize, n: usize, k: usize) -> Result<(), GpuError> {
        self.linear_format(x, w, WeightFormat::F32, out, m, n, k)
    }

    /// [`Self::linear`] with W stored as `w_format`. F16 weights on a device with cooperative
    /// matrices go through the tensor-core GEMM (`dg_kernels::coop_gemm`: x rounded to f16, f32
    /// accumulation) when the shape fits one of its tiles; everything else through the f32 GEMM.
    #[allow(clippy::too_many_arguments)]
    pub fn linear_format(&mut self, x: &'a wgpu::Buffer, w: &'a wgpu::Buffer, w_format: WeightFormat, out: &'a wgpu::Buffer, m: usize, n: usize, k: usize) -> Result<(), GpuError> {
        self.batched_linear_format(x, w, w_format, out, m, n, k, Batches::ONE)
    }

    /// `batches.count` linear products in one dispatch: batch `b` computes
    /// `out[b·c_stride..][m, n] = x[b·x_stride..][m, k] · W[b·w_stride..][n, k]ᵀ` (element strides),
    /// on the tensor cores as [`Self::linear_format`] when it can.
    #[allow(clippy::too_many_arguments)]
    pub fn batched_linear_format(
        &mut self,
        x: &'a wgpu::Buffer,
        w: &'a wgpu::Buffer,
        w_format: WeightFormat,
        out: &'a wgpu::Buffer,
        m: usize,
        n: usize,
        k: usize,
        batches: Batches,
    ) -> Result<(), GpuError> {
        let Batches { count, x_stride, w_stride, c_stride } = batches;
        let p = GemmParams { batch: count, a_batch: x_stride, b_batch: w_stride, c_batch: c_stride, ..linear_params(m, n, k) };
        self.gemm_auto(x, w, w_format, out, p, w_format == WeightFormat::F16)
    }

    /// [`Self::gemm_format`], on the tensor cores when `tensor_cores` (the F16 mode) is set, the
    /// device has cooperative matrices and `dg_kernels::coop_gemm::plan` takes the product: A and
    /// B rounded to f16 when staged (B stored as F16, BF16 or f32), f32 accumulation, the same
    /// strides, batches, accumulate and softcap; f32 operands with ragged columns split into a
    /// tensor-core body and an f32 tail. F16 `W[n][k]` may load its fragments directly (`DG_COOP_PATH=direct`);
    /// everything else is staged.
    pub fn gemm_auto(&mut self, a: &'a wgpu::Buffer, b: &'a wgpu::Buffer, b_format: WeightFormat, c: &'a wgpu::Buffer, p: GemmParams, tensor_cores: bool) -> Result<(), GpuError> {
        self.gemm_layout(a, b, b_format, MatrixLayout::RowMajor, c, p, tensor_cores, false).map(|_| ())
    }

    /// `c = a · wᵀ` as [`Self::gemm_auto`] takes it, for an uploaded matrix (`p`'s B strides
    /// describe `[n][k]`): a matrix in K panels (F16 on a device with cooperative matrices, which
    /// the upload only panels when the tensor cores take its shapes) always runs on the tensor
    /// cores, and a product no tile takes is an error, never a misread.
    pub fn gemm_matrix(&mut self, a: &'a wgpu::Buffer, w: &'a GpuMatrix, c: &'a wgpu::Buffer, p: GemmParams) -> Result<(), GpuError> {
        self.gemm_layout(a, &w.buffer, w.format, w.layout, c, p, w.format == WeightFormat::F16, false).map(|_| ())
    }

    /// `out[m, n] = x[m, k] · Wᵀ` for an uploaded matrix ([`Self::linear_format`] on its buffer,
    /// format and layout).
    pub fn linear_matrix(&mut self, x: &'a wgpu::Buffer, w: &'a GpuMatrix, out: &'a wgpu::Buffer, m: usize, n: usize, k: usize) -> Result<(), GpuError> {
        self.batched_linear_matrix(x, w, out, m, n, k, Batches::ONE)
    }

    /// [`Self::batched_linear_format`] for an uploaded matrix holding the batches' `[n, k]`
    /// matrices `batches.w_stride` elements apart (in K panels each on its own).
    #[allow(clippy::too_many_arguments)]
    pub fn batched_linear_matrix(&mut self, x: &'a wgpu::Buffer, w: &'a GpuMatrix, out: &'a wgpu::Buffer, m: usize, n: usize, k: usize, batches: Batches) -> Result<(), GpuError> {
        let Batches { count, x_stride, w_stride, c_stride } = batches;
        let p = GemmParams { batch: count, a_batch: x_stride, b_batch: w_stride, c_batch: c_stride, ..linear_params(m, n, k) };
        self.gemm_matrix(x, w, out, p)
    }

    /// [`Self::batched_linear_matrix`] for a consumer that reads its output through a [`Product`]:
    /// where the tensor-core GEMM splits K, only the partials are written and returned (the
    /// consumer adds them as it reads, no reduction dispatch), otherwise `out` is. The partials live
    /// in the recorder's split-K scratch, which the next split product overwrites: record the
    /// product's consumers before it.
    #[allow(clippy::too_many_arguments)]
    pub fn linear_product(&mut self, x: &'a wgpu::Buffer, w: &'a GpuMatrix, out: &'a wgpu::Buffer, m: usize, n: usize, k: usize, batches: Batches) -> Result<Product<'a>, GpuError> {
        let Batches { count, x_stride, w_stride, c_stride } = batches;
        let p = GemmParams { batch: count, a_batch: x_stride, b_batch: w_stride, c_batch: c_stride, ..linear_params(m, n, k) };
        self.gemm_product(x, w, out, p)
    }

    /// [`Self::gemm_matrix`] for a consumer that reads its output through a [`Product`], as
    /// [`Self::linear_product`].
    pub fn gemm_product(&mut self, a: &'a wgpu::Buffer, w: &'a GpuMatrix, c: &'a wgpu::Buffer, p: GemmParams) -> Result<Product<'a>, GpuError> {
        self.gemm_layout(a, &w.buffer, w.format, w.layout, c, p, w.format == WeightFormat::F16, true)
    }

    /// How the product `p` of `w` would run on the tensor cores: in how many waves of workgroups
    /// (its tiles over those a 132-multiprocessor H200 holds at once,
    /// `dg_kernels::coop_gemm::LARGE_TILE_SPLIT_TARGET_WORKGROUPS` a multiprocessor's worth of the
    /// tile), and whether it splits K; `None` where it would not run there.
    pub fn coop_waves(&self, w: &GpuMatrix, p: &GemmParams) -> Option<(u32, bool)> {
        let (tile, _) = self.coop_plan(w.format, w.layout == MatrixLayout::KPanels, p, w.format == WeightFormat::F16)?;
        let per_sm = if tile.dense_shared_bytes() > coop_gemm::PAIR_RESIDENT_SHARED_BYTES { 1 } else { 2 };
        let waves = (tile.tiles(p.m, p.n) * p.batch.max(1)).div_ceil(per_sm * coop_gemm::LARGE_TILE_SPLIT_TARGET_WORKGROUPS);
        let splits = self.split_scratch.is_some_and(|(_, len)| coop_gemm::Split::choose(tile, p, split_target(tile, p), len).is_some());
        Some((waves, splits))
    }

    /// The tile (and B layout) on which the tensor cores run `p` with B stored as `b_format` (in K
    /// panels or not), if they do: what [`Self::gemm_layout`] dispatches and
    /// [`Self::coop_waves`] counts.
    fn coop_plan(&self, b_format: WeightFormat, panels: bool, p: &GemmParams, tensor_cores: bool) -> Option<(coop_gemm::CoopTile, coop_gemm::BLayout)> {
        if !tensor_cores || !self.ctx.coop_matrix {
            return None;
        }
        let max_shared = self.ctx.limits.max_compute_workgroup_storage_size;
        // Attention's products (B: the f32 cache) take their own tile where the large one would
        // split K (`coop_gemm::ATTENTION_TILE`).
        let splits_large = || {
            let large = coop_gemm::TILE_128X128;
            self.split_scratch.is_some_and(|(_, len)| coop_gemm::Split::choose(large, p, split_target(large, p), len).is_some())
        };
        let prefer = coop_tile_override().or_else(|| (b_format == WeightFormat::F32 && splits_large()).then_some(coop_gemm::ATTENTION_TILE));
        coop_gemm::plan_layout(p, panels, prefer, max_shared).map(|(tile, layout)| (depth_override("DG_COOP_DEPTH", tile), layout))
    }

    /// [`Self::gemm_auto`] with B laid out as `b_layout`; with `defer`, a split product whose
    /// partials are laid out as its C (a plain product into a contiguous `[batch][m][n]`) is left
    /// unreduced and returned as such (see [`Self::linear_product`]).
    #[allow(clippy::too_many_arguments)]
    fn gemm_layout(
        &mut self,
        a: &'a wgpu::Buffer,
        b: &'a wgpu::Buffer,
        b_format: WeightFormat,
        b_layout: MatrixLayout,
        c: &'a wgpu::Buffer,
        p: GemmParams,
        tensor_cores: bool,
        defer: bool,
    ) -> Result<Product<'a>, GpuError> {
        let panels = b_layout == MatrixLayout::KPanels;
        let planned = self.coop_plan(b_format, panels, &p, tensor_cores);
        if panels && (planned.is_none() || b_format != WeightFormat::F16) {
            return Err(GpuError::Unsupported {
                what: format!("a {b_format:?} matrix in K panels for a product of m {} n {} k {} (b_cs {}): no tensor-core tile takes it", p.m, p.n, p.k, p.b_cs),
            });
        }
        if let Some(planned) = planned {
            return self.coop_product(a, b, b_format, c, p, planned, defer);
        }
        if tensor_cores && self.ctx.coop_matrix {
            // Ragged columns (a sliding layer's scores over its 1023 visible keys): the body of
            // whole 32-wide column blocks on the tensor cores, the last columns in the f32 GEMM.
            // Only for f32 operands (attention), the case measured on an H200 and tested
            // (dg-parity `tests/tensor_cores.rs`); ragged K stays in the f32 GEMM.
            const STEP: u32 = 32;
            let n_body = p.n / STEP * STEP;
            let body = GemmParams { n: n_body, ..p };
            if b_format == WeightFormat::F32 && n_body > 0 && n_body < p.n && coop_gemm::plan(&body).is_some() {
                self.gemm_auto(a, b, b_format, c, body, true)?;
                let n_tail = GemmParams { n: p.n - n_body, b_offset: p.b_offset + n_body * p.b_cs, c_offset: p.c_offset + n_body, ..p };
                self.gemm_format(a, b, b_format, c, n_tail)?;
                return Ok(c.into());
            }
        }
        self.gemm_format(a, b, b_format, c, p)?;
        Ok(c.into())
    }

    /// `p` on the tensor cores with the planned tile and B layout, split K where
    /// `dg_kernels::coop_gemm::Split` says so; with `defer`, a split product whose partials are laid
    /// out as its C is left unreduced (see [`Self::gemm_layout`]).
    #[allow(clippy::too_many_arguments)]
    fn coop_product(
        &mut self,
        a: &'a wgpu::Buffer,
        b: &'a wgpu::Buffer,
        b_format: WeightFormat,
        c: &'a wgpu::Buffer,
        p: GemmParams,
        (tile, layout): (coop_gemm::CoopTile, coop_gemm::BLayout),
        defer: bool,
    ) -> Result<Product<'a>, GpuError> {
        let path = match coop_path() {
            coop_gemm::WPath::Direct if b_format != WeightFormat::F16 || layout == coop_gemm::BLayout::Kn => coop_gemm::WPath::Staged,
            path => path,
        };
        let kernel = coop_gemm::source_for(tile, path, b_format, layout);
        let split = self.split_scratch.and_then(|(scratch, len)| Some((scratch, coop_gemm::Split::choose(tile, &p, split_target(tile, &p), len)?)));
        let Some((scratch, split)) = split else {
            self.push(kernel, &p, &[a, b, c], coop_gemm::workgroups(tile, p.m, p.n, p.batch))?;
            return Ok(c.into());
        };
        let partial = split.partial_params(&p);
        self.push(kernel, &partial, &[a, b, scratch], coop_gemm::workgroups_split(tile, p.m, p.n, p.batch, split.splits))?;
        let plain = p.alpha == 1.0 && p.accumulate == 0 && p.epilogue == gemm::EPILOGUE_NONE;
        let as_c = p.c_offset == 0 && p.c_rs == p.n && (p.batch <= 1 || p.c_batch == p.m * p.n);
        if defer && plain && as_c {
            return Ok(Product { buffer: scratch, splits: split.splits, split_stride: partial.split_stride });
        }
        let r = split.reduce_params(&p);
        let g = self.groups(split_k::workgroups(&r));
        self.push(split_k::source(), &r, &[scratch, c], g)?;
        Ok(c.into())
    }

    /// The tied head's product for one chunk of the vocabulary: `out[i·c_rs + c_offset + j] =
    /// softcap(x·Wᵀ)[i, j]` for `W: [n, k]` stored as `w_format` (`cap` `None`: no softcap). With
    /// `tensor_cores` (the F16 mode) on a device with cooperative matrices and a shape that fits a
    /// tile, on the tensor cores (`dg_kernels::coop_gemm`, BF16 or F16 W rounded to f16 when staged,
    /// x rounded to f16); otherwise the f32-arithmetic GEMM with the softcap epilogue.
    #[allow(clippy::too_many_arguments)]
    pub fn head_linear(
        &mut self,
        x: &'a wgpu::Buffer,
        w: &'a wgpu::Buffer,
        w_format: WeightFormat,
        out: &'a wgpu::Buffer,
        (m, n, k): (usize, usize, usize),
        (c_rs, c_offset): (usize, usize),
        cap: Option<f32>,
        tensor_cores: bool,
    ) -> Result<(), GpuError> {
        let mut p = GemmParams { c_offset: c_offset as u32, c_rs: c_rs as u32, ..linear_params(m, n, k) };
        if let Some(cap) = cap {
            p.epilogue = 1;
            p.cap = cap;
        }
        self.gemm_auto(x, w, w_format, out, p, tensor_cores && w_format != WeightFormat::F32)
    }

    /// Per-expert GEMMs over `slots` grouped slots (the tile is chosen by the mean group size).
    #[allow(clippy::too_many_arguments)]
    pub fn grouped_gemm(
        &mut self,
        a: &'a wgpu::Buffer,
        b: &'a wgpu::Buffer,
        offsets: &'a wgpu::Buffer,
        rows: &'a wgpu::Buffer,
        c: &'a wgpu::Buffer,
        slots: usize,
        p: GroupedGemmParams,
    ) -> Result<(), GpuError> {
        self.grouped_gemm_format(a, b, WeightFormat::F32, offsets, rows, c, slots, p)
    }

    /// [`Self::grouped_gemm`] with the expert weights `b` stored as `b_format` (`b_group_stride`
    /// in elements either way), row-major; the tile is chosen as for f32.
    #[allow(clippy::too_many_arguments)]
    pub fn grouped_gemm_format(
        &mut self,
        a: &'a wgpu::Buffer,
        b: &'a wgpu::Buffer,
        b_format: WeightFormat,
        offsets: &'a wgpu::Buffer,
        rows: &'a wgpu::Buffer,
        c: &'a wgpu::Buffer,
        slots: usize,
        p: GroupedGemmParams,
    ) -> Result<(), GpuError> {
        let tile = grouped_tile_override().unwrap_or_else(|| grouped_gemm::choose(p.n, p.k, slots as u32, p.groups));
        let g = grouped_gemm::workgroups(tile, p.n, p.max_rows, p.groups);
        self.push(grouped_gemm::source_for(tile, b_format), &p, &[a, b, offsets, rows, c], g)
    }

    /// [`Self::grouped_gemm_format`] on an uploaded expert matrix: weights in K panels go through
    /// the tensor-core grouped GEMM (the upload only panels shapes it fits), row-major ones as
    /// [`Self::grouped_gemm_format`] takes them.
    #[allow(clippy::too_many_arguments)]
    pub fn grouped_gemm_matrix(
        &mut self,
        a: &'a wgpu::Buffer,
        w: &'a GpuMatrix,
        offsets: &'a wgpu::Buffer,
        rows: &'a wgpu::Buffer,
        c: &'a wgpu::Buffer,
        slots: usize,
        p: GroupedGemmParams,
    ) -> Result<(), GpuError> {
        self.grouped_gemm_matrix_a((a, AFormat::F32), w, offsets, rows, c, slots, p)
    }

    /// [`Self::grouped_gemm_matrix`] with A stored as the given format: f16 activations only for
    /// experts in K panels (the tensor-core kernel); anything else is [`GpuError::Unsupported`].
    #[allow(clippy::too_many_arguments)]
    pub fn grouped_gemm_matrix_a(
        &mut self,
        (a, a_format): (&'a wgpu::Buffer, AFormat),
        w: &'a GpuMatrix,
        offsets: &'a wgpu::Buffer,
        rows: &'a wgpu::Buffer,
        c: &'a wgpu::Buffer,
        slots: usize,
        p: GroupedGemmParams,
    ) -> Result<(), GpuError> {
        match w.layout {
            MatrixLayout::RowMajor if a_format != AFormat::F32 => Err(GpuError::Unsupported {
                what: format!("{a_format:?} activations for row-major experts (n {} k {}): only the tensor-core kernel reads them", p.n, p.k),
            }),
            MatrixLayout::RowMajor => self.grouped_gemm_format(a, &w.buffer, w.format, offsets, rows, c, slots, p),
            MatrixLayout::KPanels => {
                let (tile, path) = coop_grouped_gemm::choose(&p, slots as u32).ok_or_else(|| GpuError::Unsupported {
                    what: format!("expert weights in K panels for a grouped product of n {} k {} a_rs {}: no tensor-core tile fits", p.n, p.k, p.a_rs),
                })?;
                let (tile, path) = coop_grouped_override(&p, (tile, path));
                let p = coop_grouped_gemm::params_for(tile, &p);
                self.push(coop_grouped_gemm::source_with_a(tile, path, a_format), &p, &[a, &w.buffer, offsets, rows, c], coop_grouped_gemm::workgroups(tile, &p))
            }
        }
    }

    /// RoPE in place on `x: [tokens·heads, 2·half]`.
    pub fn rope(&mut self, x: &'a wgpu::Buffer, cos: &'a wgpu::Buffer, sin: &'a wgpu::Buffer, tokens: usize, heads: usize, half: usize) -> Result<(), GpuError> {
        let p = rope::RopeParams { tokens: tokens as u32, heads: heads as u32, half: half as u32, _pad: 0 };
        let g = self.groups(rope::workgroups(&p));
        self.push(rope::source(), &p, &[x, cos, sin], g)
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
    pub fn norm_rope_rows(&mut self, x: impl Into<Product<'a>>, rows: HeadRows<'a>, (cos, sin): (&'a wgpu::Buffer, &'a wgpu::Buffer), tokens: usize, heads: usize, d: usize, eps: f32) -> Result<(), GpuError> {
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
        let lanes = lanes_knob(norm_rope::lanes_for(&p));
        self.push(norm_rope::source_lanes(self.ctx.row_reduce(), lanes), &p, &[x.buffer, w, cos, sin, out, values, q_w, q_out], g)
    }

    /// Row softmax in place (with the attention mask of `p`).
    pub fn softmax(&mut self, x: &'a wgpu::Buffer, p: softmax::SoftmaxParams) -> Result<(), GpuError> {
        let g = self.groups(softmax::workgroups(&p));
        let lanes = row_lanes(&[p.cols]);
        self.push(softmax::source_lanes(self.ctx.row_reduce(), lanes), &p, &[x], g)
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
            return Err(GpuError::Unsupported { what: format!("chunked softmax of [{rows}, {cols}]: {} pairs, the partials buffer holds {}", p.pairs(), part.size() / 8) });
        }
        let g = self.groups(p.workgroups());
        self.push(softmax_chunked::partials(self.ctx.row_reduce()), &p, &[x, part], g)?;
        self.push(softmax_chunked::apply(self.ctx.row_reduce()), &p, &[x, part], g)
    }

    /// `out[rows, I] = gelu_tanh(in[:, :I]) ⊙ in[:, I:]` for `in: [rows, 2·I]` (a buffer or a
    /// split product, see [`Product`]).
    pub fn gelu_glu_fused(&mut self, input: impl Into<Product<'a>>, out: &'a wgpu::Buffer, rows: usize, inter: usize) -> Result<(), GpuError> {
        let input = input.into();
        let lanes = row_lanes(&[inter as u32, input.split_stride]);
        let p = gelu_glu::GeluGluParams::one(rows as u32, inter as u32, input.splits, input.split_stride).with_lanes(lanes);
        let g = self.groups(gelu_glu::workgroups(&p));
        self.push(gelu_glu::fused_lanes(lanes, false), &p, &[input.buffer, out], g)
    }

    /// Whether the activations of the experts `w` are best stored as f16: experts in K panels
    /// (read by the tensor cores, which round A to f16 as they stage it anyway) on a device with
    /// `SHADER_F16`; then the producer stores them so, and the product reads half A's bytes. On an
    /// H200 the experts' down projection went 258 → 247 µs, and since the pinned prefetches their
    /// gate/up 346 → 333; the dense 128×128 products went the other way before the pins (MLP down
    /// 37 → 42 µs, q 53 → 61) and gain at most a few µs since (q 55.9 → 54.9, MLP down 43.2 →
    /// 39.0, in the noise of `tests/half_activations.rs`), so they read f32.
    /// Tuning knob: `DG_F32_ACTIVATIONS=1` keeps them f32 (the same results, for comparison).
    pub fn half_activations_for_experts(&self, w: &GpuMatrix) -> bool {
        w.layout == MatrixLayout::KPanels
            && w.format == WeightFormat::F16
            && self.ctx.device.features().contains(wgpu::Features::SHADER_F16)
            && std::env::var("DG_F32_ACTIVATIONS").as_deref() != Ok("1")
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
        let lanes = row_lanes(&[inter as u32, inter_b as u32, input.split_stride]);
        let a = gelu_glu::GeluGluParams::one(rows as u32, inter as u32, input.splits, input.split_stride).with_lanes(lanes);
        let p = gelu_glu::GeluGluParams::pair(a, (rows_b as u32, inter_b as u32));
        let g = self.groups(gelu_glu::workgroups(&p));
        self.push(gelu_glu::pair_lanes(half_b, lanes), &p, &[input.buffer, out, input_b, out_b], g)
    }

    /// Rows `row_start..row_start+row_count` of the scaled embedding for the ids in that range.
    #[allow(clippy::too_many_arguments)]
    pub fn embed(&mut self, ids: &'a wgpu::Buffer, table: &'a wgpu::Buffer, out: &'a wgpu::Buffer, tokens: usize, hidden: usize, row_start: usize, row_count: usize, scale: f32) -> Result<(), GpuError> {
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
        let p = embed::EmbedParams { tokens: tokens as u32, hidden: hidden as u32, row_start: row_start as u32, row_count: row_count as u32, scale, _pad: [0; 3] };
        let g = self.groups(embed::workgroups(&p));
        self.push(embed::source_for(table_format), &p, &[ids, table, out], g)
    }

    /// `out = out·beta + x·alpha` over `n` values.
    pub fn axpby(&mut self, x: &'a wgpu::Buffer, out: &'a wgpu::Buffer, n: usize, alpha: f32, beta: f32) -> Result<(), GpuError> {
        let p = axpby::AxpbyParams { n: n as u32, alpha, beta, _pad: 0 };
        let g = self.groups(axpby::workgroups(&p));
        self.push(axpby::source(), &p, &[x, out], g)
    }

    /// Softmax over experts, top-k, renormalise, × per-expert scale.
    #[allow(clippy::too_many_arguments)]
    pub fn router_topk(&mut self, logits: impl Into<Product<'a>>, per_expert_scale: &'a wgpu::Buffer, idx: &'a wgpu::Buffer, w: &'a wgpu::Buffer, tokens: usize, experts: usize, k: usize) -> Result<(), GpuError> {
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
        self.push(router_topk::source(self.ctx.row_reduce()), &p, &[logits.buffer, per_expert_scale, idx, w], g)
    }

    /// The rows of the m tiles in which the tensor-core grouped GEMM would run the experts `w`
    /// over `slots` slots (`p` as for [`Self::grouped_gemm_matrix`]): what [`Self::moe_dispatch`]
    /// writes a tile table for. 0 where no table serves (row-major experts, or more of them than
    /// `dg_kernels::moe_dispatch::TABLE_EXPERTS`).
    pub fn expert_tile_rows(&self, w: &GpuMatrix, slots: usize, p: &GroupedGemmParams) -> u32 {
        match w.layout {
            MatrixLayout::KPanels if p.groups <= moe_dispatch::TABLE_EXPERTS => coop_grouped_gemm::choose(p, slots as u32).map_or(0, |choice| coop_grouped_override(p, choice).0.bm),
            _ => 0,
        }
    }

    /// Groups the `[tokens, k]` routing entries `idx` by expert (offsets, rows, slot_of; see
    /// `dg_kernels::moe_dispatch`); with `tile_rows` non-zero also the tensor-core grouped GEMM's
    /// tile table of m tiles of that many rows, after the offsets.
    #[allow(clippy::too_many_arguments)]
    pub fn moe_dispatch(&mut self, idx: &'a wgpu::Buffer, offsets: &'a wgpu::Buffer, rows: &'a wgpu::Buffer, slot_of: &'a wgpu::Buffer, tokens: usize, k: usize, experts: usize, tile_rows: u32) -> Result<(), GpuError> {
        let p = moe_dispatch::MoeDispatchParams { tokens: tokens as u32, k: k as u32, experts: experts as u32, tile_rows };
        let g = self.groups(moe_dispatch::workgroups(&p));
        self.push(moe_dispatch::source(), &p, &[idx, offsets, rows, slot_of], g)
    }

    /// Per token, the weighted sum of its experts' outputs in ascending expert order.
    #[allow(clippy::too_many_arguments)]
    pub fn moe_combine(&mut self, y: &'a wgpu::Buffer, idx: &'a wgpu::Buffer, w: &'a wgpu::Buffer, slot_of: &'a wgpu::Buffer, out: &'a wgpu::Buffer, tokens: usize, k: usize, hidden: usize) -> Result<(), GpuError> {
        let p = moe_combine::MoeCombineParams { tokens: tokens as u32, k: k as u32, hidden: hidden as u32, _pad: 0 };
        let g = self.groups(moe_combine::workgroups(&p));
        self.push(moe_combine::source_for(hidden as u32), &p, &[y, idx, w, slot_of, out], g)
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
        self.push(sample_rows::source(), &p, &[logits, scaled, step, draws, results], g)
    }
}

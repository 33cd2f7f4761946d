//! The planner: every choice of how a matrix product runs, in one place. At upload, the layout a
//! weight matrix is stored in (K panels for the tensor cores, or row-major); at record time, for
//! dense, batched and grouped (experts) products, the kernel (tensor-core or portable), its tile,
//! W path, split of K and grid, and whether q, K and V run as one product.
//!
//! A [`Planner`] is the device's [`Capabilities`] (a plain value, so that the choices can be tested
//! without a device: `tests/planner.rs` holds them for the real model's products) and the
//! [`Tuning`]. It is a leaf of dg-gpu: it imports the shapes it plans for (`crate::shapes`), never
//! the arena, the ops or the device (`GpuContext::planner` builds one for an open device). Its
//! rules and measured thresholds are its submodules: [`coop_dense`] (the dense tensor-core tile
//! and stages), [`split`] (split K), [`experts`] (the experts' tensor-core tile, path and stages)
//! and [`portable`] (the portable kernels' tiles); the kernels in dg-kernels say only what they
//! take (`coop_gemm::layout`, `coop_gemm::takes`, `coop_grouped_gemm::fits`).

pub mod coop_dense;
pub mod experts;
pub mod portable;
pub mod split;

use dg_kernels::coop_gemm::{self, AFormat, BLayout, CoopTile, Split, WPath};
use dg_kernels::gemm::{GemmParams, GemmTile};
use dg_kernels::grouped_gemm::{GroupedGemmParams, GroupedTile};
use dg_kernels::native_grouped_gemm::{self, NativeShape, NativeShapes};
use dg_kernels::native_int8_gemm::{Int8Shape, Int8Shapes};
use dg_kernels::{CoopGemmKey, WeightFormat};
use dg_kernels::{coop_grouped_gemm, moe_dispatch};

use dg_model::ModelConfig;

use crate::overrides::QkvChoice;
use crate::shapes::{KEY_PAD, MatrixLayout, attention_scores_params, attention_values_params};
use crate::tuning::Tuning;

/// What the planner needs to know of a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// The device runs the tensor-core GEMM ([`GpuContext::coop_matrix`]: cooperative matrices,
    /// and the tuning leaves them on).
    pub coop_matrix: bool,
    /// Side of the fragments the tensor-core kernels multiply ([`GpuContext::coop_fragment`]):
    /// every tensor-core tile the planner hands out is in fragments of it.
    pub coop_fragment: u32,
    /// The fragment shapes of the Vulkan-native kernels the device runs ([`GpuContext::native`]).
    pub native: NativeShapes,
    /// The fragment shapes of the native kernel's int8 mode the device runs
    /// ([`GpuContext::int8`]: none unless asked for).
    pub int8: Int8Shapes,
    /// f16 in shaders (`SHADER_F16`).
    pub shader_f16: bool,
    /// Bytes of workgroup memory a kernel may use (`max_compute_workgroup_storage_size`).
    pub max_workgroup_storage: u32,
    /// Largest storage binding in bytes ([`GpuContext::max_binding`]).
    pub max_binding: u64,
    /// Multiprocessors (SMs, compute units) the device runs workgroups on: what a product's waves
    /// of workgroups and its split-K targets count in.
    pub multiprocessors: u32,
}

/// The multiprocessors [`Capabilities::of`] assumes: wgpu reports no count, and the split-K
/// targets were measured on a 132-multiprocessor H200.
pub const ASSUMED_MULTIPROCESSORS: u32 = 132;

impl Capabilities {
    /// An NVIDIA H200 through Vulkan (cooperative matrices with 16×8×16 and 16×16×16 f16
    /// fragments, subgroups of 32, SPIR-V passthrough, 48 KiB of workgroup memory, 132
    /// multiprocessors): what dg's measured choices were made on, for planning without a device.
    pub const H200: Capabilities = Capabilities {
        coop_matrix: true,
        coop_fragment: coop_gemm::FRAGMENT,
        native: NativeShapes::NONE.with(NativeShape::F16x8x16).with(NativeShape::F16x16x16),
        int8: Int8Shapes::NONE,
        shader_f16: true,
        max_workgroup_storage: 48 * 1024,
        max_binding: u32::MAX as u64,
        multiprocessors: 132,
    };
}

/// What a product's B is: a weight as uploaded (in its [`MatrixLayout`]), or the KV cache, the
/// row-major f32 or f16 keys and values that attention's products read
/// (`crate::arena::cache_format`). The cache alone takes attention's tile where the large one
/// would split K and it would not and, with ragged columns, a tensor-core body and a portable
/// tail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BSource {
    Weight(MatrixLayout),
    KvCache,
}

impl BSource {
    fn panels(self) -> bool {
        self == BSource::Weight(MatrixLayout::KPanels)
    }
}

impl From<MatrixLayout> for BSource {
    fn from(layout: MatrixLayout) -> Self {
        BSource::Weight(layout)
    }
}

/// How a dense or batched product runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dense {
    /// On the tensor cores (`dg_kernels::coop_gemm`).
    TensorCores(CoopPlan),
    /// Ragged columns: the first `n_body` columns (whole 32-wide blocks) as a product of their own
    /// (planned again with `n = n_body`), the rest in the portable GEMM.
    BodyAndTail { n_body: u32 },
    /// The portable f32-arithmetic GEMM (`dg_kernels::gemm`).
    Portable { tile: GemmTile },
}

/// A product on the tensor cores: the kernel (tile, W path, B format and layout, A format), and
/// the split of K.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CoopPlan {
    pub kernel: CoopGemmKey,
    /// `None`: the product whole; else its partials, added by the consumer or by `split_k`.
    pub split: Option<Split>,
}

/// How a grouped (experts) product runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grouped {
    /// The tensor-core grouped GEMM (`dg_kernels::coop_grouped_gemm`), experts in K panels.
    TensorCores { tile: CoopTile, path: WPath },
    /// The Vulkan-native grouped GEMM of short groups (`dg_kernels::native_grouped_gemm`) in
    /// fragments of `shape`, experts in K panels.
    Native { shape: NativeShape },
    /// Its int8 mode (`dg_kernels::native_int8_gemm`) in fragments of `shape`.
    NativeInt8 { shape: Int8Shape },
    /// The portable grouped GEMM (`dg_kernels::grouped_gemm`), row-major experts.
    Portable { tile: GroupedTile },
}

/// A product no kernel can take with its weights as stored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct NoKernel(pub String);

/// The device's capabilities and the tuning: see the module documentation.
#[derive(Debug, Clone, Copy)]
pub struct Planner<'t> {
    pub caps: Capabilities,
    pub tuning: &'t Tuning,
}

impl<'t> Planner<'t> {
    pub fn new(caps: Capabilities, tuning: &'t Tuning) -> Self {
        Planner { caps, tuning }
    }

    /// The layout a projection's `[n, k]` blocks are stored in when uploaded as `format`: K panels
    /// where the tensor cores run its products (`tensor_cores`: the F16 mode, on a device with
    /// cooperative matrices, and a tile takes `[m, k] · Wᵀ` for any m) and read the format in
    /// panels (F16, and with `tensor_cores` the quantized formats whose blocks are a panel wide:
    /// `coop_gemm::panelled`), else row-major.
    pub fn projection_layout(&self, format: WeightFormat, n: usize, k: usize, tensor_cores: bool) -> MatrixLayout {
        let probe = GemmParams::linear(1, n as u32, k as u32);
        let panelled = coop_gemm::panelled(format) && (format == WeightFormat::F16 || tensor_cores);
        match panelled && self.caps.coop_matrix && coop_dense::tile(&probe, true, None, self.caps.max_workgroup_storage).is_some() {
            true => MatrixLayout::KPanels,
            false => MatrixLayout::RowMajor,
        }
    }

    /// The layout expert weights `[experts, n, k]` are stored in when uploaded as `format`: K
    /// panels for the tensor-core grouped GEMM (F16, or with `tensor_cores`, the F16 mode, a
    /// quantized format in panels of its blocks) on a device with cooperative matrices where a
    /// tile fits the shape, else row-major.
    pub fn experts_layout(&self, format: WeightFormat, n: usize, k: usize, tensor_cores: bool) -> MatrixLayout {
        let read = format == WeightFormat::F16 || (tensor_cores && format.is_quantized());
        match read && self.caps.coop_matrix && coop_grouped_gemm::panels_fit(format, n as u32, k as u32) {
            true => MatrixLayout::KPanels,
            false => MatrixLayout::RowMajor,
        }
    }

    /// How `p` runs with B stored as `b_format`, a weight in its layout or the cache (`b`): on the
    /// tensor cores when `tensor_cores` (the F16 mode) is set, the device has them and a tile takes
    /// the product (split K where `split_scratch`, the f32 elements of the split-K scratch, holds
    /// the partials and [`split::choose`] says so); the cache with ragged columns as a tensor-core
    /// body and a portable tail; everything else portable. B in K panels that no tensor-core tile
    /// takes is an error, never a misread.
    pub fn dense(
        &self,
        b_format: WeightFormat,
        b: impl Into<BSource>,
        p: &GemmParams,
        tensor_cores: bool,
        split_scratch: Option<u64>,
    ) -> Result<Dense, NoKernel> {
        let b = b.into();
        let panels = b.panels();
        let planned = self.coop_tile(b_format, b, p, tensor_cores, split_scratch);
        if panels && (planned.is_none() || !coop_gemm::panelled(b_format)) {
            return Err(NoKernel(format!(
                "a {b_format:?} matrix in K panels for a product of m {} n {} k {} (b_cs {}): no tensor-core tile takes it",
                p.m, p.n, p.k, p.b_cs
            )));
        }
        if let Some((tile, layout)) = planned {
            // Staged by default (on an H200 direct loads took q_proj 83 → 133 µs; the experts'
            // grouped GEMM goes the other way, see [`experts::choose`]); the tuning's path
            // where the kernel takes it (`CoopGemmKey::is_valid`: direct and single-stage W need
            // F16, direct `W[n][k]`), else staged.
            let staged = CoopGemmKey { tile, path: WPath::Staged, w: b_format, layout, a: AFormat::F32 };
            let tuned =
                CoopGemmKey { tile: tile.on_path(self.tuning.overrides.coop_path), path: self.tuning.overrides.coop_path, ..staged };
            let kernel = Some(tuned).filter(|k| k.is_valid()).unwrap_or(staged);
            let split = self.split(tile, p, split_scratch);
            return Ok(Dense::TensorCores(CoopPlan { kernel, split }));
        }
        if tensor_cores && self.caps.coop_matrix {
            // Ragged columns (a sliding layer's scores over its 1023 visible keys): the body of
            // whole 32-wide column blocks on the tensor cores, the last columns in the f32 GEMM.
            // Only for the cache (attention), the case measured on an H200 and tested
            // (`tests/tensor_cores.rs`); ragged K stays in the f32 GEMM.
            const STEP: u32 = 32;
            let n_body = p.n / STEP * STEP;
            let body = GemmParams { n: n_body, ..*p };
            if b == BSource::KvCache && n_body > 0 && n_body < p.n && coop_dense::plan(&body).is_some() {
                return Ok(Dense::BodyAndTail { n_body });
            }
        }
        Ok(Dense::Portable { tile: self.portable(p) })
    }

    /// The portable GEMM's tile for `p` (any B format, the tile chosen as for f32).
    pub fn portable(&self, p: &GemmParams) -> GemmTile {
        portable::choose_batched(p.m, p.n, p.k, p.batch)
    }

    /// The tile (and B layout) on which the tensor cores run `p` with B stored as `b_format` (a
    /// weight in K panels or not, or the cache), if they do: what [`Self::dense`] plans and
    /// [`Self::coop_waves`] counts.
    fn coop_tile(
        &self,
        b_format: WeightFormat,
        b: BSource,
        p: &GemmParams,
        tensor_cores: bool,
        split_scratch: Option<u64>,
    ) -> Option<(CoopTile, BLayout)> {
        if !tensor_cores || !self.caps.coop_matrix {
            return None;
        }
        // Attention's products (B: the cache) take their own tile where the large one would
        // split K and it would not (`coop_gemm::ATTENTION_TILE`).
        let splits = |tile: CoopTile| self.split(tile, p, split_scratch).is_some();
        let prefer =
            match b {
                BSource::KvCache => self.tuning.overrides.attention_tile.or(self.tuning.overrides.coop_tile).or_else(|| {
                    (splits(coop_gemm::TILE_128X128) && !splits(coop_gemm::ATTENTION_TILE)).then_some(coop_gemm::ATTENTION_TILE)
                }),
                BSource::Weight(_) => self.tuning.overrides.coop_tile,
            };
        // Quantized W is read as `W[n][k]` (its blocks run along the rows), or in panels of them.
        coop_dense::tile(p, b.panels(), prefer, self.caps.max_workgroup_storage)
            .filter(|&(_, layout)| !b_format.is_quantized() || layout != BLayout::Kn)
            .map(|(tile, layout)| {
                let tile = self.tuning.overrides.dense_depth(tile);
                let tile = self.tuning.overrides.stages(tile, coop_dense::stages(tile, p, self.caps.multiprocessors));
                (tile.with_fragment(self.caps.coop_fragment), layout)
            })
    }

    /// How `p` on `tile` splits its K, if it does: where `split_scratch` (the f32 elements of the
    /// split-K scratch) holds the partials and [`split::choose`] says so.
    fn split(&self, tile: CoopTile, p: &GemmParams, split_scratch: Option<u64>) -> Option<Split> {
        split_scratch.and_then(|len| split::choose(tile, p, self.split_target(tile, p), len))
    }

    /// The workgroups a tensor-core GEMM is split towards: [`Overrides::split_target`](crate::Overrides::split_target), else
    /// [`split::target`] on this device's multiprocessors (0 never splits).
    fn split_target(&self, tile: CoopTile, p: &GemmParams) -> u32 {
        self.tuning.overrides.split_target.unwrap_or_else(|| split::target(tile, p, self.caps.multiprocessors))
    }

    /// How the product `p` of a matrix stored as `format` in `layout` would run on the tensor
    /// cores: in how many waves of workgroups (its tiles over those the device's multiprocessors
    /// hold at once: one workgroup of the tile each, two up to
    /// [`split::PAIR_RESIDENT_SHARED_BYTES`] of workgroup memory), and whether it splits K;
    /// `None` where it would not run there.
    pub fn coop_waves(
        &self,
        format: WeightFormat,
        layout: MatrixLayout,
        p: &GemmParams,
        split_scratch: Option<u64>,
    ) -> Option<(u32, bool)> {
        let tensor_cores = format == WeightFormat::F16 || format.is_quantized();
        let (tile, _) = self.coop_tile(format, layout.into(), p, tensor_cores, split_scratch)?;
        let per_sm = if tile.dense_shared_bytes() > split::PAIR_RESIDENT_SHARED_BYTES { 1 } else { 2 };
        let waves = (tile.tiles(p.m, p.n) * p.batch.max(1)).div_ceil(per_sm * self.caps.multiprocessors);
        let splits = self.split(tile, p, split_scratch).is_some();
        Some((waves, splits))
    }

    /// Whether the tensor cores (`tensor_cores`: the F16 mode) run every attention product of
    /// `config`: each layer's scores over keys and its values, by the cache's rules, at its head
    /// dim, over a canvas's rows and keys in whole `KEY_PAD` blocks as the forward lays them out.
    /// They then read K and V rounded to f16 whichever format the cache stores
    /// (`crate::arena::cache_format`).
    pub fn attention_on_tensor_cores(&self, config: &ModelConfig, tensor_cores: bool) -> bool {
        let (heads, c) = (config.text.num_attention_heads, config.canvas_length);
        let keys = KEY_PAD + c;
        config.text.layers.iter().all(|spec| {
            let (d, kv) = (spec.head_dim, spec.num_kv_heads);
            let scores = attention_scores_params(c, keys, d, heads, kv);
            let values = attention_values_params(c, keys, d, heads, kv);
            [scores, values]
                .iter()
                .all(|p| matches!(self.dense(WeightFormat::F32, BSource::KvCache, p, tensor_cores, None), Ok(Dense::TensorCores(_))))
        })
    }

    /// Whether q, K and V run as one product (`q` and `kv` the products of q's blocks and of
    /// K/V's of the matrix stored as `format` in `layout`): wherever they do not run on the tensor
    /// cores (one dispatch fewer), and on the tensor cores where the merged product takes no more
    /// waves of workgroups than q's alone and K/V's (a product that splits K counting as none: its
    /// splits fill the wave it shares). The decoder's sliding layers merge (128 tiles of 128×128:
    /// one wave, as q's 64 alone), its full layers do not (144: two waves, where q's 128 take one
    /// and K's 16 split). [`Overrides::qkv`](crate::Overrides::qkv) overrides it.
    pub fn merge_qkv(
        &self,
        format: WeightFormat,
        layout: MatrixLayout,
        q: &GemmParams,
        kv: &GemmParams,
        split_scratch: Option<u64>,
    ) -> bool {
        match self.tuning.overrides.qkv {
            QkvChoice::Merged => return true,
            QkvChoice::Separate => return false,
            QkvChoice::Auto => {}
        }
        let merged = GemmParams { batch: q.batch + kv.batch, ..*q };
        let waves = |p: &GemmParams| self.coop_waves(format, layout, p, split_scratch);
        match (waves(&merged), waves(q), waves(kv)) {
            (Some((all, _)), Some((q_waves, _)), Some((kv_waves, kv_splits))) => all <= q_waves + if kv_splits { 0 } else { kv_waves },
            _ => true,
        }
    }

    /// How the grouped product `p` over `slots` slots runs on experts stored as `format` in
    /// `layout`: K panels (F16, or ggml blocks a panel apiece) in the native kernel where the
    /// device runs it and the groups are short ([`experts::native`]) and the lab's overrides name
    /// no tile, path or depth of WGSL's (which they then measure), else on the tensor cores
    /// ([`experts::choose`], then the tuning's overrides, a W path the kernel takes for the
    /// format), row-major in the portable grouped GEMM (the tile by the mean group size).
    pub fn grouped(&self, format: WeightFormat, layout: MatrixLayout, p: &GroupedGemmParams, slots: u32) -> Result<Grouped, NoKernel> {
        match layout {
            MatrixLayout::RowMajor => Ok(Grouped::Portable {
                tile: self.tuning.overrides.grouped_tile.unwrap_or_else(|| portable::choose_grouped(p.n, p.k, slots, p.groups)),
            }),
            MatrixLayout::KPanels => {
                let lab_names_a_tile = self.tuning.overrides.names_expert_kernel();
                if let Some(shape) = experts::int8(self.caps.int8, p, format, slots).filter(|_| !lab_names_a_tile) {
                    return Ok(Grouped::NativeInt8 { shape });
                }
                if let Some(shape) =
                    experts::native(self.caps.native, p, format, slots).filter(|_| !self.tuning.overrides.names_expert_kernel())
                {
                    return Ok(Grouped::Native { shape });
                }
                let (tile, path) = self.coop_grouped(p, format, slots).ok_or_else(|| {
                    NoKernel(format!(
                        "expert weights in K panels for a grouped product of n {} k {} a_rs {}: no tensor-core tile fits",
                        p.n, p.k, p.a_rs
                    ))
                })?;
                let path = if coop_grouped_gemm::reads(format, path) { path } else { WPath::Staged };
                let tile = self.tuning.overrides.stages(tile, experts::stages(format)).on_path(path);
                Ok(Grouped::TensorCores { tile: tile.with_fragment(self.caps.coop_fragment), path })
            }
        }
    }

    /// The experts' tensor-core tile and W path after the tuning's overrides
    /// ([`Overrides::coop_grouped_path`](crate::Overrides::coop_grouped_path), [`Overrides::coop_grouped_tiles`](crate::Overrides::coop_grouped_tiles) where it fits,
    /// [`Overrides::coop_grouped_depth`](crate::Overrides::coop_grouped_depth)); its stages are the format's ([`Self::grouped`]).
    fn coop_grouped(&self, p: &GroupedGemmParams, format: WeightFormat, slots: u32) -> Option<(CoopTile, WPath)> {
        let (tile, path) = experts::choose(p, format, slots)?;
        let path = self.tuning.overrides.coop_grouped_path.unwrap_or(path);
        let tile = (self.tuning.overrides.coop_grouped_tiles.iter())
            .find(|t| coop_grouped_gemm::fits(**t, p) && coop_grouped_gemm::runs(**t, path))
            .copied()
            .unwrap_or(tile);
        Some((self.tuning.overrides.grouped_depth(tile), path))
    }

    /// The rows of the m tiles in which the tensor-core grouped GEMM would run experts stored as
    /// `format` in `layout` over `slots` slots: what the MoE dispatch writes a tile table for. 0
    /// where no table serves (row-major experts, or more of them than
    /// `moe_dispatch::TABLE_EXPERTS`).
    pub fn expert_tile_rows(&self, format: WeightFormat, layout: MatrixLayout, slots: u32, p: &GroupedGemmParams) -> u32 {
        match self.grouped(format, layout, p, slots) {
            Ok(Grouped::TensorCores { tile, .. }) if p.groups <= moe_dispatch::TABLE_EXPERTS => tile.bm,
            Ok(Grouped::Native { .. } | Grouped::NativeInt8 { .. }) if p.groups <= moe_dispatch::TABLE_EXPERTS => {
                native_grouped_gemm::SLOTS
            }
            _ => 0,
        }
    }

    /// Whether the activations of experts stored in `layout` are best stored as f16: experts in
    /// K panels (read by the tensor cores, which round A to f16 as they stage it anyway) on a
    /// device with `SHADER_F16`; then the producer stores them so, and the product reads half A's
    /// bytes. On an H200 the experts' down projection went 258 → 247 µs, and since the pinned
    /// prefetches their gate/up 346 → 333; the dense 128×128 products went the other way before
    /// the pins (MLP down 37 → 42 µs, q 53 → 61) and gain at most a few µs since (q 55.9 → 54.9,
    /// MLP down 43.2 → 39.0, in the noise of `tests/half_activations.rs`), so they read f32.
    /// [`Overrides::half_expert_activations`](crate::Overrides::half_expert_activations) false keeps them f32 (the same results, for comparison).
    pub fn half_expert_activations(&self, layout: MatrixLayout) -> bool {
        layout == MatrixLayout::KPanels && self.caps.shader_f16 && self.tuning.overrides.half_expert_activations
    }

    /// Whether the input of a down projection whose products run on the tensor cores
    /// (`on_tensor_cores`: `GpuWeights::on_tensor_cores` of its matrix) is scaled by rows into
    /// f16's range (`dg_kernels::gelu_glu::fused_scaled`, its consumer multiplying the rows
    /// back): wherever the device has cooperative matrices, since those products round their
    /// activations to f16 and a gated activation is bounded by no norm.
    /// [`Overrides::scale_rows`](crate::Overrides::scale_rows) false leaves them unscaled.
    pub fn scales_rows(&self, on_tensor_cores: bool) -> bool {
        on_tensor_cores && self.caps.coop_matrix && self.tuning.overrides.scale_rows
    }
}

//! The lab's overrides of the planner's and the forward's choices: alternatives that were
//! measured and not taken (tiles no rule picks, W paths, prefetch depths, split-K targets, fused
//! or separate dispatches), kept so that they can be measured again. One plain value, carried in
//! [`crate::Tuning::overrides`]; [`Overrides::default`] is the product's own choice everywhere.
//! dg-gpu never parses them: dg-lab's `overrides` does, from the `DG_*` variables of
//! [`crate::tuning::LAB_VARIABLES`], for the lab's tools (`cargo xtask bench-gpu`, `probe`...).

use dg_kernels::coop_gemm::{CoopTile, Stages, WPath};
use dg_kernels::{coop_kloop, grouped_gemm};

/// Every override; each field's documentation names dg-lab's variable for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overrides {
    /// `DG_ROW_LANES=1`: how many columns the row kernels take at a time.
    pub row_lanes: RowLanes,
    /// `DG_UNFUSED_COMBINE=1` sets it false: the MoE combine in a dispatch of its own instead of
    /// inside the closing norms'.
    pub fused_combine: bool,
    /// `DG_F32_ACTIVATIONS=1` sets it false: the experts' activations stay f32 instead of f16
    /// where the tensor cores read them.
    pub half_expert_activations: bool,
    /// `DG_UNSCALED_ROWS=1` sets it false: the down projections' inputs are not scaled by rows
    /// into f16's range where the tensor cores round them (for measuring the scaling's cost: a
    /// row past 65504 then becomes inf).
    pub scale_rows: bool,
    /// `DG_QKV=merged|separate`: whether q, K and V run as one product.
    pub qkv: QkvChoice,
    /// `DG_COOP_TILE=BMxBN` or a full tile label: the dense tensor-core GEMM's tile wherever it
    /// fits (one of `coop_gemm::TILES` or `coop_gemm::TUNING_TILES`).
    pub coop_tile: Option<CoopTile>,
    /// `DG_ATTENTION_TILE=BMxBN` or a full tile label: the tensor-core tile of attention's
    /// products (q · Kᵀ and P · V, B the KV cache) wherever it fits, in place of the planner's
    /// choice and of [`Self::coop_tile`] there.
    pub attention_tile: Option<CoopTile>,
    /// `DG_COOP_PATH=staged|direct|single`: how the dense tensor-core GEMM's W fragments reach
    /// the tensor cores where the kernel takes it (`dg_kernels::CoopGemmKey::is_valid`: direct
    /// only for F16 `W[n][k]`, single only for F16); the rest stays staged.
    pub coop_path: WPath,
    /// `DG_COOP_DEPTH=N`: the dense tensor-core tile's global loads `N` K steps ahead.
    pub coop_depth: Option<u32>,
    /// `DG_SPLIT_TARGET=N`: the workgroups a tensor-core GEMM is split towards (0: never split).
    pub split_target: Option<u32>,
    /// `DG_GROUPED_TILE=BMxBN`: the experts' tile in the portable grouped GEMM.
    pub grouped_tile: Option<grouped_gemm::GroupedTile>,
    /// `DG_COOP_GROUPED_TILE=BMxBN` or a full label: the experts' tensor-core tiles it names (dg-lab
    /// resolves the name among the product's tiles and its own), the first that fits the product
    /// and runs by the path chosen (`coop_grouped_gemm::fits`, `coop_grouped_gemm::runs`) taken.
    pub coop_grouped_tiles: Vec<CoopTile>,
    /// `DG_GROUPED_PATH=staged|direct|single`: the experts' tensor-core W path.
    pub coop_grouped_path: Option<WPath>,
    /// `DG_COOP_GROUPED_DEPTH=N`: the experts' tensor-core tile's loads `N` K steps ahead.
    pub coop_grouped_depth: Option<u32>,
    /// `DG_COOP_STAGES=alternating|constant`: how every tensor-core K loop with two stages names
    /// them (`coop_kloop::Stages`), dense and experts alike, instead of per product.
    pub coop_stages: Option<coop_kloop::Stages>,
}

impl Default for Overrides {
    fn default() -> Self {
        Overrides {
            row_lanes: RowLanes::Auto,
            fused_combine: true,
            half_expert_activations: true,
            scale_rows: true,
            qkv: QkvChoice::Auto,
            coop_tile: None,
            attention_tile: None,
            coop_path: WPath::Staged,
            coop_depth: None,
            split_target: None,
            grouped_tile: None,
            coop_grouped_tiles: Vec::new(),
            coop_grouped_path: None,
            coop_grouped_depth: None,
            coop_stages: None,
        }
    }
}

/// The columns a row kernel takes at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowLanes {
    /// As many as the rows' widths, offsets and strides allow (`auto`, `dg_kernels::lanes_for`).
    Auto,
    /// One (`1`).
    One,
}

/// Whether q, K and V run as one product.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QkvChoice {
    /// Merged where it takes no more waves of workgroups than separate (`auto`).
    Auto,
    /// Always one product (`merged`).
    Merged,
    /// Always separate products (`separate`).
    Separate,
}

impl Overrides {
    /// `tile` with its loads issued [`Self::coop_depth`] K steps ahead where that makes a valid
    /// tile, else as it is.
    pub fn dense_depth(&self, tile: CoopTile) -> CoopTile {
        with_depth(tile, self.coop_depth)
    }

    /// [`Self::dense_depth`] for the experts' tile ([`Self::coop_grouped_depth`]).
    pub fn grouped_depth(&self, tile: CoopTile) -> CoopTile {
        with_depth(tile, self.coop_grouped_depth)
    }

    /// Whether the overrides name a tile, W path or depth of the experts' WGSL tensor-core kernel
    /// (`DG_COOP_GROUPED_TILE`, `DG_GROUPED_PATH`, `DG_COOP_GROUPED_DEPTH`): then that kernel runs
    /// the experts, where the native one would otherwise (`crate::planner::experts::native`).
    pub fn names_expert_kernel(&self) -> bool {
        !self.coop_grouped_tiles.is_empty() || self.coop_grouped_path.is_some() || self.coop_grouped_depth.is_some()
    }

    /// `tile` with the stages [`Self::coop_stages`] names, else `chosen`.
    pub fn stages(&self, tile: CoopTile, chosen: Stages) -> CoopTile {
        tile.with_stages(self.coop_stages.unwrap_or(chosen))
    }
}

fn with_depth(tile: CoopTile, depth: Option<u32>) -> CoopTile {
    match depth {
        Some(depth) if depth <= coop_kloop::MAX_DEPTH && tile.with_depth(depth).is_valid() => tile.with_depth(depth),
        _ => tile,
    }
}

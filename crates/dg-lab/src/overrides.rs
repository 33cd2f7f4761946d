//! The lab's variables: the `DG_*` names of [`dg_gpu::tuning::LAB_VARIABLES`], parsed into the
//! one [`Overrides`] value through which they reach dg-gpu's planner and forward. Each selects an
//! alternative that was measured and not taken (bench/history), for measuring it again; dg and
//! the library crates refuse them. The lab's tools (`cargo xtask bench-gpu`, `bench-generate`,
//! `bench-batch`, `probe`) open their device with [`gpu_options_from_env`].
//!
//! An empty value counts as unset; a value outside the accepted ones is an error naming the
//! variable and listing what it accepts.

use dg_gpu::overrides::{QkvChoice, RowLanes};
use dg_gpu::tuning::{LAB_VARIABLES, TuningError, choice, env_vars, flag};
use dg_gpu::{GpuOptions, Overrides};
use dg_kernels::coop_gemm::{self, CoopTile, Stages, WPath};
use dg_kernels::{coop_grouped_gemm, coop_kloop, grouped_gemm};

use crate::tiles;

/// The device options of this process's `DG_*` variables: the product's ([`GpuOptions::from_vars`])
/// with the lab's [`Overrides`] from the rest.
pub fn gpu_options_from_env() -> Result<GpuOptions, TuningError> {
    gpu_options_from_vars(env_vars())
}

/// [`gpu_options_from_env`] over any list of variables.
pub fn gpu_options_from_vars<N: AsRef<str>, V: AsRef<str>>(vars: impl IntoIterator<Item = (N, V)>) -> Result<GpuOptions, TuningError> {
    type Vars = Vec<(String, String)>;
    let (lab, product): (Vars, Vars) = vars
        .into_iter()
        .map(|(n, v)| (n.as_ref().to_string(), v.as_ref().to_string()))
        .partition(|(name, _)| LAB_VARIABLES.contains(&name.as_str()));
    let mut options = GpuOptions::from_vars(product)?;
    options.tuning.overrides = from_vars(lab)?;
    Ok(options)
}

/// The overrides that `vars` ask for: the product's choices overridden by every lab variable
/// among them (other variables are passed over).
pub fn from_vars<N: AsRef<str>, V: AsRef<str>>(vars: impl IntoIterator<Item = (N, V)>) -> Result<Overrides, TuningError> {
    let mut overrides = Overrides::default();
    for (name, value) in vars {
        let (name, value) = (name.as_ref(), value.as_ref());
        if LAB_VARIABLES.contains(&name) && !value.is_empty() {
            set(&mut overrides, name, value)?;
        }
    }
    Ok(overrides)
}

/// A tensor-core tile named by a variable: its `BMxBN` shape (every tile of a list with that
/// shape) or one tile exactly (by its full label, `CoopTile::label`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TileName {
    Shape { bm: u32, bn: u32 },
    Exact(CoopTile),
}

impl TileName {
    /// Whether this names `tile`.
    pub fn names(self, tile: CoopTile) -> bool {
        match self {
            TileName::Shape { bm, bn } => (tile.bm, tile.bn) == (bm, bn),
            TileName::Exact(t) => t == tile,
        }
    }

    /// The name `wanted` gives among `tiles`, if it names one of them.
    pub fn parse(wanted: &str, tiles: &[CoopTile]) -> Option<TileName> {
        if let Some(t) = tiles.iter().find(|t| t.label() == wanted) {
            return Some(TileName::Exact(*t));
        }
        tiles.iter().find(|t| format!("{}x{}", t.bm, t.bn) == wanted).map(|t| TileName::Shape { bm: t.bm, bn: t.bn })
    }
}

/// Applies one lab variable.
fn set(o: &mut Overrides, name: &str, value: &str) -> Result<(), TuningError> {
    let bad = || TuningError::BadValue { name: name.into(), value: value.into(), accepted: accepted(name) };
    let paths = [("staged", WPath::Staged), ("direct", WPath::Direct), ("single", WPath::Single)];
    match name {
        "DG_ROW_LANES" => o.row_lanes = choice(value, &[("auto", RowLanes::Auto), ("1", RowLanes::One)]).ok_or_else(bad)?,
        "DG_UNFUSED_COMBINE" => o.fused_combine = !flag(value).ok_or_else(bad)?,
        "DG_F32_ACTIVATIONS" => o.half_expert_activations = !flag(value).ok_or_else(bad)?,
        "DG_UNSCALED_ROWS" => o.scale_rows = !flag(value).ok_or_else(bad)?,
        "DG_QKV" => {
            o.qkv = choice(value, &[("auto", QkvChoice::Auto), ("merged", QkvChoice::Merged), ("separate", QkvChoice::Separate)])
                .ok_or_else(bad)?
        }
        "DG_COOP_TILE" | "DG_ATTENTION_TILE" => {
            // The first tile of the lists that the value names, as `dg_gpu::planner::coop_dense::tile` prefers it.
            let tiles: Vec<CoopTile> = dense_tiles().collect();
            let wanted = TileName::parse(value, &tiles).ok_or_else(bad)?;
            let tile = tiles.into_iter().find(|t| wanted.names(*t));
            match name {
                "DG_COOP_TILE" => o.coop_tile = tile,
                _ => o.attention_tile = tile,
            }
        }
        "DG_COOP_PATH" => o.coop_path = choice(value, &paths).ok_or_else(bad)?,
        "DG_COOP_DEPTH" => o.coop_depth = Some(depth(value).ok_or_else(bad)?),
        "DG_SPLIT_TARGET" => o.split_target = Some(value.parse().map_err(|_| bad())?),
        "DG_GROUPED_TILE" => {
            o.grouped_tile = Some(grouped_gemm::TILES.iter().copied().find(|t| format!("{}x{}", t.bm, t.bn) == value).ok_or_else(bad)?);
        }
        "DG_COOP_GROUPED_TILE" => {
            let tiles: Vec<CoopTile> = grouped_tiles().collect();
            let wanted = TileName::parse(value, &tiles).ok_or_else(bad)?;
            o.coop_grouped_tiles = tiles.into_iter().filter(|t| wanted.names(*t)).collect();
        }
        "DG_GROUPED_PATH" => o.coop_grouped_path = Some(choice(value, &paths).ok_or_else(bad)?),
        "DG_COOP_GROUPED_DEPTH" => o.coop_grouped_depth = Some(depth(value).ok_or_else(bad)?),
        "DG_COOP_STAGES" => {
            let stages = [("auto", None), ("alternating", Some(Stages::Alternating)), ("constant", Some(Stages::Constant))];
            o.coop_stages = choice(value, &stages).ok_or_else(bad)?;
        }
        _ => unreachable!("{name} is one of LAB_VARIABLES, each handled above"),
    }
    Ok(())
}

/// The dense tensor-core tiles a variable may name, in the order a `BMxBN` name is looked up:
/// the product's, then the lab's.
pub fn dense_tiles() -> impl Iterator<Item = CoopTile> {
    coop_gemm::TILES.iter().chain(tiles::DENSE).copied()
}

/// The experts' tensor-core tiles a variable may name, in the order a `BMxBN` name is looked up.
pub fn grouped_tiles() -> impl Iterator<Item = CoopTile> {
    coop_grouped_gemm::TILES.iter().chain(tiles::GROUPED).copied()
}

fn depth(value: &str) -> Option<u32> {
    value.parse().ok().filter(|d| (1..=coop_kloop::MAX_DEPTH).contains(d))
}

/// What the variable `name` accepts, for its error message.
fn accepted(name: &str) -> String {
    let tiles = |tiles: &mut dyn Iterator<Item = CoopTile>| {
        let tiles: Vec<CoopTile> = tiles.collect();
        let mut shapes: Vec<String> = Vec::new();
        for shape in tiles.iter().map(|t| format!("{}x{}", t.bm, t.bn)) {
            if !shapes.contains(&shape) {
                shapes.push(shape);
            }
        }
        let labels: Vec<String> = tiles.iter().map(|t| t.label()).collect();
        format!("a tile's BMxBN ({}) or full label ({})", shapes.join(", "), labels.join(", "))
    };
    match name {
        "DG_UNFUSED_COMBINE" | "DG_F32_ACTIVATIONS" | "DG_UNSCALED_ROWS" => "0 or 1".into(),
        "DG_ROW_LANES" => "auto or 1".into(),
        "DG_QKV" => "auto, merged or separate".into(),
        "DG_COOP_PATH" | "DG_GROUPED_PATH" => "staged, direct or single".into(),
        "DG_COOP_DEPTH" | "DG_COOP_GROUPED_DEPTH" => format!("a whole number from 1 to {}", coop_kloop::MAX_DEPTH),
        "DG_COOP_STAGES" => "auto, alternating or constant".into(),
        "DG_SPLIT_TARGET" => "a whole number of workgroups (0: never split)".into(),
        "DG_GROUPED_TILE" => {
            let shapes: Vec<String> = grouped_gemm::TILES.iter().map(|t| format!("{}x{}", t.bm, t.bn)).collect();
            format!("a tile's BMxBN ({})", shapes.join(", "))
        }
        "DG_COOP_TILE" | "DG_ATTENTION_TILE" => tiles(&mut dense_tiles()),
        "DG_COOP_GROUPED_TILE" => tiles(&mut grouped_tiles()),
        _ => String::new(),
    }
}

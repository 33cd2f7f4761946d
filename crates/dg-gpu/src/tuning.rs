//! Tuning: the knobs that override how dg-gpu runs a model (tiles, W paths, split-K, fused or
//! separate dispatches), as one typed value carried in [`crate::GpuOptions`].
//!
//! [`Tuning::default`] is what dg-gpu chooses on its own; every field overrides one choice and
//! none changes the results beyond rounding. The library never reads the environment:
//! applications build the value from the `DG_*` variables with [`Tuning::from_env`] (or
//! [`crate::GpuOptions::from_env`], which adds `DG_ADAPTER`), as wgpu's `*_from_env` helpers do,
//! and [`Tuning::from_vars`] is the same parse over any list of variables.
//!
//! The variables (README.md has the table): an empty value counts as unset; a known variable
//! with a value outside its accepted ones is an error naming both and listing what it accepts; a
//! `DG_*` name that is neither a tuning variable nor one of [`OTHER_VARIABLES`] is an error
//! listing the known ones (a misspelt knob is reported, not silently ignored). Variables not
//! starting with `DG_` are ignored.

use dg_kernels::coop_gemm::{self, CoopTile, Stages, WPath};
use dg_kernels::{coop_grouped_gemm, coop_kloop, grouped_gemm};

/// Layers of an encoder chunk recorded per submit by default ([`Tuning::encoder_submit_layers`]):
/// one, so that the GPU waits only for the first layer's recording while the host records the
/// next layers (recording a 30-layer chunk took 4.5–13 ms on the H200's host, spent before its
/// 30–83 ms of kernels started when it was one plan).
pub const ENCODER_SUBMIT_LAYERS: usize = 1;

/// Command buffers a plan recorded ahead (a denoising step, a canvas forward, a commit) is
/// submitted in by default ([`Tuning::submit_parts`]): four, so that the GPU waits only for the
/// first quarter's encoding (about 3 µs a dispatch on the H200's host). On the H200, 30 layers,
/// the step went 35.09, 34.54 ms (one part) → 34.14 (two) → 33.62, 33.49 (four) → 33.46 (eight)
/// and the commit recorded ahead 28.47, 28.03 → 26.97, 26.87 (four) → 26.70 (eight); eight gains
/// no more than the runs' spread, and fewer submits suit drivers whose submit costs more.
pub const SUBMIT_PARTS: usize = 4;

/// Every knob; each field's documentation names its variable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tuning {
    /// `DG_NO_COOP=1` sets it false: leave the tensor cores (cooperative matrices) off even where
    /// the device has them.
    pub tensor_cores: bool,
    /// `DG_ROW_REDUCE=tree`: how the row kernels reduce across a workgroup.
    pub row_reduce: RowReduceChoice,
    /// `DG_ROW_LANES=1`: how many columns the row kernels take at a time.
    pub row_lanes: RowLanes,
    /// `DG_UNFUSED_COMBINE=1` sets it false: the MoE combine in a dispatch of its own instead of
    /// inside the closing norms'.
    pub fused_combine: bool,
    /// `DG_FUSED_ATTENTION=1` sets it true: the decoder's attention as one tensor-core kernel
    /// (`dg_kernels::coop_attention`) where it takes the heads, instead of the scores product, the
    /// row softmax and the values product. Off by default: on an H100 it gained 0.2–0.3 ms of the
    /// F16 decoder layers' 30.7 (the forward's 35.7 within its spread) and lost 0.16 ms of
    /// `q4_k_m`'s forward, 34.0 (bench/HISTORY.md).
    pub fused_attention: bool,
    /// `DG_F32_ACTIVATIONS=1` sets it false: the experts' activations stay f32 instead of f16
    /// where the tensor cores read them.
    pub half_expert_activations: bool,
    /// `DG_KV_CACHE=auto|f32|f16`: how the KV cache stores keys and values
    /// (`crate::arena::cache_format`).
    pub kv_cache: KvCacheChoice,
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
    /// `DG_COOP_GROUPED_TILE=BMxBN` or a full label: the experts' tensor-core tile, where it fits
    /// (and runs by the path chosen: `coop_grouped_gemm::runs`).
    pub coop_grouped_tile: Option<TileName>,
    /// `DG_GROUPED_PATH=staged|direct|single`: the experts' tensor-core W path.
    pub coop_grouped_path: Option<WPath>,
    /// `DG_COOP_GROUPED_DEPTH=N`: the experts' tensor-core tile's loads `N` K steps ahead.
    pub coop_grouped_depth: Option<u32>,
    /// `DG_COOP_STAGES=alternating|constant`: how every tensor-core K loop with two stages names
    /// them (`coop_kloop::Stages`), dense and experts alike, instead of per product.
    pub coop_stages: Option<coop_kloop::Stages>,
    /// `DG_ENCODER_SUBMIT_LAYERS=N`: the layers of an encoder chunk recorded per submit where its
    /// plan was not recorded ahead (`GpuModel::encode`; the model's layer count or more: the whole
    /// chunk as one plan).
    pub encoder_submit_layers: usize,
    /// `DG_SUBMIT_PARTS=N`: the command buffers a plan recorded ahead (a denoising step, a canvas
    /// forward, a commit) is encoded and submitted in, each submitted as soon as it is encoded
    /// (`plan::submit_in_parts`); the same dispatches in the same order, the same results.
    pub submit_parts: usize,
    /// Caps the bytes of one weight buffer ([`crate::GpuContext::weight_binding`]) below the
    /// device's largest binding: weights larger than it are split across bindings as on a device
    /// whose limit it is (tests force splits with it on small models). No variable sets it.
    pub weight_binding: Option<u64>,
    /// Caps the bytes of one vocabulary-sized activation buffer (a group of a batch's canvases'
    /// logits, `crate::arena::Arena::vocab_group`) below the device's largest binding: tests
    /// force several groups with it on small models. No variable sets it.
    pub vocab_binding: Option<u64>,
    /// Caps the tokens of an encoder chunk the arena is sized for below
    /// [`crate::arena::PREFILL_CHUNK`], and with them the positions a sliding layer's cache holds
    /// (`crate::arena::Arena::sliding_positions`): tests make the sliding caches move their
    /// window with it on small models. No variable sets it.
    pub prefill_rows: Option<usize>,
    /// `DG_SCORES_BYTES=N`: caps the bytes of the attention scores below
    /// [`crate::arena::SCORES_BYTES`] and [`crate::arena::ENCODER_SCORES_BYTES`] (less memory at
    /// long contexts, the attention then in more blocks of queries); tests make the attention run
    /// in blocks with it on small models.
    pub scores_bytes: Option<u64>,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            tensor_cores: true,
            row_reduce: RowReduceChoice::Auto,
            row_lanes: RowLanes::Auto,
            fused_combine: true,
            fused_attention: false,
            half_expert_activations: true,
            kv_cache: KvCacheChoice::Auto,
            scale_rows: true,
            qkv: QkvChoice::Auto,
            coop_tile: None,
            attention_tile: None,
            coop_path: WPath::Staged,
            coop_depth: None,
            split_target: None,
            grouped_tile: None,
            coop_grouped_tile: None,
            coop_grouped_path: None,
            coop_grouped_depth: None,
            coop_stages: None,
            encoder_submit_layers: ENCODER_SUBMIT_LAYERS,
            submit_parts: SUBMIT_PARTS,
            weight_binding: None,
            vocab_binding: None,
            prefill_rows: None,
            scores_bytes: None,
        }
    }
}

/// The row kernels' reduction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowReduceChoice {
    /// Subgroups where the device has them, else the tree (`auto`).
    Auto,
    /// The tree through workgroup memory on any device (`tree`).
    Tree,
}

/// The columns a row kernel takes at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowLanes {
    /// As many as the rows' widths, offsets and strides allow (`auto`, `dg_kernels::lanes_for`).
    Auto,
    /// One (`1`).
    One,
}

/// How the KV cache stores keys and values (`crate::arena::cache_format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvCacheChoice {
    /// f16 where the tensor cores run every attention product (they round K and V to f16 as they
    /// stage them, so the same bits at half the bytes), f32 elsewhere (`auto`;
    /// `crate::arena::cache_format`).
    Auto,
    /// f32 everywhere (`f32`).
    F32,
    /// f16 wherever the device stores f16 (`f16`): on the portable kernels too, which then read
    /// K and V rounded to f16 (within the F16 mode's tolerances, not the f32 ones).
    F16,
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

/// A tensor-core tile named by a knob: its `BMxBN` shape (the first tile of a list with that
/// shape that fits) or one tile exactly (by its full label, `CoopTile::label`).
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
    fn parse(wanted: &str, tiles: &[CoopTile]) -> Option<TileName> {
        if let Some(t) = tiles.iter().find(|t| t.label() == wanted) {
            return Some(TileName::Exact(*t));
        }
        tiles.iter().find(|t| format!("{}x{}", t.bm, t.bn) == wanted).map(|t| TileName::Shape { bm: t.bm, bn: t.bn })
    }
}

/// A `DG_*` variable that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TuningError {
    #[error("{name}={value:?} is not a valid value; {name} accepts {accepted}")]
    BadValue { name: String, value: String, accepted: String },
    #[error("unknown variable {name} (set to {value:?}); the DG_ variables are {known}")]
    Unknown { name: String, value: String, known: String },
}

/// The tuning variables, in the order of [`Tuning`]'s fields.
pub const TUNING_VARIABLES: &[&str] = &[
    "DG_NO_COOP",
    "DG_ROW_REDUCE",
    "DG_ROW_LANES",
    "DG_UNFUSED_COMBINE",
    "DG_FUSED_ATTENTION",
    "DG_F32_ACTIVATIONS",
    "DG_KV_CACHE",
    "DG_UNSCALED_ROWS",
    "DG_QKV",
    "DG_COOP_TILE",
    "DG_ATTENTION_TILE",
    "DG_COOP_PATH",
    "DG_COOP_DEPTH",
    "DG_SPLIT_TARGET",
    "DG_GROUPED_TILE",
    "DG_COOP_GROUPED_TILE",
    "DG_GROUPED_PATH",
    "DG_COOP_GROUPED_DEPTH",
    "DG_COOP_STAGES",
    "DG_ENCODER_SUBMIT_LAYERS",
    "DG_SUBMIT_PARTS",
    "DG_SCORES_BYTES",
];

/// The `DG_*` variables that are not tuning knobs and that [`Tuning::from_vars`] passes over:
/// the adapter choice (read by [`crate::GpuOptions::from_vars`]) and those of the tests and
/// benches (`DG_ALLOW_NO_GPU`, `DG_BENCH_QUICK`, `DG_FIXTURES`, `DG_GEMM_BENCH`, `DG_GEMM_REPS`,
/// `DG_GROUPED_BENCH`, `DG_REQUIRE_TENSOR_CORES`; read by the test and bench code itself).
pub const OTHER_VARIABLES: &[&str] = &[
    "DG_ADAPTER",
    "DG_ALLOW_NO_GPU",
    "DG_BENCH_QUICK",
    "DG_FIXTURES",
    "DG_GEMM_BENCH",
    "DG_GEMM_REPS",
    "DG_GROUPED_BENCH",
    "DG_REQUIRE_TENSOR_CORES",
];

impl Tuning {
    /// The tuning the `DG_*` variables of this process's environment ask for (see the module
    /// documentation). Applications call this; the library itself never does.
    pub fn from_env() -> Result<Tuning, TuningError> {
        Tuning::from_vars(env_vars())
    }

    /// The tuning that `vars` (name, value pairs, as from the environment) ask for: the defaults
    /// overridden by every tuning variable among them.
    pub fn from_vars<N: AsRef<str>, V: AsRef<str>>(vars: impl IntoIterator<Item = (N, V)>) -> Result<Tuning, TuningError> {
        let mut tuning = Tuning::default();
        for (name, value) in vars {
            let (name, value) = (name.as_ref(), value.as_ref());
            if !name.starts_with("DG_") || OTHER_VARIABLES.contains(&name) || value.is_empty() {
                continue;
            }
            tuning.set(name, value)?;
        }
        Ok(tuning)
    }

    /// Applies one `DG_*` variable.
    fn set(&mut self, name: &str, value: &str) -> Result<(), TuningError> {
        let bad = || TuningError::BadValue { name: name.into(), value: value.into(), accepted: accepted(name) };
        let paths = [("staged", WPath::Staged), ("direct", WPath::Direct), ("single", WPath::Single)];
        match name {
            "DG_NO_COOP" => self.tensor_cores = !flag(value).ok_or_else(bad)?,
            "DG_ROW_REDUCE" => {
                self.row_reduce = choice(value, &[("auto", RowReduceChoice::Auto), ("tree", RowReduceChoice::Tree)]).ok_or_else(bad)?
            }
            "DG_ROW_LANES" => self.row_lanes = choice(value, &[("auto", RowLanes::Auto), ("1", RowLanes::One)]).ok_or_else(bad)?,
            "DG_UNFUSED_COMBINE" => self.fused_combine = !flag(value).ok_or_else(bad)?,
            "DG_FUSED_ATTENTION" => self.fused_attention = flag(value).ok_or_else(bad)?,
            "DG_F32_ACTIVATIONS" => self.half_expert_activations = !flag(value).ok_or_else(bad)?,
            "DG_KV_CACHE" => {
                self.kv_cache = choice(value, &[("auto", KvCacheChoice::Auto), ("f32", KvCacheChoice::F32), ("f16", KvCacheChoice::F16)])
                    .ok_or_else(bad)?
            }
            "DG_UNSCALED_ROWS" => self.scale_rows = !flag(value).ok_or_else(bad)?,
            "DG_QKV" => {
                self.qkv = choice(value, &[("auto", QkvChoice::Auto), ("merged", QkvChoice::Merged), ("separate", QkvChoice::Separate)])
                    .ok_or_else(bad)?
            }
            "DG_COOP_TILE" => {
                // The first tile of the lists that the value names, as `coop_gemm::plan` prefers it.
                let tiles: Vec<CoopTile> = dense_tiles().collect();
                let name = TileName::parse(value, &tiles).ok_or_else(bad)?;
                self.coop_tile = tiles.into_iter().find(|t| name.names(*t));
            }
            "DG_ATTENTION_TILE" => {
                let tiles: Vec<CoopTile> = dense_tiles().collect();
                let name = TileName::parse(value, &tiles).ok_or_else(bad)?;
                self.attention_tile = tiles.into_iter().find(|t| name.names(*t));
            }
            "DG_COOP_PATH" => self.coop_path = choice(value, &paths).ok_or_else(bad)?,
            "DG_COOP_DEPTH" => self.coop_depth = Some(depth(value).ok_or_else(bad)?),
            "DG_SPLIT_TARGET" => self.split_target = Some(value.parse().map_err(|_| bad())?),
            "DG_GROUPED_TILE" => {
                self.grouped_tile =
                    Some(grouped_gemm::TILES.iter().copied().find(|t| format!("{}x{}", t.bm, t.bn) == value).ok_or_else(bad)?);
            }
            "DG_COOP_GROUPED_TILE" => {
                let tiles: Vec<CoopTile> = grouped_tiles().collect();
                self.coop_grouped_tile = Some(TileName::parse(value, &tiles).ok_or_else(bad)?);
            }
            "DG_GROUPED_PATH" => self.coop_grouped_path = Some(choice(value, &paths).ok_or_else(bad)?),
            "DG_COOP_GROUPED_DEPTH" => self.coop_grouped_depth = Some(depth(value).ok_or_else(bad)?),
            "DG_COOP_STAGES" => {
                let stages = [("auto", None), ("alternating", Some(Stages::Alternating)), ("constant", Some(Stages::Constant))];
                self.coop_stages = choice(value, &stages).ok_or_else(bad)?;
            }
            "DG_ENCODER_SUBMIT_LAYERS" => {
                self.encoder_submit_layers = value.parse().ok().filter(|&n: &usize| n > 0).ok_or_else(bad)?;
            }
            "DG_SUBMIT_PARTS" => {
                self.submit_parts = value.parse().ok().filter(|&n: &usize| n > 0).ok_or_else(bad)?;
            }
            "DG_SCORES_BYTES" => self.scores_bytes = Some(value.parse().ok().filter(|&n: &u64| n > 0).ok_or_else(bad)?),
            _ => {
                let known = TUNING_VARIABLES.iter().chain(OTHER_VARIABLES).copied().collect::<Vec<_>>().join(", ");
                return Err(TuningError::Unknown { name: name.into(), value: value.into(), known });
            }
        }
        Ok(())
    }

    /// `tile` with its loads issued [`Self::coop_depth`] K steps ahead where that makes a valid
    /// tile, else as it is.
    pub fn dense_depth(&self, tile: CoopTile) -> CoopTile {
        with_depth(tile, self.coop_depth)
    }

    /// [`Self::dense_depth`] for the experts' tile ([`Self::coop_grouped_depth`]).
    pub fn grouped_depth(&self, tile: CoopTile) -> CoopTile {
        with_depth(tile, self.coop_grouped_depth)
    }

    /// `tile` with the stages [`Self::coop_stages`] names, else `chosen`.
    pub fn stages(&self, tile: CoopTile, chosen: Stages) -> CoopTile {
        tile.with_stages(self.coop_stages.unwrap_or(chosen))
    }
}

fn with_depth(tile: CoopTile, depth: Option<u32>) -> CoopTile {
    match depth {
        Some(depth) if tile.with_depth(depth).is_valid() => tile.with_depth(depth),
        _ => tile,
    }
}

/// This process's `DG_*` variables (values that are not Unicode passed on lossily, so that they
/// fail the parse by name); the one place dg-gpu reads the environment, for applications.
pub(crate) fn env_vars() -> Vec<(String, String)> {
    std::env::vars_os()
        .filter_map(|(name, value)| Some((name.into_string().ok()?, value)))
        .filter(|(name, _)| name.starts_with("DG_"))
        .map(|(name, value)| (name, value.to_string_lossy().into_owned()))
        .collect()
}

/// The dense tensor-core tiles a knob may name, in the order a `BMxBN` name is looked up.
fn dense_tiles() -> impl Iterator<Item = CoopTile> {
    coop_gemm::TILES.iter().chain(coop_gemm::TUNING_TILES).copied()
}

/// The experts' tensor-core tiles a knob may name, in the order a `BMxBN` name is looked up.
pub(crate) fn grouped_tiles() -> impl Iterator<Item = CoopTile> {
    coop_grouped_gemm::TILES.iter().chain(coop_grouped_gemm::TUNING_TILES).copied()
}

fn flag(value: &str) -> Option<bool> {
    choice(value, &[("0", false), ("1", true)])
}

fn choice<T: Copy>(value: &str, options: &[(&str, T)]) -> Option<T> {
    options.iter().find(|(name, _)| *name == value).map(|(_, t)| *t)
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
        "DG_NO_COOP" | "DG_UNFUSED_COMBINE" | "DG_FUSED_ATTENTION" | "DG_F32_ACTIVATIONS" | "DG_UNSCALED_ROWS" => "0 or 1".into(),
        "DG_KV_CACHE" => "auto, f32 or f16".into(),
        "DG_ROW_REDUCE" => "auto or tree".into(),
        "DG_ROW_LANES" => "auto or 1".into(),
        "DG_QKV" => "auto, merged or separate".into(),
        "DG_COOP_PATH" | "DG_GROUPED_PATH" => "staged, direct or single".into(),
        "DG_COOP_DEPTH" | "DG_COOP_GROUPED_DEPTH" => format!("a whole number from 1 to {}", coop_kloop::MAX_DEPTH),
        "DG_COOP_STAGES" => "auto, alternating or constant".into(),
        "DG_SPLIT_TARGET" => "a whole number of workgroups (0: never split)".into(),
        "DG_ENCODER_SUBMIT_LAYERS" => "a whole number of layers from 1".into(),
        "DG_SUBMIT_PARTS" => "a whole number of command buffers from 1".into(),
        "DG_SCORES_BYTES" => "a whole number of bytes from 1".into(),
        "DG_GROUPED_TILE" => {
            let shapes: Vec<String> = grouped_gemm::TILES.iter().map(|t| format!("{}x{}", t.bm, t.bn)).collect();
            format!("a tile's BMxBN ({})", shapes.join(", "))
        }
        "DG_COOP_TILE" | "DG_ATTENTION_TILE" => tiles(&mut dense_tiles()),
        "DG_COOP_GROUPED_TILE" => tiles(&mut grouped_tiles()),
        _ => String::new(),
    }
}

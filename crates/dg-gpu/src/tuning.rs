//! Tuning: the knobs with product meaning that change how dg-gpu runs a model (tensor cores off,
//! the row kernels' reduction, the KV cache's format, the attention's memory, how recordings are
//! submitted), as one typed value carried in [`crate::GpuOptions`], plus the lab's
//! [`Overrides`] (set only by dg-lab).
//!
//! [`Tuning::default`] is what dg-gpu chooses on its own; every field overrides one choice and
//! none changes the results beyond rounding (the KV cache's f16 within the F16 mode's tolerances). The library never reads the environment:
//! applications build the value from the `DG_*` variables with [`Tuning::from_env`] (or
//! [`crate::GpuOptions::from_env`], which adds `DG_ADAPTER`), as wgpu's `*_from_env` helpers do,
//! and [`Tuning::from_vars`] is the same parse over any list of variables.
//!
//! The variables (docs/tuning.md has the table): an empty value counts as unset; a known variable
//! with a value outside its accepted ones is an error naming both and listing what it accepts; a
//! `DG_*` name that is neither a tuning variable nor one of [`OTHER_VARIABLES`] is an error
//! listing the known ones (a misspelt knob is reported, not silently ignored), and a lab variable
//! ([`LAB_VARIABLES`]) is an error saying that only the lab's tools read it. Variables not
//! starting with `DG_` are ignored.

use crate::overrides::Overrides;

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
    /// `DG_NATIVE=1` sets it true: take the Vulkan-native kernels (SPIR-V past WGSL,
    /// `dg_kernels::native_grouped_gemm`) where the device runs them. Off by default until their
    /// gate has passed and their timing has been measured on a GPU with the fragments NVIDIA offers
    /// (so far only lavapipe's 8×8×8 ran them); `DG_NATIVE=0` against `1` is the A/B.
    pub native: bool,
    /// `DG_INT8=1` sets it true: run the experts' Q8_0 and Q4_K products of the native kernel in its int8
    /// mode (`dg_kernels::native_int8_gemm`: activations quantized per 32-value block, `s8 × s8`
    /// fragments) where the driver lists 8-bit fragments; needs [`Self::native`]. Off by default:
    /// it changes the numerics (dg-cpu's `int8` mode is its reference).
    pub int8: bool,
    /// `DG_ROW_REDUCE=tree`: how the row kernels reduce across a workgroup.
    pub row_reduce: RowReduceChoice,
    /// `DG_KV_CACHE=auto|f32|f16`: how the KV cache stores keys and values
    /// (`crate::arena::cache_format`).
    pub kv_cache: KvCacheChoice,
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
    /// [`crate::arena::prefill_chunk`], and with them the positions a sliding layer's cache holds
    /// (`crate::arena::Arena::sliding_positions`): tests make the sliding caches move their
    /// window with it on small models. No variable sets it.
    pub prefill_rows: Option<usize>,
    /// The lab's overrides of the planner's and the forward's choices (`crate::Overrides`): the
    /// defaults are the product's own choices; only dg-lab's tools set them from variables.
    /// `DG_SCORES_BYTES=N`: caps the bytes of the attention scores below
    /// [`crate::arena::SCORES_BYTES`] and [`crate::arena::ENCODER_SCORES_BYTES`] (less memory at
    /// long contexts, the attention then in more blocks of queries); tests make the attention run
    /// in blocks with it on small models.
    pub scores_bytes: Option<u64>,
    /// The lab's overrides of the planner's and the forward's choices (`crate::Overrides`): the
    /// defaults are the product's own choices; only dg-lab's tools set them from variables.
    pub overrides: Overrides,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            tensor_cores: true,
            native: false,
            int8: false,
            row_reduce: RowReduceChoice::Auto,
            kv_cache: KvCacheChoice::Auto,
            encoder_submit_layers: ENCODER_SUBMIT_LAYERS,
            submit_parts: SUBMIT_PARTS,
            weight_binding: None,
            vocab_binding: None,
            prefill_rows: None,
            scores_bytes: None,
            overrides: Overrides::default(),
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

/// A `DG_*` variable that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TuningError {
    #[error("{name}={value:?} is not a valid value; {name} accepts {accepted}")]
    BadValue { name: String, value: String, accepted: String },
    #[error("unknown variable {name} (set to {value:?}); the DG_ variables are {known}")]
    Unknown { name: String, value: String, known: String },
    #[error(
        "{name} (set to {value:?}) is a lab override: only the lab's tools read it (cargo xtask bench-gpu, bench-generate, \
         bench-batch, probe); unset it to run dg"
    )]
    Lab { name: String, value: String },
}

/// The tuning variables with product meaning, in the order of [`Tuning`]'s fields: a device
/// without working tensor cores or subgroups, the KV cache's format and the attention's memory,
/// how a recording is submitted. The lab's variables ([`LAB_VARIABLES`]) are parsed by dg-lab
/// into [`Overrides`].
pub const TUNING_VARIABLES: &[&str] =
    &["DG_NO_COOP", "DG_NATIVE", "DG_ROW_REDUCE", "DG_KV_CACHE", "DG_ENCODER_SUBMIT_LAYERS", "DG_SUBMIT_PARTS", "DG_SCORES_BYTES"];

/// The lab's variables (dg-lab's `overrides`): alternatives that were measured and not taken, for
/// measuring them again. dg and the library crates refuse them with an error saying so.
pub const LAB_VARIABLES: &[&str] = &[
    "DG_ROW_LANES",
    "DG_UNFUSED_COMBINE",
    "DG_F32_ACTIVATIONS",
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
    /// overridden by every tuning variable among them. A lab variable is an error
    /// ([`TuningError::Lab`]).
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
        let bad = || TuningError::BadValue { name: name.into(), value: value.into(), accepted: accepted(name).into() };
        match name {
            "DG_NO_COOP" => self.tensor_cores = !flag(value).ok_or_else(bad)?,
            "DG_NATIVE" => self.native = flag(value).ok_or_else(bad)?,
            "DG_INT8" => self.int8 = flag(value).ok_or_else(bad)?,
            "DG_ROW_REDUCE" => {
                self.row_reduce = choice(value, &[("auto", RowReduceChoice::Auto), ("tree", RowReduceChoice::Tree)]).ok_or_else(bad)?
            }
            "DG_KV_CACHE" => {
                self.kv_cache = choice(value, &[("auto", KvCacheChoice::Auto), ("f32", KvCacheChoice::F32), ("f16", KvCacheChoice::F16)])
                    .ok_or_else(bad)?
            }
            "DG_ENCODER_SUBMIT_LAYERS" => {
                self.encoder_submit_layers = value.parse().ok().filter(|&n: &usize| n > 0).ok_or_else(bad)?;
            }
            "DG_SUBMIT_PARTS" => {
                self.submit_parts = value.parse().ok().filter(|&n: &usize| n > 0).ok_or_else(bad)?;
            }
            "DG_SCORES_BYTES" => self.scores_bytes = Some(value.parse().ok().filter(|&n: &u64| n > 0).ok_or_else(bad)?),
            _ if LAB_VARIABLES.contains(&name) => return Err(TuningError::Lab { name: name.into(), value: value.into() }),
            _ => {
                let known = TUNING_VARIABLES.iter().chain(OTHER_VARIABLES).copied().collect::<Vec<_>>().join(", ");
                return Err(TuningError::Unknown { name: name.into(), value: value.into(), known });
            }
        }
        Ok(())
    }
}

/// This process's `DG_*` variables (values that are not Unicode passed on lossily, so that they
/// fail the parse by name); the one place dg-gpu reads the environment, for applications.
pub fn env_vars() -> Vec<(String, String)> {
    std::env::vars_os()
        .filter_map(|(name, value)| Some((name.into_string().ok()?, value)))
        .filter(|(name, _)| name.starts_with("DG_"))
        .map(|(name, value)| (name, value.to_string_lossy().into_owned()))
        .collect()
}

/// `1` or `0`.
pub fn flag(value: &str) -> Option<bool> {
    choice(value, &[("0", false), ("1", true)])
}

/// The option `value` names among `options`.
pub fn choice<T: Copy>(value: &str, options: &[(&str, T)]) -> Option<T> {
    options.iter().find(|(name, _)| *name == value).map(|(_, t)| *t)
}

/// What the variable `name` accepts, for its error message.
fn accepted(name: &str) -> &'static str {
    match name {
        "DG_NO_COOP" | "DG_NATIVE" | "DG_INT8" => "0 or 1",
        "DG_KV_CACHE" => "auto, f32 or f16",
        "DG_ROW_REDUCE" => "auto or tree",
        "DG_ENCODER_SUBMIT_LAYERS" => "a whole number of layers from 1",
        "DG_SUBMIT_PARTS" => "a whole number of command buffers from 1",
        "DG_SCORES_BYTES" => "a whole number of bytes from 1",
        _ => "",
    }
}

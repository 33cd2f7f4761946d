//! The GPU's weight storage: BF16 for a BF16 checkpoint (exact to the checkpoint, 2 bytes per
//! parameter), f32 otherwise, a quantized GGUF's blocks as stored, unless `--weights` says which;
//! `--weights q8_0|q4_k_m` also quantizes the checkpoint's matrices at load ([`dg_model::Scheme`]).

use dg_gpu::WeightFormat;
use dg_model::{ModelDir, Scheme};

use crate::args::{SchemeArg, WeightsArg};

/// What `--weights` asks for: the format of the matrices that are not quantized, and the scheme
/// that quantizes the others at load (none: the checkpoint's own types).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WeightChoice {
    pub format: WeightFormat,
    pub scheme: Option<Scheme>,
}

/// The choice `arg` makes for `model`.
pub fn choose(model: &ModelDir, arg: WeightsArg) -> WeightChoice {
    let auto = if model.unquantized_matrices_are_bf16() { WeightFormat::Bf16 } else { WeightFormat::F32 };
    let (format, scheme) = match arg {
        WeightsArg::F32 => (WeightFormat::F32, None),
        WeightsArg::Bf16 => (WeightFormat::Bf16, None),
        WeightsArg::F16 => (WeightFormat::F16, None),
        WeightsArg::Auto => (auto, None),
        WeightsArg::Q8_0 => (auto, Some(Scheme::Q8_0)),
        WeightsArg::Q4KM => (auto, Some(Scheme::Q4KM)),
    };
    WeightChoice { format, scheme }
}

/// The scheme `arg` names.
pub fn scheme(arg: SchemeArg) -> Scheme {
    match arg {
        SchemeArg::Q4KM => Scheme::Q4KM,
        SchemeArg::Q8_0 => Scheme::Q8_0,
    }
}

/// `bf16` / `f32` / `f16`, or the ggml type of quantized matrices.
pub fn name(format: WeightFormat) -> &'static str {
    match format {
        WeightFormat::F32 => "f32",
        WeightFormat::Bf16 => "bf16",
        WeightFormat::F16 => "f16",
        WeightFormat::Quantized(q) => q.name(),
    }
}

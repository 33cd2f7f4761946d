//! The GPU's weight storage format: BF16 for a BF16 checkpoint (exact to the checkpoint, 2 bytes
//! per parameter), f32 otherwise, unless `--weights` says which.

use dg_gpu::WeightFormat;
use dg_model::ModelDir;

use crate::args::WeightsArg;

/// The format `arg` asks for.
pub fn choose(model: &ModelDir, arg: WeightsArg) -> WeightFormat {
    match arg {
        WeightsArg::F32 => WeightFormat::F32,
        WeightsArg::Bf16 => WeightFormat::Bf16,
        WeightsArg::F16 => WeightFormat::F16,
        WeightsArg::Auto if model.matrices_are_bf16() => WeightFormat::Bf16,
        WeightsArg::Auto => WeightFormat::F32,
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

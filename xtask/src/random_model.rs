//! The random-weight models the GPU benchmarks run (`bench-gpu`, `bench-generate`): seeded
//! random weights generated, quantized where `--weights` names a scheme (`dg_model::Scheme`, the
//! rest F16), and uploaded one tensor at a time (the 30-layer model is 104 GB in f32).

use anyhow::Result;
use dg_gpu::{GpuContext, GpuModel, WeightFormat};
use dg_model::{ModelConfig, Quantized, RandomWeights, Scheme};

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum WeightsArg {
    F32,
    Bf16,
    F16,
    /// The random weights quantized by `dg_model::Scheme::Q8_0` (the rest as in `f16`).
    #[value(name = "q8_0")]
    Q8_0,
    /// The random weights quantized by `dg_model::Scheme::Q4KM` (the rest as in `f16`).
    #[value(name = "q4_k_m")]
    Q4KM,
}

/// The random model of `config` stored as `weights`, with room for `max_context` cached tokens,
/// and a label of its storage (`F16`, `Q4_K_M (the rest F16)`, ...).
pub fn upload(ctx: GpuContext, config: &ModelConfig, weights: WeightsArg, max_context: usize) -> Result<(GpuModel, String)> {
    let (format, scheme) = match weights {
        WeightsArg::F32 => (WeightFormat::F32, None),
        WeightsArg::Bf16 => (WeightFormat::Bf16, None),
        WeightsArg::F16 => (WeightFormat::F16, None),
        WeightsArg::Q8_0 => (WeightFormat::F16, Some(Scheme::Q8_0)),
        WeightsArg::Q4KM => (WeightFormat::F16, Some(Scheme::Q4KM)),
    };
    let random = RandomWeights::new(0);
    let model = match scheme {
        Some(scheme) => GpuModel::load(
            ctx,
            config,
            &Quantized { inner: &random, scheme, config: &config.text },
            dg_gpu::ModelOptions::new(max_context).format(format),
        )?,
        None => GpuModel::load(ctx, config, &random, dg_gpu::ModelOptions::new(max_context).format(format))?,
    };
    let label = scheme.map_or(format!("{format:?}"), |s| format!("{} (the rest {format:?})", s.name()));
    Ok((model, label))
}

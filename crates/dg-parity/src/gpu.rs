//! The GPU backend of the checks: the CPU encoder fills the KV cache, the canvas forward runs on
//! the GPU ([`dg_gpu::GpuModel`]) against that cache.

use dg_gpu::{GpuContext, GpuModel, HybridModel};
use dg_model::{ModelConfig, Weights};
use dg_sampler::DenoiseModel;

use crate::BoxError;
use crate::checks::{Backend, CheckResult, GPU_LOGITS_TOLERANCE, LAYER_TOLERANCE};
use crate::compare::compare;

/// CPU encoder + GPU canvas forward ([`HybridModel`]) as a parity backend.
#[derive(Debug)]
pub struct GpuBackend(pub HybridModel);

impl GpuBackend {
    /// Uploads `weights` to `ctx` for contexts of up to `max_context` tokens.
    pub fn new(ctx: GpuContext, config: &ModelConfig, weights: Weights, max_context: usize) -> Result<Self, BoxError> {
        Ok(GpuBackend(HybridModel::new(ctx, config, weights, max_context)?))
    }

    /// The GPU model (for resource counters).
    pub fn gpu(&self) -> &GpuModel {
        &self.0.gpu
    }
}

impl Backend for GpuBackend {
    fn name(&self) -> &'static str {
        "gpu"
    }

    fn logits_tolerance(&self) -> f64 {
        GPU_LOGITS_TOLERANCE
    }

    fn vocab_size(&self) -> usize {
        self.0.encoder.config.text.vocab_size
    }

    fn reset(&mut self) -> Result<(), BoxError> {
        self.0.reset();
        Ok(())
    }

    fn encode(&mut self, ids: &[u32]) -> Result<(), BoxError> {
        Ok(DenoiseModel::encode(&mut self.0, ids)?)
    }

    fn canvas_forward(&mut self, canvas: &[u32], sc: Option<&[f32]>, logits: &mut [f32]) -> Result<(), BoxError> {
        Ok(DenoiseModel::canvas_forward(&mut self.0, canvas, sc, logits)?)
    }

    fn layer_check(&mut self, prompt: &[u32], canvas: &[u32]) -> Option<Result<CheckResult, BoxError>> {
        Some(self.layers(prompt, canvas))
    }
}

impl GpuBackend {
    /// Feeds every decoder layer the CPU's input for that layer and compares the outputs; the
    /// report names the first failing layer (or the worst one when all pass).
    fn layers(&mut self, prompt: &[u32], canvas: &[u32]) -> Result<CheckResult, BoxError> {
        self.reset()?;
        self.encode(prompt)?;
        self.0.sync()?;
        let HybridModel { encoder: cpu, gpu, .. } = &mut self.0;
        let (c, h) = (canvas.len(), cpu.config.text.hidden_size);
        let mut hidden = cpu.decoder_input(canvas, None);
        let mut worst = (0usize, 0f64);
        for i in 0..cpu.config.text.num_layers() {
            let gpu_out = gpu.run_layer(i, &hidden)?;
            cpu.decoder_layers(&mut hidden, c, i..i + 1);
            let cmp = compare(&gpu_out, &hidden, h, f32::INFINITY);
            if !cmp.passes(LAYER_TOLERANCE) {
                return Ok(CheckResult::from_comparison(&format!("layers (first failing: layer {i})"), &cmp, LAYER_TOLERANCE));
            }
            if cmp.normwise >= worst.1 {
                worst = (i, cmp.normwise);
            }
        }
        Ok(CheckResult {
            name: "layers".into(),
            passed: true,
            detail: format!("all {} layers within tol={LAYER_TOLERANCE:.0e}; worst layer {} normwise={:.3e}", cpu.config.text.num_layers(), worst.0, worst.1),
        })
    }
}

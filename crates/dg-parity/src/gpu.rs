//! The GPU backend of the checks: the CPU encoder fills the KV cache, the canvas forward runs on
//! the GPU ([`dg_gpu::GpuModel`]) against that cache.

use dg_cpu::CpuModel;
use dg_gpu::{GpuContext, GpuModel, LayerContext};
use dg_model::{ModelConfig, Weights};

use crate::BoxError;
use crate::checks::{Backend, GPU_LOGITS_TOLERANCE};

/// CPU encoder + GPU canvas forward.
#[derive(Debug)]
pub struct GpuBackend {
    encoder: CpuModel,
    gpu: GpuModel,
    /// The GPU has not seen the encoder's latest cache yet.
    stale: bool,
}

impl GpuBackend {
    /// Uploads `weights` to `ctx` for contexts of up to `max_context` tokens.
    pub fn new(ctx: GpuContext, config: &ModelConfig, weights: Weights, max_context: usize) -> Result<Self, BoxError> {
        let gpu = GpuModel::new(ctx, config, &weights, max_context)?;
        Ok(GpuBackend { encoder: CpuModel::new(config.clone(), weights), gpu, stale: true })
    }

    /// The GPU model (for resource counters).
    pub fn gpu(&self) -> &GpuModel {
        &self.gpu
    }

    fn sync(&mut self) -> Result<(), BoxError> {
        if self.stale {
            let cache = self.encoder.cache();
            let layers: Vec<LayerContext<'_>> =
                cache.layers.iter().map(|l| LayerContext { keys: &l.keys, values: &l.values }).collect();
            self.gpu.set_context(cache.seq_len, &layers)?;
            self.stale = false;
        }
        Ok(())
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
        self.encoder.config.text.vocab_size
    }

    fn reset(&mut self) -> Result<(), BoxError> {
        self.encoder.reset();
        self.stale = true;
        Ok(())
    }

    fn encode(&mut self, ids: &[u32]) -> Result<(), BoxError> {
        self.encoder.encode(ids)?;
        self.stale = true;
        Ok(())
    }

    fn canvas_forward(&mut self, canvas: &[u32], sc: Option<&[f32]>, logits: &mut [f32]) -> Result<(), BoxError> {
        self.sync()?;
        Ok(self.gpu.canvas_forward(canvas, sc, logits)?)
    }
}

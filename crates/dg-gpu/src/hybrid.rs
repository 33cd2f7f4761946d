//! The GPU backend as the sampler sees it: the CPU encoder fills the KV cache (until the encoder
//! moves onto the GPU), the canvas forward runs on the GPU against that cache.

use dg_cpu::CpuModel;
use dg_model::{ModelConfig, Weights};

use crate::context::GpuContext;
use crate::error::GpuError;
use crate::model::{GpuModel, LayerContext};

/// Errors of the hybrid model: the CPU encoder's or the GPU's.
#[derive(Debug, thiserror::Error)]
pub enum HybridError {
    #[error(transparent)]
    Cpu(#[from] dg_cpu::CpuError),
    #[error(transparent)]
    Gpu(#[from] GpuError),
}

/// CPU encoder + GPU canvas forward.
#[derive(Debug)]
pub struct HybridModel {
    pub encoder: CpuModel,
    pub gpu: GpuModel,
    /// The GPU has not seen the encoder's latest cache yet.
    stale: bool,
}

impl HybridModel {
    /// Uploads `weights` for contexts of up to `max_context` tokens; the CPU encoder keeps them.
    pub fn new(ctx: GpuContext, config: &ModelConfig, weights: Weights, max_context: usize) -> Result<Self, GpuError> {
        let gpu = GpuModel::new(ctx, config, &weights, max_context)?;
        Ok(HybridModel { encoder: CpuModel::new(config.clone(), weights), gpu, stale: true })
    }

    /// Forgets every cached token.
    pub fn reset(&mut self) {
        self.encoder.reset();
        self.stale = true;
    }

    /// Uploads the encoder's cache if it changed since the last forward.
    pub fn sync(&mut self) -> Result<(), GpuError> {
        if self.stale {
            let cache = self.encoder.cache();
            let layers: Vec<LayerContext<'_>> = cache.layers.iter().map(|l| LayerContext { keys: &l.keys, values: &l.values }).collect();
            self.gpu.set_context(cache.seq_len, &layers)?;
            self.stale = false;
        }
        Ok(())
    }
}

impl dg_sampler::DenoiseModel for HybridModel {
    type Error = HybridError;

    fn encode(&mut self, ids: &[u32]) -> Result<(), HybridError> {
        self.encoder.encode(ids)?;
        self.stale = true;
        Ok(())
    }

    fn canvas_forward(&mut self, canvas: &[u32], sc: Option<&[f32]>, logits: &mut [f32]) -> Result<(), HybridError> {
        self.sync()?;
        Ok(self.gpu.canvas_forward(canvas, sc, logits)?)
    }
}

//! The CPU backend of the checks: [`dg_cpu::CpuModel`] behind the [`Backend`] trait.

use dg_cpu::CpuModel;

use crate::BoxError;
use crate::checks::{Backend, CPU_LOGITS_TOLERANCE};

/// `CpuModel` as a parity backend.
#[derive(Debug)]
pub struct CpuBackend(pub CpuModel);

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn logits_tolerance(&self) -> f64 {
        CPU_LOGITS_TOLERANCE
    }

    fn vocab_size(&self) -> usize {
        self.0.config.text.vocab_size
    }

    fn reset(&mut self) -> Result<(), BoxError> {
        self.0.reset();
        Ok(())
    }

    fn encode(&mut self, ids: &[u32]) -> Result<(), BoxError> {
        Ok(self.0.encode(ids)?)
    }

    fn canvas_forward(&mut self, canvas: &[u32], sc: Option<&[f32]>, logits: &mut [f32]) -> Result<(), BoxError> {
        Ok(self.0.canvas_forward(canvas, sc, logits)?)
    }
}

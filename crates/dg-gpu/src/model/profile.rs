//! Where an encoder pass's time goes (`DiffusionGemmaEncoderModel`: the prompt's prefill, a
//! finished canvas's commit): the host's writing of the chunk's ids and RoPE tables and its
//! recording of the chunk's plan, and the GPU's time per
//! dispatch from timestamp queries, as [`GpuModel::profile_step`] gives them for the canvas
//! forward.

use std::time::Instant;

use super::GpuModel;
use crate::error::GpuError;

/// One profiled encoder chunk.
#[derive(Debug, Clone)]
pub struct EncoderProfile {
    /// Tokens encoded.
    pub tokens: usize,
    /// Host time writing the chunk's ids and RoPE tables (`GpuModel::ensure_rope`), after moving
    /// its sliding window where it needs it.
    pub tables_ms: f64,
    /// Host time recording the chunk's plan (every encode records one: the chunk's positions and
    /// the visible cache rows change with every call).
    pub record_ms: f64,
    /// `(scope, kernel, nanoseconds)` per dispatch ([`crate::Plan::profile`]: one pass each).
    pub kernels: Vec<(String, String, f64)>,
}

impl GpuModel {
    /// Encodes `ids` as [`GpuModel::encode`] does (the cache advances the same way), as one chunk
    /// with a timestamp around every dispatch. At most the prefill chunk's tokens.
    pub fn profile_encode(&mut self, ids: &[u32]) -> Result<EncoderProfile, GpuError> {
        if ids.len() > self.prefill_chunk {
            return Err(GpuError::Unsupported {
                what: format!("profiling {} tokens as one encoder chunk (at most {})", ids.len(), self.prefill_chunk),
            });
        }
        let ids = self.encoder_ids(0, ids)?;
        self.context_ready = false;
        let clock = Instant::now();
        let chunk = self.begin_encoder_chunk(0, &ids)?;
        let tables_ms = clock.elapsed().as_secs_f64() * 1e3;
        let clock = Instant::now();
        let plan = self.encoder_chunk_plan(chunk)?;
        let record_ms = clock.elapsed().as_secs_f64() * 1e3;
        let kernels = plan.profile(&self.ctx)?;
        self.seq_lens[0] += ids.len();
        Ok(EncoderProfile { tokens: ids.len(), tables_ms, record_ms, kernels })
    }
}

//! The model a batch of sequences runs on, on either backend: the GPU model with a KV cache per
//! slot (one forward a step for every canvas, `dg_gpu::GpuModel` as a
//! `dg_sampler::BatchResidentModel`), or the CPU model running the slots one after another
//! (`dg_sampler::PerSlot`). Both carry their errors as a [`ModelError`], so a
//! `dg_sampler::Batch` has one type whatever the backend. A slot's cache can be taken out as a
//! [`SlotCache`] and put back into any slot (the server keeps conversations' caches this way).
//! Used by `dg generate --prompts-file` and `dg serve`.

use anyhow::{Context, Result};
use dg_cpu::CpuModel;
use dg_cpu::cache::KvCache;
use dg_gpu::{CacheSnapshot, GpuModel};
use dg_model::ModelDir;
use dg_sampler::{Batch, BatchDenoiseModel, BatchResidentModel, Hooks, PerSlot, RandomSource, StepReport};

use crate::args::WeightsArg;
use crate::backend::Backend;
use crate::load;

/// A loaded model with `slots` sequence slots.
pub enum BatchModel {
    Cpu(Box<Errors<PerSlot<CpuModel>>>),
    Gpu(Box<Errors<GpuModel>>),
}

impl BatchModel {
    /// Loads `model` on `backend` with `slots` slots, each holding up to `positions` positions
    /// (the GPU's caches are sized for it; the CPU's grow).
    pub fn load(
        model: &ModelDir,
        backend: Backend,
        positions: usize,
        slots: usize,
        weights: WeightsArg,
        report: load::Report,
    ) -> Result<Self> {
        Ok(match backend {
            Backend::Cpu => BatchModel::Cpu(Box::new(Errors(PerSlot::new(load::cpu(model, weights)?)))),
            Backend::Gpu(ctx) => BatchModel::Gpu(Box::new(Errors(load::gpu_slots(model, *ctx, positions, slots, weights, report)?))),
        })
    }

    /// One step of every running sequence of `batch`.
    pub fn step<R: RandomSource, H: Hooks>(&mut self, batch: &mut Batch<R, H, ModelError>) -> StepReport {
        match self {
            BatchModel::Cpu(m) => batch.step(&mut **m),
            BatchModel::Gpu(m) => batch.step_resident(&mut **m),
        }
    }

    /// The GPU model, on the GPU backend.
    pub fn gpu_mut(&mut self) -> Option<&mut GpuModel> {
        match self {
            BatchModel::Cpu(_) => None,
            BatchModel::Gpu(m) => Some(&mut m.0),
        }
    }

    /// Empties `slot` (its next encode starts a new sequence).
    pub fn release(&mut self, slot: usize) {
        match self {
            BatchModel::Cpu(m) => BatchDenoiseModel::release(&mut **m, slot),
            BatchModel::Gpu(m) => BatchResidentModel::release(&mut **m, slot),
        }
    }
}

/// A slot's KV cache out of the model: moved out of the CPU model, or copied on the GPU.
pub enum SlotCache {
    Cpu(KvCache),
    Gpu(CacheSnapshot),
}

impl SlotCache {
    /// Memory the cache holds (host memory on the CPU, device memory on the GPU).
    pub fn bytes(&self) -> u64 {
        match self {
            SlotCache::Cpu(cache) => cache.bytes(),
            SlotCache::Gpu(snapshot) => snapshot.bytes(),
        }
    }
}

impl BatchModel {
    /// Takes `slot`'s cache out; the slot is left empty.
    pub fn take_slot(&mut self, slot: usize) -> Result<SlotCache> {
        Ok(match self {
            BatchModel::Cpu(m) => {
                let mut cache = m.0.take_slot(slot).with_context(|| format!("slot {slot} holds no cache"))?;
                cache.shrink_to_fit();
                SlotCache::Cpu(cache)
            }
            BatchModel::Gpu(m) => {
                let snapshot = m.0.snapshot_slot(slot)?;
                m.0.release_slot(slot);
                SlotCache::Gpu(snapshot)
            }
        })
    }

    /// Makes `cache` (taken out of this model, from any slot) `slot`'s: the slot's next encode
    /// continues it.
    pub fn put_slot(&mut self, slot: usize, cache: SlotCache) -> Result<()> {
        match (self, cache) {
            (BatchModel::Cpu(m), SlotCache::Cpu(cache)) => m.0.put_slot(slot, cache),
            (BatchModel::Gpu(m), SlotCache::Gpu(snapshot)) => m.0.restore_slot(slot, &snapshot)?,
            _ => anyhow::bail!("a cache of the other backend"),
        }
        Ok(())
    }
}

/// A batched model that encodes a prompt holding images into a slot: `embeddings` are the rows of
/// the image soft tokens in `ids`, in order ([`dg_cpu::CpuModel::encode_with_images`],
/// [`dg_gpu::GpuModel::encode_slot_with_images`]).
pub trait EncodeImages {
    fn encode_with_images(&mut self, slot: usize, ids: &[u32], embeddings: &[f32]) -> Result<(), ModelError>;
}

impl EncodeImages for Errors<PerSlot<CpuModel>> {
    fn encode_with_images(&mut self, slot: usize, ids: &[u32], embeddings: &[f32]) -> Result<(), ModelError> {
        let model = self.0.slot_model(slot).map_err(ModelError::from_error)?;
        model.encode_with_images(ids, embeddings).map_err(ModelError::from_error)
    }
}

impl EncodeImages for Errors<GpuModel> {
    fn encode_with_images(&mut self, slot: usize, ids: &[u32], embeddings: &[f32]) -> Result<(), ModelError> {
        self.0.encode_slot_with_images(slot, ids, embeddings).map_err(ModelError::from_error)
    }
}

/// A batched model whose errors the batch carries as a [`ModelError`] (one batch type for every
/// backend).
pub struct Errors<M>(M);

/// A backend's error, boxed.
#[derive(Debug)]
pub struct ModelError(Box<dyn std::error::Error + Send + Sync + 'static>);

impl ModelError {
    fn from_error(e: impl std::error::Error + Send + Sync + 'static) -> Self {
        ModelError(Box::new(e))
    }
}

impl std::fmt::Display for ModelError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for ModelError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

impl<M: dg_sampler::BatchDenoiseModel> dg_sampler::BatchDenoiseModel for Errors<M> {
    type Error = ModelError;

    fn encode(&mut self, slot: usize, ids: &[u32]) -> Result<(), ModelError> {
        self.0.encode(slot, ids).map_err(ModelError::from_error)
    }

    fn canvas_forward(&mut self, batch: &mut dg_sampler::HostCanvases<'_>) -> Result<(), ModelError> {
        self.0.canvas_forward(batch).map_err(ModelError::from_error)
    }

    fn release(&mut self, slot: usize) {
        self.0.release(slot)
    }
}

impl<M: dg_sampler::BatchResidentModel> dg_sampler::BatchResidentModel for Errors<M> {
    type Error = ModelError;

    fn encode(&mut self, slot: usize, ids: &[u32]) -> Result<(), ModelError> {
        self.0.encode(slot, ids).map_err(ModelError::from_error)
    }

    fn denoise_rows(&mut self, batch: &mut dg_sampler::ResidentCanvases<'_>) -> Result<(), ModelError> {
        self.0.denoise_rows(batch).map_err(ModelError::from_error)
    }

    fn release(&mut self, slot: usize) {
        self.0.release(slot)
    }
}

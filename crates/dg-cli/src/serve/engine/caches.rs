//! How the engine reuses KV caches: what each slot's cache holds, readying a slot for a new job
//! (the longest cache its prompt extends: the slot's own, another idle slot's, or one from the
//! pool; the slot's previous cache parked in the pool), and the model wrapper whose first encode in
//! a slot skips the ids its cache already holds, and which keeps a finished job's cache in its slot.

use std::sync::atomic::Ordering;

use std::sync::Arc;

use dg_sampler::{BatchDenoiseModel, BatchResidentModel, HostCanvases, ResidentCanvases};

use super::{CacheSource, Engine, JobImages};
use crate::batch_model::{BatchModel, EncodeImages, ModelError, SlotCache};
use crate::serve::pool;

/// The token ids each slot's cache holds, and how many of them a new job's prompt shares. A
/// prompt holding images is held as its cache keys (`JobImages::keys`: each image's soft tokens
/// stand for its bytes), so prompts that differ only in an image share no cache past it.
pub(super) struct SlotCaches {
    /// The ids (cache keys) each slot's cache holds, in order (empty: the slot's cache is empty).
    pub(super) held: Vec<Vec<u32>>,
    /// Ids the slot's next encode skips (its cache holds them already).
    skip: Vec<usize>,
    /// The images of the prompt the slot encodes next, placed by that encode.
    images: Vec<Option<Arc<JobImages>>>,
}

impl SlotCaches {
    pub(super) fn new(slots: usize) -> Self {
        SlotCaches { held: vec![Vec::new(); slots], skip: vec![0; slots], images: vec![None; slots] }
    }

    /// The images the next encode in `slot` (its job's prompt) places.
    pub(super) fn set_images(&mut self, slot: usize, images: Option<Arc<JobImages>>) {
        self.images[slot] = images;
    }

    /// `model` with this cache bookkeeping around it.
    pub(super) fn reusing<'a, M: ?Sized>(&'a mut self, model: &'a mut M) -> Reusing<'a, M> {
        Reusing { model, caches: self }
    }
}

/// A batched model whose encodes skip what a slot's cache holds already and are recorded, and
/// whose released slots keep their caches (the engine decides when a cache goes).
pub(super) struct Reusing<'a, M: ?Sized> {
    model: &'a mut M,
    caches: &'a mut SlotCaches,
}

impl<M: EncodeImages + ?Sized> Reusing<'_, M> {
    /// Encodes what `ids` adds to the slot's cache: by `encode`, or, for a prompt holding images,
    /// with the rows of the images past the reused part.
    fn encode_with(
        &mut self,
        slot: usize,
        ids: &[u32],
        encode: impl FnOnce(&mut M, &[u32]) -> Result<(), ModelError>,
    ) -> Result<(), ModelError> {
        let skip = std::mem::take(&mut self.caches.skip[slot]).min(ids.len());
        let (cached, new) = ids.split_at(skip);
        match self.caches.images[slot].take() {
            Some(images) => {
                let reused_rows = cached.iter().filter(|&&id| id == images.image_token).count();
                let rows = &images.embeddings[(reused_rows * images.row_width).min(images.embeddings.len())..];
                self.model.encode_with_images(slot, new, rows)?;
                self.caches.held[slot].extend_from_slice(&images.keys[skip..]);
            }
            None => {
                encode(self.model, new)?;
                self.caches.held[slot].extend_from_slice(new);
            }
        }
        Ok(())
    }
}

impl<M: BatchDenoiseModel<Error = ModelError> + EncodeImages + ?Sized> BatchDenoiseModel for Reusing<'_, M> {
    type Error = ModelError;
    fn encode(&mut self, slot: usize, ids: &[u32]) -> Result<(), ModelError> {
        self.encode_with(slot, ids, |m, ids| m.encode(slot, ids))
    }
    fn canvas_forward(&mut self, batch: &mut HostCanvases<'_>) -> Result<(), ModelError> {
        self.model.canvas_forward(batch)
    }
    fn release(&mut self, _slot: usize) {}
}

impl<M: BatchResidentModel<Error = ModelError> + EncodeImages + ?Sized> BatchResidentModel for Reusing<'_, M> {
    type Error = ModelError;
    fn encode(&mut self, slot: usize, ids: &[u32]) -> Result<(), ModelError> {
        self.encode_with(slot, ids, |m, ids| m.encode(slot, ids))
    }
    fn denoise_rows(&mut self, batch: &mut ResidentCanvases<'_>) -> Result<(), ModelError> {
        self.model.denoise_rows(batch)
    }
    fn release(&mut self, _slot: usize) {}
}

/// Where a new job's prompt finds its longest cache.
enum Found {
    /// In the slot it gets.
    Here,
    /// In another slot that runs no job.
    Slot(usize),
    /// In the pool, at this index.
    Pool(usize),
    None,
}

impl Engine {
    /// Readies `slot` (free, about to take a job of `prompt`): it gets the longest cache whose
    /// ids `prompt` extends (its own, another idle slot's, or the pool's, taken out), its previous
    /// cache parked in the pool otherwise; its next encode skips what that cache holds. Returns
    /// the number of prompt tokens reused and where they come from.
    pub(super) fn attach(&mut self, slot: usize, prompt: &[u32]) -> (usize, CacheSource) {
        let held = &self.caches.held;
        let extended = |ids: &[u32]| if pool::extends(prompt, ids) { ids.len() } else { 0 };
        let mut found = (extended(&held[slot]), Found::Here);
        for other in (0..held.len()).filter(|&s| s != slot && !self.slot_of.iter().any(|&(_, busy)| busy == s)) {
            let len = extended(&held[other]);
            if len > found.0 {
                found = (len, Found::Slot(other));
            }
        }
        if let Some((index, len)) = self.pool.longest_prefix(prompt)
            && len > found.0
        {
            found = (len, Found::Pool(index));
        }
        if found.0 == 0 {
            found.1 = Found::None;
        }
        let source = match found.1 {
            Found::Here => CacheSource::Resident,
            Found::Slot(other) => {
                self.park(slot);
                let ids = std::mem::take(&mut self.caches.held[other]);
                self.enter(slot, ids, |model| model.take_slot(other), CacheSource::Resident)
            }
            Found::Pool(index) => {
                // Taken out before the slot's cache is parked, which may evict.
                let (ids, cache) = self.pool.take(index);
                self.park(slot);
                self.enter(slot, ids, |_| Ok(cache), CacheSource::Pool)
            }
            Found::None => {
                self.park(slot);
                CacheSource::None
            }
        };
        self.publish_pool();
        let metrics = &self.setup.metrics;
        let counter = match source {
            CacheSource::None => &metrics.cache_misses,
            CacheSource::Resident => &metrics.cache_hits_resident,
            CacheSource::Pool => &metrics.cache_hits_pool,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        let reused = self.caches.held[slot].len();
        self.caches.skip[slot] = reused;
        (reused, source)
    }

    /// Makes the cache `take` gives (holding `ids`) the cache of `slot`, which is empty; on a
    /// failure the slot stays empty and the prompt is encoded from its start.
    fn enter(
        &mut self,
        slot: usize,
        ids: Vec<u32>,
        take: impl FnOnce(&mut BatchModel) -> anyhow::Result<SlotCache>,
        source: CacheSource,
    ) -> CacheSource {
        match take(&mut self.model).and_then(|cache| self.model.put_slot(slot, cache)) {
            Ok(()) => {
                self.caches.held[slot] = ids;
                source
            }
            Err(e) => {
                eprintln!("warning: a kept KV cache could not be restored: {e:#}");
                self.forget(slot);
                CacheSource::None
            }
        }
    }

    /// Puts `slot`'s cache in the pool (when it holds anything and the pool keeps anything); the
    /// slot is left empty.
    fn park(&mut self, slot: usize) {
        let ids = std::mem::take(&mut self.caches.held[slot]);
        if ids.is_empty() || self.pool.budget() == 0 {
            self.model.release(slot);
            return;
        }
        let evicted = match self.model.take_slot(slot) {
            Ok(cache) => {
                let bytes = cache.bytes();
                self.pool.park(ids, cache, bytes)
            }
            Err(e) => {
                eprintln!("warning: the KV cache could not be kept in the pool: {e:#}");
                self.model.release(slot);
                1
            }
        };
        self.setup.metrics.pool_evictions.fetch_add(evicted as u64, Ordering::Relaxed);
    }

    /// Empties `slot`'s cache (after a failure its contents are unknown).
    pub(super) fn forget(&mut self, slot: usize) {
        self.model.release(slot);
        self.caches.held[slot].clear();
        self.caches.skip[slot] = 0;
        self.caches.images[slot] = None;
    }

    pub(super) fn publish_pool(&self) {
        let metrics = &self.setup.metrics;
        metrics.pool_bytes.store(self.pool.bytes(), Ordering::Relaxed);
        metrics.pool_entries.store(self.pool.len() as u64, Ordering::Relaxed);
    }
}

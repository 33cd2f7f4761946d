//! How the engine reuses KV caches: parking the model's cache in the pool (moved out of the CPU
//! model, or copied on the GPU), giving the model the longest cache a prompt extends, and the
//! model wrapper whose first encode skips the ids that cache already holds (timing each step).

use std::sync::atomic::Ordering;
use std::time::Instant;

use anyhow::Result;
use dg_cpu::cache::KvCache;
use dg_gpu::CacheSnapshot;
use dg_sampler::{CategoricalRequest, DenoiseModel, ResidentModel, RowResult};

use super::{CacheSource, Engine, Loaded};
use crate::serve::metrics::Metrics;
use crate::serve::pool;

/// A cache parked in the pool: moved out of the CPU model, or copied on the GPU.
pub(super) enum Snapshot {
    Cpu(KvCache),
    Gpu(CacheSnapshot),
}

impl Loaded {
    /// Moves the model's cache into a snapshot (the model is left empty); with the bytes it holds.
    fn park(&mut self) -> Result<(Snapshot, u64)> {
        Ok(match self {
            Loaded::Cpu(m) => {
                let mut cache = m.take_cache();
                cache.shrink_to_fit();
                let bytes = cache.bytes();
                (Snapshot::Cpu(cache), bytes)
            }
            Loaded::Gpu(m) => {
                let snapshot = m.snapshot_cache()?;
                m.reset();
                let bytes = snapshot.bytes();
                (Snapshot::Gpu(snapshot), bytes)
            }
        })
    }

    /// Makes a parked cache the model's.
    fn restore(&mut self, snapshot: Snapshot) -> Result<()> {
        match (self, snapshot) {
            (Loaded::Cpu(m), Snapshot::Cpu(cache)) => m.put_cache(cache)?,
            (Loaded::Gpu(m), Snapshot::Gpu(snapshot)) => m.restore_cache(&snapshot)?,
            _ => anyhow::bail!("a parked cache of the other backend"),
        }
        Ok(())
    }
}

impl Engine {
    /// Puts the model's cache in the pool (when it holds anything and the pool keeps anything);
    /// the model is left empty.
    fn park(&mut self) {
        let ids = std::mem::take(&mut self.cached);
        if ids.is_empty() || self.pool.budget() == 0 {
            self.model.reset();
            return;
        }
        let metrics = &self.setup.metrics;
        let evicted = match self.model.park() {
            Ok((snapshot, bytes)) => self.pool.park(ids, snapshot, bytes),
            Err(e) => {
                eprintln!("warning: the KV cache could not be kept in the pool: {e:#}");
                self.model.reset();
                1
            }
        };
        metrics.pool_evictions.fetch_add(evicted as u64, Ordering::Relaxed);
        self.publish_pool();
    }

    pub(super) fn publish_pool(&self) {
        let metrics = &self.setup.metrics;
        metrics.pool_bytes.store(self.pool.bytes(), Ordering::Relaxed);
        metrics.pool_entries.store(self.pool.len() as u64, Ordering::Relaxed);
    }

    /// Gives the model the longest cache `prompt` extends (its own, or one from the pool, parking
    /// its own), or an empty one; returns the ids it holds (skipped by the first encode).
    pub(super) fn attach(&mut self, prompt: &[u32]) -> (usize, CacheSource) {
        let resident = if pool::extends(prompt, &self.cached) { self.cached.len() } else { 0 };
        let metrics = self.setup.metrics.clone();
        let source = match self.pool.longest_prefix(prompt) {
            Some((index, len)) if len > resident => {
                // Taken out before the model's cache is parked, which may evict.
                let (ids, snapshot) = self.pool.take(index);
                self.park();
                self.publish_pool();
                match self.model.restore(snapshot) {
                    Ok(()) => {
                        self.cached = ids;
                        CacheSource::Pool
                    }
                    Err(e) => {
                        eprintln!("warning: a pooled KV cache could not be restored: {e:#}");
                        self.forget();
                        CacheSource::None
                    }
                }
            }
            _ if resident > 0 => CacheSource::Resident,
            _ => {
                self.park();
                CacheSource::None
            }
        };
        let counter = match source {
            CacheSource::None => &metrics.cache_misses,
            CacheSource::Resident => &metrics.cache_hits_resident,
            CacheSource::Pool => &metrics.cache_hits_pool,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        (self.cached.len(), source)
    }
}

/// Cache reuse and timing around a model: the first encode skips the `skip` ids the cache already
/// holds; every encoded id is recorded; each step is timed.
pub(super) struct CacheSkip<'a> {
    pub(super) skip: usize,
    pub(super) encoded: Vec<u32>,
    pub(super) metrics: &'a Metrics,
}

impl<'a> CacheSkip<'a> {
    pub(super) fn wrap<'m, M>(&'m mut self, model: M) -> Skipping<'m, 'a, M> {
        Skipping { cache: self, model, encodes: 0 }
    }
}

pub(super) struct Skipping<'m, 'a, M> {
    cache: &'m mut CacheSkip<'a>,
    model: M,
    encodes: usize,
}

impl<M> Skipping<'_, '_, M> {
    fn encode_with<E>(&mut self, ids: &[u32], encode: impl FnOnce(&mut M, &[u32]) -> Result<(), E>) -> Result<(), E> {
        let first = self.encodes == 0;
        self.encodes += 1;
        let ids = if first { &ids[self.cache.skip..] } else { ids };
        encode(&mut self.model, ids)?;
        self.cache.encoded.extend_from_slice(ids);
        Ok(())
    }

    fn timed<T>(&mut self, step: impl FnOnce(&mut M) -> T) -> T {
        let start = Instant::now();
        let out = step(&mut self.model);
        self.cache.metrics.step_seconds.observe(start.elapsed().as_secs_f64());
        out
    }
}

impl<M: DenoiseModel> DenoiseModel for Skipping<'_, '_, M> {
    type Error = M::Error;
    fn encode(&mut self, ids: &[u32]) -> Result<(), M::Error> {
        self.encode_with(ids, |m, ids| m.encode(ids))
    }
    fn canvas_forward(&mut self, canvas: &[u32], sc: Option<&[f32]>, logits: &mut [f32]) -> Result<(), M::Error> {
        self.timed(|m| m.canvas_forward(canvas, sc, logits))
    }
}

impl<M: ResidentModel> ResidentModel for Skipping<'_, '_, M> {
    type Error = M::Error;
    fn encode(&mut self, ids: &[u32]) -> Result<(), M::Error> {
        self.encode_with(ids, |m, ids| m.encode(ids))
    }
    fn denoise_rows(
        &mut self,
        canvas: &[u32],
        sc: bool,
        t: f32,
        draw: CategoricalRequest<'_>,
        rows: &mut [RowResult],
    ) -> Result<(), M::Error> {
        self.timed(|m| m.denoise_rows(canvas, sc, t, draw, rows))
    }
}

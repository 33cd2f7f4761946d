//! Device-side snapshots of the GPU model's KV cache: the rows a later encode or canvas forward can
//! read (every position in full layers, the last W−1 in sliding layers) copied into buffers of
//! their own with `copy_buffer_to_buffer`, and copied back (full layers at row = position, sliding
//! layers from row 0, their base then the window's first position).
//! A server keeps several conversations' caches this way while the model's own cache serves another,
//! and moves a cache between the slots of a batched model ([`GpuModel::snapshot_slot`],
//! [`GpuModel::restore_slot`]).

use dg_model::LayerKind;

use super::GpuModel;
use crate::error::GpuError;

/// One layer's saved cache of positions `start..start + rows`.
#[derive(Debug)]
struct SavedLayer {
    start: usize,
    rows: usize,
    /// Bytes of one row of keys (or values): `kv_heads · head_dim` values as the cache stores them.
    row_bytes: u64,
    keys: wgpu::Buffer,
    values: wgpu::Buffer,
}

/// A copy of the KV cache the GPU encoder wrote, on the device.
#[derive(Debug)]
pub struct CacheSnapshot {
    seq_len: usize,
    layers: Vec<SavedLayer>,
}

impl CacheSnapshot {
    /// Tokens the saved cache had encoded.
    pub fn seq_len(&self) -> usize {
        self.seq_len
    }

    /// Device memory the snapshot holds.
    pub fn bytes(&self) -> u64 {
        self.layers.iter().map(|l| l.keys.size() + l.values.size()).sum()
    }
}

impl GpuModel {
    /// Copies the cache's readable rows into new device buffers (one copy per layer's keys and
    /// values, submitted on the model's queue: later work sees the cache as it was). The model's
    /// own cache is unchanged. A cache uploaded with [`Instrumentation::set_context`](crate::Instrumentation::set_context) is refused (its rows
    /// do not sit at row = position).
    pub fn snapshot_cache(&self) -> Result<CacheSnapshot, GpuError> {
        self.snapshot_slot(0)
    }

    /// [`Self::snapshot_cache`] of `slot`'s cache (slot 0 is the single-sequence API's): a batched
    /// server parks a finished sequence's cache this way.
    pub fn snapshot_slot(&self, slot: usize) -> Result<CacheSnapshot, GpuError> {
        self.check_slot(slot)?;
        if slot == 0 && self.uploaded_context {
            return Err(GpuError::Unsupported { what: "a snapshot of a cache uploaded with set_context".into() });
        }
        let mut encoder = self.ctx.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("cache snapshot") });
        let mut layers = Vec::with_capacity(self.arena.caches[slot].len());
        let visible = self.slot_visible(slot);
        for (i, ((v, spec), cache)) in visible.iter().zip(&self.config.text.layers).zip(&self.arena.caches[slot]).enumerate() {
            let base = if spec.kind == LayerKind::Sliding { self.sliding_bases[slot] } else { 0 };
            let row_bytes = self.arena.cache_row_bytes(spec);
            let size = v.len as u64 * row_bytes;
            let usage = wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST;
            // wgpu buffers hold at least one word; an empty cache copies nothing.
            let keys = self.ctx.buffer(&format!("cache snapshot.{i}.k"), size.max(4), usage)?;
            let values = self.ctx.buffer(&format!("cache snapshot.{i}.v"), size.max(4), usage)?;
            if size > 0 {
                let offset = v.start as u64 * row_bytes;
                encoder.copy_buffer_to_buffer(&cache.keys, offset, &keys, 0, size);
                encoder.copy_buffer_to_buffer(&cache.values, offset, &values, 0, size);
            }
            layers.push(SavedLayer { start: base + v.start, rows: v.len, row_bytes, keys, values });
        }
        self.ctx.queue.submit(Some(encoder.finish()));
        Ok(CacheSnapshot { seq_len: self.seq_lens[slot], layers })
    }

    /// Copies a snapshot of this model's cache back to the rows it came from; the next encode and
    /// canvas forward continue from it. The snapshot stays valid (it can be restored again).
    pub fn restore_cache(&mut self, snapshot: &CacheSnapshot) -> Result<(), GpuError> {
        self.restore_slot(0, snapshot)
    }

    /// [`Self::restore_cache`] into `slot`'s cache: the slot's next encode and canvases continue
    /// from the snapshot, whichever slot it was taken from.
    pub fn restore_slot(&mut self, slot: usize, snapshot: &CacheSnapshot) -> Result<(), GpuError> {
        self.check_slot(slot)?;
        let cfg = &self.config.text;
        if snapshot.layers.len() != cfg.num_layers() {
            return Err(GpuError::Length { what: "snapshot layers", got: snapshot.layers.len(), expected: cfg.num_layers() });
        }
        if snapshot.seq_len > self.arena.max_context {
            return Err(GpuError::TooLong {
                len: snapshot.seq_len,
                max: self.arena.max_context,
                limit_name: "the GPU cache's max_context",
                hint: " (the snapshot comes from a model with a larger context)",
            });
        }
        // The sliding layers' window goes to row 0.
        let sliding_base = snapshot.seq_len - snapshot.seq_len.min(cfg.sliding_kept());
        let base = |kind: LayerKind| if kind == LayerKind::Sliding { sliding_base } else { 0 };
        for (l, spec) in snapshot.layers.iter().zip(&cfg.layers) {
            let row_bytes = self.arena.cache_row_bytes(spec);
            if l.row_bytes != row_bytes || l.start + l.rows > snapshot.seq_len {
                return Err(GpuError::Length { what: "snapshot row bytes", got: l.row_bytes as usize, expected: row_bytes as usize });
            }
            if l.start < base(spec.kind) || l.start + l.rows - base(spec.kind) > self.arena.cache_positions(spec.kind) {
                return Err(GpuError::Unsupported {
                    what: format!("a snapshot whose layer holds positions {}..{} (not this model's window)", l.start, l.start + l.rows),
                });
            }
        }
        let mut encoder = self.ctx.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("cache restore") });
        for ((l, spec), cache) in snapshot.layers.iter().zip(&cfg.layers).zip(&self.arena.caches[slot]) {
            let size = l.rows as u64 * l.row_bytes;
            if size > 0 {
                let offset = (l.start - base(spec.kind)) as u64 * l.row_bytes;
                encoder.copy_buffer_to_buffer(&l.keys, 0, &cache.keys, offset, size);
                encoder.copy_buffer_to_buffer(&l.values, 0, &cache.values, offset, size);
            }
        }
        self.ctx.queue.submit(Some(encoder.finish()));
        self.seq_lens[slot] = snapshot.seq_len;
        self.sliding_bases[slot] = sliding_base;
        if slot == 0 {
            self.context_ready = false;
            self.uploaded_context = false;
        }
        Ok(())
    }

    fn check_slot(&self, slot: usize) -> Result<(), GpuError> {
        if slot >= self.arena.slots {
            return Err(GpuError::Limit {
                what: format!("slot {slot}"),
                needed: slot as u64 + 1,
                limit: self.arena.slots as u64,
                limit_name: "the slots the model was loaded with",
            });
        }
        Ok(())
    }
}

//! Warm-up: every kernel a generation will dispatch, compiled before the first request.
//!
//! A pipeline is otherwise compiled when a plan first needs it (`Pipelines::get`), so the first
//! prefill and the first block's steps of a process wait on the driver's compiler (seconds on a
//! machine whose driver has no disk cache of them yet). [`GpuModel::warm_up`] asks the planner which
//! kernels the shapes of a generation take (a [`Recorder::keys_only`] recording of each: nothing
//! created, no plan or cache touched) and compiles those, in parallel. The counterpart of vLLM's
//! start-up compilation and CUDA-graph capture (`LLMEngine._initialize_kv_caches` warming the model
//! before it serves). [`GpuModel::warm_up_reads`] does the same for typed reads' forwards (canvases
//! 16 to 64 wide, the head at the slot rows), which a server that answers reads runs as well.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use dg_kernels::KernelKey;
use dg_model::{LayerKind, TextConfig};

use super::{GpuModel, chunk_at};
use crate::arena::KEY_PAD;
use crate::error::GpuError;
use crate::forward::{
    CanvasShape, EncoderChunk, ForwardShape, Head, SelfConditioning, Visible, record_canvas_forward, record_encoder_chunk,
};
use crate::ops::Recorder;

/// What [`GpuModel::warm_up`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WarmUp {
    /// Kernel variants a generation of this model uses.
    pub kernels: usize,
    /// Of those, the ones compiled now (the rest already were).
    pub compiled: usize,
    /// The time it took, planning included.
    pub elapsed: Duration,
}

impl GpuModel {
    /// Compiles every kernel a generation will use, so that no request waits on the compiler:
    /// those of the encoder chunks a prompt and a commit record (every planned chunk length at the
    /// first positions, a second chunk, the canvas commits), the canvas forward with and without
    /// self-conditioning at every context the cache holds, and, with several slots, the batched
    /// steps of every number of canvases.
    pub fn warm_up(&mut self) -> Result<WarmUp, GpuError> {
        let start = Instant::now();
        let keys = self.generation_kernels()?;
        let compiled = self.pipelines.compile_all(&self.ctx, keys.iter().copied())?;
        Ok(WarmUp { kernels: keys.len(), compiled, elapsed: start.elapsed() })
    }

    /// Compiles every kernel a typed read's forward will use (`read_forwards` in the last slot,
    /// the one a server keeps for reads): canvases of [`READ_WIDTHS`] at every context the cache
    /// holds, alone and as many as one forward holds (a prompt's samples and re-reads), with and
    /// without self-conditioning at some rows (pinned multi-step reads), the head at every number
    /// of slot rows a canvas can ask for. The prompts' encoder chunks are [`Self::warm_up`]'s.
    pub fn warm_up_reads(&mut self) -> Result<WarmUp, GpuError> {
        let start = Instant::now();
        let keys = self.read_kernels()?;
        let compiled = self.pipelines.compile_all(&self.ctx, keys.iter().copied())?;
        Ok(WarmUp { kernels: keys.len(), compiled, elapsed: start.elapsed() })
    }

    /// The keys of the kernels [`Self::warm_up_reads`] compiles.
    pub fn read_kernels(&self) -> Result<HashSet<KernelKey>, GpuError> {
        let (c, max) = (self.config.canvas_length, self.arena.max_context);
        let (keep, positions) = (self.config.text.sliding_kept(), self.arena.sliding_positions);
        let slot = self.arena.slots - 1;
        let mut keys = HashSet::new();
        for width in READ_WIDTHS.into_iter().filter(|&w| w <= c) {
            let most = self.max_reads(width);
            let counts: Vec<usize> = if most > 1 { vec![1, most] } else { vec![1] };
            let shape = |visible: &[Visible], canvases: usize, self_conditioning, rows: usize| ForwardShape {
                canvases: vec![CanvasShape { slot, visible: visible.to_vec() }; canvases],
                self_conditioning,
                width,
                head: Head::Rows(vec![rows; canvases]),
            };
            let mut first = None;
            // The layers follow the context (their attention's keys: the cached rows padded, then
            // the canvases before a canvas and its own).
            for context in contexts(max, width) {
                let base = chunk_at(keep, positions, 0, (context, 0), width).base;
                let visible = visible_rows(&self.config.text, context, base);
                for &canvases in &counts {
                    for sc in [SelfConditioning::Off, SelfConditioning::Gated] {
                        keys.extend(self.read_keys(&shape(&visible, canvases, sc, 1))?);
                    }
                }
                first.get_or_insert(visible);
            }
            // The head follows the slot rows a canvas asks for, at any context.
            if let Some(visible) = first {
                for rows in 2..=width {
                    for &canvases in &counts {
                        keys.extend(self.read_keys(&shape(&visible, canvases, SelfConditioning::Off, rows))?);
                    }
                }
            }
        }
        Ok(keys)
    }

    /// The keys of a read forward of `shape`; none where the shape cannot run (its canvases do not
    /// fit after the context).
    fn read_keys(&self, shape: &ForwardShape) -> Result<HashSet<KernelKey>, GpuError> {
        let mut rec = Recorder::keys_only(&self.ctx);
        match record_canvas_forward(&mut rec, &self.config, &self.weights, &self.arena, shape) {
            Ok(()) => Ok(rec.into_keys()),
            Err(GpuError::TooLong { .. }) => Ok(HashSet::new()),
            Err(e) => Err(e),
        }
    }

    /// The keys of the kernels [`Self::warm_up`] compiles.
    pub fn generation_kernels(&self) -> Result<HashSet<KernelKey>, GpuError> {
        let (c, chunk, max) = (self.config.canvas_length, self.prefill_chunk, self.arena.max_context);
        let (keep, positions) = (self.config.text.sliding_kept(), self.arena.sliding_positions);
        let mut keys = HashSet::new();
        // The prompt's chunks: its first (of any planned length), then a later one.
        for start in [0, chunk].into_iter().filter(|&s| s < max) {
            for tokens in planned_lengths(chunk.min(max - start)) {
                let chunk = chunk_at(keep, positions, 0, (start, 0), tokens);
                keys.extend(self.encoder_keys(chunk)?);
            }
        }
        // Every context a canvas forward (and the commit after it) can see: the kernels follow the
        // cached rows padded to `KEY_PAD`.
        for context in contexts(max, c) {
            let base = chunk_at(keep, positions, 0, (context, 0), c).base;
            keys.extend(self.encoder_keys(chunk_at(keep, positions, 0, (context, base), c))?);
            let visible = visible_rows(&self.config.text, context, base);
            for shape in self.forward_shapes(&visible) {
                keys.extend(self.forward_keys(&shape)?);
            }
        }
        Ok(keys)
    }

    /// The shapes of the forwards a canvas over `visible` takes: alone, and with several slots in
    /// every batch of canvases up to them.
    fn forward_shapes(&self, visible: &[Visible]) -> Vec<ForwardShape> {
        let width = self.config.canvas_length;
        let mut shapes: Vec<ForwardShape> = [false, true].map(|sc| ForwardShape::single(visible.to_vec(), sc, width)).into();
        if self.arena.slots > 1 {
            for canvases in 1..=self.arena.slots {
                let canvases: Vec<CanvasShape> = (0..canvases).map(|slot| CanvasShape { slot, visible: visible.to_vec() }).collect();
                for self_conditioning in [SelfConditioning::Off, SelfConditioning::On, SelfConditioning::Gated] {
                    shapes.push(ForwardShape { canvases: canvases.clone(), self_conditioning, width, head: Head::All });
                }
            }
        }
        shapes
    }

    fn encoder_keys(&self, chunk: EncoderChunk) -> Result<HashSet<KernelKey>, GpuError> {
        let mut rec = Recorder::keys_only(&self.ctx);
        record_encoder_chunk(&mut rec, &self.config, &self.weights, &self.arena, chunk)?;
        Ok(rec.into_keys())
    }

    fn forward_keys(&self, shape: &ForwardShape) -> Result<HashSet<KernelKey>, GpuError> {
        let mut rec = Recorder::keys_only(&self.ctx);
        match shape.canvases.len() == 1 && shape.canvases[0].slot == 0 && shape.self_conditioning != SelfConditioning::Gated {
            true => record_canvas_forward(&mut rec, &self.config, &self.weights, &self.arena, shape)?,
            false => self.record_batch_keys(&mut rec, shape)?,
        }
        Ok(rec.into_keys())
    }
}

/// The canvas widths of typed reads (OpenJev's: multiples of 16 up to 64).
pub const READ_WIDTHS: [usize; 4] = [16, 32, 48, 64];

/// Chunk lengths up to `max` that cover the planner's choices: its thresholds are powers of two
/// (tile rows) and its row kernels' lanes follow a length's factors of 2 and 4, so each power of
/// two, the three lengths after it and `max` itself.
fn planned_lengths(max: usize) -> Vec<usize> {
    let mut lengths: Vec<usize> =
        std::iter::successors(Some(1usize), |p| p.checked_mul(2)).take_while(|&p| p <= max).flat_map(|p| p..p + 4).collect();
    lengths.push(max);
    lengths.retain(|&n| (1..=max).contains(&n));
    lengths.sort_unstable();
    lengths.dedup();
    lengths
}

/// Context lengths, one for each multiple of `KEY_PAD` a cache of `max` positions holds with a
/// canvas of `c` after it.
fn contexts(max: usize, c: usize) -> impl Iterator<Item = usize> {
    (1..=max.saturating_sub(c).div_ceil(KEY_PAD)).map(move |k| (k * KEY_PAD).min(max - c))
}

/// The cache rows each layer sees for a sequence of `seq_len` tokens whose sliding caches hold
/// position `base` at row 0: every token in full layers, the last W−1 in sliding layers (spec
/// §5.2).
pub(super) fn visible_rows(cfg: &TextConfig, seq_len: usize, base: usize) -> Vec<Visible> {
    cfg.layers
        .iter()
        .map(|l| {
            let (len, base) = match l.kind {
                LayerKind::Full => (seq_len, 0),
                LayerKind::Sliding => (seq_len.min(cfg.sliding_kept()), base),
            };
            Visible { start: seq_len - len - base, len }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn planned_lengths_cover_each_power_of_two_and_its_neighbours() {
        assert_eq!(planned_lengths(1), [1]);
        assert_eq!(planned_lengths(10), [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
        assert_eq!(planned_lengths(40), [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 16, 17, 18, 19, 32, 33, 34, 35, 40]);
    }

    #[test]
    fn contexts_take_every_padded_length() {
        assert_eq!(contexts(100, 32).collect::<Vec<_>>(), [32, 64, 68]);
        assert_eq!(contexts(32, 32).count(), 0);
    }
}

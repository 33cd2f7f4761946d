//! The GPU model behind a small API (`DiffusionGemmaForBlockDiffusion` minus the sampler): weights
//! uploaded once, one activation arena, a GPU-resident KV cache, and dispatch plans built once per
//! block and replayed every step with only input writes, one submit and one readback.
//!
//! - [`GpuModel::encode`] runs the encoder on the GPU (prompt prefill in chunks of C tokens, and the
//!   commit of each finished canvas), appending K/V to the cache the canvas forward reads.
//! - [`GpuModel::denoise_rows`] ([`dg_sampler::ResidentModel`]) runs a canvas forward and the
//!   sampler's per-row work; the logits and the self-conditioning input stay on the GPU and only
//!   16 bytes per canvas position come back.
//! - [`GpuModel::canvas_forward`] ([`dg_sampler::DenoiseModel`]) reads the full logits back instead
//!   (logits-level parity, and the host sampler).
//! - [`Instrumentation`] holds what benchmarks and parity need beyond that ([`instrument`]): a cache
//!   computed elsewhere uploaded, one layer run alone, profiles and timed replays.
//! - [`GpuModel::read_forwards`] ([`dg_sampler::ReadModel`], [`dg_sampler::BatchReadModel`]) reads
//!   canvases of width W ≤ C after a slot's cache, the head at the asked rows only ([`read`]).
//! - [`GpuModel::snapshot_cache`] and [`GpuModel::restore_cache`] keep a copy of the cache on the
//!   device and put it back ([`snapshot`]).
//! - [`GpuModel::warm_up`] compiles every kernel a generation uses before the first request
//!   ([`warm`]).

mod batch;
mod instrument;
mod read;
mod snapshot;
mod warm;

use std::ops::Range;

use dg_kernels::WeightFormat;
use dg_kernels::sample_rows::{self, RESULT_WORDS, SampleStep};
use dg_model::{LayerKind, ModelConfig, TensorSource};
use dg_sampler::{CategoricalRequest, RowResult};

use crate::arena::Arena;
use crate::context::{GpuContext, map_read_with};
use crate::error::GpuError;
use crate::forward::{EncoderChunk, ForwardShape, ImageRows, Visible, record_canvas_forward, record_encoder_chunk, record_encoder_layers};
use crate::ops::Recorder;
use crate::plan::{Pipelines, Plan, submit_in_parts};
use crate::weights::{GpuWeights, UploadProgress};

pub use instrument::{EncoderProfile, Instrumentation};
pub use read::SlotReader;
pub use snapshot::CacheSnapshot;
pub use warm::{READ_WIDTHS, WarmUp};

/// Visible cached K/V of one layer, `[tokens, kv_heads, head_dim]` each.
#[derive(Debug, Clone, Copy)]
pub struct LayerContext<'a> {
    pub keys: &'a [f32],
    pub values: &'a [f32],
}

struct BlockPlans {
    visible: Vec<Visible>,
    plain: Plan,
    self_conditioned: Plan,
}

/// DiffusionGemma's encoder and canvas forward on one GPU.
pub struct GpuModel {
    pub ctx: GpuContext,
    config: ModelConfig,
    pipelines: Pipelines,
    weights: GpuWeights,
    arena: Arena,
    plans: Option<BlockPlans>,
    /// The sampler's per-row work (`sample_rows`), appended to a forward in resident steps.
    sample_plan: Plan,
    /// Tokens in each slot's cache (the next position); slot 0 is the single-sequence API's.
    seq_lens: Vec<usize>,
    /// Per slot, the position at row 0 of its sliding layers' caches (`Arena::sliding_positions`;
    /// full layers keep every position at row = position).
    sliding_bases: Vec<usize>,
    /// Plans of batched steps ([`batch`]): forwards with their sampler rows, by shape.
    batch_plans: batch::PlanCache,
    /// Plans of read forwards ([`read`]), by shape.
    read_plans: read::ReadPlans,
    /// Encoder plans of the canvas commits to come, by their chunks: recorded while
    /// the GPU runs a denoising step ([`Self::prerecord_commits`]), so that a commit only runs.
    commit_plans: std::collections::HashMap<EncoderChunk, Plan>,
    /// The single-sequence forward's plans match the cache.
    context_ready: bool,
    /// Per block of C rows of the RoPE tables, the position of its first row (None: unknown):
    /// a forward's canvas, or a commit of a canvas at the positions it was denoised at, finds its
    /// tables there ([`Self::ensure_rope`]).
    rope_blocks: Vec<Option<usize>>,
    /// The cache came from [`Instrumentation::set_context`](crate::Instrumentation::set_context) (rows from 0, not at row = position).
    uploaded_context: bool,
    /// u32 staging of the per-step draw inputs.
    draw_words: Vec<u32>,
    /// Tokens per encoder chunk (at most the arena's rows).
    prefill_chunk: usize,
}

/// One layer's cached keys and values on the host, each `[tokens, kv_heads, head_dim]`.
pub type LayerKv = (Vec<f32>, Vec<f32>);

impl std::fmt::Debug for GpuModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuModel").field("adapter", &self.ctx.info.name).field("seq_lens", &self.seq_lens).finish()
    }
}

/// [`GpuModel::next_chunk`] of `slot` whose cache holds `start` tokens with its sliding caches from
/// position `base`, where a sliding layer keeps `keep` positions and its cache holds `positions`.
fn chunk_at(keep: usize, positions: usize, slot: usize, (start, base): (usize, usize), tokens: usize) -> EncoderChunk {
    // The chunk's rows end at start + tokens − base (plus padding and a canvas, which the rows
    // beyond `positions` hold); a chunk is at most `token_rows` tokens, so from the moved base it
    // fits: min(start, W − 1) + tokens ≤ positions.
    let base = if start + tokens - base <= positions { base } else { start - start.min(keep) };
    EncoderChunk { slot, start, tokens, base, image: None }
}

/// An encoder chunk's tokens within the ids of one encode, and the image run it holds.
type ChunkOfPrompt = (Range<usize>, Option<Range<usize>>);

/// The encoder chunks of `len` new tokens whose image soft tokens lie at `spans` (sorted, disjoint
/// ranges of them): ranges of at most `most` tokens, each with the span it holds whole; no chunk
/// cuts a span or holds two (an image's rows see each other, and a chunk's mask holds one span).
fn encoder_chunks(len: usize, most: usize, spans: &[Range<usize>]) -> Result<Vec<ChunkOfPrompt>, GpuError> {
    if let Some(span) = spans.iter().find(|s| s.len() > most) {
        return Err(GpuError::Unsupported {
            what: format!(
                "an image of {} soft tokens: its tokens are encoded in one chunk, of at most {most} tokens here (a smaller image budget fits)",
                span.len()
            ),
        });
    }
    let (mut out, mut pos, mut spans) = (Vec::new(), 0, spans.iter().peekable());
    while pos < len {
        let mut end = (pos + most).min(len);
        let mut image = None;
        if let Some(span) = spans.next_if(|s| s.end <= end) {
            image = Some(span.clone());
        }
        // The next span starts after the chunk, or the chunk ends where it starts (a span no
        // longer than `most` that starts at `pos` ends within the chunk, taken above).
        if let Some(next) = spans.peek() {
            end = end.min(next.start.max(pos + 1));
        }
        out.push((pos..end, image));
        pos = end;
    }
    Ok(out)
}

/// The maximal runs of `token` in `ids`, as index ranges (HF's `get_block_sequence_ids_for_mask`
/// groups of an image's soft tokens).
fn runs(ids: &[u32], token: u32) -> Vec<Range<usize>> {
    let mut out: Vec<Range<usize>> = Vec::new();
    for (i, _) in ids.iter().enumerate().filter(|&(_, &id)| id == token) {
        match out.last_mut() {
            Some(run) if run.end == i => run.end += 1,
            _ => out.push(i..i + 1),
        }
    }
    out
}

/// `u` as the f32 the GPU compares against, kept below 1 (an f64 just under 1 rounds to 1.0).
fn uniform_f32(u: f64) -> f32 {
    (u as f32).min(1.0 - f32::EPSILON / 2.0)
}

/// How [`GpuModel::load`] loads a model: the positions each sequence's KV cache holds (prompt
/// plus every committed canvas), how the matrices are stored on the device, how many sequences
/// the model holds at once, and whom to tell of the upload's progress.
pub struct ModelOptions<'p> {
    /// Positions of one sequence's KV cache.
    pub max_context: usize,
    /// Storage of the weight matrices ([`WeightFormat::F32`] by default; BF16 keeps 2 bytes per
    /// parameter, F16 and the quantized formats feed the tensor cores).
    pub format: WeightFormat,
    /// Sequences with a KV cache each (1 by default).
    pub slots: usize,
    /// Called as the upload goes.
    pub progress: Option<&'p mut dyn FnMut(&UploadProgress)>,
}

impl<'p> ModelOptions<'p> {
    /// One sequence of `max_context` positions, f32 matrices, no progress reports.
    pub fn new(max_context: usize) -> Self {
        ModelOptions { max_context, format: WeightFormat::F32, slots: 1, progress: None }
    }

    /// The matrices stored as `format`.
    pub fn format(self, format: WeightFormat) -> Self {
        ModelOptions { format, ..self }
    }

    /// A KV cache for each of `slots` sequences.
    pub fn slots(self, slots: usize) -> Self {
        ModelOptions { slots, ..self }
    }

    /// `on_progress` told of the upload as it goes.
    pub fn progress(self, on_progress: &'p mut dyn FnMut(&UploadProgress)) -> Self {
        ModelOptions { progress: Some(on_progress), ..self }
    }
}

impl std::fmt::Debug for ModelOptions<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelOptions")
            .field("max_context", &self.max_context)
            .field("format", &self.format)
            .field("slots", &self.slots)
            .field("progress", &self.progress.is_some())
            .finish()
    }
}

impl GpuModel {
    /// The one constructor: uploads `src`'s weights tensor by tensor in their stored dtypes (a
    /// checkpoint's bytes go from the memory map to the device; the host never holds the model,
    /// nor an f32 copy of a tensor), the matrices stored as [`ModelOptions::format`], and
    /// allocates the arena with a KV cache of [`ModelOptions::max_context`] positions for each of
    /// [`ModelOptions::slots`] sequences (which [`dg_sampler::BatchResidentModel`] denoises
    /// together), calling [`ModelOptions::progress`] as the upload goes.
    pub fn load(
        ctx: GpuContext,
        config: &ModelConfig,
        src: &(impl TensorSource + ?Sized),
        options: ModelOptions<'_>,
    ) -> Result<Self, GpuError> {
        let ModelOptions { max_context, format, slots, progress } = options;
        let mut silent = |_: &UploadProgress| {};
        let on_progress: &mut dyn FnMut(&UploadProgress) = progress.unwrap_or(&mut silent);
        let gpu_weights = GpuWeights::upload_with_progress(&ctx, &config.text, src, format, on_progress)?;
        Self::from_weights_with_slots(ctx, config, gpu_weights, max_context, slots)
    }

    fn from_weights_with_slots(
        ctx: GpuContext,
        config: &ModelConfig,
        gpu_weights: GpuWeights,
        max_context: usize,
        slots: usize,
    ) -> Result<Self, GpuError> {
        let arena = Arena::new(&ctx, config, max_context, slots, crate::arena::cache_format(&ctx, config, gpu_weights.format))?;
        let mut pipelines = Pipelines::default();
        let sample_plan = record_sample_plan(&ctx, &mut pipelines, config, &arena)?;
        Ok(GpuModel {
            ctx,
            config: config.clone(),
            pipelines,
            weights: gpu_weights,
            plans: None,
            sample_plan,
            seq_lens: vec![0; arena.slots],
            sliding_bases: vec![0; arena.slots],
            batch_plans: batch::PlanCache::default(),
            read_plans: read::ReadPlans::default(),
            commit_plans: Default::default(),
            context_ready: false,
            rope_blocks: Vec::new(),
            uploaded_context: false,
            draw_words: vec![0; config.canvas_length],
            prefill_chunk: arena.token_rows,
            arena,
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Bytes of weights on the device.
    pub fn weight_bytes(&self) -> u64 {
        self.weights.bytes
    }

    /// Parameters on the device (matrices, norms and scales).
    pub fn weight_parameters(&self) -> u64 {
        self.weights.parameters
    }

    /// Storage format of the weight matrices.
    pub fn weight_format(&self) -> WeightFormat {
        self.weights.format
    }

    /// Tokens in the cache.
    pub fn seq_len(&self) -> usize {
        self.seq_lens[0]
    }

    /// The longest sequence the cache holds.
    pub fn max_context(&self) -> usize {
        self.arena.max_context
    }

    /// How the KV cache stores keys and values: f32, or f16 (`arena::cache_format`).
    pub fn kv_cache_format(&self) -> WeightFormat {
        self.arena.cache_format
    }

    /// Positions a sliding layer's cache holds (`max_context` or, for longer contexts, the
    /// window and a chunk: the window moves to row 0 as the sequence grows past it).
    pub fn sliding_positions(&self) -> usize {
        self.arena.sliding_positions
    }

    /// Forgets every cached token.
    pub fn reset(&mut self) {
        self.seq_lens[0] = 0;
        self.sliding_bases[0] = 0;
        self.commit_plans.retain(|chunk, _| chunk.slot != 0);
        self.context_ready = false;
        self.uploaded_context = false;
    }

    /// Encodes `ids` causally at the next positions on the GPU, appending every layer's K/V to the
    /// cache (spec §4): in chunks of at most `max(C, arena::prefill_chunk)` tokens, each submitted as its
    /// layers are recorded ([`crate::tuning::Tuning::encoder_submit_layers`]); returns when the
    /// GPU has run them all. Image placeholders become pad.
    pub fn encode(&mut self, ids: &[u32]) -> Result<(), GpuError> {
        self.encode_slot(0, ids)
    }

    /// [`Self::encode`] into `slot`'s cache (slot 0 is the single-sequence API's).
    pub fn encode_slot(&mut self, slot: usize, ids: &[u32]) -> Result<(), GpuError> {
        self.encode_chunks(slot, ids, None)
    }

    /// Encodes a prompt holding images (`DiffusionGemmaEncoderModel` as `generate` runs it;
    /// `dg_cpu::CpuModel::encode_with_images` on the CPU): the rows of the image soft tokens
    /// (`image_token_id`) take, in order, `image_embeddings` (`[n, H]`) after the lookup, and with
    /// `use_bidirectional_attention: "vision"` each run of soft tokens sees itself whole (a run is
    /// encoded in one chunk, so it may hold at most the arena's chunk of tokens).
    pub fn encode_with_images(&mut self, ids: &[u32], image_embeddings: &[f32]) -> Result<(), GpuError> {
        self.encode_slot_with_images(0, ids, image_embeddings)
    }

    /// [`Self::encode_with_images`] into `slot`'s cache.
    pub fn encode_slot_with_images(&mut self, slot: usize, ids: &[u32], image_embeddings: &[f32]) -> Result<(), GpuError> {
        self.encode_chunks(slot, ids, Some(image_embeddings))
    }

    fn encode_chunks(&mut self, slot: usize, ids: &[u32], image_embeddings: Option<&[f32]>) -> Result<(), GpuError> {
        let looked_up = self.encoder_ids(slot, ids)?;
        let h = self.config.text.hidden_size;
        let spans = match (image_embeddings, self.config.image_token_id) {
            (Some(_), Some(image)) => runs(ids, image),
            _ => Vec::new(),
        };
        let mut rows = image_embeddings.unwrap_or_default();
        let soft_tokens: usize = spans.iter().map(|s| s.len()).sum();
        if rows.len() != soft_tokens * h {
            return Err(GpuError::Length { what: "image embeddings", got: rows.len(), expected: soft_tokens * h });
        }
        let chunks = encoder_chunks(ids.len(), self.prefill_chunk, &spans)?;
        self.context_ready = false;
        for (range, span) in chunks {
            let image = span.map(|span| {
                let (now, rest) = rows.split_at(span.len() * h);
                rows = rest;
                (ImageRows { first: span.start - range.start, len: span.len() }, now)
            });
            self.submit_encoder_chunk(slot, &looked_up[range.clone()], image)?;
            self.seq_lens[slot] += range.len();
        }
        self.ctx.device.poll(wgpu::PollType::wait_indefinitely()).map_err(|e| GpuError::Readback(e.to_string()))?;
        Ok(())
    }

    /// `ids` checked for the encoder of `slot` (ids in the vocabulary, the sequence within the
    /// positions and the cache), image placeholders turned to pad.
    fn encoder_ids(&self, slot: usize, ids: &[u32]) -> Result<Vec<u32>, GpuError> {
        let cfg = &self.config.text;
        if ids.is_empty() {
            return Err(GpuError::Empty);
        }
        let Some(&seq_len) = self.seq_lens.get(slot) else {
            return Err(GpuError::Limit {
                what: format!("slot {slot}"),
                needed: slot as u64 + 1,
                limit: self.seq_lens.len() as u64,
                limit_name: "the slots the model was loaded with",
            });
        };
        if let Some((index, &id)) = ids.iter().enumerate().find(|&(_, &id)| id as usize >= cfg.vocab_size) {
            return Err(GpuError::TokenOutOfRange { what: "encoder input", id, index, vocab: cfg.vocab_size });
        }
        let len = seq_len + ids.len();
        if len > cfg.max_position_embeddings {
            return Err(GpuError::TooLong { len, max: cfg.max_position_embeddings, limit_name: "max_position_embeddings", hint: "" });
        }
        if len > self.arena.max_context {
            return Err(GpuError::TooLong {
                len,
                max: self.arena.max_context,
                limit_name: "the GPU cache's max_context",
                hint: " (load the model with a larger context)",
            });
        }
        Ok(ids
            .iter()
            .map(|&id| match (self.config.image_token_id, cfg.pad_token_id) {
                (Some(img), Some(pad)) if id == img => pad,
                _ => id,
            })
            .collect())
    }

    /// The plan of an encoder chunk: recorded ahead by [`Self::prerecord_commits`], or now.
    fn encoder_chunk_plan(&mut self, chunk: EncoderChunk) -> Result<Plan, GpuError> {
        match self.commit_plans.remove(&chunk) {
            Some(plan) => Ok(plan),
            None => self.record_encoder_chunk(chunk),
        }
    }

    /// The encoder chunk of `tokens` tokens at `slot`'s next position, with the position its
    /// sliding caches will hold at row 0: the current one, or, where the chunk and a canvas after
    /// it would run past their rows, the first position the chunk's first query sees (the window
    /// then moves to row 0 first: [`Self::move_sliding_window`]).
    fn next_chunk(&self, slot: usize, tokens: usize) -> EncoderChunk {
        let (start, base) = (self.seq_lens[slot], self.sliding_bases[slot]);
        chunk_at(self.config.text.sliding_kept(), self.arena.sliding_positions, slot, (start, base), tokens)
    }

    /// Moves the window of `slot`'s sliding caches (positions `base..start`) to row 0 where
    /// `chunk` runs from a later base than theirs (queued behind the work already submitted).
    fn move_sliding_window(&mut self, chunk: EncoderChunk) -> Result<(), GpuError> {
        let EncoderChunk { slot, start, base, .. } = chunk;
        let old = self.sliding_bases[slot];
        if base == old {
            return Ok(());
        }
        let mut encoder = self.ctx.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("sliding window") });
        for (i, spec) in self.config.text.layers.iter().enumerate() {
            if spec.kind != LayerKind::Sliding {
                continue;
            }
            let row_bytes = self.arena.cache_row_bytes(spec);
            let (from, len) = ((base - old) as u64 * row_bytes, (start - base) as u64 * row_bytes);
            if len == 0 {
                continue;
            }
            let cache = self.arena.cache(slot, i)?;
            for buffer in [&cache.keys, &cache.values] {
                encoder.copy_buffer_to_buffer(buffer, from, &self.arena.sliding_scratch, 0, len);
                encoder.copy_buffer_to_buffer(&self.arena.sliding_scratch, 0, buffer, 0, len);
            }
        }
        self.ctx.queue.submit(Some(encoder.finish()));
        self.sliding_bases[slot] = base;
        Ok(())
    }

    /// Starts the next encoder chunk of `slot`: moves its sliding window where the chunk needs
    /// it and writes its ids, its image's rows and gate where it holds one, and its RoPE tables
    /// (queued behind the work already submitted, which has read the previous chunk's).
    fn begin_encoder_chunk(&mut self, slot: usize, ids: &[u32], image: Option<(ImageRows, &[f32])>) -> Result<EncoderChunk, GpuError> {
        let chunk = EncoderChunk { image: image.map(|(rows, _)| rows), ..self.next_chunk(slot, ids.len()) };
        self.move_sliding_window(chunk)?;
        self.ctx.queue.write_buffer(&self.arena.ids, 0, bytemuck::cast_slice(ids));
        if let Some((rows, embeddings)) = image {
            let h = self.config.text.hidden_size;
            self.ctx.queue.write_buffer(&self.arena.embedded, (rows.first * h * 4) as u64, bytemuck::cast_slice(embeddings));
            let gate: Vec<u32> = (0..ids.len()).map(|i| u32::from((rows.first..rows.first + rows.len).contains(&i))).collect();
            self.ctx.queue.write_buffer(&self.arena.image_gate, 0, bytemuck::cast_slice(&gate));
        }
        self.ensure_rope(chunk.start, ids.len(), 0);
        Ok(chunk)
    }

    /// Submits one encoder chunk of `slot` without waiting (the caller advances the slot's length):
    /// its plan recorded ahead ([`Self::prerecord_commits`]), or, recorded now, a few layers at a
    /// time ([`crate::tuning::Tuning::encoder_submit_layers`], one by default), each part
    /// submitted as soon as it is recorded, so that the host records the next layers while the GPU
    /// runs the first, each as one command buffer. The parts run the whole chunk's dispatches in
    /// the same order: the same results.
    fn submit_encoder_chunk(&mut self, slot: usize, ids: &[u32], image: Option<(ImageRows, &[f32])>) -> Result<(), GpuError> {
        let part = self.begin_encoder_chunk(slot, ids, image)?;
        if let Some(plan) = self.commit_plans.remove(&part) {
            return plan.submit(&self.ctx);
        }
        let (layers, per_submit) = (self.config.text.num_layers(), self.ctx.tuning.encoder_submit_layers);
        for first in (0..layers).step_by(per_submit) {
            let mut rec = Recorder::new(&self.ctx, &mut self.pipelines);
            let range = first..(first + per_submit).min(layers);
            record_encoder_layers(&mut rec, &self.config, &self.weights, &self.arena, part, range)?;
            // Already a part of its chunk: one command buffer (splitting it again into
            // `DG_SUBMIT_PARTS` made a 1024-token prefill 2–4 ms slower on the H200).
            submit_in_parts(&self.ctx, &[&rec.finish()?], 1, "encoder layers", |_| {})?;
        }
        Ok(())
    }

    fn record_encoder_chunk(&mut self, chunk: EncoderChunk) -> Result<Plan, GpuError> {
        let mut rec = Recorder::new(&self.ctx, &mut self.pipelines);
        record_encoder_chunk(&mut rec, &self.config, &self.weights, &self.arena, chunk)?;
        rec.finish()
    }

    /// Records the plans that will commit the canvases of `slots` (each one chunk of C tokens at
    /// its slot's next position), where not recorded yet; plans of commits that can no longer
    /// come (their slot moved on) go. Called between a step's submit and its readback: the host
    /// records while the GPU computes (a 30-layer commit's plan takes milliseconds to record).
    fn prerecord_commits(&mut self, slots: impl IntoIterator<Item = usize>) -> Result<(), GpuError> {
        let c = self.config.canvas_length;
        if c > self.prefill_chunk {
            return Ok(());
        }
        let (keep, positions) = (self.config.text.sliding_kept(), self.arena.sliding_positions);
        let (lens, bases) = (&self.seq_lens, &self.sliding_bases);
        self.commit_plans
            .retain(|k, _| lens.get(k.slot).is_some_and(|&start| *k == chunk_at(keep, positions, k.slot, (start, bases[k.slot]), c)));
        for slot in slots {
            let chunk = self.next_chunk(slot, c);
            if chunk.start + c <= self.arena.max_context && !self.commit_plans.contains_key(&chunk) {
                let plan = self.record_encoder_chunk(chunk)?;
                self.commit_plans.insert(chunk, plan);
            }
        }
        Ok(())
    }

    /// Makes rows `row0..row0 + tokens` of the RoPE tables hold positions `start..`, writing them
    /// only where [`Self::rope_blocks`] does not say they do.
    fn ensure_rope(&mut self, start: usize, tokens: usize, row0: usize) {
        let c = self.config.canvas_length;
        let whole = row0.is_multiple_of(c) && tokens.is_multiple_of(c);
        let (first, end) = (row0 / c, (row0 + tokens).div_ceil(c));
        if whole && (first..end).all(|b| self.rope_blocks.get(b) == Some(&Some(start + (b - first) * c))) {
            return;
        }
        self.write_rope(start, tokens, row0);
        if self.rope_blocks.len() < end {
            self.rope_blocks.resize(end, None);
        }
        for b in first..end {
            self.rope_blocks[b] = whole.then_some(start + (b - first) * c);
        }
    }

    /// Writes the RoPE tables of positions `start..start + tokens` for both layer kinds, from
    /// table row `row0`: copied on the GPU from the arena's tables of every position (queued
    /// behind the work already submitted), or, past them, computed here and written.
    fn write_rope(&self, start: usize, tokens: usize, row0: usize) {
        let cfg = &self.config.text;
        let a = &self.arena;
        let mut copies = self.ctx.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("rope rows") });
        for (kind, rows, table) in
            [(LayerKind::Sliding, &a.rope_sliding, &a.rope_table_sliding), (LayerKind::Full, &a.rope_full, &a.rope_table_full)]
        {
            if let Some(spec) = cfg.layers.iter().find(|l| l.kind == kind) {
                let row_bytes = (spec.head_dim / 2 * 4) as u64;
                let at = row0 as u64 * row_bytes;
                if start + tokens <= a.rope_positions {
                    let (from, len) = (start as u64 * row_bytes, tokens as u64 * row_bytes);
                    copies.copy_buffer_to_buffer(&table.0, from, &rows.0, at, len);
                    copies.copy_buffer_to_buffer(&table.1, from, &rows.1, at, len);
                } else {
                    let (cos, sin) = spec.rope.cos_sin(spec.head_dim, start, tokens);
                    self.ctx.queue.write_buffer(&rows.0, at, bytemuck::cast_slice(&cos));
                    self.ctx.queue.write_buffer(&rows.1, at, bytemuck::cast_slice(&sin));
                }
            }
        }
        self.ctx.queue.submit(Some(copies.finish()));
    }

    /// Cache rows each decoder layer sees after the GPU encoder: every token in full layers, the
    /// last W−1 in sliding layers (spec §5.2), whose rows start at the slot's sliding base.
    fn encoded_visible(&self) -> Vec<Visible> {
        self.slot_visible(0)
    }

    /// [`Self::encoded_visible`] of `slot`'s cache.
    fn slot_visible(&self, slot: usize) -> Vec<Visible> {
        warm::visible_rows(&self.config.text, self.seq_lens[slot], self.sliding_bases[slot])
    }

    /// Makes the canvas forward read the cache the encoder wrote: canvas RoPE tables, and the
    /// plans (rebuilt only when the visible rows change, i.e. once per block).
    fn prepare_canvas(&mut self) -> Result<(), GpuError> {
        if self.context_ready {
            // A batched step or a commit may have written canvas 0's tables since.
            self.ensure_rope(self.seq_lens[0], self.config.canvas_length, 0);
        } else {
            if self.seq_lens[0] == 0 {
                return Err(GpuError::NoContext);
            }
            let visible = self.encoded_visible();
            self.prepare_block(visible)?;
        }
        Ok(())
    }

    fn prepare_block(&mut self, visible: Vec<Visible>) -> Result<(), GpuError> {
        self.ensure_rope(self.seq_lens[0], self.config.canvas_length, 0);
        if self.plans.as_ref().is_none_or(|p| p.visible != visible) {
            let plain = self.record(&visible, false)?;
            let self_conditioned = self.record(&visible, true)?;
            self.plans = Some(BlockPlans { visible, plain, self_conditioned });
        }
        self.context_ready = true;
        Ok(())
    }

    /// `len` cached values from element `offset` of a cache buffer, as f32 (f16 ones widened
    /// exactly; an f16 cache's offsets and lengths are whole rows, so even).
    fn read_cache(&self, buffer: &wgpu::Buffer, offset: usize, len: usize) -> Result<Vec<f32>, GpuError> {
        match self.arena.cache_format {
            WeightFormat::F16 => Ok(self
                .ctx
                .read_u32(buffer, offset / 2, len / 2)?
                .into_iter()
                .flat_map(|w| [w & 0xffff, w >> 16].map(|h| half::f16::from_bits(h as u16).to_f32()))
                .collect()),
            _ => self.ctx.read_f32(buffer, offset, len),
        }
    }

    fn record(&mut self, visible: &[Visible], self_conditioning: bool) -> Result<Plan, GpuError> {
        let shape = ForwardShape::single(visible.to_vec(), self_conditioning, self.config.canvas_length);
        let mut rec = Recorder::new(&self.ctx, &mut self.pipelines);
        record_canvas_forward(&mut rec, &self.config, &self.weights, &self.arena, &shape)?;
        rec.finish()
    }

    /// The block's plans, prepared for the current cache (call after [`Self::prepare_canvas`]).
    fn block_plans(&self) -> Result<&BlockPlans, GpuError> {
        self.plans.as_ref().ok_or(GpuError::NoContext)
    }

    fn check_canvas(&self, canvas: &[u32]) -> Result<(), GpuError> {
        let (c, v) = (self.config.canvas_length, self.config.text.vocab_size);
        if canvas.len() != c {
            return Err(GpuError::Length { what: "canvas ids", got: canvas.len(), expected: c });
        }
        if let Some((index, &id)) = canvas.iter().enumerate().find(|&(_, &id)| id as usize >= v) {
            return Err(GpuError::TokenOutOfRange { what: "canvas", id, index, vocab: v });
        }
        Ok(())
    }

    /// One canvas forward: writes the ids (and self-conditioning logits), replays the plan, reads
    /// the logits `[C, V]` back.
    pub fn canvas_forward(&mut self, canvas: &[u32], self_conditioning: Option<&[f32]>, logits: &mut [f32]) -> Result<(), GpuError> {
        let n = self.config.canvas_length * self.config.text.vocab_size;
        if logits.len() != n {
            return Err(GpuError::Length { what: "logits buffer", got: logits.len(), expected: n });
        }
        if let Some(sc) = self_conditioning {
            if sc.len() != n {
                return Err(GpuError::Length { what: "self-conditioning logits", got: sc.len(), expected: n });
            }
            self.ctx.queue.write_buffer(&self.arena.sc_probs[0], 0, bytemuck::cast_slice(sc));
        }
        self.step(canvas, self_conditioning.is_some(), Some(logits))
    }

    /// One canvas forward whose self-conditioning input is whatever `sc_probs` holds on the
    /// device; reads the logits back only when `logits` is given.
    fn step(&mut self, canvas: &[u32], self_conditioning: bool, logits: Option<&mut [f32]>) -> Result<(), GpuError> {
        self.check_canvas(canvas)?;
        self.ctx.queue.write_buffer(&self.arena.ids, 0, bytemuck::cast_slice(canvas));
        let bytes = (canvas.len() * self.config.text.vocab_size * 4) as u64;
        self.prepare_canvas()?;
        let plans = self.block_plans()?;
        let plan = if self_conditioning { &plans.self_conditioned } else { &plans.plain };
        submit_in_parts(&self.ctx, &[plan], self.ctx.tuning.submit_parts, "canvas forward", |enc| {
            if logits.is_some() {
                enc.copy_buffer_to_buffer(&self.arena.logits[0], 0, &self.arena.staging, 0, bytes);
            }
        })?;
        match logits {
            Some(out) => {
                map_read_with(&self.ctx, &self.arena.staging, bytes, |data| {
                    bytemuck::cast_slice_mut::<f32, u8>(out).copy_from_slice(data)
                })?;
            }
            None => {
                self.ctx.device.poll(wgpu::PollType::wait_indefinitely()).map_err(|e| GpuError::Readback(e.to_string()))?;
            }
        }
        Ok(())
    }

    /// One resident denoising step: canvas forward (self-conditioned on the scaled logits the
    /// previous call left in `sc_probs`), then `sample_rows` (scaled logits → `sc_probs`, per-row
    /// entropy, argmax and sample) in the same pass; reads back `RESULT_WORDS` u32 per row.
    pub fn denoise_rows(
        &mut self,
        canvas: &[u32],
        self_conditioning: bool,
        temperature: f32,
        draw: CategoricalRequest<'_>,
        rows: &mut [RowResult],
    ) -> Result<(), GpuError> {
        self.check_canvas(canvas)?;
        let c = self.config.canvas_length;
        if rows.len() != c {
            return Err(GpuError::Length { what: "row results", got: rows.len(), expected: c });
        }
        let mode = batch::draw_words(draw, &mut self.draw_words, c)?;
        self.ctx.queue.write_buffer(&self.arena.ids, 0, bytemuck::cast_slice(canvas));
        self.ctx.queue.write_buffer(&self.arena.draws, 0, bytemuck::cast_slice(&self.draw_words));
        self.ctx.queue.write_buffer(&self.arena.sample_step, 0, bytemuck::bytes_of(&SampleStep::new(temperature, mode)));
        let bytes = (c * RESULT_WORDS * 4) as u64;
        self.prepare_canvas()?;
        let plans = self.block_plans()?;
        let plan = if self_conditioning { &plans.self_conditioned } else { &plans.plain };
        submit_in_parts(&self.ctx, &[plan, &self.sample_plan], self.ctx.tuning.submit_parts, "denoising step", |enc| {
            enc.copy_buffer_to_buffer(&self.arena.row_results, 0, &self.arena.row_staging, 0, bytes)
        })?;
        self.prerecord_commits([0])?;
        let mut non_finite = None;
        map_read_with(&self.ctx, &self.arena.row_staging, bytes, |data| non_finite = decode_rows(bytemuck::cast_slice(data), rows))?;
        if let Some((row, column)) = non_finite {
            // An error path: one more read for the offending value.
            let v = self.config.text.vocab_size;
            let value = self.ctx.read_f32(&self.arena.sc_probs[0], row * v + column, 1)?[0];
            rows[row].non_finite = Some((column, value));
        }
        Ok(())
    }
}

/// One canvas's rows of `sample_rows`' results (`RESULT_WORDS` u32 each) into `rows`; returns the
/// first row with a non-finite logit and its column (the caller reads the value).
fn decode_rows(words: &[u32], rows: &mut [RowResult]) -> Option<(usize, usize)> {
    let mut non_finite = None;
    for (row, (r, w)) in rows.iter_mut().zip(words.chunks_exact(RESULT_WORDS)).enumerate() {
        *r = RowResult {
            entropy: f32::from_bits(w[sample_rows::RESULT_ENTROPY]),
            argmax: w[sample_rows::RESULT_ARGMAX],
            sampled: w[sample_rows::RESULT_SAMPLED],
            non_finite: None,
        };
        let bad = w[sample_rows::RESULT_NON_FINITE];
        if bad != 0 && non_finite.is_none() {
            non_finite = Some((row, bad as usize - 1));
        }
    }
    non_finite
}

/// The single-sequence step's sampler rows (`sample_rows` over canvas 0).
fn record_sample_plan(ctx: &GpuContext, pipelines: &mut Pipelines, config: &ModelConfig, a: &Arena) -> Result<Plan, GpuError> {
    let mut rec = Recorder::new(ctx, pipelines);
    rec.scope("sampler rows");
    rec.sample_rows(
        &a.logits[0],
        &a.sc_probs[0],
        &a.sample_step,
        &a.draws,
        &a.row_results,
        (config.canvas_length, 0, 0),
        config.text.vocab_size,
    )?;
    rec.finish()
}

impl dg_sampler::DenoiseModel for GpuModel {
    type Error = GpuError;

    fn encode(&mut self, ids: &[u32]) -> Result<(), GpuError> {
        GpuModel::encode(self, ids)
    }

    fn canvas_forward(&mut self, canvas: &[u32], sc: Option<&[f32]>, logits: &mut [f32]) -> Result<(), GpuError> {
        GpuModel::canvas_forward(self, canvas, sc, logits)
    }
}

/// The GPU encoder places image rows ([`dg_sampler::ImagePrompt`] runs a prompt holding images).
impl dg_sampler::EncodeWithImages for GpuModel {
    type Error = GpuError;

    fn encode_with_images(&mut self, ids: &[u32], image_embeddings: &[f32]) -> Result<(), GpuError> {
        GpuModel::encode_with_images(self, ids, image_embeddings)
    }
}

impl dg_sampler::ResidentModel for GpuModel {
    type Error = GpuError;

    fn encode(&mut self, ids: &[u32]) -> Result<(), GpuError> {
        GpuModel::encode(self, ids)
    }

    fn denoise_rows(
        &mut self,
        canvas: &[u32],
        sc: bool,
        temperature: f32,
        draw: CategoricalRequest<'_>,
        rows: &mut [RowResult],
    ) -> Result<(), GpuError> {
        GpuModel::denoise_rows(self, canvas, sc, temperature, draw, rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoder_chunks_keep_each_image_whole_and_alone() {
        // Spans as (start, end) pairs.
        let spans = |pairs: &[(usize, usize)]| pairs.iter().map(|&(a, b)| a..b).collect::<Vec<_>>();
        let chunks = |len, most, pairs: &[(usize, usize)]| encoder_chunks(len, most, &spans(pairs)).unwrap();
        // No images: chunks of `most`.
        assert_eq!(chunks(10, 4, &[]), vec![(0..4, None), (4..8, None), (8..10, None)]);
        // A span across a boundary starts the next chunk; one within a chunk stays in it.
        assert_eq!(chunks(12, 6, &[(4, 8)]), vec![(0..4, None), (4..10, Some(4..8)), (10..12, None)]);
        assert_eq!(chunks(12, 6, &[(1, 3)]), vec![(0..6, Some(1..3)), (6..12, None)]);
        // Two spans that would share a chunk get one each; a span as long as a chunk fills it.
        assert_eq!(chunks(12, 8, &[(1, 3), (5, 7)]), vec![(0..5, Some(1..3)), (5..12, Some(5..7))]);
        assert_eq!(chunks(9, 4, &[(2, 6)]), vec![(0..2, None), (2..6, Some(2..6)), (6..9, None)]);
        // Adjacent runs of soft tokens are one run.
        assert_eq!(runs(&[1, 7, 7, 2, 7, 7, 7], 7), vec![1..3, 4..7]);
        // A span longer than a chunk is refused with its size.
        let err = encoder_chunks(20, 4, &spans(&[(2, 8)])).unwrap_err().to_string();
        assert!(err.contains("6 soft tokens") && err.contains("4"), "{err}");
    }
}

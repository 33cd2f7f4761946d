//! One sequence of a batch as a state machine: the per-row state of
//! `DiffusionGemmaGenerationMixin.generate`'s block loop (its sequence, block and step counters,
//! random source, hooks and stop reason), advanced one denoising step at a time by the driver
//! ([`crate::Batch`]).
//!
//! Per block: at the block boundary the committed ids are encoded (the prompt for the first block,
//! else the previous block's finalized canvas) and the initial canvas is drawn; then one step per
//! driver step until the adaptive criteria fire or the N steps are done; the block's ARGMAX canvas
//! is appended and EOS-finalized (`_finalize_canvas`). The sequence ends on EOS, on `max_length`,
//! after `GenerationConfig::new_canvases` blocks, or when its hooks ask; the last canvas is never
//! encoded.

use dg_model::GenerationConfig;

use crate::batched::Lane;
use crate::error::{ModelCall, SamplerError};
use crate::finalize::{self, CanvasEnd};
use crate::generate::{Generation, Hooks, StopReason};
use crate::rng::RandomSource;
use crate::sampler::StepOutcome;

/// Names a sequence of a [`crate::Batch`] (unique within the batch, in admission order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(pub u64);

/// A sequence that left the batch: its generation (or what failed), with its random source and
/// hooks handed back.
#[derive(Debug)]
pub struct Finished<R, H, E: std::error::Error + 'static> {
    pub id: SeqId,
    pub result: Result<Generation, SamplerError<E>>,
    pub rng: R,
    pub hooks: H,
}

/// The driver's state of one sequence.
pub(crate) struct SequenceState<R, H, E: std::error::Error + 'static> {
    pub(crate) id: SeqId,
    pub(crate) rng: R,
    hooks: H,
    pub(crate) cfg: GenerationConfig,
    sequence: Vec<u32>,
    prompt_len: usize,
    /// Blocks planned (`new_canvases`).
    blocks: usize,
    /// The current block.
    pub(crate) block: usize,
    /// Steps taken in the current block.
    steps: usize,
    steps_per_canvas: Vec<usize>,
    decoder_passes: usize,
    /// The next step starts a block: encode the committed ids, draw the initial canvas.
    at_boundary: bool,
    /// Set when the sequence is done: why, or what failed.
    outcome: Option<Result<StopReason, SamplerError<E>>>,
}

impl<R: RandomSource, H: Hooks, E: std::error::Error + 'static> SequenceState<R, H, E> {
    /// A sequence of `prompt` (already checked) generating `blocks` canvases of `canvas_length`.
    pub(crate) fn new(id: SeqId, prompt: &[u32], cfg: &GenerationConfig, canvas_length: usize, rng: R, hooks: H) -> Self {
        let blocks = cfg.new_canvases(prompt.len(), canvas_length);
        let mut sequence = Vec::with_capacity(prompt.len() + blocks * canvas_length);
        sequence.extend_from_slice(prompt);
        SequenceState {
            id,
            rng,
            hooks,
            cfg: cfg.clone(),
            sequence,
            prompt_len: prompt.len(),
            blocks,
            block: 0,
            steps: 0,
            steps_per_canvas: Vec::with_capacity(blocks),
            decoder_passes: 0,
            at_boundary: true,
            outcome: (blocks == 0).then_some(Ok(StopReason::AllCanvases)),
        }
    }

    pub(crate) fn is_done(&self) -> bool {
        self.outcome.is_some()
    }

    /// Ends the sequence with `outcome`.
    pub(crate) fn end(&mut self, outcome: Result<StopReason, SamplerError<E>>) {
        self.outcome = Some(outcome);
    }

    /// At a block boundary: encodes the committed ids into the slot's cache (through `encode`) and
    /// draws the block's initial canvas.
    pub(crate) fn begin_block(
        &mut self,
        lane: &mut Lane,
        encode: impl FnOnce(usize, &[u32]) -> Result<(), E>,
    ) -> Result<(), SamplerError<E>> {
        if !self.at_boundary {
            return Ok(());
        }
        let c = lane.sampler.canvas_length();
        let committed = if self.block == 0 { &self.sequence[..self.prompt_len] } else { &self.sequence[self.sequence.len() - c..] };
        let started = std::time::Instant::now();
        encode(lane.slot, committed).map_err(|source| SamplerError::Model { block: self.block, call: ModelCall::Encode, source })?;
        self.hooks.on_encode(self.block, committed.len(), started.elapsed());
        lane.sampler.begin_block(&mut self.rng).map_err(SamplerError::with_model_error)?;
        self.at_boundary = false;
        self.steps = 0;
        Ok(())
    }

    /// Counts the step about to run; returns n (the steps left in the block, this one included)
    /// and its 0-based index.
    pub(crate) fn start_step(&mut self) -> (usize, usize) {
        let step = self.steps;
        self.steps += 1;
        self.decoder_passes += 1;
        (self.cfg.max_denoising_steps - step, step)
    }

    /// After the sampler's step: the hooks, then, when the block ends, its canvas appended,
    /// finalized and judged (`remaining` as [`Self::start_step`] returned it).
    pub(crate) fn after_step(&mut self, lane: &Lane, outcome: &StepOutcome, remaining: usize) {
        let (block, step) = (self.block, self.steps - 1);
        self.hooks.on_step(&lane.sampler.step_info(block, step, remaining, outcome));
        if self.hooks.should_stop() {
            self.steps_per_canvas.push(self.steps);
            return self.end(Ok(StopReason::Cancelled));
        }
        if !(outcome.finished || remaining == 1) {
            return;
        }
        self.steps_per_canvas.push(self.steps);
        let c = lane.sampler.canvas_length();
        self.sequence.extend_from_slice(lane.sampler.draft());
        let len = self.sequence.len();
        let end = finalize::finalize_canvas(&mut self.sequence[len - c..], len, &self.cfg);
        self.hooks.on_canvas(block, &self.sequence[len - c..]);
        if self.hooks.should_stop() && block + 1 < self.blocks && end == CanvasEnd::Continue {
            return self.end(Ok(StopReason::Cancelled));
        }
        match end {
            CanvasEnd::Continue if block + 1 < self.blocks => {
                self.block += 1;
                self.at_boundary = true;
            }
            CanvasEnd::Continue => self.end(Ok(StopReason::AllCanvases)),
            CanvasEnd::Eos { .. } => self.end(Ok(StopReason::Eos)),
            CanvasEnd::MaxLength => self.end(Ok(StopReason::MaxLength)),
        }
    }

    /// The sequence taken out of a batch without an end: its id, random source and hooks.
    pub(crate) fn into_parts(self) -> (SeqId, R, H) {
        (self.id, self.rng, self.hooks)
    }

    /// The finished sequence: its random source is told the generation completed (a recording
    /// reports unconsumed draws; not after a cancellation, which leaves draws unused on purpose).
    pub(crate) fn into_finished(mut self) -> Finished<R, H, E> {
        let outcome = self.outcome.take().unwrap_or(Ok(StopReason::Cancelled));
        let result = outcome.and_then(|stop_reason| {
            if stop_reason != StopReason::Cancelled {
                self.rng.finish()?;
            }
            let new_tokens = &self.sequence[self.prompt_len..];
            let pad = self.cfg.pad_token_id;
            Ok(Generation {
                prompt_len: self.prompt_len,
                valid_tokens: finalize::valid_tokens(new_tokens, pad),
                tokens_per_forward: finalize::tokens_per_forward(new_tokens, pad, self.decoder_passes),
                steps_per_canvas: std::mem::take(&mut self.steps_per_canvas),
                decoder_passes: self.decoder_passes,
                stop_reason,
                sequence: std::mem::take(&mut self.sequence),
            })
        });
        Finished { id: self.id, result, rng: self.rng, hooks: self.hooks }
    }
}

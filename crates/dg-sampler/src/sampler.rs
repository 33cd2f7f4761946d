//! The sampler's state and one denoising step after the forward: the sampling half of
//! `DiffusionGemmaGenerationMixin._denoising_step`.
//!
//! [`Sampler`] owns every per-step buffer, allocated once for a canvas length C and vocabulary V: the
//! raw logits the model writes, the temperature-scaled logits of the previous step (the next forward's
//! self-conditioning input), and the per-row results (the probabilities are evaluated on demand from
//! the scaled logits, see [`RowDistributions`]). A step allocates nothing
//! itself (rayon, when entered from outside its pool, allocates a small job block every 63 parallel
//! sections; inside a pool nothing at all).
//!
//! One step, in the reference's order: `T = temperature_at(n)`, `proc = raw / T` (in place), softmax,
//! a categorical draw per row, argmax, entropies, entropy-bound acceptance, a uniform draw for the
//! renoise candidates (every step, the last one included), renoising, then the stopping criteria. The
//! scaled logits then swap places with the self-conditioning buffer.

use std::convert::Infallible;

use dg_model::GenerationConfig;

use crate::accept::{entropy_bound_accept, renoise};
use crate::error::{InputError, SamplerError};
use crate::rng::RandomSource;
use crate::rows::{RowDistributions, RowStat, process_rows};
use crate::stopping::{self, StabilityTracker, StopDecision};

/// What one step decided.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepOutcome {
    /// Temperature the raw logits were divided by.
    pub temperature: f32,
    pub num_accepted: usize,
    /// Mean per-position entropy (nats) of the scaled logits.
    pub mean_entropy: f32,
    /// `None` when adaptive stopping is off.
    pub stop: Option<StopDecision>,
    /// The block ends after this step.
    pub finished: bool,
}

/// Per-step buffers and block state for canvas length C and vocabulary size V.
pub struct Sampler {
    canvas_length: usize,
    vocab_size: usize,
    /// Raw logits of the current forward; scaled in place by the step.
    logits: Vec<f32>,
    /// Scaled logits of the previous step of this block (self-conditioning input).
    self_conditioning: Vec<f32>,
    has_self_conditioning: bool,
    stats: Vec<RowStat>,
    entropy: Vec<f32>,
    argmax: Vec<u32>,
    sampled: Vec<u32>,
    noise: Vec<u32>,
    canvas: Vec<u32>,
    accepted: Vec<bool>,
    order: Vec<u32>,
    stability: StabilityTracker,
}

impl std::fmt::Debug for Sampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sampler")
            .field("canvas_length", &self.canvas_length)
            .field("vocab_size", &self.vocab_size)
            .field("has_self_conditioning", &self.has_self_conditioning)
            .finish_non_exhaustive()
    }
}

/// Checks that every id is below `vocab_size`.
pub(crate) fn check_ids(
    what: &'static str,
    ids: &[u32],
    vocab_size: usize,
) -> Result<(), InputError> {
    match ids.iter().position(|&id| id as usize >= vocab_size) {
        None => Ok(()),
        Some(position) => Err(InputError::TokenOutOfRange {
            what,
            position,
            id: ids[position],
            vocab_size,
        }),
    }
}

impl Sampler {
    /// Allocates the buffers: two of C·V f32 (logits, self-conditioning) plus O(C).
    pub fn new(canvas_length: usize, vocab_size: usize) -> Result<Self, InputError> {
        if canvas_length == 0 || vocab_size == 0 {
            return Err(InputError::Shape(format!(
                "canvas_length ({canvas_length}) and vocab_size ({vocab_size}) must be positive"
            )));
        }
        if u32::try_from(vocab_size).is_err() {
            return Err(InputError::Shape(format!(
                "vocab_size {vocab_size} does not fit token ids in u32"
            )));
        }
        let n = canvas_length.checked_mul(vocab_size).ok_or_else(|| {
            InputError::Shape(format!("{canvas_length} × {vocab_size} logits overflow"))
        })?;
        Ok(Sampler {
            canvas_length,
            vocab_size,
            logits: vec![0.0; n],
            self_conditioning: vec![0.0; n],
            has_self_conditioning: false,
            stats: vec![RowStat::default(); canvas_length],
            entropy: vec![0.0; canvas_length],
            argmax: vec![0; canvas_length],
            sampled: vec![0; canvas_length],
            noise: vec![0; canvas_length],
            canvas: vec![0; canvas_length],
            accepted: vec![false; canvas_length],
            order: vec![0; canvas_length],
            stability: StabilityTracker::new(canvas_length),
        })
    }

    pub fn canvas_length(&self) -> usize {
        self.canvas_length
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Starts a block: draws the initial canvas (`EntropyBoundSampler.initialize_canvas`), drops the
    /// self-conditioning logits and resets the stopping history.
    pub fn begin_block<R: RandomSource + ?Sized>(
        &mut self,
        rng: &mut R,
    ) -> Result<(), SamplerError> {
        rng.uniform_tokens(self.vocab_size, &mut self.canvas)?;
        check_ids("uniform draw", &self.canvas, self.vocab_size)?;
        self.has_self_conditioning = false;
        self.stability.reset();
        Ok(())
    }

    /// Replaces the current canvas (a user-supplied `decoder_input_ids`, or teacher forcing).
    pub fn set_canvas(&mut self, ids: &[u32]) -> Result<(), InputError> {
        if ids.len() != self.canvas_length {
            return Err(InputError::Shape(format!(
                "canvas has {} ids, expected canvas_length {}",
                ids.len(),
                self.canvas_length
            )));
        }
        check_ids("canvas", ids, self.vocab_size)?;
        self.canvas.copy_from_slice(ids);
        Ok(())
    }

    /// The inputs and output of the next canvas forward: the canvas, the self-conditioning logits
    /// (`None` on a block's first step) and the buffer the raw logits go to.
    pub fn forward_buffers(&mut self) -> (&[u32], Option<&[f32]>, &mut [f32]) {
        let sc = self
            .has_self_conditioning
            .then_some(&self.self_conditioning[..]);
        (&self.canvas, sc, &mut self.logits)
    }

    /// The buffer the next step reads its raw logits from (C·V, row-major).
    pub fn logits_mut(&mut self) -> &mut [f32] {
        &mut self.logits
    }

    /// Copies raw logits computed elsewhere into the logits buffer.
    pub fn load_logits(&mut self, logits: &[f32]) -> Result<(), InputError> {
        if logits.len() != self.logits.len() {
            return Err(InputError::LogitsLength {
                got: logits.len(),
                expected: self.logits.len(),
                rows: self.canvas_length,
                vocab_size: self.vocab_size,
            });
        }
        self.logits.copy_from_slice(logits);
        Ok(())
    }

    /// The canvas the next forward decodes.
    pub fn canvas(&self) -> &[u32] {
        &self.canvas
    }

    /// Argmax of the last step's scaled logits (the draft; the block's output when the block ends).
    pub fn draft(&self) -> &[u32] {
        &self.argmax
    }

    /// Acceptance mask of the last step.
    pub fn accepted(&self) -> &[bool] {
        &self.accepted
    }

    /// Per-position entropies of the last step.
    pub fn entropies(&self) -> &[f32] {
        &self.entropy
    }

    /// Categorical samples of the last step.
    pub fn sampled(&self) -> &[u32] {
        &self.sampled
    }

    /// The per-row softmax distributions of the last step (after it, the scaled logits live in the
    /// self-conditioning buffer).
    pub fn distributions(&self) -> Option<RowDistributions<'_>> {
        self.has_self_conditioning
            .then(|| RowDistributions::new(&self.self_conditioning, &self.stats, self.vocab_size))
    }

    /// Scaled logits of the last step: the next forward's self-conditioning input.
    pub fn self_conditioning(&self) -> Option<&[f32]> {
        self.has_self_conditioning
            .then_some(&self.self_conditioning[..])
    }

    /// One step on the raw logits already in the buffer, with `remaining` (n, from N down to 1) steps
    /// left in the block. `block` only labels errors. Does not allocate (the random source aside).
    pub fn step<R: RandomSource + ?Sized>(
        &mut self,
        cfg: &GenerationConfig,
        remaining: usize,
        rng: &mut R,
        block: usize,
    ) -> Result<StepOutcome, SamplerError> {
        let v = self.vocab_size;
        let temperature = cfg.temperature_at(remaining);
        process_rows(&mut self.logits, v, temperature, &mut self.stats).map_err(|nf| {
            InputError::NonFiniteLogit {
                block,
                step: cfg.max_denoising_steps.saturating_sub(remaining),
                row: nf.row,
                column: nf.column,
                value: nf.value,
                temperature,
            }
        })?;
        for ((h, a), stat) in self
            .entropy
            .iter_mut()
            .zip(&mut self.argmax)
            .zip(&self.stats)
        {
            (*h, *a) = (stat.entropy, stat.argmax);
        }
        let dists = RowDistributions::new(&self.logits, &self.stats, v);
        rng.categorical(&dists, &mut self.sampled)?;
        check_ids("categorical draw", &self.sampled, v)?;
        let num_accepted = entropy_bound_accept(
            &self.entropy,
            cfg.entropy_bound,
            &mut self.order,
            &mut self.accepted,
        );
        rng.uniform_tokens(v, &mut self.noise)?;
        check_ids("uniform draw", &self.noise, v)?;
        renoise(&mut self.canvas, &self.accepted, &self.sampled, &self.noise);
        let mean_entropy = stopping::mean_entropy(&self.entropy);
        let stop = cfg
            .stopping
            .as_ref()
            .map(|s| stopping::evaluate(&mut self.stability, s, &self.argmax, mean_entropy));
        std::mem::swap(&mut self.logits, &mut self.self_conditioning);
        self.has_self_conditioning = true;
        Ok(StepOutcome {
            temperature,
            num_accepted,
            mean_entropy,
            stop,
            finished: stop.is_some_and(StopDecision::finished),
        })
    }
}

impl SamplerError<Infallible> {
    /// The same error, typed for a model whose errors are `E` (a model-free error never holds one).
    pub fn with_model_error<E: std::error::Error + 'static>(self) -> SamplerError<E> {
        match self {
            SamplerError::Input(e) => SamplerError::Input(e),
            SamplerError::Draw(e) => SamplerError::Draw(e),
            SamplerError::Model { source, .. } => match source {},
        }
    }
}

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
//!
//! [`Sampler::step_resident`] is the same step for a model that keeps the logits where it computes
//! them (a GPU): the temperature, softmax, entropy, argmax and categorical sample run in the model,
//! and only the per-row results come back.

use std::convert::Infallible;

use dg_model::GenerationConfig;

use crate::accept::{entropy_bound_accept, renoise};
use crate::error::{InputError, ModelCall, SamplerError};
use crate::resident::{ResidentModel, RowResult};
use crate::rng::{CategoricalRequest, RandomSource};
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

/// Where the self-conditioning input of the next forward lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ScLocation {
    /// A block's first step: none.
    None,
    /// In the sampler's self-conditioning buffer (host-logits steps).
    Host,
    /// In the model (resident steps).
    Model,
}

/// Per-step buffers and block state for canvas length C and vocabulary size V.
pub struct Sampler {
    canvas_length: usize,
    vocab_size: usize,
    /// C·V: the length of the two host logits buffers.
    host_len: usize,
    /// Raw logits of the current forward; scaled in place by the step. Allocated on first use.
    logits: Vec<f32>,
    /// Scaled logits of the previous step of this block (self-conditioning input).
    self_conditioning: Vec<f32>,
    /// Where the previous step's scaled logits (the next self-conditioning input) are.
    self_conditioning_at: ScLocation,
    /// Per-row results of a resident model's step.
    rows: Vec<RowResult>,
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
            .field("self_conditioning_at", &self.self_conditioning_at)
            .finish_non_exhaustive()
    }
}

/// Checks that every id is below `vocab_size`.
pub(crate) fn check_ids(what: &'static str, ids: &[u32], vocab_size: usize) -> Result<(), InputError> {
    match ids.iter().position(|&id| id as usize >= vocab_size) {
        None => Ok(()),
        Some(position) => Err(InputError::TokenOutOfRange { what, position, id: ids[position], vocab_size }),
    }
}

impl Sampler {
    /// Allocates the O(C) buffers. The two C·V f32 buffers of the host-logits path (logits,
    /// self-conditioning) are allocated on first use, so a sampler driving a [`ResidentModel`]
    /// never holds them.
    pub fn new(canvas_length: usize, vocab_size: usize) -> Result<Self, InputError> {
        if canvas_length == 0 || vocab_size == 0 {
            return Err(InputError::Shape(format!("canvas_length ({canvas_length}) and vocab_size ({vocab_size}) must be positive")));
        }
        if u32::try_from(vocab_size).is_err() {
            return Err(InputError::Shape(format!("vocab_size {vocab_size} does not fit token ids in u32")));
        }
        let n = canvas_length
            .checked_mul(vocab_size)
            .ok_or_else(|| InputError::Shape(format!("{canvas_length} × {vocab_size} logits overflow")))?;
        Ok(Sampler {
            canvas_length,
            vocab_size,
            host_len: n,
            logits: Vec::new(),
            self_conditioning: Vec::new(),
            rows: vec![RowResult::default(); canvas_length],
            self_conditioning_at: ScLocation::None,
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

    fn ensure_host_buffers(&mut self) {
        if self.logits.len() != self.host_len {
            self.logits = vec![0.0; self.host_len];
            self.self_conditioning = vec![0.0; self.host_len];
        }
    }

    pub fn canvas_length(&self) -> usize {
        self.canvas_length
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Starts a block: draws the initial canvas (`EntropyBoundSampler.initialize_canvas`), drops the
    /// self-conditioning logits and resets the stopping history.
    pub fn begin_block<R: RandomSource + ?Sized>(&mut self, rng: &mut R) -> Result<(), SamplerError> {
        rng.uniform_tokens(self.vocab_size, &mut self.canvas)?;
        check_ids("uniform draw", &self.canvas, self.vocab_size)?;
        self.self_conditioning_at = ScLocation::None;
        self.stability.reset();
        Ok(())
    }

    /// Replaces the current canvas (a user-supplied `decoder_input_ids`, or teacher forcing).
    pub fn set_canvas(&mut self, ids: &[u32]) -> Result<(), InputError> {
        if ids.len() != self.canvas_length {
            return Err(InputError::Shape(format!("canvas has {} ids, expected canvas_length {}", ids.len(), self.canvas_length)));
        }
        check_ids("canvas", ids, self.vocab_size)?;
        self.canvas.copy_from_slice(ids);
        Ok(())
    }

    /// The inputs and output of the next canvas forward: the canvas, the self-conditioning logits
    /// (`None` on a block's first step) and the buffer the raw logits go to.
    pub fn forward_buffers(&mut self) -> (&[u32], Option<&[f32]>, &mut [f32]) {
        self.ensure_host_buffers();
        assert_ne!(self.self_conditioning_at, ScLocation::Model, "host and resident steps mixed in one block");
        let sc = (self.self_conditioning_at == ScLocation::Host).then_some(&self.self_conditioning[..]);
        (&self.canvas, sc, &mut self.logits)
    }

    /// The buffer the next step reads its raw logits from (C·V, row-major).
    pub fn logits_mut(&mut self) -> &mut [f32] {
        self.ensure_host_buffers();
        &mut self.logits
    }

    /// Copies raw logits computed elsewhere into the logits buffer.
    pub fn load_logits(&mut self, logits: &[f32]) -> Result<(), InputError> {
        self.ensure_host_buffers();
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
        (self.self_conditioning_at == ScLocation::Host)
            .then(|| RowDistributions::new(&self.self_conditioning, &self.stats, self.vocab_size))
    }

    /// Scaled logits of the last step: the next forward's self-conditioning input (`None` after a
    /// resident step: they stay in the model).
    pub fn self_conditioning(&self) -> Option<&[f32]> {
        (self.self_conditioning_at == ScLocation::Host).then_some(&self.self_conditioning[..])
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
        self.ensure_host_buffers();
        let v = self.vocab_size;
        let temperature = cfg.temperature_at(remaining);
        process_rows(&mut self.logits, v, temperature, &mut self.stats).map_err(|nf| InputError::NonFiniteLogit {
            block,
            step: cfg.max_denoising_steps.saturating_sub(remaining),
            row: nf.row,
            column: nf.column,
            value: nf.value,
            temperature,
        })?;
        for ((h, a), stat) in self.entropy.iter_mut().zip(&mut self.argmax).zip(&self.stats) {
            (*h, *a) = (stat.entropy, stat.argmax);
        }
        let dists = RowDistributions::new(&self.logits, &self.stats, v);
        rng.categorical(&dists, &mut self.sampled)?;
        check_ids("categorical draw", &self.sampled, v)?;
        let outcome = self.finish_step(cfg, temperature, rng)?;
        std::mem::swap(&mut self.logits, &mut self.self_conditioning);
        self.self_conditioning_at = ScLocation::Host;
        Ok(outcome)
    }

    /// One step whose canvas forward and per-row work run in `model`, where the logits stay (see
    /// [`ResidentModel`]): the categorical draw's inputs go to the model, the per-row entropy,
    /// argmax and sample come back, and acceptance, renoising and stopping run here as in
    /// [`Self::step`]. `step` (0-based) and `block` label errors.
    pub fn step_resident<M: ResidentModel + ?Sized, R: RandomSource + ?Sized>(
        &mut self,
        model: &mut M,
        cfg: &GenerationConfig,
        remaining: usize,
        rng: &mut R,
        block: usize,
        step: usize,
    ) -> Result<StepOutcome, SamplerError<M::Error>> {
        assert_ne!(self.self_conditioning_at, ScLocation::Host, "host and resident steps mixed in one block");
        let temperature = cfg.temperature_at(remaining);
        let request = self.resident_draw(rng).map_err(SamplerError::with_model_error)?;
        let (canvas, self_conditioning, rows) = self.resident_inputs();
        model.denoise_rows(canvas, self_conditioning, temperature, request, rows).map_err(|source| SamplerError::Model {
            block,
            call: ModelCall::CanvasForward { step },
            source,
        })?;
        self.finish_resident(cfg, temperature, rng, block, step).map_err(SamplerError::with_model_error)
    }

    /// The categorical draw of a resident step, for the model (recorded ids checked against V).
    pub(crate) fn resident_draw<'r, R: RandomSource + ?Sized>(&self, rng: &'r mut R) -> Result<CategoricalRequest<'r>, SamplerError> {
        let (c, v) = (self.canvas_length, self.vocab_size);
        let request = rng.categorical_request(c, v)?;
        if let CategoricalRequest::Ids(ids) = request {
            check_ids("categorical draw", ids, v)?;
        }
        Ok(request)
    }

    /// The inputs and output of a resident step's forward: the canvas, whether the previous step's
    /// scaled logits (kept by the model) feed it, and the per-row results the model writes.
    pub(crate) fn resident_inputs(&mut self) -> (&[u32], bool, &mut [RowResult]) {
        assert_ne!(self.self_conditioning_at, ScLocation::Host, "host and resident steps mixed in one block");
        (&self.canvas, self.self_conditioning_at == ScLocation::Model, &mut self.rows)
    }

    /// The rest of a resident step once the model has written the per-row results: their checks,
    /// then acceptance, renoising and stopping. `block` and `step` label errors.
    pub(crate) fn finish_resident<R: RandomSource + ?Sized>(
        &mut self,
        cfg: &GenerationConfig,
        temperature: f32,
        rng: &mut R,
        block: usize,
        step: usize,
    ) -> Result<StepOutcome, SamplerError> {
        let v = self.vocab_size;
        for (row, r) in self.rows.iter().enumerate() {
            if let Some((column, value)) = r.non_finite {
                return Err(InputError::NonFiniteLogit { block, step, row, column, value, temperature }.into());
            }
            (self.entropy[row], self.argmax[row], self.sampled[row]) = (r.entropy, r.argmax, r.sampled);
        }
        check_ids("argmax", &self.argmax, v)?;
        check_ids("categorical draw", &self.sampled, v)?;
        let outcome = self.finish_step(cfg, temperature, rng)?;
        self.self_conditioning_at = ScLocation::Model;
        Ok(outcome)
    }

    /// The rest of a step once the per-row entropy, argmax and sample are known: entropy-bound
    /// acceptance, the renoise draw, renoising and the stopping criteria.
    fn finish_step<R: RandomSource + ?Sized>(
        &mut self,
        cfg: &GenerationConfig,
        temperature: f32,
        rng: &mut R,
    ) -> Result<StepOutcome, SamplerError> {
        let v = self.vocab_size;
        let num_accepted = entropy_bound_accept(&self.entropy, cfg.entropy_bound, &mut self.order, &mut self.accepted);
        rng.uniform_tokens(v, &mut self.noise)?;
        check_ids("uniform draw", &self.noise, v)?;
        renoise(&mut self.canvas, &self.accepted, &self.sampled, &self.noise);
        let mean_entropy = stopping::mean_entropy(&self.entropy);
        let stop = cfg.stopping.as_ref().map(|s| stopping::evaluate(&mut self.stability, s, &self.argmax, mean_entropy));
        Ok(StepOutcome { temperature, num_accepted, mean_entropy, stop, finished: stop.is_some_and(StopDecision::finished) })
    }
}

impl SamplerError<Infallible> {
    /// The same error, typed for a model whose errors are `E` (a model-free error never holds one).
    pub fn with_model_error<E: std::error::Error + 'static>(self) -> SamplerError<E> {
        match self {
            SamplerError::Input(e) => SamplerError::Input(e),
            SamplerError::Draw(e) => SamplerError::Draw(e),
            SamplerError::Model { source, .. } => match source {},
            SamplerError::BatchForward { block, step } => SamplerError::BatchForward { block, step },
        }
    }
}

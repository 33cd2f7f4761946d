//! The batch driver: `DiffusionGemmaGenerationMixin.generate` for several sequences at once, each
//! with its own prompt length, settings, random source and stopping, advanced together one
//! denoising step at a time.
//!
//! [`Batch::step`] (host logits) and [`Batch::step_resident`] (per-row work in the model) first
//! take every sequence at a block boundary through its encode (its prompt prefill, or its committed
//! canvas) and its initial canvas draw, then hand the canvases of all running sequences to the
//! model in ONE call ([`BatchDenoiseModel::canvas_forward`], [`BatchResidentModel::denoise_rows`]),
//! then run each sequence's sampler step on its own rows. A sequence that ends (EOS, max length,
//! all canvases, its hooks asked, or a failure) leaves the batch at that step: its slot is released
//! and its [`Finished`] result waits in [`Batch::drain_finished`]. [`Batch::admit`] adds a sequence
//! whenever a slot is free; it starts at its next step, with its prefill.
//!
//! Each sequence consumes its own random source in the order it would alone and sees only its own
//! cache, so its tokens equal those of the same sequence generated alone (`crate::generate` is this
//! driver with one sequence).

use dg_model::GenerationConfig;

use crate::batched::{BatchDenoiseModel, BatchResidentModel, Draw, HostCanvases, Lane, ResidentCanvases};
use crate::error::{InputError, ModelCall, SamplerError};
use crate::generate::{Hooks, validate_config};
use crate::rng::RandomSource;
use crate::sampler::{Sampler, StepOutcome, check_ids};
use crate::sequence::{Finished, SeqId, SequenceState};

/// Why [`Batch::admit`] refused a sequence.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AdmitError {
    #[error("the batch is full: {capacity} sequences are running")]
    Full { capacity: usize },
    #[error(transparent)]
    Input(#[from] InputError),
}

/// A refused sequence: why, with its random source and hooks handed back.
#[derive(Debug)]
pub struct Rejected<R, H> {
    pub reason: AdmitError,
    pub rng: R,
    pub hooks: H,
}

/// What one [`Batch::step`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepReport {
    /// Canvases in the step's batched model call.
    pub forwarded: usize,
    /// Sequences that left the batch at this step (now in [`Batch::drain_finished`]).
    pub finished: usize,
}

/// Up to `capacity` sequences generating together on one model; `R` is each sequence's random
/// source, `H` its hooks, `E` the model's error type.
pub struct Batch<R, H, E: std::error::Error + 'static> {
    canvas_length: usize,
    vocab_size: usize,
    capacity: usize,
    /// The running sequences' model-facing halves, in admission order (parallel to `states`).
    lanes: Vec<Lane>,
    states: Vec<SequenceState<R, H, E>>,
    slot_used: Vec<bool>,
    /// Samplers of finished sequences, reused by the next admitted ones.
    spare: Vec<Sampler>,
    finished: Vec<Finished<R, H, E>>,
    next_id: u64,
}

impl<R, H, E: std::error::Error + 'static> std::fmt::Debug for Batch<R, H, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch")
            .field("canvas_length", &self.canvas_length)
            .field("vocab_size", &self.vocab_size)
            .field("capacity", &self.capacity)
            .field("running", &self.lanes.len())
            .field("finished", &self.finished.len())
            .finish_non_exhaustive()
    }
}

impl<R, H, E: std::error::Error + 'static> Batch<R, H, E> {
    /// A spare sampler back (the buffers of a finished sequence).
    pub(crate) fn into_sampler(mut self) -> Option<Sampler> {
        self.spare.pop()
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Sequences admitted and not yet finished.
    pub fn running(&self) -> usize {
        self.lanes.len()
    }

    /// Whether [`Self::admit`] would find a free slot.
    pub fn has_room(&self) -> bool {
        self.lanes.len() < self.capacity
    }

    /// The slot [`Self::admit`] would give the next sequence (the lowest free one), if any: a
    /// server that keeps caches between sequences readies that slot's cache first.
    pub fn free_slot(&self) -> Option<usize> {
        self.slot_used.iter().position(|used| !used)
    }

    /// The running sequences, in admission order.
    pub fn ids(&self) -> impl Iterator<Item = SeqId> + '_ {
        self.states.iter().map(|s| s.id)
    }

    /// Sequences that left the batch, in the order they finished.
    pub fn drain_finished(&mut self) -> impl Iterator<Item = Finished<R, H, E>> + '_ {
        self.finished.drain(..)
    }
}

impl<R: RandomSource, H: Hooks, E: std::error::Error + 'static> Batch<R, H, E> {
    /// An empty batch of up to `capacity` sequences (slots `0..capacity`) of canvas length C and
    /// vocabulary V.
    pub fn new(canvas_length: usize, vocab_size: usize, capacity: usize) -> Result<Self, InputError> {
        if capacity == 0 {
            return Err(InputError::Shape("a batch needs room for at least one sequence".into()));
        }
        let sampler = Sampler::new(canvas_length, vocab_size)?;
        Ok(Self::with_sampler(sampler, capacity))
    }

    /// A batch whose first sequence uses `sampler`'s buffers.
    pub(crate) fn with_sampler(sampler: Sampler, capacity: usize) -> Self {
        let mut spare = Vec::with_capacity(capacity);
        let (canvas_length, vocab_size) = (sampler.canvas_length(), sampler.vocab_size());
        spare.push(sampler);
        Batch {
            canvas_length,
            vocab_size,
            capacity,
            lanes: Vec::with_capacity(capacity),
            states: Vec::with_capacity(capacity),
            slot_used: vec![false; capacity],
            spare,
            finished: Vec::with_capacity(capacity),
            next_id: 0,
        }
    }

    /// Adds a sequence generating from `prompt` with `cfg`, its own random source and hooks, in the
    /// lowest free slot. It starts at the next step (with its prompt prefill). The prompt and
    /// settings are checked here, as `generate` checks them.
    pub fn admit(&mut self, prompt: &[u32], cfg: &GenerationConfig, rng: R, hooks: H) -> Result<SeqId, Rejected<R, H>> {
        let checked = || -> Result<usize, AdmitError> {
            if prompt.is_empty() {
                return Err(InputError::EmptyPrompt.into());
            }
            check_ids("prompt", prompt, self.vocab_size)?;
            validate_config(cfg, self.vocab_size)?;
            self.free_slot().ok_or(AdmitError::Full { capacity: self.capacity })
        };
        let slot = match checked() {
            Ok(slot) => slot,
            Err(reason) => return Err(Rejected { reason, rng, hooks }),
        };
        let id = SeqId(self.next_id);
        self.next_id += 1;
        let state = SequenceState::new(id, prompt, cfg, self.canvas_length, rng, hooks);
        if state.is_done() {
            // Nothing to generate (no canvas planned): finished without touching the model.
            self.finished.push(state.into_finished());
            return Ok(id);
        }
        let sampler = match self.spare.pop() {
            Some(s) => s,
            None => Sampler::new(self.canvas_length, self.vocab_size).expect("the shape was checked when the batch was made"),
        };
        self.slot_used[slot] = true;
        self.lanes.push(Lane { slot, sampler, in_forward: false, position: (0, 0), temperature: 1.0, draw: Draw::default() });
        self.states.push(state);
        Ok(id)
    }

    /// One denoising step of every running sequence, the canvases in one call of `model`; the
    /// logits come back to the sampler.
    pub fn step<M: BatchDenoiseModel<Error = E> + ?Sized>(&mut self, model: &mut M) -> StepReport {
        self.advance(&mut Host(model))
    }

    /// [`Self::step`] on a model that keeps the logits and runs the per-row work itself. A batch
    /// steps through one kind of model only.
    pub fn step_resident<M: BatchResidentModel<Error = E> + ?Sized>(&mut self, model: &mut M) -> StepReport {
        self.advance(&mut Resident(model))
    }

    fn advance<F: Flavour<Error = E>>(&mut self, model: &mut F) -> StepReport {
        for (lane, state) in self.lanes.iter_mut().zip(&mut self.states) {
            lane.in_forward = false;
            if let Err(e) = state.begin_block(lane, |slot, ids| model.encode(slot, ids)) {
                state.end(Err(e));
                continue;
            }
            let (remaining, step) = state.start_step();
            lane.position = (remaining, step);
            lane.temperature = state.cfg.temperature_at(remaining);
            match F::prepare(lane, &mut state.rng) {
                Ok(()) => lane.in_forward = true,
                Err(e) => state.end(Err(e.with_model_error())),
            }
        }
        let forwarded = self.lanes.iter().filter(|l| l.in_forward).count();
        if forwarded > 0 {
            // A failed call fails every canvas in it: the first sequence carries the model's error.
            let mut failure = model.forward(&mut self.lanes).err().map(Some);
            for (lane, state) in self.lanes.iter_mut().zip(&mut self.states).filter(|(l, _)| l.in_forward) {
                let (remaining, step) = lane.position;
                let block = state.block;
                if let Some(source) = &mut failure {
                    state.end(Err(match source.take() {
                        Some(source) => SamplerError::Model { block, call: ModelCall::CanvasForward { step }, source },
                        None => SamplerError::BatchForward { block, step },
                    }));
                    continue;
                }
                match F::finish(lane, &mut state.rng, &state.cfg, block, step) {
                    Ok(outcome) => state.after_step(lane, &outcome, remaining),
                    Err(e) => state.end(Err(e.with_model_error())),
                }
            }
        }
        StepReport { forwarded, finished: self.retire(model) }
    }

    /// Takes every running sequence out of the batch without calling the model: for a model
    /// whose state is no longer known (a call panicked), which the caller then resets, releasing
    /// every slot. Returns each sequence's id, random source and hooks; every slot is free.
    pub fn abandon(&mut self) -> Vec<(SeqId, R, H)> {
        self.slot_used.fill(false);
        self.spare.extend(self.lanes.drain(..).map(|lane| lane.sampler));
        self.states.drain(..).map(SequenceState::into_parts).collect()
    }

    /// Moves the finished sequences out of the batch, releasing their slots.
    fn retire<F: Flavour<Error = E>>(&mut self, model: &mut F) -> usize {
        let mut retired = 0;
        let mut i = 0;
        while i < self.lanes.len() {
            if !self.states[i].is_done() {
                i += 1;
                continue;
            }
            let lane = self.lanes.remove(i);
            let state = self.states.remove(i);
            model.release(lane.slot);
            self.slot_used[lane.slot] = false;
            self.spare.push(lane.sampler);
            self.finished.push(state.into_finished());
            retired += 1;
        }
        retired
    }
}

/// How the driver reaches its model: the logits come back ([`Host`]) or stay ([`Resident`]).
trait Flavour {
    type Error: std::error::Error + Send + Sync + 'static;
    fn encode(&mut self, slot: usize, ids: &[u32]) -> Result<(), Self::Error>;
    fn release(&mut self, slot: usize);
    /// What a lane needs before the forward (its categorical draw, for a resident model).
    fn prepare<R: RandomSource>(lane: &mut Lane, rng: &mut R) -> Result<(), SamplerError>;
    fn forward(&mut self, lanes: &mut [Lane]) -> Result<(), Self::Error>;
    /// The sampler's step on the lane's rows once the forward has run.
    fn finish<R: RandomSource>(
        lane: &mut Lane,
        rng: &mut R,
        cfg: &GenerationConfig,
        block: usize,
        step: usize,
    ) -> Result<StepOutcome, SamplerError>;
}

struct Host<'m, M: ?Sized>(&'m mut M);

impl<M: BatchDenoiseModel + ?Sized> Flavour for Host<'_, M> {
    type Error = M::Error;
    fn encode(&mut self, slot: usize, ids: &[u32]) -> Result<(), M::Error> {
        self.0.encode(slot, ids)
    }
    fn release(&mut self, slot: usize) {
        self.0.release(slot)
    }
    fn prepare<R: RandomSource>(_lane: &mut Lane, _rng: &mut R) -> Result<(), SamplerError> {
        Ok(())
    }
    fn forward(&mut self, lanes: &mut [Lane]) -> Result<(), M::Error> {
        self.0.canvas_forward(&mut HostCanvases::new(lanes))
    }
    fn finish<R: RandomSource>(
        lane: &mut Lane,
        rng: &mut R,
        cfg: &GenerationConfig,
        block: usize,
        _step: usize,
    ) -> Result<StepOutcome, SamplerError> {
        lane.sampler.step(cfg, lane.position.0, rng, block)
    }
}

struct Resident<'m, M: ?Sized>(&'m mut M);

impl<M: BatchResidentModel + ?Sized> Flavour for Resident<'_, M> {
    type Error = M::Error;
    fn encode(&mut self, slot: usize, ids: &[u32]) -> Result<(), M::Error> {
        self.0.encode(slot, ids)
    }
    fn release(&mut self, slot: usize) {
        self.0.release(slot)
    }
    fn prepare<R: RandomSource>(lane: &mut Lane, rng: &mut R) -> Result<(), SamplerError> {
        let request = lane.sampler.resident_draw(rng)?;
        lane.draw.set(request);
        Ok(())
    }
    fn forward(&mut self, lanes: &mut [Lane]) -> Result<(), M::Error> {
        self.0.denoise_rows(&mut ResidentCanvases::new(lanes))
    }
    fn finish<R: RandomSource>(
        lane: &mut Lane,
        rng: &mut R,
        cfg: &GenerationConfig,
        block: usize,
        step: usize,
    ) -> Result<StepOutcome, SamplerError> {
        lane.sampler.finish_resident(cfg, lane.temperature, rng, block, step)
    }
}

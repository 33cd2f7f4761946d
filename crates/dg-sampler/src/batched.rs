//! The model as a batch of sequences sees it: several canvases, each in its own KV cache (a slot),
//! denoised by one call.
//!
//! transformers' `DiffusionGemmaGenerationMixin.generate` takes a batch of prompts and runs every
//! canvas forward on all of them at once; here the batch is ragged: each sequence sits at its own
//! positions, in its own block and step, with its own self-conditioning input, temperature and
//! random draws. [`BatchDenoiseModel`] returns the raw logits of each canvas to the sampler (as
//! [`crate::DenoiseModel`] does for one sequence); [`BatchResidentModel`] runs the per-row work
//! where the logits live (as [`crate::ResidentModel`]). The driver ([`crate::Batch`]) hands the
//! canvases of one step to the model as a [`HostCanvases`] or [`ResidentCanvases`] view.
//!
//! [`PerSlot`] makes any single-sequence model that can swap its per-sequence state out
//! ([`SwapCache`]) a batched model by running the slots one after another: exact, not faster. A
//! model that reads its weights once for the whole batch implements the batched traits itself.

use crate::generate::DenoiseModel;
use crate::resident::{HostRows, HostRowsError, ResidentModel, RowResult};
use crate::rng::CategoricalRequest;
use crate::sampler::Sampler;

/// A model that denoises the canvases of several sequences, each in its own slot (KV cache).
pub trait BatchDenoiseModel {
    type Error: std::error::Error + Send + Sync + 'static;

    /// Encodes `ids` causally into the KV cache of `slot` at its next positions (a prompt prefill,
    /// or a committed canvas). A slot not used since [`Self::release`] (or ever) starts empty.
    fn encode(&mut self, slot: usize, ids: &[u32]) -> Result<(), Self::Error>;

    /// One canvas forward for every canvas of `batch`, each at the positions after its slot's
    /// cache, with its own self-conditioning input: writes each canvas's raw softcapped logits
    /// (as [`crate::DenoiseModel::canvas_forward`] does for one).
    fn canvas_forward(&mut self, batch: &mut HostCanvases<'_>) -> Result<(), Self::Error>;

    /// The sequence in `slot` is finished: its cache may be dropped; the slot's next encode starts
    /// a new sequence.
    fn release(&mut self, slot: usize);
}

/// A model that runs the canvas forward and the per-row work of several sequences where their
/// logits live, keeping each sequence's scaled logits as its next self-conditioning input.
pub trait BatchResidentModel {
    type Error: std::error::Error + Send + Sync + 'static;

    /// As [`BatchDenoiseModel::encode`].
    fn encode(&mut self, slot: usize, ids: &[u32]) -> Result<(), Self::Error>;

    /// For every canvas of `batch`, what [`crate::ResidentModel::denoise_rows`] does for one: the
    /// forward at its slot's positions, its own temperature, self-conditioning flag and draw.
    fn denoise_rows(&mut self, batch: &mut ResidentCanvases<'_>) -> Result<(), Self::Error>;

    /// As [`BatchDenoiseModel::release`] (the slot's self-conditioning logits go too).
    fn release(&mut self, slot: usize);
}

/// The categorical draw of one lane's step, copied out of its random source so that the
/// canvases of a batch can be handed to the model together.
#[derive(Debug, Default)]
pub(crate) struct Draw {
    ids: bool,
    uniforms: Vec<f64>,
    recorded: Vec<u32>,
}

impl Draw {
    pub(crate) fn set(&mut self, request: CategoricalRequest<'_>) {
        self.uniforms.clear();
        self.recorded.clear();
        match request {
            CategoricalRequest::Uniforms(u) => {
                self.ids = false;
                self.uniforms.extend_from_slice(u);
            }
            CategoricalRequest::Ids(ids) => {
                self.ids = true;
                self.recorded.extend_from_slice(ids);
            }
        }
    }

    fn request(&self) -> CategoricalRequest<'_> {
        if self.ids { CategoricalRequest::Ids(&self.recorded) } else { CategoricalRequest::Uniforms(&self.uniforms) }
    }
}

/// The model-facing half of one sequence in a batch: its slot, its sampler's buffers, and what its
/// next forward needs.
#[derive(Debug)]
pub(crate) struct Lane {
    pub(crate) slot: usize,
    pub(crate) sampler: Sampler,
    /// Whether this lane's canvas is in the current forward.
    pub(crate) in_forward: bool,
    /// The step being taken: (n, the steps left in the block including it; its 0-based index).
    pub(crate) position: (usize, usize),
    pub(crate) temperature: f32,
    pub(crate) draw: Draw,
}

/// The canvases of one batched host-logits forward (the lanes of the step, in admission order).
#[derive(Debug)]
pub struct HostCanvases<'a> {
    lanes: &'a mut [Lane],
}

/// One canvas of a [`HostCanvases`] batch.
#[derive(Debug)]
pub struct HostCanvas<'a> {
    /// The slot whose KV cache the canvas attends to.
    pub slot: usize,
    pub canvas: &'a [u32],
    /// The previous step's temperature-scaled logits (C·V), `None` on a block's first step.
    pub self_conditioning: Option<&'a [f32]>,
    /// Where the raw softcapped logits go (C·V).
    pub logits: &'a mut [f32],
}

impl<'a> HostCanvases<'a> {
    pub(crate) fn new(lanes: &'a mut [Lane]) -> Self {
        HostCanvases { lanes }
    }

    /// The number of canvases.
    pub fn len(&self) -> usize {
        self.lanes.iter().filter(|l| l.in_forward).count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The canvases, in the batch's order.
    pub fn canvases(&mut self) -> impl Iterator<Item = HostCanvas<'_>> {
        self.lanes.iter_mut().filter(|l| l.in_forward).map(|l| {
            let (canvas, self_conditioning, logits) = l.sampler.forward_buffers();
            HostCanvas { slot: l.slot, canvas, self_conditioning, logits }
        })
    }
}

/// The canvases of one batched resident step.
#[derive(Debug)]
pub struct ResidentCanvases<'a> {
    lanes: &'a mut [Lane],
}

/// One canvas of a [`ResidentCanvases`] batch.
#[derive(Debug)]
pub struct ResidentCanvas<'a> {
    pub slot: usize,
    pub canvas: &'a [u32],
    /// Whether the slot's previous scaled logits feed the forward (false on a block's first step).
    pub self_conditioning: bool,
    pub temperature: f32,
    pub draw: CategoricalRequest<'a>,
    /// The per-row results the model writes (C entries).
    pub rows: &'a mut [RowResult],
}

impl<'a> ResidentCanvases<'a> {
    pub(crate) fn new(lanes: &'a mut [Lane]) -> Self {
        ResidentCanvases { lanes }
    }

    pub fn len(&self) -> usize {
        self.lanes.iter().filter(|l| l.in_forward).count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The canvases, in the batch's order.
    pub fn canvases(&mut self) -> impl Iterator<Item = ResidentCanvas<'_>> {
        self.lanes.iter_mut().filter(|l| l.in_forward).map(|l| {
            let (canvas, self_conditioning, rows) = l.sampler.resident_inputs();
            ResidentCanvas { slot: l.slot, canvas, self_conditioning, temperature: l.temperature, draw: l.draw.request(), rows }
        })
    }
}

/// A single-sequence model whose per-sequence state (the KV cache; for a resident model also the
/// self-conditioning logits) can be taken out and put back.
pub trait SwapCache {
    /// Everything the model keeps for one sequence.
    type Cache;
    type CacheError: std::error::Error + Send + Sync + 'static;

    /// Takes the sequence's state out, leaving the model as for a new sequence.
    fn take_cache(&mut self) -> Self::Cache;

    /// Puts back a state taken out of this model; the next calls continue that sequence.
    fn put_cache(&mut self, cache: Self::Cache) -> Result<(), Self::CacheError>;
}

/// Any [`SwapCache`] model as a batched model: each slot's state is parked beside the model while
/// another slot runs, and the canvases of a batch run one after another. Each sequence computes
/// exactly what it would alone; a batch of B costs B single forwards.
#[derive(Debug)]
pub struct PerSlot<M: SwapCache> {
    model: M,
    parked: Vec<Option<M::Cache>>,
    /// The slot whose state is in the model.
    current: Option<usize>,
}

impl<M: SwapCache> PerSlot<M> {
    /// Wraps `model`, dropping whatever sequence state it holds (slots start empty).
    pub fn new(mut model: M) -> Self {
        drop(model.take_cache());
        PerSlot { model, parked: Vec::new(), current: None }
    }

    pub fn model(&self) -> &M {
        &self.model
    }

    /// The model, without the parked states.
    pub fn into_inner(mut self) -> M {
        drop(self.model.take_cache());
        self.model
    }

    /// Puts `slot`'s state into the model (parking the one there).
    fn switch_to(&mut self, slot: usize) -> Result<(), M::CacheError> {
        if self.current == Some(slot) {
            return Ok(());
        }
        let out = self.model.take_cache();
        if let Some(previous) = self.current.take() {
            self.parked[previous] = Some(out);
        }
        if self.parked.len() <= slot {
            self.parked.resize_with(slot + 1, || None);
        }
        if let Some(state) = self.parked[slot].take() {
            self.model.put_cache(state)?;
        }
        self.current = Some(slot);
        Ok(())
    }

    /// The model with `slot`'s state in it, for a call the batched traits do not carry (an encode
    /// with image rows).
    pub fn slot_model(&mut self, slot: usize) -> Result<&mut M, M::CacheError> {
        self.switch_to(slot)?;
        Ok(&mut self.model)
    }

    /// Takes `slot`'s state out (the slot is left empty): a server keeps a finished sequence's
    /// cache this way, to continue it in any slot later with [`Self::put_slot`].
    pub fn take_slot(&mut self, slot: usize) -> Option<M::Cache> {
        if self.current == Some(slot) {
            self.current = None;
            Some(self.model.take_cache())
        } else {
            self.parked.get_mut(slot).and_then(Option::take)
        }
    }

    /// Makes `state` (taken out of this model) `slot`'s, in place of what the slot held: the
    /// slot's next calls continue that sequence.
    pub fn put_slot(&mut self, slot: usize, state: M::Cache) {
        self.release_slot(slot);
        if self.parked.len() <= slot {
            self.parked.resize_with(slot + 1, || None);
        }
        self.parked[slot] = Some(state);
    }

    fn release_slot(&mut self, slot: usize) {
        if self.current == Some(slot) {
            drop(self.model.take_cache());
            self.current = None;
        } else if let Some(parked) = self.parked.get_mut(slot) {
            *parked = None;
        }
    }
}

impl<M> BatchDenoiseModel for PerSlot<M>
where
    M: DenoiseModel + SwapCache<CacheError = <M as DenoiseModel>::Error>,
{
    type Error = <M as DenoiseModel>::Error;

    fn encode(&mut self, slot: usize, ids: &[u32]) -> Result<(), Self::Error> {
        self.switch_to(slot)?;
        self.model.encode(ids)
    }

    fn canvas_forward(&mut self, batch: &mut HostCanvases<'_>) -> Result<(), Self::Error> {
        for c in batch.canvases() {
            self.switch_to(c.slot)?;
            self.model.canvas_forward(c.canvas, c.self_conditioning, c.logits)?;
        }
        Ok(())
    }

    fn release(&mut self, slot: usize) {
        self.release_slot(slot);
    }
}

impl<M> BatchResidentModel for PerSlot<M>
where
    M: ResidentModel + SwapCache<CacheError = <M as ResidentModel>::Error>,
{
    type Error = <M as ResidentModel>::Error;

    fn encode(&mut self, slot: usize, ids: &[u32]) -> Result<(), Self::Error> {
        self.switch_to(slot)?;
        self.model.encode(ids)
    }

    fn denoise_rows(&mut self, batch: &mut ResidentCanvases<'_>) -> Result<(), Self::Error> {
        for c in batch.canvases() {
            self.switch_to(c.slot)?;
            self.model.denoise_rows(c.canvas, c.self_conditioning, c.temperature, c.draw, c.rows)?;
        }
        Ok(())
    }

    fn release(&mut self, slot: usize) {
        self.release_slot(slot);
    }
}

/// A [`HostRows`] model's sequence state: its model's, and the scaled logits it keeps as the next
/// self-conditioning input.
impl<M> SwapCache for HostRows<M>
where
    M: DenoiseModel + SwapCache<CacheError = <M as DenoiseModel>::Error>,
{
    type Cache = (M::Cache, Vec<f32>);
    type CacheError = HostRowsError<<M as DenoiseModel>::Error>;

    fn take_cache(&mut self) -> Self::Cache {
        (self.model.take_cache(), self.take_scaled())
    }

    fn put_cache(&mut self, (cache, scaled): Self::Cache) -> Result<(), Self::CacheError> {
        self.model.put_cache(cache).map_err(HostRowsError::Model)?;
        self.put_scaled(scaled);
        Ok(())
    }
}

/// One sequence's model as a batch of one slot (the single-sequence `generate`): the model's cache
/// is the slot's, as the caller left it, and stays after the sequence ends.
pub(crate) struct OneSlot<'m, M: ?Sized>(pub(crate) &'m mut M);

impl<M: DenoiseModel + ?Sized> BatchDenoiseModel for OneSlot<'_, M> {
    type Error = M::Error;

    fn encode(&mut self, _slot: usize, ids: &[u32]) -> Result<(), Self::Error> {
        self.0.encode(ids)
    }

    fn canvas_forward(&mut self, batch: &mut HostCanvases<'_>) -> Result<(), Self::Error> {
        for c in batch.canvases() {
            self.0.canvas_forward(c.canvas, c.self_conditioning, c.logits)?;
        }
        Ok(())
    }

    fn release(&mut self, _slot: usize) {}
}

impl<M: ResidentModel + ?Sized> BatchResidentModel for OneSlot<'_, M> {
    type Error = M::Error;

    fn encode(&mut self, _slot: usize, ids: &[u32]) -> Result<(), Self::Error> {
        self.0.encode(ids)
    }

    fn denoise_rows(&mut self, batch: &mut ResidentCanvases<'_>) -> Result<(), Self::Error> {
        for c in batch.canvases() {
            self.0.denoise_rows(c.canvas, c.self_conditioning, c.temperature, c.draw, c.rows)?;
        }
        Ok(())
    }

    fn release(&mut self, _slot: usize) {}
}

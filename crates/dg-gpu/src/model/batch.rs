//! Batched denoising steps (`DiffusionGemmaGenerationMixin.generate` over a batch of prompts): the
//! canvases of several sequences, each in its own slot (KV cache, positions, self-conditioning
//! logits), through ONE canvas forward and one sampler pass, so that every weight is read once a
//! step for the whole batch ([`dg_sampler::BatchResidentModel`] for [`GpuModel`]).
//!
//! Slot `s`'s canvas is the forward's canvas `s`: rows `s·C ..` of every activation, its
//! self-conditioning logits and its sampler results stay in those rows from step to step. A
//! forward covers slots `0..=` the highest one in the step; a slot below it that has no canvas in
//! the step (a free one) runs a pad canvas whose results are dropped. Canvases that self-condition
//! and canvases on their block's first step share a forward: the signal is computed for all and
//! added to the former only (`forward::SelfConditioning::Gated`). Every product is planned as
//! for one canvas (`Recorder::plan_rows`), so each sequence gets the bits it gets alone.

use std::collections::HashMap;

use dg_kernels::sample_rows::{self, RESULT_WORDS, SampleStep};
use dg_sampler::{CategoricalRequest, ResidentCanvases};

use dg_model::ModelConfig;

use super::{GpuModel, uniform_f32};
use crate::arena::Arena;
use crate::context::map_read_with;
use crate::error::GpuError;
use crate::forward::{CanvasShape, ForwardShape, Head, SelfConditioning, record_canvas_forward};
use crate::ops::Recorder;
use crate::plan::Plan;
use crate::weights::GpuWeights;

/// Recorded plans kept at most (a batch's shape changes when any of its sequences starts a block).
const MAX_PLANS: usize = 16;

/// The batched steps' plans by shape, and the host buffers a step fills (kept from step to step).
#[derive(Debug, Default)]
pub(super) struct PlanCache {
    plans: HashMap<ForwardShape, Plan>,
    /// The shape of the last step run.
    last: Option<ForwardShape>,
    inputs: StepInputs,
}

impl PlanCache {
    /// The plan of the last step run, if any.
    pub(super) fn last_plan(&self) -> Option<&Plan> {
        self.last.as_ref().and_then(|s| self.plans.get(s))
    }
}

/// One step's inputs for the forward's canvases, in slot order.
#[derive(Debug, Default)]
struct StepInputs {
    ids: Vec<u32>,
    draws: Vec<u32>,
    steps: Vec<SampleStep>,
    gate: Vec<u32>,
    /// Whether a canvas of the step is in the slot.
    taken: Vec<bool>,
}

impl StepInputs {
    /// Empties the inputs for a forward of `n` canvases of `c` rows: pad ids, no draws, the
    /// uniform sampler mode, no self-conditioning, no slot taken.
    fn reset(&mut self, n: usize, c: usize, pad: u32) {
        let fill = |v: &mut Vec<u32>, len: usize, x: u32| {
            v.clear();
            v.resize(len, x);
        };
        fill(&mut self.ids, n * c, pad);
        fill(&mut self.draws, n * c, 0);
        fill(&mut self.gate, n * c, 0);
        self.steps.clear();
        self.steps.resize(n, SampleStep::new(1.0, sample_rows::MODE_UNIFORM));
        self.taken.clear();
        self.taken.resize(n, false);
    }
}

impl GpuModel {
    /// Slots (sequences with a cache of their own) the model was loaded with.
    pub fn slots(&self) -> usize {
        self.arena.slots
    }

    /// Bytes of the activations and caches (the arena: every slot's cache, and rows for a forward
    /// of every slot's canvas).
    pub fn arena_bytes(&self) -> u64 {
        self.arena.bytes
    }

    /// Forgets `slot`'s sequence (its cache and self-conditioning logits are free for the next).
    pub fn release_slot(&mut self, slot: usize) {
        if let Some(len) = self.seq_lens.get_mut(slot) {
            *len = 0;
            self.sliding_bases[slot] = 0;
        }
        if slot == 0 {
            self.reset();
        }
    }

    /// Keeps the first `len` tokens of `slot`'s cache and forgets the rest, so that the next encode
    /// continues a shared prefix (vLLM's prefix caching, at token granularity): full layers hold
    /// every position at row = position, sliding layers the positions from their base on, so the
    /// prefix is whole while the last W − 1 positions before `len` are still at or past the base.
    /// Returns the tokens the slot keeps: `len`, or 0 where the cache cannot give that prefix
    /// (the window has moved past it, or `len` is past the cache), the slot then released.
    pub fn truncate_slot(&mut self, slot: usize, len: usize) -> usize {
        let Some(&seq_len) = self.seq_lens.get(slot) else { return 0 };
        let keep = self.config.text.sliding_kept();
        if len > seq_len || len - len.min(keep) < self.sliding_bases[slot] || (slot == 0 && self.uploaded_context) {
            self.release_slot(slot);
            return 0;
        }
        self.seq_lens[slot] = len;
        if slot == 0 {
            self.context_ready = false;
        }
        len
    }

    /// One batched resident step: for every canvas of `batch`, what [`GpuModel::denoise_rows`]
    /// does for one, in one forward and one sampler pass; reads back `RESULT_WORDS` u32 per row
    /// of the forward.
    pub fn denoise_batch(&mut self, batch: &mut ResidentCanvases<'_>) -> Result<(), GpuError> {
        let (c, v) = (self.config.canvas_length, self.config.text.vocab_size);
        let mut canvases: Vec<_> = batch.canvases().collect();
        let Some(n) = canvases.iter().map(|cv| cv.slot + 1).max() else { return Ok(()) };
        if n > self.arena.slots {
            return Err(GpuError::Limit {
                what: format!("slot {}", n - 1),
                needed: n as u64,
                limit: self.arena.slots as u64,
                limit_name: "the slots the model was loaded with",
            });
        }
        let pad = self.config.text.pad_token_id.unwrap_or(0);
        // The step's host buffers, kept for the next step (a step that fails drops them).
        let mut inputs = std::mem::take(&mut self.batch_plans.inputs);
        inputs.reset(n, c, pad);
        let sc = self.fill_batch_inputs(&canvases, &mut inputs)?;
        let shape = ForwardShape {
            canvases: (0..n).map(|slot| CanvasShape { slot, visible: self.slot_visible(slot) }).collect(),
            self_conditioning: sc,
            width: c,
            head: Head::All,
        };
        self.write_batch_inputs(&inputs, &shape)?;
        self.batch_plans.inputs = inputs;
        self.ensure_batch_plan(&shape)?;
        let plan = &self.batch_plans.plans[&shape];
        if self.batch_plans.last.as_ref() != Some(&shape) {
            self.batch_plans.last = Some(shape.clone());
        }
        let bytes = (n * c * RESULT_WORDS * 4) as u64;
        crate::plan::submit_in_parts(&self.ctx, &[plan], self.ctx.tuning.submit_parts, "batched denoising step", |enc| {
            enc.copy_buffer_to_buffer(&self.arena.row_results, 0, &self.arena.row_staging, 0, bytes)
        })?;
        // While the GPU runs: the plans the next steps take (every canvas self-conditioned, the
        // canvases' commits), so that a batch whose sequences stay records nothing until one of
        // them starts a block or leaves.
        if shape.self_conditioning != SelfConditioning::On {
            self.ensure_batch_plan(&ForwardShape { self_conditioning: SelfConditioning::On, ..shape })?;
        }
        self.prerecord_commits(canvases.iter().map(|cv| cv.slot))?;
        let mut non_finite = Vec::new();
        map_read_with(&self.ctx, &self.arena.row_staging, bytes, |data| {
            let words: &[u32] = bytemuck::cast_slice(data);
            for cv in &mut canvases {
                let slot_words = &words[cv.slot * c * RESULT_WORDS..(cv.slot + 1) * c * RESULT_WORDS];
                if let Some((row, column)) = super::decode_rows(slot_words, cv.rows) {
                    non_finite.push((cv.slot, row, column));
                }
            }
        })?;
        // An error path: one more read for each offending value.
        for (slot, row, column) in non_finite {
            let (g, first_row) = self.arena.vocab_rows(slot);
            let value = self.ctx.read_f32(&self.arena.sc_probs[g], (first_row + row) * v + column, 1)?[0];
            if let Some(cv) = canvases.iter_mut().find(|cv| cv.slot == slot) {
                cv.rows[row].non_finite = Some((column, value));
            }
        }
        Ok(())
    }

    /// Checks the step's canvases and fills `inputs` (reset for the forward) from them; returns
    /// how the forward self-conditions.
    fn fill_batch_inputs(
        &self,
        canvases: &[dg_sampler::ResidentCanvas<'_>],
        inputs: &mut StepInputs,
    ) -> Result<SelfConditioning, GpuError> {
        let c = self.config.canvas_length;
        for cv in canvases {
            let s = cv.slot;
            if std::mem::replace(&mut inputs.taken[s], true) {
                return Err(GpuError::Unsupported { what: format!("two canvases in slot {s} in one step") });
            }
            if self.seq_lens[s] == 0 || (s == 0 && self.uploaded_context) {
                return Err(GpuError::NoContext);
            }
            self.check_canvas(cv.canvas)?;
            if cv.rows.len() != c {
                return Err(GpuError::Length { what: "row results", got: cv.rows.len(), expected: c });
            }
            let rows = s * c..(s + 1) * c;
            inputs.ids[rows.clone()].copy_from_slice(cv.canvas);
            inputs.gate[rows.clone()].fill(u32::from(cv.self_conditioning));
            let mode = draw_words(cv.draw, &mut inputs.draws[rows], c)?;
            inputs.steps[s] = SampleStep::new(cv.temperature, mode);
        }
        Ok(match (canvases.iter().all(|cv| cv.self_conditioning), canvases.iter().any(|cv| cv.self_conditioning)) {
            (true, _) => SelfConditioning::On,
            (false, true) => SelfConditioning::Gated,
            (false, false) => SelfConditioning::Off,
        })
    }

    /// Records the plan of a batched step of `shape` unless it is kept.
    fn ensure_batch_plan(&mut self, shape: &ForwardShape) -> Result<(), GpuError> {
        if self.batch_plans.plans.contains_key(shape) {
            return Ok(());
        }
        let plan = self.record_batch(shape)?;
        if self.batch_plans.plans.len() >= MAX_PLANS {
            // Keep the plan the step in flight runs.
            let last = self.batch_plans.last.as_ref();
            self.batch_plans.plans.retain(|kept, _| Some(kept) == last);
        }
        self.batch_plans.plans.insert(shape.clone(), plan);
        Ok(())
    }

    /// Writes a batched step's ids, draws, per-canvas sampler settings and self-conditioning gate,
    /// and the RoPE tables of the canvases whose positions the tables do not hold.
    fn write_batch_inputs(&mut self, inputs: &StepInputs, shape: &ForwardShape) -> Result<(), GpuError> {
        let q = &self.ctx.queue;
        q.write_buffer(&self.arena.ids, 0, bytemuck::cast_slice(&inputs.ids));
        q.write_buffer(&self.arena.draws, 0, bytemuck::cast_slice(&inputs.draws));
        q.write_buffer(&self.arena.sample_step, 0, bytemuck::cast_slice(&inputs.steps));
        if shape.self_conditioning == SelfConditioning::Gated {
            q.write_buffer(&self.arena.sc_gate, 0, bytemuck::cast_slice(&inputs.gate));
        }
        let c = self.config.canvas_length;
        for slot in 0..shape.canvases.len() {
            self.ensure_rope(self.seq_lens[slot], c, slot * c);
        }
        Ok(())
    }

    /// The plan of a batched step of `shape`.
    fn record_batch(&mut self, shape: &ForwardShape) -> Result<Plan, GpuError> {
        let mut rec = Recorder::new(&self.ctx, &mut self.pipelines);
        record_batch_step(&mut rec, &self.config, &self.weights, &self.arena, shape)?;
        rec.finish()
    }

    /// Records a batched step of `shape` into `rec` (its kernels' keys, for the warm-up).
    pub(super) fn record_batch_keys<'a>(&'a self, rec: &mut Recorder<'a>, shape: &ForwardShape) -> Result<(), GpuError> {
        record_batch_step(rec, &self.config, &self.weights, &self.arena, shape)
    }
}

/// A batched step of `shape`: the forward, then the sampler's rows.
fn record_batch_step<'a>(
    rec: &mut Recorder<'a>,
    config: &ModelConfig,
    w: &'a GpuWeights,
    a: &'a Arena,
    shape: &ForwardShape,
) -> Result<(), GpuError> {
    let (c, v) = (config.canvas_length, config.text.vocab_size);
    record_canvas_forward(rec, config, w, a, shape)?;
    rec.scope("sampler rows");
    for (g, first, count) in a.vocab_groups(shape.canvases.len()) {
        rec.sample_rows(&a.logits[g], &a.sc_probs[g], &a.sample_step, &a.draws, &a.row_results, (count * c, c, first * c), v)?;
    }
    Ok(())
}

/// `draw` as the sampler kernel's per-row words (uniform bits, or given ids) and its mode.
pub(super) fn draw_words(draw: CategoricalRequest<'_>, words: &mut [u32], c: usize) -> Result<u32, GpuError> {
    match draw {
        CategoricalRequest::Uniforms(u) => {
            if u.len() != c {
                return Err(GpuError::Length { what: "categorical uniforms", got: u.len(), expected: c });
            }
            words.iter_mut().zip(u).for_each(|(w, &u)| *w = uniform_f32(u).to_bits());
            Ok(sample_rows::MODE_UNIFORM)
        }
        CategoricalRequest::Ids(ids) => {
            if ids.len() != c {
                return Err(GpuError::Length { what: "categorical ids", got: ids.len(), expected: c });
            }
            words.copy_from_slice(ids);
            Ok(sample_rows::MODE_GIVEN)
        }
    }
}

impl dg_sampler::BatchResidentModel for GpuModel {
    type Error = GpuError;

    fn encode(&mut self, slot: usize, ids: &[u32]) -> Result<(), GpuError> {
        if slot == 0 && self.uploaded_context {
            self.reset();
        }
        self.encode_slot(slot, ids)
    }

    fn denoise_rows(&mut self, batch: &mut ResidentCanvases<'_>) -> Result<(), GpuError> {
        self.denoise_batch(batch)
    }

    fn release(&mut self, slot: usize) {
        self.release_slot(slot);
    }
}

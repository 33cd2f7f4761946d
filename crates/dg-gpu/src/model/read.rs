//! Reads on the GPU ([`dg_sampler::ReadModel`], [`dg_sampler::BatchReadModel`]): canvases of
//! width W ≤ `canvas_length` after a slot's cache, self-conditioned at some rows only, the head
//! computed at the rows asked for, the cache's context left as it was.
//!
//! Mirrors `DiffusionGemmaForBlockDiffusion.forward(decoder_input_ids=canvas, past_key_values=cache)`
//! as vLLM's structured mode (PR #57250) runs it: the forward is the canvas forward
//! ([`record_canvas_forward`]) at `width` W with [`Head::Rows`], its products planned for W rows
//! (and the head's for a canvas's asked rows); pinned rows get no self-conditioning
//! ([`SelfConditioning::Gated`] by row). Several canvases of one slot (a prompt's samples,
//! re-reads, question groups) run as one forward over that slot's one cache: canvas `b` writes its
//! K/V after the slot's earlier canvases' and masks theirs (`forward::attention_groups`).

use std::collections::HashMap;

use dg_sampler::{BatchReadModel, Conditioning, ReadCanvas, ReadModel};

use super::GpuModel;
use crate::context::map_read_with;
use crate::error::GpuError;
use crate::forward::{CanvasShape, ForwardShape, Head, SelfConditioning, record_canvas_forward};
use crate::ops::Recorder;
use crate::plan::{Plan, submit_in_parts};

/// Recorded read plans kept at most (one per width, canvas count, head rows and self-conditioning).
const MAX_PLANS: usize = 16;

/// The read forwards' plans by shape.
#[derive(Debug, Default)]
pub(super) struct ReadPlans {
    plans: HashMap<ForwardShape, Plan>,
    /// The shape of the last read forward run.
    last: Option<ForwardShape>,
}

impl ReadPlans {
    /// The plan of the last read forward run, if any.
    pub(super) fn last_plan(&self) -> Option<&Plan> {
        self.last.as_ref().and_then(|s| self.plans.get(s))
    }
}

impl GpuModel {
    /// Canvases of `width` rows one read forward holds: a canvas forward's `canvas_length` rows
    /// (the rows every slot's cache keeps after its context, and the logits' staging).
    pub fn max_reads(&self, width: usize) -> usize {
        self.config.canvas_length / width.max(1)
    }

    /// One forward of `reads` (canvases of one width) after `slot`'s cache: canvas `b`'s raw
    /// softcapped logits at its `head_rows`, one canvas after another, into `logits`
    /// (`Σ head_rows × V`). Each canvas's rows equal those of a forward of it alone, and those
    /// rows of its full head. The slot's cache is read, its context never written.
    pub fn read_forwards(&mut self, slot: usize, reads: &[ReadCanvas<'_>], logits: &mut [f32]) -> Result<(), GpuError> {
        let (c, v) = (self.config.canvas_length, self.config.text.vocab_size);
        let width = self.check_reads(slot, reads, logits)?;
        let n = reads.len();
        let mut ids = Vec::with_capacity(n * width);
        let mut head_rows = Vec::new();
        for (b, r) in reads.iter().enumerate() {
            ids.extend_from_slice(r.canvas);
            head_rows.extend(r.head_rows.iter().map(|&row| (b * width + row) as u32));
        }
        let conditioned = reads.iter().filter(|r| r.conditioning.is_some_and(|sc| !sc.rows.is_empty())).count();
        let self_conditioning = if conditioned == 0 { SelfConditioning::Off } else { SelfConditioning::Gated };
        let q = &self.ctx.queue;
        q.write_buffer(&self.arena.ids, 0, bytemuck::cast_slice(&ids));
        q.write_buffer(&self.arena.head_rows, 0, bytemuck::cast_slice(&head_rows));
        if self_conditioning == SelfConditioning::Gated {
            let mut gate = vec![0u32; n * width];
            for (b, r) in reads.iter().enumerate() {
                let Some(sc) = r.conditioning else { continue };
                let (g, first) = self.arena.vocab_rows_of(b, width);
                for (i, &row) in sc.rows.iter().enumerate() {
                    gate[b * width + row] = 1;
                    let at = ((first + row) * v * 4) as u64;
                    q.write_buffer(&self.arena.sc_probs[g], at, bytemuck::cast_slice(&sc.logits[i * v..(i + 1) * v]));
                }
            }
            q.write_buffer(&self.arena.sc_gate, 0, bytemuck::cast_slice(&gate));
        }
        let start = self.seq_lens[slot];
        for b in 0..n {
            self.ensure_rope(start, width, b * width);
        }
        let shape = ForwardShape {
            canvases: vec![CanvasShape { slot, visible: self.slot_visible(slot) }; n],
            self_conditioning,
            width,
            head: Head::Rows(reads.iter().map(|r| r.head_rows.len()).collect()),
        };
        if !self.read_plans.plans.contains_key(&shape) {
            let plan = self.record_read(&shape)?;
            if self.read_plans.plans.len() >= MAX_PLANS {
                self.read_plans.plans.clear();
            }
            self.read_plans.plans.insert(shape.clone(), plan);
        }
        if self.read_plans.last.as_ref() != Some(&shape) {
            self.read_plans.last = Some(shape.clone());
        }
        let plan = &self.read_plans.plans[&shape];
        let bytes = (head_rows.len() * v * 4) as u64;
        debug_assert!(head_rows.len() <= c);
        submit_in_parts(&self.ctx, &[plan], self.ctx.tuning.submit_parts, "read forward", |enc| {
            enc.copy_buffer_to_buffer(&self.arena.logits[0], 0, &self.arena.staging, 0, bytes)
        })?;
        map_read_with(&self.ctx, &self.arena.staging, bytes, |data| bytemuck::cast_slice_mut::<f32, u8>(logits).copy_from_slice(data))
    }

    /// Checks a read forward's canvases against the model and `slot`'s cache; returns their width.
    fn check_reads(&self, slot: usize, reads: &[ReadCanvas<'_>], logits: &[f32]) -> Result<usize, GpuError> {
        let (c, v) = (self.config.canvas_length, self.config.text.vocab_size);
        let Some(first) = reads.first() else { return Err(GpuError::Empty) };
        let width = first.canvas.len();
        if width == 0 || width > c {
            return Err(GpuError::Length { what: "read canvas ids (1 to canvas_length)", got: width, expected: c });
        }
        if reads.len() > self.max_reads(width) {
            return Err(GpuError::Limit {
                what: format!("a read forward of {} canvases of {width}", reads.len()),
                needed: (reads.len() * width) as u64,
                limit: c as u64,
                limit_name: "the rows of a canvas forward (canvas_length)",
            });
        }
        match self.seq_lens.get(slot) {
            None => return Err(GpuError::Unsupported { what: format!("slot {slot} of a model of {} slots", self.seq_lens.len()) }),
            Some(0) => return Err(GpuError::NoContext),
            Some(_) if slot == 0 && self.uploaded_context => return Err(GpuError::NoContext),
            Some(_) => {}
        }
        let outside = |rows: &[usize]| rows.iter().any(|&r| r >= width);
        for r in reads {
            if r.canvas.len() != width {
                return Err(GpuError::Length {
                    what: "ids of a canvas of the read forward (one width)",
                    got: r.canvas.len(),
                    expected: width,
                });
            }
            if let Some((index, &id)) = r.canvas.iter().enumerate().find(|&(_, &id)| id as usize >= v) {
                return Err(GpuError::TokenOutOfRange { what: "read canvas", id, index, vocab: v });
            }
            if r.head_rows.is_empty() || outside(r.head_rows) {
                return Err(GpuError::Length { what: "head rows (each within the canvas)", got: r.head_rows.len(), expected: width });
            }
            if let Some(sc) = r.conditioning {
                if outside(sc.rows) {
                    return Err(GpuError::Length {
                        what: "self-conditioned rows (each within the canvas)",
                        got: sc.rows.len(),
                        expected: width,
                    });
                }
                if sc.logits.len() != sc.rows.len() * v {
                    return Err(GpuError::Length { what: "self-conditioning logits", got: sc.logits.len(), expected: sc.rows.len() * v });
                }
            }
        }
        let rows: usize = reads.iter().map(|r| r.head_rows.len()).sum();
        if logits.len() != rows * v {
            return Err(GpuError::Length { what: "logits buffer", got: logits.len(), expected: rows * v });
        }
        Ok(width)
    }

    fn record_read(&mut self, shape: &ForwardShape) -> Result<Plan, GpuError> {
        let mut rec = Recorder::new(&self.ctx, &mut self.pipelines);
        record_canvas_forward(&mut rec, &self.config, &self.weights, &self.arena, shape)?;
        rec.finish()
    }
}

/// Reads after one slot's cache (a server's generation keeps the other slots).
#[derive(Debug)]
pub struct SlotReader<'m> {
    pub model: &'m mut GpuModel,
    pub slot: usize,
}

impl ReadModel for SlotReader<'_> {
    type Error = GpuError;

    fn canvas_length(&self) -> usize {
        self.model.config.canvas_length
    }

    fn vocab_size(&self) -> usize {
        self.model.config.text.vocab_size
    }

    fn read_forward(&mut self, canvas: &[u32], sc: Option<Conditioning<'_>>, rows: &[usize], logits: &mut [f32]) -> Result<(), GpuError> {
        self.model.read_forwards(self.slot, &[ReadCanvas { canvas, conditioning: sc, head_rows: rows }], logits)
    }
}

impl BatchReadModel for SlotReader<'_> {
    fn max_reads(&self, width: usize) -> usize {
        self.model.max_reads(width)
    }

    fn read_forwards(&mut self, reads: &[ReadCanvas<'_>], logits: &mut [f32]) -> Result<(), GpuError> {
        self.model.read_forwards(self.slot, reads, logits)
    }
}

/// Reads after slot 0's cache (the single-sequence API's).
impl ReadModel for GpuModel {
    type Error = GpuError;

    fn canvas_length(&self) -> usize {
        self.config.canvas_length
    }

    fn vocab_size(&self) -> usize {
        self.config.text.vocab_size
    }

    fn read_forward(&mut self, canvas: &[u32], sc: Option<Conditioning<'_>>, rows: &[usize], logits: &mut [f32]) -> Result<(), GpuError> {
        SlotReader { model: self, slot: 0 }.read_forward(canvas, sc, rows, logits)
    }
}

impl BatchReadModel for GpuModel {
    fn max_reads(&self, width: usize) -> usize {
        GpuModel::max_reads(self, width)
    }

    fn read_forwards(&mut self, reads: &[ReadCanvas<'_>], logits: &mut [f32]) -> Result<(), GpuError> {
        GpuModel::read_forwards(self, 0, reads, logits)
    }
}

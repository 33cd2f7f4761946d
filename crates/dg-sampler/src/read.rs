//! Typed reads: a seeded canvas read in one forward (or a few), answers taken from the logits at
//! slot rows.
//!
//! Mirrors vLLM's structured generation mode (vllm-project/vllm PR #57250: a seed canvas, a canvas
//! length, pinned positions, a step cap, read-only) as OpenJev's `/v1/systemone` uses it: the answer
//! template is written into a canvas of width W ≤ `canvas_length`, each question's label position
//! (its slot) holds noise, and one bidirectional forward over `[prompt cache | canvas]` gives, at
//! each slot row, the temperature-1 log-probabilities of that question's labels. In transformers
//! terms a 1-step read is `model(input_ids=prompt, past_key_values=cache,
//! decoder_input_ids=seed_canvas).logits` at the slot rows.
//!
//! A read of `steps` > 1 first runs `steps − 1` denoising steps of the sampler ([`Sampler::step`]:
//! the temperature schedule over `steps`, a categorical draw, entropy-bound acceptance, renoising)
//! on the *free* rows only; pinned rows keep their seed ids throughout and get no
//! self-conditioning (`s = 0`, as on a block's first step). The last forward is the read.
//!
//! The read's canvas is never encoded into the cache: reads of one prompt can run one after another
//! (samples, re-reads, question groups) on the cache the prompt left. The model computes the head
//! only at the rows asked for ([`ReadModel::read_forward`]): a 1-step read costs K slot rows of
//! the `[rows, V]` head, not W.

use dg_model::GenerationConfig;

use crate::error::{InputError, ModelCall, SamplerError};
use crate::rng::RandomSource;
use crate::rows::{RowStat, process_rows};
use crate::sampler::{Sampler, check_ids};

/// How many of a slot's most likely tokens its entropy is taken over (OpenJev's `TOPK`: vLLM's
/// `top_logprobs` set at each slot row).
pub const TOP_K: usize = 20;

/// The self-conditioning input of a read forward: the previous step's temperature-scaled logits
/// at `rows` (`rows.len() × V`, row-major); every other row gets none (`s = 0`).
#[derive(Debug, Clone, Copy)]
pub struct Conditioning<'a> {
    pub rows: &'a [usize],
    pub logits: &'a [f32],
}

/// A model that can read a canvas: one forward of a canvas of width W ≤ `canvas_length` at the
/// positions after its cache, the head computed only at some rows. The cache is left as it was.
pub trait ReadModel {
    type Error: std::error::Error + Send + Sync + 'static;

    /// The model's `canvas_length`: the widest canvas a read may use.
    fn canvas_length(&self) -> usize;

    /// The vocabulary size V.
    fn vocab_size(&self) -> usize;

    /// One forward of `canvas` (W ids) with `conditioning` (none: no row is self-conditioned),
    /// writing the raw softcapped logits of `head_rows` (in that order, `head_rows.len() × V`)
    /// into `logits`. Row `r` of the result equals row `r` of a full forward's logits.
    fn read_forward(
        &mut self,
        canvas: &[u32],
        conditioning: Option<Conditioning<'_>>,
        head_rows: &[usize],
        logits: &mut [f32],
    ) -> Result<(), Self::Error>;
}

impl<M: ReadModel + ?Sized> ReadModel for &mut M {
    type Error = M::Error;
    fn canvas_length(&self) -> usize {
        (**self).canvas_length()
    }
    fn vocab_size(&self) -> usize {
        (**self).vocab_size()
    }
    fn read_forward(&mut self, c: &[u32], sc: Option<Conditioning<'_>>, rows: &[usize], logits: &mut [f32]) -> Result<(), Self::Error> {
        (**self).read_forward(c, sc, rows, logits)
    }
}

/// One question's answer position in the canvas and the ids of its labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    pub position: usize,
    pub labels: Vec<u32>,
}

/// What to read: the seed canvas (W ids), which rows are pinned (`None`: none), the step cap (1: the
/// read is the first forward) and the slots.
#[derive(Debug, Clone, Copy)]
pub struct ReadRequest<'a> {
    pub canvas: &'a [u32],
    pub pinned: Option<&'a [bool]>,
    pub steps: usize,
    pub slots: &'a [Slot],
}

/// The read of one slot.
#[derive(Debug, Clone, PartialEq)]
pub struct SlotRead {
    /// Temperature-1 log-probability of each label over the full vocabulary.
    pub label_logprobs: Vec<f32>,
    /// The labels' probabilities renormalised over the labels (they sum to 1).
    pub probabilities: Vec<f32>,
    /// The row's [`TOP_K`] most likely tokens and their log-probabilities, most likely first
    /// (ties: lower id first).
    pub top: Vec<(u32, f32)>,
    /// Entropy (nats) of the top tokens' probabilities, unrenormalised (`−Σ p·ln p` over `top`):
    /// OpenJev's re-read criterion.
    pub top_entropy: f32,
    /// First index of the row's maximum over the full vocabulary.
    pub argmax: u32,
}

/// The result of a read: one [`SlotRead`] per slot, the canvas the last forward read (the seed
/// where pinned; the free rows after `steps − 1` steps), and that forward's raw logits at the slot
/// rows (`slots × V`).
#[derive(Debug, Clone, PartialEq)]
pub struct Read {
    pub slots: Vec<SlotRead>,
    pub canvas: Vec<u32>,
    pub logits: Vec<f32>,
}

/// Checks a read request against the model's canvas length and vocabulary.
pub fn validate_read(request: &ReadRequest<'_>, canvas_length: usize, vocab_size: usize) -> Result<(), InputError> {
    let w = request.canvas.len();
    let bad = |m: String| Err(InputError::Shape(m));
    if w == 0 || w > canvas_length {
        return bad(format!("the read canvas has {w} ids; it must have 1 to canvas_length ({canvas_length})"));
    }
    check_ids("seed canvas", request.canvas, vocab_size)?;
    if let Some(p) = request.pinned
        && p.len() != w
    {
        return bad(format!("the pin mask has {} entries for a canvas of {w}", p.len()));
    }
    if request.steps == 0 {
        return bad("a read takes at least 1 step".into());
    }
    if request.slots.is_empty() {
        return bad("a read needs at least one slot".into());
    }
    for (i, s) in request.slots.iter().enumerate() {
        if s.position >= w {
            return bad(format!("slot {i} is at position {}, past the canvas of {w}", s.position));
        }
        if s.labels.is_empty() {
            return bad(format!("slot {i} has no labels"));
        }
        check_ids("label", &s.labels, vocab_size)?;
    }
    Ok(())
}

/// Reads `request` on `model` (whose cache holds the prompt). The intermediate steps (`steps` > 1)
/// follow `cfg`'s temperature schedule and entropy bound over `steps` steps, without adaptive
/// stopping, drawing from `rng`; a 1-step read draws nothing.
pub fn read<M: ReadModel + ?Sized, R: RandomSource + ?Sized>(
    model: &mut M,
    request: &ReadRequest<'_>,
    cfg: &GenerationConfig,
    rng: &mut R,
) -> Result<Read, SamplerError<M::Error>> {
    let (v, c) = (model.vocab_size(), model.canvas_length());
    validate_read(request, c, v)?;
    let forward_error = |step: usize| move |source| SamplerError::Model { block: 0, call: ModelCall::CanvasForward { step }, source };
    let mut canvas = request.canvas.to_vec();
    let free: Vec<usize> = (0..canvas.len()).filter(|&r| !request.pinned.is_some_and(|p| p[r])).collect();
    let mut sampler = None;
    if request.steps > 1 && !free.is_empty() {
        let steps_cfg = GenerationConfig { max_denoising_steps: request.steps, stopping: None, ..cfg.clone() };
        let s = sampler.insert(Sampler::new(free.len(), v)?);
        let ids: Vec<u32> = free.iter().map(|&r| canvas[r]).collect();
        s.set_canvas(&ids)?;
        for step in 0..request.steps - 1 {
            let (ids, sc, logits) = s.forward_buffers();
            for (&r, &id) in free.iter().zip(ids) {
                canvas[r] = id;
            }
            let conditioning = sc.map(|logits| Conditioning { rows: &free, logits });
            model.read_forward(&canvas, conditioning, &free, logits).map_err(forward_error(step))?;
            s.step(&steps_cfg, request.steps - step, rng, 0).map_err(SamplerError::with_model_error)?;
        }
        for (&r, &id) in free.iter().zip(s.canvas()) {
            canvas[r] = id;
        }
    }
    let head_rows: Vec<usize> = request.slots.iter().map(|s| s.position).collect();
    let mut logits = vec![0f32; head_rows.len() * v];
    let conditioning = sampler.as_ref().and_then(Sampler::self_conditioning).map(|logits| Conditioning { rows: &free, logits });
    model.read_forward(&canvas, conditioning, &head_rows, &mut logits).map_err(forward_error(request.steps - 1))?;
    let slots = read_slots(&mut logits, v, request.slots, request.steps - 1)?;
    Ok(Read { slots, canvas, logits })
}

/// The slots' reads from their rows' raw logits (`slots.len() × V`; left as they are: the
/// temperature is 1). `step` labels a non-finite logit.
pub fn read_slots(logits: &mut [f32], vocab_size: usize, slots: &[Slot], step: usize) -> Result<Vec<SlotRead>, InputError> {
    let mut stats = vec![RowStat::default(); slots.len()];
    process_rows(logits, vocab_size, 1.0, &mut stats).map_err(|nf| InputError::NonFiniteLogit {
        block: 0,
        step,
        row: slots[nf.row].position,
        column: nf.column,
        value: nf.value,
        temperature: 1.0,
    })?;
    let reads = logits
        .chunks_exact(vocab_size)
        .zip(&stats)
        .zip(slots)
        .map(|((row, stat), slot)| {
            let ln_sum = f64::from(stat.sum).ln();
            let logprob = |id: u32| (f64::from(row[id as usize] - stat.max) - ln_sum) as f32;
            let label_logprobs: Vec<f32> = slot.labels.iter().map(|&id| logprob(id)).collect();
            let top = top_tokens(row).into_iter().map(|id| (id, logprob(id))).collect::<Vec<_>>();
            let top_entropy = -top.iter().map(|&(_, lp)| f64::from(lp).exp() * f64::from(lp)).sum::<f64>();
            SlotRead {
                probabilities: renormalise(&label_logprobs),
                label_logprobs,
                top,
                top_entropy: top_entropy as f32,
                argmax: stat.argmax,
            }
        })
        .collect();
    Ok(reads)
}

/// `softmax` of the labels' log-probabilities: their probabilities given that one of them is read.
fn renormalise(logprobs: &[f32]) -> Vec<f32> {
    let max = logprobs.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let e: Vec<f64> = logprobs.iter().map(|&lp| f64::from(lp - max).exp()).collect();
    let z: f64 = e.iter().sum();
    e.iter().map(|&x| (x / z) as f32).collect()
}

/// The ids of the row's [`TOP_K`] largest values, largest first, lower id first among equals.
fn top_tokens(row: &[f32]) -> Vec<u32> {
    let mut top: Vec<u32> = Vec::with_capacity(TOP_K + 1);
    let better = |a: u32, b: u32| row[a as usize] > row[b as usize] || (row[a as usize] == row[b as usize] && a < b);
    for id in 0..row.len() as u32 {
        if top.len() == TOP_K && !better(id, top[TOP_K - 1]) {
            continue;
        }
        let at = top.iter().position(|&t| better(id, t)).unwrap_or(top.len());
        top.insert(at, id);
        top.truncate(TOP_K);
    }
    top
}

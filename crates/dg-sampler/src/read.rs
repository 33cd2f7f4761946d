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

/// One canvas of a batched read forward ([`BatchReadModel::read_forwards`]): its ids, its
/// self-conditioning, the rows its head is computed at.
#[derive(Debug, Clone, Copy)]
pub struct ReadCanvas<'a> {
    pub canvas: &'a [u32],
    pub conditioning: Option<Conditioning<'a>>,
    pub head_rows: &'a [usize],
}

/// A [`ReadModel`] that reads several canvases of one width after its one cache in one forward
/// (a prompt's samples, re-reads and question groups: every weight read once for all).
pub trait BatchReadModel: ReadModel {
    /// Canvases of `width` ids one [`Self::read_forwards`] takes at most (at least 1).
    fn max_reads(&self, width: usize) -> usize;

    /// [`ReadModel::read_forward`] of each of `reads` (one width), their logits one canvas after
    /// another in `logits` (`Σ head_rows × V`); each canvas's equal those of its forward alone.
    fn read_forwards(&mut self, reads: &[ReadCanvas<'_>], logits: &mut [f32]) -> Result<(), Self::Error>;
}

/// A read in progress: its canvas, its free rows, and (for `steps` > 1) the sampler denoising them.
struct Reading<'r> {
    request: &'r ReadRequest<'r>,
    canvas: Vec<u32>,
    free: Vec<usize>,
    slot_rows: Vec<usize>,
    sampler: Option<(Sampler, GenerationConfig)>,
    /// Forwards run so far.
    step: usize,
}

impl<'r> Reading<'r> {
    fn new(request: &'r ReadRequest<'r>, (canvas_length, v): (usize, usize), cfg: &GenerationConfig) -> Result<Self, InputError> {
        validate_read(request, canvas_length, v)?;
        let canvas = request.canvas.to_vec();
        let free: Vec<usize> = (0..canvas.len()).filter(|&r| !request.pinned.is_some_and(|p| p[r])).collect();
        let mut sampler = None;
        if request.steps > 1 && !free.is_empty() {
            let steps_cfg = GenerationConfig { max_denoising_steps: request.steps, stopping: None, ..cfg.clone() };
            let mut s = Sampler::new(free.len(), v)?;
            s.set_canvas(&free.iter().map(|&r| canvas[r]).collect::<Vec<_>>())?;
            sampler = Some((s, steps_cfg));
        }
        let slot_rows = request.slots.iter().map(|s| s.position).collect();
        Ok(Reading { request, canvas, free, slot_rows, sampler, step: 0 })
    }

    /// Whether the next forward is the read (the last): else a step of the free rows.
    fn reads_next(&self) -> bool {
        self.sampler.is_none() || self.step + 1 >= self.request.steps
    }

    /// The next forward's canvas.
    fn next(&self) -> ReadCanvas<'_> {
        let conditioning =
            self.sampler.as_ref().and_then(|(s, _)| s.self_conditioning()).map(|logits| Conditioning { rows: &self.free, logits });
        let head_rows = if self.reads_next() { &self.slot_rows } else { &self.free };
        ReadCanvas { canvas: &self.canvas, conditioning, head_rows }
    }

    /// Takes the next forward's logits (its head rows' raw logits): a step of the free rows, or
    /// the read.
    fn advance<R: RandomSource + ?Sized>(&mut self, logits: &mut [f32], v: usize, rng: &mut R) -> Result<Option<Read>, SamplerError> {
        if self.reads_next() {
            let slots = read_slots(logits, v, self.request.slots, self.request.steps - 1)?;
            return Ok(Some(Read { slots, canvas: std::mem::take(&mut self.canvas), logits: logits.to_vec() }));
        }
        let (s, steps_cfg) = self.sampler.as_mut().expect("a step needs the sampler");
        s.logits_mut().copy_from_slice(logits);
        s.step(steps_cfg, self.request.steps - self.step, rng, 0)?;
        for (&r, &id) in self.free.iter().zip(s.canvas()) {
            self.canvas[r] = id;
        }
        self.step += 1;
        Ok(None)
    }
}

/// The error of a read's forward at `step`.
fn forward_error<E: std::error::Error + 'static>(step: usize) -> impl FnOnce(E) -> SamplerError<E> {
    move |source| SamplerError::Model { block: 0, call: ModelCall::CanvasForward { step }, source }
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
    let v = model.vocab_size();
    let mut reading = Reading::new(request, (model.canvas_length(), v), cfg)?;
    loop {
        let next = reading.next();
        let mut logits = vec![0f32; next.head_rows.len() * v];
        model.read_forward(next.canvas, next.conditioning, next.head_rows, &mut logits).map_err(forward_error(reading.step))?;
        if let Some(done) = reading.advance(&mut logits, v, rng).map_err(SamplerError::with_model_error)? {
            return Ok(done);
        }
    }
}

/// Reads `requests` on `model` (whose cache holds their one prompt), read `i` drawing from
/// `rngs[i]`: each forward runs the next forward of every read not done whose canvas has the
/// width of the first's, as many at once as [`BatchReadModel::max_reads`] allows. Each read is
/// what [`read`] gives alone on a model whose batched forward gives each canvas the logits of
/// its forward alone.
pub fn read_batch<M: BatchReadModel + ?Sized, R: RandomSource>(
    model: &mut M,
    requests: &[ReadRequest<'_>],
    cfg: &GenerationConfig,
    rngs: &mut [R],
) -> Result<Vec<Read>, SamplerError<M::Error>> {
    if rngs.len() != requests.len() {
        return Err(InputError::Shape(format!("{} random sources for {} reads", rngs.len(), requests.len())).into());
    }
    let v = model.vocab_size();
    let mut readings = requests.iter().map(|r| Reading::new(r, (model.canvas_length(), v), cfg)).collect::<Result<Vec<_>, _>>()?;
    let mut done: Vec<Option<Read>> = vec![None; requests.len()];
    let mut logits = Vec::new();
    while let Some(first) = done.iter().position(Option::is_none) {
        let width = readings[first].canvas.len();
        let batch: Vec<usize> = (first..requests.len())
            .filter(|&i| done[i].is_none() && readings[i].canvas.len() == width)
            .take(model.max_reads(width).max(1))
            .collect();
        let canvases: Vec<ReadCanvas<'_>> = batch.iter().map(|&i| readings[i].next()).collect();
        let rows: Vec<usize> = canvases.iter().map(|c| c.head_rows.len()).collect();
        logits.resize(rows.iter().sum::<usize>() * v, 0.0);
        model.read_forwards(&canvases, &mut logits).map_err(forward_error(readings[first].step))?;
        let mut at = 0;
        for (&i, rows) in batch.iter().zip(rows) {
            let mine = &mut logits[at * v..(at + rows) * v];
            at += rows;
            done[i] = readings[i].advance(mine, v, &mut rngs[i]).map_err(SamplerError::with_model_error)?;
        }
    }
    Ok(done.into_iter().map(|r| r.expect("every read is done")).collect())
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

//! Where two generations part, and whether the logits error explains it.
//!
//! [`record`] runs `dg_sampler::generate` (the host-logits path) on a backend and keeps every
//! step: the draft (argmax), the categorical samples and the uniforms they were drawn with, the
//! entropies and their mean, the acceptance mask, the renoised canvas, the stop decision and the
//! temperature-scaled logits. [`first_divergence`] walks two such recordings in step order and
//! returns the first decision that differs, checked in this order within a step: the draft at
//! each position, the sample at each position, the acceptance mask, the renoised canvas, the stop
//! decision; then the shape of the runs (a block with another number of steps, a missing block,
//! an error on one side) and the final sequences.
//!
//! Up to the first differing decision both runs fed their model the same tokens and consumed the
//! same draws, so the only difference between them at that step is the logits: those of the step
//! itself, and through self-conditioning those of the steps before it. The divergence is
//! *explained* when both of these hold:
//!
//! 1. **The measured error reaches the decision.** The reference decided with some margin; the
//!    error measured at that step must be large enough to move the decision across it:
//!    - *Argmax* at position p: the margin is the reference's top-2 gap of row p of the scaled
//!      logits, the error `err_p` is max |Δ| over that row; explained iff `gap ≤ 2·err_p` (each
//!      of the two logits can move by at most `err_p`, towards each other).
//!    - *Sample* at p: both runs draw row p by inverse CDF with the same uniform u (recorded with
//!      the samples; a source that hands out ids, such as a replay, gives both runs the same ids,
//!      so their samples cannot differ through the logits). The reference's sample a is the
//!      first index whose CDF exceeds u, so u lies in `[F_ref(a−1), F_ref(a))`. For ours to pick
//!      b > a, `F_ours(a) ≤ u`; for b < a, `F_ours(b) > u ≥ F_ref(b)`. The margin is therefore u's
//!      distance to the edge of the reference's interval on the side ours left it by, and the
//!      error is the Kolmogorov distance `max_k |F_ours(k) − F_ref(k)|` of the two rows'
//!      softmax CDFs; explained iff `margin ≤ error`. The total-variation distance of the two rows
//!      (an upper bound of the Kolmogorov distance) is reported too. Different uniforms on the two
//!      sides mean different draws: never explained.
//!    - *Acceptance* at p (the first position, in canvas order, whose acceptance differs): with
//!      `δ_q = |H_ours,q − H_ref,q|` the per-position entropy errors, a flip needs one of two
//!      things. Either the positions ranked before p (in the sampler's order, by entropy then
//!      position) are the same in both runs, so the exclusive prefix sums at p differ only by
//!      those positions' entropy errors, and the reference's prefix lies within
//!      `Σ_{q ranked before p in either run} δ_q` of the entropy bound; or some position q is
//!      ranked before p in one run and after it in the other, which needs
//!      `|H_ref,p − H_ref,q| ≤ δ_p + δ_q`. Explained iff either holds (the report names the one
//!      that did).
//!    - *Stop*: stability depends on the drafts alone (compared first, at this step and every
//!      earlier one), so a differing stop decision is a differing confidence, `mean H < threshold`.
//!      Explained iff `|reference mean entropy − threshold| ≤ mean_q δ_q` (the mean entropy can
//!      move by at most the mean of the entropy errors).
//!
//!    The sums above carry a few f32 ulps of slack for the sampler's own rounding of prefix
//!    sums and means. For recordings that follow the sampler's arithmetic, condition 1 holds
//!    whenever the decisions do differ (each inequality is what a flip implies): its job is to
//!    attribute the divergence to the logits. A decision that differs although the measured
//!    error cannot reach it (different draws, a sampler that decided otherwise on the same
//!    numbers, recordings of different runs) is not explained.
//! 2. **The error is within the path's tolerance.** The normwise relative error ‖Δ‖/‖ref‖ of the
//!    step's scaled logits (all C·V of them; dividing both sides by the same temperature leaves
//!    it unchanged) must not exceed the `allowed_error` the caller passes, the logits tolerance
//!    of the path under test. A divergence that comes from a logits error above the tolerance is
//!    never explained, however close the decision was. The error at a later step includes what
//!    self-conditioning carried over from the earlier steps of the block, so it can sit a little
//!    above the single-forward error the tolerance was measured with.
//!
//! A renoised canvas that differs while samples and acceptance agree (the two runs drew different
//! noise) and every difference in the shape or outcome of the runs ([`DivergenceKind::Length`])
//! are never explained: no logits error produces them without an earlier differing decision.
//!
//! A recording keeps C·V scaled logits per step: meant for test-size models.

use std::fmt;

use dg_model::GenerationConfig;
use dg_sampler::{CategoricalRequest, DenoiseModel, DrawError, Hooks, RandomSource, RowDistributions, StepInfo, StopDecision, generate};

use crate::checks::Backend;
use crate::compare::compare;
use crate::replay::{AsModel, BackendFailure};

/// One step of a recorded generation.
#[derive(Debug, Clone, PartialEq)]
pub struct StepRecord {
    pub block: usize,
    /// 0-based step within the block.
    pub step: usize,
    pub temperature: f32,
    /// Argmax of the scaled logits, one per canvas position.
    pub draft: Vec<u32>,
    /// The categorical samples.
    pub sampled: Vec<u32>,
    /// The uniform each row's sample was drawn with (empty when the random source handed out ids).
    pub uniforms: Vec<f64>,
    pub entropies: Vec<f32>,
    pub mean_entropy: f32,
    pub accepted: Vec<bool>,
    /// The canvas the next step decodes.
    pub canvas: Vec<u32>,
    /// What this step's forward was given: the canvas it decoded and its self-conditioning input
    /// (C·V scaled logits of the previous step; empty on a block's first step).
    pub input_canvas: Vec<u32>,
    pub input_sc: Vec<f32>,
    /// Temperature-scaled logits, C·V row-major (empty when the logits stayed in the model).
    pub scaled_logits: Vec<f32>,
    /// `None` when adaptive stopping is off.
    pub stop: Option<StopDecision>,
    pub finished: bool,
}

/// A hook that records every step of a generation (for `generate`; a resident generation's steps
/// come without their logits).
#[derive(Debug, Default)]
pub struct StepRecorder {
    pub steps: Vec<StepRecord>,
}

impl Hooks for StepRecorder {
    fn on_step(&mut self, info: &StepInfo<'_>) {
        self.steps.push(StepRecord {
            block: info.block,
            step: info.step,
            temperature: info.temperature,
            draft: info.draft.to_vec(),
            sampled: info.sampled.to_vec(),
            uniforms: Vec::new(),
            entropies: info.entropies.to_vec(),
            mean_entropy: info.mean_entropy,
            accepted: info.accepted.to_vec(),
            canvas: info.canvas.to_vec(),
            input_canvas: Vec::new(),
            input_sc: Vec::new(),
            scaled_logits: info.scaled_logits.to_vec(),
            stop: info.stop,
            finished: info.finished,
        });
    }
}

/// A recorded generation: its steps, the sampler parameters the explanations need, and how it
/// ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Recording {
    /// B, the acceptance budget (nats).
    pub entropy_bound: f32,
    /// The stopping criterion's confidence threshold; `None` when adaptive stopping is off.
    pub confidence_threshold: Option<f32>,
    /// Every step that completed, in order (also when the generation then failed).
    pub steps: Vec<StepRecord>,
    /// The final sequence (prompt and canvases), or the error the generation ended with.
    pub outcome: Result<Vec<u32>, String>,
}

/// A random source that passes the categorical draw's uniforms on to the sampler and keeps them.
struct UniformRecorder<'a> {
    inner: &'a mut dyn RandomSource,
    /// One entry per categorical draw (empty when the source handed out ids).
    draws: Vec<Vec<f64>>,
}

impl RandomSource for UniformRecorder<'_> {
    fn uniform_tokens(&mut self, vocab_size: usize, out: &mut [u32]) -> Result<(), DrawError> {
        self.inner.uniform_tokens(vocab_size, out)
    }

    /// Asks the source for the draw's inputs (the same randomness its own `categorical` consumes)
    /// and samples the rows as that would: inverse CDF with one uniform per row.
    fn categorical(&mut self, dists: &RowDistributions<'_>, out: &mut [u32]) -> Result<(), DrawError> {
        if out.len() != dists.rows() {
            return Err(DrawError::RowCount { expected: dists.rows(), got: out.len() });
        }
        match self.inner.categorical_request(dists.rows(), dists.vocab_size())? {
            CategoricalRequest::Uniforms(uniforms) => {
                for (row, (o, &u)) in out.iter_mut().zip(uniforms).enumerate() {
                    *o = dists.sample(row, u);
                }
                self.draws.push(uniforms.to_vec());
            }
            CategoricalRequest::Ids(ids) => {
                out.copy_from_slice(ids);
                self.draws.push(Vec::new());
            }
        }
        Ok(())
    }

    fn categorical_request(&mut self, rows: usize, vocab_size: usize) -> Result<CategoricalRequest<'_>, DrawError> {
        self.inner.categorical_request(rows, vocab_size)
    }

    fn finish(&mut self) -> Result<(), DrawError> {
        self.inner.finish()
    }
}

/// Resets `backend` and runs `dg_sampler::generate` on it, recording every step. A failure (of
/// the reset, the model or the sampler) ends the recording with the error; the steps before it are
/// kept.
pub fn record(
    backend: &mut dyn Backend,
    prompt: &[u32],
    cfg: &GenerationConfig,
    canvas_len: usize,
    vocab: usize,
    rng: &mut dyn RandomSource,
) -> Recording {
    let mut recorder = StepRecorder::default();
    let mut draws = UniformRecorder { inner: rng, draws: Vec::new() };
    let mut inputs = Vec::new();
    let outcome = match backend.reset() {
        Err(e) => Err(format!("reset: {e}")),
        Ok(()) => generate(
            &mut InputRecorder { inner: AsModel(backend), inputs: &mut inputs },
            prompt,
            cfg,
            canvas_len,
            vocab,
            &mut draws,
            &mut recorder,
        )
        .map(|g| g.sequence)
        .map_err(|e| error_chain(&e)),
    };
    // One categorical draw and one forward per step, made before the step's hook ran.
    let mut steps = recorder.steps;
    for (step, uniforms) in steps.iter_mut().zip(draws.draws) {
        step.uniforms = uniforms;
    }
    for (step, (canvas, sc)) in steps.iter_mut().zip(inputs) {
        step.input_canvas = canvas;
        step.input_sc = sc;
    }
    Recording {
        entropy_bound: cfg.entropy_bound,
        confidence_threshold: cfg.stopping.as_ref().map(|s| s.confidence_threshold),
        steps,
        outcome,
    }
}

/// A model that keeps each forward's inputs (the canvas and the self-conditioning logits).
struct InputRecorder<'a, 'b> {
    inner: AsModel<'b>,
    inputs: &'a mut Vec<(Vec<u32>, Vec<f32>)>,
}

impl DenoiseModel for InputRecorder<'_, '_> {
    type Error = BackendFailure;

    fn encode(&mut self, ids: &[u32]) -> Result<(), Self::Error> {
        self.inner.encode(ids)
    }

    fn canvas_forward(&mut self, canvas: &[u32], sc: Option<&[f32]>, logits: &mut [f32]) -> Result<(), Self::Error> {
        self.inputs.push((canvas.to_vec(), sc.map(<[f32]>::to_vec).unwrap_or_default()));
        self.inner.canvas_forward(canvas, sc, logits)
    }
}

/// An error and its sources, one line.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text = format!("{text}: {s}");
        source = s.source();
    }
    text
}

/// Which decision differs first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DivergenceKind {
    /// The draft (argmax of the scaled logits) at a position.
    Argmax,
    /// The categorical sample at a position.
    Sample,
    /// Whether a position was accepted.
    Acceptance,
    /// The renoised canvas at a position, while samples and acceptance agree: different noise draws.
    Noise,
    /// The stop decision after the step.
    Stop,
    /// The runs' shape or outcome: the number of steps of a block or of blocks, an error on one
    /// side, or the final sequences.
    Length,
}

impl fmt::Display for DivergenceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DivergenceKind::Argmax => "argmax",
            DivergenceKind::Sample => "sample",
            DivergenceKind::Acceptance => "acceptance",
            DivergenceKind::Noise => "noise",
            DivergenceKind::Stop => "stop",
            DivergenceKind::Length => "length",
        })
    }
}

/// One side's value of the decision that differs.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    Token(u32),
    Accepted(bool),
    Stop(Option<StopDecision>),
    /// The run is at this step (where the other is at another one, or has ended).
    At {
        block: usize,
        step: usize,
    },
    /// The run has ended: its sequence length, or its error.
    Ended(Result<usize, String>),
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Decision::Token(t) => write!(f, "token {t}"),
            Decision::Accepted(a) => f.write_str(if *a { "accepted" } else { "rejected" }),
            Decision::Stop(None) => f.write_str("no stopping"),
            Decision::Stop(Some(s)) => write!(
                f,
                "{} ({}, {})",
                if s.finished() { "stop" } else { "go on" },
                if s.stable { "stable" } else { "unstable" },
                if s.confident { "confident" } else { "unconfident" }
            ),
            Decision::At { block, step } => write!(f, "at block {block} step {step}"),
            Decision::Ended(Ok(len)) => write!(f, "ended with {len} tokens"),
            Decision::Ended(Err(e)) => write!(f, "ended with error: {e}"),
        }
    }
}

/// The first decision two recorded generations make differently, with the error measured there and
/// whether it explains the difference (see the module docs for the rules).
#[derive(Debug, Clone, PartialEq)]
pub struct Divergence {
    pub block: usize,
    pub step: usize,
    /// Canvas position (a sequence index for a differing final sequence); `None` for a stop
    /// decision or a difference in the runs' shape.
    pub position: Option<usize>,
    pub kind: DivergenceKind,
    pub ours: Decision,
    pub reference: Decision,
    /// max |Δ| of the step's scaled logits over the row at `position`.
    pub row_max_abs: Option<f64>,
    /// ‖Δ‖₂ / ‖ref‖₂ over the whole step's scaled logits.
    pub normwise: Option<f64>,
    /// The reference's decision margin, in the units of the kind (logits, probability, nats);
    /// `None` where no logits error can move the decision.
    pub margin: Option<f64>,
    /// How far the measured error can move that decision, same units.
    pub reach: Option<f64>,
    /// What `margin` and `reach` are, and any further measurement (TV distance, the swapped pair).
    pub detail: String,
    /// The caller's normwise logits tolerance.
    pub allowed_error: f64,
    pub explained: bool,
}

impl fmt::Display for Divergence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} differs at block {} step {}", self.kind, self.block, self.step)?;
        if let Some(p) = self.position {
            write!(f, " position {p}")?;
        }
        write!(f, ": ours {}, reference {}", self.ours, self.reference)?;
        match (self.margin, self.reach) {
            (Some(m), Some(r)) => write!(f, "; reference margin {m:.3e} {} error reach {r:.3e}", if m <= r { "≤" } else { ">" })?,
            (Some(m), None) => write!(f, "; reference margin {m:.3e}, error reach unknown")?,
            _ => {}
        }
        if !self.detail.is_empty() {
            write!(f, " ({})", self.detail)?;
        }
        if let Some(e) = self.row_max_abs {
            write!(f, "; row max|Δ| {e:.3e}")?;
        }
        match self.normwise {
            Some(n) => {
                write!(f, "; step normwise {n:.3e} {} allowed {:.1e}", if n <= self.allowed_error { "≤" } else { ">" }, self.allowed_error)?
            }
            None => write!(f, "; step normwise unknown")?,
        }
        f.write_str(if self.explained { ": explained" } else { ": NOT explained" })
    }
}

/// The first divergence of `ours` from `reference` (rows of `vocab` logits), or `None` when every
/// recorded decision and the outcome agree. `allowed_error` is the normwise logits tolerance of
/// the path that produced `ours`: no divergence at a step whose error exceeds it is explained.
pub fn first_divergence(ours: &Recording, reference: &Recording, vocab: usize, allowed_error: f64) -> Option<Divergence> {
    let base = |block, step, position, kind, ours, reference| Divergence {
        block,
        step,
        position,
        kind,
        ours,
        reference,
        row_max_abs: None,
        normwise: None,
        margin: None,
        reach: None,
        detail: String::new(),
        allowed_error,
        explained: false,
    };
    for (o, r) in ours.steps.iter().zip(&reference.steps) {
        if (o.block, o.step) != (r.block, r.step) {
            return Some(base(
                r.block,
                r.step,
                None,
                DivergenceKind::Length,
                Decision::At { block: o.block, step: o.step },
                Decision::At { block: r.block, step: r.step },
            ));
        }
        if let Some(d) = step_divergence(o, r, ours, reference, vocab, allowed_error) {
            return Some(d);
        }
    }
    let ended = |rec: &Recording| Decision::Ended(rec.outcome.as_ref().map(Vec::len).map_err(Clone::clone));
    let (no, nr) = (ours.steps.len(), reference.steps.len());
    if no != nr {
        let at = |s: &StepRecord| Decision::At { block: s.block, step: s.step };
        let (ours_at, ref_at, here) = if no < nr {
            (ended(ours), at(&reference.steps[no]), &reference.steps[no])
        } else {
            (at(&ours.steps[nr]), ended(reference), &ours.steps[nr])
        };
        return Some(base(here.block, here.step, None, DivergenceKind::Length, ours_at, ref_at));
    }
    let (block, step) = reference.steps.last().map_or((0, 0), |s| (s.block, s.step));
    match (&ours.outcome, &reference.outcome) {
        (Ok(a), Ok(b)) if a != b => {
            let i = a.iter().zip(b).position(|(x, y)| x != y);
            Some(match i {
                Some(i) => base(block, step, Some(i), DivergenceKind::Length, Decision::Token(a[i]), Decision::Token(b[i])),
                None => base(block, step, None, DivergenceKind::Length, ended(ours), ended(reference)),
            })
        }
        (Ok(_), Ok(_)) => None,
        (Err(a), Err(b)) if a == b => None,
        _ => Some(base(block, step, None, DivergenceKind::Length, ended(ours), ended(reference))),
    }
}

/// Slack for the f32 rounding of a sum of non-negative terms totalling `total` (a few ulps).
fn rounding_slack(total: f64) -> f64 {
    4.0 * f64::from(f32::EPSILON) * total
}

/// The first differing decision of one step both runs made, with its explanation.
fn step_divergence(
    o: &StepRecord,
    r: &StepRecord,
    ours: &Recording,
    reference: &Recording,
    vocab: usize,
    allowed_error: f64,
) -> Option<Divergence> {
    let c = r.draft.len();
    let logits_ok = vocab > 0 && o.scaled_logits.len() == c * vocab && r.scaled_logits.len() == c * vocab;
    let normwise = logits_ok.then(|| compare(&o.scaled_logits, &r.scaled_logits, vocab, f32::INFINITY).normwise);
    let row_max_abs = |p: usize| {
        logits_ok
            .then(|| row(o, p, vocab).iter().zip(row(r, p, vocab)).map(|(&a, &b)| (f64::from(a) - f64::from(b)).abs()).fold(0.0, f64::max))
    };
    let within_tolerance = normwise.is_some_and(|n| n <= allowed_error);
    let mut d = Divergence {
        block: r.block,
        step: r.step,
        position: None,
        kind: DivergenceKind::Length,
        ours: Decision::At { block: o.block, step: o.step },
        reference: Decision::At { block: r.block, step: r.step },
        row_max_abs: None,
        normwise,
        margin: None,
        reach: None,
        detail: String::new(),
        allowed_error,
        explained: false,
    };
    if o.draft.len() != c || o.sampled.len() != c || o.accepted.len() != c || o.canvas.len() != c {
        d.detail = format!("canvas lengths differ: ours {}, reference {c}", o.draft.len());
        return Some(d);
    }

    if let Some(p) = (0..c).find(|&p| o.draft[p] != r.draft[p]) {
        d.kind = DivergenceKind::Argmax;
        d.position = Some(p);
        (d.ours, d.reference) = (Decision::Token(o.draft[p]), Decision::Token(r.draft[p]));
        d.row_max_abs = row_max_abs(p);
        if logits_ok {
            let gap = top2_gap(row(r, p, vocab));
            let reach = 2.0 * d.row_max_abs.unwrap_or(0.0);
            (d.margin, d.reach) = (Some(gap), Some(reach));
            d.detail = "margin: the reference's top-2 gap of the row; reach: 2·max|Δ| of the row".into();
            d.explained = gap <= reach && within_tolerance;
        }
        return Some(d);
    }

    if let Some(p) = (0..c).find(|&p| o.sampled[p] != r.sampled[p]) {
        d.kind = DivergenceKind::Sample;
        d.position = Some(p);
        (d.ours, d.reference) = (Decision::Token(o.sampled[p]), Decision::Token(r.sampled[p]));
        d.row_max_abs = row_max_abs(p);
        let (uo, ur) = (o.uniforms.get(p), r.uniforms.get(p));
        match (uo, ur) {
            _ if !logits_ok => d.detail = "no logits recorded".into(),
            (Some(&uo), Some(&ur)) if uo == ur => {
                let sample = sample_explanation(row(o, p, vocab), row(r, p, vocab), ur, o.sampled[p], r.sampled[p]);
                d.margin = sample.margin;
                d.reach = Some(sample.kolmogorov);
                d.detail = format!(
                    "uniform {ur:.6}; margin: its distance to the reference's CDF step; reach: max CDF difference of the row; TV distance {:.3e}{}",
                    sample.total_variation,
                    if sample.margin.is_none() { "; the reference's sample does not follow from its row and uniform" } else { "" }
                );
                d.explained = sample.margin.is_some_and(|m| m <= sample.kolmogorov + 1e-9) && within_tolerance;
            }
            (Some(uo), Some(ur)) => d.detail = format!("different draws: uniforms {uo} and {ur}"),
            _ => d.detail = "no uniforms recorded (the draws handed out ids)".into(),
        }
        return Some(d);
    }

    if let Some(p) = (0..c).find(|&p| o.accepted[p] != r.accepted[p]) {
        d.kind = DivergenceKind::Acceptance;
        d.position = Some(p);
        (d.ours, d.reference) = (Decision::Accepted(o.accepted[p]), Decision::Accepted(r.accepted[p]));
        d.row_max_abs = row_max_abs(p);
        if o.entropies.len() == c && r.entropies.len() == c {
            let (margin_ok, margin, reach, detail) =
                acceptance_explanation(&o.entropies, &r.entropies, p, reference.entropy_bound, ours.entropy_bound);
            (d.margin, d.reach, d.detail) = (Some(margin), Some(reach), detail);
            d.explained = margin_ok && within_tolerance;
        } else {
            d.detail = "no entropies recorded".into();
        }
        return Some(d);
    }

    if let Some(p) = (0..c).find(|&p| o.canvas[p] != r.canvas[p]) {
        d.kind = DivergenceKind::Noise;
        d.position = Some(p);
        (d.ours, d.reference) = (Decision::Token(o.canvas[p]), Decision::Token(r.canvas[p]));
        d.row_max_abs = row_max_abs(p);
        d.detail = "samples and acceptance agree: the runs drew different noise".into();
        return Some(d);
    }

    if o.stop != r.stop || o.finished != r.finished {
        d.kind = DivergenceKind::Stop;
        (d.ours, d.reference) = (Decision::Stop(o.stop), Decision::Stop(r.stop));
        match (o.stop, r.stop, reference.confidence_threshold) {
            (Some(so), Some(sr), Some(threshold))
                if so.stable == sr.stable
                    && so.confident != sr.confident
                    && ours.confidence_threshold == reference.confidence_threshold
                    && o.entropies.len() == r.entropies.len() =>
            {
                let n = r.entropies.len().max(1) as f64;
                let mean_delta = o.entropies.iter().zip(&r.entropies).map(|(&a, &b)| (f64::from(a) - f64::from(b)).abs()).sum::<f64>() / n;
                let margin = (f64::from(r.mean_entropy) - f64::from(threshold)).abs();
                let slack = rounding_slack(f64::from(r.mean_entropy.max(o.mean_entropy)));
                (d.margin, d.reach) = (Some(margin), Some(mean_delta));
                d.detail = format!("reference mean entropy {:.6e} vs threshold {threshold:e}; reach: mean entropy error", r.mean_entropy);
                d.explained = margin <= mean_delta + slack && within_tolerance;
            }
            _ => d.detail = "not a confidence flip: stability or the stopping setup differs".into(),
        }
        return Some(d);
    }
    None
}

/// Row `p` of a step's scaled logits.
fn row(s: &StepRecord, p: usize, vocab: usize) -> &[f32] {
    &s.scaled_logits[p * vocab..(p + 1) * vocab]
}

/// `top1 − top2` of a row, in f64 (exact for f32 values).
fn top2_gap(row: &[f32]) -> f64 {
    let (mut first, mut second) = (f64::NEG_INFINITY, f64::NEG_INFINITY);
    for &v in row {
        let v = f64::from(v);
        if v > first {
            second = first;
            first = v;
        } else if v > second {
            second = v;
        }
    }
    first - second
}

/// The measurements behind a differing sample.
struct SampleExplanation {
    /// u's distance to the edge of the reference's CDF interval on the side ours left it by;
    /// `None` when u is not in the reference's interval (the recording does not follow the rule).
    margin: Option<f64>,
    /// max_k |F_ours(k) − F_ref(k)|.
    kolmogorov: f64,
    total_variation: f64,
}

fn sample_explanation(ours: &[f32], reference: &[f32], u: f64, ours_sample: u32, ref_sample: u32) -> SampleExplanation {
    // The sampler's probabilities (its own exp and normalisation); the scaled logits are divided
    // by 1, which leaves them as they are.
    let po = dg_sampler::rows::softmax(ours, 1.0);
    let pr = dg_sampler::rows::softmax(reference, 1.0);
    let (mut fo, mut fr, mut kolmogorov, mut total_variation) = (0f64, 0f64, 0f64, 0f64);
    let (mut below, mut upto) = (0f64, 0f64);
    for (k, (&a, &b)) in po.iter().zip(&pr).enumerate() {
        if k == ref_sample as usize {
            below = fr;
        }
        fo += f64::from(a);
        fr += f64::from(b);
        if k == ref_sample as usize {
            upto = fr;
        }
        kolmogorov = kolmogorov.max((fo - fr).abs());
        total_variation += 0.5 * (f64::from(a) - f64::from(b)).abs();
    }
    // The sampler sums in another order: allow for that rounding when placing u.
    let inside = u >= below - 1e-9 && u < upto + 1e-9;
    let margin = inside.then(|| if ours_sample > ref_sample { (upto - u).max(0.0) } else { (u - below).max(0.0) });
    SampleExplanation { margin, kolmogorov, total_variation }
}

/// Each position's exclusive prefix sum in the sampler's acceptance order (entropy, then position;
/// the f64 prefix rounded to f32 minus the entropy in f32, as the sampler computes it) and its rank.
fn acceptance_prefixes(entropies: &[f32]) -> (Vec<f32>, Vec<usize>) {
    let key = |i: usize| if entropies[i] == 0.0 { 0.0 } else { entropies[i] };
    let mut order: Vec<usize> = (0..entropies.len()).collect();
    order.sort_by(|&a, &b| key(a).total_cmp(&key(b)).then(a.cmp(&b)));
    let (mut prefix, mut rank) = (vec![0f32; entropies.len()], vec![0usize; entropies.len()]);
    let mut cumulative = 0f64;
    for (k, &i) in order.iter().enumerate() {
        cumulative += f64::from(entropies[i]);
        prefix[i] = (cumulative as f32) - entropies[i];
        rank[i] = k;
    }
    (prefix, rank)
}

/// Whether the entropy errors explain the acceptance flip at `p`, with the margin and reach of the
/// condition reported and its description.
fn acceptance_explanation(ours: &[f32], reference: &[f32], p: usize, bound: f32, ours_bound: f32) -> (bool, f64, f64, String) {
    if bound != ours_bound {
        return (false, f64::NAN, 0.0, format!("the runs' entropy bounds differ: ours {ours_bound}, reference {bound}"));
    }
    let (prefix_ref, rank_ref) = acceptance_prefixes(reference);
    let (_, rank_ours) = acceptance_prefixes(ours);
    let delta: Vec<f64> = ours.iter().zip(reference).map(|(&a, &b)| (f64::from(a) - f64::from(b)).abs()).collect();
    let before = |q: usize| (rank_ref[q] < rank_ref[p], rank_ours[q] < rank_ours[p]);
    let threshold_reach: f64 = (0..reference.len())
        .filter(|&q| {
            let (r, o) = before(q);
            r || o
        })
        .map(|q| delta[q])
        .sum();
    let total = |h: &[f32]| h.iter().map(|&x| f64::from(x)).sum::<f64>();
    let slack = rounding_slack(total(reference).max(total(ours)) + f64::from(bound));
    let threshold_margin = (f64::from(prefix_ref[p]) - f64::from(bound)).abs();
    if threshold_margin <= threshold_reach + slack {
        let detail = format!(
            "margin: |reference prefix {:.6e} − bound {bound}|; reach: Σ entropy errors of the positions ranked before it",
            prefix_ref[p]
        );
        return (true, threshold_margin, threshold_reach, detail);
    }
    // A pair whose order the entropy errors swapped, the closest in the reference first.
    let swapped = (0..reference.len())
        .filter(|&q| {
            let (r, o) = before(q);
            r != o
        })
        .map(|q| (q, (f64::from(reference[p]) - f64::from(reference[q])).abs(), delta[p] + delta[q]))
        .min_by(|a, b| (a.1 - a.2).total_cmp(&(b.1 - b.2)));
    match swapped {
        Some((q, gap, reach)) if gap <= reach => {
            let detail = format!("margin: reference entropy gap to position {q}, ranked on the other side of it in ours; reach: δ_p + δ_q");
            (true, gap, reach, detail)
        }
        _ => {
            let detail = format!(
                "margin: |reference prefix {:.6e} − bound {bound}|; reach: Σ entropy errors of the positions ranked before it{}",
                prefix_ref[p],
                match swapped {
                    Some((q, gap, reach)) => format!("; order against position {q} swapped with gap {gap:.3e} > δ_p + δ_q {reach:.3e}"),
                    None => String::new(),
                }
            );
            (false, threshold_margin, threshold_reach, detail)
        }
    }
}

//! Block-autoregressive generation of one sequence: `DiffusionGemmaGenerationMixin.generate` with
//! a batch of one, and the types generation reports through.
//!
//! Per block: encode (the prompt for the first block, else the previous block's finalized canvas),
//! draw the initial canvas, then for n = N down to 1 run a canvas forward and a sampler step, stopping
//! early when the adaptive criteria fire. The block's output is the ARGMAX canvas of its last step; it is
//! appended, EOS-finalized (`_finalize_canvas`), and generation stops on EOS, on `max_length`, or after
//! `GenerationConfig::new_canvases` blocks. The last canvas is never encoded.
//!
//! The model is a [`DenoiseModel`] (the logits come back to the sampler: [`generate`]) or a
//! [`ResidentModel`] (the per-row work runs where the logits are: [`generate_resident`]). Both run
//! the batch driver ([`crate::Batch`], the per-sequence state machine in `sequence.rs`) with one
//! sequence, so a sequence generated alone and in a batch take the same path.

use dg_model::GenerationConfig;

use crate::batch::{AdmitError, Batch, StepReport};
use crate::batched::OneSlot;
use crate::error::{InputError, SamplerError};
use crate::resident::ResidentModel;
use crate::rng::RandomSource;
use crate::sampler::{Sampler, StepOutcome, check_ids};
use crate::stopping::StopDecision;

/// The model as the sampler sees it.
pub trait DenoiseModel {
    type Error: std::error::Error + Send + Sync + 'static;

    /// Encodes `ids` causally into the KV cache at the next positions (prompt prefill, or a committed
    /// canvas at the positions it was decoded at).
    fn encode(&mut self, ids: &[u32]) -> Result<(), Self::Error>;

    /// One canvas forward at the C positions right after the cache. `self_conditioning` is `None` on a
    /// block's first step, else the previous step's temperature-scaled logits (C·V, row-major; a bf16
    /// model rounds them to its embedding dtype, as the reference does). Writes the raw softcapped logits
    /// (C·V) into `logits`.
    fn canvas_forward(&mut self, canvas: &[u32], self_conditioning: Option<&[f32]>, logits: &mut [f32]) -> Result<(), Self::Error>;
}

impl<M: DenoiseModel + ?Sized> DenoiseModel for &mut M {
    type Error = M::Error;
    fn encode(&mut self, ids: &[u32]) -> Result<(), Self::Error> {
        (**self).encode(ids)
    }
    fn canvas_forward(&mut self, c: &[u32], sc: Option<&[f32]>, logits: &mut [f32]) -> Result<(), Self::Error> {
        (**self).canvas_forward(c, sc, logits)
    }
}

/// What a step did, for progress display, streaming drafts and step-by-step comparison.
#[derive(Debug, Clone, Copy)]
pub struct StepInfo<'a> {
    pub block: usize,
    /// 0-based step within the block.
    pub step: usize,
    /// n: steps remaining including this one (N on the first step, 1 on the last possible one).
    pub remaining: usize,
    pub temperature: f32,
    /// Argmax of the scaled logits (what the block outputs if it ends here).
    pub draft: &'a [u32],
    pub accepted: &'a [bool],
    pub num_accepted: usize,
    pub entropies: &'a [f32],
    pub mean_entropy: f32,
    /// Categorical samples of this step.
    pub sampled: &'a [u32],
    /// The canvas the next step decodes (accepted samples, noise elsewhere).
    pub canvas: &'a [u32],
    /// Temperature-scaled logits (C·V): the next step's self-conditioning input (empty when they stay
    /// in a [`ResidentModel`]).
    pub scaled_logits: &'a [f32],
    pub stop: Option<StopDecision>,
    pub finished: bool,
}

/// Callbacks during generation. They default to doing nothing and never stopping.
pub trait Hooks {
    fn on_step(&mut self, _info: &StepInfo<'_>) {}
    /// A finished block, after EOS padding, as appended to the sequence.
    fn on_canvas(&mut self, _block: usize, _tokens: &[u32]) {}
    /// A block's committed ids were encoded into the cache (the prompt for block 0, else the
    /// previous block's canvas): how many ids the model's encode call was handed (a model that
    /// reuses a cached prefix may run fewer through its layers), and the call's wall time.
    fn on_encode(&mut self, _block: usize, _tokens: usize, _took: std::time::Duration) {}
    /// Asked after every step's [`Hooks::on_step`] and every block's [`Hooks::on_canvas`]: `true` ends
    /// the generation there with [`StopReason::Cancelled`] (a block cut short is not appended).
    fn should_stop(&mut self) -> bool {
        false
    }
}

/// Hooks that do nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoHooks;

impl Hooks for NoHooks {}

impl<H: Hooks + ?Sized> Hooks for &mut H {
    fn on_step(&mut self, info: &StepInfo<'_>) {
        (**self).on_step(info)
    }
    fn on_canvas(&mut self, block: usize, tokens: &[u32]) {
        (**self).on_canvas(block, tokens)
    }
    fn on_encode(&mut self, block: usize, tokens: usize, took: std::time::Duration) {
        (**self).on_encode(block, tokens, took)
    }
    fn should_stop(&mut self) -> bool {
        (**self).should_stop()
    }
}

/// Why generation stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// A canvas contained an EOS id.
    Eos,
    /// The sequence reached `max_length`.
    MaxLength,
    /// All `new_canvases` blocks were generated.
    AllCanvases,
    /// [`Hooks::should_stop`] asked to stop.
    Cancelled,
}

/// The result of `generate`.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    /// Prompt followed by whole canvases (never trimmed to `max_new_tokens`).
    pub sequence: Vec<u32>,
    pub prompt_len: usize,
    /// Decoder passes of each block.
    pub steps_per_canvas: Vec<usize>,
    pub decoder_passes: usize,
    /// New tokens that are not the pad id.
    pub valid_tokens: usize,
    /// `valid_tokens / decoder_passes` (`_compute_tokens_per_forward`).
    pub tokens_per_forward: f64,
    pub stop_reason: StopReason,
}

impl Generation {
    /// The generated canvases, without the prompt.
    pub fn new_tokens(&self) -> &[u32] {
        &self.sequence[self.prompt_len..]
    }
}

/// Checks a config built in code the way `DiffusionGemmaGenerationConfig.validate` would, plus token ids.
pub fn validate_config(cfg: &GenerationConfig, vocab_size: usize) -> Result<(), InputError> {
    let bad = |m: String| Err(InputError::Config(m));
    if cfg.max_denoising_steps == 0 {
        return bad("max_denoising_steps must be > 0".into());
    }
    if cfg.max_new_tokens == 0 || cfg.max_length == Some(0) {
        return bad("max_new_tokens and max_length must be > 0".into());
    }
    if !(cfg.entropy_bound > 0.0 && cfg.entropy_bound.is_finite()) {
        return bad(format!("entropy_bound must be a finite value > 0 (got {})", cfg.entropy_bound));
    }
    if let Some((t_min, t_max)) = cfg.temperature
        && !(t_min >= 0.0 && t_max > t_min && t_max.is_finite())
    {
        return bad(format!("need 0 <= t_min < t_max (got t_min {t_min}, t_max {t_max})"));
    }
    if let Some(s) = &cfg.stopping
        && s.confidence_threshold.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater)
    {
        return bad(format!("confidence_threshold must be > 0 (got {})", s.confidence_threshold));
    }
    check_ids("eos", &cfg.eos_token_ids, vocab_size)?;
    check_ids("pad", cfg.pad_token_id.as_slice(), vocab_size)?;
    Ok(())
}

/// Runs `generate` with a fresh [`Sampler`] for canvas length C and vocabulary V.
pub fn generate<M: DenoiseModel + ?Sized, R: RandomSource + ?Sized, H: Hooks + ?Sized>(
    model: &mut M,
    prompt: &[u32],
    cfg: &GenerationConfig,
    canvas_length: usize,
    vocab_size: usize,
    rng: &mut R,
    hooks: &mut H,
) -> Result<Generation, SamplerError<M::Error>> {
    let mut sampler = Sampler::new(canvas_length, vocab_size)?;
    sampler.generate(model, prompt, cfg, rng, hooks)
}

/// Runs `generate` on a [`ResidentModel`] (logits and self-conditioning stay in the model; only the
/// per-row results of each step come back) with a fresh [`Sampler`]. Same draws, same decisions as
/// [`generate`] given the same per-row results; [`StepInfo::scaled_logits`] is empty.
pub fn generate_resident<M: ResidentModel + ?Sized, R: RandomSource + ?Sized, H: Hooks + ?Sized>(
    model: &mut M,
    prompt: &[u32],
    cfg: &GenerationConfig,
    canvas_length: usize,
    vocab_size: usize,
    rng: &mut R,
    hooks: &mut H,
) -> Result<Generation, SamplerError<M::Error>> {
    let mut sampler = Sampler::new(canvas_length, vocab_size)?;
    sampler.generate_resident(model, prompt, cfg, rng, hooks)
}

impl Sampler {
    /// `generate` on this sampler's buffers (reusable across calls with the same C and V).
    pub fn generate<M: DenoiseModel + ?Sized, R: RandomSource + ?Sized, H: Hooks + ?Sized>(
        &mut self,
        model: &mut M,
        prompt: &[u32],
        cfg: &GenerationConfig,
        rng: &mut R,
        hooks: &mut H,
    ) -> Result<Generation, SamplerError<M::Error>> {
        let mut model = OneSlot(model);
        self.alone(prompt, cfg, rng, hooks, |batch| batch.step(&mut model))
    }

    /// [`generate_resident`] on this sampler's buffers.
    pub fn generate_resident<M: ResidentModel + ?Sized, R: RandomSource + ?Sized, H: Hooks + ?Sized>(
        &mut self,
        model: &mut M,
        prompt: &[u32],
        cfg: &GenerationConfig,
        rng: &mut R,
        hooks: &mut H,
    ) -> Result<Generation, SamplerError<M::Error>> {
        let mut model = OneSlot(model);
        self.alone(prompt, cfg, rng, hooks, |batch| batch.step_resident(&mut model))
    }

    /// One sequence through the batch driver (a batch of one, on this sampler's buffers), stepped
    /// by `step` until it finishes.
    fn alone<'a, R: RandomSource + ?Sized, H: Hooks + ?Sized, E: std::error::Error + 'static>(
        &mut self,
        prompt: &[u32],
        cfg: &GenerationConfig,
        rng: &'a mut R,
        hooks: &'a mut H,
        mut step: impl FnMut(&mut Batch<&'a mut R, &'a mut H, E>) -> StepReport,
    ) -> Result<Generation, SamplerError<E>> {
        let placeholder = Sampler::new(1, 1)?;
        let mut batch = Batch::with_sampler(std::mem::replace(self, placeholder), 1);
        let admitted = batch.admit(prompt, cfg, rng, hooks);
        while batch.running() > 0 {
            step(&mut batch);
        }
        let finished = batch.drain_finished().next();
        if let Some(sampler) = batch.into_sampler() {
            *self = sampler;
        }
        match (admitted, finished) {
            (Err(rejected), _) => Err(match rejected.reason {
                AdmitError::Input(e) => e.into(),
                AdmitError::Full { capacity } => unreachable!("a batch of {capacity} holds its first sequence"),
            }),
            (Ok(_), Some(finished)) => finished.result,
            (Ok(_), None) => unreachable!("an admitted sequence finishes before its batch runs dry"),
        }
    }

    pub(crate) fn step_info(&self, block: usize, step: usize, remaining: usize, o: &StepOutcome) -> StepInfo<'_> {
        StepInfo {
            block,
            step,
            remaining,
            temperature: o.temperature,
            draft: self.draft(),
            accepted: self.accepted(),
            num_accepted: o.num_accepted,
            entropies: self.entropies(),
            mean_entropy: o.mean_entropy,
            sampled: self.sampled(),
            canvas: self.canvas(),
            scaled_logits: self.self_conditioning().unwrap_or(&[]),
            stop: o.stop,
            finished: o.finished,
        }
    }
}

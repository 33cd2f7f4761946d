//! Block-autoregressive generation: `DiffusionGemmaGenerationMixin.generate` for one sequence.
//!
//! Per block: encode (the prompt for the first block, else the previous block's finalized canvas),
//! draw the initial canvas, then for n = N down to 1 run a canvas forward and a sampler step, stopping
//! early when the adaptive criteria fire. The block's output is the ARGMAX canvas of its last step; it is
//! appended, EOS-finalized (`_finalize_canvas`), and generation stops on EOS, on `max_length`, or after
//! `GenerationConfig::new_canvases` blocks. The last canvas is never encoded.
//!
//! The model is a [`DenoiseModel`] (the logits come back to the sampler: [`generate`]) or a
//! [`ResidentModel`] (the per-row work runs where the logits are: [`generate_resident`]); one loop
//! drives both.

use dg_model::GenerationConfig;

use crate::error::{InputError, ModelCall, SamplerError};
use crate::finalize::{self, CanvasEnd};
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
    sampler.run(&mut Resident(model), prompt, cfg, rng, hooks)
}

/// How a generation reaches its model: encode, and one whole step (forward + per-row work + the
/// sampler's decisions).
trait StepDriver {
    type Error: std::error::Error + Send + Sync + 'static;
    fn encode(&mut self, ids: &[u32]) -> Result<(), Self::Error>;
    fn step<R: RandomSource + ?Sized>(
        &mut self,
        sampler: &mut Sampler,
        cfg: &GenerationConfig,
        remaining: usize,
        rng: &mut R,
        block: usize,
        step: usize,
    ) -> Result<StepOutcome, SamplerError<Self::Error>>;
}

/// The logits come to the sampler ([`DenoiseModel`]).
struct HostLogits<'m, M: ?Sized>(&'m mut M);

impl<M: DenoiseModel + ?Sized> StepDriver for HostLogits<'_, M> {
    type Error = M::Error;
    fn encode(&mut self, ids: &[u32]) -> Result<(), M::Error> {
        self.0.encode(ids)
    }
    fn step<R: RandomSource + ?Sized>(
        &mut self,
        sampler: &mut Sampler,
        cfg: &GenerationConfig,
        remaining: usize,
        rng: &mut R,
        block: usize,
        step: usize,
    ) -> Result<StepOutcome, SamplerError<M::Error>> {
        let (canvas, sc, logits) = sampler.forward_buffers();
        self.0.canvas_forward(canvas, sc, logits).map_err(|source| SamplerError::Model {
            block,
            call: ModelCall::CanvasForward { step },
            source,
        })?;
        sampler.step(cfg, remaining, rng, block).map_err(SamplerError::with_model_error)
    }
}

/// The per-row work runs in the model ([`ResidentModel`]).
struct Resident<'m, M: ?Sized>(&'m mut M);

impl<M: ResidentModel + ?Sized> StepDriver for Resident<'_, M> {
    type Error = M::Error;
    fn encode(&mut self, ids: &[u32]) -> Result<(), M::Error> {
        self.0.encode(ids)
    }
    fn step<R: RandomSource + ?Sized>(
        &mut self,
        sampler: &mut Sampler,
        cfg: &GenerationConfig,
        remaining: usize,
        rng: &mut R,
        block: usize,
        step: usize,
    ) -> Result<StepOutcome, SamplerError<M::Error>> {
        sampler.step_resident(self.0, cfg, remaining, rng, block, step)
    }
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
        self.run(&mut HostLogits(model), prompt, cfg, rng, hooks)
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
        self.run(&mut Resident(model), prompt, cfg, rng, hooks)
    }

    fn run<D: StepDriver, R: RandomSource + ?Sized, H: Hooks + ?Sized>(
        &mut self,
        model: &mut D,
        prompt: &[u32],
        cfg: &GenerationConfig,
        rng: &mut R,
        hooks: &mut H,
    ) -> Result<Generation, SamplerError<D::Error>> {
        let (c, v) = (self.canvas_length(), self.vocab_size());
        if prompt.is_empty() {
            return Err(InputError::EmptyPrompt.into());
        }
        check_ids("prompt", prompt, v)?;
        validate_config(cfg, v)?;
        let blocks = cfg.new_canvases(prompt.len(), c);
        let n = cfg.max_denoising_steps;
        let mut sequence = Vec::with_capacity(prompt.len() + blocks * c);
        sequence.extend_from_slice(prompt);
        let mut steps_per_canvas = Vec::with_capacity(blocks);
        let mut decoder_passes = 0;
        let mut stop_reason = StopReason::AllCanvases;
        'blocks: for block in 0..blocks {
            let committed = if block == 0 { prompt } else { &sequence[sequence.len() - c..] };
            model.encode(committed).map_err(|source| SamplerError::Model { block, call: ModelCall::Encode, source })?;
            self.begin_block(rng).map_err(SamplerError::with_model_error)?;
            let mut steps = 0;
            for remaining in (1..=n).rev() {
                let step = n - remaining;
                decoder_passes += 1;
                steps += 1;
                let outcome = model.step(self, cfg, remaining, rng, block, step)?;
                hooks.on_step(&self.step_info(block, step, remaining, &outcome));
                if hooks.should_stop() {
                    steps_per_canvas.push(steps);
                    stop_reason = StopReason::Cancelled;
                    break 'blocks;
                }
                if outcome.finished {
                    break;
                }
            }
            steps_per_canvas.push(steps);
            sequence.extend_from_slice(self.draft());
            let len = sequence.len();
            let end = finalize::finalize_canvas(&mut sequence[len - c..], len, cfg);
            hooks.on_canvas(block, &sequence[len - c..]);
            if hooks.should_stop() && block + 1 < blocks && end == CanvasEnd::Continue {
                stop_reason = StopReason::Cancelled;
                break;
            }
            match end {
                CanvasEnd::Continue => {}
                CanvasEnd::Eos { .. } => {
                    stop_reason = StopReason::Eos;
                    break;
                }
                CanvasEnd::MaxLength => {
                    stop_reason = StopReason::MaxLength;
                    break;
                }
            }
        }
        if stop_reason != StopReason::Cancelled {
            // A cancelled run leaves recorded draws unused on purpose.
            rng.finish()?;
        }
        let new_tokens = &sequence[prompt.len()..];
        let valid_tokens = finalize::valid_tokens(new_tokens, cfg.pad_token_id);
        let tokens_per_forward = finalize::tokens_per_forward(new_tokens, cfg.pad_token_id, decoder_passes);
        Ok(Generation {
            prompt_len: prompt.len(),
            steps_per_canvas,
            decoder_passes,
            valid_tokens,
            tokens_per_forward,
            stop_reason,
            sequence,
        })
    }

    fn step_info(&self, block: usize, step: usize, remaining: usize, o: &StepOutcome) -> StepInfo<'_> {
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

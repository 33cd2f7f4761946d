//! The generate-level check: `dg_sampler::generate` (and `generate_resident` where the backend keeps
//! its logits on the device) driven by a backend, consuming the draws the reference recorded, must
//! reproduce the reference's token sequence exactly.
//!
//! A mismatch names the block, the step count of that block, the position, both tokens, and the
//! top-2 margin of our final-step scaled logits there (how close the decision was).

use dg_model::{GenerationConfig, ModelConfig, RawGenerationConfig};
use dg_sampler::{DenoiseModel, Generation, Hooks, Replay, StepInfo, generate};

use crate::checks::{Backend, CheckResult};
use crate::compare::top2;
use crate::reference::Reference;
use crate::{BoxError, ParityError};

/// A backend failure, as the sampler's model error.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BackendFailure(String);

/// Adapts a parity [`Backend`] to the sampler's model trait (replays here, seeded runs in tests).
pub struct AsModel<'a>(pub &'a mut dyn Backend);

impl std::fmt::Debug for AsModel<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("AsModel").field(&self.0.name()).finish()
    }
}

impl DenoiseModel for AsModel<'_> {
    type Error = BackendFailure;

    fn encode(&mut self, ids: &[u32]) -> Result<(), Self::Error> {
        self.0.encode(ids).map_err(|e: BoxError| BackendFailure(e.to_string()))
    }

    fn canvas_forward(&mut self, canvas: &[u32], sc: Option<&[f32]>, logits: &mut [f32]) -> Result<(), Self::Error> {
        self.0.canvas_forward(canvas, sc, logits).map_err(|e: BoxError| BackendFailure(e.to_string()))
    }
}

/// Remembers, per block, the last step's top-2 margins of the scaled logits.
#[derive(Default)]
struct Margins {
    vocab: usize,
    last: Vec<Vec<f32>>,
    steps: Vec<usize>,
}

impl Hooks for Margins {
    fn on_step(&mut self, info: &StepInfo<'_>) {
        if self.last.len() <= info.block {
            self.last.resize(info.block + 1, Vec::new());
            self.steps.resize(info.block + 1, 0);
        }
        // Empty when the logits stay on the device (resident steps).
        self.last[info.block] = info.scaled_logits.chunks_exact(self.vocab).map(|row| top2(row).1).collect();
        self.steps[info.block] = info.step + 1;
    }
}

/// The generation parameters of a replay: the model directory's generation config, overridden by
/// the `generation` block of `reference.json`.
pub fn replay_config(reference: &Reference, base: &RawGenerationConfig, model: &ModelConfig) -> Result<GenerationConfig, ParityError> {
    let over = reference.meta.generation.clone().unwrap_or_default();
    let raw = base.clone().overridden_by(over);
    Ok(raw.resolve(model, &reference.json_path)?)
}

/// Replays `generate` on `backend` with the recorded draws (`generate`), and, where the backend keeps
/// its logits on the device, again through `generate_resident` (`generate-resident`); empty when
/// the dump has no run.
pub fn generate_check(
    reference: &Reference,
    backend: &mut dyn Backend,
    model: &ModelConfig,
    cfg: &GenerationConfig,
) -> Result<Vec<CheckResult>, ParityError> {
    if !reference.has("gen_sequences") || reference.meta.draws.is_empty() {
        return Ok(Vec::new());
    }
    let want = reference.ids("gen_sequences")?;
    let prompt = reference.ids("prompt_ids")?;
    let (c, v) = (model.canvas_length, model.text.vocab_size);
    let mut results = Vec::new();

    let mut replay = Replay::new(reference.draws()?);
    let mut margins = Margins { vocab: v, ..Default::default() };
    backend.reset().map_err(|e| ParityError::Backend(e.to_string()))?;
    let result = generate(&mut AsModel(&mut *backend), &prompt, cfg, c, v, &mut replay, &mut margins).map_err(|e| e.to_string());
    results.push(judge("generate", result, &want, prompt.len(), c, &margins, replay.consumed()));

    let mut replay = Replay::new(reference.draws()?);
    let mut margins = Margins { vocab: v, ..Default::default() };
    if let Some(result) = backend.generate_resident(&prompt, cfg, &mut replay, &mut margins) {
        let result = result.map_err(|e| e.to_string());
        results.push(judge("generate-resident", result, &want, prompt.len(), c, &margins, replay.consumed()));
    }
    Ok(results)
}

/// The check result of one replayed generation against the reference's sequence.
fn judge(
    name: &str,
    result: Result<Generation, String>,
    want: &[u32],
    prompt_len: usize,
    c: usize,
    margins: &Margins,
    consumed: usize,
) -> CheckResult {
    let name = name.to_string();
    let generation = match result {
        Ok(g) => g,
        Err(e) => return CheckResult { name, passed: false, detail: format!("replay failed: {e}") },
    };
    let got = &generation.sequence;
    let first_diff = got.iter().zip(want).position(|(a, b)| a != b);
    let detail = match (first_diff, got.len() == want.len()) {
        (None, true) => {
            return CheckResult {
                name,
                passed: true,
                detail: format!(
                    "tokens={} identical, blocks={} steps={:?} draws={} tokens/forward={:.2}",
                    want.len(),
                    generation.steps_per_canvas.len(),
                    generation.steps_per_canvas,
                    consumed,
                    generation.tokens_per_forward
                ),
            };
        }
        (None, false) => format!("length {} differs from the reference's {}", got.len(), want.len()),
        (Some(i), _) => {
            let (block, pos) = ((i.saturating_sub(prompt_len)) / c, (i.saturating_sub(prompt_len)) % c);
            let margin = margins.last.get(block).and_then(|m| m.get(pos)).copied();
            let steps = margins.steps.get(block).copied().unwrap_or(0);
            format!(
                "first difference at sequence index {i}: block {block}, position {pos}, after {steps} steps: ours {} ref {} (our final-step top-2 margin there {margin:?}; None when the logits stay on the device)",
                got[i], want[i]
            )
        }
    };
    CheckResult { name, passed: false, detail }
}

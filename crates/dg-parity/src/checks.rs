//! The model-level checks of a reference directory: logits of three forwards against the dump.
//!
//! Each check resets the backend, replays the reference's inputs (prompt prefill, a committed
//! block, a canvas with and without self-conditioning) and compares the logits.

use crate::compare::{Comparison, compare};
use crate::reference::Reference;
use crate::{BoxError, ParityError};

/// Normwise tolerance of the f32 CPU path against transformers f32 on the CPU: both sides do the
/// same f32 operations and differ only in summation order (a few ulps per op).
pub const CPU_LOGITS_TOLERANCE: f64 = 1e-5;
/// Normwise tolerance of the f32 GPU path: GPU reductions and transcendentals are less tightly
/// specified than libm's (WGSL allows a few ulps for exp/tanh).
pub const GPU_LOGITS_TOLERANCE: f64 = 1e-4;
/// Normwise tolerance of one GPU layer against the same CPU layer on the same input: one layer of
/// f32 GEMMs and reductions in another order (measured ~1e-6), with margin for router near-ties.
pub const LAYER_TOLERANCE: f64 = 1e-5;
/// Normwise tolerance of the GPU encoder's K/V against the CPU encoder's, per layer: layer i's K/V
/// come out of i encoder layers (each within LAYER_TOLERANCE's ~1e-6) plus the K/V projection.
pub const CACHE_TOLERANCE: f64 = 1e-5;
/// The tolerances one backend is held to.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tolerances {
    pub logits: f64,
    pub layer: f64,
    pub cache: f64,
    /// Rows whose reference top-2 gap exceeds this must agree on the argmax.
    pub argmax_margin: f32,
}

/// The F16 weight path on a device with cooperative matrices (`gpu-f16` there): the tensor-core
/// projections round their f32 activations to f16 (unit roundoff 2⁻¹¹ ≈ 4.9e-4) before the f16 ×
/// f16 products, which accumulate exactly in f32. One rounding of a GEMM's input moves its output
/// by about the input's relative rounding error (~3e-4 normwise for random-looking errors), and a
/// forward chains several such GEMMs. Measured on an H200 with the `tensor-core-shapes` fixture
/// (whose decoder projections fit the tiles): logits 9.1e-4 / 9.3e-4 normwise (plain / self-
/// conditioned), max |Δ| 6.9e-2; worst layer 3.4e-4. The bounds are about 3× those; the argmax
/// margin is twice the largest |Δ| measured rounded up (both top-2 entries may move, in opposite
/// directions). The cache bound is the layer bound (prefill chunks whose length fits a tile use
/// the tensor cores too).
pub const F16_ACTIVATION_TOLERANCES: Tolerances = Tolerances { logits: 3e-3, layer: 1e-3, cache: 1e-3, argmax_margin: 0.15 };

/// Rows whose reference top-2 gap exceeds this must agree on the argmax.
pub const ARGMAX_MARGIN: f32 = 1e-3;

/// A model the checks can drive.
pub trait Backend {
    /// Short name for reports (`cpu`, `gpu`).
    fn name(&self) -> &'static str;
    /// The normwise tolerance on logits for this backend.
    fn logits_tolerance(&self) -> f64;
    /// Rows whose reference top-2 gap exceeds this must agree on the argmax.
    fn argmax_margin(&self) -> f32 {
        ARGMAX_MARGIN
    }
    /// Vocabulary size V (logits row length).
    fn vocab_size(&self) -> usize;
    /// Forget every cached token.
    fn reset(&mut self) -> Result<(), BoxError>;
    /// Encode ids at the next positions into the cache.
    fn encode(&mut self, ids: &[u32]) -> Result<(), BoxError>;
    /// Canvas forward at the positions after the cache.
    fn canvas_forward(&mut self, canvas: &[u32], sc: Option<&[f32]>, logits: &mut [f32]) -> Result<(), BoxError>;
    /// Layer-level check against the CPU reference, for backends that are not the reference:
    /// every decoder layer on the CPU layer's input, after encoding `prompt`.
    fn layer_check(&mut self, _prompt: &[u32], _canvas: &[u32]) -> Option<Result<CheckResult, BoxError>> {
        None
    }
    /// Cache-level check against the CPU encoder, for backends with their own encoder: the K/V
    /// each layer sees after encoding each of `blocks` in turn.
    fn cache_check(&mut self, _blocks: &[&[u32]]) -> Option<Result<CheckResult, BoxError>> {
        None
    }
    /// `generate` with the sampler's per-row work where the backend keeps its logits
    /// (`dg_sampler::generate_resident`); `None` when it only offers `canvas_forward`.
    fn generate_resident(
        &mut self,
        _prompt: &[u32],
        _cfg: &dg_model::GenerationConfig,
        _rng: &mut dyn dg_sampler::RandomSource,
        _hooks: &mut dyn dg_sampler::Hooks,
    ) -> Option<Result<dg_sampler::Generation, BoxError>> {
        None
    }
}

/// The outcome of one check.
#[derive(Debug, Clone)]
pub struct CheckResult {
    pub name: String,
    pub passed: bool,
    pub detail: String,
}

impl CheckResult {
    pub(crate) fn from_comparison(name: &str, c: &Comparison, tolerance: f64) -> Self {
        CheckResult { name: name.to_string(), passed: c.passes(tolerance), detail: format!("{c} tol={tolerance:.0e}") }
    }
}

/// Runs the logits checks the dump supports (`logits_plain`, `logits_sc`, `logits_block2`).
pub fn logits_checks(reference: &Reference, backend: &mut dyn Backend) -> Result<Vec<CheckResult>, ParityError> {
    let mut results = Vec::new();
    let v = backend.vocab_size();
    let tol = backend.logits_tolerance();
    let margin = backend.argmax_margin();
    let be = |e: BoxError| ParityError::Backend(e.to_string());
    if !reference.has("prompt_ids") {
        return Ok(results);
    }
    let prompt = reference.ids("prompt_ids")?;
    if reference.has("canvas_ids") {
        let canvas = reference.ids("canvas_ids")?;
        let mut logits = vec![0f32; canvas.len() * v];
        backend.reset().map_err(be)?;
        backend.encode(&prompt).map_err(be)?;
        if reference.has("logits_plain") {
            backend.canvas_forward(&canvas, None, &mut logits).map_err(be)?;
            let (_, want) = reference.floats("logits_plain")?;
            check_len(reference, "logits_plain", want.len(), logits.len())?;
            results.push(CheckResult::from_comparison("logits_plain", &compare(&logits, &want, v, margin), tol));
        }
        if reference.has("logits_sc") && reference.has("sc_logits") {
            let (_, sc) = reference.floats("sc_logits")?;
            check_len(reference, "sc_logits", sc.len(), logits.len())?;
            backend.canvas_forward(&canvas, Some(&sc), &mut logits).map_err(be)?;
            let (_, want) = reference.floats("logits_sc")?;
            check_len(reference, "logits_sc", want.len(), logits.len())?;
            results.push(CheckResult::from_comparison("logits_sc", &compare(&logits, &want, v, margin), tol));
        }
    }
    if reference.has("block2_ids") && reference.has("canvas2_ids") && reference.has("logits_block2") {
        if let Some(start) = reference.meta.block2_position_start
            && start != prompt.len()
        {
            return Err(ParityError::Reference {
                path: reference.dir.join("reference.json"),
                message: format!("block2_position_start {start} differs from the prompt length {}", prompt.len()),
            });
        }
        let block2 = reference.ids("block2_ids")?;
        let canvas2 = reference.ids("canvas2_ids")?;
        let mut logits = vec![0f32; canvas2.len() * v];
        backend.reset().map_err(be)?;
        backend.encode(&prompt).map_err(be)?;
        backend.encode(&block2).map_err(be)?;
        backend.canvas_forward(&canvas2, None, &mut logits).map_err(be)?;
        let (_, want) = reference.floats("logits_block2")?;
        check_len(reference, "logits_block2", want.len(), logits.len())?;
        results.push(CheckResult::from_comparison("logits_block2", &compare(&logits, &want, v, margin), tol));
    }
    Ok(results)
}

fn check_len(reference: &Reference, name: &str, got: usize, expected: usize) -> Result<(), ParityError> {
    if got == expected {
        Ok(())
    } else {
        Err(ParityError::Reference {
            path: reference.dir.join("reference.safetensors"),
            message: format!("{name} has {got} values, expected {expected} (canvas × vocab)"),
        })
    }
}

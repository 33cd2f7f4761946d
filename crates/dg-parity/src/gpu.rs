//! The GPU backend of the checks: [`dg_gpu::GpuModel`] (encoder, canvas forward and the sampler's
//! per-row work on the GPU), with a [`dg_cpu::CpuModel`] beside it as the reference of the
//! cache-level and layer-level checks; matrices stored in f32 (`gpu`) or BF16 (`gpu-bf16`).

use dg_cpu::CpuModel;
use dg_cpu::layer::RouterTrace;
use dg_gpu::{GpuContext, GpuModel, Instrumentation, LayerContext, WeightFormat};
use dg_model::{GenerationConfig, ModelConfig, TensorSource, Weights};
use dg_sampler::{Generation, Hooks, RandomSource, generate_resident};

use crate::BoxError;
use crate::checks::{
    ARGMAX_MARGIN, Backend, CACHE_TOLERANCE, CheckResult, F16_ACTIVATION_TOLERANCES, GPU_LOGITS_TOLERANCE, LAYER_TOLERANCE, Tolerances,
};
use crate::compare::compare;

/// The f32 GPU path's tolerances: also those of every path that computes in f32 on the same
/// weights (BF16 and F16 storage without cooperative matrices, ggml blocks in the portable kernels).
const F32_TOLERANCES: Tolerances =
    Tolerances { logits: GPU_LOGITS_TOLERANCE, layer: LAYER_TOLERANCE, cache: CACHE_TOLERANCE, argmax_margin: ARGMAX_MARGIN };

/// The GPU model as a parity backend; `cpu` is used only by the cache and layer checks.
#[derive(Debug)]
pub struct GpuBackend {
    pub cpu: CpuModel,
    pub gpu: GpuModel,
    name: &'static str,
    tolerances: Tolerances,
}

/// `tolerances`, or the F16 activation tolerances where `gpu` caches K and V as f16: the attention
/// then reads them rounded to f16, as the tensor cores read an f32 cache (with them, the F16 mode's
/// tolerances already apply; without them only a forced f16 cache, `DG_KV_CACHE=f16`, does this).
fn with_cache_rounding(gpu: &GpuModel, tolerances: Tolerances) -> Tolerances {
    if gpu.kv_cache_format() == WeightFormat::F16 { F16_ACTIVATION_TOLERANCES } else { tolerances }
}

impl GpuBackend {
    /// Uploads `weights` (matrices in f32) to `ctx` for sequences of up to `max_context` tokens.
    pub fn new(ctx: GpuContext, config: &ModelConfig, weights: Weights, max_context: usize) -> Result<Self, BoxError> {
        Self::with_format(ctx, config, weights, max_context, WeightFormat::F32)
    }

    /// Uploads `weights` with the matrices in `format` (backend name `gpu-bf16` for BF16). The CPU
    /// twin of the cache and layer checks gets the same matrices: rounded to BF16 for a BF16
    /// upload, so both sides compute in f32 on identical weights.
    pub fn with_format(
        ctx: GpuContext,
        config: &ModelConfig,
        mut weights: Weights,
        max_context: usize,
        format: WeightFormat,
    ) -> Result<Self, BoxError> {
        let coop = ctx.coop_matrix;
        let gpu = GpuModel::load(ctx, config, &weights, dg_gpu::ModelOptions::new(max_context).format(format))?;
        let (name, tolerances) = match format {
            WeightFormat::F32 => ("gpu", F32_TOLERANCES),
            WeightFormat::Bf16 => {
                weights.round_matrices_to_bf16();
                ("gpu-bf16", F32_TOLERANCES)
            }
            WeightFormat::F16 => {
                weights.round_matrices_for_f16_mode();
                // With cooperative matrices the projections round their activations to f16 too.
                ("gpu-f16", if coop { F16_ACTIVATION_TOLERANCES } else { F32_TOLERANCES })
            }
            WeightFormat::Quantized(q) => {
                return Err(format!("{}: quantized matrices upload as their source stores them, not as an upload format", q.name()).into());
            }
        };
        let tolerances = with_cache_rounding(&gpu, tolerances);
        Ok(GpuBackend { cpu: CpuModel::new(config.clone(), weights), gpu, name, tolerances })
    }

    /// Uploads the tensors of `src` as it stores them (a quantized checkpoint's matrices in their
    /// ggml blocks, read by the kernels that dequantize them), the other matrices in `format`
    /// (f32, or F16 for the F16 mode: `gpu-f16`), with `weights` as the CPU twin of the cache and
    /// layer checks: the same tensors widened to f32 (a quantized one dequantized), rounded by the
    /// caller as the GPU stores them. In f32 the portable kernels compute on the blocks what the
    /// f32 kernels compute on the dequantized values, so the f32 GPU path's tolerances apply; in
    /// the F16 mode on a device with cooperative matrices the tensor cores round the dequantized
    /// values and the activations to f16 (`F16_ACTIVATION_TOLERANCES`).
    pub fn stored(
        ctx: GpuContext,
        config: &ModelConfig,
        src: &(impl TensorSource + ?Sized),
        weights: Weights,
        max_context: usize,
        format: WeightFormat,
    ) -> Result<Self, BoxError> {
        let coop = ctx.coop_matrix;
        let (name, tolerances) = match format {
            WeightFormat::F32 => ("gpu", F32_TOLERANCES),
            WeightFormat::F16 => ("gpu-f16", if coop { F16_ACTIVATION_TOLERANCES } else { F32_TOLERANCES }),
            other => return Err(format!("{other:?}: stored checkpoints upload their other matrices in f32 or F16").into()),
        };
        let gpu = GpuModel::load(ctx, config, src, dg_gpu::ModelOptions::new(max_context).format(format))?;
        let tolerances = with_cache_rounding(&gpu, tolerances);
        Ok(GpuBackend { cpu: CpuModel::new(config.clone(), weights), gpu, name, tolerances })
    }

    /// The GPU model (for resource counters).
    pub fn gpu(&self) -> &GpuModel {
        &self.gpu
    }
}

impl Backend for GpuBackend {
    fn name(&self) -> &'static str {
        self.name
    }

    fn logits_tolerance(&self) -> f64 {
        self.tolerances.logits
    }

    fn argmax_margin(&self) -> f32 {
        self.tolerances.argmax_margin
    }

    fn vocab_size(&self) -> usize {
        self.cpu.config.text.vocab_size
    }

    fn reset(&mut self) -> Result<(), BoxError> {
        self.gpu.reset();
        Ok(())
    }

    fn encode(&mut self, ids: &[u32]) -> Result<(), BoxError> {
        Ok(self.gpu.encode(ids)?)
    }

    fn canvas_forward(&mut self, canvas: &[u32], sc: Option<&[f32]>, logits: &mut [f32]) -> Result<(), BoxError> {
        Ok(self.gpu.canvas_forward(canvas, sc, logits)?)
    }

    fn layer_check(&mut self, prompt: &[u32], canvas: &[u32]) -> Option<Result<CheckResult, BoxError>> {
        Some(self.layers(prompt, canvas))
    }

    fn cache_check(&mut self, blocks: &[&[u32]]) -> Option<Result<CheckResult, BoxError>> {
        Some(self.caches(blocks))
    }

    fn generate_resident(
        &mut self,
        prompt: &[u32],
        cfg: &GenerationConfig,
        rng: &mut dyn RandomSource,
        hooks: &mut dyn Hooks,
    ) -> Option<Result<Generation, BoxError>> {
        let (c, v) = (self.cpu.config.canvas_length, self.cpu.config.text.vocab_size);
        self.gpu.reset();
        Some(generate_resident(&mut self.gpu, prompt, cfg, c, v, rng, hooks).map_err(Into::into))
    }
}

impl GpuBackend {
    /// The tolerances this backend is held to.
    pub fn tolerances(&self) -> Tolerances {
        self.tolerances
    }

    /// Feeds every decoder layer the CPU's input for that layer, against the CPU encoder's cache
    /// uploaded as is, and compares the outputs; the report names the first failing layer (or the
    /// worst one when all pass).
    fn layers(&mut self, prompt: &[u32], canvas: &[u32]) -> Result<CheckResult, BoxError> {
        let GpuBackend { cpu, gpu, tolerances, .. } = self;
        let tol = tolerances.layer;
        share_cpu_context(cpu, gpu, &[prompt])?;
        let (c, h) = (canvas.len(), cpu.config.text.hidden_size);
        let mut hidden = cpu.decoder_input(canvas, None);
        let mut worst = (0usize, 0f64);
        for i in 0..cpu.config.text.num_layers() {
            let gpu_out = gpu.run_layer(i, &hidden)?;
            cpu.decoder_layers(&mut hidden, c, i..i + 1);
            let cmp = compare(&gpu_out, &hidden, h, f32::INFINITY);
            if !cmp.passes(tol) {
                return Ok(CheckResult::from_comparison(&format!("layers (first failing: layer {i})"), &cmp, tol));
            }
            if cmp.normwise >= worst.1 {
                worst = (i, cmp.normwise);
            }
        }
        gpu.reset();
        Ok(CheckResult {
            name: "layers".into(),
            passed: true,
            detail: format!(
                "all {} layers within tol={tol:.0e}; worst layer {} normwise={:.3e}",
                cpu.config.text.num_layers(),
                worst.0,
                worst.1
            ),
        })
    }

    /// The layers along the GPU's own stream: the context `blocks` encoded by the CPU, then, for
    /// the canvas `canvas` with self-conditioning `sc`, each GPU layer runs on the hidden state the
    /// GPU's previous layers produced and is compared with the CPU's layer on that same input. It
    /// passes when every layer is within the layer tolerance of the CPU's; the detail also gives
    /// how far each side's stream has drifted from the CPU's own (f32 from the start), which is the
    /// model's response to the GPU's in-tolerance errors: where it jumps (a router's top-k choice
    /// flipping on a close margin, the only discontinuous step of a layer) the whole forward's
    /// logits can leave their tolerance while every layer holds. Such a flip can also fall inside
    /// a layer's step (the GPU's router, on its own rounding of the same input, choosing another
    /// expert than the CPU's): then the step is the CPU's layer run with the GPU's experts, where
    /// every flipped token's margin lies within the GPU router's error ([`routing_flip`]; the
    /// detail names the tokens and the step with the CPU's own router).
    pub fn stream_check(&mut self, blocks: &[&[u32]], canvas: &[u32], sc: Option<&[f32]>) -> Result<CheckResult, BoxError> {
        let GpuBackend { cpu, gpu, tolerances, .. } = self;
        let tol = tolerances.layer;
        share_cpu_context(cpu, gpu, blocks)?;
        let (c, h) = (canvas.len(), cpu.config.text.hidden_size);
        let mut own = cpu.decoder_input(canvas, sc);
        let mut ours = own.clone();
        let (mut passed, mut worst, mut detail) = (true, (0usize, 0f64), String::new());
        for i in 0..cpu.config.text.num_layers() {
            let mut theirs = ours.clone();
            let trace = cpu.decoder_layer_routed(&mut theirs, c, i, None);
            let next = gpu.run_layer(i, &ours)?;
            let input = std::mem::replace(&mut ours, next);
            cpu.decoder_layers(&mut own, c, i..i + 1);
            let mut step = compare(&ours, &theirs, h, f32::INFINITY);
            let drift = compare(&theirs, &own, h, f32::INFINITY);
            let mut flip = String::new();
            if !step.passes(tol)
                && let Some((tokens, rerouted)) = routing_flip(cpu, gpu, i, &input, &trace)?
            {
                let again = compare(&ours, &rerouted, h, f32::INFINITY);
                flip = format!(" (step {:.2e} with the CPU's router; its top-k flipped at {tokens})", step.normwise);
                step = again;
            }
            passed &= step.passes(tol);
            if step.normwise >= worst.1 {
                worst = (i, step.normwise);
            }
            detail += &format!("; layer {i}: step {:.2e}{flip}, drift {:.2e}", step.normwise, drift.normwise);
        }
        gpu.reset();
        let verdict = if passed { "within" } else { "NOT within" };
        Ok(CheckResult {
            name: "layers along the GPU's stream".into(),
            passed,
            detail: format!(
                "every layer {verdict} tol={tol:.0e} of the CPU's on the GPU's own input; worst layer {} step {:.3e}{detail}",
                worst.0, worst.1
            ),
        })
    }

    /// The GPU decoder's canvas forward (logits into `logits`) on the CPU encoder's cache of
    /// `blocks`: the forward alone, without the GPU encoder's own error (which
    /// [`Backend::cache_check`] bounds on its own).
    pub fn forward_on_cpu_context(
        &mut self,
        blocks: &[&[u32]],
        canvas: &[u32],
        sc: Option<&[f32]>,
        logits: &mut [f32],
    ) -> Result<(), BoxError> {
        share_cpu_context(&mut self.cpu, &mut self.gpu, blocks)?;
        self.gpu.canvas_forward(canvas, sc, logits)?;
        self.gpu.reset();
        Ok(())
    }

    /// Encodes `blocks` one after another on both encoders and compares, after each, the K and V
    /// every decoder layer would see; the report names the first failing (block, layer).
    fn caches(&mut self, blocks: &[&[u32]]) -> Result<CheckResult, BoxError> {
        let GpuBackend { cpu, gpu, tolerances, .. } = self;
        let tol = tolerances.cache;
        cpu.reset();
        gpu.reset();
        let mut worst = (0usize, 0usize, 0f64);
        for (b, ids) in blocks.iter().enumerate() {
            cpu.encode(ids)?;
            gpu.encode(ids)?;
            let got = gpu.read_visible_cache()?;
            for (i, ((k, v), want)) in got.iter().zip(&cpu.cache().layers).enumerate() {
                let row = want.kv_heads * want.head_dim;
                for (name, ours, theirs) in [("keys", k, &want.keys), ("values", v, &want.values)] {
                    let cmp = compare(ours, theirs, row, f32::INFINITY);
                    if ours.len() != theirs.len() || !cmp.passes(tol) {
                        return Ok(CheckResult {
                            name: format!("encoder cache (first failing: block {b}, layer {i} {name})"),
                            passed: false,
                            detail: format!("{} of {} values; {cmp} tol={tol:.0e}", ours.len(), theirs.len()),
                        });
                    }
                    if cmp.normwise >= worst.2 {
                        worst = (b, i, cmp.normwise);
                    }
                }
            }
        }
        gpu.reset();
        Ok(CheckResult {
            name: "encoder cache".into(),
            passed: true,
            detail: format!(
                "{} block(s) × {} layers within tol={tol:.0e}; worst block {} layer {} normwise={:.3e}",
                blocks.len(),
                cpu.config.text.num_layers(),
                worst.0,
                worst.1,
                worst.2
            ),
        })
    }
}

/// A bound on the relative change of each router input the GPU rounds: f16's unit roundoff (the
/// tensor cores round their operands to f16; the f32 products' own error is far below it).
const ROUTER_ROUNDING: f64 = 1.0 / 2048.0;

/// Whether a layer step that left its tolerance comes from a router's top-k choice flipping on a
/// close margin, the one discontinuous step of a layer: `Some` where the GPU's router (in
/// `gpu`'s last [`Instrumentation::run_layer`](dg_gpu::Instrumentation::run_layer) of layer `i`, on `input`) chose other experts than the
/// CPU's (`trace`) and every such token's swap lies within reach, with the tokens described and
/// the CPU's layer on `input` run with the GPU's experts (which the caller compares instead).
/// Reach, per token: twice the largest difference between the CPU's logits of the GPU's router
/// input and of its own, plus twice [`ROUTER_ROUNDING`] of the largest `Σ|w·x|` (the rounding of
/// the GPU's input); a swap is within reach where the CPU's logit of an expert it chose exceeds
/// that of the one the GPU chose instead by no more.
fn routing_flip(
    cpu: &CpuModel,
    gpu: &GpuModel,
    i: usize,
    input: &[f32],
    trace: &RouterTrace,
) -> Result<Option<(String, Vec<f32>)>, BoxError> {
    let cfg = &cpu.config.text;
    let (e, k, h, c) = (cfg.num_experts, cfg.top_k_experts, cfg.hidden_size, trace.input.len() / cfg.hidden_size);
    let w = &cpu.weights.layers[i];
    let (gpu_input, gpu_idx) = gpu.last_routing()?;
    let gpu_logits = dg_cpu::moe::router_logits(&gpu_input, c, w, cfg);
    let chosen: Vec<usize> = gpu_idx.iter().map(|&x| x as usize).collect();
    if chosen.iter().any(|&x| x >= e) {
        return Ok(None);
    }
    let mut flipped = Vec::new();
    for t in 0..c {
        let (ours, theirs) = (&chosen[t * k..(t + 1) * k], &trace.routing.experts[t * k..(t + 1) * k]);
        if ours.iter().all(|x| theirs.contains(x)) {
            continue;
        }
        let logit = |l: &[f32], x: usize| f64::from(l[t * e + x]);
        let diff = (0..e).map(|x| (logit(&gpu_logits, x) - logit(&trace.logits, x)).abs()).fold(0.0, f64::max);
        let row = &gpu_input[t * h..(t + 1) * h];
        let size = w
            .router_proj
            .data
            .chunks_exact(h)
            .map(|wr| wr.iter().zip(row).map(|(a, b)| f64::from((a * b).abs())).sum::<f64>())
            .fold(0.0, f64::max);
        let reach = 2.0 * (diff + ROUTER_ROUNDING * size);
        let gap = theirs
            .iter()
            .filter(|x| !ours.contains(x))
            .flat_map(|&b| ours.iter().filter(|x| !theirs.contains(x)).map(move |&a| (a, b)))
            .map(|(a, b)| logit(&trace.logits, b) - logit(&trace.logits, a))
            .fold(f64::MIN, f64::max);
        if gap > reach {
            return Ok(None);
        }
        flipped.push(format!("token {t} (logit gap {gap:.1e} ≤ reach {reach:.1e})"));
    }
    if flipped.is_empty() {
        return Ok(None);
    }
    let mut rerouted = input.to_vec();
    cpu.decoder_layer_routed(&mut rerouted, c, i, Some(&chosen));
    Ok(Some((flipped.join(", "), rerouted)))
}

/// Encodes `blocks` on the CPU from an empty cache and hands its K/V cache to the GPU's decoder
/// layers as their context (the layer checks compare layers, not encoders).
fn share_cpu_context(cpu: &mut CpuModel, gpu: &mut GpuModel, blocks: &[&[u32]]) -> Result<(), BoxError> {
    cpu.reset();
    for ids in blocks {
        cpu.encode(ids)?;
    }
    let cache = cpu.cache();
    let layers: Vec<LayerContext<'_>> = cache.layers.iter().map(|l| LayerContext { keys: &l.keys, values: &l.values }).collect();
    gpu.set_context(cache.seq_len, &layers)?;
    Ok(())
}

//! `cargo xtask bench-generate`: GPU-resident generation at a given geometry (default: the real
//! model's with 6 layers) on random weights: prompt prefill on the GPU encoder, then `canvases`
//! blocks of `steps` denoising steps each with adaptive stopping off and no EOS ids (so every
//! block runs every step, like the transformers side of the comparison), the sampler's per-row
//! work on the GPU.
//!
//! Prints prefill ms (the encoder over the prompt), commit ms (a finished canvas encoded), ms per
//! denoising step (forward + per-row work + the 16-byte-per-position readback + the host's
//! acceptance and renoising), total generate ms and generated tokens per second. A warm-up
//! generation runs first; timing waits for the device before reading the clock.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use dg_gpu::{GpuContext, GpuModel, GpuOptions};
use dg_model::{GenerationConfig, ModelConfig};
use dg_sampler::{CategoricalRequest, NoHooks, ResidentModel, RowResult, SeededRng, generate_resident};

use crate::random_model;

/// What a generation benchmark generates (shared with `bench-batch`): the model's geometry, and
/// per sequence a random prompt and canvases whose every step runs.
#[derive(Debug, clap::Args)]
pub struct Workload {
    /// Model config (HF config.json format).
    #[arg(long, default_value = "bench/configs/real-6layer.json")]
    pub config: PathBuf,
    /// Prompt tokens (random ids).
    #[arg(long, default_value_t = 1024)]
    pub prompt: usize,
    /// Canvases generated.
    #[arg(long, default_value_t = 2)]
    pub canvases: usize,
    /// Denoising steps per canvas (all run: stopping is off).
    #[arg(long, default_value_t = 48)]
    pub steps: usize,
    /// Adapter name substring.
    #[arg(long)]
    pub adapter: Option<String>,
}

impl Workload {
    /// The config, and the GPU context of the chosen adapter (both printed).
    pub fn open(&self) -> Result<(ModelConfig, GpuContext)> {
        let config = ModelConfig::from_file(&self.config).with_context(|| format!("reading {}", self.config.display()))?;
        let env = dg_lab::overrides::gpu_options_from_env()?;
        let ctx = GpuContext::new(&GpuOptions { adapter: self.adapter.clone().or(env.adapter), ..env })?;
        println!("adapter: {} ({:?}, driver {} {})", ctx.info.name, ctx.info.backend, ctx.info.driver, ctx.info.driver_info);
        let cfg = &config.text;
        println!(
            "config: {} ({} layers, hidden {}, vocab {}, canvas {}); prompt {} tokens, {} canvases × {} steps, stopping off",
            self.config.display(),
            cfg.num_layers(),
            cfg.hidden_size,
            cfg.vocab_size,
            config.canvas_length,
            self.prompt,
            self.canvases,
            self.steps
        );
        Ok((config, ctx))
    }

    /// Cache rows a sequence needs.
    pub fn max_context(&self, config: &ModelConfig) -> usize {
        self.prompt + self.canvases * config.canvas_length
    }

    /// Every canvas, every step: stopping off, no EOS ids.
    pub fn settings(&self, config: &ModelConfig) -> GenerationConfig {
        GenerationConfig {
            max_new_tokens: self.canvases * config.canvas_length,
            max_denoising_steps: self.steps,
            stopping: None,
            eos_token_ids: vec![],
            ..GenerationConfig::default()
        }
    }
}

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    work: Workload,
    /// Timed generations after the warm-up (the median is reported).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Store the weight matrices as BF16 on the GPU (arithmetic stays f32); `--weights bf16`.
    #[arg(long, conflicts_with_all = ["f16", "weights"])]
    bf16: bool,
    /// Store the weight matrices as F16 (tensor cores for the projections, experts, head and
    /// attention where the GPU has them); `--weights f16`.
    #[arg(long, conflicts_with = "weights")]
    f16: bool,
    /// Storage of the weight matrices (as `bench-gpu --weights`; default f32).
    #[arg(long, value_enum)]
    weights: Option<random_model::WeightsArg>,
    /// Compile every kernel ahead (`GpuModel::warm_up`, as `dg serve` and `dg generate` do before
    /// their first request) and report the first generation apart from the later ones: with an
    /// empty driver shader cache, what a first request on a fresh machine waits.
    #[arg(long)]
    warm_up: bool,
}

/// The GPU model with the wall time of each kind of call.
struct Timed<'m> {
    model: &'m mut GpuModel,
    encodes: Vec<Duration>,
    steps: Vec<Duration>,
}

impl ResidentModel for Timed<'_> {
    type Error = dg_gpu::GpuError;
    fn encode(&mut self, ids: &[u32]) -> Result<(), Self::Error> {
        let start = Instant::now();
        let r = self.model.encode(ids);
        self.encodes.push(start.elapsed());
        r
    }
    fn denoise_rows(
        &mut self,
        canvas: &[u32],
        sc: bool,
        t: f32,
        draw: CategoricalRequest<'_>,
        rows: &mut [RowResult],
    ) -> Result<(), Self::Error> {
        let start = Instant::now();
        let r = self.model.denoise_rows(canvas, sc, t, draw, rows);
        self.steps.push(start.elapsed());
        r
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

pub fn run(args: Args) -> Result<bool> {
    let (config, ctx) = args.work.open()?;
    let cfg = &config.text;
    let c = config.canvas_length;
    let weights = match (args.weights, args.bf16, args.f16) {
        (Some(w), _, _) => w,
        (None, _, true) => random_model::WeightsArg::F16,
        (None, true, false) => random_model::WeightsArg::Bf16,
        (None, false, false) => random_model::WeightsArg::F32,
    };
    let (mut model, label) = random_model::upload(ctx, &config, weights, args.work.max_context(&config))?;
    println!("weights on the GPU: {:.2} GB ({label})", model.weight_bytes() as f64 / 1e9);
    println!(
        "caches and activations on the GPU: {:.2} GB ({} positions, {:?} KV cache, sliding caches of {} positions)",
        model.arena_bytes() as f64 / 1e9,
        model.max_context(),
        model.kv_cache_format(),
        model.sliding_positions()
    );
    let settings = args.work.settings(&config);
    let mut rng = SeededRng::new(1);
    let prompt: Vec<u32> = (0..args.work.prompt).map(|_| rng.below(cfg.vocab_size as u32)).collect();

    if args.warm_up {
        let w = model.warm_up()?;
        println!("kernels compiled ahead: {} of {} in {:.2} s", w.compiled, w.kernels, w.elapsed.as_secs_f64());
    }
    let mut rows = Vec::new();
    let mut first = None;
    for run in 0..=args.runs {
        model.reset();
        let mut timed = Timed { model: &mut model, encodes: Vec::new(), steps: Vec::new() };
        let start = Instant::now();
        let g = generate_resident(&mut timed, &prompt, &settings, c, cfg.vocab_size, &mut SeededRng::new(run as u64), &mut NoHooks)?;
        let total = start.elapsed();
        anyhow::ensure!(g.decoder_passes == args.work.canvases * args.work.steps, "ran {} decoder passes", g.decoder_passes);
        if run == 0 {
            first = Some((ms(timed.encodes[0]), ms(total)));
        } else {
            let new_tokens = g.new_tokens().len() as f64;
            let steps: Vec<f64> = timed.steps.iter().copied().map(ms).collect();
            rows.push((
                ms(timed.encodes[0]),
                timed.encodes[1..].iter().copied().map(ms).sum::<f64>() / (timed.encodes.len() - 1).max(1) as f64,
                steps.iter().sum::<f64>() / steps.len() as f64,
                ms(total),
                new_tokens / total.as_secs_f64(),
            ));
        }
    }
    let col = |f: fn(&(f64, f64, f64, f64, f64)) -> f64| median(rows.iter().map(f).collect());
    println!("prefill (GPU encoder, {} tokens): {:.2} ms", args.work.prompt, col(|r| r.0));
    println!("canvas commit (encoder, {c} tokens): {:.2} ms", col(|r| r.1));
    println!("denoising step (forward + sampler rows + readback + host acceptance): {:.2} ms", col(|r| r.2));
    println!("generate total ({} canvases, {} steps): {:.1} ms", args.work.canvases, args.work.canvases * args.work.steps, col(|r| r.3));
    println!("generated tokens per second: {:.1}", col(|r| r.4));
    println!("(median of {} runs after a warm-up)", args.runs);
    if let Some((prefill, total)) = first.filter(|_| args.warm_up) {
        println!(
            "first generation (after the kernels were compiled ahead): prefill {prefill:.2} ms, total {total:.1} ms = {:.2}x the later ones",
            total / col(|r| r.3)
        );
    }
    Ok(true)
}

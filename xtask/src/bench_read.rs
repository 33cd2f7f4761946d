//! `cargo xtask bench-read`: typed reads on the GPU (`/v1/systemone`, vLLM's structured mode) on
//! random weights at a given geometry (default: the real 30-layer model), stage by stage.
//!
//! A random prompt of `--prompt` tokens (a `/v1/systemone` state and its questions) is encoded,
//! then reads of seeded canvases `--widths` wide with `--questions` slots (template rows pinned, one
//! step) run after its cache. Prints p50/p95 wall times (each waits for the device) of: the
//! prefill; the prefill of another state after the `--system` tokens kept (the read slot's prefix
//! reuse: `GpuModel::truncate_slot`, then the state's tokens encoded); the whole read (`dg_sampler::read`: the forward, the readback of the slot rows'
//! logits and the host's log-probabilities and top-20); its forward alone
//! (`GpuModel::read_forwards`, the head at the slot rows and their readback included); four reads
//! of the prompt in one batched forward (OpenJev's re-read rule and `samples: 4`); beside them the
//! C-wide canvas forward of generation (no logits readback). Where the adapter has timestamp
//! queries, the GPU time of one read forward and of its head at the slot rows (the "head" scope).
//! Setup (weights, upload) and a warm-up run (plans, pipelines) stay outside.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use dg_gpu::{GpuContext, GpuModel, GpuOptions, Instrumentation};
use dg_model::{GenerationConfig, ModelConfig};
use dg_sampler::{ReadCanvas, ReadRequest, SeededRng, Slot, read, read_batch};

use crate::random_model;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Model config (HF config.json format).
    #[arg(long, default_value = "bench/configs/real-30layer.json")]
    config: PathBuf,
    /// Prompt tokens (random ids: the state and the questions' system text).
    #[arg(long, default_value_t = 200)]
    prompt: usize,
    /// Of those, the system text's (the questions; the rest is the state): the prefix a read of
    /// another state with the same questions keeps.
    #[arg(long, default_value_t = 140)]
    system: usize,
    /// Canvas widths, comma-separated (OpenJev's are multiples of 16 up to 64).
    #[arg(long, value_delimiter = ',', default_value = "16,64")]
    widths: Vec<usize>,
    /// Questions (slots) per read, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,3")]
    questions: Vec<usize>,
    /// Timed runs of each measurement after a warm-up.
    #[arg(long, default_value_t = 20)]
    runs: usize,
    /// Storage of the weight matrices (as `bench-gpu --weights`).
    #[arg(long, value_enum, default_value = "f16")]
    weights: random_model::WeightsArg,
    /// Adapter name substring.
    #[arg(long)]
    adapter: Option<String>,
}

/// Reads batched together in the batched row (the re-read rule's four reads).
const BATCHED: usize = 4;

/// `(p50, p95)` of `ms`.
fn percentiles(mut ms: Vec<f64>) -> (f64, f64) {
    ms.sort_by(f64::total_cmp);
    let at = |q: f64| ms[((q * ms.len() as f64).ceil() as usize).clamp(1, ms.len()) - 1];
    (at(0.5), at(0.95))
}

/// Runs `f` once to warm up, then `runs` times; the wall ms of each timed run.
fn time(runs: usize, mut f: impl FnMut() -> Result<()>) -> Result<Vec<f64>> {
    f()?;
    (0..runs)
        .map(|_| {
            let start = Instant::now();
            f()?;
            Ok(start.elapsed().as_secs_f64() * 1e3)
        })
        .collect()
}

/// A read of a seeded canvas `width` wide with `questions` slots spread over it (three labels
/// each), every other row pinned.
struct ReadCase {
    canvases: Vec<Vec<u32>>,
    pinned: Vec<bool>,
    slots: Vec<Slot>,
}

impl ReadCase {
    fn new(width: usize, questions: usize, vocab: usize, seed: u64) -> Self {
        let mut rng = SeededRng::new(seed);
        let mut ids = |n: usize| (0..n).map(|_| rng.below(vocab as u32)).collect::<Vec<u32>>();
        let slots: Vec<Slot> = (0..questions).map(|q| Slot { position: (q + 1) * width / (questions + 1), labels: ids(3) }).collect();
        let pinned = (0..width).map(|r| !slots.iter().any(|s| s.position == r)).collect();
        ReadCase { canvases: (0..BATCHED).map(|_| ids(width)).collect(), pinned, slots }
    }

    fn request(&self, k: usize) -> ReadRequest<'_> {
        ReadRequest { canvas: &self.canvases[k], pinned: Some(&self.pinned), steps: 1, slots: &self.slots }
    }
}

pub fn run(args: Args) -> Result<bool> {
    anyhow::ensure!(args.runs > 0, "--runs: at least 1");
    anyhow::ensure!(args.system < args.prompt, "--system: fewer tokens than --prompt");
    let config = ModelConfig::from_file(&args.config).with_context(|| format!("reading {}", args.config.display()))?;
    let (c, v) = (config.canvas_length, config.text.vocab_size);
    anyhow::ensure!(args.widths.iter().all(|&w| (1..=c).contains(&w)), "--widths: each 1 to canvas_length ({c})");
    anyhow::ensure!(
        args.widths.iter().all(|&w| args.questions.iter().all(|&q| (1..=w).contains(&q))),
        "--questions: each 1 to the narrowest width"
    );
    let env = dg_lab::overrides::gpu_options_from_env()?;
    let ctx = GpuContext::new(&GpuOptions { adapter: args.adapter.clone().or(env.adapter), ..env })?;
    println!("adapter: {} ({:?}, driver {} {})", ctx.info.name, ctx.info.backend, ctx.info.driver, ctx.info.driver_info);
    println!(
        "config: {} ({} layers, hidden {}, vocab {v}, canvas {c}); prompt {} tokens",
        args.config.display(),
        config.text.num_layers(),
        config.text.hidden_size,
        args.prompt
    );
    let (mut model, label) = random_model::upload(ctx, &config, args.weights, args.prompt + c)?;
    println!("weights on the GPU: {:.2} GB ({label}); {} timed runs after a warm-up", model.weight_bytes() as f64 / 1e9, args.runs);
    let mut rng = SeededRng::new(7);
    let prompt: Vec<u32> = (0..args.prompt).map(|_| rng.below(v as u32)).collect();
    let settings = GenerationConfig::default();

    println!("| stage | W | questions | p50 ms | p95 ms | GPU ms (profile) | head GPU ms |");
    println!("|---|---|---|---|---|---|---|");
    let row = |stage: &str, w: &str, q: &str, ms: Vec<f64>, gpu: Option<(f64, f64)>| {
        let (p50, p95) = percentiles(ms);
        let (total, head) = gpu.map_or(("—".into(), "—".into()), |(t, h)| (format!("{t:.2}"), format!("{h:.2}")));
        println!("| {stage} | {w} | {q} | {p50:.2} | {p95:.2} | {total} | {head} |");
    };
    let prefill = time(args.runs, || {
        model.reset();
        Ok(model.encode(&prompt)?)
    })?;
    row(&format!("prefill ({} tokens)", args.prompt), "—", "—", prefill, None);
    let state = &prompt[args.system..];
    let reused = time(args.runs, || {
        anyhow::ensure!(model.truncate_slot(0, args.system) == args.system, "the system text's prefix was not kept");
        Ok(model.encode(state)?)
    })?;
    row(&format!("prefill, {} system tokens kept ({} encoded)", args.system, state.len()), "—", "—", reused, None);
    for &w in &args.widths {
        for &q in &args.questions {
            let case = ReadCase::new(w, q, v, (w * 100 + q) as u64);
            let (ws, qs) = (w.to_string(), q.to_string());
            let reads = time(args.runs, || {
                read(&mut model, &case.request(0), &settings, &mut SeededRng::new(0))?;
                Ok(())
            })?;
            row("read (forward, readback, slot log-probs)", &ws, &qs, reads, None);
            let rows: Vec<usize> = case.slots.iter().map(|s| s.position).collect();
            let mut logits = vec![0f32; rows.len() * v];
            let forward = time(args.runs, || {
                let canvas = ReadCanvas { canvas: &case.canvases[0], conditioning: None, head_rows: &rows };
                Ok(model.read_forwards(0, &[canvas], &mut logits)?)
            })?;
            row("read forward (head at the slot rows)", &ws, &qs, forward, profile(&model));
            if model.max_reads(w) >= BATCHED {
                let requests: Vec<ReadRequest<'_>> = (0..BATCHED).map(|k| case.request(k)).collect();
                let batched = time(args.runs, || {
                    let mut rngs: Vec<SeededRng> = (0..BATCHED as u64).map(SeededRng::new).collect();
                    read_batch(&mut model, &requests, &settings, &mut rngs)?;
                    Ok(())
                })?;
                row(&format!("{BATCHED} reads, one batched forward"), &ws, &qs, batched, profile(&model));
            }
        }
    }
    let canvas: Vec<u32> = (0..c).map(|_| rng.below(v as u32)).collect();
    let full = time(args.runs, || Ok(model.run_step(&canvas, false, None)?))?;
    row(&format!("canvas forward ({c} wide, generation's, no readback)"), &c.to_string(), "—", full, None);
    Ok(true)
}

/// GPU ms of the last read forward and of its head (`Instrumentation::profile_last_read`); None
/// where the adapter has no timestamp queries.
fn profile(model: &GpuModel) -> Option<(f64, f64)> {
    let p = model.profile_last_read().ok()?;
    let total = p.iter().map(|(_, _, ns)| ns).sum::<f64>() / 1e6;
    let head = p.iter().filter(|(scope, _, _)| scope == "head").map(|(_, _, ns)| ns).sum::<f64>() / 1e6;
    Some((total, head))
}

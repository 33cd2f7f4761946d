//! `dg generate`: the model directory, the prompt, the generation settings (generation_config.json
//! overridden by the command line), the backend, the sampler run and its output (`--prompts-file`
//! in `prompts_file`).

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use dg_cpu::CpuError;
use dg_gpu::GpuError;
use dg_model::{GenerationConfig, ModelDir};
use dg_sampler::{DenoiseModel, Generation, ImagePrompt, ResidentModel, SeededRng};

use crate::args::GenerateArgs;
use crate::backend::{self, Backend};
use crate::display::{Mode, Progress};
use crate::error::{Input, input};
use crate::images::{ImageSpec, PreparedImage, TowerDevice, VisionTower};
use crate::report::{Report, Timings};
use crate::settings::{check_positions, resolve_settings};
use crate::text::TextCodec;
use crate::timing::Timed;
use crate::{load, model_dir, prompt};

pub fn run(args: GenerateArgs) -> Result<()> {
    if args.batch.is_some() {
        return Err(input("--batch sets how many lines of --prompts-file generate at once; it needs --prompts-file"));
    }
    let started = Instant::now();
    let dir = model_dir::resolve(args.model.as_deref())?;
    let model = model_dir::open_with_mmproj(&dir, args.mmproj.as_deref())?;
    let config = &model.config;
    // The tokenizer and chat template lie in the model's directory (beside a .gguf file).
    let codec = TextCodec::load(&model)?;
    // Images are decoded and processed now (a bad one is reported before anything loads), and go
    // through the tower once the backend is chosen.
    let images = prompt_images(&args, &model)?;
    let soft_tokens: Option<Vec<usize>> = images.as_ref().map(|(_, images)| images.iter().map(PreparedImage::soft_tokens).collect());
    let placed = images.as_ref().zip(soft_tokens.as_deref()).map(|((spec, _), soft)| (spec, soft));
    let prompt = prompt::build(&args, &model, codec.as_ref(), config.text.vocab_size, placed)?;
    let settings = generation_config(&args, &model)?;
    let c = config.canvas_length;
    let planned = settings.new_canvases(prompt.ids.len(), c);
    check_positions(prompt.ids.len(), planned, c, config.text.max_position_embeddings)?;

    let stderr_tty = std::io::stderr().is_terminal();
    let mode = match (args.quiet, stderr_tty) {
        (true, _) => Mode::Quiet,
        (false, true) => Mode::Live,
        (false, false) => Mode::Lines,
    };
    let stream_stdout = mode == Mode::Live && !args.json && std::io::stdout().is_terminal();
    let choice = backend::choose(args.device.backend, args.device.adapter.as_deref())?;
    if mode != Mode::Quiet {
        eprintln!("backend: {}", choice.description);
        eprintln!(
            "model: {} ({} parameters){}",
            dir.display(),
            config.text.num_parameters(),
            if model_dir::is_bundled(&dir) { ", the bundled random model: its text is noise" } else { "" }
        );
        eprintln!(
            "prompt: {} tokens; up to {planned} canvas(es) of {c} tokens, {} steps each, seed {}",
            prompt.ids.len(),
            settings.max_denoising_steps,
            args.sampler.seed
        );
    }

    // The tower runs on the chosen backend, and its weights are gone before the model's load.
    let images = match images {
        Some((_, prepared)) => Some(embed_images(&args, &model, &choice.backend, &prepared, mode != Mode::Quiet)?),
        None => None,
    };

    let load_start = Instant::now();
    let mut progress = Progress::new(mode, stream_stdout, codec.as_ref(), &settings.eos_token_ids, planned, settings.max_denoising_steps);
    let positions = prompt.ids.len() + planned * c;
    let backend_name = choice.name();
    let adapter = choice.adapter();
    let (generation, mut timings) = match choice.backend {
        Backend::Cpu => {
            let cpu = load::cpu(&model, args.device.weights)?;
            let load = load_start.elapsed();
            let mut generate = |m: &mut dyn DenoiseModel<Error = CpuError>, rng: &mut SeededRng| {
                dg_sampler::generate(m, &prompt.ids, &settings, c, config.text.vocab_size, rng, &mut progress)
            };
            match images {
                Some(embeddings) => sample(ImagePrompt::new(cpu, embeddings), load, args.sampler.seed, |m, rng| generate(m, rng))?,
                None => sample(cpu, load, args.sampler.seed, |m, rng| generate(m, rng))?,
            }
        }
        Backend::Gpu(ctx) => {
            // Encoder, canvas forward and the sampler's per-row work on the GPU; the weights go
            // from the checkpoint's memory map to the device as stored.
            let report = match mode {
                Mode::Quiet => load::Report::Quiet,
                Mode::Live => load::Report::Bar,
                Mode::Lines => load::Report::Summary,
            };
            let gpu = load::gpu(&model, *ctx, positions, args.device.weights, report)?;
            let load = load_start.elapsed();
            let mut generate = |m: &mut dyn ResidentModel<Error = GpuError>, rng: &mut SeededRng| {
                dg_sampler::generate_resident(m, &prompt.ids, &settings, c, config.text.vocab_size, rng, &mut progress)
            };
            match images {
                Some(embeddings) => sample(ImagePrompt::new(gpu, embeddings), load, args.sampler.seed, |m, rng| generate(m, rng))?,
                None => sample(gpu, load, args.sampler.seed, |m, rng| generate(m, rng))?,
            }
        }
    };
    timings.total = started.elapsed();

    let report = Report::new(
        &dir,
        backend_name,
        adapter,
        args.sampler.seed,
        &prompt,
        &generation,
        &settings,
        codec.as_ref(),
        progress.canvases,
        timings,
    )?;
    if mode != Mode::Quiet {
        eprintln!("{}", report.summary(mode == Mode::Live));
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report.to_json())?);
    } else if !stream_stdout {
        println!("{}", report.plain_output());
    }
    Ok(())
}

/// The `--image` files, each decoded and processed at `--image-tokens`; an error names the file at
/// fault.
fn prompt_images(args: &GenerateArgs, model: &ModelDir) -> Result<Option<(ImageSpec, Vec<PreparedImage>)>> {
    if args.image.is_empty() {
        return Ok(None);
    }
    let spec = ImageSpec::of(model)?;
    let processor = spec.processor(args.image_tokens).context(Input("--image-tokens".into()))?;
    let images = args
        .image
        .iter()
        .map(|path| {
            let bytes = std::fs::read(path).context(Input(format!("--image {}: cannot read the file", path.display())))?;
            crate::images::prepare(&bytes, &processor).map_err(|e| input(format!("--image {}: {e}", path.display())))
        })
        .collect::<Result<_>>()?;
    Ok(Some((spec, images)))
}

/// The rows of the `--image` files' soft tokens, in order, from the tower on `backend`'s device
/// (the tower dropped after); with `report`, a line saying where it ran.
fn embed_images(args: &GenerateArgs, model: &ModelDir, backend: &Backend, images: &[PreparedImage], report: bool) -> Result<Vec<f32>> {
    let start = Instant::now();
    let tower = VisionTower::load(model, TowerDevice::of(backend, args.device.weights))?;
    let mut rows = Vec::new();
    for (path, image) in args.image.iter().zip(images) {
        let encoded = tower.embed(image).with_context(|| format!("--image {}", path.display()))?;
        rows.extend(encoded.embeddings);
    }
    if report {
        eprintln!("images: {} through the vision tower {} in {:.2} s", images.len(), tower.describe(), start.elapsed().as_secs_f64());
    }
    Ok(rows)
}

/// generation_config.json of the directory, overridden by the command line, resolved.
fn generation_config(args: &GenerateArgs, model: &ModelDir) -> Result<GenerationConfig> {
    resolve_settings(model, args.sampler.overrides())
}

/// Runs `generate` (host or resident) on `model` with a seeded random source; returns the
/// generation and its timings.
fn sample<M, E>(
    model: M,
    load: Duration,
    seed: u64,
    generate: impl FnOnce(&mut Timed<M>, &mut SeededRng) -> Result<Generation, E>,
) -> Result<(Generation, Timings)>
where
    E: std::error::Error + Send + Sync + 'static,
{
    let mut timed = Timed::new(model);
    let mut rng = SeededRng::new(seed);
    let start = Instant::now();
    let generation = generate(&mut timed, &mut rng).context("generation failed")?;
    let timings = Timings {
        load,
        prefill: timed.prefill,
        commits: timed.commits,
        forwards: timed.forwards,
        generate: start.elapsed(),
        total: Duration::ZERO,
    };
    Ok((generation, timings))
}

//! `cargo xtask parity`: runs every check a reference directory supports on each backend and
//! prints one `PASS|FAIL <check> <metrics>` line per check, then a summary.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use dg_cpu::CpuModel;
use dg_gpu::{GpuContext, GpuOptions, WeightFormat};
use dg_model::ModelDir;
use dg_parity::checks::{Backend, CheckResult, logits_checks};
use dg_parity::cpu::CpuBackend;
use dg_parity::gpu::GpuBackend;
use dg_parity::reference::Reference;
use dg_parity::replay::{generate_check, replay_config};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// A directory in the reference format (repeatable). Default: every fixture under fixtures/.
    #[arg(long = "model")]
    models: Vec<PathBuf>,
    /// Which backend(s) to check.
    #[arg(long, value_enum, default_value = "cpu")]
    backend: BackendChoice,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum BackendChoice {
    Cpu,
    Gpu,
    /// The GPU with BF16 weight storage: checked against the dump only where the checkpoint's
    /// matrices are BF16 (exact); f32 checkpoints are covered by dg-parity's tests against the CPU
    /// on the same rounded weights.
    GpuBf16,
    /// cpu, gpu and gpu-bf16.
    All,
}

/// Runs the checks; `Ok(false)` when any check failed.
pub fn run(args: Args) -> Result<bool> {
    let dirs = if args.models.is_empty() { committed_fixtures()? } else { args.models };
    if dirs.is_empty() {
        bail!("no reference directories found");
    }
    let (mut passed, mut failed) = (0usize, 0usize);
    for dir in &dirs {
        let label = dir.file_name().map_or_else(|| dir.display().to_string(), |n| n.to_string_lossy().into_owned());
        let started = Instant::now();
        let results = check_dir(dir, args.backend).with_context(|| format!("checking {}", dir.display()))?;
        for (backend, r) in &results {
            println!("{} {backend}:{label}/{} {}", if r.passed { "PASS" } else { "FAIL" }, r.name, r.detail);
            if r.passed {
                passed += 1;
            } else {
                failed += 1;
            }
        }
        eprintln!("  ({label}: {:.1}s)", started.elapsed().as_secs_f64());
    }
    println!("parity: {passed} passed, {failed} failed");
    Ok(failed == 0)
}

fn check_dir(dir: &Path, choice: BackendChoice) -> Result<Vec<(&'static str, CheckResult)>> {
    let reference = Reference::open(dir)?;
    let model_dir = ModelDir::open(dir)?;
    if reference.meta.canvas_length != model_dir.config.canvas_length {
        bail!("reference.json canvas_length {} differs from config.json {}", reference.meta.canvas_length, model_dir.config.canvas_length);
    }
    let weights = model_dir.load_weights()?;
    let mut backends: Vec<Box<dyn Backend>> = Vec::new();
    if matches!(choice, BackendChoice::Cpu | BackendChoice::All) {
        backends.push(Box::new(CpuBackend(CpuModel::new(model_dir.config.clone(), weights.clone()))));
    }
    let max_context = sequence_length(&reference).max(1);
    if matches!(choice, BackendChoice::Gpu | BackendChoice::All) {
        let ctx = GpuContext::new(&GpuOptions::from_env()?)?;
        // A quantized checkpoint's matrices reach the GPU in their ggml blocks, as `dg` uploads
        // them (the kernels that dequantize them are what this checks); others in f32.
        let gpu = match model_dir.has_quantized_matrices() {
            true => GpuBackend::stored(ctx, &model_dir.config, &model_dir.checkpoint, weights.clone(), max_context, WeightFormat::F32),
            false => GpuBackend::new(ctx, &model_dir.config, weights.clone(), max_context),
        }
        .map_err(|e| anyhow::anyhow!(e))?;
        backends.push(Box::new(gpu));
    }
    if matches!(choice, BackendChoice::GpuBf16 | BackendChoice::All) {
        if model_dir.matrices_are_bf16() {
            let ctx = GpuContext::new(&GpuOptions::from_env()?)?;
            let gpu = GpuBackend::with_format(ctx, &model_dir.config, weights, max_context, WeightFormat::Bf16)
                .map_err(|e| anyhow::anyhow!(e))?;
            backends.push(Box::new(gpu));
        } else if choice == BackendChoice::GpuBf16 {
            let label = dir.file_name().map_or_else(|| dir.display().to_string(), |n| n.to_string_lossy().into_owned());
            eprintln!("  SKIP gpu-bf16:{label}: an f32 checkpoint (BF16 storage would round it; the dump is not its reference)");
        }
    }
    let gen_cfg = replay_config(&reference, &model_dir.generation, &model_dir.config)?;
    let mut out = Vec::new();
    for backend in &mut backends {
        let name = backend.name();
        let mut results = logits_checks(&reference, backend.as_mut())?;
        if reference.has("prompt_ids") && reference.has("canvas_ids") {
            let (prompt, canvas) = (reference.ids("prompt_ids")?, reference.ids("canvas_ids")?);
            if let Some(r) = backend.layer_check(&prompt, &canvas) {
                results.push(r.map_err(|e| anyhow::anyhow!("layer check: {e}"))?);
            }
        }
        if reference.has("prompt_ids") {
            let prompt = reference.ids("prompt_ids")?;
            let block2 = if reference.has("block2_ids") { Some(reference.ids("block2_ids")?) } else { None };
            let blocks: Vec<&[u32]> = std::iter::once(&prompt[..]).chain(block2.as_deref()).collect();
            if let Some(r) = backend.cache_check(&blocks) {
                results.push(r.map_err(|e| anyhow::anyhow!("cache check: {e}"))?);
            }
        }
        results.extend(generate_check(&reference, backend.as_mut(), &model_dir.config, &gen_cfg)?);
        if results.is_empty() {
            bail!("{} holds no check this tool knows", dir.display());
        }
        out.extend(results.into_iter().map(|r| (name, r)));
    }
    Ok(out)
}

/// The longest context any check of `reference` encodes (prompt plus generated canvases).
fn sequence_length(reference: &Reference) -> usize {
    let len = |name: &str| reference.ids(name).map(|v| v.len()).unwrap_or(0);
    len("gen_sequences").max(len("prompt_ids") + len("block2_ids"))
}

/// Every directory under `fixtures/` that holds a `reference.json`.
fn committed_fixtures() -> Result<Vec<PathBuf>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .with_context(|| format!("reading {}", root.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("reference.json").exists())
        .collect();
    dirs.sort();
    Ok(dirs)
}

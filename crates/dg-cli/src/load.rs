//! Putting a model directory's weights where the backend computes: the GPU takes the checkpoint's
//! tensors as stored, straight from the memory map ([`dg_gpu::GpuModel::from_source`]); only the
//! CPU backend widens them to f32 (dequantizes quantized ones). With a quantization scheme
//! (`--weights q8_0|q4_k_m`) the checkpoint's matrices are quantized on the way, tensor by tensor.
//! Reports the load's throughput and, on a terminal, a progress bar.

use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use dg_cpu::CpuModel;
use dg_gpu::{GpuContext, GpuError, GpuModel, UploadProgress};
use dg_model::{ModelDir, Quantized, Scheme, TensorSource};

use crate::args::WeightsArg;
use crate::error::Input;
use crate::weights::WeightChoice;

/// How much a load reports on stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Report {
    /// Nothing.
    Quiet,
    /// One summary line.
    Summary,
    /// A progress bar redrawn in place, then the summary line.
    Bar,
}

/// The checkpoint's tensors, quantized by `scheme` where one is given.
fn source(model: &ModelDir, scheme: Option<Scheme>) -> Box<dyn TensorSource + '_> {
    match scheme {
        Some(scheme) => Box::new(Quantized { inner: &model.checkpoint, scheme, config: &model.config.text }),
        None => Box::new(&model.checkpoint),
    }
}

/// The model's weights in f32 for the CPU backend (quantized first where `weights` names a
/// scheme: [`crate::weights::choose`]).
pub fn cpu(model: &ModelDir, weights: WeightsArg) -> Result<CpuModel> {
    let scheme = crate::weights::choose(model, weights, false).scheme;
    let weights = dg_model::Weights::build(&*source(model, scheme), &model.config.text)
        .context(Input(format!("cannot load the weights of {}", model.dir.display())))?;
    Ok(CpuModel::new(model.config.clone(), weights))
}

/// The model on the GPU with matrices as `weights` asks on this adapter
/// ([`crate::weights::choose`]), for sequences of up to `max_context` tokens.
pub fn gpu(model: &ModelDir, ctx: GpuContext, max_context: usize, weights: WeightsArg, report: Report) -> Result<GpuModel> {
    gpu_slots(model, ctx, max_context, 1, weights, report)
}

/// [`gpu`] with a KV cache for each of `slots` sequences (a batch denoised one forward a step).
pub fn gpu_slots(
    model: &ModelDir,
    ctx: GpuContext,
    max_context: usize,
    slots: usize,
    weights: WeightsArg,
    report: Report,
) -> Result<GpuModel> {
    let coop = ctx.coop_matrix;
    let choice = crate::weights::choose(model, weights, coop);
    // What the arena's caches will store, for the out-of-memory message below.
    let cache = dg_gpu::cache_format(&ctx, &model.config, choice.format);
    let start = Instant::now();
    let mut bar = Bar { report, last: None };
    let src = source(model, choice.scheme);
    let format = choice.format;
    let mut gpu = GpuModel::load(
        ctx,
        &model.config,
        &*src,
        dg_gpu::ModelOptions::new(max_context).slots(slots).format(format).progress(&mut |p| bar.draw(p, start.elapsed())),
    )
    .map_err(|e| match e {
        GpuError::Model(e) => anyhow::Error::new(e).context(Input(format!("cannot load the weights of {}", model.dir.display()))),
        // A weight the chosen storage cannot hold is the checkpoint's, and the user's choice.
        e @ GpuError::OutOfRange { .. } => {
            anyhow::Error::new(e).context(Input(format!("cannot load the weights of {}", model.dir.display())))
        }
        // Out of device memory: say what the sequences' buffers take and what lowers it.
        e @ GpuError::OutOfMemory { .. } => {
            let arena = dg_gpu::arena_bytes(&model.config, max_context, slots, cache, (u64::MAX, coop)).unwrap_or(0);
            anyhow::Error::new(e).context(format!(
                "the GPU ran out of memory for the model's weights and {slots} sequence(s) of up to {max_context} positions \
                         (their activations and caches take about {:.2} GB beside the weights; `dg info` prints them by context): \
                         lower --context or --batch, or store the weights smaller (--weights q4_k_m); at long contexts \
                         DG_SCORES_BYTES also caps the attention's scores buffer (at most 1 GiB)",
                arena as f64 / 1e9
            ))
        }
        other => anyhow::Error::new(other).context("cannot upload the model to the GPU"),
    })?;
    bar.clear();
    if report != Report::Quiet {
        let (bytes, params) = (gpu.weight_bytes(), gpu.weight_parameters().max(1));
        let stored = bar.last.map_or(0, |p| p.stored_bytes);
        eprintln!(
            "weights on the GPU: {:.1} MiB, {} ({:.2} bytes per parameter), loaded in {:.2} s ({})",
            bytes as f64 / 1_048_576.0,
            storage_label(model, choice),
            bytes as f64 / params as f64,
            start.elapsed().as_secs_f64(),
            throughput(stored, start.elapsed())
        );
        let arena = gpu.arena_bytes() as f64 / 1_048_576.0;
        eprintln!("caches and activations on the GPU: {arena:.1} MiB for {slots} sequence(s) of up to {max_context} positions");
    }
    // Every kernel a generation uses, compiled now rather than while the first request waits. A
    // failure only leaves the compilation to first use, which reports its own errors.
    match gpu.warm_up() {
        Ok(warm) if report != Report::Quiet => {
            eprintln!("kernels compiled ahead: {} of {} in {:.2} s", warm.compiled, warm.kernels, warm.elapsed.as_secs_f64())
        }
        Ok(_) => {}
        Err(e) => eprintln!("warning: the kernels were not compiled ahead ({e}); the first request compiles them"),
    }
    Ok(gpu)
}

/// How the matrices are stored, for the summary: the scheme that quantized them at load, the
/// format and a quantized checkpoint's blocks, or the format.
fn storage_label(model: &ModelDir, choice: WeightChoice) -> String {
    let format = crate::weights::name(choice.format);
    match choice.scheme {
        Some(s) => format!("{} (the rest {format})", s.name()),
        None if model.has_quantized_matrices() => format!("the checkpoint's quantized blocks (the rest {format})"),
        None => format.to_string(),
    }
}

/// The rate checkpoint bytes were read at: `6.60 GB/s`, or in MB/s below 1 GB/s.
fn throughput(bytes: u64, elapsed: Duration) -> String {
    let rate = bytes as f64 / elapsed.as_secs_f64().max(1e-9);
    if rate >= 1e9 { format!("{:.2} GB/s from the checkpoint", rate / 1e9) } else { format!("{:.1} MB/s from the checkpoint", rate / 1e6) }
}

/// The progress bar of a load.
struct Bar {
    report: Report,
    last: Option<UploadProgress>,
}

impl Bar {
    const WIDTH: usize = 30;

    fn draw(&mut self, p: &UploadProgress, elapsed: Duration) {
        let previous = self.last.replace(*p);
        if self.report != Report::Bar {
            return;
        }
        let fraction = p.parameters as f64 / p.total_parameters.max(1) as f64;
        let filled = (fraction * Self::WIDTH as f64).round() as usize;
        // Redraw only when the bar or the percentage moves.
        if previous.is_some_and(|q| (q.parameters * 100 / q.total_parameters.max(1)) == (p.parameters * 100 / p.total_parameters.max(1))) {
            return;
        }
        let mut err = std::io::stderr();
        let _ = write!(
            err,
            "\r\x1b[Kloading weights [{}{}] {:>3.0}%  {}",
            "#".repeat(filled.min(Self::WIDTH)),
            " ".repeat(Self::WIDTH - filled.min(Self::WIDTH)),
            fraction * 100.0,
            throughput(p.stored_bytes, elapsed)
        );
        let _ = err.flush();
    }

    fn clear(&self) {
        if self.report == Report::Bar && self.last.is_some() {
            let _ = write!(std::io::stderr(), "\r\x1b[K");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throughput_is_in_gb_per_second_or_mb_below_one() {
        assert_eq!(throughput(6_600_000_000, Duration::from_secs(1)), "6.60 GB/s from the checkpoint");
        assert_eq!(throughput(700_000, Duration::from_millis(500)), "1.4 MB/s from the checkpoint");
    }
}

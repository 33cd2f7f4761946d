//! `cargo xtask`: the project's automation (matklad's cargo-xtask convention).
//!
//! `cargo xtask parity [--model DIR]... [--backend cpu|gpu|all]` checks reference directories;
//! `cargo xtask bench [--quick]` runs the criterion benchmarks; `cargo xtask bench-gpu` times the
//! GPU canvas forward with a per-kernel profile; `cargo xtask bench-generate` times a GPU-resident
//! generation; `cargo xtask shader-stats` prints the driver's compile statistics of the kernels;
//! `cargo xtask coopmat2-probe` times GEMMs written with `VK_NV_cooperative_matrix2` (dg-lab);
//! `cargo xtask coop-configs` lists the driver's cooperative-matrix configurations (dg-lab);
//! `cargo xtask write-checkpoint` writes a random model directory, `cargo xtask write-gguf` a model
//! directory's weights as GGUF, and `cargo xtask load-memory` reports a command's peak host memory.
//! `cargo xtask probe NAME` runs a hardware probe of dg-lab (`--list` lists them); `cargo xtask quant-accuracy`
//! measures what the quantization schemes do to logits and generation on the CPU.

mod bench;
mod bench_batch;
mod bench_generate;
mod bench_gpu;
mod bench_read;
mod bench_tower;
mod load_memory;
mod parity;
mod probe;
mod quant_accuracy;
mod random_model;
mod shader_stats;
mod write_checkpoint;
mod write_gguf;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "xtask", about = "dg project automation")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Check dg against HF transformers reference dumps (all committed fixtures by default).
    Parity(parity::Args),
    /// Run the criterion benchmarks and print a table (`--quick`: CI smoke sizes).
    Bench(bench::Args),
    /// Time the GPU canvas forward at a given geometry on random weights.
    BenchGpu(bench_gpu::Args),
    /// Time a GPU-resident generation (prefill, steps, tokens/s) on random weights.
    BenchGenerate(bench_generate::Args),
    /// Time batched GPU generation (B sequences, one forward a step) at several batch sizes.
    BenchBatch(bench_batch::Args),
    /// Time typed reads (prefill, read forwards, head at the slot rows) on random weights.
    BenchRead(bench_read::Args),
    /// Time the vision tower on the GPU at the real vision geometry on random weights.
    BenchTower(bench_tower::Args),
    /// Time GEMMs written with VK_NV_cooperative_matrix2 (SPIR-V from bench/coopmat2) on the adapter.
    Coopmat2Probe(dg_lab::coopmat2::Args),
    /// List the Vulkan driver's cooperative-matrix configurations (the 8-bit ones wgpu omits).
    CoopConfigs(dg_lab::coop_configs::Args),
    /// Print the Vulkan driver's compile statistics (registers, spills...) of the GPU kernels.
    ShaderStats(shader_stats::Args),
    /// Write a model directory with seeded random weights for a config (sharded on request).
    WriteCheckpoint(write_checkpoint::Args),
    /// Write a model directory's text weights as a GGUF file (types as stored, llama.cpp's names).
    WriteGguf(write_gguf::Args),
    /// Run a command and report its peak anonymous resident memory.
    LoadMemory(load_memory::Args),
    /// Run a hardware probe (kernel and GPU timings) by name; `--list` lists them.
    Probe(probe::Args),
    /// Logits error and sampler behaviour of each quantization scheme against the stored weights (CPU, f32).
    QuantAccuracy(quant_accuracy::Args),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Parity(args) => parity::run(args),
        Command::Bench(args) => bench::run(args),
        Command::BenchGpu(args) => bench_gpu::run(args),
        Command::BenchGenerate(args) => bench_generate::run(args),
        Command::BenchBatch(args) => bench_batch::run(args),
        Command::BenchRead(args) => bench_read::run(args),
        Command::BenchTower(args) => bench_tower::run(args),
        Command::ShaderStats(args) => shader_stats::run(args),
        Command::Coopmat2Probe(args) => dg_lab::coopmat2::run(args),
        Command::CoopConfigs(args) => dg_lab::coop_configs::run(args),
        Command::WriteCheckpoint(args) => write_checkpoint::run(args),
        Command::WriteGguf(args) => write_gguf::run(args),
        Command::LoadMemory(args) => load_memory::run(args),
        Command::Probe(args) => probe::run(args),
        Command::QuantAccuracy(args) => quant_accuracy::run(args),
    };
    match result {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}

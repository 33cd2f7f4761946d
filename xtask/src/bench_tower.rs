//! `cargo xtask bench-tower`: the Gemma 4 vision tower and its projection on the GPU
//! (`dg_gpu::GpuVisionTower`) at the real vision geometry of google/diffusiongemma-26B-A4B-it
//! (27 layers, hidden 1152, MLP 4304, 16 heads of 72, patch 16, 3x3 pooling, 2-D RoPE with θ = 100,
//! a position table of 10240, standardized, projected into 2816) on random weights: one image of
//! each `--tokens` soft tokens (a grid of whole pooling blocks, no padding: 280 soft tokens are
//! 20x14 of them, 2520 patches; 1120 are 40x28, 10080 patches), the median and min wall time of
//! `--runs` passes after `--warmup` (each pass records its plan, uploads the image, runs and
//! reads the rows back). bench/torch_tower.py times transformers' tower on the same images.

use anyhow::{Result, ensure};
use dg_gpu::{GpuContext, GpuOptions, GpuVisionTower, WeightFormat};
use dg_model::{RandomWeights, VisionConfig};
use std::time::Instant;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Soft tokens of the images timed, comma-separated (each in the grids below).
    #[arg(long, value_delimiter = ',', default_value = "280,1120")]
    tokens: Vec<usize>,
    /// Timed passes of each image after the warm-up.
    #[arg(long, default_value_t = 10)]
    runs: usize,
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    /// Layers of the tower (27 in the model; fewer for a quick run on a slow device).
    #[arg(long, default_value_t = 27)]
    layers: usize,
    /// Storage of the weight matrices: f16 (the tensor cores where the device has them), bf16 or f32.
    #[arg(long, default_value = "f16")]
    weights: String,
    /// Adapter name substring.
    #[arg(long)]
    adapter: Option<String>,
}

/// The text model's hidden size the projection maps into.
const TEXT_HIDDEN: usize = 2816;

/// The real `vision_config` with `layers` layers.
fn real_geometry(layers: usize) -> VisionConfig {
    VisionConfig {
        hidden_size: 1152,
        intermediate_size: 4304,
        num_layers: layers,
        num_heads: 16,
        num_kv_heads: 16,
        head_dim: 72,
        rms_norm_eps: 1e-6,
        patch_size: 16,
        pooling_kernel_size: 3,
        position_embedding_size: 10240,
        rope_theta: 100.0,
        standardize: true,
    }
}

/// Soft-token grids (width x height) of the budgets (transformers' aspect of a 10:7 image).
fn grid(tokens: usize) -> Option<(usize, usize)> {
    [(70, (10, 7)), (280, (20, 14)), (560, (28, 20)), (1120, (40, 28))].into_iter().find(|&(t, _)| t == tokens).map(|(_, g)| g)
}

pub fn run(args: Args) -> Result<bool> {
    ensure!(args.runs > 0, "--runs: at least 1");
    let format = match args.weights.as_str() {
        "f16" => WeightFormat::F16,
        "bf16" => WeightFormat::Bf16,
        "f32" => WeightFormat::F32,
        other => anyhow::bail!("--weights {other}: f16, bf16 or f32"),
    };
    let c = real_geometry(args.layers);
    let env = dg_lab::overrides::gpu_options_from_env()?;
    let ctx = GpuContext::new(&GpuOptions { adapter: args.adapter.clone().or(env.adapter), ..env })?;
    println!("adapter: {} ({:?}, driver {} {})", ctx.info.name, ctx.info.backend, ctx.info.driver, ctx.info.driver_info);
    let mut tower = GpuVisionTower::load(&ctx, &c, TEXT_HIDDEN, &RandomWeights::new(0), format)?;
    println!(
        "vision tower: {} layers, hidden {}, MLP {}, {} heads of {}; projection into {TEXT_HIDDEN}; weights {:.2} GB ({})",
        c.num_layers,
        c.hidden_size,
        c.intermediate_size,
        c.num_heads,
        c.head_dim,
        tower.bytes as f64 / 1e9,
        args.weights
    );
    for &tokens in &args.tokens {
        let Some((tw, th)) = grid(tokens) else { anyhow::bail!("--tokens {tokens}: one of 70, 280, 560, 1120") };
        let k = c.pooling_kernel_size;
        let (w, h) = (tw * k, th * k);
        let positions: Vec<[u32; 2]> = (0..h).flat_map(|y| (0..w).map(move |x| [x as u32, y as u32])).collect();
        let pixels: Vec<f32> = (0..positions.len() * c.patch_width()).map(|i| ((i * 7919) % 256) as f32 / 255.0).collect();
        let mut pass = || -> Result<f64> {
            let start = Instant::now();
            let rows = tower.image_embeddings(&ctx, &pixels, &positions)?;
            ensure!(rows.len() == tokens * TEXT_HIDDEN && rows.iter().all(|v| v.is_finite()), "{tokens} soft tokens: bad output");
            Ok(start.elapsed().as_secs_f64() * 1e3)
        };
        for _ in 0..args.warmup {
            pass()?;
        }
        let mut ms = (0..args.runs).map(|_| pass()).collect::<Result<Vec<f64>>>()?;
        ms.sort_by(f64::total_cmp);
        println!(
            "dg tower {tokens} soft tokens ({} patches): median {:.2} ms, min {:.2} ms over {}",
            positions.len(),
            ms[ms.len() / 2],
            ms[0],
            args.runs
        );
    }
    Ok(true)
}

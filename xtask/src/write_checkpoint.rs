//! `cargo xtask write-checkpoint`: a model directory on disk with seeded random weights for any
//! config (`config.json` plus `model.safetensors`, or shards with `model.safetensors.index.json`
//! as `save_pretrained` writes them), for measuring loading at the real geometry without the
//! real checkpoint.
//!
//! Each file is written tensor by tensor (header first, then each tensor's bytes), so the writer
//! holds one tensor at a time, whatever the model's size.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use dg_model::{ModelConfig, RandomWeights, TensorSource, tensor_manifest};
use serde_json::json;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Dtype {
    F32,
    Bf16,
    F16,
}

impl Dtype {
    fn size(self) -> usize {
        if self == Dtype::F32 { 4 } else { 2 }
    }

    fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "F32",
            Dtype::Bf16 => "BF16",
            Dtype::F16 => "F16",
        }
    }

    fn encode(self, values: &[f32]) -> Vec<u8> {
        match self {
            Dtype::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            Dtype::Bf16 => values.iter().flat_map(|&v| half::bf16::from_f32(v).to_le_bytes()).collect(),
            Dtype::F16 => values.iter().flat_map(|&v| half::f16::from_f32(v).to_le_bytes()).collect(),
        }
    }
}

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Model config (HF config.json format), copied into the directory.
    #[arg(long)]
    config: PathBuf,
    /// Directory to write (created; must not hold a checkpoint already).
    #[arg(long)]
    out: PathBuf,
    /// Stored dtype of every tensor.
    #[arg(long, value_enum, default_value = "bf16")]
    dtype: Dtype,
    /// Largest shard in GB; 0 writes one `model.safetensors`.
    #[arg(long, default_value_t = 0.0)]
    shard_gb: f64,
    /// Seed of the random weights.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

pub fn run(args: Args) -> Result<bool> {
    let config = ModelConfig::from_file(&args.config)?;
    std::fs::create_dir_all(&args.out).with_context(|| format!("creating {}", args.out.display()))?;
    for existing in ["model.safetensors", "model.safetensors.index.json"] {
        if args.out.join(existing).exists() {
            bail!("{} already holds {existing}; choose an empty directory", args.out.display());
        }
    }
    std::fs::copy(&args.config, args.out.join("config.json")).context("copying the config")?;
    let manifest = tensor_manifest(&config.text);
    let limit = if args.shard_gb > 0.0 { (args.shard_gb * 1e9) as usize } else { usize::MAX };
    let mut shards: Vec<Vec<(String, Vec<usize>)>> = vec![Vec::new()];
    let mut size = 0;
    for (name, shape) in manifest {
        let bytes = shape.iter().product::<usize>() * args.dtype.size();
        if size > 0 && size + bytes > limit {
            shards.push(Vec::new());
            size = 0;
        }
        size += bytes;
        shards.last_mut().unwrap().push((name, shape));
    }
    let source = RandomWeights::new(args.seed);
    let count = shards.len();
    let mut weight_map = BTreeMap::new();
    let mut total = 0;
    for (i, tensors) in shards.iter().enumerate() {
        let file = if count == 1 { "model.safetensors".to_string() } else { format!("model-{:05}-of-{count:05}.safetensors", i + 1) };
        total += write_file(&args.out.join(&file), tensors, args.dtype, &source)?;
        for (name, _) in tensors {
            weight_map.insert(name.clone(), file.clone());
        }
    }
    if count > 1 {
        let index = json!({ "metadata": { "total_size": total }, "weight_map": weight_map });
        std::fs::write(args.out.join("model.safetensors.index.json"), serde_json::to_string_pretty(&index)?)?;
    }
    println!("wrote {} ({:.2} GB in {count} file(s), {})", args.out.display(), total as f64 / 1e9, args.dtype.name());
    Ok(true)
}

/// One safetensors file: the header with every tensor's offsets, then the tensors in order.
fn write_file(path: &Path, tensors: &[(String, Vec<usize>)], dtype: Dtype, source: &RandomWeights) -> Result<usize> {
    let mut header = serde_json::Map::new();
    let mut offset = 0;
    for (name, shape) in tensors {
        let bytes = shape.iter().product::<usize>() * dtype.size();
        header.insert(name.clone(), json!({ "dtype": dtype.name(), "shape": shape, "data_offsets": [offset, offset + bytes] }));
        offset += bytes;
    }
    let mut text = serde_json::to_string(&header)?;
    // The data starts 8-byte aligned, as the safetensors writer pads it.
    while !(8 + text.len()).is_multiple_of(8) {
        text.push(' ');
    }
    let mut out = BufWriter::with_capacity(8 << 20, File::create(path).with_context(|| format!("creating {}", path.display()))?);
    out.write_all(&(text.len() as u64).to_le_bytes())?;
    out.write_all(text.as_bytes())?;
    for (name, shape) in tensors {
        out.write_all(&dtype.encode(&source.get(name, shape)?))?;
    }
    out.flush()?;
    Ok(offset)
}

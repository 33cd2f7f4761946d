//! `cargo xtask write-gguf --model DIR --out FILE.gguf`: a model directory's text weights as a GGUF
//! file, every tensor in the type the checkpoint stores it in, with llama.cpp's DiffusionGemma
//! names and metadata (`dg_model::gguf`), and the directory's tokenizer and chat template as
//! llama.cpp's converter writes them (`dg_model::gguf::Vocab::from_hf_dir`). With `--copy-files`, the directory's other files
//! (config, tokenizer, chat template, reference dumps) are copied beside it, so the output's
//! directory is a model directory whose weights are `model.gguf`. With `--scheme q8_0|q4_k_m`
//! the matrices the scheme names are quantized by dg's quantizers ([`dg_model::Quantized`]) and
//! the rest kept as stored (the oracle's GGUF fixtures are made this way).

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use dg_model::ModelDir;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The model directory to convert.
    #[arg(long)]
    model: PathBuf,
    /// The GGUF file to write.
    #[arg(long)]
    out: PathBuf,
    /// Copy the directory's files other than its safetensors beside the output.
    #[arg(long)]
    copy_files: bool,
    /// Quantize with this scheme (`q8_0`, `q4_k_m`); without it every tensor stays as stored.
    #[arg(long)]
    scheme: Option<String>,
}

pub fn run(args: Args) -> Result<bool> {
    let model = ModelDir::open(&args.model).with_context(|| format!("opening {}", args.model.display()))?;
    if model.checkpoint.gguf().is_some() {
        bail!("{} is already a GGUF model", args.model.display());
    }
    let out_dir = args.out.parent().filter(|p| !p.as_os_str().is_empty()).map(PathBuf::from).unwrap_or_else(|| ".".into());
    std::fs::create_dir_all(&out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    let vocab = model.vocab().with_context(|| format!("reading the tokenizer of {}", args.model.display()))?;
    match &args.scheme {
        None => {
            dg_model::gguf::write_model_as_stored(&args.out, &model.config, Some(&model.generation), vocab.as_ref(), &model.checkpoint)?
        }
        Some(name) => {
            let scheme = dg_model::Scheme::parse(name)?;
            let src = dg_model::Quantized { inner: &model.checkpoint, scheme, config: &model.config.text };
            dg_model::gguf::write_model_as_stored(&args.out, &model.config, Some(&model.generation), vocab.as_ref(), &src)?;
        }
    }
    if args.copy_files {
        for entry in std::fs::read_dir(&args.model)? {
            let entry = entry?;
            let name = entry.file_name();
            let skip = name.to_string_lossy().starts_with("model.safetensors") || entry.path() == args.out;
            if !skip && entry.file_type()?.is_file() {
                std::fs::copy(entry.path(), out_dir.join(&name)).with_context(|| format!("copying {}", entry.path().display()))?;
            }
        }
    }
    let size = std::fs::metadata(&args.out)?.len();
    eprintln!(
        "wrote {} ({:.1} MiB, {} tensors)",
        args.out.display(),
        size as f64 / 1_048_576.0,
        dg_model::tensor_manifest(&model.config.text).len()
    );
    Ok(true)
}

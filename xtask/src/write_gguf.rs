//! `cargo xtask write-gguf --model DIR --out FILE.gguf`: a model directory's text weights as a GGUF
//! file, every tensor in the type the checkpoint stores it in, with llama.cpp's DiffusionGemma
//! names and metadata (`dg_model::gguf`), and the directory's tokenizer and chat template as
//! llama.cpp's converter writes them (`dg_model::gguf::Vocab::from_hf_dir`). With `--copy-files`, the directory's other files
//! (config, tokenizer, chat template, reference dumps) are copied beside it, so the output's
//! directory is a model directory whose weights are `model.gguf`. With `--scheme q8_0|q4_k_m`
//! the matrices the scheme names are quantized by dg's quantizers ([`dg_model::Quantized`]) and
//! the rest kept as stored (the oracle's GGUF fixtures are made this way). `--tensor NAME=TYPE`
//! writes one tensor (HF name) in another ggml type, quantized by dg; `--tensor NAME=TYPE:FILE`
//! writes FILE's bytes as that tensor's blocks, for the types dg has no quantizer for (the oracle
//! draws them, `tools/oracle/gguf_fixture.py`). `--random CONFIG` writes seeded random weights of a
//! config instead of the directory's checkpoint (the directory then gives the tokenizer and chat
//! template, its vocabulary padded with unused tokens to the config's): a file at the real geometry
//! with no checkpoint on disk, to load in other engines.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use dg_model::gguf::{TokenType, Vocab};
use dg_model::{ModelConfig, ModelDir, RandomWeights, RawGenerationConfig, StoredDtype, TensorSource};

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
    /// Quantize with this scheme (`q8_0`, `q4_k_m`, ...); without it every tensor stays as stored.
    #[arg(long)]
    scheme: Option<String>,
    /// One tensor (HF name) in another ggml type: quantized by dg (`NAME=TYPE`), or FILE's bytes as
    /// its blocks (`NAME=TYPE:FILE`). Repeatable.
    #[arg(long = "tensor", value_name = "NAME=TYPE[:FILE]")]
    tensors: Vec<String>,
    /// Seeded random weights of this config (a `config.json` such as
    /// `bench/configs/real-30layer.json`) instead of `--model`'s checkpoint; `--model` then gives
    /// the tokenizer and chat template only, and the generation settings are the defaults.
    #[arg(long, value_name = "CONFIG")]
    random: Option<PathBuf>,
    /// The seed of `--random`'s weights.
    #[arg(long, default_value_t = 0, requires = "random")]
    seed: u64,
}

/// Pads a vocabulary to `size` tokens with unused ones (`<unusedN>`, as Gemma's tokenizer names
/// its own), so that a small tokenizer serves a config with a larger vocabulary.
fn pad_vocab(vocab: &mut Vocab, size: usize) -> Result<()> {
    if vocab.tokens.len() > size {
        bail!("the tokenizer has {} tokens, more than the config's vocab_size {size}", vocab.tokens.len());
    }
    for id in vocab.tokens.len()..size {
        vocab.tokens.push(format!("<unused{id}>"));
        vocab.types.push(TokenType::Unused);
        if !vocab.scores.is_empty() {
            vocab.scores.push(-1000.0);
        }
    }
    Ok(())
}

/// A `--tensor` option: the tensor's type, and the file of its blocks if they are given.
struct Override {
    name: String,
    dtype: StoredDtype,
    blocks: Option<PathBuf>,
}

fn parse_override(arg: &str) -> Result<Override> {
    let (name, rest) = arg.split_once('=').with_context(|| format!("--tensor {arg}: expected NAME=TYPE or NAME=TYPE:FILE"))?;
    let (dtype, blocks) = match rest.split_once(':') {
        Some((d, file)) => (d, Some(PathBuf::from(file))),
        None => (rest, None),
    };
    let dtype = StoredDtype::ALL
        .into_iter()
        .find(|d| d.name() == dtype)
        .with_context(|| format!("--tensor {arg}: {dtype} is not a type dg reads"))?;
    Ok(Override { name: name.to_string(), dtype, blocks })
}

pub fn run(args: Args) -> Result<bool> {
    let model = ModelDir::open(&args.model).with_context(|| format!("opening {}", args.model.display()))?;
    if model.checkpoint.gguf().is_some() {
        bail!("{} is already a GGUF model", args.model.display());
    }
    let out_dir = args.out.parent().filter(|p| !p.as_os_str().is_empty()).map(PathBuf::from).unwrap_or_else(|| ".".into());
    std::fs::create_dir_all(&out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    let mut vocab = model.vocab().with_context(|| format!("reading the tokenizer of {}", args.model.display()))?;
    let random = args.random.as_ref().map(|p| ModelConfig::from_file(p).with_context(|| format!("reading {}", p.display()))).transpose()?;
    let random_weights = RandomWeights::new(args.seed);
    let (config, generation, weights): (&ModelConfig, RawGenerationConfig, &dyn TensorSource) = match &random {
        Some(config) => {
            if let Some(v) = vocab.as_mut() {
                pad_vocab(v, config.text.vocab_size)?;
            }
            (config, RawGenerationConfig::default(), &random_weights)
        }
        None => (&model.config, model.generation.clone(), &model.checkpoint),
    };
    let scheme = args.scheme.as_deref().map(dg_model::Scheme::parse).transpose()?;
    let overrides = args.tensors.iter().map(|a| parse_override(a)).collect::<Result<Vec<_>>>()?;
    let manifest = dg_model::tensor_manifest(&config.text);
    if let Some(o) = overrides.iter().find(|o| !manifest.iter().any(|(n, _)| *n == o.name)) {
        bail!("--tensor {}: no such tensor in the model", o.name);
    }
    let find = |hf: &str| overrides.iter().find(|o| o.name == hf);
    // Every tensor is encoded from the checkpoint's own values (never from another quantization).
    let dtype =
        |hf: &str, stored| find(hf).map(|o| o.dtype).or_else(|| scheme.and_then(|s| s.dtype_of(&config.text, hf))).unwrap_or(stored);
    dg_model::gguf::write_model(&args.out, config, Some(&generation), vocab.as_ref(), weights, &dtype, &mut |hf, t, want| match find(hf)
        .and_then(|o| o.blocks.as_ref())
    {
        Some(file) => {
            let bytes = std::fs::read(file)
                .map_err(|e| dg_model::ModelError::Quantize { name: hf.into(), message: format!("{}: {e}", file.display()) })?;
            match want.bytes_for(t.len()) {
                Some(n) if n == bytes.len() => Ok(bytes),
                _ => Err(dg_model::ModelError::Quantize {
                    name: hf.into(),
                    message: format!("{} holds {} bytes, not {} values of {}", file.display(), bytes.len(), t.len(), want.name()),
                }),
            }
        }
        None => Ok(dg_model::quantize_tensor(t, want, hf)?.bytes().to_vec()),
    })?;
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
    eprintln!("wrote {} ({:.1} MiB, {} tensors)", args.out.display(), size as f64 / 1_048_576.0, manifest.len());
    Ok(true)
}

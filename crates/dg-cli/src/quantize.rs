//! `dg quantize`: a model's text weights as a GGUF file quantized by a scheme
//! ([`dg_model::Scheme`]: which tensors become Q8_0, Q5_0, Q4_K or Q6_K and which stay as
//! stored), with llama.cpp's DiffusionGemma names and metadata and the model's tokenizer and chat
//! template ([`dg_model::ModelDir::vocab`]). Tensors are read, quantized
//! (ggml's reference quantizers, in parallel chunks) and written one at a time; the model's other
//! files are copied beside the output so that it runs as `dg generate --model FILE.gguf`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};

use crate::args::QuantizeArgs;
use crate::error::{Input, input};

pub fn run(args: QuantizeArgs) -> Result<()> {
    let dir = crate::model_dir::resolve(args.model.as_deref())?;
    let model = crate::model_dir::open(&dir)?;
    let scheme = crate::weights::scheme(args.scheme);
    if args.out.extension().is_none_or(|e| e != "gguf") {
        return Err(input(format!("--out {}: the output must be a .gguf file", args.out.display())));
    }
    let out_dir = args.out.parent().filter(|p| !p.as_os_str().is_empty()).map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    std::fs::create_dir_all(&out_dir).with_context(|| Input(format!("cannot create {}", out_dir.display())))?;
    let vocab = model.vocab().with_context(|| Input(format!("cannot read the tokenizer of {}", dir.display())))?;
    let cfg = &model.config.text;
    let start = Instant::now();
    let mut types: BTreeMap<&'static str, (usize, u64)> = BTreeMap::new();
    let dtype = |hf: &str, stored| scheme.dtype_of(cfg, hf).unwrap_or(stored);
    dg_model::gguf::write_model(
        &args.out,
        &model.config,
        Some(&model.generation),
        vocab.as_ref(),
        &model.checkpoint,
        &dtype,
        &mut |hf, t, want| Ok(dg_model::quantize_tensor(t, want, hf)?.bytes().to_vec()),
    )
    .with_context(|| Input(format!("cannot quantize {} into {}", dir.display(), args.out.display())))?;
    for (hf, shape) in dg_model::tensor_manifest(cfg) {
        let stored = model.checkpoint.stored(&hf, &shape)?.dtype;
        let d = dtype(&hf, stored);
        let n: usize = shape.iter().product();
        let e = types.entry(d.name()).or_default();
        (e.0, e.1) = (e.0 + 1, e.1 + n as u64);
    }
    let copied = copy_model_files(&dir, &out_dir, &args.out)?;
    if !args.quiet {
        let size = std::fs::metadata(&args.out)?.len();
        let params: u64 = types.values().map(|t| t.1).sum();
        let by_type: Vec<String> = types.iter().map(|(name, (count, n))| format!("{name} {count} tensors ({n} values)")).collect();
        eprintln!(
            "wrote {} ({}): {:.1} MiB, {:.3} bytes per parameter, in {:.1} s; {}{}",
            args.out.display(),
            scheme.name(),
            size as f64 / 1_048_576.0,
            size as f64 / params.max(1) as f64,
            start.elapsed().as_secs_f64(),
            by_type.join(", "),
            if copied.is_empty() { String::new() } else { format!("; copied beside it: {}", copied.join(", ")) }
        );
    }
    Ok(())
}

/// Copies the model directory's files other than its weights into `out_dir` where they are not
/// there yet (a GGUF model takes its tokenizer, chat template and sampler settings from its
/// directory); returns their names.
fn copy_model_files(dir: &Path, out_dir: &Path, out: &Path) -> Result<Vec<String>> {
    let src_dir = if dir.is_file() { dir.parent().unwrap_or(Path::new(".")) } else { dir };
    if src_dir.canonicalize().ok() == out_dir.canonicalize().ok() {
        return Ok(Vec::new());
    }
    let mut copied = Vec::new();
    for entry in std::fs::read_dir(src_dir).with_context(|| format!("reading {}", src_dir.display()))? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let weights = name.starts_with("model") && (name.contains(".safetensors") || name.ends_with(".gguf"));
        let target = out_dir.join(&name);
        if weights || !entry.file_type()?.is_file() || target.exists() || target == out {
            continue;
        }
        std::fs::copy(entry.path(), &target).with_context(|| format!("copying {} to {}", entry.path().display(), target.display()))?;
        copied.push(name);
    }
    copied.sort();
    Ok(copied)
}

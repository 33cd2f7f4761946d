//! Finding and opening the model directory: `--model DIR` (or `--model FILE.gguf`, whose
//! directory holds the tokenizer and chat template), or the bundled random model of the
//! repository (`models/tiny-random`, located from this crate's source directory).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use dg_model::ModelDir;

use crate::error::{Input, input};

/// Where the bundled model lives in the source tree this binary was built from.
pub fn bundled_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/tiny-random");
    dir.canonicalize().unwrap_or(dir)
}

/// Is `dir` the bundled model (however it is spelled)?
pub fn is_bundled(dir: &Path) -> bool {
    dir.canonicalize().is_ok_and(|d| d == bundled_dir())
}

/// `--model`, or the bundled model when it is absent (an error if the bundled model is missing).
pub fn resolve(model: Option<&Path>) -> Result<PathBuf> {
    if let Some(dir) = model {
        return Ok(dir.to_path_buf());
    }
    let dir = bundled_dir();
    if !dir.join("config.json").is_file() {
        return Err(input(format!(
            "no --model given and the bundled model is missing at {} (it ships with the dg sources \
             in models/tiny-random); pass --model DIR",
            dir.display()
        )));
    }
    Ok(dir)
}

/// Opens `dir` after checking that it looks like a complete model directory, or the GGUF file
/// `dir` names.
pub fn open(dir: &Path) -> Result<ModelDir> {
    let shown = dir.display();
    if dg_model::is_gguf(dir) {
        if !dir.is_file() {
            return Err(input(format!("GGUF file {shown} does not exist")));
        }
        return ModelDir::open(dir).context(Input(format!("cannot open GGUF model {shown}")));
    }
    if !dir.exists() {
        return Err(input(format!("model directory {shown} does not exist")));
    }
    if !dir.is_dir() {
        return Err(input(format!("{shown} is not a directory (--model takes an HF model directory or a .gguf file)")));
    }
    if !dir.join("config.json").is_file() {
        return Err(input(format!("model directory {shown} is incomplete: config.json is missing")));
    }
    if !dir.join("model.safetensors").is_file() && !dir.join("model.safetensors.index.json").is_file() && !dir.join("model.gguf").is_file()
    {
        return Err(input(format!(
            "model directory {shown} is incomplete: neither model.safetensors nor \
             model.safetensors.index.json (nor model.gguf) exists"
        )));
    }
    ModelDir::open(dir).context(Input(format!("cannot open model directory {shown}")))
}

/// Opens `dir` ([`open`]) with the vision tower of `mmproj` attached where one is given.
pub fn open_with_mmproj(dir: &Path, mmproj: Option<&Path>) -> Result<ModelDir> {
    let mut model = open(dir)?;
    if let Some(path) = mmproj {
        if !path.is_file() {
            return Err(input(format!("--mmproj {}: no such file", path.display())));
        }
        model.attach_mmproj(path).context(Input(format!("--mmproj {}", path.display())))?;
    }
    Ok(model)
}

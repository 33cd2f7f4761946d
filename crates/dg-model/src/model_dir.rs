//! A model directory as `save_pretrained` writes it: `config.json`, an optional
//! `generation_config.json`, and the safetensors checkpoint; or a GGUF file, with the files of a
//! model directory that sit beside it (`config.json` and `generation_config.json` there win over
//! the GGUF metadata).

use std::path::{Path, PathBuf};

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::generation::{GenerationConfig, RawGenerationConfig};
use crate::gguf::GgufModel;
use crate::tensors::Checkpoint;
use crate::weights::Weights;

/// An opened model directory (config parsed, checkpoint mapped, nothing converted yet).
#[derive(Debug)]
pub struct ModelDir {
    /// The directory; for a GGUF file, the one it lies in (where tokenizer and chat template are).
    pub dir: PathBuf,
    pub config: ModelConfig,
    /// The raw `generation_config.json` (all defaults when the file is absent).
    pub generation: RawGenerationConfig,
    pub checkpoint: Checkpoint,
}

impl ModelDir {
    /// Whether every matrix of the text model (every tensor of rank ≥ 2) is stored as BF16 in the
    /// checkpoint: then a BF16 copy of the weights is exact.
    pub fn matrices_are_bf16(&self) -> bool {
        self.matrices_all(|dtype| dtype == "BF16")
    }

    /// Whether every matrix is stored as BF16 or in quantized blocks (which the GPU keeps as
    /// stored): then a BF16 copy of the other matrices is exact.
    pub fn unquantized_matrices_are_bf16(&self) -> bool {
        self.matrices_all(|dtype| dtype == "BF16" || is_quantized(dtype))
    }

    /// Whether any matrix is stored in quantized blocks.
    pub fn has_quantized_matrices(&self) -> bool {
        crate::names::tensor_manifest(&self.config.text)
            .iter()
            .any(|(name, _)| matches!(self.checkpoint.shape(name), Ok((_, dtype)) if is_quantized(&dtype)))
    }

    fn matrices_all(&self, keep: impl Fn(&str) -> bool) -> bool {
        crate::names::tensor_manifest(&self.config.text)
            .iter()
            .filter(|(_, shape)| shape.len() >= 2)
            .all(|(name, _)| matches!(self.checkpoint.shape(name), Ok((_, dtype)) if keep(&dtype)))
    }

    /// Opens `dir`: a missing directory or `config.json` is an error naming the path. A file named
    /// `*.gguf`, or a directory whose weights are `model.gguf`, is opened as a GGUF model
    /// ([`Self::open_gguf`]).
    pub fn open(dir: &Path) -> Result<Self> {
        if is_gguf(dir) {
            return Self::open_gguf(dir);
        }
        if !dir.is_dir() {
            return Err(ModelError::Io {
                path: dir.to_path_buf(),
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "model directory not found"),
            });
        }
        // A directory whose weights are a GGUF file (`model.gguf` beside `config.json`).
        let gguf = dir.join(GGUF_NAME);
        if gguf.is_file() && !dir.join("model.safetensors").exists() && !dir.join("model.safetensors.index.json").exists() {
            return Self::open_gguf(&gguf);
        }
        let config = ModelConfig::from_file(&dir.join("config.json"))?;
        let gen_path = dir.join("generation_config.json");
        let generation = if gen_path.exists() { RawGenerationConfig::from_file(&gen_path)? } else { RawGenerationConfig::default() };
        let checkpoint = Checkpoint::open_dir(dir)?;
        Ok(ModelDir { dir: dir.to_path_buf(), config, generation, checkpoint })
    }

    /// Opens the GGUF file `path`. The geometry comes from a `config.json` beside it when there is
    /// one (it wins over the metadata), else from the GGUF metadata; the generation parameters
    /// likewise from `generation_config.json` beside it, else from the metadata's sampler keys.
    pub fn open_gguf(path: &Path) -> Result<Self> {
        let dir = path.parent().map(Path::to_path_buf).filter(|p| !p.as_os_str().is_empty()).unwrap_or_else(|| PathBuf::from("."));
        let config_path = dir.join("config.json");
        let config = if config_path.is_file() { Some(ModelConfig::from_file(&config_path)?) } else { None };
        let model = GgufModel::open(path, config)?;
        let gen_path = dir.join("generation_config.json");
        let generation = if gen_path.exists() { RawGenerationConfig::from_file(&gen_path)? } else { model.generation };
        Ok(ModelDir { dir, config: model.config, generation, checkpoint: Checkpoint::from_gguf(model.file) })
    }

    /// The generation parameters of this directory, resolved with the built-in defaults.
    pub fn generation_config(&self) -> Result<GenerationConfig> {
        self.generation.resolve(&self.config, &self.dir.join("generation_config.json"))
    }

    /// The tokenizer a GGUF written from this model carries: the directory's `tokenizer.json`
    /// (with its config and chat template, [`crate::gguf::Vocab::from_hf_dir`]), else a GGUF
    /// model's own; `None` when there is neither.
    pub fn vocab(&self) -> Result<Option<crate::gguf::Vocab>> {
        match crate::gguf::Vocab::from_hf_dir(&self.dir)? {
            Some(v) => Ok(Some(v)),
            None => self.checkpoint.gguf().map_or(Ok(None), |f| f.vocab()),
        }
    }

    /// Converts every text tensor to f32, checking names and shapes.
    pub fn load_weights(&self) -> Result<Weights> {
        Weights::from_checkpoint(&self.checkpoint, &self.config.text)
    }
}

/// The GGUF file a model directory may hold instead of safetensors (safetensors win when both are
/// there).
pub const GGUF_NAME: &str = "model.gguf";

/// Whether `path` names a GGUF file (by its extension, as llama.cpp's tools take them).
pub fn is_gguf(path: &Path) -> bool {
    path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
}

/// Whether `dtype` names one of ggml's quantized block types.
fn is_quantized(dtype: &str) -> bool {
    crate::StoredDtype::from_name(dtype).is_some_and(|d| d.is_quantized())
}

//! A model directory as `save_pretrained` writes it: `config.json`, an optional
//! `generation_config.json`, and the safetensors checkpoint; or a GGUF file, with the files of a
//! model directory that sit beside it (`config.json` and `generation_config.json` there win over
//! the GGUF metadata).

use std::path::{Path, PathBuf};

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::generation::{GenerationConfig, RawGenerationConfig};
use crate::gguf::{GgufModel, Mmproj};
use crate::tensors::Checkpoint;
use crate::vision::VisionWeights;
use crate::weights::{TensorSource, Weights};

/// An opened model directory (config parsed, checkpoint mapped, nothing converted yet).
#[derive(Debug)]
pub struct ModelDir {
    /// The directory; for a GGUF file, the one it lies in (where tokenizer and chat template are).
    pub dir: PathBuf,
    pub config: ModelConfig,
    /// The raw `generation_config.json` (all defaults when the file is absent).
    pub generation: RawGenerationConfig,
    pub checkpoint: Checkpoint,
    /// The vision tower's own file (llama.cpp's mmproj), where the checkpoint holds no tower
    /// ([`Self::attach_mmproj`]).
    pub mmproj: Option<Mmproj>,
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
        Ok(ModelDir { dir: dir.to_path_buf(), config, generation, checkpoint, mmproj: None })
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
        Ok(ModelDir { dir, config: model.config, generation, checkpoint: Checkpoint::from_gguf(model.file), mmproj: None })
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

    /// Takes the vision tower from llama.cpp's projector file `path` (a GGUF model from llama.cpp's
    /// converter holds no tower): its geometry becomes the config's `vision_config`, and the image
    /// token ids, where the config has none, are the vocabulary's `<|image|>`, `<|image>` and
    /// `<image|>` (Gemma 4's). Errors name the file: not a `gemma4v` projector, a projection into
    /// another hidden size, a checkpoint that has a tower of its own, no image tokens.
    pub fn attach_mmproj(&mut self, path: &Path) -> Result<()> {
        let mmproj = Mmproj::open(path)?;
        let err = |message: String| ModelError::Gguf { path: path.to_path_buf(), message };
        if self.checkpoint.shape(&format!("{}.patch_embedder.input_proj.weight", crate::vision::TOWER)).is_ok() {
            return Err(err(format!("{} holds a vision tower of its own: give no --mmproj", self.dir.display())));
        }
        let hidden = self.config.text.hidden_size;
        if mmproj.projection_dim() != hidden {
            return Err(err(format!(
                "the projector writes {}-wide rows (clip.vision.projection_dim) where the text model is {hidden} wide: it belongs to another model",
                mmproj.projection_dim()
            )));
        }
        let ids = [self.config.image_token_id, self.config.boi_token_id, self.config.eoi_token_id];
        if ids.contains(&None) {
            let vocab = self.vocab()?.ok_or_else(|| err("the model has no tokenizer to find its image tokens in".into()))?;
            let id = |text: &str| {
                let id = vocab.tokens.iter().position(|t| t == text).and_then(|i| u32::try_from(i).ok());
                id.ok_or_else(|| err(format!("the model's vocabulary has no {text:?} token: it takes no images")))
            };
            let c = &mut self.config;
            c.image_token_id = c.image_token_id.map_or_else(|| id(IMAGE_TOKENS[0]).map(Some), |v| Ok(Some(v)))?;
            c.boi_token_id = c.boi_token_id.map_or_else(|| id(IMAGE_TOKENS[1]).map(Some), |v| Ok(Some(v)))?;
            c.eoi_token_id = c.eoi_token_id.map_or_else(|| id(IMAGE_TOKENS[2]).map(Some), |v| Ok(Some(v)))?;
        }
        self.config.vision = Some(mmproj.config().clone());
        self.mmproj = Some(mmproj);
        Ok(())
    }

    /// Where the vision tower's tensors are: the projector file when one is attached, else the
    /// checkpoint.
    pub fn vision_source(&self) -> &dyn TensorSource {
        match &self.mmproj {
            Some(m) => m,
            None => &self.checkpoint,
        }
    }

    /// The vision tower's weights in f32; `None` without a `vision_config`.
    pub fn load_vision_weights(&self) -> Result<Option<VisionWeights>> {
        let Some(c) = &self.config.vision else { return Ok(None) };
        VisionWeights::build(self.vision_source(), c, self.config.text.hidden_size).map(Some)
    }

    /// Converts every text tensor to f32, checking names and shapes.
    pub fn load_weights(&self) -> Result<Weights> {
        Weights::from_checkpoint(&self.checkpoint, &self.config.text)
    }
}

/// Gemma 4's image placeholder, begin-of-image and end-of-image tokens, by text.
pub const IMAGE_TOKENS: [&str; 3] = ["<|image|>", "<|image>", "<image|>"];

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

//! A reference dump of an HF transformers run (`reference.safetensors` + `reference.json`,
//! see the reference format): the inputs, the logits of each forward, and the recorded draws of
//! `generate`.

use std::path::{Path, PathBuf};

use dg_model::{RawGenerationConfig, SafetensorsFile};
use dg_sampler::DrawKind;
use serde::Deserialize;

use crate::ParityError;

/// `reference.json`.
#[derive(Debug, Clone, Deserialize)]
pub struct ReferenceMeta {
    #[serde(default)]
    pub config: Option<String>,
    #[serde(default)]
    pub transformers: Option<String>,
    #[serde(default)]
    pub torch: Option<String>,
    #[serde(default)]
    pub checkpoint_dtype: Option<String>,
    pub canvas_length: usize,
    #[serde(default)]
    pub block2_position_start: Option<usize>,
    #[serde(default)]
    pub generation: Option<RawGenerationConfig>,
    #[serde(default)]
    pub draws: Vec<String>,
}

/// The tensors of `reference.safetensors`; each check needs only some of them.
#[derive(Debug)]
pub struct Reference {
    pub dir: PathBuf,
    /// The JSON half (`reference.json`, or another name's).
    pub json_path: PathBuf,
    pub meta: ReferenceMeta,
    file: SafetensorsFile,
}

impl Reference {
    /// Opens `dir/reference.json` and `dir/reference.safetensors`.
    pub fn open(dir: &Path) -> Result<Self, ParityError> {
        Self::open_named(dir, "reference")
    }

    /// Opens `dir/{stem}.json` and `dir/{stem}.safetensors`: a dump in this format under another
    /// name (one the tools that walk every fixture's reference.json pass by).
    pub fn open_named(dir: &Path, stem: &str) -> Result<Self, ParityError> {
        let json_path = dir.join(format!("{stem}.json"));
        let text =
            std::fs::read_to_string(&json_path).map_err(|e| ParityError::Reference { path: json_path.clone(), message: e.to_string() })?;
        let meta: ReferenceMeta = serde_json::from_str(&text)
            .map_err(|e| ParityError::Reference { path: json_path.clone(), message: format!("malformed: {e}") })?;
        let file = SafetensorsFile::open(&dir.join(format!("{stem}.safetensors")))?;
        Ok(Reference { dir: dir.to_path_buf(), json_path, meta, file })
    }

    /// Does the dump hold tensor `name`?
    pub fn has(&self, name: &str) -> bool {
        self.file.shape(name).is_some()
    }

    /// Token ids of `name`, checked to be non-negative and to fit u32.
    pub fn ids(&self, name: &str) -> Result<Vec<u32>, ParityError> {
        let (_, data) = self.file.tensor_i64(name)?;
        data.iter()
            .map(|&v| {
                u32::try_from(v).map_err(|_| ParityError::Reference {
                    path: self.file.path().to_path_buf(),
                    message: format!("tensor {name:?} holds {v}, not a token id"),
                })
            })
            .collect()
    }

    /// F32 tensor `name` with its shape.
    pub fn floats(&self, name: &str) -> Result<(Vec<usize>, Vec<f32>), ParityError> {
        let t = self.file.tensor_f32(name)?;
        Ok((t.shape, t.data))
    }

    /// The recorded draws of `generate`, in call order, with their kinds.
    pub fn draws(&self) -> Result<Vec<(DrawKind, Vec<u32>)>, ParityError> {
        self.meta
            .draws
            .iter()
            .enumerate()
            .map(|(i, kind)| {
                let kind = match kind.as_str() {
                    "uniform_tokens" => DrawKind::UniformTokens,
                    "categorical" => DrawKind::Categorical,
                    other => {
                        return Err(ParityError::Reference {
                            path: self.json_path.clone(),
                            message: format!("draws[{i}] has unknown kind {other:?}"),
                        });
                    }
                };
                Ok((kind, self.ids(&format!("gen_draw_{i}"))?))
            })
            .collect()
    }
}

//! Errors of the model layer: every variant names the file, tensor or field at fault.

use std::path::PathBuf;

/// Everything that can go wrong while reading a model directory.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: malformed JSON: {source}")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{path}: invalid config: {message}")]
    Config { path: PathBuf, message: String },
    #[error("{path}: unsupported model_type {found:?} (expected {expected:?})")]
    UnknownModelType { path: PathBuf, found: String, expected: &'static str },
    #[error("{path}: not a valid safetensors file: {message}")]
    Safetensors { path: PathBuf, message: String },
    #[error("tensor {name:?} not found in {location}")]
    MissingTensor { name: String, location: String },
    #[error("tensor {name:?} in {path}: shape {got:?}, expected {expected:?}")]
    ShapeMismatch { name: String, path: PathBuf, expected: Vec<usize>, got: Vec<usize> },
    #[error("tensor {name:?} in {path}: unsupported dtype {dtype} (supported: F32, F16, BF16)")]
    UnsupportedDtype { name: String, path: PathBuf, dtype: String },
    #[error("{path}: shard index names {file:?} for tensor {name:?}, but that file is missing")]
    MissingShard { path: PathBuf, file: String, name: String },
    #[error("unknown quantization scheme {name:?} (expected one of {expected})")]
    UnknownScheme { name: String, expected: String },
    #[error("tensor {name:?}: cannot quantize it: {message}")]
    Quantize { name: String, message: String },
    #[error("{path}: not a valid GGUF file: {message}")]
    Gguf { path: PathBuf, message: String },
    #[error("{path}: GGUF metadata {key:?}: {message}")]
    GgufMetadata { path: PathBuf, key: String, message: String },
    #[error("{path}: GGUF tensor {name:?}: {message}")]
    GgufTensor { path: PathBuf, name: String, message: String },
    #[error(
        "{path}: GGUF tensor {name:?} has ggml type {type_id} ({type_name}), which dg does not read (it reads {})",
        crate::StoredDtype::ALL.map(|d| d.name()).join(", ")
    )]
    GgufType { path: PathBuf, name: String, type_id: u32, type_name: String },
    #[error("{path}: GGUF tensor {name:?} is not a DiffusionGemma text tensor dg reads (is this a DiffusionGemma GGUF?)")]
    UnknownTensor { path: PathBuf, name: String },
}

/// Shorthand used throughout the crate.
pub type Result<T, E = ModelError> = std::result::Result<T, E>;

impl ModelError {
    pub(crate) fn config(path: impl Into<PathBuf>, message: impl Into<String>) -> Self {
        ModelError::Config { path: path.into(), message: message.into() }
    }
}

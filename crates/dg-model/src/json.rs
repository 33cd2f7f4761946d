//! Reading JSON files with errors that name the file.

use std::path::Path;

use serde::de::DeserializeOwned;

use crate::error::{ModelError, Result};

/// Reads `path` and parses it as `T`; I/O and syntax errors name the file.
pub(crate) fn read_json<T: DeserializeOwned>(path: &Path) -> Result<T> {
    let text = std::fs::read_to_string(path).map_err(|source| ModelError::Io { path: path.to_path_buf(), source })?;
    serde_json::from_str(&text).map_err(|source| ModelError::Json { path: path.to_path_buf(), source })
}

//! Memory-mapped safetensors files and sharded checkpoints (or one GGUF file, `crate::gguf`):
//! tensors as stored (borrowed from the map) or widened to f32.
//!
//! Mirrors what `PreTrainedModel.from_pretrained` reads: `model.safetensors`, or the shards named by
//! `model.safetensors.index.json` (`weight_map`). Headers are validated by the `safetensors` crate,
//! which also rejects truncated files (the data must end exactly where the header says).

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::tensor::{Dtype, Metadata};
use serde::Deserialize;

use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;
use crate::json::read_json;
use crate::stored::{StoredDtype, StoredTensor};

/// One safetensors file, memory-mapped, with its parsed header.
#[derive(Debug)]
pub struct SafetensorsFile {
    path: PathBuf,
    mmap: Mmap,
    data_start: usize,
    meta: Metadata,
}

/// A tensor converted to f32, in row-major order.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

impl SafetensorsFile {
    /// Maps `path` and validates its header against the file length.
    pub fn open(path: &Path) -> Result<Self> {
        let io = |source| ModelError::Io { path: path.to_path_buf(), source };
        let file = File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        if len < 8 {
            return Err(ModelError::Safetensors {
                path: path.into(),
                message: format!("file is {len} bytes long, shorter than the 8-byte header length (truncated?)"),
            });
        }
        // SAFETY: the map is read-only; like every mmap-based loader we rely on the checkpoint not
        // being modified while it is open.
        let mmap = unsafe { Mmap::map(&file) }.map_err(io)?;
        let (header_len, meta) = safetensors::SafeTensors::read_metadata(&mmap)
            .map_err(|e| ModelError::Safetensors { path: path.into(), message: describe(&e) })?;
        Ok(SafetensorsFile { path: path.to_path_buf(), mmap, data_start: 8 + header_len, meta })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Names of all tensors in the file.
    pub fn names(&self) -> Vec<String> {
        self.meta.tensors().into_keys().collect()
    }

    /// Shape and dtype name of `name`, if present.
    pub fn shape(&self, name: &str) -> Option<(Vec<usize>, String)> {
        self.meta.info(name).map(|i| (i.shape.clone(), format!("{:?}", i.dtype)))
    }

    fn raw(&self, name: &str) -> Result<(Dtype, &[usize], &[u8])> {
        let info = self
            .meta
            .info(name)
            .ok_or_else(|| ModelError::MissingTensor { name: name.to_string(), location: self.path.display().to_string() })?;
        let (start, end) = info.data_offsets;
        let bytes = &self.mmap[self.data_start + start..self.data_start + end];
        Ok((info.dtype, &info.shape, bytes))
    }

    /// `name` as stored: its dtype, shape and bytes, borrowed from the map (F32, F16, BF16).
    pub fn stored(&self, name: &str) -> Result<StoredTensor<'_>> {
        let (dtype, shape, bytes) = self.raw(name)?;
        let dtype = match dtype {
            Dtype::F32 => StoredDtype::F32,
            Dtype::BF16 => StoredDtype::BF16,
            Dtype::F16 => StoredDtype::F16,
            other => return Err(self.bad_dtype(name, other)),
        };
        Ok(StoredTensor::from_bytes(dtype, shape.to_vec(), bytes))
    }

    /// Reads `name` as f32 (F32, F16 and BF16 are converted exactly).
    pub fn tensor_f32(&self, name: &str) -> Result<Tensor> {
        let t = self.stored(name)?;
        Ok(Tensor { shape: t.shape.clone(), data: t.to_f32() })
    }

    /// Reads an integer tensor (I64 or I32) as i64.
    pub fn tensor_i64(&self, name: &str) -> Result<(Vec<usize>, Vec<i64>)> {
        let (dtype, shape, bytes) = self.raw(name)?;
        let data = match dtype {
            Dtype::I64 => bytes.chunks_exact(8).map(|b| i64::from_le_bytes(b.try_into().unwrap())).collect(),
            Dtype::I32 => bytes.chunks_exact(4).map(|b| i32::from_le_bytes(b.try_into().unwrap()) as i64).collect(),
            other => return Err(self.bad_dtype(name, other)),
        };
        Ok((shape.to_vec(), data))
    }

    fn bad_dtype(&self, name: &str, dtype: Dtype) -> ModelError {
        ModelError::UnsupportedDtype { name: name.to_string(), path: self.path.clone(), dtype: format!("{dtype:?}") }
    }
}

fn describe(e: &safetensors::SafeTensorError) -> String {
    use safetensors::SafeTensorError as E;
    match e {
        E::MetadataIncompleteBuffer => "the data section does not match the header (file truncated or padded)".to_string(),
        E::InvalidHeaderLength => "header length points past the end of the file (truncated?)".to_string(),
        other => format!("{other}"),
    }
}

/// A checkpoint: one safetensors file or several shards, or one GGUF file; each tensor found by
/// its HF name.
#[derive(Debug)]
pub struct Checkpoint {
    /// What lists the tensors, named in "not found" errors: `model.safetensors`, the shard index,
    /// the directory when several files were opened directly, or the GGUF file.
    origin: PathBuf,
    files: Vec<SafetensorsFile>,
    location: HashMap<String, usize>,
    /// Set for a GGUF checkpoint (then `files` is empty).
    gguf: Option<GgufFile>,
}

#[derive(Debug, Deserialize)]
struct ShardIndex {
    weight_map: HashMap<String, String>,
}

impl Checkpoint {
    /// Opens `dir/model.safetensors`, or the shards listed in `dir/model.safetensors.index.json`.
    pub fn open_dir(dir: &Path) -> Result<Self> {
        let index_path = dir.join("model.safetensors.index.json");
        let single = dir.join("model.safetensors");
        if index_path.exists() {
            let index: ShardIndex = read_json(&index_path)?;
            let mut shard_names: Vec<&String> = index.weight_map.values().collect();
            shard_names.sort();
            shard_names.dedup();
            let mut files = Vec::new();
            let mut shard_of = HashMap::new();
            for shard in shard_names {
                let path = dir.join(shard);
                if !path.exists() {
                    let name = index.weight_map.iter().find(|(_, f)| *f == shard).map(|(n, _)| n.clone());
                    return Err(ModelError::MissingShard { path: index_path.clone(), file: shard.clone(), name: name.unwrap_or_default() });
                }
                shard_of.insert(shard.clone(), files.len());
                files.push(SafetensorsFile::open(&path)?);
            }
            let mut location = HashMap::new();
            for (name, shard) in &index.weight_map {
                location.insert(name.clone(), shard_of[shard]);
            }
            Ok(Checkpoint { origin: index_path, files, location, gguf: None })
        } else if single.exists() {
            Self::from_files(dir, vec![SafetensorsFile::open(&single)?])
        } else {
            Err(ModelError::Io {
                path: single,
                source: std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "neither model.safetensors nor model.safetensors.index.json exists",
                ),
            })
        }
    }

    /// A checkpoint made of already opened files (tensor names must be unique across them).
    pub fn from_files(dir: &Path, files: Vec<SafetensorsFile>) -> Result<Self> {
        let mut location = HashMap::new();
        for (i, f) in files.iter().enumerate() {
            for name in f.names() {
                location.insert(name, i);
            }
        }
        let origin = match files.as_slice() {
            [one] => one.path().to_path_buf(),
            _ => dir.to_path_buf(),
        };
        Ok(Checkpoint { origin, files, location, gguf: None })
    }

    /// A checkpoint of the one GGUF file `file` (its tensors found by HF name).
    pub fn from_gguf(file: GgufFile) -> Self {
        let location = file.hf_names().map(|n| (n, 0)).collect();
        Checkpoint { origin: file.path().to_path_buf(), files: Vec::new(), location, gguf: Some(file) }
    }

    /// The GGUF file of a GGUF checkpoint.
    pub fn gguf(&self) -> Option<&GgufFile> {
        self.gguf.as_ref()
    }

    /// What lists the tensors: `model.safetensors`, the shard index, or the GGUF file.
    pub fn origin(&self) -> &Path {
        &self.origin
    }

    /// Does the checkpoint hold `name`?
    pub fn contains(&self, name: &str) -> bool {
        self.location.contains_key(name)
    }

    /// All tensor names (HF names, also for a GGUF file).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.location.keys().map(String::as_str)
    }

    /// Reads `name` as f32 and checks its shape.
    pub fn tensor(&self, name: &str, expected: &[usize]) -> Result<Vec<f32>> {
        Ok(self.stored(name, expected)?.to_f32())
    }

    /// `name` as stored (borrowed from the memory map), its shape checked against `expected`.
    pub fn stored(&self, name: &str, expected: &[usize]) -> Result<StoredTensor<'_>> {
        if let Some(g) = &self.gguf {
            return g.stored_hf(name, expected);
        }
        let file = self.file_of(name)?;
        let t = file.stored(name)?;
        if t.shape != expected {
            return Err(ModelError::ShapeMismatch {
                name: name.to_string(),
                path: file.path().to_path_buf(),
                expected: expected.to_vec(),
                got: t.shape,
            });
        }
        Ok(t)
    }

    /// Shape and dtype name of `name`.
    pub fn shape(&self, name: &str) -> Result<(Vec<usize>, String)> {
        if let Some(g) = &self.gguf {
            return g.find_hf(name).map(|t| (t.shape(), t.dtype.name().to_string()));
        }
        let file = self.file_of(name)?;
        // A shard index may name a shard that does not hold the tensor.
        file.shape(name).ok_or_else(|| ModelError::MissingTensor { name: name.to_string(), location: file.path().display().to_string() })
    }

    fn file_of(&self, name: &str) -> Result<&SafetensorsFile> {
        self.location
            .get(name)
            .map(|&i| &self.files[i])
            .ok_or_else(|| ModelError::MissingTensor { name: name.to_string(), location: self.origin.display().to_string() })
    }
}

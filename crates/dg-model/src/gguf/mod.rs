//! GGUF files: reading them memory-mapped (`read`), the DiffusionGemma tensor names llama.cpp
//! writes (`names`), the geometry in their metadata (`config`), the tokenizer and chat template
//! they carry (`vocab`), writing them (`write`), and llama.cpp's projector files for the vision
//! tower (`mmproj`).
//!
//! A [`GgufFile`] serves its tensors by HF name, as stored, so the same loaders that read a
//! safetensors checkpoint read a GGUF one ([`crate::Checkpoint::open_gguf`]). The format is ggml's
//! (`ggml/docs/gguf.md`): a header with typed metadata and tensor infos, then the aligned data.

mod config;
mod mmproj;
mod names;
mod read;
mod vocab;
mod vocab_hf;
mod write;

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

pub use config::{ARCH, model_metadata, rope_freqs};
pub use mmproj::{GEMMA4V, Mmproj, mmproj_name};
pub use names::{IGNORABLE, to_gguf, to_hf};
pub use read::{Header, MetaValue, TensorInfo};
pub use vocab::{GEMMA4, SpecialIds, TokenType, Vocab};
pub use vocab_hf::RENDERED;
pub use write::{GgufWriter, PlannedTensor, VERSION};

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::generation::RawGenerationConfig;
use crate::names::tensor_manifest;
use crate::stored::{StoredDtype, StoredTensor};
use crate::weights::TensorSource;

/// The bytes of a GGUF file: mapped, or (for in-memory parsing) owned.
#[derive(Debug)]
enum Bytes {
    Mapped(Mmap),
    Owned(Vec<u8>),
}

/// A GGUF file with its validated header.
#[derive(Debug)]
pub struct GgufFile {
    path: PathBuf,
    bytes: Bytes,
    header: Header,
    by_name: HashMap<String, usize>,
}

impl GgufFile {
    /// Maps `path` and validates its header and every tensor's byte range.
    pub fn open(path: &Path) -> Result<Self> {
        let io = |source| ModelError::Io { path: path.to_path_buf(), source };
        let file = File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        if len < 24 {
            return Err(ModelError::Gguf {
                path: path.into(),
                message: format!("file is {len} bytes long, shorter than the 24-byte GGUF header (truncated?)"),
            });
        }
        // SAFETY: the map is read-only; like every mmap-based loader we rely on the file not being
        // modified while it is open.
        let mmap = unsafe { Mmap::map(&file) }.map_err(io)?;
        Self::from_bytes(Bytes::Mapped(mmap), path)
    }

    /// Parses a GGUF file held in memory; `path` only names it in errors.
    pub fn from_vec(bytes: Vec<u8>, path: &Path) -> Result<Self> {
        Self::from_bytes(Bytes::Owned(bytes), path)
    }

    fn from_bytes(bytes: Bytes, path: &Path) -> Result<Self> {
        let header = Header::parse(bytes.as_slice(), path)?;
        let by_name = header.tensors.iter().enumerate().map(|(i, t)| (t.name.clone(), i)).collect();
        Ok(GgufFile { path: path.to_path_buf(), bytes, header, by_name })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn header(&self) -> &Header {
        &self.header
    }

    /// Every tensor, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.header.tensors
    }

    /// The tensor GGUF names `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.by_name.get(name).map(|&i| &self.header.tensors[i])
    }

    /// The metadata keys, in file order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.header.metadata.iter().map(|e| e.key.as_str())
    }

    /// The value of metadata `key`, decoded.
    pub fn meta(&self, key: &str) -> Option<MetaValue> {
        let e = self.header.metadata.iter().find(|e| e.key == key)?;
        Some(read::decode_value(&self.bytes.as_slice()[e.bytes.clone()], e.type_id))
    }

    /// Tensor `t` of this file as stored, in its row-major (HF) shape.
    pub fn stored_gguf(&self, t: &TensorInfo) -> StoredTensor<'_> {
        StoredTensor::from_bytes(t.dtype, t.shape(), &self.bytes.as_slice()[t.bytes.clone()])
    }

    /// The first tensor dg would not read (neither a DiffusionGemma text tensor nor one of
    /// [`IGNORABLE`]): its presence means the file is not what dg takes it for.
    pub fn first_unknown(&self) -> Option<&TensorInfo> {
        self.tensors().iter().find(|t| to_hf(&t.name).is_none() && !IGNORABLE.contains(&t.name.as_str()))
    }

    /// HF names of the text tensors the file holds.
    pub fn hf_names(&self) -> impl Iterator<Item = String> + '_ {
        self.tensors().iter().filter_map(|t| to_hf(&t.name))
    }

    /// The tensor HF names `hf`, with its HF shape and GGUF name, or a missing-tensor error.
    pub fn find_hf(&self, hf: &str) -> Result<&TensorInfo> {
        let gguf = to_gguf(hf);
        gguf.as_deref().and_then(|g| self.tensor(g)).ok_or_else(|| ModelError::MissingTensor {
            name: hf.to_string(),
            location: match gguf {
                Some(g) => format!("{} (GGUF name {g:?})", self.path.display()),
                None => format!("{} (no GGUF name: not a DiffusionGemma text tensor)", self.path.display()),
            },
        })
    }

    /// `hf` as stored, its HF shape (the GGUF dims reversed) checked against `shape`.
    pub fn stored_hf(&self, hf: &str, shape: &[usize]) -> Result<StoredTensor<'_>> {
        let t = self.find_hf(hf)?;
        let got = t.shape();
        if got != shape {
            return Err(ModelError::ShapeMismatch {
                name: format!("{hf} (GGUF {:?}, ggml dims {:?})", t.name, t.dims),
                path: self.path.clone(),
                expected: shape.to_vec(),
                got,
            });
        }
        Ok(self.stored_gguf(t))
    }
}

impl Bytes {
    fn as_slice(&self) -> &[u8] {
        match self {
            Bytes::Mapped(m) => m,
            Bytes::Owned(v) => v,
        }
    }
}

impl TensorSource for GgufFile {
    fn stored(&self, name: &str, shape: &[usize]) -> Result<StoredTensor<'_>> {
        self.stored_hf(name, shape)
    }
}

/// A GGUF model: the file, and the config and sampler defaults it was opened with.
#[derive(Debug)]
pub struct GgufModel {
    pub file: GgufFile,
    pub config: ModelConfig,
    pub generation: RawGenerationConfig,
}

impl GgufModel {
    /// Opens `path`; the geometry comes from `config` when given (a `config.json` beside the
    /// file, which wins), else from the GGUF metadata. Another architecture than DiffusionGemma's,
    /// or a tensor dg would not read, is an error.
    pub fn open(path: &Path, config: Option<ModelConfig>) -> Result<Self> {
        let file = GgufFile::open(path)?;
        file.check_architecture()?;
        if let Some(t) = file.first_unknown() {
            return Err(ModelError::UnknownTensor { path: path.into(), name: t.name.clone() });
        }
        let config = match config {
            Some(c) => c,
            None => file.model_config()?,
        };
        let generation = file.generation_config()?;
        Ok(GgufModel { file, config, generation })
    }
}

/// Turns tensor `hf` (as its source stores it) into the bytes of another dtype.
pub type Encode<'a> = dyn FnMut(&str, &StoredTensor<'_>, StoredDtype) -> Result<Vec<u8>> + 'a;

/// Writes `config`'s model to `path` as GGUF: the metadata [`model_metadata`] gives and the
/// tokenizer `vocab` carries ([`Vocab::metadata`]; a special id both name must agree), then every
/// tensor of [`tensor_manifest`] (and `rope_freqs.weight`) read from `src` one at a time. `dtype`
/// picks each matrix's stored type from its HF name and its type in `src`; `encode` turns the
/// tensor into that type's bytes (`src`'s bytes unchanged when the types agree). Tensors of rank
/// 1 (norms, scalars) stored as floats are written as F32, as the converter writes them.
pub fn write_model<S: TensorSource + ?Sized>(
    path: &Path,
    config: &ModelConfig,
    generation: Option<&RawGenerationConfig>,
    vocab: Option<&Vocab>,
    src: &S,
    dtype: &dyn Fn(&str, StoredDtype) -> StoredDtype,
    encode: &mut Encode<'_>,
) -> Result<()> {
    let bad = |message: String| ModelError::Gguf { path: path.into(), message };
    let manifest = tensor_manifest(&config.text);
    let mut plan = Vec::with_capacity(manifest.len() + 1);
    let freqs = rope_freqs(config);
    if let Some(f) = &freqs {
        plan.push(PlannedTensor { name: IGNORABLE[0].into(), shape: vec![f.len()], dtype: StoredDtype::F32 });
    }
    for (hf, shape) in &manifest {
        let stored = src.stored(hf, shape)?.dtype;
        let name = to_gguf(hf).ok_or_else(|| bad(format!("{hf} has no GGUF name")))?;
        // Norms and scalars in F32, as the converter writes them (ggml's binary ops take F32).
        let dtype = if shape.len() < 2 && !stored.is_quantized() { StoredDtype::F32 } else { dtype(hf, stored) };
        plan.push(PlannedTensor { name, shape: shape.clone(), dtype });
    }
    let mut metadata = model_metadata(config, generation).map_err(bad)?;
    if let Some(v) = vocab {
        if v.tokens.len() > config.text.vocab_size {
            return Err(bad(format!("the tokenizer has {} tokens, the model's vocabulary {}", v.tokens.len(), config.text.vocab_size)));
        }
        for (key, value) in v.metadata() {
            match metadata.iter().find(|(k, _)| *k == key) {
                Some((_, ours)) if *ours != value => {
                    return Err(bad(format!("{key} is {ours:?} in the model's config but {value:?} in its tokenizer")));
                }
                Some(_) => {}
                None => metadata.push((key, value)),
            }
        }
    }
    let mut w = GgufWriter::create(path, &metadata, &plan)?;
    if let Some(f) = &freqs {
        w.write_tensor(IGNORABLE[0], crate::stored::f32_bytes(f))?;
    }
    for ((hf, shape), planned) in manifest.iter().zip(&plan[usize::from(freqs.is_some())..]) {
        let t = src.stored(hf, shape)?;
        if t.dtype == planned.dtype {
            w.write_tensor(&planned.name, t.bytes())?;
        } else if planned.dtype == StoredDtype::F32 && !t.dtype.is_quantized() {
            w.write_tensor(&planned.name, crate::stored::f32_bytes(&t.to_f32()))?;
        } else {
            w.write_tensor(&planned.name, &encode(hf, &t, planned.dtype)?)?;
        }
    }
    w.finish()
}

/// [`write_model`] keeping every tensor in the type `src` stores it in.
pub fn write_model_as_stored<S: TensorSource + ?Sized>(
    path: &Path,
    config: &ModelConfig,
    generation: Option<&RawGenerationConfig>,
    vocab: Option<&Vocab>,
    src: &S,
) -> Result<()> {
    write_model(path, config, generation, vocab, src, &|_, stored| stored, &mut |hf, t, want| {
        Err(ModelError::Gguf { path: path.into(), message: format!("{hf}: cannot convert {} to {}", t.dtype.name(), want.name()) })
    })
}

//! Writing GGUF v3 files: metadata, then the tensor infos, then each tensor's bytes at an aligned
//! offset, streamed one tensor at a time (the model is never held in memory).
//!
//! Mirrors gguf-py's `GGUFWriter` (`write_header_to_file`, `write_kv_data_to_file`,
//! `write_ti_data_to_file`, `write_tensor_data`): every tensor's data starts at a multiple of
//! `general.alignment` from the data section, which itself starts aligned after the header.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use super::read::{DEFAULT_ALIGNMENT, MAGIC, MAX_DIMS, MetaValue};
use crate::error::{ModelError, Result};
use crate::stored::StoredDtype;

/// The GGUF version this writer produces.
pub const VERSION: u32 = 3;

/// A tensor the writer will write: GGUF name, row-major shape, dtype.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedTensor {
    pub name: String,
    /// Row-major (HF) shape; written reversed, as ggml's `ne`.
    pub shape: Vec<usize>,
    pub dtype: StoredDtype,
}

impl PlannedTensor {
    /// Bytes of the tensor's data, or `None` when its rows are not whole blocks.
    fn byte_len(&self) -> Option<usize> {
        let row = self.shape.last().copied().unwrap_or(1);
        if !row.is_multiple_of(self.dtype.block_len()) {
            return None;
        }
        super::read::byte_len(self.dtype, self.shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d))?)
    }
}

/// A GGUF file being written: the header is out, the tensors follow in plan order.
#[derive(Debug)]
pub struct GgufWriter {
    path: PathBuf,
    out: BufWriter<File>,
    alignment: usize,
    plan: Vec<(PlannedTensor, usize)>,
    next: usize,
    /// Bytes written since the data section started.
    data_written: usize,
}

impl GgufWriter {
    /// Creates `path` and writes the header: `metadata` (with `general.alignment` added when it
    /// is not among them) and the infos of `tensors`, whose data [`Self::write_tensor`] then
    /// takes in this order.
    pub fn create(path: &Path, metadata: &[(String, MetaValue)], tensors: &[PlannedTensor]) -> Result<Self> {
        let bad = |message: String| ModelError::Gguf { path: path.to_path_buf(), message };
        let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
            None => DEFAULT_ALIGNMENT as usize,
            Some((_, MetaValue::U32(a))) if a.is_power_of_two() => *a as usize,
            Some((_, other)) => return Err(bad(format!("general.alignment must be a power of two as uint32, got {other:?}"))),
        };
        let mut header = Vec::new();
        header.extend_from_slice(&MAGIC);
        header.extend_from_slice(&VERSION.to_le_bytes());
        header.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
        let add_alignment = !metadata.iter().any(|(k, _)| k == "general.alignment");
        header.extend_from_slice(&((metadata.len() + usize::from(add_alignment)) as u64).to_le_bytes());
        let mut keys = std::collections::HashSet::new();
        for (key, value) in metadata {
            if !keys.insert(key.as_str()) {
                return Err(bad(format!("metadata key {key:?} given twice")));
            }
            put_string(&mut header, key);
            header.extend_from_slice(&value.type_id().to_le_bytes());
            put_value(&mut header, value).map_err(|m| bad(format!("metadata {key:?}: {m}")))?;
        }
        if add_alignment {
            put_string(&mut header, "general.alignment");
            header.extend_from_slice(&MetaValue::U32(alignment as u32).type_id().to_le_bytes());
            header.extend_from_slice(&(alignment as u32).to_le_bytes());
        }
        let mut plan = Vec::with_capacity(tensors.len());
        let mut names = std::collections::HashSet::new();
        let mut offset = 0usize;
        for t in tensors {
            if !names.insert(t.name.as_str()) {
                return Err(bad(format!("tensor {:?} planned twice", t.name)));
            }
            if t.shape.len() > MAX_DIMS {
                return Err(bad(format!("tensor {:?} has {} dimensions (ggml has at most {MAX_DIMS})", t.name, t.shape.len())));
            }
            let len = t.byte_len().ok_or_else(|| {
                bad(format!(
                    "tensor {:?}: {} rows of shape {:?} are not whole blocks of {}",
                    t.name,
                    t.dtype.name(),
                    t.shape,
                    t.dtype.block_len()
                ))
            })?;
            put_string(&mut header, &t.name);
            header.extend_from_slice(&(t.shape.len() as u32).to_le_bytes());
            for &d in t.shape.iter().rev() {
                header.extend_from_slice(&(d as u64).to_le_bytes());
            }
            header.extend_from_slice(&t.dtype.ggml_type().to_le_bytes());
            header.extend_from_slice(&(offset as u64).to_le_bytes());
            plan.push((t.clone(), len));
            offset = (offset + len).next_multiple_of(alignment);
        }
        header.resize(header.len().next_multiple_of(alignment), 0);
        let io = |source| ModelError::Io { path: path.to_path_buf(), source };
        let mut out = BufWriter::new(File::create(path).map_err(io)?);
        out.write_all(&header).map_err(io)?;
        Ok(GgufWriter { path: path.to_path_buf(), out, alignment, plan, next: 0, data_written: 0 })
    }

    /// Writes the next planned tensor's data (`name` must be the next one in the plan, `bytes`
    /// exactly its size), padded to the alignment.
    pub fn write_tensor(&mut self, name: &str, bytes: &[u8]) -> Result<()> {
        let bad = |message: String| ModelError::Gguf { path: self.path.clone(), message };
        let Some((t, len)) = self.plan.get(self.next) else {
            return Err(bad(format!("tensor {name:?} written after every planned tensor")));
        };
        if t.name != name {
            return Err(bad(format!("tensor {name:?} written where {:?} was planned", t.name)));
        }
        if bytes.len() != *len {
            return Err(bad(format!("tensor {name:?}: {} bytes given, {len} planned ({} {:?})", bytes.len(), t.dtype.name(), t.shape)));
        }
        let pad = (self.data_written + len).next_multiple_of(self.alignment) - (self.data_written + len);
        let io = |source| ModelError::Io { path: self.path.clone(), source };
        self.out.write_all(bytes).map_err(io)?;
        self.out.write_all(&vec![0u8; pad]).map_err(io)?;
        self.data_written += len + pad;
        self.next += 1;
        Ok(())
    }

    /// Checks every planned tensor was written and flushes the file.
    pub fn finish(mut self) -> Result<()> {
        if let Some((t, _)) = self.plan.get(self.next) {
            return Err(ModelError::Gguf {
                path: self.path.clone(),
                message: format!("tensor {:?} was planned but never written", t.name),
            });
        }
        self.out.flush().map_err(|source| ModelError::Io { path: self.path.clone(), source })
    }
}

fn put_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, value: &MetaValue) -> std::result::Result<(), String> {
    match value {
        MetaValue::U8(v) => out.push(*v),
        MetaValue::I8(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::U16(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::I16(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::U32(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::I32(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::U64(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::I64(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::F32(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::F64(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::Bool(v) => out.push(u8::from(*v)),
        MetaValue::Str(s) => put_string(out, s),
        MetaValue::Array(elem, values) => {
            out.extend_from_slice(&elem.to_le_bytes());
            out.extend_from_slice(&(values.len() as u64).to_le_bytes());
            for v in values {
                if v.type_id() != *elem {
                    return Err(format!("an array of type {elem} holds {v:?}"));
                }
                put_value(out, v)?;
            }
        }
    }
    Ok(())
}

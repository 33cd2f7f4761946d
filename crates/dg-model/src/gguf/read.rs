//! Parsing a GGUF header (versions 2 and 3, little-endian) from bytes: magic, version, counts,
//! the metadata key/value pairs, `general.alignment`, the tensor infos and where the aligned data
//! section starts.
//!
//! Mirrors ggml's `gguf_init_from_file_impl` (`ggml/src/gguf.cpp`) and gguf-py's `GGUFReader`.
//! Nothing here trusts the header: every count and length is bounded by the bytes left in the file
//! before anything is allocated for it, every tensor's byte range is checked against the file and
//! its dtype's block size, and every failure is an error naming the file and the field or tensor.

use std::collections::HashSet;
use std::ops::Range;
use std::path::Path;

use crate::error::{ModelError, Result};
use crate::stored::StoredDtype;

/// `"GGUF"` as the file's first four bytes.
pub const MAGIC: [u8; 4] = *b"GGUF";
/// The data section's alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml's `GGML_MAX_DIMS`.
pub const MAX_DIMS: usize = 4;
/// Deepest nesting of arrays in a metadata value (ggml itself reads one level).
const MAX_ARRAY_DEPTH: usize = 4;

/// Metadata value type ids (`enum gguf_type`).
pub(crate) mod ty {
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;
}

/// A metadata value, decoded.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    Str(String),
    /// Elements of one type (`type_id`), possibly none.
    Array(u32, Vec<MetaValue>),
}

impl MetaValue {
    /// The GGUF type id of this value.
    pub fn type_id(&self) -> u32 {
        match self {
            MetaValue::U8(_) => ty::U8,
            MetaValue::I8(_) => ty::I8,
            MetaValue::U16(_) => ty::U16,
            MetaValue::I16(_) => ty::I16,
            MetaValue::U32(_) => ty::U32,
            MetaValue::I32(_) => ty::I32,
            MetaValue::U64(_) => ty::U64,
            MetaValue::I64(_) => ty::I64,
            MetaValue::F32(_) => ty::F32,
            MetaValue::F64(_) => ty::F64,
            MetaValue::Bool(_) => ty::BOOL,
            MetaValue::Str(_) => ty::STRING,
            MetaValue::Array(..) => ty::ARRAY,
        }
    }

    /// An integer value of any width as u64 (`None` for negative values and non-integers).
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetaValue::U8(v) => Some(v.into()),
            MetaValue::U16(v) => Some(v.into()),
            MetaValue::U32(v) => Some(v.into()),
            MetaValue::U64(v) => Some(v),
            MetaValue::I8(v) => u64::try_from(v).ok(),
            MetaValue::I16(v) => u64::try_from(v).ok(),
            MetaValue::I32(v) => u64::try_from(v).ok(),
            MetaValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// A float or integer value as f64.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetaValue::F32(v) => Some(v.into()),
            MetaValue::F64(v) => Some(v),
            _ => self.as_u64().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetaValue::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            MetaValue::Array(_, v) => Some(v),
            _ => None,
        }
    }
}

/// One metadata entry: its key, type and where its value's bytes lie (decoded on demand, so a
/// large array nobody asks for costs nothing).
#[derive(Debug, Clone)]
pub(crate) struct RawEntry {
    pub key: String,
    pub type_id: u32,
    pub bytes: Range<usize>,
}

/// One tensor info, validated against the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order: `dims[0]` (ne[0]) varies fastest, the reverse of the row-major shape.
    pub dims: Vec<usize>,
    pub dtype: StoredDtype,
    /// Absolute byte range of the data in the file.
    pub bytes: Range<usize>,
}

impl TensorInfo {
    /// The row-major (PyTorch / HF) shape: the ggml dims reversed.
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().copied().collect()
    }
}

/// A parsed header: everything but the tensor data.
#[derive(Debug, Clone)]
pub struct Header {
    pub version: u32,
    pub alignment: u64,
    pub(crate) metadata: Vec<RawEntry>,
    pub tensors: Vec<TensorInfo>,
    /// Absolute offset of the (aligned) data section.
    pub data_start: usize,
}

/// Bytes of `elements` elements (whole blocks) of `dtype`; `None` when that overflows.
pub(crate) fn byte_len(dtype: StoredDtype, elements: usize) -> Option<usize> {
    if !elements.is_multiple_of(dtype.block_len()) {
        return None;
    }
    (elements / dtype.block_len()).checked_mul(dtype.block_bytes())
}

/// ggml's names of the type ids dg does not read, for error messages.
fn ggml_type_name(id: u32) -> Option<&'static str> {
    const NAMES: [&str; 43] = [
        "F32",
        "F16",
        "Q4_0",
        "Q4_1",
        "Q4_2",
        "Q4_3",
        "Q5_0",
        "Q5_1",
        "Q8_0",
        "Q8_1",
        "Q2_K",
        "Q3_K",
        "Q4_K",
        "Q5_K",
        "Q6_K",
        "Q8_K",
        "IQ2_XXS",
        "IQ2_XS",
        "IQ3_XXS",
        "IQ1_S",
        "IQ4_NL",
        "IQ3_S",
        "IQ2_S",
        "IQ4_XS",
        "I8",
        "I16",
        "I32",
        "I64",
        "F64",
        "IQ1_M",
        "BF16",
        "Q4_0_4_4",
        "Q4_0_4_8",
        "Q4_0_8_8",
        "TQ1_0",
        "TQ2_0",
        "IQ4_NL_4_4",
        "IQ4_NL_4_8",
        "IQ4_NL_8_8",
        "MXFP4",
        "NVFP4",
        "Q1_0",
        "Q2_0",
    ];
    NAMES.get(id as usize).copied()
}

/// A little-endian cursor over the header bytes; every read checks the bytes left.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Cursor<'a> {
    fn err(&self, message: impl Into<String>) -> ModelError {
        ModelError::Gguf { path: self.path.to_path_buf(), message: message.into() }
    }

    fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(self.err(format!(
                "truncated: {what} needs {n} bytes at offset {}, but the file has {} left",
                self.pos,
                self.remaining()
            )));
        }
        let out = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4, what)?.try_into().expect("4 bytes")))
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8, what)?.try_into().expect("8 bytes")))
    }

    /// A count that will be allocated for: at most the bytes left divided by the smallest size
    /// one element can take.
    fn count(&mut self, what: &str, min_element_bytes: usize) -> Result<usize> {
        let n = self.u64(what)?;
        let most = self.remaining() / min_element_bytes.max(1);
        if n > most as u64 {
            return Err(self.err(format!("{what} is {n}, but the {} bytes left in the file hold at most {most}", self.remaining())));
        }
        Ok(n as usize)
    }

    /// A GGUF string: u64 length, then that many bytes.
    fn string_bytes(&mut self, what: &str) -> Result<&'a [u8]> {
        let len = self.count(&format!("length of {what}"), 1)?;
        self.take(len, what)
    }

    fn utf8(&mut self, what: &str) -> Result<String> {
        let bytes = self.string_bytes(what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| self.err(format!("{what} is not valid UTF-8")))
    }

    /// Skips one value of type `type_id`, checking it is complete.
    fn skip_value(&mut self, type_id: u32, what: &str, depth: usize) -> Result<()> {
        match type_id {
            ty::ARRAY => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(self.err(format!("{what}: arrays nested deeper than {MAX_ARRAY_DEPTH}")));
                }
                let elem = self.u32(&format!("{what}: array element type"))?;
                let min = element_size(elem).ok_or_else(|| self.err(format!("{what}: unknown array element type {elem}")))?;
                let n = self.count(&format!("{what}: array length"), min)?;
                match scalar_size(elem) {
                    Some(size) => {
                        self.take(n * size, what)?;
                    }
                    None => {
                        for _ in 0..n {
                            self.skip_value(elem, what, depth + 1)?;
                        }
                    }
                }
            }
            ty::STRING => {
                self.string_bytes(what)?;
            }
            other => {
                let size = scalar_size(other).ok_or_else(|| self.err(format!("{what}: unknown value type {other}")))?;
                self.take(size, what)?;
            }
        }
        Ok(())
    }
}

/// Bytes of a fixed-size value type.
fn scalar_size(type_id: u32) -> Option<usize> {
    Some(match type_id {
        ty::U8 | ty::I8 | ty::BOOL => 1,
        ty::U16 | ty::I16 => 2,
        ty::U32 | ty::I32 | ty::F32 => 4,
        ty::U64 | ty::I64 | ty::F64 => 8,
        _ => return None,
    })
}

/// The fewest bytes one element of `type_id` takes in the file (a string or an array: its length).
fn element_size(type_id: u32) -> Option<usize> {
    match type_id {
        ty::STRING => Some(8),
        ty::ARRAY => Some(12),
        other => scalar_size(other),
    }
}

/// Decodes a value already checked by [`Cursor::skip_value`].
pub(crate) fn decode_value(bytes: &[u8], type_id: u32) -> MetaValue {
    let mut pos = 0;
    decode_at(bytes, &mut pos, type_id)
}

fn take<'b>(b: &'b [u8], pos: &mut usize, n: usize) -> &'b [u8] {
    let s = &b[*pos..*pos + n];
    *pos += n;
    s
}

fn decode_at(b: &[u8], pos: &mut usize, type_id: u32) -> MetaValue {
    macro_rules! le {
        ($t:ty) => {
            <$t>::from_le_bytes(take(b, pos, std::mem::size_of::<$t>()).try_into().expect("sized"))
        };
    }
    match type_id {
        ty::U8 => MetaValue::U8(le!(u8)),
        ty::I8 => MetaValue::I8(le!(i8)),
        ty::U16 => MetaValue::U16(le!(u16)),
        ty::I16 => MetaValue::I16(le!(i16)),
        ty::U32 => MetaValue::U32(le!(u32)),
        ty::I32 => MetaValue::I32(le!(i32)),
        ty::U64 => MetaValue::U64(le!(u64)),
        ty::I64 => MetaValue::I64(le!(i64)),
        ty::F32 => MetaValue::F32(le!(f32)),
        ty::F64 => MetaValue::F64(le!(f64)),
        ty::BOOL => MetaValue::Bool(le!(u8) != 0),
        ty::STRING => {
            let len = le!(u64) as usize;
            MetaValue::Str(String::from_utf8_lossy(take(b, pos, len)).into_owned())
        }
        ty::ARRAY => {
            let elem = le!(u32);
            let n = le!(u64) as usize;
            let values = (0..n).map(|_| decode_at(b, pos, elem)).collect();
            MetaValue::Array(elem, values)
        }
        other => unreachable!("value type {other} was rejected while parsing"),
    }
}

impl Header {
    /// Parses and validates the header of a GGUF file whose whole content is `bytes`; `path` only
    /// names the file in errors.
    pub fn parse(bytes: &[u8], path: &Path) -> Result<Header> {
        let mut c = Cursor { bytes, pos: 0, path };
        let magic = c.take(4, "the magic")?;
        if magic != MAGIC {
            return Err(c.err(format!("bad magic {magic:02x?} (a GGUF file starts with \"GGUF\")")));
        }
        let version = c.u32("the version")?;
        if !(2..=3).contains(&version) {
            return Err(c.err(format!("GGUF version {version} is not supported (2 and 3 are)")));
        }
        // The smallest tensor info: name length, n_dims, type, offset.
        let tensor_count = c.count("the tensor count", 8 + 4 + 4 + 8)?;
        // The smallest entry: key length, value type, a one-byte value.
        let kv_count = c.count("the metadata count", 8 + 4 + 1)?;

        let mut metadata = Vec::with_capacity(kv_count);
        let mut keys = HashSet::with_capacity(kv_count);
        for i in 0..kv_count {
            let key = c.utf8(&format!("metadata key #{i}"))?;
            let type_id = c.u32(&format!("the type of metadata {key:?}"))?;
            let start = c.pos;
            c.skip_value(type_id, &format!("metadata {key:?}"), 0)?;
            if !keys.insert(key.clone()) {
                return Err(ModelError::GgufMetadata { path: path.into(), key, message: "appears twice".into() });
            }
            metadata.push(RawEntry { key, type_id, bytes: start..c.pos });
        }
        let alignment = match metadata.iter().find(|e| e.key == "general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(e) => match decode_value(&bytes[e.bytes.clone()], e.type_id) {
                MetaValue::U32(a) if a.is_power_of_two() => a.into(),
                other => {
                    return Err(ModelError::GgufMetadata {
                        path: path.into(),
                        key: e.key.clone(),
                        message: format!("must be a power of two stored as uint32, got {other:?}"),
                    });
                }
            },
        };

        let mut infos = Vec::with_capacity(tensor_count);
        let mut names = HashSet::with_capacity(tensor_count);
        for i in 0..tensor_count {
            let name = c.utf8(&format!("the name of tensor #{i}"))?;
            let tensor_err = |message: String| ModelError::GgufTensor { path: path.into(), name: name.clone(), message };
            let n_dims = c.u32(&format!("n_dims of tensor {name:?}"))? as usize;
            if n_dims > MAX_DIMS {
                return Err(tensor_err(format!("{n_dims} dimensions (ggml has at most {MAX_DIMS})")));
            }
            let mut dims = Vec::with_capacity(n_dims);
            for d in 0..n_dims {
                let ne = c.u64(&format!("dimension {d} of tensor {name:?}"))?;
                dims.push(usize::try_from(ne).map_err(|_| tensor_err(format!("dimension {d} is {ne}")))?);
            }
            let type_id = c.u32(&format!("the type of tensor {name:?}"))?;
            let offset = c.u64(&format!("the offset of tensor {name:?}"))?;
            let dtype = StoredDtype::from_ggml_type(type_id).ok_or_else(|| ModelError::GgufType {
                path: path.into(),
                name: name.clone(),
                type_id,
                type_name: ggml_type_name(type_id).unwrap_or("unknown").to_string(),
            })?;
            if !names.insert(name.clone()) {
                return Err(tensor_err("appears twice".into()));
            }
            infos.push((name, dims, dtype, offset));
        }
        let data_start = c.pos.checked_next_multiple_of(alignment as usize).ok_or_else(|| c.err("the data section's offset overflows"))?;

        let mut tensors = Vec::with_capacity(infos.len());
        for (name, dims, dtype, offset) in infos {
            let tensor_err = |message: String| ModelError::GgufTensor { path: path.into(), name: name.clone(), message };
            let row = dims.first().copied().unwrap_or(1);
            if !row.is_multiple_of(dtype.block_len()) {
                return Err(tensor_err(format!(
                    "{} rows of {row} elements are not whole blocks of {} (ggml dims {dims:?})",
                    dtype.name(),
                    dtype.block_len()
                )));
            }
            let elements =
                dims.iter().try_fold(1usize, |n, &d| n.checked_mul(d)).ok_or_else(|| tensor_err(format!("dims {dims:?} overflow")))?;
            let len = byte_len(dtype, elements).ok_or_else(|| tensor_err(format!("{elements} {} elements overflow", dtype.name())))?;
            if offset % alignment != 0 {
                return Err(tensor_err(format!("data offset {offset} is not a multiple of the alignment {alignment}")));
            }
            let start = usize::try_from(offset).ok().and_then(|o| o.checked_add(data_start));
            let end = start.and_then(|s| s.checked_add(len));
            match (start, end) {
                (Some(start), Some(end)) if end <= bytes.len() => tensors.push(TensorInfo { name, dims, dtype, bytes: start..end }),
                _ => {
                    return Err(tensor_err(format!(
                        "{len} bytes of {} data at offset {offset} past the data section at {data_start} run beyond the end of \
                         the file ({} bytes; truncated?)",
                        dtype.name(),
                        bytes.len()
                    )));
                }
            }
        }
        Ok(Header { version, alignment, metadata, tensors, data_start })
    }
}

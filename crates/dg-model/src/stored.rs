//! Tensors as a checkpoint stores them: a dtype, a shape and the little-endian bytes, borrowed
//! from the memory map (or owned, for sources that invent their values).
//!
//! This is what `safetensors` files hold for `PreTrainedModel.save_pretrained` (F32, F16, BF16).
//! A consumer that computes in f32 widens with [`StoredTensor::to_f32`]; one that keeps the
//! stored format (the GPU upload) converts runs of elements straight from the bytes
//! ([`StoredTensor::widen_range`], [`StoredTensor::bytes`]) and never holds an f32 copy of a
//! tensor.

use std::borrow::Cow;

use rayon::prelude::*;

/// Element types a checkpoint may store floating-point tensors in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StoredDtype {
    F32,
    F16,
    BF16,
}

impl StoredDtype {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            StoredDtype::F32 => 4,
            StoredDtype::F16 | StoredDtype::BF16 => 2,
        }
    }

    /// The dtype's safetensors name (`F32`, `F16`, `BF16`).
    pub fn name(self) -> &'static str {
        match self {
            StoredDtype::F32 => "F32",
            StoredDtype::F16 => "F16",
            StoredDtype::BF16 => "BF16",
        }
    }
}

/// Elements converted per parallel task when widening a whole tensor.
const WIDEN_CHUNK: usize = 1 << 16;

/// One tensor in its stored dtype, row-major.
#[derive(Debug, Clone)]
pub struct StoredTensor<'a> {
    pub dtype: StoredDtype,
    pub shape: Vec<usize>,
    data: Data<'a>,
}

#[derive(Debug, Clone)]
enum Data<'a> {
    Bytes(Cow<'a, [u8]>),
    F32(Vec<f32>),
}

impl<'a> StoredTensor<'a> {
    /// A tensor over `bytes` (little-endian elements of `dtype`, as many as `shape` says).
    ///
    /// # Panics
    /// When the byte count does not match the shape: sources check this before (the checkpoint
    /// reader validates every header against the file).
    pub fn from_bytes(dtype: StoredDtype, shape: Vec<usize>, bytes: impl Into<Cow<'a, [u8]>>) -> Self {
        let bytes = bytes.into();
        let n: usize = shape.iter().product();
        assert_eq!(bytes.len(), n * dtype.size(), "{} bytes for {n} {} elements", bytes.len(), dtype.name());
        StoredTensor { dtype, shape, data: Data::Bytes(bytes) }
    }

    /// An F32 tensor that owns its values.
    ///
    /// # Panics
    /// When the value count does not match the shape.
    pub fn from_f32(shape: Vec<usize>, values: Vec<f32>) -> StoredTensor<'static> {
        let n: usize = shape.iter().product();
        assert_eq!(values.len(), n, "{} values for shape {shape:?}", values.len());
        StoredTensor { dtype: StoredDtype::F32, shape, data: Data::F32(values) }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The stored bytes, little-endian.
    pub fn bytes(&self) -> &[u8] {
        match &self.data {
            Data::Bytes(b) => b,
            Data::F32(v) => f32_bytes(v),
        }
    }

    /// Bytes of the tensor as stored.
    pub fn byte_len(&self) -> usize {
        self.len() * self.dtype.size()
    }

    /// Elements `start..start + out.len()` widened to f32 into `out` (exact for every dtype).
    pub fn widen_range(&self, start: usize, out: &mut [f32]) {
        let size = self.dtype.size();
        let bytes = &self.bytes()[start * size..(start + out.len()) * size];
        match self.dtype {
            StoredDtype::F32 => {
                for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                    *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
            }
            StoredDtype::BF16 => {
                for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                    *o = half::bf16::from_le_bytes([b[0], b[1]]).to_f32();
                }
            }
            StoredDtype::F16 => {
                for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                    *o = half::f16::from_le_bytes([b[0], b[1]]).to_f32();
                }
            }
        }
    }

    /// The whole tensor as f32 (an owned F32 tensor gives its values back without a copy).
    pub fn into_f32(self) -> Vec<f32> {
        match self.data {
            Data::F32(v) => v,
            Data::Bytes(_) => self.to_f32(),
        }
    }

    /// The whole tensor widened to f32, in parallel.
    pub fn to_f32(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.len()];
        out.par_chunks_mut(WIDEN_CHUNK).enumerate().for_each(|(c, chunk)| self.widen_range(c * WIDEN_CHUNK, chunk));
        out
    }
}

/// f32 values as their little-endian bytes (every target dg builds for is little-endian).
pub(crate) fn f32_bytes(v: &[f32]) -> &[u8] {
    const _: () = assert!(cfg!(target_endian = "little"), "stored tensors are little-endian");
    // SAFETY: f32 has no padding and every byte pattern is a valid u8; the slice covers exactly
    // the values' memory and lives as long as `v`.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn widening_is_exact_for_every_dtype() {
        let values = [0.0f32, -1.5, 3.0e-5, 65504.0, f32::MIN_POSITIVE, 1.0e30];
        let f32_bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let t = StoredTensor::from_bytes(StoredDtype::F32, vec![2, 3], &f32_bytes[..]);
        assert_eq!(t.to_f32(), values);
        let bf: Vec<u8> = values.iter().flat_map(|&v| half::bf16::from_f32(v).to_le_bytes()).collect();
        let t = StoredTensor::from_bytes(StoredDtype::BF16, vec![6], bf);
        let want: Vec<f32> = values.iter().map(|&v| half::bf16::from_f32(v).to_f32()).collect();
        assert_eq!(t.to_f32(), want);
        let h: Vec<u8> = values.iter().flat_map(|&v| half::f16::from_f32(v).to_le_bytes()).collect();
        let t = StoredTensor::from_bytes(StoredDtype::F16, vec![6], h);
        let want: Vec<f32> = values.iter().map(|&v| half::f16::from_f32(v).to_f32()).collect();
        assert_eq!(t.to_f32(), want);
        let mut part = [0f32; 2];
        t.widen_range(2, &mut part);
        assert_eq!(part, want[2..4]);
    }

    #[test]
    fn owned_f32_bytes_are_the_values() {
        let t = StoredTensor::from_f32(vec![2], vec![1.0, -2.0]);
        assert_eq!(t.bytes(), [1.0f32.to_le_bytes(), (-2.0f32).to_le_bytes()].concat());
        assert_eq!(t.into_f32(), [1.0, -2.0]);
    }
}

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

/// Element types a checkpoint may store tensors in: floating-point elements (safetensors and
/// GGUF) and ggml's quantized blocks (GGUF), where `block_len` elements share `block_bytes` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum StoredDtype {
    F32,
    F16,
    BF16,
    /// ggml `Q8_0`: 32 values in 34 bytes (an f16 scale, 32 i8).
    Q8_0,
    /// ggml `Q5_0`: 32 values in 22 bytes (an f16 scale, 4 bytes of high bits, 16 of nibbles).
    Q5_0,
    /// ggml `Q4_K`: 256 values in 144 bytes (f16 d and dmin, 12 bytes of 6-bit scales and mins, 128 of nibbles).
    Q4_K,
    /// ggml `Q6_K`: 256 values in 210 bytes (128 low nibbles, 64 of high bits, 16 i8 scales, an f16 d).
    Q6_K,
}

impl StoredDtype {
    /// Every dtype, in ggml type-id order of the quantized ones.
    pub const ALL: [StoredDtype; 7] =
        [StoredDtype::F32, StoredDtype::F16, StoredDtype::BF16, StoredDtype::Q8_0, StoredDtype::Q5_0, StoredDtype::Q4_K, StoredDtype::Q6_K];

    /// Elements per block (1 for the floating-point dtypes).
    pub const fn block_len(self) -> usize {
        match self {
            StoredDtype::F32 | StoredDtype::F16 | StoredDtype::BF16 => 1,
            StoredDtype::Q8_0 | StoredDtype::Q5_0 => 32,
            StoredDtype::Q4_K | StoredDtype::Q6_K => 256,
        }
    }

    /// Bytes per block (per element for the floating-point dtypes).
    pub const fn block_bytes(self) -> usize {
        match self {
            StoredDtype::F32 => 4,
            StoredDtype::F16 | StoredDtype::BF16 => 2,
            StoredDtype::Q8_0 => 34,
            StoredDtype::Q5_0 => 22,
            StoredDtype::Q4_K => 144,
            StoredDtype::Q6_K => 210,
        }
    }

    /// Whether elements come in quantized blocks.
    pub const fn is_quantized(self) -> bool {
        self.block_len() > 1
    }

    /// Bytes of `elements` elements; `None` when they are not a whole number of blocks.
    pub const fn bytes_for(self, elements: usize) -> Option<usize> {
        if !elements.is_multiple_of(self.block_len()) {
            return None;
        }
        Some(elements / self.block_len() * self.block_bytes())
    }

    /// Bytes per element of a floating-point dtype.
    ///
    /// # Panics
    /// On a quantized dtype, whose elements have no whole byte count ([`Self::bytes_for`]).
    pub fn size(self) -> usize {
        assert!(!self.is_quantized(), "{} stores blocks of {} elements, not single elements", self.name(), self.block_len());
        self.block_bytes()
    }

    /// The dtype's name: safetensors' (`F32`, `F16`, `BF16`) or ggml's (`Q8_0`, ...).
    pub fn name(self) -> &'static str {
        match self {
            StoredDtype::F32 => "F32",
            StoredDtype::F16 => "F16",
            StoredDtype::BF16 => "BF16",
            StoredDtype::Q8_0 => "Q8_0",
            StoredDtype::Q5_0 => "Q5_0",
            StoredDtype::Q4_K => "Q4_K",
            StoredDtype::Q6_K => "Q6_K",
        }
    }

    /// The dtype named `name` ([`Self::name`]'s spelling); `None` for any other name.
    pub fn from_name(name: &str) -> Option<StoredDtype> {
        StoredDtype::ALL.into_iter().find(|d| d.name() == name)
    }

    /// ggml's type id (`enum ggml_type`), as GGUF stores it.
    pub const fn ggml_type(self) -> u32 {
        match self {
            StoredDtype::F32 => 0,
            StoredDtype::F16 => 1,
            StoredDtype::Q5_0 => 6,
            StoredDtype::Q8_0 => 8,
            StoredDtype::Q4_K => 12,
            StoredDtype::Q6_K => 14,
            StoredDtype::BF16 => 30,
        }
    }

    /// The dtype of ggml type id `id`; `None` for types dg does not read.
    pub fn from_ggml_type(id: u32) -> Option<StoredDtype> {
        StoredDtype::ALL.into_iter().find(|d| d.ggml_type() == id)
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
        assert_eq!(Some(bytes.len()), dtype.bytes_for(n), "{} bytes for {n} {} elements", bytes.len(), dtype.name());
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
        self.dtype.bytes_for(self.len()).expect("a stored tensor holds whole blocks")
    }

    /// Elements `start..start + out.len()` widened to f32 into `out` (exact for every dtype; for a
    /// quantized dtype, ggml's dequantization: a range that is not whole blocks dequantizes the
    /// blocks that cover it).
    ///
    /// # Panics
    /// When the range runs past the tensor.
    pub fn widen_range(&self, start: usize, out: &mut [f32]) {
        let block = self.dtype.block_len();
        let end = start + out.len();
        assert!(end <= self.len(), "{} elements {start}..{end} of a tensor of {}", self.dtype.name(), self.len());
        if !start.is_multiple_of(block) || !out.len().is_multiple_of(block) {
            let first = start / block * block;
            let mut covering = vec![0f32; end.div_ceil(block) * block - first];
            self.widen_range(first, &mut covering);
            out.copy_from_slice(&covering[start - first..end - first]);
            return;
        }
        let (at, len) = (self.dtype.bytes_for(start).expect("whole blocks"), self.dtype.bytes_for(out.len()).expect("whole blocks"));
        let bytes = &self.bytes()[at..at + len];
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
            q => crate::quant::dequantize(q, bytes, out),
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

    #[test]
    fn a_quantized_range_that_is_not_whole_blocks_reads_the_covering_blocks() {
        let values: Vec<f32> = (0..512).map(|i| (i as f32 * 0.37).sin()).collect();
        for dtype in [StoredDtype::Q8_0, StoredDtype::Q4_K] {
            let t = StoredTensor::from_bytes(dtype, vec![2, 256], crate::quantize(dtype, &values).unwrap());
            let whole = t.to_f32();
            for (start, len) in [(3, 40), (250, 20), (0, 31), (480, 32)] {
                let mut part = vec![0f32; len];
                t.widen_range(start, &mut part);
                assert_eq!(part, whole[start..start + len], "{} {start}+{len}", dtype.name());
            }
        }
    }
}

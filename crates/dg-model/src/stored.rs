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
///
/// The quantized variants are every block type gguf-py's `gguf.quants.dequantize` reads but the
/// ternary `TQ1_0` and `TQ2_0`, named as ggml names them; their layouts are `ggml-common.h`'s
/// `block_*` structs (each format's module in `quant` describes its own).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum StoredDtype {
    F32,
    F16,
    BF16,
    /// ggml `Q4_0`: 32 values in 18 bytes (an f16 scale, 16 bytes of nibbles).
    Q4_0,
    /// ggml `Q4_1`: 32 values in 20 bytes (f16 scale and min, 16 bytes of nibbles).
    Q4_1,
    /// ggml `Q5_0`: 32 values in 22 bytes (an f16 scale, 4 bytes of high bits, 16 of nibbles).
    Q5_0,
    /// ggml `Q5_1`: 32 values in 24 bytes (f16 scale and min, 4 bytes of high bits, 16 of nibbles).
    Q5_1,
    /// ggml `Q8_0`: 32 values in 34 bytes (an f16 scale, 32 i8).
    Q8_0,
    /// ggml `Q2_K`: 256 values in 84 bytes (16 bytes of 4-bit scales and mins, 64 of 2-bit quants, f16 d and dmin).
    Q2_K,
    /// ggml `Q3_K`: 256 values in 110 bytes (32 bytes of high bits, 64 of 2-bit quants, 12 of 6-bit scales, an f16 d).
    Q3_K,
    /// ggml `Q4_K`: 256 values in 144 bytes (f16 d and dmin, 12 bytes of 6-bit scales and mins, 128 of nibbles).
    Q4_K,
    /// ggml `Q5_K`: 256 values in 176 bytes (f16 d and dmin, 12 bytes of 6-bit scales and mins, 32 of high bits, 128 of nibbles).
    Q5_K,
    /// ggml `Q6_K`: 256 values in 210 bytes (128 low nibbles, 64 of high bits, 16 i8 scales, an f16 d).
    Q6_K,
    /// ggml `IQ2_XXS`: 256 values in 66 bytes (an f16 d, 8 pairs of u32: grid indices, signs and a scale).
    IQ2_XXS,
    /// ggml `IQ2_XS`: 256 values in 74 bytes (an f16 d, 32 u16 of grid index and signs, 8 bytes of scales).
    IQ2_XS,
    /// ggml `IQ3_XXS`: 256 values in 98 bytes (an f16 d, 64 grid indices, 8 u32 of signs and scales).
    IQ3_XXS,
    /// ggml `IQ1_S`: 256 values in 50 bytes (an f16 d, 32 bytes of grid indices, 8 u16 of index bits, scales and deltas).
    IQ1_S,
    /// ggml `IQ4_NL`: 32 values in 18 bytes (an f16 scale, 16 bytes of nibbles indexing 16 non-linear levels).
    IQ4_NL,
    /// ggml `IQ3_S`: 256 values in 110 bytes (an f16 d, 64 grid indices, 8 bytes of index bits, 32 of signs, 4 of scales).
    IQ3_S,
    /// ggml `IQ2_S`: 256 values in 82 bytes (an f16 d, 32 grid indices, 32 bytes of signs, 8 of index bits, 8 of scales).
    IQ2_S,
    /// ggml `IQ4_XS`: 256 values in 136 bytes (an f16 d, 6-bit sub-block scales in 2 + 4 bytes, 128 bytes of nibbles).
    IQ4_XS,
    /// ggml `IQ1_M`: 256 values in 56 bytes (32 grid indices, 16 bytes of index bits and deltas, 4 u16 of scales and d).
    IQ1_M,
    /// ggml `MXFP4`: 32 values in 17 bytes (an E8M0 scale, 16 bytes of FP4 nibbles).
    MXFP4,
    /// ggml `NVFP4`: 64 values in 36 bytes (four UE4M3 scales of 16 values each, 32 bytes of FP4 nibbles).
    NVFP4,
}

impl StoredDtype {
    /// Every dtype: the floating-point ones, then the quantized ones in ggml type-id order.
    pub const ALL: [StoredDtype; 24] = {
        use StoredDtype::*;
        [
            F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ2_XXS, IQ2_XS, IQ3_XXS, IQ1_S, IQ4_NL, IQ3_S,
            IQ2_S, IQ4_XS, IQ1_M, MXFP4, NVFP4,
        ]
    };

    /// Elements per block (1 for the floating-point dtypes).
    pub const fn block_len(self) -> usize {
        use StoredDtype::*;
        match self {
            F32 | F16 | BF16 => 1,
            Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | IQ4_NL | MXFP4 => 32,
            NVFP4 => 64,
            Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | IQ2_XXS | IQ2_XS | IQ3_XXS | IQ1_S | IQ3_S | IQ2_S | IQ4_XS | IQ1_M => 256,
        }
    }

    /// Bytes per block (per element for the floating-point dtypes).
    pub const fn block_bytes(self) -> usize {
        use StoredDtype::*;
        match self {
            F32 => 4,
            F16 | BF16 => 2,
            Q4_0 | IQ4_NL => 18,
            Q4_1 => 20,
            Q5_0 => 22,
            Q5_1 => 24,
            Q8_0 => 34,
            Q2_K => 84,
            Q3_K | IQ3_S => 110,
            Q4_K => 144,
            Q5_K => 176,
            Q6_K => 210,
            IQ2_XXS => 66,
            IQ2_XS => 74,
            IQ3_XXS => 98,
            IQ1_S => 50,
            IQ2_S => 82,
            IQ4_XS => 136,
            IQ1_M => 56,
            MXFP4 => 17,
            NVFP4 => 36,
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

    /// The dtype's name: safetensors' (`F32`, `F16`, `BF16`) or ggml's (`Q8_0`, `IQ4_XS`, ...).
    pub fn name(self) -> &'static str {
        use StoredDtype::*;
        match self {
            F32 => "F32",
            F16 => "F16",
            BF16 => "BF16",
            Q4_0 => "Q4_0",
            Q4_1 => "Q4_1",
            Q5_0 => "Q5_0",
            Q5_1 => "Q5_1",
            Q8_0 => "Q8_0",
            Q2_K => "Q2_K",
            Q3_K => "Q3_K",
            Q4_K => "Q4_K",
            Q5_K => "Q5_K",
            Q6_K => "Q6_K",
            IQ2_XXS => "IQ2_XXS",
            IQ2_XS => "IQ2_XS",
            IQ3_XXS => "IQ3_XXS",
            IQ1_S => "IQ1_S",
            IQ4_NL => "IQ4_NL",
            IQ3_S => "IQ3_S",
            IQ2_S => "IQ2_S",
            IQ4_XS => "IQ4_XS",
            IQ1_M => "IQ1_M",
            MXFP4 => "MXFP4",
            NVFP4 => "NVFP4",
        }
    }

    /// The dtype named `name` ([`Self::name`]'s spelling); `None` for any other name.
    pub fn from_name(name: &str) -> Option<StoredDtype> {
        StoredDtype::ALL.into_iter().find(|d| d.name() == name)
    }

    /// ggml's type id (`enum ggml_type`, gguf-py's `GGMLQuantizationType`), as GGUF stores it.
    pub const fn ggml_type(self) -> u32 {
        use StoredDtype::*;
        match self {
            F32 => 0,
            F16 => 1,
            Q4_0 => 2,
            Q4_1 => 3,
            Q5_0 => 6,
            Q5_1 => 7,
            Q8_0 => 8,
            Q2_K => 10,
            Q3_K => 11,
            Q4_K => 12,
            Q5_K => 13,
            Q6_K => 14,
            IQ2_XXS => 16,
            IQ2_XS => 17,
            IQ3_XXS => 18,
            IQ1_S => 19,
            IQ4_NL => 20,
            IQ3_S => 21,
            IQ2_S => 22,
            IQ4_XS => 23,
            IQ1_M => 29,
            BF16 => 30,
            MXFP4 => 39,
            NVFP4 => 40,
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

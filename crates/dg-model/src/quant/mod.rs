//! ggml's quantized block formats (`ggml/src/ggml-quants.c`, `gguf-py/gguf/quants.py`): the
//! dequantization every reader of a GGUF file needs, and the reference quantizers `dg quantize`
//! writes them with.

use crate::stored::StoredDtype;

/// `bytes` (whole blocks of `dtype`) dequantized into `out` (as many elements as they hold).
pub(crate) fn dequantize(dtype: StoredDtype, bytes: &[u8], out: &mut [f32]) {
    unimplemented!("dequantization of {} lands with the block formats ({} bytes into {})", dtype.name(), bytes.len(), out.len())
}

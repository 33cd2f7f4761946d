//! The GPU's weight storage: BF16 for a BF16 checkpoint (exact to the checkpoint, 2 bytes per
//! parameter), f32 otherwise, a quantized GGUF's blocks as stored, unless `--weights` says which;
//! `--weights q8_0|q4_k_m` also quantizes the checkpoint's matrices at load ([`dg_model::Scheme`]).
//!
//! Quantized matrices (a quantized GGUF's, or quantized at load) run in the F16 mode on an adapter
//! with tensor cores (cooperative matrices): the tensor-core kernels dequantize their blocks into
//! f16 tiles, and the other matrices are F16. The F16 mode's own error (1.2e-3 normwise from the
//! f32 forward on `tensor-core-shapes`) is well below what the quantization costs (BENCHMARKS.md,
//! "Quantization accuracy"), and it runs 4–5× faster than the portable kernels there.

use dg_gpu::WeightFormat;
use dg_model::{ModelDir, Scheme};

use crate::args::{SchemeArg, WeightsArg};

/// What `--weights` asks for: the format of the matrices that are not quantized, and the scheme
/// that quantizes the others at load (none: the checkpoint's own types).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WeightChoice {
    pub format: WeightFormat,
    pub scheme: Option<Scheme>,
}

/// The choice `arg` makes for `model` on an adapter with (`tensor_cores`) or without cooperative
/// matrices.
pub fn choose(model: &ModelDir, arg: WeightsArg, tensor_cores: bool) -> WeightChoice {
    let auto = if model.unquantized_matrices_are_bf16() { WeightFormat::Bf16 } else { WeightFormat::F32 };
    // Quantized matrices: the F16 mode where the tensor cores read their blocks.
    let quantized = if tensor_cores { WeightFormat::F16 } else { auto };
    let (format, scheme) = match arg {
        WeightsArg::F32 => (WeightFormat::F32, None),
        WeightsArg::Bf16 => (WeightFormat::Bf16, None),
        WeightsArg::F16 => (WeightFormat::F16, None),
        WeightsArg::Auto if model.has_quantized_matrices() => (quantized, None),
        WeightsArg::Auto => (auto, None),
        WeightsArg::Q8_0 => (quantized, Some(Scheme::Q8_0)),
        WeightsArg::Q4KM => (quantized, Some(Scheme::Q4KM)),
    };
    WeightChoice { format, scheme }
}

/// The scheme `arg` names.
pub fn scheme(arg: SchemeArg) -> Scheme {
    match arg {
        SchemeArg::Q4KM => Scheme::Q4KM,
        SchemeArg::Q8_0 => Scheme::Q8_0,
    }
}

/// `bf16` / `f32` / `f16`, or the ggml type of quantized matrices.
pub fn name(format: WeightFormat) -> &'static str {
    match format {
        WeightFormat::F32 => "f32",
        WeightFormat::Bf16 => "bf16",
        WeightFormat::F16 => "f16",
        WeightFormat::Quantized(q) => q.name(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn open(dir: &str) -> ModelDir {
        ModelDir::open(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(dir)).unwrap()
    }

    #[test]
    fn quantized_matrices_take_the_f16_mode_where_the_tensor_cores_read_them() {
        let plain = open("models/tiny-random");
        let gguf = open("fixtures/gguf-q8_0");
        assert!(!plain.has_quantized_matrices() && gguf.has_quantized_matrices());
        for tensor_cores in [false, true] {
            let f16_if = |fallback| if tensor_cores { WeightFormat::F16 } else { fallback };
            let auto = choose(&plain, WeightsArg::Auto, tensor_cores).format;
            assert_ne!(auto, WeightFormat::F16, "an unquantized checkpoint keeps an exact format");
            assert_eq!(choose(&plain, WeightsArg::Q8_0, tensor_cores), WeightChoice { format: f16_if(auto), scheme: Some(Scheme::Q8_0) });
            assert_eq!(choose(&plain, WeightsArg::Q4KM, tensor_cores), WeightChoice { format: f16_if(auto), scheme: Some(Scheme::Q4KM) });
            let gguf_auto = choose(&gguf, WeightsArg::Auto, tensor_cores);
            assert_eq!(gguf_auto.scheme, None);
            assert_eq!(gguf_auto.format == WeightFormat::F16, tensor_cores);
            assert_eq!(choose(&gguf, WeightsArg::Bf16, tensor_cores).format, WeightFormat::Bf16);
        }
    }
}

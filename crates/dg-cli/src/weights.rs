//! The GPU's weight storage, unless `--weights` says which: the fastest mode that meets dg's
//! accuracy bar on the adapter. `--weights q8_0|q4_k_m` also quantizes the checkpoint's matrices
//! at load ([`dg_model::Scheme`]).
//!
//! **The accuracy bar**: logits within 3e-3 normwise of the f32 forward on the same weights, and
//! every layer within 1e-3 (`F16_ACTIVATION_TOLERANCES` of dg-parity, held on every committed
//! fixture, `f16-overflow`'s activations past 65504 included, by `tests/half_weights.rs`); for scale,
//! transformers' own bf16 forward lands 8e-2 from its f32 one. Exact formats (f32, a BF16
//! checkpoint in BF16, a quantized GGUF's blocks) meet it trivially.
//!
//! - On an adapter with tensor cores (cooperative matrices): the F16 mode, whatever the checkpoint
//!   (every matrix but the embedding F16, a quantized GGUF's in its blocks; products, experts,
//!   head and attention on the tensor cores with f16 operands, the down projections' inputs scaled
//!   by rows into f16's range): 1.2e-3 normwise from the f32 forward on `tensor-core-shapes`, and
//!   4.4× faster a layer than BF16 on an H200 (5× the portable kernels on quantized blocks).
//! - Elsewhere, the checkpoint as stored: BF16 for BF16 (2 bytes a parameter, exact), f32
//!   otherwise, a quantized GGUF's blocks; the portable kernels compute in f32 and F16 storage
//!   would be no faster than BF16 there, only less exact.

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
    let stored = if model.unquantized_matrices_are_bf16() { WeightFormat::Bf16 } else { WeightFormat::F32 };
    // The fastest mode within the bar: the F16 mode where the tensor cores run it.
    let auto = if tensor_cores { WeightFormat::F16 } else { stored };
    let (format, scheme) = match arg {
        WeightsArg::F32 => (WeightFormat::F32, None),
        WeightsArg::Bf16 => (WeightFormat::Bf16, None),
        WeightsArg::F16 => (WeightFormat::F16, None),
        WeightsArg::Auto => (auto, None),
        WeightsArg::Q8_0 => (auto, Some(Scheme::Q8_0)),
        WeightsArg::Q4KM => (auto, Some(Scheme::Q4KM)),
    };
    WeightChoice { format, scheme }
}

/// The scheme `arg` names.
pub fn scheme(arg: SchemeArg) -> Scheme {
    match arg {
        SchemeArg::Q4KM => Scheme::Q4KM,
        SchemeArg::Q8_0 => Scheme::Q8_0,
        SchemeArg::Q2K => Scheme::Q2K,
        SchemeArg::Q3KM => Scheme::Q3KM,
        SchemeArg::IQ4XS => Scheme::IQ4XS,
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
    fn auto_takes_the_f16_mode_where_the_tensor_cores_run_it_and_the_stored_format_elsewhere() {
        let plain = open("models/tiny-random");
        let f32_fixture = open("fixtures/tensor-core-shapes");
        let gguf = open("fixtures/gguf-q8_0");
        assert!(!plain.has_quantized_matrices() && gguf.has_quantized_matrices());
        assert!(plain.unquantized_matrices_are_bf16() && !f32_fixture.unquantized_matrices_are_bf16());
        for (model, stored) in [(&plain, WeightFormat::Bf16), (&f32_fixture, WeightFormat::F32), (&gguf, WeightFormat::F32)] {
            for tensor_cores in [false, true] {
                let want = if tensor_cores { WeightFormat::F16 } else { stored };
                assert_eq!(choose(model, WeightsArg::Auto, tensor_cores), WeightChoice { format: want, scheme: None });
                assert_eq!(choose(model, WeightsArg::Q8_0, tensor_cores), WeightChoice { format: want, scheme: Some(Scheme::Q8_0) });
                assert_eq!(choose(model, WeightsArg::Q4KM, tensor_cores), WeightChoice { format: want, scheme: Some(Scheme::Q4KM) });
                // An explicit format is taken as asked.
                for (arg, format) in
                    [(WeightsArg::F32, WeightFormat::F32), (WeightsArg::Bf16, WeightFormat::Bf16), (WeightsArg::F16, WeightFormat::F16)]
                {
                    assert_eq!(choose(model, arg, tensor_cores), WeightChoice { format, scheme: None });
                }
            }
        }
    }
}

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
//!
//! **The vision tower on the GPU** ([`tower_format`]) follows the text model where `--weights`
//! names a format (`f32`, `bf16`, `f16`) and where the tensor cores run the F16 mode (auto, or a
//! scheme: the tower's products then run on the tensor cores as the text model's, held to the same
//! bar by dg-parity's `vision_tower.rs`); elsewhere it keeps its own checkpoint's storage, as the
//! text model does: BF16 where the tower's matrices are BF16, f32 otherwise (an f32 `--mmproj`
//! beside a BF16 model stays f32). A quantization scheme quantizes the text model only; a
//! projector file's quantized matrices stay in their blocks.

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

/// The format of the vision tower's matrices on the GPU for `arg` on an adapter with
/// (`tensor_cores`) or without cooperative matrices (the rule in the module's overview).
pub fn tower_format(model: &ModelDir, arg: WeightsArg, tensor_cores: bool) -> WeightFormat {
    match arg {
        WeightsArg::F32 | WeightsArg::Bf16 | WeightsArg::F16 => choose(model, arg, tensor_cores).format,
        WeightsArg::Auto | WeightsArg::Q8_0 | WeightsArg::Q4KM if tensor_cores => WeightFormat::F16,
        WeightsArg::Auto | WeightsArg::Q8_0 | WeightsArg::Q4KM => match tower_matrices_are_bf16(model) {
            true => WeightFormat::Bf16,
            false => WeightFormat::F32,
        },
    }
}

/// Whether every matrix of the model's vision tower is stored as BF16 (or in quantized blocks,
/// which keep their own format); false without a tower.
fn tower_matrices_are_bf16(model: &ModelDir) -> bool {
    let Some(vision) = &model.config.vision else { return false };
    let src = model.vision_source();
    dg_model::vision_manifest(vision, model.config.text.hidden_size)
        .iter()
        .filter(|(_, shape)| shape.len() >= 2)
        .all(|(name, shape)| src.stored(name, shape).is_ok_and(|t| t.dtype == dg_model::StoredDtype::BF16 || t.dtype.is_quantized()))
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

    /// The tower follows an explicit format and the F16 mode; elsewhere its own storage: a BF16
    /// tower stays BF16 (under a scheme too), an f32 one f32.
    #[test]
    fn the_tower_takes_the_f16_mode_an_asked_format_or_its_own_storage() {
        let (bf16, f32) = (open("fixtures/vision-generate"), open("fixtures/vision-encoder"));
        for (model, stored) in [(&bf16, WeightFormat::Bf16), (&f32, WeightFormat::F32)] {
            for arg in [WeightsArg::Auto, WeightsArg::Q8_0, WeightsArg::Q4KM] {
                assert_eq!(tower_format(model, arg, false), stored, "{arg:?}");
                assert_eq!(tower_format(model, arg, true), WeightFormat::F16, "{arg:?}");
            }
            for (arg, format) in
                [(WeightsArg::F32, WeightFormat::F32), (WeightsArg::Bf16, WeightFormat::Bf16), (WeightsArg::F16, WeightFormat::F16)]
            {
                for tensor_cores in [false, true] {
                    assert_eq!(tower_format(model, arg, tensor_cores), format);
                }
            }
        }
        // A model without a tower has no BF16 tower.
        assert!(!tower_matrices_are_bf16(&open("models/tiny-random")));
    }
}

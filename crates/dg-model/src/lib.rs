//! dg-model: DiffusionGemma checkpoints as data.
//!
//! Parses `config.json` and `generation_config.json` (HF `configuration_diffusion_gemma.py`,
//! `generation_diffusion_gemma.py`), loads safetensors checkpoints (single file or shards,
//! F32/F16/BF16, memory-mapped) with HF's tensor names and tying rules, reads and writes GGUF
//! files as llama.cpp names DiffusionGemma's tensors (`gguf`) and ggml's quantized blocks (every
//! type gguf-py dequantizes but TQ1_0 and TQ2_0: [`dequantize_bytes`]; [`quantize`] and the schemes
//! of [`Scheme`] write the types of [`QUANTIZABLE`]),
//! and builds seeded random weights for any config; reads the Gemma 4 vision tower's config and
//! weights (`vision`). No model math, no GPU.

mod config;
mod error;
mod generation;
pub mod gguf;
mod json;
mod model_dir;
mod names;
mod quant;
mod random;
mod stored;
mod tensors;
mod vision;
mod weights;

pub use config::{IdOrList, LayerKind, LayerSpec, ModelConfig, RopeSpec, TextConfig};
pub use error::{ModelError, Result};
pub use generation::{GenerationConfig, RawGenerationConfig, RawSamplerConfig, StoppingConfig};
pub use model_dir::{ModelDir, is_gguf};
pub use names::{LayerNames, Named, SharedNames, tensor_manifest};
pub use quant::{QUANTIZABLE, QuantError, Quantized, Scheme, dequantize_bytes, quantize, quantize_tensor};
pub use random::RandomWeights;
pub use stored::{StoredDtype, StoredTensor};
pub use tensors::{Checkpoint, SafetensorsFile, Tensor};
pub use vision::{VisionConfig, VisionLayerWeights, VisionWeights, vision_manifest};
pub use weights::{ExpertWeights, LayerWeights, Matrix, SelfConditioningWeights, TensorSource, Weights};

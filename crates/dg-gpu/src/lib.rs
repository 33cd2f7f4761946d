//! dg-gpu: DiffusionGemma's canvas forward on any GPU wgpu reaches (Vulkan, Metal, DX12).
//!
//! [`context`] opens the device and counts every created object; [`plan`] compiles kernels and
//! records replayable dispatch lists; [`planner`] decides how each matrix product runs; [`weights`]
//! uploads the model once; [`arena`] allocates the activations and the KV cache once; [`ops`] and
//! [`forward`] record the encoder and the canvas forward; [`tuning`] carries the knobs that
//! override their choices; [`model`] is the API (the sampler's `DenoiseModel` and `ResidentModel`).

pub mod arena;
pub mod context;
pub mod error;
pub mod forward;
pub mod model;
pub mod ops;
pub mod overrides;
pub mod pack;
pub mod parts;
pub mod plan;
pub mod planner;
pub mod shapes;
mod staging;
pub mod tuning;
pub mod weights;

pub use arena::{arena_bytes, cache_format_for, canvas_vocab_bytes, canvases_per_binding, sequence_cache_bytes, tensor_core_cache_format};
pub use context::{Counters, Created, GpuContext, GpuOptions, list_adapters};
pub use dg_kernels::WeightFormat;
pub use error::GpuError;
pub use forward::Visible;
pub use model::{CacheSnapshot, EncoderProfile, GpuModel, Instrumentation, LayerContext, ModelOptions};
pub use overrides::Overrides;
pub use plan::{Pipeline, Pipelines, Plan, PlanBuilder, groups_1d};
pub use tuning::{KvCacheChoice, Tuning, TuningError};
pub use weights::{GpuMatrix, MatrixLayout, UploadProgress};

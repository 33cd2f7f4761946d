//! dg-gpu: DiffusionGemma's canvas forward on any GPU wgpu reaches (Vulkan, Metal, DX12).
//!
//! The API is [`GpuModel`] (the sampler's `DenoiseModel`, `ResidentModel` and
//! `BatchResidentModel`) with [`ModelOptions`], [`GpuContext`] and [`GpuOptions`]; benchmarks and
//! parity reach further through [`Instrumentation`]. Inside: `context` opens the device and counts
//! every created object; `plan` compiles kernels and records replayable dispatch lists; `weights`
//! uploads the model once; `arena` allocates the activations and the KV cache once; `forward`
//! records the encoder and the canvas forward. Public for the kernel tests, the golden plans and
//! the lab: [`ops`] (one kernel recorded at a time), [`planner`] (how each matrix product runs, a
//! leaf over [`shapes`]), [`parts`] and [`pack`] (how a matrix is split and laid out on the
//! device), [`tuning`] and [`overrides`] (the product's variables, and the lab's choices).

mod arena;
mod context;
mod error;
mod forward;
mod model;
pub mod ops;
pub mod overrides;
pub mod pack;
pub mod parts;
mod plan;
pub mod planner;
pub mod shapes;
mod staging;
pub mod tuning;
mod vision;
mod weights;

pub use arena::{
    arena_bytes, cache_format, cache_format_for, canvas_vocab_bytes, canvases_per_binding, sequence_cache_bytes, tensor_core_cache_format,
};
pub use context::{Counters, Created, GpuContext, GpuOptions, list_adapters};
pub use dg_kernels::WeightFormat;
pub use error::GpuError;
pub use forward::Visible;
pub use model::{CacheSnapshot, EncoderProfile, GpuModel, Instrumentation, LayerContext, ModelOptions, READ_WIDTHS, SlotReader, WarmUp};
pub use overrides::Overrides;
pub use plan::{Pipeline, Pipelines, Plan, PlanBuilder, groups_1d};
pub use tuning::{KvCacheChoice, Tuning, TuningError};
pub use vision::GpuVisionTower;
pub use weights::{GpuMatrix, GpuWeights, MatrixLayout, UploadProgress, embedding_format, matrix_format};

//! dg-gpu: DiffusionGemma's canvas forward on any GPU wgpu reaches (Vulkan, Metal, DX12).
//!
//! [`context`] opens the device and counts every created object; [`plan`] compiles kernels and
//! records replayable dispatch lists; [`weights`] uploads the model once; [`arena`] allocates the
//! activations once; [`ops`] and [`forward`] record the canvas forward; [`model`] is the API;
//! [`hybrid`] pairs it with the CPU encoder for the sampler.

pub mod arena;
pub mod context;
pub mod error;
pub mod forward;
pub mod hybrid;
pub mod model;
pub mod ops;
pub mod plan;
pub mod testing;
pub mod weights;

pub use context::{Counters, Created, GpuContext, GpuOptions, list_adapters};
pub use error::GpuError;
pub use hybrid::{HybridError, HybridModel};
pub use model::{GpuModel, LayerContext};
pub use plan::{Pipeline, Pipelines, Plan, PlanBuilder, groups_1d};

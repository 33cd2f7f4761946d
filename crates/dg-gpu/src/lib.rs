//! dg-gpu: DiffusionGemma's forward on any GPU wgpu reaches (Vulkan, Metal, DX12).
//!
//! [`context`] opens the device and counts every created object; [`plan`] compiles kernels and
//! records replayable dispatch lists.

pub mod context;
pub mod error;
pub mod plan;
pub mod testing;

pub use context::{Created, GpuContext, GpuOptions, list_adapters};
pub use error::GpuError;
pub use plan::{Pipeline, Pipelines, Plan, PlanBuilder, groups_1d};

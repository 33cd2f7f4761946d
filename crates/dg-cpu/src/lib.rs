//! dg-cpu: the f32 CPU reference of DiffusionGemma.
//!
//! Mirrors `modeling_diffusion_gemma.py` module by module: RMSNorm and activations ([`ops`]),
//! RoPE ([`rope`]), attention ([`attention`]), router and experts ([`moe`]), the shared layer
//! ([`layer`]), the KV cache ([`cache`]) and the encoder/decoder model ([`model`]); the Gemma 4 vision tower
//! and its projection ([`vision`], `modeling_gemma4.py`); the experts' int8-activation mode
//! ([`int8`]). Every GPU
//! kernel is checked against these functions.

pub mod attention;
pub mod cache;
pub mod int8;
pub mod layer;
pub mod linalg;
pub mod moe;
pub mod ops;
pub mod rope;
pub mod vision;

mod model;
mod read;

pub use model::{CpuError, CpuModel};

//! dg-parity: the cross-checks that prove dg right.
//!
//! Model level: logits against HF transformers reference dumps ([`checks`], [`reference`](mod@reference));
//! generate level: exact token replay with the recorded draws, and, for paths whose logits differ
//! within their tolerance, where two generations part and whether that error explains it
//! ([`divergence`]). Metrics and the argmax rule live in [`compare`]. Backends plug in through
//! [`checks::Backend`].
//!
//! Kernel level: the GPU kernels against dg-cpu's ops and exact products (`tests/kernels_*.rs`,
//! `tests/tensor_cores.rs`, `tests/coop_gemm.rs`), on the test support of [`testing`]. Timing
//! experiments live in dg-lab, not here: this crate holds cross-checks only.

pub mod checks;
pub mod compare;
pub mod cpu;
pub mod divergence;
pub mod gpu;
pub mod reference;
pub mod replay;
pub mod testing;

use std::path::PathBuf;

/// A backend's own error, boxed.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why a check could not run (as opposed to running and failing).
#[derive(Debug, thiserror::Error)]
pub enum ParityError {
    #[error(transparent)]
    Model(#[from] dg_model::ModelError),
    #[error("{path}: {message}")]
    Reference { path: PathBuf, message: String },
    #[error("backend error: {0}")]
    Backend(String),
}

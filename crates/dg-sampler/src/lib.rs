//! dg-sampler: the block-diffusion sampler of DiffusionGemma, replay-exact with the reference.
//!
//! Mirrors `generation_diffusion_gemma.py` of HF transformers: `DiffusionGemmaGenerationMixin.generate`
//! and `_denoising_step` ([`generate`], [`Sampler`]), `LinearTemperatureScheduleLogitsProcessor` and the
//! softmax/entropy/argmax of a step ([`rows`]), `EntropyBoundSampler` ([`accept`]),
//! `StableAndConfidentStoppingCriteria` ([`stopping`]) and `_finalize_canvas` ([`finalize`]).
//!
//! The model is behind [`DenoiseModel`] (encode into the KV cache; one canvas forward) or
//! [`ResidentModel`] (the forward and the per-row work of a step run where the logits live) and randomness
//! behind [`RandomSource`]: [`SeededRng`] for users, [`Replay`] for draws recorded from a reference run.
//! [`Batch`] drives several sequences together, each canvas forward of a step in one call of a
//! [`BatchDenoiseModel`] or [`BatchResidentModel`] ([`PerSlot`] makes any [`SwapCache`] model one);
//! each sequence gives the tokens it gives alone.
//! Given the same draws and the same logits, the output tokens equal the reference's: the draw order,
//! temperature (`raw / T` in f32), argmax, acceptance arithmetic, renoising, stopping and EOS handling
//! are the reference's. Entropies use their own `exp` and f64 accumulation: they are closer to the exact
//! value than PyTorch's f32 reduction (which is off by about 1e−4 relative on very peaked rows) and so
//! not bit-identical to it, and an acceptance or stopping decision within rounding of its threshold can
//! differ (spec §7.4).
//!
//! [`ImagePrompt`] runs a prompt holding images on a model that places image rows
//! ([`EncodeWithImages`]).
//!
//! [`read()`] reads a seeded canvas (typed answers at slot rows, vLLM's structured mode) on a
//! [`ReadModel`], reusing the sampler's step for multi-step reads.
//!
//! Choices where the reference leaves the result to PyTorch internals:
//! - entropy ties in acceptance are ordered by position (a stable sort);
//! - the acceptance cumsum accumulates in f64 and rounds each prefix to f32 (PyTorch's CPU kernel);
//! - row reductions use a fixed order, so results do not depend on the number of threads or on the
//!   CPU's vector width.

pub mod accept;
mod batch;
mod batched;
mod error;
pub mod finalize;
mod generate;
mod images;
mod python_random;
pub mod read;
mod replay;
mod resident;
mod rng;
pub mod rows;
mod sampler;
mod sequence;
pub mod stopping;

pub use batch::{AdmitError, Batch, Rejected, StepReport};
pub use batched::{BatchDenoiseModel, BatchResidentModel, HostCanvas, HostCanvases, PerSlot, ResidentCanvas, ResidentCanvases, SwapCache};
pub use error::{DrawError, InputError, ModelCall, SamplerError};
pub use finalize::CanvasEnd;
pub use generate::{DenoiseModel, Generation, Hooks, NoHooks, StepInfo, StopReason, generate, generate_resident, validate_config};
pub use images::{EncodeWithImages, ImagePrompt};
pub use python_random::PythonRandom;
pub use read::{BatchReadModel, Conditioning, Read, ReadCanvas, ReadModel, ReadRequest, Slot, SlotRead, read, read_batch, validate_read};
pub use replay::Replay;
pub use resident::{HostRows, HostRowsError, ResidentModel, RowResult};
pub use rng::{CategoricalRequest, DrawKind, RandomSource, SeededRng};
pub use rows::{RowDistributions, RowStat};
pub use sampler::{Sampler, StepOutcome};
pub use sequence::{Finished, SeqId};
pub use stopping::StopDecision;

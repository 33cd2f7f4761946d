//! Errors of the sampler: bad inputs, bad random draws, and failures of the model behind it.
//!
//! The reference (`DiffusionGemmaGenerationMixin.generate`) validates its configuration in
//! `DiffusionGemmaGenerationConfig.validate`; the checks here cover the same ground for a config built
//! in code, plus the shape and finiteness checks that PyTorch would otherwise do implicitly.

use crate::rng::DrawKind;

/// A problem with the inputs of a generation, independent of the model and the random source.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum InputError {
    #[error("the prompt is empty: generation needs at least one prompt token")]
    EmptyPrompt,
    #[error("{what} token id {id} at position {position} is outside the vocabulary (vocab_size {vocab_size})")]
    TokenOutOfRange { what: &'static str, position: usize, id: u32, vocab_size: usize },
    #[error("logits have {got} values, expected {expected} ({rows} rows × vocab_size {vocab_size})")]
    LogitsLength { got: usize, expected: usize, rows: usize, vocab_size: usize },
    #[error(
        "non-finite logit at block {block}, step {step}, row {row}, column {column}: \
         {value} after dividing by the temperature {temperature}"
    )]
    NonFiniteLogit { block: usize, step: usize, row: usize, column: usize, value: f32, temperature: f32 },
    #[error("invalid sampler shape: {0}")]
    Shape(String),
    #[error("invalid generation config: {0}")]
    Config(String),
}

/// A random source could not provide the draw the sampler asked for.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DrawError {
    #[error("draw {index}: expected a {expected} draw but the recording has no draws left ({index} consumed)")]
    Exhausted { index: usize, expected: DrawKind },
    #[error("draw {index}: expected a {expected} draw but the recorded draw is {recorded}")]
    KindMismatch { index: usize, expected: DrawKind, recorded: DrawKind },
    #[error("draw {index} ({kind}): expected {expected} ids but the recorded draw has {recorded}")]
    LengthMismatch { index: usize, kind: DrawKind, expected: usize, recorded: usize },
    #[error("draw {index} ({kind}): id {id} at position {position} is outside the vocabulary (vocab_size {vocab_size})")]
    IdOutOfRange { index: usize, kind: DrawKind, position: usize, id: u32, vocab_size: usize },
    #[error("categorical draw: {got} output ids for {expected} distributions")]
    RowCount { expected: usize, got: usize },
    #[error("{left} recorded draws were left unconsumed (consumed {consumed}; the next one is {next})")]
    Unconsumed { consumed: usize, left: usize, next: DrawKind },
}

/// What the sampler was asking the model to do when it failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelCall {
    /// `DenoiseModel::encode` of the prompt (block 0) or of the previous block's canvas.
    Encode,
    /// `DenoiseModel::canvas_forward` at the given 0-based step of the block.
    CanvasForward { step: usize },
}

impl std::fmt::Display for ModelCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ModelCall::Encode => write!(f, "encode"),
            ModelCall::CanvasForward { step } => write!(f, "canvas forward (step {step})"),
        }
    }
}

/// Any failure of `generate`; `E` is the model's own error type (`Infallible` for model-free calls).
#[derive(Debug, thiserror::Error)]
pub enum SamplerError<E: std::error::Error + 'static = std::convert::Infallible> {
    #[error(transparent)]
    Input(#[from] InputError),
    #[error(transparent)]
    Draw(#[from] DrawError),
    #[error("model {call} failed at block {block}")]
    Model {
        block: usize,
        call: ModelCall,
        #[source]
        source: E,
    },
    #[error(
        "the batched canvas forward (step {step}) failed at block {block}; the model's error is reported for another sequence of the batch"
    )]
    BatchForward { block: usize, step: usize },
}

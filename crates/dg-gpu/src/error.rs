//! Errors of the GPU backend; each says what to do about it.

/// Everything that can go wrong on the GPU side.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error(
        "no GPU adapter found{detail}. On Linux without a GPU install the Vulkan software driver \
         (lavapipe): `apt-get install -y mesa-vulkan-drivers libvulkan1`"
    )]
    NoAdapter { detail: String },
    #[error("no adapter matches {wanted:?}; available: {available}")]
    AdapterNotFound { wanted: String, available: String },
    #[error("requesting a device from {adapter}: {message}")]
    Device { adapter: String, message: String },
    #[error("{what} needs {needed} bytes, over the adapter's limit {limit} ({limit_name})")]
    Limit { what: String, needed: u64, limit: u64, limit_name: &'static str },
    #[error("out of GPU memory while {context}: {message}")]
    OutOfMemory { context: String, message: String },
    #[error("GPU validation error while {context}: {message}")]
    Validation { context: String, message: String },
    #[error("reading back from the GPU: {0}")]
    Readback(String),
    #[error("token id {id} at position {index} of the {what} is out of range (vocab_size {vocab})")]
    TokenOutOfRange { what: &'static str, id: u32, index: usize, vocab: usize },
    #[error("sequence of {len} tokens exceeds {limit_name} {max}{hint}")]
    TooLong { len: usize, max: usize, limit_name: &'static str, hint: &'static str },
    #[error("{what}: got {got} values, expected {expected}")]
    Length { what: &'static str, got: usize, expected: usize },
    #[error("nothing to encode: empty token list")]
    Empty,
    #[error(
        "tensor {tensor} holds a value beyond ±{max}, the largest {format}, which would become ±inf stored as {format}: \
         store the matrices as BF16 or f32 (--weights bf16 or --weights f32)"
    )]
    OutOfRange { tensor: String, format: &'static str, max: f32 },
    #[error("unsupported on this device or shape: {what}")]
    Unsupported { what: String },
    #[error(transparent)]
    Model(#[from] dg_model::ModelError),
    #[error("no context: encode a prompt (or set a context) before the first canvas forward")]
    NoContext,
}

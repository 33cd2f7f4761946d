//! The command line: `dg generate`, `dg info`, `dg quantize` and `dg serve`, with their options
//! (the sampler settings shared by generate and serve in [`SamplerArgs`]).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// The soft-token budget of an image when none is given (transformers' `image_seq_length`).
pub const DEFAULT_IMAGE_TOKENS: usize = 280;

const ABOUT: &str = "DiffusionGemma block-diffusion inference on the CPU or any GPU (Vulkan, Metal, DX12)";

const AFTER_HELP: &str = "\
Without --model, dg uses the small bundled model in models/tiny-random of the dg repository. Its \
weights are random: it shows that the whole path works (tokenizer, chat template, sampler, \
backends), and its text is noise.

Exit status: 0 on success, 2 for usage and input errors (bad arguments, missing or incomplete \
model directory, no tokenizer without --prompt-ids, token id outside the vocabulary, prompt too \
long, unknown --adapter), 1 for runtime failures (no GPU adapter for --backend gpu, device or \
model failures).";

#[derive(Debug, Parser)]
#[command(name = "dg", version, about = ABOUT, after_help = AFTER_HELP)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Generate text from a prompt (text, a file, stdin, or token ids).
    #[command(after_help = AFTER_HELP)]
    Generate(Box<GenerateArgs>),
    /// Describe a model (geometry, parameters, memory) and the GPU adapters wgpu finds.
    #[command(after_help = AFTER_HELP)]
    Info(InfoArgs),
    /// Quantize a model into a GGUF file (ggml blocks as the scheme says, llama.cpp's names).
    Quantize(QuantizeArgs),
    /// Serve the model over an OpenAI-compatible HTTP API (chat and text completions, streaming).
    #[command(after_help = AFTER_HELP)]
    Serve(Box<ServeArgs>),
    /// Answer typed questions about a state in one read (the answers of `dg serve`'s /v1/systemone).
    Read(ReadArgs),
}

#[derive(Debug, Args)]
pub struct ReadArgs {
    /// Model directory or GGUF file (default: the bundled model).
    #[arg(long, value_name = "DIR|FILE.gguf")]
    pub model: Option<PathBuf>,

    /// The state: a JSON file (object, array or string) or a text file; `-` reads stdin.
    #[arg(long, value_name = "FILE", requires = "questions")]
    pub state: Option<PathBuf>,

    /// The questions: a JSON object of `noul`, `choice` and `score` questions by id, as
    /// /v1/systemone takes them. Without --state and --questions, stdin holds a whole
    /// /v1/systemone request body (`state`, `questions`, and `steps`, `samples`, `images`,
    /// `think`, `sequential`).
    #[arg(long, value_name = "FILE", requires = "state")]
    pub questions: Option<PathBuf>,

    /// Denoising steps before the read (1 to 8; the template rows stay pinned).
    #[arg(long, value_name = "N")]
    pub steps: Option<u32>,

    /// Reads to average, each on its own noise (1 to 32; default: one, and three more when unsure).
    #[arg(long, value_name = "N")]
    pub samples: Option<u32>,

    #[command(flatten)]
    pub device: DeviceArgs,
}

/// How the GPU stores the weight matrices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum WeightsArg {
    /// BF16 when the checkpoint's matrices are BF16 (exact, 2 bytes per parameter), else f32.
    Auto,
    /// f32 (4 bytes per parameter).
    F32,
    /// BF16 (2 bytes per parameter; an f32 checkpoint is rounded to nearest even).
    Bf16,
    /// F16 (2 bytes per parameter, rounded to nearest even); on GPUs with cooperative matrices the
    /// projections then run on the tensor cores with f16 activations (less exact, faster).
    F16,
    /// Quantized at load as `dg quantize --scheme q8_0` would (every matrix but the embedding,
    /// router and self-conditioning MLP in ggml's Q8_0, about 1.06 bytes per parameter); the GPU
    /// keeps the blocks, the CPU computes on their dequantized values.
    #[value(name = "q8_0")]
    Q8_0,
    /// Quantized at load as `dg quantize --scheme q4_k_m` would (routed experts Q4_K/Q5_0/Q8_0 as
    /// llama.cpp's Q4_K_M, attention and dense MLP Q8_0).
    #[value(name = "q4_k_m")]
    Q4KM,
}

/// Which implementation runs the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BackendArg {
    /// The GPU when wgpu finds an adapter, else the CPU.
    Auto,
    /// Encoder, canvas forward and the sampler's per-row work on the GPU (wgpu).
    Gpu,
    /// The f32 CPU reference.
    Cpu,
}

#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// HF model directory (config.json, generation_config.json, model.safetensors, tokenizer.json,
    /// chat template), or a .gguf file (its own tokenizer and chat template, unless a tokenizer.json or template lies beside it). Default:
    /// the bundled random model (its text is noise).
    #[arg(long, value_name = "DIR|FILE.gguf")]
    pub model: Option<PathBuf>,

    /// The vision tower's own file, for a model whose checkpoint has none (a GGUF from llama.cpp's
    /// converter): llama.cpp's projector GGUF for Gemma 4 vision (`mmproj-*.gguf`, projector type
    /// gemma4v; docs/vision.md says which files open).
    #[arg(long, value_name = "FILE.gguf")]
    pub mmproj: Option<PathBuf>,

    /// The prompt text.
    #[arg(long, conflicts_with_all = ["prompt_file", "prompt_ids"])]
    pub prompt: Option<String>,

    /// Read the prompt text from a file ("-" for stdin).
    #[arg(long, value_name = "FILE", conflicts_with = "prompt_ids")]
    pub prompt_file: Option<PathBuf>,

    /// The prompt as token ids, comma or space separated (for directories without a tokenizer).
    #[arg(long, value_name = "IDS")]
    pub prompt_ids: Option<String>,

    /// Generate for every line of FILE: one prompt per line, handled as --prompt is (--chat
    /// included); empty lines are an error. Prints one JSON object per line on stdout, in input
    /// order (the fields of --json, without timings, plus "line", the 1-based line number, and
    /// "prompt", the line). Line i uses the seed --seed + i - 1, so `dg generate --prompt LINE
    /// --seed S --json` alone gives the same object. The prompts run as one batch (--batch): on
    /// the GPU one forward a step for all its canvases, on the CPU the canvases in turn.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["prompt", "prompt_file", "prompt_ids"])]
    pub prompts_file: Option<PathBuf>,

    /// With --prompts-file: the most sequences generating at once (each with its own KV cache and
    /// sampler buffers of 2 × canvas × vocabulary f32 logits); a sequence that ends frees its
    /// place for the next line. Default 8.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub batch: Option<u32>,

    /// Wrap the prompt as a user message in the model's chat template.
    #[arg(long, conflicts_with = "prompt_ids")]
    pub chat: bool,

    /// An image (PNG, JPEG or WebP) in the prompt; repeat for several, in order. With --chat the
    /// user turn holds the images, then the text, as transformers' processor places them; without,
    /// the prompt text holds the model's image token once per image. Needs a model with a vision
    /// tower (or --mmproj); the tower runs on the model's backend (on the GPU its matrices in
    /// --weights' format, or its own storage under auto without tensor cores).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["prompt_ids", "prompts_file"])]
    pub image: Vec<PathBuf>,

    /// Soft tokens per image (the processor's budget: 70, 140, 280, 560 or 1120).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_IMAGE_TOKENS, requires = "image")]
    pub image_tokens: usize,

    #[command(flatten)]
    pub sampler: SamplerArgs,

    #[command(flatten)]
    pub device: DeviceArgs,

    /// Print one JSON object on stdout: prompt_ids, output_ids (every generated canvas, whole; pad
    /// after an EOS), text (the output up to its first EOS; null without a tokenizer), stop_reason,
    /// steps_per_canvas, canvases (accepted and mean entropy per step), tokens_per_forward,
    /// generation settings and timings.
    #[arg(long)]
    pub json: bool,

    /// No progress or summary on stderr.
    #[arg(long, short)]
    pub quiet: bool,
}

/// A quantization scheme (`dg_model::Scheme`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SchemeArg {
    /// Routed experts' gate/up Q4_K, their down projection Q6_K in llama.cpp's `use_more_bits`
    /// layers and Q4_K elsewhere (Q8_0 / Q5_0 where K is not a multiple of 256), attention and
    /// dense MLP Q8_0; embedding, router, self-conditioning MLP, norms and scalars kept.
    #[value(name = "q4_k_m")]
    Q4KM,
    /// Every matrix but the embedding, router and self-conditioning MLP in Q8_0.
    #[value(name = "q8_0")]
    Q8_0,
    /// For small GPUs: llama.cpp's Q2_K for the routed experts (gate/up Q2_K, down Q3_K; Q4_0 where
    /// K is not a multiple of 256), the rest as q4_k_m.
    #[value(name = "q2_k")]
    Q2K,
    /// For small GPUs: llama.cpp's Q3_K_M for the routed experts (gate/up Q3_K, down Q5_K in the
    /// first sixteenth of the layers and Q4_K after; Q5_1 / Q5_0 where K is not a multiple of 256).
    #[value(name = "q3_k_m")]
    Q3KM,
    /// For small GPUs: llama.cpp's IQ4_XS for the routed experts without an importance matrix
    /// (down Q5_K in the first eighth of the layers; IQ4_NL / Q5_1 where K is not a multiple of 256).
    #[value(name = "iq4_xs")]
    IQ4XS,
}

#[derive(Debug, Args)]
pub struct QuantizeArgs {
    /// HF model directory (or a GGUF file). Default: the bundled random model.
    #[arg(long, value_name = "DIR|FILE.gguf")]
    pub model: Option<PathBuf>,

    /// Which tensors become which ggml type.
    #[arg(long, value_enum)]
    pub scheme: SchemeArg,

    /// The GGUF file to write. The model's other files (config, tokenizer, chat template) are
    /// copied beside it where they are not there yet, so `dg generate --model FILE.gguf` runs.
    #[arg(long, value_name = "FILE.gguf")]
    pub out: PathBuf,

    /// No summary on stderr.
    #[arg(long, short)]
    pub quiet: bool,
}

#[derive(Debug, Args)]
pub struct InfoArgs {
    /// HF model directory or .gguf file. Default: the bundled random model.
    #[arg(long, value_name = "DIR|FILE.gguf")]
    pub model: Option<PathBuf>,

    /// The vision tower's own file, for a model whose checkpoint has none (a GGUF from llama.cpp's
    /// converter): llama.cpp's projector GGUF for Gemma 4 vision (`mmproj-*.gguf`, projector type
    /// gemma4v; docs/vision.md says which files open).
    #[arg(long, value_name = "FILE.gguf")]
    pub mmproj: Option<PathBuf>,

    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,

    /// Print instead the GPU memory each quantization scheme needs at the model's geometry (file,
    /// weights on the GPU, one sequence's caches) and which 8, 12, 16 and 24 GiB cards it fits.
    #[arg(long)]
    pub schemes: bool,

    /// With --schemes: the geometry of this config.json instead of a model (e.g.
    /// bench/configs/real-30layer.json; unquantized tensors counted as BF16, as released).
    #[arg(long, value_name = "FILE", requires = "schemes", conflicts_with = "model")]
    pub config: Option<PathBuf>,

    /// With --schemes: the positions of the one sequence whose caches are counted.
    #[arg(long, value_name = "N", requires = "schemes", default_value_t = crate::schemes::DEFAULT_CONTEXT)]
    pub context: usize,
}

/// The `dg serve` options.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// HF model directory or .gguf file. Default: the bundled random model (its text is noise).
    #[arg(long, value_name = "DIR|FILE.gguf")]
    pub model: Option<PathBuf>,

    /// The vision tower's own file, for a model whose checkpoint has none (a GGUF from llama.cpp's
    /// converter): llama.cpp's projector GGUF for Gemma 4 vision (`mmproj-*.gguf`, projector type
    /// gemma4v; docs/vision.md says which files open).
    #[arg(long, value_name = "FILE.gguf")]
    pub mmproj: Option<PathBuf>,

    /// The name clients give as `model` (default: the directory's name).
    #[arg(long, value_name = "NAME")]
    pub served_model_name: Option<String>,

    /// Address to listen on. Anything but loopback without --api-key prints a warning.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,

    /// Port to listen on (0: any free port; the address is printed on stderr).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,

    /// Require `Authorization: Bearer KEY` on every endpoint but /health.
    #[arg(long, value_name = "KEY")]
    pub api_key: Option<String>,

    /// Generation requests that may wait for the engine; one more is answered 429.
    #[arg(long, value_name = "N", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    pub queue: u32,

    /// Typed reads (`/v1/systemone`, vLLM's read-only requests) that may wait for the reader; one
    /// more is answered 529 (OpenJev's overload answer) with `Retry-After: 1`.
    #[arg(long, value_name = "N", default_value_t = 512, value_parser = clap::value_parser!(u32).range(1..))]
    pub read_queue: u32,

    /// Positions a request may use (prompt plus every canvas). Default: the model's
    /// max_position_embeddings, at most 16384 (the GPU's caches are sized for it, one per --batch
    /// slot).
    #[arg(long, value_name = "N")]
    pub context: Option<usize>,

    /// Requests generating at once (1: one at a time). Each step runs their canvases together (on
    /// the GPU in one forward); a queued request joins at the next step when one ends. Every slot
    /// holds a KV cache of --context positions, kept after its request: a prompt that extends an
    /// earlier conversation continues from its KV cache, in a slot or the pool (see
    /// --cache-budget), whatever N.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub batch: u32,

    /// Bytes of other conversations' KV caches kept besides the slots' own (host memory on the
    /// CPU, device memory on the GPU), least recently used evicted first: digits with an optional
    /// unit B, K, M, G (KiB, MiB, GiB). 0 keeps none.
    #[arg(long, value_name = "BYTES", default_value = "2GiB", value_parser = crate::settings::parse_bytes)]
    pub cache_budget: u64,

    #[command(flatten)]
    pub device: DeviceArgs,

    /// Defaults of a request that sets none of them (its `max_tokens`, `seed` and `dg` object win).
    #[command(flatten)]
    pub sampler: SamplerArgs,

    /// Largest request body, in bytes (larger: 413).
    #[arg(long, value_name = "BYTES", default_value_t = 4 << 20)]
    pub max_body: usize,

    /// Seconds a connection may take to send a request's headers, or its body (then it is dropped,
    /// or answered 408).
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    pub request_timeout: f64,

    /// Seconds in-flight requests get to finish after SIGTERM/SIGINT before they are cancelled.
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    pub shutdown_timeout: f64,

    /// Times a chat reply that comes back empty (the model's end of turn at the first position of
    /// the first canvas, frequent with thinking off) is generated again, with the next seed. 0:
    /// never. See docs/serving.md: unmeasured on real weights.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub empty_reply_retries: usize,

    /// Soft tokens per image of chat requests' image parts (the processor's budget: 70, 140, 280,
    /// 560 or 1120).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_IMAGE_TOKENS)]
    pub image_tokens: usize,

    /// For tests only: accept `dg.test_output` (the reply's text, committed in place of the
    /// model's canvases through the same decoding and parsing).
    #[arg(long, hide = true)]
    pub test_hooks: bool,
}

/// Where the model runs and how the GPU stores it (`dg generate`, `dg serve` and `dg read` alike).
#[derive(Debug, Clone, Args)]
pub struct DeviceArgs {
    /// Backend: gpu, cpu, or auto (the GPU when an adapter exists, else the CPU).
    #[arg(long, value_enum, default_value_t = BackendArg::Auto)]
    pub backend: BackendArg,

    /// GPU adapter to use: a case-insensitive substring of its name (see `dg info`).
    #[arg(long, value_name = "NAME")]
    pub adapter: Option<String>,

    /// How the GPU stores the weight matrices: auto (the fastest mode within dg's accuracy bar:
    /// f16 where the GPU has tensor cores, else the checkpoint as stored: BF16 if it is BF16, else
    /// f32, a quantized GGUF's blocks), f32, bf16, f16, or quantized at load (q8_0, q4_k_m; on the
    /// CPU, the f32 reference on the dequantized values). Arithmetic is f32, except with f16 on a
    /// GPU with tensor cores (cooperative matrices): projections, experts, head and attention in
    /// f16 operands there, quantized matrices dequantized into them.
    #[arg(long, value_enum, default_value_t = WeightsArg::Auto)]
    pub weights: WeightsArg,
}

/// The sampler settings `generation_config.json` gives, overridden from the command line (for
/// `dg serve`, the defaults of a request that sets none).
#[derive(Debug, Args)]
pub struct SamplerArgs {
    /// New tokens to generate; whole canvases are generated, ceil(N / canvas) of them.
    #[arg(long, value_name = "N")]
    pub max_new_tokens: Option<usize>,

    /// Denoising steps per canvas at most.
    #[arg(long, value_name = "N")]
    pub steps: Option<usize>,

    /// Seed of the sampler's random draws.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,

    /// Acceptance budget per step, in nats.
    #[arg(long, value_name = "NATS")]
    pub entropy_bound: Option<f64>,

    /// Temperature at the last step.
    #[arg(long, value_name = "T")]
    pub t_min: Option<f64>,

    /// Temperature at the first step.
    #[arg(long, value_name = "T")]
    pub t_max: Option<f64>,

    /// Previous argmax canvases that must equal the current one to stop early (0: always stable).
    #[arg(long, value_name = "N")]
    pub stability_threshold: Option<usize>,

    /// Stop a canvas early when its mean entropy (nats) falls below this.
    #[arg(long, value_name = "NATS")]
    pub confidence_threshold: Option<f64>,
}

impl SamplerArgs {
    /// The `generation_config.json` fields these options set.
    pub fn overrides(&self) -> dg_model::RawGenerationConfig {
        dg_model::RawGenerationConfig {
            max_new_tokens: self.max_new_tokens,
            max_denoising_steps: self.steps,
            entropy_bound: self.entropy_bound,
            t_min: self.t_min,
            t_max: self.t_max,
            stability_threshold: self.stability_threshold,
            confidence_threshold: self.confidence_threshold,
            ..Default::default()
        }
    }
}

//! The activation arena: every buffer one forward or encoder chunk needs, allocated once for the
//! largest shapes (a batch of `slots` canvases of C rows, or an encoder chunk of up to
//! [`PREFILL_CHUNK`] tokens, at most `max_context` cached tokens), reused by every step of every
//! block; and one KV cache per slot (a sequence of a batch): every position in full layers, a
//! window's worth in sliding layers ([`Arena::sliding_positions`]).

use dg_kernels::WeightFormat;
use dg_model::{LayerKind, ModelConfig, TextConfig};

use dg_kernels::coop_grouped_gemm::MIN_TILE_ROWS;
use dg_kernels::moe_dispatch::MoeDispatchParams;
use dg_kernels::sample_rows::RESULT_WORDS;

use crate::context::GpuContext;
use crate::error::GpuError;
use crate::tuning::{KvCacheChoice, Tuning};

/// Per-layer cached K/V of the context (what the encoder wrote), `[positions + KEY_PAD + C,
/// kv_heads, head_dim]` ([`Arena::cache_positions`]) in f32 or f16 ([`Arena::cache_format`]).
/// The GPU encoder writes token `p` at row `p` in full layers and at row `p − base` in sliding
/// layers, where `base` is the first position the slot's sliding caches still hold (`GpuModel`'s
/// sliding bases: the decoder reads only their last W−1 positions, so when a chunk would run past
/// the rows, the window is moved to row 0 first); a context uploaded from the host starts at row
/// 0. The decoder writes its canvas's K/V into the rows after the visible ones padded to
/// [`KEY_PAD`] (`forward.rs`), so every buffer has `KEY_PAD + C` rows beyond its positions.
#[derive(Debug)]
pub struct CacheBuffers<B = wgpu::Buffer> {
    pub keys: B,
    pub values: B,
}

pub use crate::shapes::KEY_PAD;

/// Bytes a canvas's attention scores take at most (`Arena::scores`, where the adapter binds that
/// many; `Tuning::scores_bytes`, `DG_SCORES_BYTES`, caps it lower): a group of queries whose
/// scores would take more runs in blocks of queries whose scores fit (`Arena::query_block`). At
/// the real geometry a canvas's attention runs unblocked up to 65280 cached positions. A canvas
/// has few queries, and blocks of fewer cost their products far more than their share: each
/// block reads the whole cache again, once per query head (on an H200 a full layer over 65792
/// keys in blocks of 48 queries ran its scores at 44 TFLOP/s, over 16640 keys in blocks of 128 at
/// 112; bench/HISTORY.md, "Attention's tiles, and its blocks of queries").
pub const SCORES_BYTES: u64 = 1 << 30;

/// Bytes an encoder chunk's scores take at most where a canvas's take less: a chunk of 1024
/// queries runs unblocked up to 4096 keys and in blocks of at least 256 queries up to 16384, its
/// products on whole tiles, without growing the arena past a canvas's needs.
pub const ENCODER_SCORES_BYTES: u64 = 256 << 20;

/// The fewest queries an attention block holds (or all of its group's): the scores buffer holds
/// at least this many over the most keys, and blocks are multiples of it where that takes no more
/// of them (`even_block`).
pub const QUERY_BLOCK: usize = 16;

/// The size of the fewest blocks of `tokens` queries, each at most `most` (at least
/// [`QUERY_BLOCK`]): as even as they can be, rounded up to a multiple of [`QUERY_BLOCK`] where that
/// still fits `most` and needs no more blocks.
fn even_block(tokens: usize, most: usize) -> usize {
    let blocks = tokens.div_ceil(most);
    let even = tokens.div_ceil(blocks);
    let rounded = even.next_multiple_of(QUERY_BLOCK);
    if rounded <= most { rounded } else { even }
}

/// Tokens per encoder chunk at most (a longer prompt is encoded in several): 1024 rows of activations
/// keep the GEMMs as wide as a prefill allows while the arena stays a few hundred MB at the real size.
pub const PREFILL_CHUNK: usize = 1024;

/// Tokens per encoder chunk at most in `config`'s model: [`PREFILL_CHUNK`], or in a model with a
/// vision tower the largest image's soft tokens where more (an image's run is encoded in one
/// chunk: `GpuModel::encode_with_images`).
pub fn prefill_chunk(config: &ModelConfig) -> usize {
    let largest_image = dg_image::SUPPORTED_SOFT_TOKENS.iter().max().copied().unwrap_or(0);
    if config.vision.is_some() { PREFILL_CHUNK.max(largest_image) } else { PREFILL_CHUNK }
}

/// Activation buffers.
#[derive(Debug)]
pub struct Arena<B = wgpu::Buffer> {
    pub canvas: usize,
    /// Sequences with a KV cache of their own; a forward takes up to this many canvases.
    pub slots: usize,
    /// Rows of the per-token activations: max(slots·C, the encoder's chunk).
    pub token_rows: usize,
    pub max_context: usize,
    /// Positions a sliding layer's cache holds from its base: `min(max_context, W − 1 + rows)`,
    /// the window an encoder chunk's first query sees and the chunk itself (at most
    /// `token_rows` tokens). At the real geometry and a context of 16384, 2047 rows instead of
    /// 16384: 0.84 GB of f32 K/V a sequence in the 25 sliding layers instead of 6.7 GB.
    pub sliding_positions: usize,
    /// How the caches store keys and values: f32, or f16 ([`cache_format`]).
    pub cache_format: WeightFormat,
    /// `[W − 1, kv_heads, head_dim]` as cached: where a sliding cache's window passes on its way to
    /// row 0 (a buffer cannot be copied into itself); one word where the caches hold every
    /// position.
    pub sliding_scratch: B,
    /// u32 ids `[rows]`: the canvases, or an encoder chunk.
    pub ids: B,
    /// Embedded canvas, then `e + sc_signal` `[C, H]`; in an encoder chunk holding an image, its
    /// soft tokens' rows (`forward::ImageRows`).
    pub embedded: B,
    /// u32 `[rows]`: 1 at the rows of an encoder chunk that hold an image's soft tokens, else 0.
    pub image_gate: B,
    /// The residual stream `[C, H]`.
    pub hidden: B,
    /// A normed copy of the stream `[C, H]`.
    pub normed: B,
    /// Raw projections of `GpuLayer::qkv_proj`'s blocks, `[blocks, C, kv·d]`: q's, K's and V's in
    /// one product, or one product's blocks at a time (q's, then K's and V's once q is normed).
    pub qkv_raw: B,
    pub q: B,
    /// Attention scores/probabilities `[heads, queries, keys]` of one block of queries (a canvas,
    /// an encoder chunk, or part of one where its scores would take more than [`SCORES_BYTES`]).
    pub scores: B,
    /// f32 elements `scores` holds.
    pub scores_len: usize,
    pub attn: B,
    /// `[C, H]` scratch: attention output, MoE output.
    pub proj: B,
    /// `[C, 2·I]` dense / self-conditioning MLP gate‖up.
    pub gate_up: B,
    /// `[C, I]`.
    pub act: B,
    /// `[C]`: what each row of the product of `act` is multiplied by, where `act` is scaled by
    /// rows into f16's range (`Planner::scales_rows`).
    pub act_scale: B,
    /// `[C, H]` MoE branch.
    pub moe: B,
    /// The experts' input `pre_feedforward_layernorm_2(h)`, then the router's `rms(h)·scale·H^-½`:
    /// `[2, C, H]` (rows of the pass: the second starts `rows·H` in).
    pub branch_in: B,
    pub router_logits: B,
    pub topk_idx: B,
    pub topk_w: B,
    /// The experts' `E + 1` slot offsets, then the tensor-core grouped GEMM's tile table
    /// (`dg_kernels::moe_dispatch`).
    pub offsets: B,
    pub rows: B,
    pub slot_of: B,
    /// `[C·K, 2·I_e]`.
    pub expert_gate_up: B,
    /// `[C·K, I_e]`.
    pub expert_act: B,
    /// `[C·K]`: `act_scale` for `expert_act`'s slots.
    pub expert_act_scale: B,
    /// `[C·K, H]`.
    pub expert_out: B,
    /// Canvases whose vocabulary-sized rows share one buffer: as many as one storage binding
    /// holds (canvas `b` is in group `b / vocab_group`, at row `(b % vocab_group)·C`).
    pub vocab_group: usize,
    /// Per group: its canvases' self-conditioning input logits, softmaxed in place, `[rows, V]`.
    pub sc_probs: Vec<B>,
    /// Per group: its canvases' output logits `[rows, V]`.
    pub logits: Vec<B>,
    /// RoPE tables per layer type: cos, sin `[C, d/2]` (sliding, full), the rows of the tokens
    /// of a forward or an encoder chunk.
    pub rope_sliding: (B, B),
    pub rope_full: (B, B),
    /// The same tables for every position `0..rope_positions` (`max_context` + C: the cache's
    /// tokens and a canvas after them), computed once here, from which a forward's rows are
    /// copied on the GPU (`GpuModel::ensure_rope`): on an H200 host, writing a 1024-token chunk's
    /// tables took 4.4–6.5 ms before its first layer could run.
    pub rope_table_sliding: (B, B),
    pub rope_table_full: (B, B),
    pub rope_positions: usize,
    /// Per slot, per layer, the cached context K/V.
    pub caches: Vec<Vec<CacheBuffers<B>>>,
    /// u32 `[rows of logits[0]]`: the rows of a forward whose head runs at some rows
    /// (`forward::Head::Rows`), as indices among the forward's rows.
    pub head_rows: B,
    /// u32 per canvas row: whether the row's canvas adds the self-conditioning signal in a
    /// forward of mixed canvases (`forward::SelfConditioning::Gated`).
    pub sc_gate: B,
    /// Host-visible staging for the logits readback.
    pub staging: B,
    /// The sampler step's inputs: one `dg_kernels::sample_rows::SampleStep`.
    pub sample_step: B,
    /// Per-row uniforms (f32 bits) or given ids of the step's categorical draw, u32 `[C]`.
    pub draws: B,
    /// Per-row results of the step (entropy, argmax, sampled, non-finite column), u32 `[C, 4]`.
    pub row_results: B,
    /// Host-visible staging for `row_results`.
    pub row_staging: B,
    /// A 16-byte buffer bound where a kernel ignores a binding (one vec4: the size a binding of
    /// `array<vec4<f32>>` needs at least).
    pub dummy: B,
    /// The split-K partial products of the tensor-core GEMMs (`dg_kernels::split_k`): room for
    /// [`SPLIT_PARTIALS`] partials of the widest canvas product, on a device with cooperative
    /// matrices (elsewhere one element, and no product splits); `slots` times that, a canvas's
    /// share for each canvas of a batch.
    pub split_partials: B,
    /// The f32 elements of `split_partials` the planner fits a product's splits into (one
    /// canvas's share: the same for any `slots`, so that the plans are).
    pub split_planned: u64,
    /// The chunked vocabulary softmax's `(max, sum)` pairs (`dg_kernels::softmax_chunked`).
    pub softmax_pairs: B,
    /// Bytes of all the arena's buffers (the caches included).
    pub bytes: u64,
}

/// Bytes one canvas of a batched forward adds to its vocabulary-sized buffers: its logits and its
/// self-conditioning input, f32 `[C, V]` each (each slot of a batch also has its KV cache).
pub fn canvas_vocab_bytes(config: &ModelConfig) -> u64 {
    2 * (config.canvas_length * config.text.vocab_size * 4) as u64
}

/// How many canvases' logits share one buffer on an adapter whose storage bindings hold
/// `max_binding` bytes (a batch's vocabulary-sized buffers come in groups of that many, so the
/// batch itself is bounded by memory only); 0: one canvas's logits do not fit a binding.
pub fn canvases_per_binding(config: &ModelConfig, max_binding: u64) -> usize {
    (max_binding / (canvas_vocab_bytes(config) / 2).max(1)) as usize
}

/// Canvas-sized partial products (of the widest canvas product) the split-K scratch holds: the
/// router splits 22 ways but is 128 wide, the soft embedding 5 ways at 2816 wide
/// (`dg_kernels::coop_gemm::Split`); a split that would not fit takes fewer ranges.
pub const SPLIT_PARTIALS: usize = 8;

/// Where an arena's buffers come from: the device ([`GpuContext`]), or [`Sizing`], which only
/// counts their bytes (what the arena would take on a device of given limits).
pub trait Allocate {
    type Buffer;
    /// A storage buffer of `bytes` (whole words), within the device's binding limit.
    fn storage(&self, label: &str, bytes: u64) -> Result<Self::Buffer, GpuError>;
    /// A buffer for copies or staging (no binding) with `usage`.
    fn plain(&self, label: &str, bytes: u64, usage: wgpu::BufferUsages) -> Result<Self::Buffer, GpuError>;
    /// The largest storage binding ([`GpuContext::max_binding`]).
    fn max_binding(&self) -> u64;
    /// Whether the tensor-core GEMMs run ([`GpuContext::coop_matrix`]).
    fn coop_matrix(&self) -> bool;
    fn tuning(&self) -> &Tuning;
}

impl Allocate for GpuContext {
    type Buffer = wgpu::Buffer;
    fn storage(&self, label: &str, bytes: u64) -> Result<wgpu::Buffer, GpuError> {
        self.storage_buffer(label, bytes)
    }
    fn plain(&self, label: &str, bytes: u64, usage: wgpu::BufferUsages) -> Result<wgpu::Buffer, GpuError> {
        self.buffer(label, bytes, usage)
    }
    fn max_binding(&self) -> u64 {
        GpuContext::max_binding(self)
    }
    fn coop_matrix(&self) -> bool {
        self.coop_matrix
    }
    fn tuning(&self) -> &Tuning {
        &self.tuning
    }
}

/// Counts the bytes of the buffers an arena would allocate on a device whose storage bindings
/// hold `max_binding` bytes, with or without the tensor-core GEMMs: `dg info`'s memory for a
/// context, without a device.
#[derive(Debug, Default)]
pub struct Sizing {
    pub max_binding: u64,
    pub coop_matrix: bool,
    pub tuning: Tuning,
    bytes: std::cell::Cell<u64>,
}

impl Sizing {
    pub fn new(max_binding: u64, coop_matrix: bool) -> Self {
        Sizing { max_binding, coop_matrix, ..Default::default() }
    }

    /// Bytes counted so far.
    pub fn bytes(&self) -> u64 {
        self.bytes.get()
    }
}

impl Allocate for Sizing {
    type Buffer = u64;
    fn storage(&self, label: &str, bytes: u64) -> Result<u64, GpuError> {
        let size = crate::context::storage_size(label, bytes, self.max_binding)?;
        self.bytes.set(self.bytes.get() + size);
        Ok(size)
    }
    fn plain(&self, _label: &str, bytes: u64, _usage: wgpu::BufferUsages) -> Result<u64, GpuError> {
        self.bytes.set(self.bytes.get() + bytes);
        Ok(bytes)
    }
    fn max_binding(&self) -> u64 {
        self.max_binding
    }
    fn coop_matrix(&self) -> bool {
        self.coop_matrix
    }
    fn tuning(&self) -> &Tuning {
        &self.tuning
    }
}

/// Bytes of the arena (activations, and every slot's KV cache stored as `cache_format`) of a
/// model loaded for `slots` sequences of up to `max_context` positions on a device whose storage
/// bindings hold `max_binding` bytes, with or without the tensor-core GEMMs.
pub fn arena_bytes(
    config: &ModelConfig,
    max_context: usize,
    slots: usize,
    cache_format: WeightFormat,
    (max_binding, coop_matrix): (u64, bool),
) -> Result<u64, GpuError> {
    let sizing = Sizing::new(max_binding, coop_matrix);
    Arena::build(&sizing, config, max_context, slots, cache_format)?;
    Ok(sizing.bytes())
}

/// How a model of `config` whose matrices are stored as `weights` (F16 for the tensor-core
/// modes, quantized ones included) caches keys and values on `ctx` (`Tuning::kv_cache`, by
/// default [`KvCacheChoice::Auto`]). Auto: f16 where the tensor cores run every attention
/// product (`Planner::attention_on_tensor_cores`: the F16 mode with cooperative matrices and head
/// dims their tiles take, as the real model's 256 and 512), which round K and V to f16 as they
/// stage them, so the same bits at half the bytes; f32 elsewhere. Where some attention product
/// runs on the portable GEMM (the fixtures' 16-wide heads) an f16 cache rounds what that GEMM
/// would read unrounded: on the H200 it doubled the F16 mode's logits error on `bf16-checkpoint`
/// (5.2e-4 → 1.13e-3 of the CPU's), so there f16 is only on request.
pub fn cache_format(ctx: &GpuContext, config: &ModelConfig, weights: WeightFormat) -> WeightFormat {
    // The attention's products take the tensor cores in the F16 mode (`forward.rs`).
    let all_on_tensor_cores = ctx.planner().attention_on_tensor_cores(config, weights == WeightFormat::F16);
    cache_format_for(all_on_tensor_cores, ctx.features.contains(wgpu::Features::SHADER_F16), ctx.tuning.kv_cache)
}

/// The cache format [`cache_format`] picks by default for `config` in the F16 mode on a device
/// with cooperative matrices like an H200, without opening one (`dg info`).
pub fn tensor_core_cache_format(config: &ModelConfig) -> WeightFormat {
    let tuning = Tuning::default();
    let planner = crate::planner::Planner::new(crate::planner::Capabilities::H200, &tuning);
    cache_format_for(planner.attention_on_tensor_cores(config, true), true, KvCacheChoice::Auto)
}

/// [`cache_format`] for a model whose attention products do (or do not) all run on the tensor
/// cores, on a device that does (or does not) store f16 in shaders.
pub fn cache_format_for(attention_on_tensor_cores: bool, shader_f16: bool, choice: KvCacheChoice) -> WeightFormat {
    let half = match choice {
        KvCacheChoice::Auto => attention_on_tensor_cores,
        KvCacheChoice::F32 => false,
        KvCacheChoice::F16 => shader_f16,
    };
    if half { WeightFormat::F16 } else { WeightFormat::F32 }
}

/// Rows of the per-token activations of an arena for `slots` canvases and contexts of up to
/// `max_context` positions: a forward of every slot's canvas, or an encoder chunk of up to
/// `prefill` tokens.
fn token_rows(config: &ModelConfig, max_context: usize, slots: usize, prefill: usize) -> usize {
    (slots.max(1) * config.canvas_length).max(prefill.max(1).min(max_context))
}

/// Positions the caches of `kind`'s layers hold for contexts of up to `max_context` positions
/// and encoder chunks of up to `token_rows` tokens (besides the `KEY_PAD + C` rows of a canvas
/// after them): every one in full layers; in sliding layers the W − 1 positions a chunk's first
/// query sees and the chunk, where that is fewer.
pub fn cache_positions_for(cfg: &TextConfig, kind: LayerKind, max_context: usize, token_rows: usize) -> usize {
    match kind {
        LayerKind::Full => max_context,
        LayerKind::Sliding => max_context.min(cfg.sliding_kept() + token_rows),
    }
}

/// Bytes of one sequence's KV cache on the GPU (keys and values of every layer, stored as `format`:
/// [`cache_format`]) for contexts of up to `max_context` positions, in a model loaded for one
/// sequence.
pub fn sequence_cache_bytes(config: &ModelConfig, max_context: usize, format: WeightFormat) -> u64 {
    let r = token_rows(config, max_context, 1, prefill_chunk(config));
    config.text.layers.iter().map(|l| 2 * layer_cache_bytes(config, l, max_context, r, format)).sum()
}

/// Bytes of one layer's cached keys (or values) stored as `format`: its positions
/// ([`cache_positions_for`]) and the `KEY_PAD + C` rows of a canvas after them.
fn layer_cache_bytes(config: &ModelConfig, l: &dg_model::LayerSpec, max_context: usize, token_rows: usize, format: WeightFormat) -> u64 {
    let positions = cache_positions_for(&config.text, l.kind, max_context, token_rows);
    cache_bytes(format, (positions + KEY_PAD + config.canvas_length) * l.num_kv_heads * l.head_dim)
}

/// Bytes of `elements` cached keys (or values) stored as `format` (f32, or f16 in pairs).
fn cache_bytes(format: WeightFormat, elements: usize) -> u64 {
    match format {
        WeightFormat::F16 => (elements * 2).next_multiple_of(4) as u64,
        _ => (elements * 4) as u64,
    }
}

fn max_dims(cfg: &TextConfig) -> (usize, usize) {
    let q = cfg.layers.iter().map(|l| cfg.num_attention_heads * l.head_dim).max().unwrap_or(0);
    let kv = cfg.layers.iter().map(|l| l.num_kv_heads * l.head_dim).max().unwrap_or(0);
    (q, kv)
}

impl Arena {
    /// Allocates every activation for forwards of up to `slots` canvases of `config.canvas_length`
    /// tokens, each against at most `max_context` cached tokens in its slot's cache, and fills the
    /// RoPE tables.
    pub fn new(
        ctx: &GpuContext,
        config: &ModelConfig,
        max_context: usize,
        slots: usize,
        cache_format: WeightFormat,
    ) -> Result<Self, GpuError> {
        let allocated = ctx.counters().bytes_allocated();
        let mut arena = Self::build(ctx, config, max_context, slots, cache_format)?;
        for (kind, (cos_buf, sin_buf)) in [(LayerKind::Sliding, &arena.rope_table_sliding), (LayerKind::Full, &arena.rope_table_full)] {
            if let Some(spec) = config.text.layers.iter().find(|l| l.kind == kind) {
                let (cos, sin) = spec.rope.cos_sin(spec.head_dim, 0, arena.rope_positions);
                ctx.queue.write_buffer(cos_buf, 0, bytemuck::cast_slice(&cos));
                ctx.queue.write_buffer(sin_buf, 0, bytemuck::cast_slice(&sin));
            }
        }
        arena.bytes = ctx.counters().bytes_allocated() - allocated;
        Ok(arena)
    }
}

impl<B> Arena<B> {
    /// Every buffer of [`Arena::new`] from `alloc` (the device, or [`Sizing`]), the RoPE tables
    /// unfilled and `bytes` 0.
    pub fn build<A: Allocate<Buffer = B>>(
        alloc: &A,
        config: &ModelConfig,
        max_context: usize,
        slots: usize,
        cache_format: WeightFormat,
    ) -> Result<Self, GpuError> {
        let cfg = &config.text;
        let c = config.canvas_length;
        let slots = slots.max(1);
        let tuning = alloc.tuning();
        // Rows of a forward of every slot's canvas.
        let b = slots * c;
        // Rows of the per-token activations: the canvases, or an encoder chunk.
        let r = token_rows(config, max_context, slots, tuning.prefill_rows.unwrap_or_else(|| prefill_chunk(config)));
        let keep = cfg.sliding_kept();
        let sliding_positions = cache_positions_for(cfg, LayerKind::Sliding, max_context, r);
        let (h, v, i, e_i, k) = (cfg.hidden_size, cfg.vocab_size, cfg.intermediate_size, cfg.moe_intermediate_size, cfg.top_k_experts);
        let (q_w, kv_w) = max_dims(cfg);
        let heads = cfg.num_attention_heads;
        // The scores of a decoder group ([visible | dead | canvas] keys), capped at SCORES_BYTES,
        // or of an encoder chunk (at most max_context keys, padded), capped at
        // ENCODER_SCORES_BYTES, whichever is more; holding at least a block of QUERY_BLOCK
        // queries over the most keys.
        let most_keys = max_context.next_multiple_of(KEY_PAD) + c;
        let (canvas, chunk) = (heads * c * most_keys, heads * r * max_context.next_multiple_of(KEY_PAD));
        let cap = |bytes: u64| (tuning.scores_bytes.unwrap_or(bytes).min(bytes).min(alloc.max_binding()) / 4) as usize;
        let least = heads * QUERY_BLOCK * most_keys;
        let scores_len = canvas.min(cap(SCORES_BYTES)).max(chunk.min(cap(ENCODER_SCORES_BYTES))).max(least.min(canvas.max(chunk)));
        let f = |label: &str, n: usize| alloc.storage(label, (n * 4) as u64);
        let caches = (0..slots)
            .map(|slot| {
                cfg.layers
                    .iter()
                    .enumerate()
                    .map(|(li, l)| {
                        let name = |kv: &str| if slot == 0 { format!("cache.{li}.{kv}") } else { format!("cache{slot}.{li}.{kv}") };
                        let buffer = |kv: &str| alloc.storage(&name(kv), layer_cache_bytes(config, l, max_context, r, cache_format));
                        Ok(CacheBuffers { keys: buffer("k")?, values: buffer("v")? })
                    })
                    .collect::<Result<Vec<_>, GpuError>>()
            })
            .collect::<Result<Vec<_>, GpuError>>()?;
        // The vocabulary-sized buffers in groups of as many canvases as a binding holds.
        let canvas_bytes = (c * v * 4) as u64;
        let vocab_binding = tuning.vocab_binding.map_or(alloc.max_binding(), |cap| cap.min(alloc.max_binding()));
        let vocab_group = ((vocab_binding / canvas_bytes.max(1)) as usize).clamp(1, slots);
        let group_rows: Vec<usize> = (0..slots.div_ceil(vocab_group)).map(|g| (slots - g * vocab_group).min(vocab_group) * c).collect();
        let vocab_buffers = |label: &str| -> Result<Vec<B>, GpuError> {
            group_rows
                .iter()
                .enumerate()
                .map(|(g, rows)| f(&if g == 0 { label.to_string() } else { format!("{label}{g}") }, rows * v))
                .collect()
        };
        let split_planned = if alloc.coop_matrix() { (SPLIT_PARTIALS * c * h.max(q_w).max(2 * kv_w).max(2 * i)) as u64 } else { 1 };
        let half = |kind: LayerKind| cfg.layers.iter().find(|l| l.kind == kind).map_or(1, |l| l.head_dim / 2);
        let rope = |name: &str, hd: usize| -> Result<(B, B), GpuError> {
            Ok((f(&format!("rope.{name}.cos"), r * hd)?, f(&format!("rope.{name}.sin"), r * hd)?))
        };
        // Copy sources only (no binding, so no binding limit).
        let rope_positions = max_context + c;
        let rope_table = |kind: LayerKind, name: &str| -> Result<(B, B), GpuError> {
            let usage = wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST;
            let bytes = (rope_positions * half(kind) * 4) as u64;
            Ok((
                alloc.plain(&format!("rope table.{name}.cos"), bytes, usage)?,
                alloc.plain(&format!("rope table.{name}.sin"), bytes, usage)?,
            ))
        };
        Ok(Arena {
            canvas: c,
            slots,
            token_rows: r,
            max_context,
            sliding_positions,
            cache_format,
            sliding_scratch: {
                let sliding_row = cfg.layers.iter().filter(|l| l.kind == LayerKind::Sliding).map(|l| l.num_kv_heads * l.head_dim).max();
                let elements = match sliding_row {
                    Some(row) if sliding_positions < max_context => keep * row,
                    _ => 1,
                };
                let bytes = cache_bytes(cache_format, elements).max(4);
                alloc.plain("sliding scratch", bytes, wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST)?
            },
            ids: f("ids", r)?,
            embedded: f("embedded", r * h)?,
            image_gate: f("image gate", r)?,
            hidden: f("hidden", r * h)?,
            normed: f("normed", r * h)?,
            qkv_raw: f("qkv_raw", r * (q_w + 2 * kv_w))?,
            q: f("q", r * q_w)?,
            // One block of queries' scores (`scores_len`, above).
            scores: f("scores", scores_len)?,
            scores_len,
            attn: f("attn", r * q_w)?,
            proj: f("proj", r * h)?,
            gate_up: f("gate_up", r * 2 * i.max(1))?,
            act: f("act", r * i)?,
            act_scale: f("act_scale", r)?,
            moe: f("moe", r * h)?,
            branch_in: f("branch_in", 2 * r * h)?,
            router_logits: f("router_logits", r * cfg.num_experts)?,
            topk_idx: f("topk_idx", r * k)?,
            topk_w: f("topk_w", r * k)?,
            // The experts' offsets and room for the tile table of the smallest m tiles.
            offsets: f(
                "offsets",
                dg_kernels::moe_dispatch::offsets_len(&MoeDispatchParams {
                    tokens: r as u32,
                    k: k as u32,
                    experts: cfg.num_experts as u32,
                    tile_rows: MIN_TILE_ROWS,
                }) as usize,
            )?,
            rows: f("rows", r * k)?,
            slot_of: f("slot_of", r * k)?,
            expert_gate_up: f("expert_gate_up", r * k * 2 * e_i)?,
            expert_act: f("expert_act", r * k * e_i)?,
            expert_act_scale: f("expert_act_scale", r * k)?,
            expert_out: f("expert_out", r * k * h)?,
            vocab_group,
            sc_probs: vocab_buffers("sc_probs")?,
            softmax_pairs: f(
                "softmax pairs",
                2 * dg_kernels::softmax_chunked::ChunkedSoftmaxParams::new((vocab_group * c) as u32, v as u32).pairs() as usize,
            )?,
            logits: vocab_buffers("logits")?,
            rope_sliding: rope("sliding", half(LayerKind::Sliding))?,
            rope_full: rope("full", half(LayerKind::Full))?,
            rope_table_sliding: rope_table(LayerKind::Sliding, "sliding")?,
            rope_table_full: rope_table(LayerKind::Full, "full")?,
            rope_positions,
            caches,
            head_rows: f("head rows", group_rows[0])?,
            sc_gate: f("sc gate", b)?,
            staging: alloc.plain("logits staging", (c * v * 4) as u64, wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::MAP_READ)?,
            sample_step: alloc.storage("sample step", (slots * size_of::<dg_kernels::sample_rows::SampleStep>()) as u64)?,
            draws: f("draws", b)?,
            row_results: f("row results", b * RESULT_WORDS)?,
            row_staging: alloc.plain(
                "row results staging",
                (b * RESULT_WORDS * 4) as u64,
                wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::MAP_READ,
            )?,
            dummy: f("dummy", 4)?,
            split_partials: f("split partials", split_planned as usize * slots)?,
            split_planned,
            bytes: 0,
        })
    }

    /// Rows of a forward of every slot's canvas.
    pub fn batch_rows(&self) -> usize {
        self.slots * self.canvas
    }

    /// The groups of a forward of `n` canvases' vocabulary-sized rows: `(group, first canvas,
    /// canvases)`.
    pub fn vocab_groups(&self, n: usize) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
        self.vocab_groups_of(n, self.canvas)
    }

    /// [`Self::vocab_groups`] of canvases of `width` rows (a group holds `vocab_group · C` rows).
    pub fn vocab_groups_of(&self, n: usize, width: usize) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
        let per = self.canvases_per_group(width);
        (0..n.div_ceil(per)).map(move |g| (g, g * per, (n - g * per).min(per)))
    }

    /// Canvas `b`'s vocabulary-sized rows: its group's buffers and its first row there.
    pub fn vocab_rows(&self, b: usize) -> (usize, usize) {
        self.vocab_rows_of(b, self.canvas)
    }

    /// [`Self::vocab_rows`] of canvas `b` of a forward of canvases of `width` rows.
    pub fn vocab_rows_of(&self, b: usize, width: usize) -> (usize, usize) {
        let per = self.canvases_per_group(width);
        (b / per, (b % per) * width)
    }

    /// Canvases of `width` rows one group of vocabulary-sized buffers holds.
    fn canvases_per_group(&self, width: usize) -> usize {
        (self.vocab_group * self.canvas / width.max(1)).max(1)
    }

    /// Rows of the first group's vocabulary-sized buffers: the most a forward's head computes
    /// at some rows (`forward::Head::Rows`).
    pub fn head_rows_len(&self) -> usize {
        self.vocab_group * self.canvas
    }

    /// Query tokens per attention block for a group of `tokens` queries of `heads` heads over
    /// `keys` keys: all of them where their scores fit `scores`, else blocks of even size
    /// (`even_block`), as few as the scores buffer allows. Even blocks, not the most
    /// that fit and a short last one: on an H200 a canvas's 256 queries over 16640 keys in a full
    /// layer ran as 224 + 32, and the 32-query block's products, on tiles of 128 rows, took a
    /// fifth of the layer's attention for an eighth of its work.
    pub fn query_block(&self, heads: usize, tokens: usize, keys: usize) -> Result<usize, GpuError> {
        let per_query = heads * keys;
        if tokens * per_query <= self.scores_len {
            return Ok(tokens);
        }
        match self.scores_len / per_query {
            0..QUERY_BLOCK => Err(GpuError::TooLong {
                len: keys,
                max: self.scores_len / (heads * QUERY_BLOCK),
                limit_name: "the keys whose scores of one block of queries fit the arena's scores buffer",
                hint: "",
            }),
            most => Ok(even_block(tokens, most)),
        }
    }

    /// Positions layer `kind`'s caches hold from their first row (besides the `KEY_PAD + C` rows
    /// of a canvas after them).
    pub fn cache_positions(&self, kind: LayerKind) -> usize {
        match kind {
            LayerKind::Full => self.max_context,
            LayerKind::Sliding => self.sliding_positions,
        }
    }

    /// Bytes of one row (token) of a cache of `spec`'s layer: its K (or V) heads.
    pub fn cache_row_bytes(&self, spec: &dg_model::LayerSpec) -> u64 {
        cache_bytes(self.cache_format, spec.num_kv_heads * spec.head_dim)
    }

    /// Layer `layer`'s cache of `slot`.
    pub fn cache(&self, slot: usize, layer: usize) -> Result<&CacheBuffers<B>, GpuError> {
        self.caches.get(slot).and_then(|c| c.get(layer)).ok_or(GpuError::Limit {
            what: format!("slot {slot}"),
            needed: slot as u64 + 1,
            limit: self.slots as u64,
            limit_name: "the slots the model was loaded with",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes docs/generate.md gives for a sequence's cache at the real geometry: 25 sliding layers of
    /// 8 × 256 K/V that hold 2047 positions past a context of 2047, 5 full layers of 2 × 512.
    #[test]
    fn a_sequences_cache_at_the_real_geometry() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/configs/real-30layer.json");
        let config = ModelConfig::from_file(&path).unwrap();
        let every_position = |n: usize| 8 * (n + KEY_PAD + 256) as u64 * (25 * 8 * 256 + 5 * 2 * 512);
        for (positions, bytes, before) in [
            (1024, 591_134_720, every_position(1024)),
            (4096, 1_135_984_640, 1_975_255_040),
            (16384, 1_639_301_120, 7_511_736_320),
            (262144, 11_705_630_720, 118_241_361_920),
        ] {
            assert_eq!(sequence_cache_bytes(&config, positions, WeightFormat::F32), bytes, "{positions} positions");
            assert_eq!(sequence_cache_bytes(&config, positions, WeightFormat::F16), bytes / 2, "{positions} positions, f16");
            assert_eq!(every_position(positions), before, "{positions} positions, every one held");
        }
        // Up to the window and a chunk, the sliding caches hold every position.
        assert_eq!(sequence_cache_bytes(&config, 1024, WeightFormat::F32), every_position(1024));
    }

    /// The arena of one sequence at the real geometry, as BENCHMARKS.md gives it: on an H200
    /// (bindings of 2 GiB − 4 bytes, the tensor cores) with an f32 cache (`DG_KV_CACHE=f32`) and
    /// with the default f16 one, and on a device without tensor cores (f32). At 1536 positions
    /// with an f32 cache on the H200 it is the 2.19 GB measured there (`xtask bench-batch`, B = 1).
    #[test]
    fn the_arena_of_one_sequence_at_the_real_geometry() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/configs/real-30layer.json");
        let config = ModelConfig::from_file(&path).unwrap();
        // On such a device the tensor cores run all of the real model's attention: f16 cache.
        assert_eq!(tensor_core_cache_format(&config), WeightFormat::F16);
        let h200 = ((2u64 << 30) - 4, true);
        let gb = |positions, format, device| arena_bytes(&config, positions, 1, format, device).unwrap() as f64 / 1e9;
        assert_eq!(format!("{:.2}", gb(1536, WeightFormat::F32, h200)), "2.19");
        for (positions, f32_cache, f16_cache, portable) in [
            (4096, "2.69", "2.12", "2.62"),
            (16384, "3.23", "2.41", "3.17"),
            (65536, "6.20", "4.37", "6.13"),
            (262144, "14.86", "9.00", "14.79"),
        ] {
            assert_eq!(
                format!("{:.2}", gb(positions, WeightFormat::F32, h200)),
                f32_cache,
                "{positions} positions, tensor cores, an f32 cache"
            );
            assert_eq!(format!("{:.2}", gb(positions, WeightFormat::F16, h200)), f16_cache, "{positions} positions, an f16 cache");
            assert_eq!(format!("{:.2}", gb(positions, WeightFormat::F32, (h200.0, false))), portable, "{positions} positions, portable");
        }
    }

    #[test]
    fn queries_run_in_the_fewest_even_blocks() {
        // (queries, the most a block holds) -> the block.
        let cases =
            [((256, 252), 128), ((1024, 256), 256), ((256, 16), 16), ((250, 224), 128), ((100, 96), 64), ((256, 63), 52), ((256, 48), 48)];
        for ((tokens, most), block) in cases {
            assert_eq!(even_block(tokens, most), block, "{tokens} queries, at most {most} a block");
            assert!(block <= most);
            assert_eq!(tokens.div_ceil(block), tokens.div_ceil(most), "{tokens} queries: more blocks than needed");
        }
    }
}

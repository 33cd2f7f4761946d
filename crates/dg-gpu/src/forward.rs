//! The decoder's canvas forward as a list of dispatches (`DiffusionGemmaDecoderModel.forward` +
//! `DiffusionGemmaSelfConditioning` + the tied, softcapped head), recorded once per block and
//! replayed every denoising step.
//!
//! Per layer (mirrors `dg_cpu::layer::layer_forward`):
//! norm → the q/k/v GEMM (one, or q's and K/V's: `Planner::merge_qkv`) → q/k norms fused with RoPE and the
//! v norm in one dispatch (the canvas's K/V written into the cache after the visible rows) →
//! attention over [visible | dead | canvas] cache rows as one score GEMM, a row softmax and one
//! value GEMM (per block of queries where the scores would not fit the arena's) → o_proj → post-attention norm + residual fused with the dense MLP's, the experts'
//! and the router's input norms → router → the dense MLP's and the experts' gate/up, both
//! activations in one dispatch (the experts' stored as f16 for the tensor cores where the device
//! has f16; where the down projections run on the tensor cores, each row scaled by a power of two
//! into f16's range, `Planner::scales_rows`), both down projections → the three post-FF norms
//! (multiplying those rows back), residual and layer scalar, and the next layer's input norm, in
//! one dispatch.
//!
//! A read (vLLM's structured mode) is the same forward over canvases of W < C rows, its head at
//! the asked rows only ([`Head::Rows`]); canvases of one slot share its cache ([`LayerPass::Decode`]).
//!
//! The encoder (`DiffusionGemmaEncoderModel`: prompt prefill and the commit of a finished canvas) is
//! the same layer with [`LayerPass::Encode`]: the new tokens' K/V are appended to the GPU-resident
//! cache, attention is causal (windowed in sliding layers), and the encoder's layer scalar applies.

use dg_kernels::WeightFormat;
use dg_kernels::coop_gemm::AFormat;
use dg_kernels::coop_grouped_gemm;
use dg_kernels::gemm::GemmParams;
use dg_kernels::grouped_gemm::GroupedGemmParams;
use dg_kernels::softmax::{self, SoftmaxParams};
use dg_model::{LayerKind, ModelConfig};

use crate::arena::{Arena, CacheBuffers, KEY_PAD};
use crate::error::GpuError;
use crate::ops::{
    AxpbyRows, Combine, HeadRows, Operand, Recorder, TokensAt, attention_scores_params, attention_values_params, head_params, linear_params,
};
use crate::weights::GpuWeights;

/// The cached keys one decoder layer attends to: cache rows `start..start + len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Visible {
    pub start: usize,
    pub len: usize,
}

/// One canvas of a decoder forward: the slot whose KV cache it attends to, and the cached rows
/// of that slot each layer sees.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CanvasShape {
    pub slot: usize,
    pub visible: Vec<Visible>,
}

/// Which canvases of a forward add the self-conditioning signal (`DiffusionGemmaSelfConditioning`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SelfConditioning {
    /// None (every canvas on its block's first step).
    Off,
    /// Every canvas.
    On,
    /// The canvases whose rows' gate (`Arena::sc_gate`) is non-zero: the signal is computed for
    /// every canvas and added to those (`Recorder::axpby` with a gate), the same bits as `On` there and
    /// the untouched embedding elsewhere.
    Gated,
}

/// Where a forward computes the head (final norm, `lm_head`, softcap).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Head {
    /// At every row: canvas `b`'s logits in its vocabulary rows (`Arena::vocab_rows_of`).
    All,
    /// At some rows of each canvas (a read's slots: vLLM's `logprob_token_ids` at a few
    /// positions), this many of canvas `b`'s: their indices among the forward's rows in
    /// `arena.head_rows` (canvas by canvas), their logits one after another from row 0 of
    /// `arena.logits[0]`.
    Rows(Vec<usize>),
}

/// What varies between steps of a forward: its canvases (canvas `b` in rows `b·width ..` of every
/// activation, the RoPE tables' rows included), which of them self-condition, their width, and
/// where the head runs.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ForwardShape {
    pub canvases: Vec<CanvasShape>,
    pub self_conditioning: SelfConditioning,
    /// Rows of each canvas: `canvas_length`, or a read's W below it.
    pub width: usize,
    pub head: Head,
}

impl ForwardShape {
    /// One canvas of `width` rows in slot 0 with the head at every row (the single-sequence
    /// forward).
    pub fn single(visible: Vec<Visible>, self_conditioning: bool, width: usize) -> Self {
        let self_conditioning = if self_conditioning { SelfConditioning::On } else { SelfConditioning::Off };
        ForwardShape { canvases: vec![CanvasShape { slot: 0, visible }], self_conditioning, width, head: Head::All }
    }
}

/// One canvas of a decoder layer: its slot and the cached rows the layer sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CanvasAt {
    pub slot: usize,
    pub visible: Visible,
}

/// What one recorded layer computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerPass<'s> {
    /// Decoder over canvases of `width` rows each (canvas `b` in rows `b·width ..`):
    /// bidirectional attention of each over the visible rows of its slot's cache, then the canvas
    /// itself (`DiffusionGemmaDecoderModel`; the decoder never writes the cache's context rows).
    Decode { canvases: &'s [CanvasAt], width: usize },
    /// Encoder over `tokens` new tokens at absolute positions `start..` of `slot`'s sequence
    /// (`DiffusionGemmaEncoderModel`): their K/V are appended to the slot's cache at row `start`
    /// (cache row = position; in sliding layers row = position − `base`), then causal (and, in
    /// sliding layers, windowed) attention over the cache rows that can be visible. `kv_only`:
    /// the last layer, whose output generation never uses (spec §4).
    /// `image`: the chunk's rows that hold an image's soft tokens, each of which sees the whole
    /// span where the model's text attention is bidirectional within images.
    Encode { slot: usize, start: usize, tokens: usize, base: usize, kv_only: bool, image: Option<ImageRows> },
}

/// Records one forward of `shape`'s canvases: their ids in `arena.ids` (canvas `b` at `b·width`;
/// and the probabilities' source logits in its rows of `arena.sc_probs` when self-conditioning,
/// see `Arena::vocab_rows_of`) → logits in its rows of `arena.logits` (or at the rows
/// [`Head::Rows`] names). Every product over the canvases' rows is planned
/// as for one canvas (`Recorder::plan_rows`), so each canvas gets the bits it gets alone.
pub fn record_canvas_forward<'a>(
    rec: &mut Recorder<'a>,
    config: &ModelConfig,
    w: &'a GpuWeights,
    a: &'a Arena,
    shape: &ForwardShape,
) -> Result<(), GpuError> {
    rec.split_k_scratch_as(&a.split_partials, a.split_planned);
    let cfg = &config.text;
    let canvas = shape.width;
    let n = shape.canvases.len();
    if canvas == 0 || canvas > config.canvas_length {
        return Err(GpuError::Length { what: "canvas width", got: canvas, expected: config.canvas_length });
    }
    if n == 0 || n * canvas > a.batch_rows() {
        return Err(GpuError::Limit {
            what: format!("a forward of {n} canvases"),
            needed: (n * canvas) as u64,
            limit: a.batch_rows() as u64,
            limit_name: "the canvases the arena holds (its batch)",
        });
    }
    rec.plan_rows(Some(canvas));
    // c: the rows of the forward.
    let (c, h, v, eps) = (n * canvas, cfg.hidden_size, cfg.vocab_size, cfg.rms_norm_eps);
    let scale = cfg.embed_scale();

    // e = E[ids]·√H
    rec.scope("input");
    for chunk in &w.embed {
        rec.embed_format(&a.ids, &chunk.matrix.buffer, chunk.matrix.format, &a.embedded, c, h, chunk.start, chunk.rows, scale)?;
    }
    if shape.self_conditioning != SelfConditioning::Off {
        // P = softmax(sc) (in place), soft = (P·E)·√H, signal = MLP_sc(pre_norm(soft)), e += signal.
        // Per group of canvases whose vocabulary rows share a buffer (`Arena::vocab_group`).
        for (g, first, count) in a.vocab_groups_of(n, canvas) {
            let rows = count * canvas;
            rec.softmax_rows(&a.sc_probs[g], &a.softmax_pairs, rows, v)?;
            for (i, chunk) in w.embed.iter().enumerate() {
                let p = GemmParams {
                    a_offset: chunk.start as u32,
                    a_rs: v as u32,
                    b_rs: h as u32,
                    b_cs: 1,
                    c_offset: (first * canvas * h) as u32,
                    accumulate: u32::from(i > 0),
                    ..linear_params(rows, h, chunk.rows)
                };
                rec.product(&a.sc_probs[g], &chunk.matrix, &a.proj, p, w.format == WeightFormat::F16)?;
            }
        }
        rec.axpby(&a.dummy, &a.proj, c * h, (0.0, scale), AxpbyRows::default())?;
        rec.rmsnorm(&a.proj, Some(&w.sc_pre_norm), &a.dummy, &a.normed, c, h, eps, false, 1.0)?;
        let inter = cfg.intermediate_size;
        let gate_up = rec.product_to_consumer(
            &a.normed,
            &w.sc_gate_up,
            &a.gate_up,
            linear_params(c, 2 * inter, h),
            w.on_tensor_cores(w.sc_gate_up.format),
        )?;
        // The down projection's input scaled by rows into f16's range where the tensor cores
        // round it, the rows multiplied back in the add.
        let tensor_cores = w.on_tensor_cores(w.sc_down.format);
        let scaled = rec.planner().scales_rows(tensor_cores);
        rec.gelu_glu_fused(gate_up, &a.act, c, inter, scaled.then_some(&a.act_scale))?;
        rec.product(&a.act, &w.sc_down, &a.proj, linear_params(c, h, inter), tensor_cores)?;
        let gate = (shape.self_conditioning == SelfConditioning::Gated).then_some(&a.sc_gate);
        rec.axpby(&a.proj, &a.embedded, c * h, (1.0, 1.0), AxpbyRows { row: h, scale: scaled.then_some(&a.act_scale), gate })?;
    }
    // h0 = post_norm(e + signal), weightless.
    rec.rmsnorm(&a.embedded, None, &a.dummy, &a.hidden, c, h, eps, false, 1.0)?;

    // Each layer's closing norms also write the next norm of the stream into `normed`: the next
    // layer's input norm, and after the last layer the final norm.
    let layers = cfg.num_layers();
    if let Some(bad) = shape.canvases.iter().find(|cv| cv.visible.len() != layers) {
        return Err(GpuError::Length { what: "visible ranges of a canvas", got: bad.visible.len(), expected: layers });
    }
    let mut at = Vec::with_capacity(n);
    for i in 0..layers {
        rec.scope(format!("layer{i}"));
        at.clear();
        at.extend(shape.canvases.iter().map(|cv| CanvasAt { slot: cv.slot, visible: cv.visible[i] }));
        let next = if i + 1 < layers { &w.layers[i + 1].norms.input } else { &w.final_norm };
        let pass = LayerPass::Decode { canvases: &at, width: canvas };
        record_layer_with(rec, config, w, a, i, pass, Chain { normed_in: i > 0, next_norm: Some(next) })?;
    }

    // logits = softcap(norm(h)·Eᵀ), norm(h) in `normed` from the last layer's closing norms.
    rec.scope("head");
    if layers == 0 {
        rec.rmsnorm(&a.hidden, Some(&w.final_norm), &a.dummy, &a.normed, c, h, eps, false, 1.0)?;
    }
    // The head over `rows` rows of `x` from row `x_row` into `out` from row `out_row`.
    let head = |rec: &mut Recorder<'a>, x: &'a wgpu::Buffer, (x_row, rows): (usize, usize), out: &'a wgpu::Buffer, out_row: usize| {
        for chunk in &w.embed {
            let p = GemmParams {
                a_offset: (x_row * h) as u32,
                ..head_params((rows, chunk.rows, h), (v, out_row * v + chunk.start), cfg.final_logit_softcapping)
            };
            let tensor_cores = w.format == WeightFormat::F16 && chunk.matrix.format != WeightFormat::F32;
            rec.product(x, &chunk.matrix, out, p, tensor_cores)?;
        }
        Ok::<(), GpuError>(())
    };
    match &shape.head {
        Head::All => {
            for (g, first, count) in a.vocab_groups_of(n, canvas) {
                head(rec, &a.normed, (first * canvas, count * canvas), &a.logits[g], 0)?;
            }
        }
        Head::Rows(counts) => {
            // The asked rows of norm(h) gathered into `proj` (free after the last layer) by the
            // embedding lookup over `normed` as an f32 table (× 1: the same bits), then the head
            // over them: each run of canvases with as many rows as one product, planned as one
            // canvas's rows, so that a canvas gets the bits it gets alone.
            let total: usize = counts.iter().sum();
            if total == 0 || total > a.head_rows_len() || counts.len() != n {
                return Err(GpuError::Limit {
                    what: format!("a head at {total} rows of {} canvases", counts.len()),
                    needed: total as u64,
                    limit: a.head_rows_len() as u64,
                    limit_name: "the rows of the arena's first logits buffer",
                });
            }
            rec.embed_format(&a.head_rows, &a.normed, WeightFormat::F32, &a.proj, total, h, 0, n * canvas, 1.0)?;
            let mut first = 0;
            for run in counts.chunk_by(|x, y| x == y) {
                let rows = run.iter().sum::<usize>();
                rec.plan_rows(Some(run[0]));
                head(rec, &a.proj, (first, rows), &a.logits[0], first)?;
                first += rows;
            }
        }
    }
    rec.plan_rows(None);
    Ok(())
}

/// Records one encoder chunk of a slot's sequence: `ids` in `arena.ids` (the first `tokens`), RoPE
/// tables of positions `start..start + tokens` → every layer's K/V appended to the slot's cache
/// (at row `start` in full layers, `start − base` in sliding layers).
pub fn record_encoder_chunk<'a>(
    rec: &mut Recorder<'a>,
    config: &ModelConfig,
    w: &'a GpuWeights,
    a: &'a Arena,
    chunk: EncoderChunk,
) -> Result<(), GpuError> {
    record_encoder_layers(rec, config, w, a, chunk, 0..config.text.num_layers())
}

/// One encoder chunk of a slot's sequence: `tokens` ids at positions `start..`, against sliding
/// caches whose row 0 holds position `base` (see [`record_encoder_chunk`]), holding at most one
/// image's soft tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EncoderChunk {
    pub slot: usize,
    pub start: usize,
    pub tokens: usize,
    pub base: usize,
    pub image: Option<ImageRows>,
}

/// The rows `first..first + len` of an encoder chunk that hold one image's soft tokens. Their
/// embeddings wait in `arena.embedded` (at those rows) and `arena.image_gate` marks them: after
/// the lookup a gated copy puts them into `hidden` (HF's `inputs_embeds.masked_scatter`), and with
/// `use_bidirectional_attention: "vision"` each of them sees the whole span
/// (`dg_cpu::CpuModel::encode_with_images` on the CPU).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ImageRows {
    pub first: usize,
    pub len: usize,
}

/// The part of [`record_encoder_chunk`] that runs `layers` (with the input embedding where they
/// start at 0): plans of consecutive ranges, run in order, do what the whole chunk's plan does,
/// dispatch for dispatch (the layers pass their activations on through the arena).
pub fn record_encoder_layers<'a>(
    rec: &mut Recorder<'a>,
    config: &ModelConfig,
    w: &'a GpuWeights,
    a: &'a Arena,
    chunk: EncoderChunk,
    layers: std::ops::Range<usize>,
) -> Result<(), GpuError> {
    let cfg = &config.text;
    let EncoderChunk { slot, start, tokens, base, image } = chunk;
    if layers.start == 0 {
        // h0 = E[ids]·√H (no self-conditioning, no post-norm in the encoder).
        rec.scope("encoder input");
        for part in &w.embed {
            rec.embed_format(
                &a.ids,
                &part.matrix.buffer,
                part.matrix.format,
                &a.hidden,
                tokens,
                cfg.hidden_size,
                part.start,
                part.rows,
                cfg.embed_scale(),
            )?;
        }
        if image.is_some() {
            let h = cfg.hidden_size;
            rec.axpby(&a.embedded, &a.hidden, tokens * h, (1.0, 0.0), AxpbyRows { row: h, scale: None, gate: Some(&a.image_gate) })?;
        }
    }
    let last = cfg.num_layers() - 1;
    for i in layers {
        rec.scope(format!("encoder layer{i}"));
        // Each layer's closing norms write the next layer's input norm (the last layer has none).
        let chain = Chain { normed_in: i > 0, next_norm: (i < last).then(|| &w.layers[i + 1].norms.input) };
        record_layer_with(rec, config, w, a, i, LayerPass::Encode { slot, start, tokens, base, kv_only: i == last, image }, chain)?;
    }
    Ok(())
}

/// How a recorded layer links to its neighbours through `arena.normed`.
#[derive(Debug, Clone, Copy)]
struct Chain<'a> {
    /// The layer's input norm is already in `normed` (the previous layer's closing norms wrote
    /// it); else the layer normalises `hidden` itself.
    normed_in: bool,
    /// The weight of the norm that follows the layer (the next layer's input norm, or the final
    /// norm), which its closing norms then write into `normed`.
    next_norm: Option<&'a wgpu::Buffer>,
}

/// One attention group of a layer: a canvas of the decoder, or the encoder's chunk.
struct AttentionGroup<'a> {
    /// The layer's cache of the group's slot.
    cache: &'a CacheBuffers,
    /// The group's first row among the pass's rows.
    first_token: usize,
    /// The cache row the group's K/V are written from.
    first_row: usize,
    /// The keys it attends to: cache rows `key_start..key_start + keys`.
    key_start: usize,
    keys: usize,
    /// The scores' softmax over them (the dead columns, or the causal mask).
    mask: SoftmaxParams,
    /// Causal (the encoder): query `i` sees key columns `j < i + causal`, so the scores past them
    /// need not be computed and the values' sums stop there (`GemmParams::causal_n`,
    /// `causal_k`); 0 in the decoder.
    causal: u32,
}

/// Layer `i`'s attention groups in `pass`.
fn attention_groups<'a>(config: &ModelConfig, a: &'a Arena, i: usize, pass: LayerPass<'_>) -> Result<Vec<AttentionGroup<'a>>, GpuError> {
    let cfg = &config.text;
    let spec = &cfg.layers[i];
    let heads = cfg.num_attention_heads;
    match pass {
        LayerPass::Decode { canvases, width: c } => {
            canvases
                .iter()
                .enumerate()
                .map(|(b, cv)| {
                    let cache = a.cache(cv.slot, i)?;
                    // Canvases of one slot (a prompt's reads) each write their K/V `c` rows after
                    // the slot's earlier ones, whose keys their scores mask with the dead columns.
                    let before = canvases[..b].iter().filter(|o| o.slot == cv.slot).count() * c;
                    let v = cv.visible;
                    // The decoder's keys are [cached | dead columns up to a multiple of KEY_PAD |
                    // canvas]: the canvas part and the value products' K then stay aligned for
                    // the tensor cores, and the dead columns (the scores of cache rows past the
                    // visible ones, masked to probability 0) add exact zeros to the values.
                    let cached = if v.len > 0 { v.len.next_multiple_of(KEY_PAD) } else { 0 };
                    // The canvas's K/V go into the rows after the visible ones padded to KEY_PAD
                    // (scratch rows past the context, which the encoder rewrites when it commits
                    // the canvas), so that each attention product runs once over [visible | dead
                    // | canvas].
                    let rows = (cache.keys.size() / a.cache_row_bytes(spec)) as usize;
                    if v.start + cached + before + c > rows {
                        return Err(GpuError::TooLong {
                            len: v.start + v.len,
                            max: rows.saturating_sub(KEY_PAD + before + c),
                            limit_name: "the cache rows that leave room for the canvas after the visible ones (max_context)",
                            hint: "",
                        });
                    }
                    let keys = cached + before + c;
                    let mask = SoftmaxParams {
                        gap_start: v.len as u32,
                        gap_end: (cached + before) as u32,
                        ..SoftmaxParams::plain((heads * c) as u32, keys as u32)
                    };
                    let first_row = v.start + cached + before;
                    Ok(AttentionGroup { cache, first_token: b * c, first_row, key_start: v.start, keys, mask, causal: 0 })
                })
                .collect()
        }
        LayerPass::Encode { slot, start, tokens, base, image, .. } => {
            // The new tokens' positions are their cache rows (DynamicCache.update), less the
            // sliding caches' base in sliding layers; the mask works on positions.
            let (key_start, window, base) = match spec.kind {
                LayerKind::Sliding => (start.saturating_sub(cfg.sliding_kept()), cfg.sliding_window as u32, base),
                LayerKind::Full => (0, 0, 0),
            };
            let keys = (start + tokens - key_start).next_multiple_of(KEY_PAD);
            // An image's soft tokens see their whole span (in the chunk: `EncoderChunk`).
            let span = image.filter(|_| config.images_bidirectional).map_or(0..0, |r| start + r.first..start + r.first + r.len);
            let mask = SoftmaxParams {
                queries: tokens as u32,
                mode: softmax::MODE_CAUSAL,
                key_start: key_start as u32,
                query_start: start as u32,
                window,
                span_start: span.start as u32,
                span_end: span.end as u32,
                ..SoftmaxParams::plain((heads * tokens) as u32, keys as u32)
            };
            // The span's first query sees len − 1 keys past itself; the queries after it see
            // those too (masked by the softmax, they add exact zeros).
            let causal = (start + 1 - key_start + span.len().saturating_sub(1)) as u32;
            let cache = a.cache(slot, i)?;
            let rows = (cache.keys.size() / a.cache_row_bytes(spec)) as usize;
            if base > key_start || key_start - base + keys > rows {
                return Err(GpuError::TooLong {
                    len: start + tokens,
                    max: base + rows - KEY_PAD,
                    limit_name: "the rows of the layer's cache from its first held position",
                    hint: "",
                });
            }
            Ok(vec![AttentionGroup { cache, first_token: 0, first_row: start - base, key_start: key_start - base, keys, mask, causal }])
        }
    }
}

/// Records the attention of queries `t0..t0 + qb` of group `g` (`heads` query heads of `d` over
/// `kv` K/V heads): scores = q · Kᵀ over cache rows `key_start..key_start + keys` into
/// `arena.scores` (`[heads, qb, keys]`), their masked softmax, and P · V into the queries' rows
/// of `arena.attn`.
fn record_attention_block<'a>(
    rec: &mut Recorder<'a>,
    a: &'a Arena,
    g: &AttentionGroup<'a>,
    (t0, qb): (usize, usize),
    (heads, d, kv): (usize, usize, usize),
    tc: bool,
) -> Result<(), GpuError> {
    let (s, row) = (g.keys, kv * d);
    let first = g.first_token + t0;
    // Query i of the block is query t0 + i of the group: it sees key columns j < i + t0 + causal.
    let causal = if g.causal == 0 { 0 } else { g.causal + t0 as u32 };
    let scores = GemmParams {
        a_offset: (first * heads * d) as u32,
        b_offset: (g.key_start * row) as u32,
        causal_n: causal,
        ..attention_scores_params(qb, s, d, heads, kv)
    };
    rec.product(&a.q, Operand::kv_cache(&g.cache.keys, a.cache_format), &a.scores, scores, tc)?;
    let mask = SoftmaxParams {
        rows: (heads * qb) as u32,
        queries: if g.mask.mode == softmax::MODE_CAUSAL { qb as u32 } else { g.mask.queries },
        query_start: g.mask.query_start + t0 as u32,
        ..g.mask
    };
    rec.softmax(&a.scores, mask)?;
    // attn = P · V over the same cache rows as the scores.
    let values = GemmParams {
        b_offset: (g.key_start * row) as u32,
        c_offset: (first * heads * d) as u32,
        causal_k: causal,
        ..attention_values_params(qb, s, d, heads, kv)
    };
    rec.product(&a.scores, Operand::kv_cache(&g.cache.values, a.cache_format), &a.attn, values, tc)
}

/// Records layer `i` alone: reads and updates `arena.hidden` (layer-level parity uses it).
pub fn record_layer<'a>(
    rec: &mut Recorder<'a>,
    config: &ModelConfig,
    w: &'a GpuWeights,
    a: &'a Arena,
    i: usize,
    pass: LayerPass,
) -> Result<(), GpuError> {
    record_layer_with(rec, config, w, a, i, pass, Chain { normed_in: false, next_norm: None })
}

/// [`record_layer`], linked to its neighbours by `chain`.
fn record_layer_with<'a>(
    rec: &mut Recorder<'a>,
    config: &ModelConfig,
    w: &'a GpuWeights,
    a: &'a Arena,
    i: usize,
    pass: LayerPass<'_>,
    chain: Chain<'a>,
) -> Result<(), GpuError> {
    rec.split_k_scratch_as(&a.split_partials, a.split_planned);
    let cfg = &config.text;
    let spec = &cfg.layers[i];
    let l = &w.layers[i];
    // tokens: the rows of one attention group (a canvas, or the encoder chunk); c: the rows this
    // pass computes (every canvas, or the chunk).
    let (tokens, c) = match pass {
        LayerPass::Decode { canvases, width } => (width, canvases.len() * width),
        LayerPass::Encode { tokens, .. } => (tokens, tokens),
    };
    let (h, eps) = (cfg.hidden_size, cfg.rms_norm_eps);
    let (heads, d, kv) = (cfg.num_attention_heads, spec.head_dim, spec.num_kv_heads);
    let group = heads / kv;
    let (cos, sin) = match spec.kind {
        LayerKind::Sliding => (&a.rope_sliding.0, &a.rope_sliding.1),
        LayerKind::Full => (&a.rope_full.0, &a.rope_full.1),
    };

    // Attention inputs.
    let kv_only = matches!(pass, LayerPass::Encode { kv_only: true, .. });
    if !chain.normed_in {
        rec.rmsnorm(&a.hidden, Some(&l.norms.input), &a.dummy, &a.normed, c, h, eps, false, 1.0)?;
    }
    let row = kv * d;

    // q, K and V: `qkv_proj`'s blocks of kv·d rows (q's `group`, K's, V's in sliding layers), as
    // one GEMM batched over the blocks (`[blocks, rows, kv·d]`), or as q's product then K/V's;
    // then, per attention group (a canvas, or the encoder chunk), q_norm and RoPE into q, k_norm
    // and RoPE into its slot's keys, and v_norm (weightless) into its values: in full layers V is
    // the raw K projection, K's rows read again. A split product's partials go straight to their
    // consumer (`Recorder::product_to_consumer`).
    let halves = if l.has_v_proj { 2 } else { 1 };
    let blocks = |count: usize, first: usize| GemmParams {
        batch: count as u32,
        a_batch: 0,
        b_offset: (first * row * h) as u32,
        b_batch: (row * h) as u32,
        c_batch: (c * row) as u32,
        ..linear_params(c, row, h)
    };
    let groups = attention_groups(config, a, i, pass)?;
    // Group g's rows of the input's blocks, its RoPE tables' rows and its q rows.
    let at = |g: &AttentionGroup<'a>| TokensAt {
        x_offset: g.first_token * row,
        block_stride: c * row,
        table_row0: g.first_token,
        q_offset: g.first_token * heads * d,
    };
    let planner = rec.planner();
    let qkv_tc = w.on_tensor_cores(l.qkv_proj.format);
    let half_kv = a.cache_format == WeightFormat::F16;
    if !kv_only
        && planner.merge_qkv(
            l.qkv_proj.format,
            l.qkv_proj.layout,
            &rec.planned(&blocks(group, 0)),
            &rec.planned(&blocks(halves, group)),
            rec.split_scratch_len(),
        )
    {
        let qkv = rec.product_to_consumer(&a.normed, &l.qkv_proj, &a.qkv_raw, blocks(group + halves, 0), qkv_tc)?;
        for g in &groups {
            let v = (&g.cache.values, kv, (group + halves - 1) * c * row + g.first_token * row);
            let k = Some((&l.k_norm, &g.cache.keys, g.first_row * row));
            rec.norm_rope_rows(
                qkv,
                HeadRows { q: Some((&l.q_norm, &a.q, group)), k, v, at: at(g), half_kv },
                (cos, sin),
                tokens,
                kv,
                d,
                eps,
            )?;
        }
    } else {
        if !kv_only {
            let q_raw = rec.product_to_consumer(&a.normed, &l.qkv_proj, &a.qkv_raw, blocks(group, 0), qkv_tc)?;
            for g in &groups {
                let rows = HeadRows { q: Some((&l.q_norm, &a.q, group)), k: None, v: (&a.dummy, 0, 0), at: at(g), half_kv };
                rec.norm_rope_rows(q_raw, rows, (cos, sin), tokens, kv, d, eps)?;
            }
        }
        // Into the same buffer as q's: its norms, recorded first, have read it.
        let kv_raw = rec.product_to_consumer(&a.normed, &l.qkv_proj, &a.qkv_raw, blocks(halves, group), qkv_tc)?;
        for g in &groups {
            let v = (&g.cache.values, kv, (halves - 1) * c * row + g.first_token * row);
            let k = Some((&l.k_norm, &g.cache.keys, g.first_row * row));
            rec.norm_rope_rows(kv_raw, HeadRows { q: None, k, v, at: at(g), half_kv }, (cos, sin), tokens, kv, d, eps)?;
        }
    }
    if kv_only {
        return Ok(());
    }

    // Attention, scaling 1.0, per group, its output into the group's rows of `attn`. Decoder:
    // scores [heads, C, S] over the slot's cache rows key_start.. (visible, dead, canvas).
    // Encoder: scores [heads, T, S] over cache rows key_start..start+T (the new rows included),
    // masked causally (and by the window in sliding layers), S rounded up to a multiple of
    // KEY_PAD (the tensor-core products' K step) with rows past start+T: the causal mask gives
    // them probability 0, and they hold finite values (the cache's rows past the sequence are
    // zeros or earlier K/V), so they add exact zeros. The tensor cores skip the score tiles past
    // the causal mask and stop the values' sums at it (`AttentionGroup::causal`).
    // The F16 mode runs attention's products on the tensor cores too (q, K, V and the
    // probabilities rounded to f16 when staged) where the shapes fit.
    // A group whose scores would not fit `arena.scores` runs its queries in blocks whose scores
    // do (`Arena::query_block`: long contexts only).
    let tc = w.format == WeightFormat::F16;
    for g in &groups {
        let block = a.query_block(heads, tokens, g.keys)?;
        for t0 in (0..tokens).step_by(block) {
            let qb = block.min(tokens - t0);
            record_attention_block(rec, a, g, (t0, qb), (heads, d, kv), tc)?;
        }
    }
    let o = rec.product_to_consumer(&a.attn, &l.o_proj, &a.proj, linear_params(c, h, heads * d), w.on_tensor_cores(l.o_proj.format))?;

    // h = h + post_attention_layernorm(a); with the same dispatch, the dense MLP's input
    // pre_feedforward_layernorm(h) in `normed`, and in `branch_in` the experts' input
    // pre_feedforward_layernorm_2(h) and (c·h further) the router's rms(h)·scale·H^-½.
    // The experts' input as f16 where their gate/up reads f16 (the tensor cores): half the bytes,
    // the same products (on an H200: 346 → 333 µs).
    let root = (h as f64).powf(-0.5) as f32;
    let experts_in = if planner.half_expert_activations(l.experts_gate_up.layout) && h % 4 == 0 { AFormat::F16 } else { AFormat::F32 };
    rec.attention_residual_norms(
        (o, &l.norms.post_attention),
        &a.hidden,
        (&l.norms.pre_ff, &a.normed, 1.0),
        (&l.norms.pre_ff_2, 1.0, experts_in),
        (&l.router_scale, root),
        &a.branch_in,
        (c, h, eps),
    )?;

    // Router on the un-normalised stream → logits → top-k (ahead of the dense MLP, so that the
    // MLP's down projection is the last split product before the closing norms read it).
    let (e, k, ei) = (cfg.num_experts, cfg.top_k_experts, cfg.moe_intermediate_size);
    let router = GemmParams { a_offset: (c * h) as u32, ..linear_params(c, e, h) };
    let logits =
        rec.product_to_consumer(&a.branch_in, &l.router_proj, &a.router_logits, router, w.on_tensor_cores(l.router_proj.format))?;
    rec.router_topk(logits, &l.per_expert_scale, &a.topk_idx, &a.topk_w, c, e, k)?;

    // The two branches' gate/up products, then both activations in one dispatch, then both down
    // projections (the experts' first: measured 1.219–1.221 against 1.224–1.226 ms a layer on an
    // H200 with the dense one first). The dense MLP's gate/up partials (a split product) survive
    // the experts' gate/up, which never splits; its down projection's partials stay untouched
    // until the layer's closing norms (the combine does not split either).
    let inter = cfg.intermediate_size;
    // Experts on pre_feedforward_layernorm_2(h), the first half of `branch_in`.
    let grouped = |n: usize, kk: usize, gather: bool, tile_rows: u32| GroupedGemmParams {
        n: n as u32,
        k: kk as u32,
        groups: e as u32,
        max_rows: c as u32,
        a_rs: kk as u32,
        b_group_stride: (n * kk) as u32,
        c_rs: n as u32,
        gather: u32::from(gather),
        tiles: if tile_rows == 0 { 0 } else { coop_grouped_gemm::table_len((c * k) as u32, e as u32, tile_rows) },
        tile_rows,
        first_group: 0,
        _pad: 0,
    };
    // The dispatch also lists the experts' m tiles that hold slots, for the tensor-core GEMMs'
    // grids (a product whose tile has other rows covers `max_rows` instead); their tile follows
    // the real slots (`Recorder::grouped_product`).
    let tile_rows =
        planner.expert_tile_rows(l.experts_gate_up.format, l.experts_gate_up.layout, (c * k) as u32, &grouped(2 * ei, h, true, 0));
    rec.moe_dispatch(&a.topk_idx, &a.offsets, &a.rows, &a.slot_of, c, k, e, tile_rows)?;
    let gate_up = rec.product_to_consumer(
        &a.normed,
        &l.mlp_gate_up,
        &a.gate_up,
        linear_params(c, 2 * inter, h),
        w.on_tensor_cores(l.mlp_gate_up.format),
    )?;
    rec.grouped_product(
        (&a.branch_in, experts_in),
        &l.experts_gate_up,
        &a.offsets,
        &a.rows,
        &a.expert_gate_up,
        c * k,
        grouped(2 * ei, h, true, tile_rows),
    )?;
    // The experts' activations as f16 where their down projection reads f16 (the tensor cores).
    let expert_format = if planner.half_expert_activations(l.experts_down.layout) { AFormat::F16 } else { AFormat::F32 };
    // Both down projections' inputs scaled by rows into f16's range where the tensor cores round
    // them (a gated activation is bounded by no norm); the closing norms multiply the rows back.
    let scaled = planner.scales_rows(w.on_tensor_cores(l.mlp_down.format) || w.on_tensor_cores(l.experts_down.format));
    let scales = scaled.then_some((&a.act_scale, &a.expert_act_scale));
    rec.gelu_glu_pair((gate_up, &a.act, c, inter), (&a.expert_gate_up, &a.expert_act, c * k, ei, expert_format), scales)?;
    rec.grouped_product(
        (&a.expert_act, expert_format),
        &l.experts_down,
        &a.offsets,
        &a.rows,
        &a.expert_out,
        c * k,
        grouped(h, ei, false, tile_rows),
    )?;
    let mlp = rec.product_to_consumer(&a.act, &l.mlp_down, &a.proj, linear_params(c, h, inter), w.on_tensor_cores(l.mlp_down.format))?;
    // moe = the experts' outputs combined by token;
    // dense = post_feedforward_layernorm_1(mlp) + post_feedforward_layernorm_2(moe);
    // h = (h + post_feedforward_layernorm(dense)) · layer_scalar; and the next norm of h into
    // `normed` (the dense MLP, its last reader, is done); one dispatch where the adapter allows.
    let scalar = match pass {
        LayerPass::Decode { .. } => l.decoder_scalar,
        LayerPass::Encode { .. } => l.encoder_scalar,
    };
    let next = chain.next_norm.map(|w_next| (w_next, &a.normed));
    let combine = Combine {
        y: &a.expert_out,
        idx: &a.topk_idx,
        weights: &a.topk_w,
        slot_of: &a.slot_of,
        slot_scale: scales.map(|(_, slots)| slots),
        top_k: k,
    };
    rec.ffn_residual_norms(
        (mlp, &l.norms.post_ff_1, scales.map(|(rows, _)| rows)),
        (&a.moe, &l.norms.post_ff_2),
        Some(combine),
        &l.norms.post_ff,
        &a.hidden,
        next,
        &a.dummy,
        (c, h, eps),
        scalar,
    )?;
    Ok(())
}

//! What benchmarks, profiles and parity checks need of a [`GpuModel`] beyond generation, behind
//! one trait ([`Instrumentation`]): a cache computed elsewhere uploaded, one decoder layer run
//! alone, the router's last choice, timestamps per dispatch, timed replays, the arena resized.
//! Generation never calls it; `use dg_gpu::Instrumentation` brings it in where it is wanted.

use std::time::Instant;

use dg_kernels::WeightFormat;
use dg_model::ModelConfig;

use super::batch::PlanCache;
use super::{GpuModel, LayerContext, LayerKv};
use crate::arena::Arena;
use crate::context::Created;
use crate::error::GpuError;
use crate::forward::{CanvasAt, LayerPass, Visible, record_layer};
use crate::ops::Recorder;
use crate::weights::GpuWeights;

/// One profiled encoder chunk (`DiffusionGemmaEncoderModel`: the prompt's prefill, a finished
/// canvas's commit): the host's writing of its ids and RoPE tables and recording of its plan, and
/// the GPU's time per dispatch from timestamp queries.
#[derive(Debug, Clone)]
pub struct EncoderProfile {
    /// Tokens encoded.
    pub tokens: usize,
    /// Host time writing the chunk's ids and RoPE tables (`GpuModel::ensure_rope`), after moving
    /// its sliding window where it needs it.
    pub tables_ms: f64,
    /// Host time recording the chunk's plan (every encode records one: the chunk's positions and
    /// the visible cache rows change with every call).
    pub record_ms: f64,
    /// `(scope, kernel, nanoseconds)` per dispatch ([`crate::Plan::profile`]: one pass each).
    pub kernels: Vec<(String, String, f64)>,
}

/// The instrumentation of a [`GpuModel`] (see the module documentation).
pub trait Instrumentation {
    /// Encodes in chunks of at most `tokens` (clamped to 1..=the arena's rows; the default is the
    /// largest). Chunking changes only rounding (spec §4.5); tests use it to exercise chunk seams.
    fn set_prefill_chunk(&mut self, tokens: usize);

    /// Uploads a cache computed elsewhere: `seq_len` tokens encoded so far, and per layer the K/V
    /// the decoder sees (sliding layers: the last W−1), stored from cache row 0.
    fn set_context(&mut self, seq_len: usize, layers: &[LayerContext<'_>]) -> Result<(), GpuError>;

    /// The cached K/V each decoder layer would see now, read back (cache-level parity):
    /// `(keys, values)` per layer, `[tokens, kv_heads, head_dim]`.
    fn read_visible_cache(&mut self) -> Result<Vec<LayerKv>, GpuError>;

    /// Runs one canvas forward with a timestamp around every dispatch:
    /// `(scope, kernel, nanoseconds)` per dispatch (see [`Plan::profile`]).
    fn profile_step(&mut self, canvas: &[u32], self_conditioning: bool) -> Result<Vec<(String, String, f64)>, GpuError>;

    /// Runs decoder layer `i` alone on `hidden` (`[C, H]`, the layer's input) against the current
    /// context and returns its output: the GPU half of layer-level parity. Builds a one-off plan.
    fn run_layer(&mut self, i: usize, hidden: &[f32]) -> Result<Vec<f32>, GpuError>;

    /// What the router of the layer [`Self::run_layer`] last ran saw and chose: its input `[C, H]`
    /// (`rms(h)·scale·H^-½`, f32) and the experts it chose, `[C, k]`.
    fn last_routing(&self) -> Result<(Vec<f32>, Vec<u32>), GpuError>;

    /// Wall time of the decoder layers alone, in normal execution (one compute pass, no
    /// timestamps): records a plan of every layer once, replays it `steps` times, waits for the
    /// device each time, and returns the mean milliseconds per replay of all layers.
    fn time_layers(&mut self, steps: usize) -> Result<f64, GpuError>;

    /// Host milliseconds to encode the self-conditioned forward's commands into a command buffer
    /// (what a step pays before its submit; the buffer is finished and dropped, never run), the
    /// median of `rounds`.
    fn time_encoding(&mut self, rounds: usize) -> Result<f64, GpuError>;

    /// Number of dispatches of the self-conditioned plan.
    fn dispatches(&self) -> usize;

    /// One canvas forward whose self-conditioning input is whatever `sc_probs` holds on the
    /// device (benchmarks); reads the logits back only when `logits` is given.
    fn run_step(&mut self, canvas: &[u32], self_conditioning: bool, logits: Option<&mut [f32]>) -> Result<(), GpuError>;

    /// GPU objects created so far.
    fn created(&self) -> Created;

    /// Query tokens per attention block of a group of `queries` over `keys` keys: all of them
    /// where their scores fit the arena's scores buffer, else fewer (long contexts).
    fn attention_block(&self, queries: usize, keys: usize) -> Result<usize, GpuError>;

    /// Replaces the arena with one of `slots` slots (the weights stay): every sequence is
    /// forgotten and the plans recorded again as they are needed.
    fn set_slots(&mut self, slots: usize) -> Result<(), GpuError>;

    /// Canvases whose logits share one buffer (a batch's vocabulary-sized buffers come in groups
    /// of this many: as many as one storage binding holds).
    fn vocab_group(&self) -> usize;

    /// Runs the last batched step's plan again (its inputs as they are on the device) with a
    /// timestamp around every dispatch: `(scope, kernel, nanoseconds)` ([`Plan::profile`]).
    fn profile_last_batch(&self) -> Result<Vec<(String, String, f64)>, GpuError>;

    /// A timestamp profile of the last read forward's plan (`GpuModel::read_forwards`), by
    /// dispatch: `(scope, kernel, nanoseconds)`; the head at the asked rows is the scope "head".
    fn profile_last_read(&self) -> Result<Vec<(String, String, f64)>, GpuError>;

    /// Tokens in `slot`'s cache.
    fn slot_len(&self, slot: usize) -> Option<usize>;

    /// Encodes `ids` as [`GpuModel::encode`] does (the cache advances the same way), as one chunk
    /// with a timestamp around every dispatch. At most the prefill chunk's tokens.
    fn profile_encode(&mut self, ids: &[u32]) -> Result<EncoderProfile, GpuError>;
}

impl Instrumentation for GpuModel {
    fn set_prefill_chunk(&mut self, tokens: usize) {
        self.prefill_chunk = tokens.clamp(1, self.arena.token_rows);
    }

    fn set_context(&mut self, seq_len: usize, layers: &[LayerContext<'_>]) -> Result<(), GpuError> {
        let cfg = &self.config.text;
        if layers.len() != cfg.num_layers() {
            return Err(GpuError::Length { what: "context layers", got: layers.len(), expected: cfg.num_layers() });
        }
        let mut visible = Vec::with_capacity(layers.len());
        for (i, (l, spec)) in layers.iter().zip(&cfg.layers).enumerate() {
            let per_token = spec.num_kv_heads * spec.head_dim;
            let n = l.keys.len() / per_token;
            let positions = self.arena.cache_positions(spec.kind);
            if n > positions {
                return Err(GpuError::Limit {
                    what: format!("layer {i} context of {n} tokens"),
                    needed: n as u64,
                    limit: positions as u64,
                    limit_name: "the positions the arena's cache of that layer holds",
                });
            }
            if l.values.len() != l.keys.len() || l.keys.len() != n * per_token {
                return Err(GpuError::Length { what: "context values", got: l.values.len(), expected: n * per_token });
            }
            let cache = &self.arena.caches[0][i];
            for (buffer, rows) in [(&cache.keys, l.keys), (&cache.values, l.values)] {
                match self.arena.cache_format {
                    WeightFormat::F16 => {
                        let halves: Vec<u16> = rows.iter().map(|&x| half::f16::from_f32(x).to_bits()).collect();
                        self.ctx.queue.write_buffer(buffer, 0, bytemuck::cast_slice(&halves));
                    }
                    _ => self.ctx.queue.write_buffer(buffer, 0, bytemuck::cast_slice(rows)),
                }
            }
            visible.push(Visible { start: 0, len: n });
        }
        self.seq_lens[0] = seq_len;
        self.sliding_bases[0] = 0;
        self.uploaded_context = true;
        self.prepare_block(visible)
    }

    fn read_visible_cache(&mut self) -> Result<Vec<LayerKv>, GpuError> {
        self.prepare_canvas()?;
        let visible = self.plans.as_ref().map(|p| p.visible.clone()).unwrap_or_default();
        let cfg = &self.config.text;
        visible
            .iter()
            .zip(&cfg.layers)
            .zip(&self.arena.caches[0])
            .map(|((v, spec), cache)| {
                let row = spec.num_kv_heads * spec.head_dim;
                Ok((self.read_cache(&cache.keys, v.start * row, v.len * row)?, self.read_cache(&cache.values, v.start * row, v.len * row)?))
            })
            .collect()
    }

    fn profile_step(&mut self, canvas: &[u32], self_conditioning: bool) -> Result<Vec<(String, String, f64)>, GpuError> {
        self.check_canvas(canvas)?;
        self.ctx.queue.write_buffer(&self.arena.ids, 0, bytemuck::cast_slice(canvas));
        self.prepare_canvas()?;
        let plans = self.block_plans()?;
        let plan = if self_conditioning { &plans.self_conditioned } else { &plans.plain };
        plan.profile(&self.ctx)
    }

    fn run_layer(&mut self, i: usize, hidden: &[f32]) -> Result<Vec<f32>, GpuError> {
        self.prepare_canvas()?;
        let visible = self.block_plans()?.visible[i];
        self.ctx.queue.write_buffer(&self.arena.hidden, 0, bytemuck::cast_slice(hidden));
        let plan = {
            let mut rec = Recorder::new(&self.ctx, &mut self.pipelines);
            record_decoder_layer(&mut rec, (&self.config, &self.weights, &self.arena), i, visible)?;
            rec.finish()?
        };
        plan.run(&self.ctx)?;
        self.ctx.read_f32(&self.arena.hidden, 0, hidden.len())
    }

    fn last_routing(&self) -> Result<(Vec<f32>, Vec<u32>), GpuError> {
        let (c, h, k) = (self.config.canvas_length, self.config.text.hidden_size, self.config.text.top_k_experts);
        Ok((self.ctx.read_f32(&self.arena.branch_in, c * h, c * h)?, self.ctx.read_u32(&self.arena.topk_idx, 0, c * k)?))
    }

    fn time_layers(&mut self, steps: usize) -> Result<f64, GpuError> {
        self.prepare_canvas()?;
        let visible = self.block_plans()?.visible.clone();
        let plan = {
            let mut rec = Recorder::new(&self.ctx, &mut self.pipelines);
            for (i, v) in visible.iter().enumerate() {
                record_decoder_layer(&mut rec, (&self.config, &self.weights, &self.arena), i, *v)?;
            }
            rec.finish()?
        };
        plan.run(&self.ctx)?;
        let start = std::time::Instant::now();
        for _ in 0..steps {
            plan.run(&self.ctx)?;
        }
        Ok(start.elapsed().as_secs_f64() * 1e3 / steps.max(1) as f64)
    }

    fn time_encoding(&mut self, rounds: usize) -> Result<f64, GpuError> {
        self.prepare_canvas()?;
        let plan = &self.block_plans()?.self_conditioned;
        let mut ms: Vec<f64> = (0..rounds.max(1))
            .map(|_| {
                let start = std::time::Instant::now();
                drop(plan.command_buffer(&self.ctx, "encoding timed"));
                start.elapsed().as_secs_f64() * 1e3
            })
            .collect();
        ms.sort_by(f64::total_cmp);
        Ok(ms[ms.len() / 2])
    }

    fn dispatches(&self) -> usize {
        self.plans.as_ref().map_or(0, |p| p.self_conditioned.len())
    }

    fn run_step(&mut self, canvas: &[u32], self_conditioning: bool, logits: Option<&mut [f32]>) -> Result<(), GpuError> {
        self.step(canvas, self_conditioning, logits)
    }

    fn created(&self) -> Created {
        self.ctx.created()
    }

    fn attention_block(&self, queries: usize, keys: usize) -> Result<usize, GpuError> {
        self.arena.query_block(self.config.text.num_attention_heads, queries, keys)
    }

    fn set_slots(&mut self, slots: usize) -> Result<(), GpuError> {
        let max_context = self.arena.max_context;
        self.plans = None;
        self.batch_plans = PlanCache::default();
        self.read_plans = Default::default();
        self.commit_plans.clear();
        self.rope_blocks.clear();
        // The old arena goes first, so that both never hold the device's memory together.
        let cache_format = self.arena.cache_format;
        self.arena = Arena::new(&self.ctx, &self.config, 1, 1, cache_format)?;
        self.arena = Arena::new(&self.ctx, &self.config, max_context, slots, cache_format)?;
        self.sample_plan = super::record_sample_plan(&self.ctx, &mut self.pipelines, &self.config, &self.arena)?;
        self.seq_lens = vec![0; self.arena.slots];
        self.sliding_bases = vec![0; self.arena.slots];
        self.prefill_chunk = self.prefill_chunk.min(self.arena.token_rows);
        self.context_ready = false;
        self.uploaded_context = false;
        Ok(())
    }

    fn vocab_group(&self) -> usize {
        self.arena.vocab_group
    }

    fn profile_last_batch(&self) -> Result<Vec<(String, String, f64)>, GpuError> {
        let plan = self.batch_plans.last_plan().ok_or(GpuError::NoContext)?;
        plan.profile(&self.ctx)
    }

    fn profile_last_read(&self) -> Result<Vec<(String, String, f64)>, GpuError> {
        let plan = self.read_plans.last_plan().ok_or(GpuError::NoContext)?;
        plan.profile(&self.ctx)
    }

    fn slot_len(&self, slot: usize) -> Option<usize> {
        self.seq_lens.get(slot).copied()
    }

    fn profile_encode(&mut self, ids: &[u32]) -> Result<EncoderProfile, GpuError> {
        if ids.len() > self.prefill_chunk {
            return Err(GpuError::Unsupported {
                what: format!("profiling {} tokens as one encoder chunk (at most {})", ids.len(), self.prefill_chunk),
            });
        }
        let ids = self.encoder_ids(0, ids)?;
        self.context_ready = false;
        let clock = Instant::now();
        let chunk = self.begin_encoder_chunk(0, &ids, None)?;
        let tables_ms = clock.elapsed().as_secs_f64() * 1e3;
        let clock = Instant::now();
        let plan = self.encoder_chunk_plan(chunk)?;
        let record_ms = clock.elapsed().as_secs_f64() * 1e3;
        let kernels = plan.profile(&self.ctx)?;
        self.seq_lens[0] += ids.len();
        Ok(EncoderProfile { tokens: ids.len(), tables_ms, record_ms, kernels })
    }
}

/// Decoder layer `i` over one full-width canvas in slot 0 that sees `visible` of the cache.
fn record_decoder_layer<'a>(
    rec: &mut Recorder<'a>,
    (config, weights, arena): (&ModelConfig, &'a GpuWeights, &'a Arena),
    i: usize,
    visible: Visible,
) -> Result<(), GpuError> {
    let canvas = [CanvasAt { slot: 0, visible }];
    record_layer(rec, config, weights, arena, i, LayerPass::Decode { canvases: &canvas, width: config.canvas_length })
}

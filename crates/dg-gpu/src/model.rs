//! The GPU canvas forward behind a small API: weights uploaded once, one activation arena, the
//! dispatch plans built once per block (when the cached context changes) and replayed every step
//! with only input writes, one submit and one readback.
//!
//! The KV cache of the context comes from the encoder (the CPU encoder for now): each block
//! starts with [`GpuModel::set_context`], which uploads every layer's visible K/V and the RoPE
//! tables of the canvas positions.

use dg_model::{LayerKind, ModelConfig, Weights};

use crate::arena::Arena;
use crate::context::{Created, GpuContext, map_read_with};
use crate::error::GpuError;
use crate::forward::{ForwardShape, record_canvas_forward, record_layer};
use crate::ops::Recorder;
use crate::plan::{Pipelines, Plan};
use crate::weights::GpuWeights;

/// Visible cached K/V of one layer, `[tokens, kv_heads, head_dim]` each.
#[derive(Debug, Clone, Copy)]
pub struct LayerContext<'a> {
    pub keys: &'a [f32],
    pub values: &'a [f32],
}

struct BlockPlans {
    visible: Vec<usize>,
    plain: Plan,
    self_conditioned: Plan,
}

/// DiffusionGemma's canvas forward on one GPU.
pub struct GpuModel {
    pub ctx: GpuContext,
    config: ModelConfig,
    pipelines: Pipelines,
    weights: GpuWeights,
    arena: Arena,
    plans: Option<BlockPlans>,
    seq_len: usize,
}

impl std::fmt::Debug for GpuModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuModel").field("adapter", &self.ctx.info.name).field("seq_len", &self.seq_len).finish()
    }
}

impl GpuModel {
    /// Uploads the weights and allocates the arena for contexts of up to `max_context` tokens.
    pub fn new(ctx: GpuContext, config: &ModelConfig, weights: &Weights, max_context: usize) -> Result<Self, GpuError> {
        let gpu_weights = GpuWeights::upload(&ctx, &config.text, weights)?;
        let arena = Arena::new(&ctx, config, max_context)?;
        Ok(GpuModel { ctx, config: config.clone(), pipelines: Pipelines::default(), weights: gpu_weights, arena, plans: None, seq_len: 0 })
    }

    /// Bytes of weights on the device.
    pub fn weight_bytes(&self) -> u64 {
        self.weights.bytes
    }

    /// GPU objects created so far.
    pub fn created(&self) -> Created {
        self.ctx.created()
    }

    /// Sets the cached context for the next canvases: `seq_len` tokens encoded so far, and per
    /// layer the K/V the decoder sees (sliding layers: the last W−1). Rebuilds the plans only when
    /// the visible lengths change.
    pub fn set_context(&mut self, seq_len: usize, layers: &[LayerContext<'_>]) -> Result<(), GpuError> {
        let cfg = &self.config.text;
        assert_eq!(layers.len(), cfg.num_layers(), "one context entry per layer");
        let mut visible = Vec::with_capacity(layers.len());
        for (i, (l, spec)) in layers.iter().zip(&cfg.layers).enumerate() {
            let per_token = spec.num_kv_heads * spec.head_dim;
            let n = l.keys.len() / per_token;
            if n > self.arena.max_context {
                return Err(GpuError::Limit {
                    what: format!("layer {i} context of {n} tokens"),
                    needed: n as u64,
                    limit: self.arena.max_context as u64,
                    limit_name: "max_context of the arena",
                });
            }
            let cache = &self.arena.cache[i];
            self.ctx.queue.write_buffer(&cache.keys, 0, bytemuck::cast_slice(l.keys));
            self.ctx.queue.write_buffer(&cache.values, 0, bytemuck::cast_slice(l.values));
            visible.push(n);
        }
        let c = self.config.canvas_length;
        for (kind, (cos_buf, sin_buf)) in [(LayerKind::Sliding, &self.arena.rope_sliding), (LayerKind::Full, &self.arena.rope_full)] {
            if let Some(spec) = cfg.layers.iter().find(|l| l.kind == kind) {
                let (cos, sin) = spec.rope.cos_sin(spec.head_dim, seq_len, c);
                self.ctx.queue.write_buffer(cos_buf, 0, bytemuck::cast_slice(&cos));
                self.ctx.queue.write_buffer(sin_buf, 0, bytemuck::cast_slice(&sin));
            }
        }
        self.seq_len = seq_len;
        if self.plans.as_ref().is_none_or(|p| p.visible != visible) {
            let plain = self.record(&visible, false)?;
            let self_conditioned = self.record(&visible, true)?;
            self.plans = Some(BlockPlans { visible, plain, self_conditioned });
        }
        Ok(())
    }

    fn record(&mut self, visible: &[usize], self_conditioning: bool) -> Result<Plan, GpuError> {
        let shape = ForwardShape { visible: visible.to_vec(), self_conditioning };
        let mut rec = Recorder::new(&self.ctx, &mut self.pipelines);
        record_canvas_forward(&mut rec, &self.config, &self.weights, &self.arena, &shape)?;
        rec.finish()
    }

    /// Runs one canvas forward with a timestamp around every dispatch:
    /// `(scope, kernel, nanoseconds)` per dispatch (see [`Plan::profile`]).
    pub fn profile_step(&mut self, canvas: &[u32], self_conditioning: bool) -> Result<Vec<(String, String, f64)>, GpuError> {
        let plans = self.plans.as_ref().expect("set_context must run before profiling");
        self.ctx.queue.write_buffer(&self.arena.ids, 0, bytemuck::cast_slice(canvas));
        let plan = if self_conditioning { &plans.self_conditioned } else { &plans.plain };
        plan.profile(&self.ctx)
    }

    /// Runs decoder layer `i` alone on `hidden` (`[C, H]`, the layer's input) against the current
    /// context and returns its output: the GPU half of layer-level parity. Builds a one-off plan.
    pub fn run_layer(&mut self, i: usize, hidden: &[f32]) -> Result<Vec<f32>, GpuError> {
        let visible = self.plans.as_ref().expect("set_context must run before run_layer").visible[i];
        self.ctx.queue.write_buffer(&self.arena.hidden, 0, bytemuck::cast_slice(hidden));
        let plan = {
            let mut rec = Recorder::new(&self.ctx, &mut self.pipelines);
            record_layer(&mut rec, &self.config, &self.weights, &self.arena, i, visible)?;
            rec.finish()?
        };
        plan.run(&self.ctx)?;
        self.ctx.read_f32(&self.arena.hidden, 0, hidden.len())
    }

    /// Wall time of the decoder layers alone, in normal execution (one compute pass, no
    /// timestamps): records a plan of every layer once, replays it `steps` times, waits for the
    /// device each time, and returns the mean milliseconds per replay of all layers.
    pub fn time_layers(&mut self, steps: usize) -> Result<f64, GpuError> {
        let visible = self.plans.as_ref().expect("set_context must run before time_layers").visible.clone();
        let plan = {
            let mut rec = Recorder::new(&self.ctx, &mut self.pipelines);
            for (i, v) in visible.iter().enumerate() {
                record_layer(&mut rec, &self.config, &self.weights, &self.arena, i, *v)?;
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

    /// Number of dispatches of the self-conditioned plan.
    pub fn dispatches(&self) -> usize {
        self.plans.as_ref().map_or(0, |p| p.self_conditioned.len())
    }

    /// One canvas forward: writes the ids (and self-conditioning logits), replays the plan, reads
    /// the logits `[C, V]` back.
    pub fn canvas_forward(&mut self, canvas: &[u32], self_conditioning: Option<&[f32]>, logits: &mut [f32]) -> Result<(), GpuError> {
        if let Some(sc) = self_conditioning {
            self.ctx.queue.write_buffer(&self.arena.sc_probs, 0, bytemuck::cast_slice(sc));
        }
        self.run_step(canvas, self_conditioning.is_some(), Some(logits))
    }

    /// One canvas forward whose self-conditioning input is whatever `sc_probs` holds on the
    /// device (benchmarks); reads the logits back only when `logits` is given.
    pub fn run_step(&mut self, canvas: &[u32], self_conditioning: bool, logits: Option<&mut [f32]>) -> Result<(), GpuError> {
        let plans = self.plans.as_ref().expect("set_context must run before the first canvas forward");
        assert_eq!(canvas.len(), self.config.canvas_length, "canvas length");
        self.ctx.queue.write_buffer(&self.arena.ids, 0, bytemuck::cast_slice(canvas));
        let plan = if self_conditioning { &plans.self_conditioned } else { &plans.plain };
        let bytes = (canvas.len() * self.config.text.vocab_size * 4) as u64;
        let scope = self.ctx.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let mut enc = self.ctx.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("canvas forward") });
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some("canvas forward"), timestamp_writes: None });
            plan.encode(&mut pass);
        }
        if logits.is_some() {
            enc.copy_buffer_to_buffer(&self.arena.logits, 0, &self.arena.staging, 0, bytes);
        }
        self.ctx.queue.submit(Some(enc.finish()));
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(GpuError::Validation { context: "canvas forward".into(), message: e.to_string() });
        }
        match logits {
            Some(out) => {
                map_read_with(&self.ctx, &self.arena.staging, bytes, |data| {
                    bytemuck::cast_slice_mut::<f32, u8>(out).copy_from_slice(data)
                })?;
            }
            None => {
                self.ctx.device.poll(wgpu::PollType::wait_indefinitely()).map_err(|e| GpuError::Readback(e.to_string()))?;
            }
        }
        Ok(())
    }
}

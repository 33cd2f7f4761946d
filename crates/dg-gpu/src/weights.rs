//! The model's weights on the GPU, uploaded once at load.
//!
//! Layouts stay PyTorch's `[out, in]`; the dense and self-conditioning MLPs' gate and up
//! projections are concatenated into one `[2·I, H]` matrix so one GEMM computes both. The
//! embedding (also the tied head) is split by rows into chunks that each fit the adapter's
//! largest storage binding (the real one is 2.95 GB in f32, over the H200's 2 GiB).

use dg_model::{LayerKind, Matrix, TextConfig, Weights};

use crate::context::GpuContext;
use crate::error::GpuError;

/// Rows `start..start+rows` of the embedding.
#[derive(Debug)]
pub struct EmbedChunk {
    pub start: usize,
    pub rows: usize,
    pub buffer: wgpu::Buffer,
}

/// One layer's tensors.
#[derive(Debug)]
pub struct GpuLayer {
    pub kind: LayerKind,
    pub norms: LayerNorms,
    pub q_proj: wgpu::Buffer,
    /// Sliding layers: `[K; V]` projections stacked, `[2·kv·d, H]` (one batched GEMM computes
    /// both); full layers: the K projection alone (V is the raw K projection).
    pub kv_proj: wgpu::Buffer,
    /// Whether `kv_proj` holds a V half.
    pub has_v_proj: bool,
    pub o_proj: wgpu::Buffer,
    pub q_norm: wgpu::Buffer,
    pub k_norm: wgpu::Buffer,
    /// `[2·I, H]`: gate rows then up rows.
    pub mlp_gate_up: wgpu::Buffer,
    pub mlp_down: wgpu::Buffer,
    pub router_proj: wgpu::Buffer,
    pub router_scale: wgpu::Buffer,
    pub per_expert_scale: wgpu::Buffer,
    pub experts_gate_up: wgpu::Buffer,
    pub experts_down: wgpu::Buffer,
    pub encoder_scalar: f32,
    pub decoder_scalar: f32,
}

/// The seven `[H]` norm weights of a layer.
#[derive(Debug)]
pub struct LayerNorms {
    pub input: wgpu::Buffer,
    pub post_attention: wgpu::Buffer,
    pub pre_ff: wgpu::Buffer,
    pub post_ff_1: wgpu::Buffer,
    pub pre_ff_2: wgpu::Buffer,
    pub post_ff_2: wgpu::Buffer,
    pub post_ff: wgpu::Buffer,
}

/// All weights on the device.
#[derive(Debug)]
pub struct GpuWeights {
    pub embed: Vec<EmbedChunk>,
    pub final_norm: wgpu::Buffer,
    pub sc_pre_norm: wgpu::Buffer,
    pub sc_gate_up: wgpu::Buffer,
    pub sc_down: wgpu::Buffer,
    pub layers: Vec<GpuLayer>,
    /// Bytes uploaded.
    pub bytes: u64,
}

struct Uploader<'a> {
    ctx: &'a GpuContext,
    bytes: u64,
}

impl Uploader<'_> {
    fn f32(&mut self, label: &str, data: &[f32]) -> Result<wgpu::Buffer, GpuError> {
        self.bytes += (data.len() * 4) as u64;
        self.ctx.upload(label, data)
    }

    fn concat(&mut self, label: &str, a: &Matrix, b: &Matrix) -> Result<wgpu::Buffer, GpuError> {
        let mut data = Vec::with_capacity(a.data.len() + b.data.len());
        data.extend_from_slice(&a.data);
        data.extend_from_slice(&b.data);
        self.f32(label, &data)
    }
}

impl GpuWeights {
    /// Uploads every tensor; fails with a clear error when one does not fit a binding.
    pub fn upload(ctx: &GpuContext, cfg: &TextConfig, w: &Weights) -> Result<Self, GpuError> {
        let mut up = Uploader { ctx, bytes: 0 };
        let h = cfg.hidden_size;
        let rows_per_chunk = ((ctx.max_binding() / 4) as usize / h).max(1);
        let mut embed = Vec::new();
        let mut start = 0;
        while start < cfg.vocab_size {
            let rows = rows_per_chunk.min(cfg.vocab_size - start);
            let buffer = up.f32(&format!("embed[{start}..]"), &w.embed.data[start * h..(start + rows) * h])?;
            embed.push(EmbedChunk { start, rows, buffer });
            start += rows;
        }
        let sc = &w.self_conditioning;
        let mut layers = Vec::with_capacity(w.layers.len());
        for (i, l) in w.layers.iter().enumerate() {
            let p = |name: &str| format!("layers.{i}.{name}");
            let mut norm = |name: &str, v: &[f32]| up.f32(&p(name), v);
            let norms = LayerNorms {
                input: norm("input_layernorm", &l.input_layernorm)?,
                post_attention: norm("post_attention_layernorm", &l.post_attention_layernorm)?,
                pre_ff: norm("pre_feedforward_layernorm", &l.pre_feedforward_layernorm)?,
                post_ff_1: norm("post_feedforward_layernorm_1", &l.post_feedforward_layernorm_1)?,
                pre_ff_2: norm("pre_feedforward_layernorm_2", &l.pre_feedforward_layernorm_2)?,
                post_ff_2: norm("post_feedforward_layernorm_2", &l.post_feedforward_layernorm_2)?,
                post_ff: norm("post_feedforward_layernorm", &l.post_feedforward_layernorm)?,
            };
            layers.push(GpuLayer {
                kind: l.kind,
                norms,
                q_proj: up.f32(&p("q_proj"), &l.q_proj.data)?,
                kv_proj: match &l.v_proj {
                    Some(v) => up.concat(&p("k_proj+v_proj"), &l.k_proj, v)?,
                    None => up.f32(&p("k_proj"), &l.k_proj.data)?,
                },
                has_v_proj: l.v_proj.is_some(),
                o_proj: up.f32(&p("o_proj"), &l.o_proj.data)?,
                q_norm: up.f32(&p("q_norm"), &l.q_norm)?,
                k_norm: up.f32(&p("k_norm"), &l.k_norm)?,
                mlp_gate_up: up.concat(&p("mlp.gate_up"), &l.mlp_gate, &l.mlp_up)?,
                mlp_down: up.f32(&p("mlp.down_proj"), &l.mlp_down.data)?,
                router_proj: up.f32(&p("router.proj"), &l.router_proj.data)?,
                router_scale: up.f32(&p("router.scale"), &l.router_scale)?,
                per_expert_scale: up.f32(&p("router.per_expert_scale"), &l.per_expert_scale)?,
                experts_gate_up: up.f32(&p("experts.gate_up_proj"), &l.experts.gate_up)?,
                experts_down: up.f32(&p("experts.down_proj"), &l.experts.down)?,
                encoder_scalar: l.encoder_scalar,
                decoder_scalar: l.decoder_scalar,
            });
        }
        Ok(GpuWeights {
            embed,
            final_norm: up.f32("norm", &w.final_norm)?,
            sc_pre_norm: up.f32("self_conditioning.pre_norm", &sc.pre_norm)?,
            sc_gate_up: up.concat("self_conditioning.gate_up", &sc.gate, &sc.up)?,
            sc_down: up.f32("self_conditioning.down_proj", &sc.down.data)?,
            layers,
            bytes: up.bytes,
        })
    }
}

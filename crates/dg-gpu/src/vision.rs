//! The Gemma 4 vision tower and its projection on the GPU (`Gemma4VisionModel` +
//! `Gemma4MultimodalEmbedder`, what `get_image_features` runs; `dg_cpu::vision` is the f32
//! reference), one image at a time, through the planned products and row kernels of the text
//! model: the patch embedding (a product, and the position tables' rows looked up and added),
//! per layer the sandwich-normed attention (q/k/v products, per-head norms, the 2-D RoPE as the
//! rotate-half kernel over half-heads, bidirectional attention over the patches in blocks of
//! queries) and gated MLP, the pooling as a product with the pooling matrix, the standardization
//! as a product with `diag(std_scale)` added to `−std_bias·std_scale`, and the projection. Weights
//! are uploaded as stored (matrices in the upload's format, as the text model's).

use dg_kernels::WeightFormat;
use dg_kernels::gemm::GemmParams;
use dg_kernels::softmax::SoftmaxParams;
use dg_model::{Named, TensorSource, VisionConfig, vision_manifest};

use crate::context::GpuContext;
use crate::error::GpuError;
use crate::ops::{AxpbyRows, Operand, Recorder, attention_scores_params, attention_values_params, linear_params};
use crate::parts::SplitMatrix;
use crate::plan::Pipelines;
use crate::weights::{GpuMatrix, Uploader};

/// Bytes of one block of attention scores (`[heads, queries, patches]`): an image of 10080
/// patches runs its queries in blocks of a few hundred.
const SCORES_BYTES: usize = 256 << 20;

struct VisionLayer {
    input_norm: wgpu::Buffer,
    post_attention_norm: wgpu::Buffer,
    pre_ff_norm: wgpu::Buffer,
    post_ff_norm: wgpu::Buffer,
    q_proj: SplitMatrix,
    k_proj: SplitMatrix,
    v_proj: SplitMatrix,
    o_proj: SplitMatrix,
    q_norm: wgpu::Buffer,
    k_norm: wgpu::Buffer,
    gate_up: SplitMatrix,
    down: SplitMatrix,
}

/// The tower's weights on the device.
struct TowerWeights {
    /// The upload's format of the matrices (as [`crate::GpuWeights`]'s).
    format: WeightFormat,
    input_proj: SplitMatrix,
    /// `[2·position_embedding_size, hidden]`: the x table, then the y table.
    positions: GpuMatrix,
    layers: Vec<VisionLayer>,
    /// `diag(std_scale)` (`[hidden, hidden]`, f32) and the row `−std_bias·std_scale`; or the
    /// identity and zeros where the config does not standardize.
    std_scale: wgpu::Buffer,
    std_shift: wgpu::Buffer,
    projection: SplitMatrix,
}

/// The tower of a model on one GPU: its weights, and the kernels its passes compiled.
pub struct GpuVisionTower {
    config: VisionConfig,
    text_hidden: usize,
    weights: TowerWeights,
    pipelines: Pipelines,
    /// Bytes of weights on the device.
    pub bytes: u64,
}

impl std::fmt::Debug for GpuVisionTower {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuVisionTower").field("layers", &self.weights.layers.len()).field("bytes", &self.bytes).finish()
    }
}

/// Buffers of one image's pass.
struct ImageBuffers {
    pixels: wgpu::Buffer,
    ids_x: wgpu::Buffer,
    ids_y: wgpu::Buffer,
    h: wgpu::Buffer,
    normed: wgpu::Buffer,
    tmp: wgpu::Buffer,
    q: wgpu::Buffer,
    k: wgpu::Buffer,
    v: wgpu::Buffer,
    qn: wgpu::Buffer,
    kn: wgpu::Buffer,
    vn: wgpu::Buffer,
    cos_q: wgpu::Buffer,
    sin_q: wgpu::Buffer,
    cos_k: wgpu::Buffer,
    sin_k: wgpu::Buffer,
    scores: wgpu::Buffer,
    attn: wgpu::Buffer,
    gate_up: wgpu::Buffer,
    act: wgpu::Buffer,
    pool: wgpu::Buffer,
    pooled: wgpu::Buffer,
    zeros: wgpu::Buffer,
    standardized: wgpu::Buffer,
    projected: wgpu::Buffer,
    dummy: wgpu::Buffer,
}

impl GpuVisionTower {
    /// Uploads the tower of `config` (and its projection into `text_hidden`) from `src`, the
    /// matrices in `format`.
    pub fn load(
        ctx: &GpuContext,
        config: &VisionConfig,
        text_hidden: usize,
        src: &(impl TensorSource + ?Sized),
        format: WeightFormat,
    ) -> Result<Self, GpuError> {
        let c = config.clone();
        let manifest: Vec<Named> = vision_manifest(&c, text_hidden).into_iter().map(|(name, shape)| Named { name, shape }).collect();
        let find = |suffix: &str| -> Result<&Named, GpuError> {
            manifest
                .iter()
                .find(|n| n.name.ends_with(suffix))
                .ok_or_else(|| GpuError::Unsupported { what: format!("no vision tensor {suffix}") })
        };
        let hid = c.hidden_size;
        let standardize = if c.standardize {
            let bias = src.get(&find("std_bias")?.name, &[hid])?;
            let scale = src.get(&find("std_scale")?.name, &[hid])?;
            (scale.clone(), bias.iter().zip(&scale).map(|(b, s)| -b * s).collect::<Vec<f32>>())
        } else {
            (vec![1.0; hid], vec![0.0; hid])
        };
        let upload = |up: &mut Uploader<'_, '_, _>| -> Result<_, GpuError> {
            let input_proj = up.linear(find("patch_embedder.input_proj.weight")?)?;
            let positions = up.table(find("position_embedding_table")?, 2 * c.position_embedding_size, hid)?;
            let mut layers = Vec::with_capacity(c.num_layers);
            for l in 0..c.num_layers {
                let at = |what: &str| find(&format!("encoder.layers.{l}.{what}"));
                layers.push(VisionLayer {
                    input_norm: up.vector(at("input_layernorm.weight")?)?,
                    post_attention_norm: up.vector(at("post_attention_layernorm.weight")?)?,
                    pre_ff_norm: up.vector(at("pre_feedforward_layernorm.weight")?)?,
                    post_ff_norm: up.vector(at("post_feedforward_layernorm.weight")?)?,
                    q_proj: up.linear(at("self_attn.q_proj.linear.weight")?)?,
                    k_proj: up.linear(at("self_attn.k_proj.linear.weight")?)?,
                    v_proj: up.linear(at("self_attn.v_proj.linear.weight")?)?,
                    o_proj: up.linear(at("self_attn.o_proj.linear.weight")?)?,
                    q_norm: up.vector(at("self_attn.q_norm.weight")?)?,
                    k_norm: up.vector(at("self_attn.k_norm.weight")?)?,
                    gate_up: up.gate_up(
                        &format!("vision layers.{l}.mlp.gate_up"),
                        at("mlp.gate_proj.linear.weight")?,
                        at("mlp.up_proj.linear.weight")?,
                    )?,
                    down: up.linear(at("mlp.down_proj.linear.weight")?)?,
                });
            }
            let projection = up.linear(find("embedding_projection.weight")?)?;
            Ok((input_proj, positions, layers, projection))
        };
        let ((input_proj, positions, layers, projection), bytes, _) = Uploader::run(ctx, src, format, upload)?;
        let (scale, shift) = standardize;
        let mut diag = vec![0f32; hid * hid];
        for (i, s) in scale.iter().enumerate() {
            diag[i * hid + i] = *s;
        }
        let std_scale = ctx.storage_buffer("vision std scale", (hid * hid * 4) as u64)?;
        ctx.queue.write_buffer(&std_scale, 0, bytemuck::cast_slice(&diag));
        let std_shift = ctx.storage_buffer("vision std shift", (hid * 4) as u64)?;
        ctx.queue.write_buffer(&std_shift, 0, bytemuck::cast_slice(&shift));
        let weights = TowerWeights { format, input_proj, positions, layers, std_scale, std_shift, projection };
        Ok(GpuVisionTower {
            config: c,
            text_hidden,
            weights,
            pipelines: Pipelines::default(),
            bytes: bytes + ((hid * hid + hid) * 4) as u64,
        })
    }

    /// The upload's format of the tower's matrices (a quantized checkpoint's keep their blocks).
    pub fn format(&self) -> WeightFormat {
        self.weights.format
    }

    /// One image's rows for the text encoder, `[P / k², text hidden]`, from its processed patches
    /// (`pixel_values` `[P, 3·patch²]` in [0, 1], `positions` (x, y) each); the patches must pool
    /// into whole soft tokens (as `dg_cpu::vision::vision_tower` checks).
    pub fn image_embeddings(&mut self, ctx: &GpuContext, pixel_values: &[f32], positions: &[[u32; 2]]) -> Result<Vec<f32>, GpuError> {
        let c = &self.config;
        let (p, k) = (positions.len(), c.pooling_kernel_size);
        if pixel_values.len() != p * c.patch_width() {
            return Err(GpuError::Length { what: "pixel values", got: pixel_values.len(), expected: p * c.patch_width() });
        }
        let grid_width = positions.iter().map(|q| q[0] as usize).max().unwrap_or(0) + 1;
        let tokens = p / (k * k);
        let size = c.position_embedding_size;
        let bad = positions
            .iter()
            .find(|&&[x, y]| x as usize >= size || y as usize >= size || x as usize / k + (grid_width / k) * (y as usize / k) >= tokens);
        if p == 0 || !p.is_multiple_of(k * k) || !grid_width.is_multiple_of(k) || bad.is_some() {
            return Err(GpuError::Unsupported {
                what: format!(
                    "{p} patches (grid width {grid_width}) that do not pool by {k}x{k} into whole soft tokens, or a position outside the table of {size}"
                ),
            });
        }
        let b = ImageBuffers::new(ctx, c, self.text_hidden, pixel_values, positions, tokens)?;
        let mut rec = Recorder::new(ctx, &mut self.pipelines);
        record(ctx, &mut rec, c, self.text_hidden, &self.weights, &b, (p, tokens))?;
        let plan = rec.finish()?;
        plan.run(ctx)?;
        ctx.read_f32(&b.projected, 0, tokens * self.text_hidden)
    }
}

/// Queries of a block of attention scores over `p` keys (at least 1), its scores at most
/// [`SCORES_BYTES`] or the tuning's cap (`Tuning::scores_bytes`).
fn query_block(ctx: &GpuContext, heads: usize, p: usize) -> usize {
    let bytes = ctx.tuning.scores_bytes.map_or(SCORES_BYTES, |cap| (cap as usize).min(SCORES_BYTES));
    (bytes / (4 * heads * p).max(1)).clamp(1, p)
}

/// The RoPE tables of `heads` heads of `d` a patch as the rotate-half kernel reads them over
/// half-heads (`[P·heads·2, d/4]` each, half-head `2·h + axis` rotating by the patch's x or y
/// coordinate: `apply_multidimensional_rope`, `dg_cpu::vision`'s `AxialRope`).
fn axial_tables(c: &VisionConfig, positions: &[[u32; 2]], heads: usize) -> (Vec<f32>, Vec<f32>) {
    let (half, quarter) = (c.head_dim / 2, c.head_dim / 4);
    let inv_freq: Vec<f32> = (0..quarter).map(|i| 1.0f32 / (c.rope_theta.powf(f64::from((2 * i) as f32 / half as f32)) as f32)).collect();
    let n = positions.len() * heads * 2 * quarter;
    let (mut cos, mut sin) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for pos in positions {
        for _ in 0..heads {
            for axis in pos {
                for &f in &inv_freq {
                    let theta = f64::from(*axis as f32 * f);
                    cos.push(theta.cos() as f32);
                    sin.push(theta.sin() as f32);
                }
            }
        }
    }
    (cos, sin)
}

impl TowerWeights {
    /// Whether products with `m` run on the tensor cores: as the text model's
    /// (`GpuWeights::on_tensor_cores`: in the F16 mode, its F16 and quantized matrices).
    fn tc(&self, m: &SplitMatrix) -> bool {
        self.format == WeightFormat::F16 && (m.format == WeightFormat::F16 || m.format.is_quantized())
    }
}

impl ImageBuffers {
    fn new(
        ctx: &GpuContext,
        c: &VisionConfig,
        text_hidden: usize,
        pixel_values: &[f32],
        positions: &[[u32; 2]],
        tokens: usize,
    ) -> Result<Self, GpuError> {
        let (p, hid, k) = (positions.len(), c.hidden_size, c.pooling_kernel_size);
        let (heads, kv, d, inter) = (c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size);
        let f = |label: &str, n: usize| ctx.storage_buffer(label, (n.max(1) * 4) as u64);
        let put = |label: &str, data: &[u8]| -> Result<wgpu::Buffer, GpuError> {
            let b = ctx.storage_buffer(label, data.len().max(4) as u64)?;
            ctx.queue.write_buffer(&b, 0, data);
            Ok(b)
        };
        // The patch embedder's input 2·(x − 0.5), as `dg_cpu::vision` computes it.
        let scaled: Vec<f32> = pixel_values.iter().map(|&v| 2.0 * (v - 0.5)).collect();
        let ids_x: Vec<u32> = positions.iter().map(|q| q[0]).collect();
        let ids_y: Vec<u32> = positions.iter().map(|q| c.position_embedding_size as u32 + q[1]).collect();
        let (cos_q, sin_q) = axial_tables(c, positions, heads);
        let (cos_k, sin_k) = axial_tables(c, positions, kv);
        // Soft token x/k + (W/k)·(y/k) is the mean of its k² patches.
        let grid_width = positions.iter().map(|q| q[0] as usize).max().unwrap_or(0) + 1;
        let mut pool = vec![0f32; tokens * p];
        for (i, &[x, y]) in positions.iter().enumerate() {
            let t = x as usize / k + (grid_width / k) * (y as usize / k);
            pool[t * p + i] = 1.0 / (k * k) as f32;
        }
        Ok(ImageBuffers {
            pixels: put("vision pixels", bytemuck::cast_slice(&scaled))?,
            ids_x: put("vision ids x", bytemuck::cast_slice(&ids_x))?,
            ids_y: put("vision ids y", bytemuck::cast_slice(&ids_y))?,
            h: f("vision h", p * hid)?,
            normed: f("vision normed", p * hid)?,
            tmp: f("vision tmp", p * hid)?,
            q: f("vision q", p * heads * d)?,
            k: f("vision k", p * kv * d)?,
            v: f("vision v", p * kv * d)?,
            qn: f("vision qn", p * heads * d)?,
            kn: f("vision kn", p * kv * d)?,
            vn: f("vision vn", p * kv * d)?,
            cos_q: put("vision cos q", bytemuck::cast_slice(&cos_q))?,
            sin_q: put("vision sin q", bytemuck::cast_slice(&sin_q))?,
            cos_k: put("vision cos k", bytemuck::cast_slice(&cos_k))?,
            sin_k: put("vision sin k", bytemuck::cast_slice(&sin_k))?,
            scores: f("vision scores", heads * query_block(ctx, heads, p) * p)?,
            attn: f("vision attn", p * heads * d)?,
            gate_up: f("vision gate_up", p * 2 * inter)?,
            act: f("vision act", p * inter)?,
            pool: put("vision pool", bytemuck::cast_slice(&pool))?,
            pooled: f("vision pooled", tokens * hid)?,
            zeros: put("vision zero ids", bytemuck::cast_slice(&vec![0u32; tokens]))?,
            standardized: f("vision standardized", tokens * hid)?,
            projected: f("vision projected", tokens * text_hidden)?,
            dummy: f("vision dummy", 4)?,
        })
    }
}

/// Records one image's pass of `p` patches into `tokens` soft tokens (see the module's overview).
fn record<'a>(
    ctx: &GpuContext,
    rec: &mut Recorder<'a>,
    c: &VisionConfig,
    text_hidden: usize,
    w: &'a TowerWeights,
    b: &'a ImageBuffers,
    (p, tokens): (usize, usize),
) -> Result<(), GpuError> {
    let (hid, heads, kv, d, inter) = (c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size);
    let eps = c.rms_norm_eps as f32;
    let size = c.position_embedding_size;
    // Patch embedding: input_proj(2·(x − 0.5)) + table[x] + table[size + y].
    rec.scope("vision patch embedding");
    rec.product(&b.pixels, &w.input_proj, &b.h, linear_params(p, hid, c.patch_width()), w.tc(&w.input_proj))?;
    for ids in [&b.ids_x, &b.ids_y] {
        rec.embed_format(ids, &w.positions.buffer, w.positions.format, &b.tmp, p, hid, 0, 2 * size, 1.0)?;
        rec.axpby(&b.tmp, &b.h, p * hid, (1.0, 1.0), AxpbyRows::default())?;
    }
    let block = query_block(ctx, heads, p);
    for (l, layer) in w.layers.iter().enumerate() {
        rec.scope(format!("vision layer{l}"));
        rec.rmsnorm(&b.h, Some(&layer.input_norm), &b.dummy, &b.normed, p, hid, eps, false, 1.0)?;
        rec.product(&b.normed, &layer.q_proj, &b.q, linear_params(p, heads * d, hid), w.tc(&layer.q_proj))?;
        rec.product(&b.normed, &layer.k_proj, &b.k, linear_params(p, kv * d, hid), w.tc(&layer.k_proj))?;
        rec.product(&b.normed, &layer.v_proj, &b.v, linear_params(p, kv * d, hid), w.tc(&layer.v_proj))?;
        rec.rmsnorm(&b.q, Some(&layer.q_norm), &b.dummy, &b.qn, p * heads, d, eps, false, 1.0)?;
        rec.rmsnorm(&b.k, Some(&layer.k_norm), &b.dummy, &b.kn, p * kv, d, eps, false, 1.0)?;
        rec.rmsnorm(&b.v, None, &b.dummy, &b.vn, p * kv, d, eps, false, 1.0)?;
        rec.rope(&b.qn, &b.cos_q, &b.sin_q, p * heads * 2, 1, d / 4)?;
        rec.rope(&b.kn, &b.cos_k, &b.sin_k, p * kv * 2, 1, d / 4)?;
        // Bidirectional attention with scaling 1 over every patch, in blocks of queries.
        for t0 in (0..p).step_by(block) {
            let qb = block.min(p - t0);
            let scores = GemmParams { a_offset: (t0 * heads * d) as u32, ..attention_scores_params(qb, p, d, heads, kv) };
            rec.product(&b.qn, Operand::kv_cache(&b.kn, WeightFormat::F32), &b.scores, scores, false)?;
            rec.softmax(&b.scores, SoftmaxParams::plain((heads * qb) as u32, p as u32))?;
            let values = GemmParams { c_offset: (t0 * heads * d) as u32, ..attention_values_params(qb, p, d, heads, kv) };
            rec.product(&b.scores, Operand::kv_cache(&b.vn, WeightFormat::F32), &b.attn, values, false)?;
        }
        rec.product(&b.attn, &layer.o_proj, &b.tmp, linear_params(p, hid, heads * d), w.tc(&layer.o_proj))?;
        rec.rmsnorm(&b.tmp, Some(&layer.post_attention_norm), &b.dummy, &b.h, p, hid, eps, true, 1.0)?;
        rec.rmsnorm(&b.h, Some(&layer.pre_ff_norm), &b.dummy, &b.normed, p, hid, eps, false, 1.0)?;
        rec.product(&b.normed, &layer.gate_up, &b.gate_up, linear_params(p, 2 * inter, hid), w.tc(&layer.gate_up))?;
        rec.gelu_glu_fused(&b.gate_up, &b.act, p, inter, None)?;
        rec.product(&b.act, &layer.down, &b.tmp, linear_params(p, hid, inter), w.tc(&layer.down))?;
        rec.rmsnorm(&b.tmp, Some(&layer.post_ff_norm), &b.dummy, &b.h, p, hid, eps, true, 1.0)?;
    }
    // Pooling (`Gemma4VisionPooler`: the mean of each k×k block, times √hidden) as a product with
    // the pooling matrix; the standardization `(x − bias)·scale`; the projection's weightless norm
    // and product.
    rec.scope("vision pooling and projection");
    let root = (hid as f64).sqrt() as f32;
    rec.product(
        &b.pool,
        Operand::kv_cache(&b.h, WeightFormat::F32),
        &b.pooled,
        GemmParams { alpha: root, ..GemmParams::new(tokens as u32, hid as u32, p as u32) },
        false,
    )?;
    rec.embed(&b.zeros, &w.std_shift, &b.standardized, tokens, hid, 0, 1, 1.0)?;
    rec.product(&b.pooled, &w.std_scale, &b.standardized, GemmParams { accumulate: 1, ..linear_params(tokens, hid, hid) }, false)?;
    rec.rmsnorm(&b.standardized, None, &b.dummy, &b.pooled, tokens, hid, eps, false, 1.0)?;
    rec.product(&b.pooled, &w.projection, &b.projected, linear_params(tokens, text_hidden, hid), w.tc(&w.projection))
}

//! The model's weights on the GPU, uploaded once at load.
//!
//! Layouts stay PyTorch's `[out, in]`; the dense and self-conditioning MLPs' gate and up
//! projections are concatenated into one `[2·I, H]` matrix so one GEMM computes both, and a
//! layer's q, K and V projections into one matrix of blocks ([`GpuLayer::qkv_proj`]). The
//! embedding (also the tied head) is split by rows into chunks that each fit the adapter's
//! largest storage binding (the real one is 2.95 GB in f32, over the H200's 2 GiB).
//!
//! Matrices are stored in a [`WeightFormat`] chosen at load: f32, BF16 (2 bytes per parameter,
//! exact for a BF16 checkpoint; the kernels unpack it and compute in f32), or the F16 mode (2 bytes
//! per parameter): every matrix that runs on tensor cores where the device has them (q, K/V, o,
//! dense and self-conditioning MLPs, router, experts) in F16, the embedding in BF16 (its products,
//! the soft embedding and the head, run in the f32 kernels, which unpack BF16 with a shift and F16
//! with a conversion). Norm weights, scales and scalars (a few thousand values per layer) stay f32. [`GpuWeights::upload_streaming`] uploads
//! one layer at a time from a [`TensorSource`], so the host never holds the whole model in f32
//! (the real 30-layer model is 104 GB in f32).

use dg_kernels::WeightFormat;
use dg_model::{LayerKind, LayerWeights, TensorSource, TextConfig, Weights};
use rayon::prelude::*;

use crate::context::GpuContext;
use crate::error::GpuError;

/// A weight matrix on the device, in its storage format.
#[derive(Debug)]
pub struct GpuMatrix {
    pub buffer: wgpu::Buffer,
    pub format: WeightFormat,
    pub layout: MatrixLayout,
}

/// How a matrix's elements are ordered in its buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatrixLayout {
    /// PyTorch's row-major `[out, in]` (per expert for the experts).
    RowMajor,
    /// F16 weights in K panels: expert weights `[experts, in / PANEL, out, PANEL]`, the layout the
    /// tensor-core grouped GEMM streams (`dg_kernels::coop_grouped_gemm`); a dense projection
    /// `[in / PANEL, out, PANEL]` (the stacked K and V projections each on its own), which the
    /// tensor-core GEMM streams as `dg_kernels::coop_gemm::BLayout::NkPanels`. Only the tensor
    /// cores read it: the upload panels a matrix only where they take its products.
    KPanels,
}

/// Rows `start..start+rows` of the embedding.
#[derive(Debug)]
pub struct EmbedChunk {
    pub start: usize,
    pub rows: usize,
    pub matrix: GpuMatrix,
}

/// One layer's tensors.
#[derive(Debug)]
pub struct GpuLayer {
    pub kind: LayerKind,
    pub norms: LayerNorms,
    /// The q, K and (sliding layers) V projections stacked, `[q; K; V]`: `heads/kv + 2` blocks of
    /// `[kv·d, H]` (`heads/kv + 1` in full layers, where V is the raw K projection), so that one
    /// GEMM batched over the blocks computes any run of them (q's alone, K and V, or all).
    pub qkv_proj: GpuMatrix,
    /// Whether `qkv_proj` ends with a V block.
    pub has_v_proj: bool,
    pub o_proj: GpuMatrix,
    pub q_norm: wgpu::Buffer,
    pub k_norm: wgpu::Buffer,
    /// `[2·I, H]`: gate rows then up rows.
    pub mlp_gate_up: GpuMatrix,
    pub mlp_down: GpuMatrix,
    pub router_proj: GpuMatrix,
    pub router_scale: wgpu::Buffer,
    pub per_expert_scale: wgpu::Buffer,
    pub experts_gate_up: GpuMatrix,
    pub experts_down: GpuMatrix,
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
    pub sc_gate_up: GpuMatrix,
    pub sc_down: GpuMatrix,
    pub layers: Vec<GpuLayer>,
    /// Storage format of the matrices.
    pub format: WeightFormat,
    /// Bytes uploaded.
    pub bytes: u64,
    /// Parameters uploaded.
    pub parameters: u64,
}

struct Uploader<'a> {
    ctx: &'a GpuContext,
    format: WeightFormat,
    bytes: u64,
    parameters: u64,
}

/// f32 → packed 16-bit words with `pack`, in parallel over blocks of an even length (so pairs
/// never straddle blocks).
fn pack_parallel(data: &[f32], pack: fn(&[f32]) -> Vec<u32>) -> Vec<u32> {
    data.par_chunks(1 << 20).flat_map_iter(pack).collect()
}

impl Uploader<'_> {
    fn f32(&mut self, label: &str, data: &[f32]) -> Result<wgpu::Buffer, GpuError> {
        self.bytes += (data.len() * 4) as u64;
        self.parameters += data.len() as u64;
        self.ctx.upload(label, data)
    }

    /// A projection matrix, in the upload's format.
    fn matrix(&mut self, label: &str, data: &[f32]) -> Result<GpuMatrix, GpuError> {
        self.matrix_as(label, data, self.format)
    }

    /// The embedding (and tied head): in the F16 mode it stays BF16, whose unpack (a shift) is
    /// cheaper than F16's in the f32 soft-embedding kernel; the tensor-core head converts it.
    fn embedding_matrix(&mut self, label: &str, data: &[f32]) -> Result<GpuMatrix, GpuError> {
        let format = if self.format == WeightFormat::F16 { WeightFormat::Bf16 } else { self.format };
        self.matrix_as(label, data, format)
    }

    fn matrix_as(&mut self, label: &str, data: &[f32], format: WeightFormat) -> Result<GpuMatrix, GpuError> {
        let buffer = match format {
            WeightFormat::F32 => self.f32(label, data)?,
            WeightFormat::Bf16 | WeightFormat::F16 => {
                let pack = if format == WeightFormat::Bf16 { dg_kernels::pack_bf16 } else { dg_kernels::pack_f16 };
                self.words(label, &pack_parallel(data, pack), data.len())?
            }
        };
        Ok(GpuMatrix { buffer, format, layout: MatrixLayout::RowMajor })
    }

    /// Uploads `parameters` 16-bit values packed in `words`, counting them.
    fn words(&mut self, label: &str, words: &[u32], parameters: usize) -> Result<wgpu::Buffer, GpuError> {
        self.bytes += (words.len() * 4) as u64;
        self.parameters += parameters as u64;
        self.ctx.upload(label, words)
    }

    /// One `[out, in]` projection, as [`Self::projection_blocks`] uploads it.
    fn projection(&mut self, label: &str, m: &dg_model::Matrix) -> Result<GpuMatrix, GpuError> {
        self.projection_blocks(label, &m.data, 1, m.rows, m.cols)
    }

    /// A projection's `blocks` stacked `[n, k]` matrices (`data` holds `blocks · n · k` values): in
    /// the F16 mode on a device with cooperative matrices, each block in K panels when the
    /// tensor-core GEMM takes its products (`[m, k] · Wᵀ` for any m); otherwise as
    /// [`Self::matrix`].
    fn projection_blocks(&mut self, label: &str, data: &[f32], blocks: usize, n: usize, k: usize) -> Result<GpuMatrix, GpuError> {
        use dg_kernels::coop_gemm::PANEL;
        use dg_kernels::coop_grouped_gemm::pack_f16_panels;
        assert_eq!(data.len(), blocks * n * k, "{label}: {} values for {blocks} blocks of [{n}, {k}]", data.len());
        if crate::planner::Planner::of(self.ctx).projection_layout(self.format, n, k) == MatrixLayout::RowMajor {
            return self.matrix(label, data);
        }
        let words: Vec<u32> = data.par_chunks(n * k).flat_map_iter(|block| pack_f16_panels(block, n, k, PANEL as usize)).collect();
        let buffer = self.words(label, &words, data.len())?;
        Ok(GpuMatrix { buffer, format: WeightFormat::F16, layout: MatrixLayout::KPanels })
    }

    /// A layer's `[q; K; V]` projections in blocks of K's rows ([`GpuLayer::qkv_proj`]).
    fn qkv_projection(&mut self, label: &str, l: &LayerWeights) -> Result<GpuMatrix, GpuError> {
        let (k, cols) = (&l.k_proj, l.k_proj.cols);
        if k.rows == 0 || !l.q_proj.rows.is_multiple_of(k.rows) || l.q_proj.cols != cols || l.v_proj.as_ref().is_some_and(|v| v.rows != k.rows || v.cols != cols) {
            return Err(GpuError::Unsupported {
                what: format!("{label}: q [{}, {}], k [{}, {cols}]{}: q's rows are not whole blocks of k's", l.q_proj.rows, l.q_proj.cols, k.rows, l.v_proj.as_ref().map_or(String::new(), |v| format!(", v [{}, {}]", v.rows, v.cols))),
            });
        }
        let mut data = Vec::with_capacity(l.q_proj.data.len() + 2 * k.data.len());
        data.extend_from_slice(&l.q_proj.data);
        data.extend_from_slice(&k.data);
        if let Some(v) = &l.v_proj {
            data.extend_from_slice(&v.data);
        }
        let blocks = data.len() / (k.rows * cols);
        self.projection_blocks(label, &data, blocks, k.rows, cols)
    }

    /// Expert weights `[experts, n, k]`: in the F16 mode on a device with cooperative matrices, in
    /// K panels for the tensor-core grouped GEMM when a tile fits the shape; otherwise as
    /// [`Self::matrix`].
    fn experts(&mut self, label: &str, data: &[f32], n: usize, k: usize) -> Result<GpuMatrix, GpuError> {
        use dg_kernels::coop_grouped_gemm::{PANEL, pack_f16_panels};
        if crate::planner::Planner::of(self.ctx).experts_layout(self.format, n, k) == MatrixLayout::RowMajor {
            return self.matrix(label, data);
        }
        let words: Vec<u32> = data.par_chunks(n * k).flat_map_iter(|group| pack_f16_panels(group, n, k, PANEL as usize)).collect();
        let buffer = self.words(label, &words, data.len())?;
        Ok(GpuMatrix { buffer, format: WeightFormat::F16, layout: MatrixLayout::KPanels })
    }

    fn layer(&mut self, i: usize, l: &LayerWeights) -> Result<GpuLayer, GpuError> {
        let p = |name: &str| format!("layers.{i}.{name}");
        let mut norm = |name: &str, v: &[f32]| self.f32(&p(name), v);
        let norms = LayerNorms {
            input: norm("input_layernorm", &l.input_layernorm)?,
            post_attention: norm("post_attention_layernorm", &l.post_attention_layernorm)?,
            pre_ff: norm("pre_feedforward_layernorm", &l.pre_feedforward_layernorm)?,
            post_ff_1: norm("post_feedforward_layernorm_1", &l.post_feedforward_layernorm_1)?,
            pre_ff_2: norm("pre_feedforward_layernorm_2", &l.pre_feedforward_layernorm_2)?,
            post_ff_2: norm("post_feedforward_layernorm_2", &l.post_feedforward_layernorm_2)?,
            post_ff: norm("post_feedforward_layernorm", &l.post_feedforward_layernorm)?,
        };
        Ok(GpuLayer {
            kind: l.kind,
            norms,
            qkv_proj: self.qkv_projection(&p("q_proj+k_proj+v_proj"), l)?,
            has_v_proj: l.v_proj.is_some(),
            o_proj: self.projection(&p("o_proj"), &l.o_proj)?,
            q_norm: self.f32(&p("q_norm"), &l.q_norm)?,
            k_norm: self.f32(&p("k_norm"), &l.k_norm)?,
            mlp_gate_up: self.projection_blocks(&p("mlp.gate_up"), &[&l.mlp_gate.data[..], &l.mlp_up.data].concat(), 1, 2 * l.mlp_gate.rows, l.mlp_gate.cols)?,
            mlp_down: self.projection(&p("mlp.down_proj"), &l.mlp_down)?,
            router_proj: self.projection(&p("router.proj"), &l.router_proj)?,
            router_scale: self.f32(&p("router.scale"), &l.router_scale)?,
            per_expert_scale: self.f32(&p("router.per_expert_scale"), &l.per_expert_scale)?,
            experts_gate_up: self.experts(&p("experts.gate_up_proj"), &l.experts.gate_up, 2 * l.experts.intermediate, l.experts.hidden)?,
            experts_down: self.experts(&p("experts.down_proj"), &l.experts.down, l.experts.hidden, l.experts.intermediate)?,
            encoder_scalar: l.encoder_scalar,
            decoder_scalar: l.decoder_scalar,
        })
    }

    /// Everything outside the layers; `layers` empty.
    fn shared(&mut self, cfg: &TextConfig, w: &Weights) -> Result<GpuWeights, GpuError> {
        let h = cfg.hidden_size;
        let rows_per_chunk = ((self.ctx.max_binding() / self.format.bytes() as u64) as usize / h).max(1);
        let mut embed = Vec::new();
        let mut start = 0;
        while start < cfg.vocab_size {
            let rows = rows_per_chunk.min(cfg.vocab_size - start);
            let matrix = self.embedding_matrix(&format!("embed[{start}..]"), &w.embed.data[start * h..(start + rows) * h])?;
            embed.push(EmbedChunk { start, rows, matrix });
            start += rows;
        }
        let sc = &w.self_conditioning;
        Ok(GpuWeights {
            embed,
            final_norm: self.f32("norm", &w.final_norm)?,
            sc_pre_norm: self.f32("self_conditioning.pre_norm", &sc.pre_norm)?,
            sc_gate_up: self.projection_blocks("self_conditioning.gate_up", &[&sc.gate.data[..], &sc.up.data].concat(), 1, 2 * sc.gate.rows, sc.gate.cols)?,
            sc_down: self.projection("self_conditioning.down_proj", &sc.down)?,
            layers: Vec::with_capacity(cfg.num_layers()),
            format: self.format,
            bytes: 0,
            parameters: 0,
        })
    }
}

impl GpuWeights {
    /// Uploads every tensor with matrices in `format`; fails with a clear error when one does not
    /// fit a binding.
    pub fn upload(ctx: &GpuContext, cfg: &TextConfig, w: &Weights, format: WeightFormat) -> Result<Self, GpuError> {
        let mut up = Uploader { ctx, format, bytes: 0, parameters: 0 };
        let mut gw = up.shared(cfg, w)?;
        for (i, l) in w.layers.iter().enumerate() {
            gw.layers.push(up.layer(i, l)?);
        }
        (gw.bytes, gw.parameters) = (up.bytes, up.parameters);
        Ok(gw)
    }

    /// Uploads from `src` one layer at a time (the host holds one layer's f32 tensors at most).
    pub fn upload_streaming(ctx: &GpuContext, cfg: &TextConfig, src: &mut impl TensorSource, format: WeightFormat) -> Result<Self, UploadError> {
        let mut up = Uploader { ctx, format, bytes: 0, parameters: 0 };
        let shared = Weights::build_shared(src, cfg)?;
        let mut gw = up.shared(cfg, &shared)?;
        drop(shared);
        for i in 0..cfg.num_layers() {
            let l = LayerWeights::load(src, cfg, i)?;
            gw.layers.push(up.layer(i, &l)?);
        }
        (gw.bytes, gw.parameters) = (up.bytes, up.parameters);
        Ok(gw)
    }
}

/// Errors of a streaming upload: reading a tensor, or the GPU.
#[derive(Debug, thiserror::Error)]
pub enum UploadError {
    #[error(transparent)]
    Model(#[from] dg_model::ModelError),
    #[error(transparent)]
    Gpu(#[from] GpuError),
}

//! The model's weights on the GPU, uploaded once at load.
//!
//! Layouts stay PyTorch's `[out, in]`; the dense and self-conditioning MLPs' gate and up
//! projections are concatenated into one `[2·I, H]` matrix so one GEMM computes both, and a
//! layer's q, K and V projections into one matrix of blocks ([`GpuLayer::qkv_proj`]). A tensor
//! larger than the adapter's largest storage binding is split across several ([`crate::parts`]):
//! the embedding (also the tied head) by vocabulary rows (the real one is 2.95 GB in f32, over the
//! H200's 2 GiB), dense matrices by rows, the experts by whole experts.
//!
//! Matrices are stored in a [`WeightFormat`] chosen at load: f32, BF16 (2 bytes per parameter,
//! exact for a BF16 checkpoint; the kernels unpack it and compute in f32), or the F16 mode (2 bytes
//! per parameter): every matrix that runs on tensor cores where the device has them (q, K/V, o,
//! dense and self-conditioning MLPs, router, experts) in F16, the embedding in BF16 (its products,
//! the soft embedding and the head, run in the f32 kernels, which unpack BF16 with a shift and F16
//! with a conversion). Norm weights, scales and scalars (a few thousand values per layer) stay f32.
//!
//! [`GpuWeights::upload`] reads a [`TensorSource`] tensor by tensor in its stored dtype and packs
//! each buffer from those bytes a piece at a time ([`crate::pack`]), so the host never holds an
//! f32 copy of the model (the real 30-layer model is 104 GB in f32) nor a whole tensor's packed
//! copy; every piece goes through one reused staging buffer ([`crate::staging`]).

use dg_kernels::WeightFormat;
use dg_model::{LayerKind, LayerNames, Named, SharedNames, StoredDtype, StoredTensor, TensorSource, TextConfig};

use crate::context::GpuContext;
use crate::error::GpuError;
use crate::pack::{Order, Packing};
use crate::parts::{Parts, SplitMatrix, stored_rows};
use crate::staging::StagingBelt;

/// A weight matrix (or one part of one, [`SplitMatrix`]) on the device, in its storage format.
#[derive(Debug)]
pub struct GpuMatrix {
    pub buffer: wgpu::Buffer,
    pub format: WeightFormat,
    pub layout: MatrixLayout,
}

pub use crate::shapes::MatrixLayout;

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
    pub qkv_proj: SplitMatrix,
    /// Whether `qkv_proj` ends with a V block.
    pub has_v_proj: bool,
    pub o_proj: SplitMatrix,
    pub q_norm: wgpu::Buffer,
    pub k_norm: wgpu::Buffer,
    /// `[2·I, H]`: gate rows then up rows.
    pub mlp_gate_up: SplitMatrix,
    pub mlp_down: SplitMatrix,
    pub router_proj: SplitMatrix,
    pub router_scale: wgpu::Buffer,
    pub per_expert_scale: wgpu::Buffer,
    pub experts_gate_up: SplitMatrix,
    pub experts_down: SplitMatrix,
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
    pub sc_gate_up: SplitMatrix,
    pub sc_down: SplitMatrix,
    pub layers: Vec<GpuLayer>,
    /// Storage format of the matrices.
    pub format: WeightFormat,
    /// Bytes uploaded.
    pub bytes: u64,
    /// Parameters uploaded.
    pub parameters: u64,
}

/// Bytes of a buffer converted on the host at a time: an upload holds one piece, never a tensor.
const PIECE: usize = 16 << 20;
/// Size of the staging buffer the upload reuses ([`StagingBelt`]): the host memory, beyond one
/// piece, that an upload of any size takes.
const STAGING: u64 = 128 << 20;

/// How far an upload has come, for a progress display.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UploadProgress {
    /// Parameters uploaded so far, and in all.
    pub parameters: u64,
    pub total_parameters: u64,
    /// Bytes of the source's tensors read so far (in their stored dtypes).
    pub stored_bytes: u64,
}

/// The format a matrix stacked from parts stored as `dtypes` is held in by an upload in `upload`:
/// their ggml blocks where all parts store the same block type (a quantized checkpoint's matrices
/// stay in their blocks); otherwise the upload's format (dequantized where they are quantized).
/// `dg info`'s memory count reads the same rule.
pub fn matrix_format(dtypes: &[StoredDtype], upload: WeightFormat) -> WeightFormat {
    let quant = crate::pack::quant_format;
    match dtypes.first().and_then(|&d| quant(d)) {
        Some(first) if dtypes.iter().all(|&d| quant(d) == Some(first)) => WeightFormat::Quantized(first),
        _ => upload,
    }
}

/// The element format the embedding lookup and the tied head read the embedding in, stored as
/// `stored`, in an upload in `upload`: BF16 in the F16 mode (its unpack, a shift, is cheaper than
/// F16's in the f32 soft-embedding kernel; the tensor-core head converts it), f32 where it is
/// stored quantized (its dequantized values exactly; BF16 would round them), else the upload's.
pub fn embedding_format(stored: StoredDtype, upload: WeightFormat) -> WeightFormat {
    match upload {
        WeightFormat::F16 => WeightFormat::Bf16,
        _ if stored.is_quantized() => WeightFormat::F32,
        f => f,
    }
}

fn stored_format(parts: &[&StoredTensor], upload: WeightFormat) -> WeightFormat {
    matrix_format(&parts.iter().map(|p| p.dtype).collect::<Vec<_>>(), upload)
}

pub(crate) struct Uploader<'a, 'p, S: TensorSource + ?Sized> {
    ctx: &'a GpuContext,
    src: &'a S,
    format: WeightFormat,
    bytes: u64,
    belt: StagingBelt,
    progress: UploadProgress,
    on_progress: &'p mut dyn FnMut(&UploadProgress),
}

impl<'a, 'p, S: TensorSource + ?Sized> Uploader<'a, 'p, S> {
    /// `t` as the source stores it (borrowed from the source, not from the uploader).
    fn stored(&self, t: &Named) -> Result<StoredTensor<'a>, GpuError> {
        let src: &'a S = self.src;
        Ok(src.stored(&t.name, &t.shape)?)
    }

    /// Creates the buffer of `packing` and writes it piece by piece, counting what it read.
    fn put(&mut self, label: &str, packing: &Packing) -> Result<wgpu::Buffer, GpuError> {
        let size = packing.bytes();
        let buffer = self.ctx.storage_buffer(label, size as u64)?;
        let mut piece = vec![0u8; PIECE.min(size)];
        for offset in (0..size).step_by(PIECE) {
            let piece = &mut piece[..PIECE.min(size - offset)];
            packing.fill(offset, piece);
            self.belt.write(self.ctx, &buffer, offset as u64, piece)?;
        }
        if packing.overflowed() {
            return Err(GpuError::OutOfRange { tensor: label.to_string(), format: "F16", max: 65504.0 });
        }
        self.bytes += size as u64;
        self.progress.parameters += packing.len() as u64;
        self.progress.stored_bytes += packing.stored_bytes() as u64;
        (self.on_progress)(&self.progress);
        Ok(buffer)
    }

    /// Uploads tensors of `src` with `upload` (matrices in `format`, each as
    /// [`GpuWeights::upload`] stores it); returns what it made and the bytes and parameters
    /// uploaded.
    pub(crate) fn run<T>(
        ctx: &'a GpuContext,
        src: &'a S,
        format: WeightFormat,
        upload: impl FnOnce(&mut Uploader<'a, '_, S>) -> Result<T, GpuError>,
    ) -> Result<(T, u64, u64), GpuError> {
        let progress = UploadProgress { parameters: 0, total_parameters: 0, stored_bytes: 0 };
        let mut silent = |_: &UploadProgress| {};
        let belt = StagingBelt::new(ctx, STAGING)?;
        let mut up = Uploader { ctx, src, format, bytes: 0, belt, progress, on_progress: &mut silent };
        let made = upload(&mut up)?;
        up.belt.flush(ctx)?;
        Ok((made, up.bytes, up.progress.parameters))
    }

    /// A table of `rows` rows of `cols` row-major in the upload's format (an embedding's), in one
    /// binding.
    pub(crate) fn table(&mut self, t: &Named, rows: usize, cols: usize) -> Result<GpuMatrix, GpuError> {
        let stored = self.stored(t)?;
        let format = embedding_format(stored.dtype, self.format);
        let cut = Parts::rows(&t.name, rows, Self::bytes_for(&t.name, format, cols)?, rows, false, self.ctx.weight_binding())?;
        if cut.len() != 1 {
            return Err(GpuError::Unsupported { what: format!("{}: a table over one binding", t.name) });
        }
        let mut m = self.split_matrix(&t.name, &[&stored], (format, MatrixLayout::RowMajor), cols, 1, cut, 0)?;
        Ok(m.pieces.remove(0))
    }

    /// A vector (norm weight, scale) in f32.
    pub(crate) fn vector(&mut self, t: &Named) -> Result<wgpu::Buffer, GpuError> {
        let stored = self.stored(t)?;
        self.put(&t.name, &Packing::new(vec![&stored], WeightFormat::F32, Order::RowMajor))
    }

    /// A scalar, kept on the host.
    fn scalar(&mut self, t: &Named) -> Result<f32, GpuError> {
        let value = self.src.get(&t.name, &t.shape)?[0];
        self.progress.parameters += 1;
        Ok(value)
    }

    /// `stacked` (tensors of `cols` columns stacked by rows) as a matrix in `format` and
    /// `layout`, one buffer per part of `parts` (ranges of units of `unit_rows` rows), each packed
    /// from its rows' stored bytes; in K panels of `panel_rows` rows (at most a part's rows).
    #[allow(clippy::too_many_arguments)]
    fn split_matrix(
        &mut self,
        label: &str,
        stacked: &[&StoredTensor],
        (format, layout): (WeightFormat, MatrixLayout),
        cols: usize,
        unit_rows: usize,
        parts: Parts,
        panel_rows: usize,
    ) -> Result<SplitMatrix, GpuError> {
        let mut pieces = Vec::with_capacity(parts.len());
        for range in parts.ranges() {
            let rows = range.start * unit_rows..range.end * unit_rows;
            let views = stored_rows(label, stacked, cols, rows.clone())?;
            let order = match layout {
                MatrixLayout::RowMajor => Order::RowMajor,
                MatrixLayout::KPanels => {
                    // F16 panels of `coop_gemm::PANEL` columns, ggml blocks in panels one block wide.
                    let panel = match format {
                        WeightFormat::Quantized(q) => q.block_len(),
                        _ => dg_kernels::coop_gemm::PANEL as usize,
                    };
                    Order::KPanels { rows: panel_rows.min(rows.len()), cols, panel }
                }
            };
            let name = if parts.len() == 1 { label.to_string() } else { format!("{label}[{}..{}]", range.start, range.end) };
            let buffer = self.put(&name, &Packing::new(views.iter().collect(), format, order))?;
            pieces.push(GpuMatrix { buffer, format, layout });
        }
        Ok(SplitMatrix { parts, unit_elems: unit_rows * cols, pieces, format, layout })
    }

    /// The format a matrix planned as `format` is stored in when laid out in `layout`: K panels
    /// hold F16, or a quantized format's blocks.
    fn panelled(format: WeightFormat, layout: MatrixLayout) -> WeightFormat {
        match layout {
            MatrixLayout::KPanels if !format.is_quantized() => WeightFormat::F16,
            _ => format,
        }
    }

    /// The bytes a binding of `format` holds for its elements: the weight binding's, less the
    /// table a quantized type's buffer holds after its blocks (`QuantFormat::table`).
    fn blocks_binding(&self, format: WeightFormat) -> u64 {
        let table = match format {
            WeightFormat::Quantized(q) => 4 * q.table().len() as u64,
            _ => 0,
        };
        self.ctx.weight_binding() - table
    }

    /// Bytes `elements` elements of `what` take in `format`.
    fn bytes_for(what: &str, format: WeightFormat, elements: usize) -> Result<u64, GpuError> {
        format
            .bytes_for(elements)
            .map(|b| b as u64)
            .ok_or_else(|| GpuError::Unsupported { what: format!("{what}: rows of {elements} values are not whole {format:?} blocks") })
    }

    /// A projection: `parts` stacked by rows into blocks of `[n, k]` matrices (in their quantized
    /// blocks as stored where they all store the same ggml type, [`matrix_format`]): in the F16
    /// mode on a device with cooperative matrices, each block in K panels when the tensor-core GEMM
    /// takes its products (`[m, k] · Wᵀ` for any m); otherwise row-major in the upload's format.
    /// Split by rows where it exceeds a binding ([`Parts::rows`]).
    fn projection(&mut self, label: &str, parts: &[&StoredTensor], n: usize, k: usize) -> Result<SplitMatrix, GpuError> {
        let format = stored_format(parts, self.format);
        let layout = self.ctx.planner().projection_layout(format, n, k, self.format == WeightFormat::F16);
        let format = Self::panelled(format, layout);
        let rows = parts.iter().map(|p| p.len()).sum::<usize>() / k.max(1);
        let row_bytes = Self::bytes_for(label, format, k)?;
        let cut = Parts::rows(label, rows, row_bytes, n, self.ctx.coop_matrix, self.blocks_binding(format))?;
        self.split_matrix(label, parts, (format, layout), k, 1, cut, n)
    }

    /// One `[out, in]` projection.
    pub(crate) fn linear(&mut self, t: &Named) -> Result<SplitMatrix, GpuError> {
        let stored = self.stored(t)?;
        self.projection(&t.name, &[&stored], t.shape[0], t.shape[1])
    }

    /// A gate and an up projection stacked into one `[2·I, H]` matrix.
    pub(crate) fn gate_up(&mut self, label: &str, gate: &Named, up: &Named) -> Result<SplitMatrix, GpuError> {
        let (g, u) = (self.stored(gate)?, self.stored(up)?);
        self.projection(label, &[&g, &u], 2 * gate.shape[0], gate.shape[1])
    }

    /// A layer's `[q; K; V]` projections in blocks of K's rows ([`GpuLayer::qkv_proj`]).
    fn qkv_projection(&mut self, label: &str, n: &LayerNames) -> Result<SplitMatrix, GpuError> {
        let (rows, cols) = (n.k_proj.shape[0], n.k_proj.shape[1]);
        if rows == 0 || !n.q_proj.shape[0].is_multiple_of(rows) || n.q_proj.shape[1] != cols {
            return Err(GpuError::Unsupported {
                what: format!("{label}: q {:?}, k {:?}: q's rows are not whole blocks of k's", n.q_proj.shape, n.k_proj.shape),
            });
        }
        let (q, k) = (self.stored(&n.q_proj)?, self.stored(&n.k_proj)?);
        let v = n.v_proj.as_ref().map(|v| self.stored(v)).transpose()?;
        let parts: Vec<&StoredTensor> = [&q, &k].into_iter().chain(v.as_ref()).collect();
        self.projection(label, &parts, rows, cols)
    }

    /// Expert weights `[experts, n, k]`: in the F16 mode on a device with cooperative matrices, in
    /// K panels for the tensor-core grouped GEMM when a tile fits the shape; otherwise row-major
    /// (in their quantized blocks where stored so). Split by whole experts where they exceed a
    /// binding ([`Parts::experts`]).
    fn experts(&mut self, t: &Named) -> Result<SplitMatrix, GpuError> {
        let (e, n, k) = (t.shape[0], t.shape[1], t.shape[2]);
        let stored = self.stored(t)?;
        let format = stored_format(&[&stored], self.format);
        let layout = self.ctx.planner().experts_layout(format, n, k, self.format == WeightFormat::F16);
        let format = Self::panelled(format, layout);
        let cut = Parts::experts(&t.name, e, Self::bytes_for(&t.name, format, n * k)?, self.blocks_binding(format))?;
        self.split_matrix(&t.name, &[&stored], (format, layout), k, n, cut, n)
    }

    fn layer(&mut self, cfg: &TextConfig, i: usize) -> Result<GpuLayer, GpuError> {
        let n = LayerNames::new(cfg, i);
        let [input, post_attention, pre_ff, post_ff_1, pre_ff_2, post_ff_2, post_ff] = &n.norms;
        let norms = LayerNorms {
            input: self.vector(input)?,
            post_attention: self.vector(post_attention)?,
            pre_ff: self.vector(pre_ff)?,
            post_ff_1: self.vector(post_ff_1)?,
            pre_ff_2: self.vector(pre_ff_2)?,
            post_ff_2: self.vector(post_ff_2)?,
            post_ff: self.vector(post_ff)?,
        };
        Ok(GpuLayer {
            kind: n.kind,
            norms,
            qkv_proj: self.qkv_projection(&format!("layers.{i}.q_proj+k_proj+v_proj"), &n)?,
            has_v_proj: n.v_proj.is_some(),
            o_proj: self.linear(&n.o_proj)?,
            q_norm: self.vector(&n.q_norm)?,
            k_norm: self.vector(&n.k_norm)?,
            mlp_gate_up: self.gate_up(&format!("layers.{i}.mlp.gate_up"), &n.mlp_gate, &n.mlp_up)?,
            mlp_down: self.linear(&n.mlp_down)?,
            router_proj: self.linear(&n.router_proj)?,
            router_scale: self.vector(&n.router_scale)?,
            per_expert_scale: self.vector(&n.per_expert_scale)?,
            experts_gate_up: self.experts(&n.experts_gate_up)?,
            experts_down: self.experts(&n.experts_down)?,
            encoder_scalar: self.scalar(&n.encoder_scalar)?,
            decoder_scalar: self.scalar(&n.decoder_scalar)?,
        })
    }

    /// Everything outside the layers; `layers` empty. The embedding (and tied head) is split by
    /// vocabulary rows into chunks that each fit a binding ([`Parts::rows`]); in the F16 mode it stays BF16, whose unpack (a
    /// shift) is cheaper than F16's in the f32 soft-embedding kernel; the tensor-core head
    /// converts it.
    fn shared(&mut self, cfg: &TextConfig) -> Result<GpuWeights, GpuError> {
        let n = SharedNames::new(cfg);
        let h = cfg.hidden_size;
        let stored = self.stored(&n.embed)?;
        let format = embedding_format(stored.dtype, self.format);
        let cut = Parts::rows(
            &n.embed.name,
            cfg.vocab_size,
            Self::bytes_for(&n.embed.name, format, h)?,
            cfg.vocab_size,
            self.ctx.coop_matrix,
            self.ctx.weight_binding(),
        )?;
        let table = self.split_matrix(&n.embed.name, &[&stored], (format, MatrixLayout::RowMajor), h, 1, cut, 0)?;
        let embed =
            table.parts.ranges().iter().zip(table.pieces).map(|(r, matrix)| EmbedChunk { start: r.start, rows: r.len(), matrix }).collect();
        drop(stored);
        Ok(GpuWeights {
            embed,
            final_norm: self.vector(&n.final_norm)?,
            sc_pre_norm: self.vector(&n.sc_pre_norm)?,
            sc_gate_up: self.gate_up("self_conditioning.gate_up", &n.sc_gate, &n.sc_up)?,
            sc_down: self.linear(&n.sc_down)?,
            layers: Vec::with_capacity(cfg.num_layers()),
            format: self.format,
            bytes: 0,
            parameters: 0,
        })
    }
}

impl GpuWeights {
    /// Whether the products of a matrix stored as `matrix` run on the tensor cores (where the device has them and a tile
    /// takes the shape): in the F16 mode, its F16 matrices and those kept in ggml blocks (which
    /// the tensor-core kernels dequantize into their f16 tiles). In the BF16 and f32 modes every
    /// product keeps f32 arithmetic, quantized ones included.
    pub fn on_tensor_cores(&self, matrix: WeightFormat) -> bool {
        self.format == WeightFormat::F16 && (matrix == WeightFormat::F16 || matrix.is_quantized())
    }

    /// Uploads every tensor of `src` with matrices in `format`, tensor by tensor from their stored
    /// bytes (the host holds one piece of a buffer at a time); fails with a clear error naming
    /// the tensor when one is missing, misshapen or does not fit a binding.
    pub fn upload(ctx: &GpuContext, cfg: &TextConfig, src: &(impl TensorSource + ?Sized), format: WeightFormat) -> Result<Self, GpuError> {
        Self::upload_with_progress(ctx, cfg, src, format, &mut |_| {})
    }

    /// [`Self::upload`], calling `on_progress` after every buffer.
    pub fn upload_with_progress(
        ctx: &GpuContext,
        cfg: &TextConfig,
        src: &(impl TensorSource + ?Sized),
        format: WeightFormat,
        on_progress: &mut dyn FnMut(&UploadProgress),
    ) -> Result<Self, GpuError> {
        let total_parameters = dg_model::tensor_manifest(cfg).iter().map(|(_, s)| s.iter().product::<usize>() as u64).sum();
        let progress = UploadProgress { parameters: 0, total_parameters, stored_bytes: 0 };
        let belt = StagingBelt::new(ctx, STAGING)?;
        let mut up = Uploader { ctx, src, format, bytes: 0, belt, progress, on_progress };
        let mut gw = up.shared(cfg)?;
        for i in 0..cfg.num_layers() {
            gw.layers.push(up.layer(cfg, i)?);
        }
        up.belt.flush(ctx)?;
        (gw.bytes, gw.parameters) = (up.bytes, up.progress.parameters);
        Ok(gw)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_matrix_keeps_blocks_only_where_all_its_parts_store_one_block_type() {
        let q8 = WeightFormat::Quantized(dg_kernels::format::QuantFormat::Q8_0);
        assert_eq!(matrix_format(&[StoredDtype::Q8_0, StoredDtype::Q8_0], WeightFormat::Bf16), q8);
        assert_eq!(matrix_format(&[StoredDtype::Q8_0, StoredDtype::BF16], WeightFormat::Bf16), WeightFormat::Bf16);
        assert_eq!(matrix_format(&[StoredDtype::Q8_0, StoredDtype::Q4_K], WeightFormat::F32), WeightFormat::F32);
        assert_eq!(matrix_format(&[StoredDtype::BF16], WeightFormat::F16), WeightFormat::F16);
    }

    #[test]
    fn the_embedding_is_bf16_in_the_f16_mode_and_f32_where_stored_quantized() {
        assert_eq!(embedding_format(StoredDtype::Q4_K, WeightFormat::F16), WeightFormat::Bf16);
        assert_eq!(embedding_format(StoredDtype::Q4_K, WeightFormat::Bf16), WeightFormat::F32);
        assert_eq!(embedding_format(StoredDtype::BF16, WeightFormat::Bf16), WeightFormat::Bf16);
    }
}

//! The Gemma 4 vision tower and its projection, f32 reference, one function per HF module
//! (`modeling_gemma4.py`): `Gemma4VisionPatchEmbedder`, `Gemma4VisionRotaryEmbedding` with
//! `apply_multidimensional_rope`, `Gemma4VisionEncoderLayer` (attention with scale 1, bidirectional
//! over the image's patches), `Gemma4VisionPooler`, the standardization of `Gemma4VisionModel` and
//! `Gemma4MultimodalEmbedder`. One image at a time, without HF's padding rows (see docs/vision.md).

use dg_model::{VisionConfig, VisionLayerWeights, VisionWeights};

use crate::attention::{AttnShape, Mask, attention};
use crate::linalg::linear;
use crate::ops::{gelu_glu, rms_norm_rows};

/// Inputs the tower cannot take; each names the value at fault.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum VisionError {
    #[error("pixel values: {got} values for {patches} patches of {width}")]
    PixelLength { got: usize, patches: usize, width: usize },
    #[error("{patches} patches do not pool by {kernel}x{kernel} into whole soft tokens")]
    Pooling { patches: usize, kernel: usize },
    #[error("patch position ({x}, {y}) does not lie in a grid of whole {kernel}x{kernel} pooling blocks")]
    Grid { x: u32, y: u32, kernel: usize },
    #[error("patch position ({x}, {y}) is outside the position table of {size}")]
    Position { x: u32, y: u32, size: usize },
}

/// One image's patches as the processor gives them: `[P, 3·patch²]` values in [0, 1] and (x, y) each.
#[derive(Debug, Clone, Copy)]
pub struct ImagePatches<'a> {
    pub pixel_values: &'a [f32],
    pub positions: &'a [[u32; 2]],
}

/// The tower's soft tokens `[P / k², hidden]` (after pooling, scaling and standardization).
pub fn vision_tower(c: &VisionConfig, w: &VisionWeights, image: ImagePatches<'_>) -> Result<Vec<f32>, VisionError> {
    let p = image.positions.len();
    let k = c.pooling_kernel_size;
    if image.pixel_values.len() != p * c.patch_width() {
        return Err(VisionError::PixelLength { got: image.pixel_values.len(), patches: p, width: c.patch_width() });
    }
    if p == 0 || !p.is_multiple_of(k * k) {
        return Err(VisionError::Pooling { patches: p, kernel: k });
    }
    let mut h = patch_embed(c, w, image)?;
    let rope = AxialRope::new(c, image.positions);
    for layer in &w.layers {
        encoder_layer(c, layer, &rope, &mut h);
    }
    let mut soft = pool(c, &h, image.positions)?;
    if let Some((bias, scale)) = &w.standardize {
        for row in soft.chunks_exact_mut(c.hidden_size) {
            row.iter_mut().zip(bias).zip(scale).for_each(|((v, &b), &s)| *v = (*v - b) * s);
        }
    }
    Ok(soft)
}

/// One image's rows for the text encoder (`get_image_features`): the tower, then [`embed_vision`];
/// `[P / k², text hidden]`.
pub fn image_embeddings(c: &VisionConfig, w: &VisionWeights, image: ImagePatches<'_>) -> Result<Vec<f32>, VisionError> {
    Ok(embed_vision(c, w, &vision_tower(c, w, image)?))
}

/// `Gemma4MultimodalEmbedder`: weightless RMSNorm, then the projection into the text model's width.
pub fn embed_vision(c: &VisionConfig, w: &VisionWeights, soft: &[f32]) -> Vec<f32> {
    let tokens = soft.len() / c.hidden_size;
    let mut normed = soft.to_vec();
    rms_norm_rows(&mut normed, c.hidden_size, None, c.rms_norm_eps as f32);
    let mut out = vec![0f32; tokens * w.embedding_projection.rows];
    linear(&mut out, &normed, tokens, &w.embedding_projection);
    out
}

/// `Gemma4VisionPatchEmbedder`: `input_proj(2·(x − 0.5)) + (table[0][x] + table[1][y])`.
fn patch_embed(c: &VisionConfig, w: &VisionWeights, image: ImagePatches<'_>) -> Result<Vec<f32>, VisionError> {
    let (hid, p, size) = (c.hidden_size, image.positions.len(), c.position_embedding_size);
    let scaled: Vec<f32> = image.pixel_values.iter().map(|&v| 2.0 * (v - 0.5)).collect();
    let mut h = vec![0f32; p * hid];
    linear(&mut h, &scaled, p, &w.input_proj);
    let table = &w.position_embedding_table;
    for (row, &[x, y]) in h.chunks_exact_mut(hid).zip(image.positions) {
        if x as usize >= size || y as usize >= size {
            return Err(VisionError::Position { x, y, size });
        }
        let tx = &table[x as usize * hid..(x as usize + 1) * hid];
        let ty = &table[(size + y as usize) * hid..(size + y as usize + 1) * hid];
        row.iter_mut().zip(tx).zip(ty).for_each(|((v, &a), &b)| *v += a + b);
    }
    Ok(h)
}

/// `Gemma4VisionRotaryEmbedding` + `apply_multidimensional_rope`: the head's first half rotates
/// by `x · inv_freq`, its second half by `y · inv_freq`, each half rotate-half style (pairs j, j + d/4).
struct AxialRope {
    quarter: usize,
    /// Per patch, `[cos_x | cos_y]` and `[sin_x | sin_y]`, `d/2` values each.
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl AxialRope {
    fn new(c: &VisionConfig, positions: &[[u32; 2]]) -> Self {
        let (half, quarter) = (c.head_dim / 2, c.head_dim / 4);
        // 1 / θ^(2i / (d/2)), f32 as torch computes it.
        let inv_freq: Vec<f32> =
            (0..quarter).map(|i| 1.0f32 / (c.rope_theta.powf(f64::from((2 * i) as f32 / half as f32)) as f32)).collect();
        let (mut cos, mut sin) = (Vec::with_capacity(positions.len() * half), Vec::with_capacity(positions.len() * half));
        for pos in positions {
            for axis in pos {
                for &f in &inv_freq {
                    let theta = f64::from(*axis as f32 * f);
                    cos.push(theta.cos() as f32);
                    sin.push(theta.sin() as f32);
                }
            }
        }
        AxialRope { quarter, cos, sin }
    }

    /// Rotates every head of `x: [P, heads, d]` in place.
    fn apply(&self, x: &mut [f32], heads: usize) {
        let (q, d) = (self.quarter, 4 * self.quarter);
        for (t, token) in x.chunks_exact_mut(heads * d).enumerate() {
            for head in token.chunks_exact_mut(d) {
                for (axis, part) in head.chunks_exact_mut(2 * q).enumerate() {
                    let at = t * 2 * q + axis * q;
                    let (cos, sin) = (&self.cos[at..at + q], &self.sin[at..at + q]);
                    let (lo, hi) = part.split_at_mut(q);
                    for i in 0..q {
                        let (x1, x2) = (lo[i], hi[i]);
                        lo[i] = x1 * cos[i] + (-x2) * sin[i];
                        hi[i] = x2 * cos[i] + x1 * sin[i];
                    }
                }
            }
        }
    }
}

/// `Gemma4VisionEncoderLayer`: sandwich-normed attention and gated MLP, each added to the residual.
fn encoder_layer(c: &VisionConfig, w: &VisionLayerWeights, rope: &AxialRope, h: &mut [f32]) {
    let (hid, d, eps) = (c.hidden_size, c.head_dim, c.rms_norm_eps as f32);
    let p = h.len() / hid;
    let mut a = h.to_vec();
    rms_norm_rows(&mut a, hid, Some(&w.input_layernorm), eps);
    let project = |m: &dg_model::Matrix| {
        let mut out = vec![0f32; p * m.rows];
        linear(&mut out, &a, p, m);
        out
    };
    let (mut q, mut k, mut v) = (project(&w.q_proj), project(&w.k_proj), project(&w.v_proj));
    rms_norm_rows(&mut q, d, Some(&w.q_norm), eps);
    rms_norm_rows(&mut k, d, Some(&w.k_norm), eps);
    rms_norm_rows(&mut v, d, None, eps);
    rope.apply(&mut q, c.num_heads);
    rope.apply(&mut k, c.num_kv_heads);
    let mut attn = vec![0f32; p * c.num_heads * d];
    let shape = AttnShape { queries: p, keys: p, heads: c.num_heads, kv_heads: c.num_kv_heads, head_dim: d };
    attention(&mut attn, &q, &k, &v, shape, Mask::None);
    let mut o = vec![0f32; p * hid];
    linear(&mut o, &attn, p, &w.o_proj);
    rms_norm_rows(&mut o, hid, Some(&w.post_attention_layernorm), eps);
    h.iter_mut().zip(&o).for_each(|(r, &v)| *r += v);

    let mut m = h.to_vec();
    rms_norm_rows(&mut m, hid, Some(&w.pre_feedforward_layernorm), eps);
    let (mut gate, mut up) = (vec![0f32; p * c.intermediate_size], vec![0f32; p * c.intermediate_size]);
    linear(&mut gate, &m, p, &w.gate_proj);
    linear(&mut up, &m, p, &w.up_proj);
    gelu_glu(&mut gate, &up);
    let mut down = vec![0f32; p * hid];
    linear(&mut down, &gate, p, &w.down_proj);
    rms_norm_rows(&mut down, hid, Some(&w.post_feedforward_layernorm), eps);
    h.iter_mut().zip(&down).for_each(|(r, &v)| *r += v);
}

/// `Gemma4VisionPooler`: the mean of each k×k block of patches (soft token
/// `x/k + (W/k)·(y/k)`, W the grid's width), times √hidden.
fn pool(c: &VisionConfig, h: &[f32], positions: &[[u32; 2]]) -> Result<Vec<f32>, VisionError> {
    let (hid, k) = (c.hidden_size, c.pooling_kernel_size);
    let tokens = positions.len() / (k * k);
    let grid_width = positions.iter().map(|p| p[0] as usize).max().unwrap_or(0) + 1;
    let mut out = vec![0f32; tokens * hid];
    let weight = 1.0 / (k * k) as f32;
    for (row, &[x, y]) in h.chunks_exact(hid).zip(positions) {
        let t = x as usize / k + (grid_width / k) * (y as usize / k);
        if !grid_width.is_multiple_of(k) || t >= tokens {
            return Err(VisionError::Grid { x, y, kernel: k });
        }
        out[t * hid..(t + 1) * hid].iter_mut().zip(row).for_each(|(o, &v)| *o += weight * v);
    }
    let root = (hid as f64).sqrt() as f32;
    out.iter_mut().for_each(|v| *v *= root);
    Ok(out)
}

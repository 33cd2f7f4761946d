//! llama.cpp's multimodal projector files for the Gemma 4 vision tower (`mmproj-*.gguf`,
//! `general.architecture = "clip"`, `clip.vision.projector_type = "gemma4v"`), as its converter
//! writes them (`convert_hf_to_gguf.py --mmproj`, class `Gemma4VisionAudioModel`) and its
//! `tools/mtmd/clip.cpp` reads them: the tower's tensors under `v.*`, the projection into the text
//! model as `mm.input_projection.weight`.
//!
//! An [`Mmproj`] serves those tensors by dg's HF names (`model.encoder.vision_tower.*`,
//! `model.encoder.embed_vision.*`), so `VisionWeights::build` reads it as it reads a checkpoint.
//! The geometry comes from the `clip.vision.*` keys and the tensors' shapes; what the file does not
//! say is what clip.cpp fixes for `gemma4v` (RoPE θ = 100, pooling 3 unless
//! `clip.vision.projector.scale_factor` says otherwise).

use std::path::Path;

use super::GgufFile;
use super::read::TensorInfo;
use crate::error::{ModelError, Result};
use crate::stored::StoredTensor;
use crate::vision::{EMBED_VISION, TOWER, VisionConfig};
use crate::weights::TensorSource;

/// The projector type dg reads (`PROJECTOR_TYPE_GEMMA4V` in clip.cpp).
pub const GEMMA4V: &str = "gemma4v";

/// The tower's RoPE base, which clip.cpp fixes for `gemma4v` (the file does not carry it).
const ROPE_THETA: f64 = 100.0;

/// The pooling kernel clip.cpp takes for `gemma4v` when `clip.vision.projector.scale_factor` is absent.
const DEFAULT_POOLING: usize = 3;

/// Per-layer tensors: the HF suffix under `encoder.layers.N.` and the GGUF one under `v.blk.N.`.
const LAYER: [(&str, &str); 13] = [
    ("input_layernorm.weight", "ln1.weight"),
    ("post_attention_layernorm.weight", "attn_post_norm.weight"),
    ("pre_feedforward_layernorm.weight", "ln2.weight"),
    ("post_feedforward_layernorm.weight", "ffn_post_norm.weight"),
    ("self_attn.q_proj.linear.weight", "attn_q.weight"),
    ("self_attn.k_proj.linear.weight", "attn_k.weight"),
    ("self_attn.v_proj.linear.weight", "attn_v.weight"),
    ("self_attn.o_proj.linear.weight", "attn_out.weight"),
    ("self_attn.q_norm.weight", "attn_q_norm.weight"),
    ("self_attn.k_norm.weight", "attn_k_norm.weight"),
    ("mlp.gate_proj.linear.weight", "ffn_gate.weight"),
    ("mlp.up_proj.linear.weight", "ffn_up.weight"),
    ("mlp.down_proj.linear.weight", "ffn_down.weight"),
];

/// Tensors outside the layers: the name after the tower's (or the projection's) prefix, and the GGUF name.
const TOWER_SHARED: [(&str, &str); 4] = [
    ("patch_embedder.input_proj.weight", PATCH),
    ("patch_embedder.position_embedding_table", "v.position_embd.weight"),
    ("std_bias", "v.std_bias"),
    ("std_scale", "v.std_scale"),
];
const PROJECTION: (&str, &str) = ("embedding_projection.weight", "mm.input_projection.weight");

/// The patch embedding, which the converter stores as a convolution kernel `[hidden, 3, p, p]`
/// where HF holds a linear layer over `(p, p, 3)`-ordered patches.
const PATCH: &str = "v.patch_embd.weight";

/// A Gemma 4 vision projector file.
#[derive(Debug)]
pub struct Mmproj {
    file: GgufFile,
    config: VisionConfig,
    /// The text model's hidden size the projection writes (`clip.vision.projection_dim`).
    projection_dim: usize,
}

impl Mmproj {
    /// Opens `path`, checking that it is a `gemma4v` projector and reading the tower's geometry.
    pub fn open(path: &Path) -> Result<Self> {
        Self::from_file(GgufFile::open(path)?)
    }

    /// The projector in `file`.
    pub fn from_file(file: GgufFile) -> Result<Self> {
        let err = |message: String| ModelError::Gguf { path: file.path().to_path_buf(), message };
        let text = |key: &str| file.meta(key).and_then(|v| v.as_str().map(str::to_string));
        let arch = text("general.architecture");
        if arch.as_deref() != Some("clip") {
            return Err(err(format!(
                "general.architecture is {arch:?}, not \"clip\": not a multimodal projector (mmproj) file; a model's GGUF goes to --model"
            )));
        }
        let projector = text("clip.vision.projector_type").or_else(|| text("clip.projector_type"));
        if projector.as_deref() != Some(GEMMA4V) {
            return Err(err(format!("clip.vision.projector_type is {projector:?}: dg reads Gemma 4 vision projectors ({GEMMA4V:?})")));
        }
        let count = |key: &str| -> Result<usize> {
            let v = file.meta(key).ok_or_else(|| err(format!("metadata {key} is missing")))?;
            v.as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .filter(|&n| n > 0)
                .ok_or_else(|| err(format!("metadata {key} is not a positive integer")))
        };
        let shape = |name: &str| file.tensor(name).map(TensorInfo::shape).ok_or_else(|| err(format!("tensor {name} is missing")));
        let hidden = count("clip.vision.embedding_length")?;
        let heads = count("clip.vision.attention.head_count")?;
        let head_dim = *shape("v.blk.0.attn_q_norm.weight")?.first().unwrap_or(&0);
        let k_rows = *shape("v.blk.0.attn_k.weight")?.first().unwrap_or(&0);
        if head_dim == 0 || !k_rows.is_multiple_of(head_dim) || k_rows == 0 {
            return Err(err(format!("v.blk.0.attn_k.weight has {k_rows} rows, not a multiple of the head size {head_dim}")));
        }
        let table = shape("v.position_embd.weight")?;
        let [2, positions, width] = table[..] else {
            return Err(err(format!("v.position_embd.weight has shape {table:?}, not [2, positions, {hidden}]")));
        };
        if width != hidden {
            return Err(err(format!("v.position_embd.weight is {width} wide where clip.vision.embedding_length is {hidden}")));
        }
        let pooling = match file.meta("clip.vision.projector.scale_factor") {
            Some(v) => v
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .filter(|&n| n > 0)
                .ok_or_else(|| err("metadata clip.vision.projector.scale_factor is not a positive integer".to_string()))?,
            None => DEFAULT_POOLING,
        };
        let eps = file.meta("clip.vision.attention.layer_norm_epsilon").and_then(|v| v.as_f64()).unwrap_or(1e-6);
        if let Some(t) = file.tensors().iter().find(|t| t.name.ends_with(".input_max") || t.name.ends_with(".input_min")) {
            return Err(err(format!("{} clips a linear layer's inputs (Gemma 4's clipped linears), which dg does not run", t.name)));
        }
        let config = VisionConfig {
            hidden_size: hidden,
            intermediate_size: count("clip.vision.feed_forward_length")?,
            num_layers: count("clip.vision.block_count")?,
            num_heads: heads,
            num_kv_heads: k_rows / head_dim,
            head_dim,
            rms_norm_eps: eps,
            patch_size: count("clip.vision.patch_size")?,
            pooling_kernel_size: pooling,
            position_embedding_size: positions,
            rope_theta: ROPE_THETA,
            standardize: file.tensor("v.std_bias").is_some(),
        };
        config.validate().map_err(|m| err(format!("the tower's geometry: {m}")))?;
        let projection_dim = count("clip.vision.projection_dim")?;
        Ok(Mmproj { file, config, projection_dim })
    }

    /// The tower's geometry.
    pub fn config(&self) -> &VisionConfig {
        &self.config
    }

    /// The text hidden size the projection writes; it must be the text model's.
    pub fn projection_dim(&self) -> usize {
        self.projection_dim
    }

    pub fn path(&self) -> &Path {
        self.file.path()
    }

    /// Bytes of every tensor of the file, as stored.
    pub fn tensor_bytes(&self) -> u64 {
        self.file.tensors().iter().map(|t| t.bytes.len() as u64).sum()
    }
}

/// The GGUF name of the vision tensor HF names `hf`; `None` for other names.
pub fn mmproj_name(hf: &str) -> Option<String> {
    if let Some(rest) = hf.strip_prefix(EMBED_VISION).and_then(|r| r.strip_prefix('.')) {
        return (rest == PROJECTION.0).then(|| PROJECTION.1.to_string());
    }
    let rest = hf.strip_prefix(TOWER)?.strip_prefix('.')?;
    if let Some(layer) = rest.strip_prefix("encoder.layers.") {
        let (i, suffix) = layer.split_once('.')?;
        if i.is_empty() || !i.bytes().all(|b| b.is_ascii_digit()) || (i.len() > 1 && i.starts_with('0')) {
            return None;
        }
        return LAYER.iter().find(|(h, _)| *h == suffix).map(|(_, g)| format!("v.blk.{i}.{g}"));
    }
    TOWER_SHARED.iter().find(|(h, _)| *h == rest).map(|(_, g)| g.to_string())
}

impl TensorSource for Mmproj {
    fn stored(&self, name: &str, shape: &[usize]) -> Result<StoredTensor<'_>> {
        let missing = |location: String| ModelError::MissingTensor { name: name.to_string(), location };
        let gguf = mmproj_name(name).ok_or_else(|| missing(format!("{} (not a vision tensor)", self.path().display())))?;
        let t = self.file.tensor(&gguf).ok_or_else(|| missing(format!("{} (GGUF name {gguf:?})", self.path().display())))?;
        // The convolution kernel `[hidden, 3, p, p]` back to HF's `[hidden, p·p·3]` (the
        // converter's `reshape(hidden, p, p, 3).permute(0, 3, 1, 2)` undone).
        let (stored, hf_shape) = match gguf.as_str() {
            PATCH => {
                let got = t.shape();
                let &[h, 3, p, q] = &got[..] else { return Err(self.shape_error(name, t, shape)) };
                if p != q {
                    return Err(self.shape_error(name, t, shape));
                }
                let conv = self.file.stored_gguf(t).into_f32();
                let mut linear = vec![0.0; conv.len()];
                for o in 0..h {
                    for c in 0..3 {
                        for y in 0..p {
                            for x in 0..p {
                                linear[o * 3 * p * p + (y * p + x) * 3 + c] = conv[((o * 3 + c) * p + y) * p + x];
                            }
                        }
                    }
                }
                (StoredTensor::from_f32(vec![h, 3 * p * p], linear), vec![h, 3 * p * p])
            }
            _ => (self.file.stored_gguf(t), t.shape()),
        };
        if hf_shape != shape {
            return Err(self.shape_error(name, t, shape));
        }
        Ok(stored)
    }
}

impl Mmproj {
    fn shape_error(&self, name: &str, t: &TensorInfo, expected: &[usize]) -> ModelError {
        ModelError::ShapeMismatch {
            name: format!("{name} (GGUF {:?}, ggml dims {:?})", t.name, t.dims),
            path: self.path().to_path_buf(),
            expected: expected.to_vec(),
            got: t.shape(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_vision_tensor_has_one_gguf_name() {
        let c = VisionConfig {
            hidden_size: 8,
            intermediate_size: 12,
            num_layers: 11,
            num_heads: 2,
            num_kv_heads: 1,
            head_dim: 4,
            rms_norm_eps: 1e-6,
            patch_size: 2,
            pooling_kernel_size: 3,
            position_embedding_size: 5,
            rope_theta: 100.0,
            standardize: true,
        };
        let names: Vec<String> =
            crate::vision_manifest(&c, 16).iter().map(|(hf, _)| mmproj_name(hf).unwrap_or_else(|| panic!("{hf}"))).collect();
        let unique: std::collections::HashSet<_> = names.iter().collect();
        assert_eq!(unique.len(), names.len());
        assert!(names.contains(&"v.blk.10.ffn_down.weight".to_string()));
        assert_eq!(mmproj_name("model.encoder.vision_tower.encoder.layers.01.ln1.weight"), None);
        assert_eq!(mmproj_name("model.decoder.embed_tokens.weight"), None);
    }
}

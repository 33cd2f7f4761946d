//! Images in prompts (`dg generate --image`, the image parts of `dg serve`'s chat messages): bytes
//! decoded and processed by `dg_image` at a soft-token budget, the vision tower and projection
//! (transformers' `Gemma4VisionModel` + `Gemma4MultimodalEmbedder`, what `get_image_features`
//! runs) on the backend the text model runs on, and the prompt's image placeholders expanded as
//! transformers' `Gemma4Processor.replace_image_token` expands them: the chat template writes one
//! image token (`<|image|>`) per image part, which becomes `<|image>` (boi), one image token per
//! soft token, and `<image|>` (eoi). The encoder then puts each image's rows in place of its soft
//! tokens (`dg_cpu::CpuModel::encode_with_images`, `dg_gpu::GpuModel::encode_with_images`).
//!
//! Where the tower runs ([`TowerDevice`]): with the CPU backend on the f32 CPU reference
//! (`dg_cpu::vision`); with the GPU backend on the model's own device (`dg_gpu::GpuVisionTower`,
//! through a shared handle on the model's `GpuContext`), its matrices in the format
//! [`crate::weights::tower_format`] picks: the text model's where `--weights` names a format or
//! the tensor cores run the F16 mode, else the tower's checkpoint as stored (BF16 where its
//! matrices are BF16, f32 otherwise; a quantization scheme quantizes the text model only). The
//! GPU tower's kernels are recorded behind a lock, so `dg serve`'s request threads may encode
//! images while the engine thread runs the model on the same device.
//!
//! An image is first prepared ([`prepare`]: decoded and processed, which is all its soft-token
//! count and any error in its bytes need), then embedded by the tower ([`VisionTower::embed`]):
//! `dg generate` reports a bad image before it loads anything, and runs the tower once the
//! backend is chosen.

use std::sync::Mutex;

use anyhow::{Context, Result};
use dg_cpu::vision::{ImagePatches, image_embeddings};
use dg_gpu::{GpuContext, GpuError, GpuVisionTower};
use dg_image::{DecodeLimits, ImageProcessor, ProcessedImage, decode};
use dg_model::{ModelDir, VisionConfig, VisionWeights};
use sha2::{Digest, Sha256};

use crate::args::WeightsArg;
use crate::backend::Backend;
use crate::error::{Input, input};

/// What a model's images become, without the tower's weights: the processor's geometry and the
/// image token ids the prompt's placeholders expand to.
#[derive(Debug, Clone)]
pub struct ImageSpec {
    config: VisionConfig,
    image_token: u32,
    boi_token: u32,
    eoi_token: u32,
}

/// Where the tower runs.
pub enum TowerDevice {
    /// The f32 CPU reference.
    Cpu,
    /// The model's GPU (a shared handle on its context, `GpuContext::share`), its matrices in the
    /// format `--weights` gives for the tower ([`crate::weights::tower_format`]).
    Gpu(Box<GpuContext>, WeightsArg),
}

impl TowerDevice {
    /// The device of `backend`: the CPU's, or a shared handle on the GPU's context with the
    /// model's `--weights`.
    pub fn of(backend: &Backend, weights: WeightsArg) -> Self {
        match backend {
            Backend::Cpu => TowerDevice::Cpu,
            Backend::Gpu(ctx) => TowerDevice::Gpu(Box::new(ctx.share()), weights),
        }
    }
}

/// The tower's weights where it runs.
enum Tower {
    Cpu(VisionWeights),
    Gpu(Box<GpuTower>),
}

/// The GPU tower and its handle on the model's device. The tower records into its compiled
/// pipelines (`&mut`): one image at a time.
struct GpuTower {
    tower: Mutex<GpuVisionTower>,
    ctx: GpuContext,
}

/// The model's vision tower and projection, on the CPU or the model's GPU, and its image token ids.
pub struct VisionTower {
    spec: ImageSpec,
    tower: Tower,
}

/// One image decoded and processed: its patches, soft tokens and digest, ready for the tower.
#[derive(Debug, Clone)]
pub struct PreparedImage {
    processed: ProcessedImage,
    /// SHA-256 of the image's bytes and the budget: what a cache holding it is keyed by.
    digest: [u8; 32],
}

/// One image ready for the encoder.
#[derive(Debug, Clone)]
pub struct EncodedImage {
    /// `[soft_tokens, text hidden]`, the rows its soft tokens take.
    pub embeddings: Vec<f32>,
    pub soft_tokens: usize,
    /// SHA-256 of the image's bytes and the budget: what a cache holding it is keyed by.
    pub digest: [u8; 32],
}

/// Why an image was not encoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EncodeError {
    /// Its bytes: they do not decode, or the image is too large (the caller's input is wrong).
    Image(String),
    /// The tower failed on a processed image (a device error on the GPU): not the input's fault.
    Tower(String),
}

impl std::fmt::Display for EncodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EncodeError::Image(e) => f.write_str(e),
            EncodeError::Tower(e) => write!(f, "the vision tower failed: {e}"),
        }
    }
}

impl std::error::Error for EncodeError {}

impl ImageSpec {
    /// The images `model` takes, or an input error when it has none (`vision_config` null or
    /// absent, or no image token ids in config.json).
    pub fn of(model: &ModelDir) -> Result<Self> {
        let dir = model.dir.display();
        let Some(config) = model.config.vision.clone() else {
            return Err(input(format!(
                "{dir} has no vision tower (its config.json has no vision_config, and no --mmproj file was given): it takes no images"
            )));
        };
        let ids = (model.config.image_token_id, model.config.boi_token_id, model.config.eoi_token_id);
        let (Some(image_token), Some(boi_token), Some(eoi_token)) = ids else {
            return Err(input(format!("{dir}: config.json needs image_token_id, boi_token_id and eoi_token_id to take images")));
        };
        Ok(ImageSpec { config, image_token, boi_token, eoi_token })
    }

    /// The processor at `budget` soft tokens per image (one of `dg_image::SUPPORTED_SOFT_TOKENS`).
    pub fn processor(&self, budget: usize) -> Result<ImageProcessor> {
        let base =
            ImageProcessor { patch_size: self.config.patch_size, pooling_kernel_size: self.config.pooling_kernel_size, max_soft_tokens: 0 };
        base.with_budget(budget).map_err(|e| input(e.to_string()))
    }

    /// `ids` with each image token (one per image, in order) expanded to boi, the image's
    /// `soft_tokens` and eoi; the error says how the counts differ.
    pub fn expand(&self, ids: &[u32], soft_tokens: &[usize]) -> Result<Vec<u32>, String> {
        let placeholders = ids.iter().filter(|&&id| id == self.image_token).count();
        if placeholders != soft_tokens.len() {
            return Err(format!(
                "the prompt holds {placeholders} image placeholder(s) (token {}) for {} image(s)",
                self.image_token,
                soft_tokens.len()
            ));
        }
        let mut images = soft_tokens.iter();
        let mut out = Vec::with_capacity(ids.len() + images.len() * 2);
        for &id in ids {
            if id != self.image_token {
                out.push(id);
                continue;
            }
            let &soft = images.next().expect("one image per placeholder, counted above");
            out.push(self.boi_token);
            out.extend(std::iter::repeat_n(self.image_token, soft));
            out.push(self.eoi_token);
        }
        Ok(out)
    }

    /// The ids a cache of `ids` (expanded, holding `images` in order) is keyed by: the ids, with
    /// each image's soft tokens replaced by words of its digest (with the top bit set, so no key
    /// equals a token id): prompts that differ only in an image's bytes share no cache past it.
    pub fn cache_keys(&self, ids: &[u32], images: &[EncodedImage]) -> Vec<u32> {
        let mut images = images.iter();
        let mut current: Option<(&EncodedImage, usize)> = None;
        ids.iter()
            .map(|&id| {
                if id != self.image_token {
                    current = None;
                    return id;
                }
                let (image, at) = match current {
                    Some((image, at)) if at < image.soft_tokens => (image, at),
                    _ => match images.next() {
                        Some(image) => (image, 0),
                        None => return id,
                    },
                };
                current = Some((image, at + 1));
                let word = at % 8;
                let bytes: [u8; 4] = image.digest[4 * word..4 * word + 4].try_into().expect("4 bytes");
                u32::from_le_bytes(bytes) | 1 << 31
            })
            .collect()
    }

    /// The image token id (the soft tokens' id in the expanded prompt).
    pub fn image_token(&self) -> u32 {
        self.image_token
    }
}

/// Decodes and processes one image; the error says what is wrong with its bytes (the caller
/// names the image).
pub fn prepare(bytes: &[u8], processor: &ImageProcessor) -> Result<PreparedImage, String> {
    let image = decode(bytes, DecodeLimits::default()).map_err(|e| e.to_string())?;
    let processed = processor.process(&image).map_err(|e| e.to_string())?;
    let digest = Sha256::new().chain_update(bytes).chain_update((processor.max_soft_tokens as u64).to_le_bytes()).finalize().into();
    Ok(PreparedImage { processed, digest })
}

impl PreparedImage {
    /// The soft tokens this image becomes.
    pub fn soft_tokens(&self) -> usize {
        self.processed.num_soft_tokens
    }
}

impl VisionTower {
    /// The tower of `model` on `device`, or an input error when it has none ([`ImageSpec::of`]) or
    /// its checkpoint lacks the tower's tensors.
    pub fn load(model: &ModelDir, device: TowerDevice) -> Result<Self> {
        let spec = ImageSpec::of(model)?;
        let dir = model.dir.display();
        let missing = || {
            Input(match (model.checkpoint.gguf(), &model.mmproj) {
                (Some(_), None) => format!(
                    "cannot load the vision tower of {dir}: a GGUF model's file holds none; give llama.cpp's projector file with --mmproj"
                ),
                _ => format!("cannot load the vision tower of {dir}"),
            })
        };
        let text_hidden = model.config.text.hidden_size;
        let tower = match device {
            TowerDevice::Cpu => Tower::Cpu(VisionWeights::build(model.vision_source(), &spec.config, text_hidden).with_context(missing)?),
            TowerDevice::Gpu(ctx, weights) => {
                let format = crate::weights::tower_format(model, weights, ctx.coop_matrix);
                let tower = GpuVisionTower::load(&ctx, &spec.config, text_hidden, model.vision_source(), format).map_err(|e| match e {
                    GpuError::Model(e) => anyhow::Error::new(e).context(missing()),
                    e @ GpuError::OutOfRange { .. } => anyhow::Error::new(e).context(missing()),
                    other => anyhow::Error::new(other).context("cannot upload the vision tower to the GPU"),
                })?;
                Tower::Gpu(Box::new(GpuTower { tower: Mutex::new(tower), ctx: *ctx }))
            }
        };
        Ok(VisionTower { spec, tower })
    }

    /// The images this tower takes: processor geometry and token ids.
    pub fn spec(&self) -> &ImageSpec {
        &self.spec
    }

    /// Where the tower runs and, on the GPU, its matrices' format and the bytes of its weights
    /// there: `on the CPU (f32)`, `on the GPU (f16 matrices, 12.5 MiB)`.
    pub fn describe(&self) -> String {
        match &self.tower {
            Tower::Cpu(_) => "on the CPU (f32)".to_string(),
            Tower::Gpu(gpu) => {
                let tower = gpu.tower.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                format!("on the GPU ({} matrices, {:.1} MiB)", crate::weights::name(tower.format()), tower.bytes as f64 / 1_048_576.0)
            }
        }
    }

    /// Runs the tower on one prepared image.
    pub fn embed(&self, image: &PreparedImage) -> Result<EncodedImage, EncodeError> {
        let p = &image.processed;
        let embeddings = match &self.tower {
            Tower::Cpu(weights) => {
                let patches = ImagePatches { pixel_values: &p.pixel_values, positions: &p.positions };
                image_embeddings(&self.spec.config, weights, patches).map_err(|e| EncodeError::Tower(e.to_string()))?
            }
            Tower::Gpu(gpu) => {
                // A panic of an earlier image's pass leaves only compiled pipelines behind.
                let mut tower = gpu.tower.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                tower.image_embeddings(&gpu.ctx, &p.pixel_values, &p.positions).map_err(|e| EncodeError::Tower(e.to_string()))?
            }
        };
        Ok(EncodedImage { embeddings, soft_tokens: p.num_soft_tokens, digest: image.digest })
    }

    /// Decodes, processes and encodes one image ([`prepare`], [`Self::embed`]); the error says
    /// what is wrong with it (the caller names the image).
    pub fn encode(&self, bytes: &[u8], processor: &ImageProcessor) -> Result<EncodedImage, EncodeError> {
        self.embed(&prepare(bytes, processor).map_err(EncodeError::Image)?)
    }
}

#[cfg(test)]
mod tests {
    use dg_parity::checks::GPU_LOGITS_TOLERANCE;
    use dg_parity::compare::compare;
    use dg_parity::testing::{fixture, test_context};

    use super::*;

    const IMAGES: [&str; 2] = ["wide.png", "tall.png"];

    /// The GPU tower through [`VisionTower`] (F32 matrices, on a shared handle of the model's
    /// context, its objects counted there) gives the CPU tower's rows for each test image within
    /// the f32 GPU forward's tolerance, the one dg-parity's `vision_tower.rs` holds the GPU tower
    /// to against transformers: the same f32 tower, reductions and transcendentals in another
    /// order. Two threads encode each image at once, as `dg serve`'s request threads may.
    #[test]
    fn the_gpu_tower_gives_the_cpu_towers_rows() {
        let test = "the_gpu_tower_gives_the_cpu_towers_rows";
        let Some(ctx) = test_context(test) else { return };
        let model = ModelDir::open(&fixture("vision-generate")).unwrap();
        let cpu = VisionTower::load(&model, TowerDevice::Cpu).unwrap();
        let before = ctx.created().buffers;
        let gpu = VisionTower::load(&model, TowerDevice::Gpu(Box::new(ctx.share()), WeightsArg::F32)).unwrap();
        assert!(ctx.created().buffers > before, "the tower's buffers are not counted on the context it shares");
        assert!(gpu.describe().starts_with("on the GPU (f32 matrices, "), "{}", gpu.describe());
        assert_eq!(cpu.describe(), "on the CPU (f32)");
        let processor = gpu.spec().processor(70).unwrap();
        let hidden = model.config.text.hidden_size;
        for name in IMAGES {
            let bytes = std::fs::read(fixture("image-processor").join(name)).unwrap();
            let want = cpu.encode(&bytes, &processor).unwrap();
            let got: Vec<EncodedImage> = std::thread::scope(|s| {
                let runs: Vec<_> = (0..2).map(|_| s.spawn(|| gpu.encode(&bytes, &processor).unwrap())).collect();
                runs.into_iter().map(|run| run.join().unwrap()).collect()
            });
            for ours in got {
                assert_eq!((ours.soft_tokens, ours.digest), (want.soft_tokens, want.digest), "{name}");
                assert_eq!(ours.embeddings.len(), want.soft_tokens * hidden, "{name}: rows");
                let c = compare(&ours.embeddings, &want.embeddings, hidden, f32::INFINITY);
                eprintln!("{name}: GPU tower against the CPU's: {c}");
                assert!(c.nonfinite_ours == 0 && c.normwise <= GPU_LOGITS_TOLERANCE, "{name}: {c}");
            }
        }
        // The tower's bytes on the device are what `dg info` counts, in f32 and as stored (BF16).
        let stored = |name: &str| {
            let shape = dg_model::vision_manifest(&spec_config(&gpu), hidden).into_iter().find(|(n, _)| n == name).unwrap().1;
            model.vision_source().stored(name, &shape).unwrap().dtype
        };
        let bf16 = VisionTower::load(&model, TowerDevice::Gpu(Box::new(ctx.share()), WeightsArg::Bf16)).unwrap();
        for (tower, format) in [(&gpu, dg_gpu::WeightFormat::F32), (&bf16, dg_gpu::WeightFormat::Bf16)] {
            let Tower::Gpu(on) = &tower.tower else { panic!("{format:?}: not on the GPU") };
            let counted = crate::footprint::tower_bytes(&spec_config(tower), hidden, &stored, format).total;
            assert_eq!(on.tower.lock().unwrap().bytes, counted, "{format:?}");
        }
        // Bytes that are no image are the input's fault, on either device.
        for tower in [&cpu, &gpu] {
            assert!(matches!(tower.encode(b"not an image", &processor), Err(EncodeError::Image(_))));
        }
    }

    fn spec_config(tower: &VisionTower) -> VisionConfig {
        tower.spec.config.clone()
    }

    /// Expansion places boi, the soft tokens and eoi per placeholder, and a count that differs
    /// is an error saying so.
    #[test]
    fn placeholders_expand_to_their_images_soft_tokens() {
        let model = ModelDir::open(&fixture("vision-generate")).unwrap();
        let spec = ImageSpec::of(&model).unwrap();
        let (image, boi, eoi) = (spec.image_token, spec.boi_token, spec.eoi_token);
        assert_eq!(spec.expand(&[2, image, 5, image], &[2, 1]).unwrap(), [2, boi, image, image, eoi, 5, boi, image, eoi]);
        let err = spec.expand(&[2, image], &[2, 1]).unwrap_err();
        assert!(err.contains("1 image placeholder(s)") && err.contains("for 2 image(s)"), "{err}");
    }
}

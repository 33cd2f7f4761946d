//! Images in prompts (`dg generate --image`, the image parts of `dg serve`'s chat messages): bytes
//! decoded and processed by `dg_image` at a soft-token budget, the vision tower and projection run
//! on the CPU reference (`dg_cpu::vision`), and the prompt's image placeholders expanded as
//! transformers' `Gemma4Processor.replace_image_token` expands them: the chat template writes one
//! image token (`<|image|>`) per image part, which becomes `<|image>` (boi), one image token per
//! soft token, and `<image|>` (eoi). The encoder then puts each image's rows in place of its soft
//! tokens (`dg_cpu::CpuModel::encode_with_images`, `dg_gpu::GpuModel::encode_with_images`).

use anyhow::{Context, Result};
use dg_cpu::vision::{ImagePatches, image_embeddings};
use dg_image::{DecodeLimits, ImageProcessor, decode};
use dg_model::{ModelDir, VisionConfig, VisionWeights};
use sha2::{Digest, Sha256};

use crate::error::{Input, input};

/// The soft-token budget of an image when none is given (transformers' `image_seq_length`).
pub const DEFAULT_IMAGE_TOKENS: usize = 280;

/// The model's vision tower, projection and image token ids.
pub struct VisionTower {
    config: VisionConfig,
    weights: VisionWeights,
    image_token: u32,
    boi_token: u32,
    eoi_token: u32,
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

impl VisionTower {
    /// The tower of `model`, or an input error when it has none (`vision_config` null or absent,
    /// or no image token ids in config.json).
    pub fn load(model: &ModelDir) -> Result<Self> {
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
        let weights = VisionWeights::build(model.vision_source(), &config, model.config.text.hidden_size).context(Input(
            match (model.checkpoint.gguf(), &model.mmproj) {
                (Some(_), None) => format!(
                    "cannot load the vision tower of {dir}: a GGUF model's file holds none; give llama.cpp's projector file with --mmproj"
                ),
                _ => format!("cannot load the vision tower of {dir}"),
            },
        ))?;
        Ok(VisionTower { config, weights, image_token, boi_token, eoi_token })
    }

    /// The processor at `budget` soft tokens per image (one of `dg_image::SUPPORTED_SOFT_TOKENS`).
    pub fn processor(&self, budget: usize) -> Result<ImageProcessor> {
        let base =
            ImageProcessor { patch_size: self.config.patch_size, pooling_kernel_size: self.config.pooling_kernel_size, max_soft_tokens: 0 };
        base.with_budget(budget).map_err(|e| input(e.to_string()))
    }

    /// Decodes, processes and encodes one image; the error says what is wrong with it (the caller
    /// names the image).
    pub fn encode(&self, bytes: &[u8], processor: &ImageProcessor) -> Result<EncodedImage, String> {
        let image = decode(bytes, DecodeLimits::default()).map_err(|e| e.to_string())?;
        let processed = processor.process(&image).map_err(|e| e.to_string())?;
        let patches = ImagePatches { pixel_values: &processed.pixel_values, positions: &processed.positions };
        let embeddings = image_embeddings(&self.config, &self.weights, patches).map_err(|e| e.to_string())?;
        let digest = Sha256::new().chain_update(bytes).chain_update((processor.max_soft_tokens as u64).to_le_bytes()).finalize().into();
        Ok(EncodedImage { embeddings, soft_tokens: processed.num_soft_tokens, digest })
    }

    /// `ids` with each image token (one per image, in order) expanded to boi, the image's soft
    /// tokens and eoi; the error says how the counts differ.
    pub fn expand(&self, ids: &[u32], images: &[EncodedImage]) -> Result<Vec<u32>, String> {
        let placeholders = ids.iter().filter(|&&id| id == self.image_token).count();
        if placeholders != images.len() {
            return Err(format!(
                "the prompt holds {placeholders} image placeholder(s) (token {}) for {} image(s)",
                self.image_token,
                images.len()
            ));
        }
        let mut images = images.iter();
        let mut out = Vec::with_capacity(ids.len() + images.len() * 2);
        for &id in ids {
            if id != self.image_token {
                out.push(id);
                continue;
            }
            let image = images.next().expect("one image per placeholder, counted above");
            out.push(self.boi_token);
            out.extend(std::iter::repeat_n(self.image_token, image.soft_tokens));
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

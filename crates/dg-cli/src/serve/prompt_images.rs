//! A served prompt's images, shared by chat requests ([`super::http`]), the engine that encodes
//! their prompts ([`super::engine`]) and `/v1/systemone`'s reads ([`super::systemone`]): the
//! model's vision tower with the processor at the server's soft-token budget, and a prompt's
//! images encoded (`crate::images::VisionTower`, transformers' `Gemma4Processor`): its placeholders
//! expanded, the rows its encode places, and the keys its cache is found by.

use crate::images::{EncodedImage, ImageSpec, VisionTower};

/// The vision tower and the processor at the server's soft-token budget (`--image-tokens`).
pub struct ImageInput {
    pub tower: VisionTower,
    pub processor: dg_image::ImageProcessor,
}

impl std::fmt::Debug for ImageInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImageInput").field("processor", &self.processor).finish_non_exhaustive()
    }
}

/// A prompt's images, encoded: the rows its first encode places, and what its cache is keyed by.
#[derive(Debug, Clone)]
pub struct JobImages {
    /// The rows of the prompt's image soft tokens, in order, `row_width` floats each.
    pub embeddings: Vec<f32>,
    pub row_width: usize,
    /// The soft tokens' id in the prompt.
    pub image_token: u32,
    /// The prompt's ids with each image's soft tokens standing for its bytes
    /// (`crate::images::ImageSpec::cache_keys`).
    pub keys: Vec<u32>,
}

impl JobImages {
    /// `prompt` (one image token per image, as the chat template writes them) expanded to the
    /// images' soft tokens, and the images' rows and keys; the error says how the counts differ.
    pub fn new(spec: &ImageSpec, prompt: &[u32], images: Vec<EncodedImage>) -> Result<(Vec<u32>, Self), String> {
        let soft_tokens: Vec<usize> = images.iter().map(|image| image.soft_tokens).collect();
        let prompt = spec.expand(prompt, &soft_tokens)?;
        let keys = spec.cache_keys(&prompt, &images);
        let embeddings: Vec<f32> = images.into_iter().flat_map(|image| image.embeddings).collect();
        let row_width = embeddings.len() / soft_tokens.iter().sum::<usize>().max(1);
        Ok((prompt, JobImages { embeddings, row_width, image_token: spec.image_token(), keys }))
    }

    /// The rows of the image soft tokens in `ids`, a part of the prompt that starts after `before`
    /// of its soft tokens.
    pub fn rows(&self, before: usize, ids: &[u32]) -> &[f32] {
        let count = ids.iter().filter(|&&id| id == self.image_token).count();
        let start = (before * self.row_width).min(self.embeddings.len());
        let end = ((before + count) * self.row_width).min(self.embeddings.len());
        &self.embeddings[start..end]
    }
}

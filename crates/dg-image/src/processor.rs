//! The Gemma 4 image processor (transformers' `Gemma4ImageProcessorPil`): an aspect-preserving
//! bicubic resize to the largest size whose sides are multiples of `pooling_kernel · patch` and whose
//! patches fit `max_soft_tokens · pooling_kernel²`, rescale by 1/255 (no normalisation: the tower
//! maps [0, 1] to [-1, 1] itself), patchify into rows of `patch · patch · 3` (row, column, channel
//! order) with (x, y) patch positions, and one soft token per `pooling_kernel²` patches.
//!
//! HF pads every image to the budget's patch count (zero pixels, position (-1, -1)); the tower masks
//! and then strips those rows, so they are left out here.

use crate::{ImageError, RgbImage, resample::resize_bicubic};

/// The soft-token budgets transformers accepts (`_SUPPORTED_SOFT_TOKENS`).
pub const SUPPORTED_SOFT_TOKENS: [usize; 5] = [70, 140, 280, 560, 1120];

/// The processor's settings (`preprocessor_config.json`; the defaults are Gemma 4's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageProcessor {
    pub patch_size: usize,
    pub pooling_kernel_size: usize,
    pub max_soft_tokens: usize,
}

impl Default for ImageProcessor {
    fn default() -> Self {
        ImageProcessor { patch_size: 16, pooling_kernel_size: 3, max_soft_tokens: 280 }
    }
}

/// One image ready for the vision tower.
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessedImage {
    /// `[num_patches, 3 · patch²]`, values in [0, 1].
    pub pixel_values: Vec<f32>,
    /// Per patch its (x, y) = (column, row) in the patch grid, row-major like the patches.
    pub positions: Vec<[u32; 2]>,
    /// The resized image's height and width in pixels.
    pub height: usize,
    pub width: usize,
    /// Soft tokens this image becomes (patches / pooling_kernel²).
    pub num_soft_tokens: usize,
}

impl ProcessedImage {
    pub fn num_patches(&self) -> usize {
        self.positions.len()
    }
}

/// transformers' `get_aspect_ratio_preserving_size`: (height, width) after the resize.
pub fn target_size(height: usize, width: usize, patch: usize, max_patches: usize, pooling: usize) -> Result<(usize, usize), ImageError> {
    let target_px = (max_patches * patch * patch) as f64;
    let factor = (target_px / (height * width) as f64).sqrt();
    let side = pooling * patch;
    let mut th = ((factor * height as f64) / side as f64).floor() as usize * side;
    let mut tw = ((factor * width as f64) / side as f64).floor() as usize * side;
    let error = ImageError::Resize { height, width, side, max_patches };
    let max_side = (max_patches / (pooling * pooling)) * side;
    match (th, tw) {
        (0, 0) => return Err(error),
        (0, _) => {
            th = side;
            tw = ((width as f64 / height as f64).floor() as usize * side).min(max_side);
        }
        (_, 0) => {
            tw = side;
            th = ((height as f64 / width as f64).floor() as usize * side).min(max_side);
        }
        _ => {}
    }
    if (th * tw) as f64 > target_px {
        return Err(error);
    }
    Ok((th, tw))
}

impl ImageProcessor {
    /// A processor with this soft-token budget (one of [`SUPPORTED_SOFT_TOKENS`]).
    pub fn with_budget(self, max_soft_tokens: usize) -> Result<Self, ImageError> {
        if !SUPPORTED_SOFT_TOKENS.contains(&max_soft_tokens) {
            return Err(ImageError::Budget { got: max_soft_tokens });
        }
        Ok(ImageProcessor { max_soft_tokens, ..self })
    }

    /// Patches the budget allows (`max_soft_tokens · pooling_kernel²`).
    pub fn max_patches(&self) -> usize {
        self.max_soft_tokens * self.pooling_kernel_size * self.pooling_kernel_size
    }

    /// Resize, rescale and patchify one decoded image.
    pub fn process(&self, image: &RgbImage) -> Result<ProcessedImage, ImageError> {
        if !SUPPORTED_SOFT_TOKENS.contains(&self.max_soft_tokens) {
            return Err(ImageError::Budget { got: self.max_soft_tokens });
        }
        let (height, width) = target_size(image.height, image.width, self.patch_size, self.max_patches(), self.pooling_kernel_size)?;
        let resized;
        let image = if (height, width) == (image.height, image.width) {
            image
        } else {
            resized = resize_bicubic(image, width, height);
            &resized
        };
        let p = self.patch_size;
        let (rows, cols) = (height / p, width / p);
        let mut pixel_values = Vec::with_capacity(rows * cols * p * p * 3);
        let mut positions = Vec::with_capacity(rows * cols);
        for row in 0..rows {
            for col in 0..cols {
                for dy in 0..p {
                    let start = ((row * p + dy) * width + col * p) * 3;
                    // transformers' `rescale`: f64 product, then f32.
                    pixel_values.extend(image.pixels[start..start + p * 3].iter().map(|&v| (f64::from(v) * (1.0 / 255.0)) as f32));
                }
                positions.push([col as u32, row as u32]);
            }
        }
        let num_soft_tokens = positions.len() / (self.pooling_kernel_size * self.pooling_kernel_size);
        Ok(ProcessedImage { pixel_values, positions, height, width, num_soft_tokens })
    }
}

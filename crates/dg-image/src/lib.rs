//! Images in: decoding (PNG, JPEG, WebP; EXIF orientation applied) and the Gemma 4 image processor,
//! which turns RGB pixels into the patches, patch positions and soft-token count the vision tower reads.
//!
//! Mirrors transformers' `load_image` + `Gemma4ImageProcessorPil` (`image_processing_pil_gemma4.py`);
//! the resize is Pillow's bicubic resampling reproduced bit for bit (see [`resample`]).

mod decode;
mod processor;
pub mod resample;

pub use decode::{DecodeLimits, RgbImage, decode};
pub use processor::{ImageProcessor, ProcessedImage, SUPPORTED_SOFT_TOKENS, target_size};

/// Everything that can go wrong turning bytes into patches; each names the value at fault.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("image format not recognised (PNG, JPEG and WebP are read)")]
    UnknownFormat,
    #[error("image format {format} is not read (PNG, JPEG and WebP are)")]
    UnsupportedFormat { format: String },
    #[error("image could not be decoded: {reason}")]
    Decode { reason: String },
    #[error("image of {width}x{height} pixels is over the limit of {max_pixels} pixels")]
    TooLarge { width: u32, height: u32, max_pixels: u64 },
    #[error("image of {width}x{height} pixels is empty")]
    Empty { width: u32, height: u32 },
    #[error("soft-token budget {got} is not one of {SUPPORTED_SOFT_TOKENS:?}")]
    Budget { got: usize },
    #[error(
        "image of {height}x{width} (height x width) cannot be resized to a multiple of {side} on both sides within {max_patches} patches"
    )]
    Resize { height: usize, width: usize, side: usize, max_patches: usize },
}

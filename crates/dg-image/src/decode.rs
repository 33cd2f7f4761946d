//! Bytes to an RGB8 image, as transformers' `load_image` + `convert_to_rgb` do it with Pillow:
//! EXIF orientation applied (`ImageOps.exif_transpose`), alpha dropped (`Image.convert("RGB")`),
//! grey replicated. Bounded by a pixel limit checked before the pixels are decoded.

use crate::ImageError;
use image::{ImageDecoder, ImageFormat, ImageReader};
use std::io::Cursor;

/// Pillow's `Image.MAX_IMAGE_PIXELS` (1024·1024·1024 / 4 / 3): the size past which it warns of a
/// decompression bomb. dg refuses images over it rather than warn.
pub const DEFAULT_MAX_PIXELS: u64 = 89_478_485;

/// What [`decode`] accepts.
#[derive(Debug, Clone, Copy)]
pub struct DecodeLimits {
    /// Width times height (after orientation, which preserves it) at most this.
    pub max_pixels: u64,
}

impl Default for DecodeLimits {
    fn default() -> Self {
        DecodeLimits { max_pixels: DEFAULT_MAX_PIXELS }
    }
}

/// An RGB image, 8 bits a channel, rows top to bottom, pixels interleaved (HWC).
#[derive(Debug, Clone, PartialEq)]
pub struct RgbImage {
    pub width: usize,
    pub height: usize,
    pub pixels: Vec<u8>,
}

/// Decodes PNG, JPEG or WebP bytes (format sniffed from the bytes) to RGB8 with EXIF orientation applied.
pub fn decode(bytes: &[u8], limits: DecodeLimits) -> Result<RgbImage, ImageError> {
    let reader = ImageReader::new(Cursor::new(bytes)).with_guessed_format().map_err(|e| ImageError::Decode { reason: e.to_string() })?;
    match reader.format() {
        Some(ImageFormat::Png | ImageFormat::Jpeg | ImageFormat::WebP) => {}
        Some(other) => return Err(ImageError::UnsupportedFormat { format: format!("{other:?}") }),
        None => return Err(ImageError::UnknownFormat),
    }
    let mut decoder = reader.into_decoder().map_err(decode_error)?;
    let (width, height) = decoder.dimensions();
    if u64::from(width) * u64::from(height) > limits.max_pixels {
        return Err(ImageError::TooLarge { width, height, max_pixels: limits.max_pixels });
    }
    if width == 0 || height == 0 {
        return Err(ImageError::Empty { width, height });
    }
    let orientation = decoder.orientation().map_err(decode_error)?;
    let mut image = image::DynamicImage::from_decoder(decoder).map_err(decode_error)?;
    image.apply_orientation(orientation);
    let rgb = image.into_rgb8();
    Ok(RgbImage { width: rgb.width() as usize, height: rgb.height() as usize, pixels: rgb.into_raw() })
}

fn decode_error(e: image::ImageError) -> ImageError {
    ImageError::Decode { reason: e.to_string() }
}

//! A `/v1/systemone` request's `images`, as OpenJev takes them (`openjev/api.py`, `image_parts`,
//! and `engine.py`, `Engine.decide`): at most [`MAX_IMAGES`], each a `data:image/...;base64,...`
//! string or a `{content_type, base64}` object of JPEG, PNG, WebP or GIF, at most
//! [`MAX_IMAGE_BYTES`] decoded; a bad one is a 400 with OpenJev's message. They go ahead of the
//! state in the user turn (OpenAI image parts, then the text), so the chat template writes one
//! image placeholder each; the served model's vision tower encodes them and the placeholders are
//! expanded (`crate::serve::prompt_images::JobImages`, as chat requests' images are).

use super::request::{ImageArg, Rejection};
use crate::images::{EncodeError, EncodedImage};
use crate::serve::prompt_images::{ImageInput, JobImages};

/// OpenJev's `OPENJEV_MAX_IMAGES` default.
pub const MAX_IMAGES: usize = 8;
/// OpenJev's `OPENJEV_MAX_IMAGE_BYTES` default (5 MiB).
pub const MAX_IMAGE_BYTES: usize = 5 * 1024 * 1024;
/// The content types OpenJev takes.
const IMAGE_TYPES: [&str; 4] = ["image/jpeg", "image/png", "image/webp", "image/gif"];

/// One checked image: the data URL OpenJev sends upstream (and seeds with), and its bytes.
#[derive(Debug, Clone)]
pub struct Image {
    pub url: String,
    pub bytes: Vec<u8>,
}

/// The request's images checked, in order; the first bad one is a 400 with OpenJev's message.
pub fn parts(images: &[ImageArg]) -> Result<Vec<Image>, Rejection> {
    if images.len() > MAX_IMAGES {
        return Err(Rejection::semantic(format!("at most {MAX_IMAGES} images per request")));
    }
    images.iter().map(part).collect()
}

fn part(image: &ImageArg) -> Result<Image, Rejection> {
    let (content_type, data) = match image {
        ImageArg::Url(url) => {
            let (head, data) = url.split_once(',').unwrap_or((url, ""));
            let content_type = head.strip_prefix("data:").unwrap_or(head);
            let content_type = content_type.strip_suffix(";base64").unwrap_or(content_type);
            if !(url.contains(',') && head.starts_with("data:") && head.ends_with(";base64")) {
                return Err(Rejection::semantic("an image is a data:image/...;base64 string or a {content_type, base64} object"));
            }
            (content_type, data)
        }
        ImageArg::Object { content_type, base64 } => (content_type.as_str(), base64.as_str()),
    };
    if !IMAGE_TYPES.contains(&content_type) {
        return Err(Rejection::semantic(format!("image type {} is not supported; use JPEG, PNG, WebP or GIF", py_str_repr(content_type))));
    }
    // OpenJev bounds the decoded size by the text's length before decoding it.
    if (3 * (data.len() / 4)).saturating_sub(2) > MAX_IMAGE_BYTES {
        return Err(Rejection::semantic(format!("image data is larger than the {MAX_IMAGE_BYTES} byte limit")));
    }
    let bytes = strict_base64(data).ok_or_else(|| Rejection::semantic("image data is not valid base64"))?;
    if bytes.len() > MAX_IMAGE_BYTES {
        return Err(Rejection::semantic(format!("image is {} bytes; the limit is {MAX_IMAGE_BYTES}", bytes.len())));
    }
    Ok(Image { url: format!("data:{content_type};base64,{data}"), bytes })
}

/// Python's `base64.b64decode(data, validate=True)`: the standard alphabet only, padded to whole
/// quanta, padding only at the end.
fn strict_base64(data: &str) -> Option<Vec<u8>> {
    let body = data.trim_end_matches('=');
    let padding = data.len() - body.len();
    let alphabet = |c: char| c.is_ascii_alphanumeric() || c == '+' || c == '/';
    if !data.len().is_multiple_of(4) || padding > 2 || !body.chars().all(alphabet) {
        return None;
    }
    base64::decode(data).ok()
}

/// Python's `repr` of a string (the quotes it picks, its escapes of the characters a
/// content type may hold).
fn py_str_repr(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') { '"' } else { '\'' };
    let mut out = String::from(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

/// The images through the vision tower, in order (on the CPU: call it off the async workers); a
/// model that cannot take them (no vision tower: what OpenJev's upstream answers for a text
/// model) or an image it cannot read is a 400, "the model rejected this request: ..."; a tower
/// that fails on the device a 500.
pub fn encode(input: &Result<std::sync::Arc<ImageInput>, String>, images: &[Image]) -> Result<Vec<EncodedImage>, Rejection> {
    let rejected = |why: String| Rejection::semantic(format!("the model rejected this request: {why}"));
    let input = input.as_ref().map_err(|_| rejected("this model reads text only; send the state without images".into()))?;
    images
        .iter()
        .enumerate()
        .map(|(i, image)| {
            input.tower.encode(&image.bytes, &input.processor).map_err(|e| match e {
                EncodeError::Image(_) => rejected(format!("image {i}: {e}")),
                // The device failed, not the request: a 500, as any engine failure.
                EncodeError::Tower(_) => Rejection {
                    status: axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                    body: serde_json::json!({"detail": format!("image {i}: {e}")}),
                    retry_after: None,
                },
            })
        })
        .collect()
}

/// `prompt` (one placeholder per image, as the chat template writes them) with the images' soft
/// tokens in place, and the rows and cache keys its encode takes.
pub fn placed(input: &ImageInput, prompt: &[u32], images: &[EncodedImage]) -> Result<(Vec<u32>, JobImages), Rejection> {
    JobImages::new(input.tower.spec(), prompt, images.to_vec())
        .map_err(|e| Rejection::semantic(format!("the model rejected this request: the chat template's prompt: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(image: ImageArg) -> String {
        match parts(&[image]) {
            Ok(_) => String::new(),
            Err(r) => r.body["detail"].as_str().unwrap().to_string(),
        }
    }

    /// OpenJev's answers (`image_parts` in `openjev/api.py`, run on each).
    #[test]
    fn images_are_checked_as_openjev_checks_them() {
        let url = |s: &str| ImageArg::Url(s.to_string());
        assert_eq!(parts(&[url("data:image/png;base64,AAEC")]).unwrap()[0].bytes, [0, 1, 2]);
        let object = ImageArg::Object { content_type: "image/gif".into(), base64: "AAEC".into() };
        assert_eq!(parts(&[object]).unwrap()[0].url, "data:image/gif;base64,AAEC");
        let shape = "an image is a data:image/...;base64 string or a {content_type, base64} object";
        for (bad, want) in [
            (url("https://example.com/a.png"), shape),
            (url("data:image/png,AAEC"), shape),
            (url("data:image/png;base64"), shape),
            (url("data:image/bmp;base64,AAEC"), "image type 'image/bmp' is not supported; use JPEG, PNG, WebP or GIF"),
            (url("data:image/png;base64,AAE"), "image data is not valid base64"),
            (url("data:image/png;base64,AA EC"), "image data is not valid base64"),
            (url("data:image/png;base64,=AAA"), "image data is not valid base64"),
        ] {
            assert_eq!(message(bad), want);
        }
        let big = "A".repeat(4 * (MAX_IMAGE_BYTES / 3 + 2));
        assert_eq!(message(url(&format!("data:image/png;base64,{big}"))), "image data is larger than the 5242880 byte limit");
        let nine: Vec<ImageArg> = (0..9).map(|_| url("data:image/png;base64,AAEC")).collect();
        assert_eq!(parts(&nine).unwrap_err().body["detail"], "at most 8 images per request");
        assert_eq!(py_str_repr("it's"), "\"it's\"");
    }
}

//! Image content parts of chat messages, in OpenAI's shape: `{"type": "image_url", "image_url":
//! {"url": "data:image/png;base64,..."}}` in a user message. Only `data:` URLs are taken (base64,
//! PNG, JPEG or WebP): the server fetches nothing, and an http(s) URL is a 400 saying so. Each
//! bad part is named by its path (`messages[1].content[0]`).

use serde_json::Value;

use super::ApiError;

/// The MIME types of the image formats dg decodes.
const MIME_TYPES: [&str; 3] = ["image/png", "image/jpeg", "image/webp"];

/// One image part's bytes, and where it was in the request.
#[derive(Debug, Clone, PartialEq)]
pub struct ImagePart {
    pub param: String,
    pub bytes: Vec<u8>,
}

/// Whether `part` is an image part (checked by [`image_parts`]).
pub fn is_image_part(part: &Value) -> bool {
    part["type"] == "image_url"
}

/// The image parts of `messages` in the order the chat template meets them (message by message,
/// part by part), decoded from their data URLs.
pub fn image_parts(messages: &[Value]) -> Result<Vec<ImagePart>, ApiError> {
    let mut parts = Vec::new();
    for (i, message) in messages.iter().enumerate() {
        let Some(content) = message["content"].as_array() else { continue };
        for (j, part) in content.iter().enumerate().filter(|(_, p)| is_image_part(p)) {
            let param = format!("messages[{i}].content[{j}]");
            if message["role"] != "user" {
                return Err(ApiError::invalid(Some(&param), format!("{param}: images are taken in user messages only")));
            }
            let url = part
                .pointer("/image_url/url")
                .and_then(Value::as_str)
                .ok_or_else(|| ApiError::invalid(Some(&param), format!("{param}: an image_url part needs image_url.url, a data: URL")))?;
            parts.push(ImagePart { bytes: data_url(url, &param)?, param });
        }
    }
    Ok(parts)
}

/// The bytes of a `data:<image type>;base64,<data>` URL.
fn data_url(url: &str, param: &str) -> Result<Vec<u8>, ApiError> {
    let bad = |what: String| ApiError::invalid(Some(param), format!("{param}: {what}"));
    let Some(rest) = url.strip_prefix("data:") else {
        let scheme = url.split_once(':').map_or("", |(s, _)| s);
        return Err(bad(if ["http", "https"].contains(&scheme.to_ascii_lowercase().as_str()) {
            "image URLs are not fetched (the server reaches nothing outside): send the image inline as data:image/png;base64,...".into()
        } else {
            "the image must be a data: URL (data:image/png;base64,...)".into()
        }));
    };
    let (header, data) = rest.split_once(',').ok_or_else(|| bad("the data: URL has no ',' before its data".into()))?;
    let Some(mime) = header.strip_suffix(";base64") else {
        return Err(bad(format!("the data: URL must be base64 (data:{header};base64,...)")));
    };
    if !MIME_TYPES.contains(&mime.to_ascii_lowercase().as_str()) {
        return Err(bad(format!("image type {mime:?} is not read (one of {})", MIME_TYPES.join(", "))));
    }
    base64::decode(data).map_err(|e| bad(format!("the data: URL's base64 does not decode: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parts(url: &str) -> Result<Vec<ImagePart>, ApiError> {
        image_parts(&[
            json!({"role": "system", "content": "s"}),
            json!({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": url}}]}),
        ])
    }

    #[test]
    fn data_urls_give_their_bytes_and_everything_else_is_named() {
        assert_eq!(
            parts("data:image/png;base64,AAEC").unwrap(),
            [ImagePart { param: "messages[1].content[1]".into(), bytes: vec![0, 1, 2] }]
        );
        for (url, needle) in [
            ("https://example.com/cat.png", "not fetched"),
            ("HTTP://example.com/cat.png", "not fetched"),
            ("file:///etc/passwd", "must be a data: URL"),
            ("data:text/plain;base64,AAEC", "\"text/plain\" is not read"),
            ("data:image/png,AAEC", "must be base64"),
            ("data:image/png;base64,@@@", "does not decode"),
            ("data:image/png;base64", "no ','"),
        ] {
            let e = parts(url).unwrap_err();
            assert_eq!(e.param.as_deref(), Some("messages[1].content[1]"), "{url}");
            assert!(e.message.contains(needle), "{url}: {}", e.message);
        }
        let assistant = image_parts(&[
            json!({"role": "assistant", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]}),
        ]);
        assert!(assistant.unwrap_err().message.contains("user messages only"));
    }
}

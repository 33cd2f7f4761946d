//! A `/v1/systemone` body checked as OpenJev's pydantic models check it (`openjev/api.py`,
//! `SystemOneRequest`), and the error bodies it answers with.
//!
//! Field problems are 422s with FastAPI's `{"detail": [{type, loc, msg, input}]}`; an unknown
//! question type is Jev's generic 400 (`{"detail": {"error_type": "api_usage_error", "message":
//! "Invalid request."}}`); requests that are well formed but cannot be answered are 400s with a
//! plain-string detail ([`Rejection::semantic`]).

use axum::http::StatusCode;

use super::pyjson::Json;
use super::template::Kind;

/// A checked request.
#[derive(Debug)]
pub struct SystemOne {
    pub state: Json,
    pub model: String,
    /// In the order sent: (id, type, the question as pydantic dumps it).
    pub questions: Vec<(String, Kind, Json)>,
    /// As sent (checked by [`super::images::parts`]); empty when none.
    pub images: Vec<ImageArg>,
    pub steps: Option<usize>,
    pub samples: Option<usize>,
    pub think: Option<usize>,
    pub sequential: Option<bool>,
}

/// One of `images`: OpenJev's `Union[str, ImageObject]`.
#[derive(Debug, Clone)]
pub enum ImageArg {
    /// A `data:image/...;base64,...` URL.
    Url(String),
    /// `{content_type, base64}`.
    Object { content_type: String, base64: String },
}

/// An error answer: status and body.
#[derive(Debug)]
pub struct Rejection {
    pub status: StatusCode,
    pub body: serde_json::Value,
    /// `retry-after` seconds, where the client should retry.
    pub retry_after: Option<u32>,
}

impl Rejection {
    /// Jev's `{"detail": {"error_type", "message"}}` shape.
    pub fn typed(status: StatusCode, error_type: &str, message: impl Into<String>) -> Self {
        let body = serde_json::json!({"detail": {"error_type": error_type, "message": message.into()}});
        Rejection { status, body, retry_after: None }
    }

    /// A well-formed request that cannot be answered: 400 with a plain-string detail.
    pub fn semantic(message: impl Into<String>) -> Self {
        Rejection { status: StatusCode::BAD_REQUEST, body: serde_json::json!({"detail": message.into()}), retry_after: None }
    }

    fn fields(errors: Vec<serde_json::Value>) -> Self {
        Rejection { status: StatusCode::UNPROCESSABLE_ENTITY, body: serde_json::json!({"detail": errors}), retry_after: None }
    }
}

/// One FastAPI validation error entry.
fn entry(kind: &str, loc: &[&str], msg: &str, input: &Json) -> serde_json::Value {
    entry_at(kind, serde_json::json!(loc), msg, input)
}

/// [`entry`] at a location that holds list indices (ints, as pydantic writes them).
fn entry_at(kind: &str, loc: serde_json::Value, msg: &str, input: &Json) -> serde_json::Value {
    let input: serde_json::Value = serde_json::from_str(&input.dumps(false, false)).unwrap_or(serde_json::Value::Null);
    serde_json::json!({"type": kind, "loc": loc, "msg": msg, "input": input})
}

/// `str | dict | list` (`JSONContent`), and with `None` (`Described`).
fn content(v: &Json, nullable: bool) -> bool {
    matches!(v, Json::String(_) | Json::Object(_) | Json::Array(_)) || (nullable && *v == Json::Null)
}

/// An optional bounded int field: pydantic's lax int (an integral float counts).
fn bounded(body: &Json, name: &str, (lo, hi): (i64, i64), errors: &mut Vec<serde_json::Value>) -> Option<usize> {
    let v = body.get(name).filter(|v| **v != Json::Null)?;
    let n = match v {
        Json::Number(n) => n.as_i64().or_else(|| n.as_f64().filter(|x| x.fract() == 0.0 && x.abs() < 9e15).map(|x| x as i64)),
        _ => None,
    };
    match n {
        None => errors.push(entry("int_type", &["body", name], "Input should be a valid integer", v)),
        Some(n) if n < lo => {
            errors.push(entry("greater_than_equal", &["body", name], &format!("Input should be greater than or equal to {lo}"), v))
        }
        Some(n) if n > hi => {
            errors.push(entry("less_than_equal", &["body", name], &format!("Input should be less than or equal to {hi}"), v))
        }
        Some(n) => return Some(n as usize),
    }
    None
}

/// Parses and checks a body.
pub fn parse(body: &[u8]) -> Result<SystemOne, Rejection> {
    let body: Json = serde_json::from_slice(body).map_err(|e| {
        Rejection::fields(vec![serde_json::json!({"type": "json_invalid", "loc": ["body", e.column()], "msg": "JSON decode error",
            "input": {}, "ctx": {"error": e.to_string()}})])
    })?;
    let Json::Object(_) = body else {
        return Err(Rejection::fields(vec![entry(
            "model_attributes_type",
            &["body"],
            "Input should be a valid dictionary or object to extract fields from",
            &body,
        )]));
    };
    let mut errors = Vec::new();
    let missing = |name: &str, errors: &mut Vec<serde_json::Value>| errors.push(entry("missing", &["body", name], "Field required", &body));
    let state = match body.get("state") {
        None => {
            missing("state", &mut errors);
            Json::Null
        }
        Some(s) if content(s, false) => s.clone(),
        Some(s) => {
            errors.push(entry("string_type", &["body", "state", "str"], "Input should be a valid string", s));
            Json::Null
        }
    };
    let model = match body.get("model") {
        None => {
            missing("model", &mut errors);
            String::new()
        }
        Some(Json::String(m)) => m.clone(),
        Some(m) => {
            errors.push(entry("string_type", &["body", "model"], "Input should be a valid string", m));
            String::new()
        }
    };
    let mut questions = Vec::new();
    match body.get("questions") {
        None => missing("questions", &mut errors),
        Some(Json::Object(entries)) => {
            let entries = Json::dict(entries);
            if entries.is_empty() {
                errors.push(entry(
                    "too_short",
                    &["body", "questions"],
                    "Dictionary should have at least 1 item after validation, not 0",
                    &Json::Object(entries.clone()),
                ));
            }
            for (id, q) in entries {
                match question(&id, &q, &mut errors)? {
                    Some((kind, dumped)) => questions.push((id, kind, dumped)),
                    None => continue,
                }
            }
        }
        Some(q) => errors.push(entry("dict_type", &["body", "questions"], "Input should be a valid dictionary", q)),
    }
    let images = match body.get("images") {
        None | Some(Json::Null) => Vec::new(),
        Some(Json::Array(items)) => items.iter().enumerate().filter_map(|(i, item)| image(i, item, &mut errors)).collect(),
        Some(v) => {
            errors.push(entry("list_type", &["body", "images"], "Input should be a valid list", v));
            Vec::new()
        }
    };
    let steps = bounded(&body, "steps", (1, 8), &mut errors);
    let samples = bounded(&body, "samples", (1, 32), &mut errors);
    let think = bounded(&body, "think", (0, 4096), &mut errors);
    let sequential = match body.get("sequential") {
        None | Some(Json::Null) => None,
        Some(Json::Bool(b)) => Some(*b),
        Some(v) => {
            errors.push(entry("bool_type", &["body", "sequential"], "Input should be a valid boolean", v));
            None
        }
    };
    if !errors.is_empty() {
        return Err(Rejection::fields(errors));
    }
    Ok(SystemOne { state, model, questions, images, steps, samples, think, sequential })
}

/// Item `i` of `images` as pydantic checks `Union[str, ImageObject]`: a string, else an object
/// with string `content_type` and `base64`; a bad item gets both members' errors.
fn image(i: usize, item: &Json, errors: &mut Vec<serde_json::Value>) -> Option<ImageArg> {
    let loc = |tail: &[&str]| {
        let mut loc = serde_json::json!(["body", "images", i]);
        loc.as_array_mut().expect("an array").extend(tail.iter().map(|t| serde_json::json!(t)));
        loc
    };
    let as_str =
        |errors: &mut Vec<serde_json::Value>| errors.push(entry_at("string_type", loc(&["str"]), "Input should be a valid string", item));
    match item {
        Json::String(url) => Some(ImageArg::Url(url.clone())),
        Json::Object(_) => {
            let mut missed = Vec::new();
            let mut field = |name: &str| match item.get(name) {
                Some(Json::String(v)) => Some(v.clone()),
                None => {
                    missed.push(entry_at("missing", loc(&["ImageObject", name]), "Field required", item));
                    None
                }
                Some(v) => {
                    missed.push(entry_at("string_type", loc(&["ImageObject", name]), "Input should be a valid string", v));
                    None
                }
            };
            let (content_type, base64) = (field("content_type"), field("base64"));
            match (content_type, base64) {
                (Some(content_type), Some(base64)) => Some(ImageArg::Object { content_type, base64 }),
                _ => {
                    as_str(errors);
                    errors.extend(missed);
                    None
                }
            }
        }
        _ => {
            as_str(errors);
            errors.push(entry_at(
                "model_attributes_type",
                loc(&["ImageObject"]),
                "Input should be a valid dictionary or object to extract fields from",
                item,
            ));
            None
        }
    }
}

/// One question: its type and its fields as `model_dump` gives them (declared fields only, absent
/// ones `None`); `Err` for an unknown type (Jev's generic 400).
fn question(id: &str, q: &Json, errors: &mut Vec<serde_json::Value>) -> Result<Option<(Kind, Json)>, Rejection> {
    let at = |field: &'static str| ["body", "questions", id, field];
    let Json::Object(_) = q else {
        errors.push(entry(
            "model_attributes_type",
            &["body", "questions", id],
            "Input should be a valid dictionary or object to extract fields from",
            q,
        ));
        return Ok(None);
    };
    let kind = match q.get("type") {
        None => {
            errors.push(entry("union_tag_not_found", &["body", "questions", id], "Unable to extract tag using discriminator 'type'", q));
            return Ok(None);
        }
        Some(Json::String(t)) if t == "noul" => Kind::Noul,
        Some(Json::String(t)) if t == "choice" => Kind::Choice,
        Some(Json::String(t)) if t == "score" => Kind::Score,
        Some(_) => return Err(Rejection::typed(StatusCode::BAD_REQUEST, "api_usage_error", "Invalid request.")),
    };
    let instructions = q.get("instructions").cloned().unwrap_or(Json::Null);
    if !content(&instructions, true) {
        errors.push(entry("string_type", &at("instructions"), "Input should be a valid string", &instructions));
    }
    let criteria = q.get("criteria").cloned();
    let criteria = match (kind, criteria) {
        (Kind::Noul, None | Some(Json::Null)) => Json::Null,
        (Kind::Noul, Some(Json::Object(sides))) => {
            let sides = Json::Object(sides);
            let side = |name: &str| sides.get(name).cloned().unwrap_or(Json::Null);
            for name in ["true", "false"] {
                if !content(&side(name), true) {
                    errors.push(entry(
                        "string_type",
                        &["body", "questions", id, "criteria", name],
                        "Input should be a valid string",
                        &side(name),
                    ));
                }
            }
            Json::Object(vec![("true".into(), side("true")), ("false".into(), side("false"))])
        }
        (Kind::Choice, Some(Json::Object(choices))) => {
            for (name, desc) in &choices {
                if !content(desc, true) {
                    errors.push(entry("string_type", &["body", "questions", id, "criteria", name], "Input should be a valid string", desc));
                }
            }
            Json::Object(choices)
        }
        (Kind::Score, Some(Json::Array(levels))) => {
            if levels.is_empty() {
                errors.push(entry(
                    "too_short",
                    &at("criteria"),
                    "List should have at least 1 item after validation, not 0",
                    &Json::Array(levels.clone()),
                ));
            }
            for (i, level) in levels.iter().enumerate() {
                if !content(level, false) {
                    let i = i.to_string();
                    errors.push(entry("string_type", &["body", "questions", id, "criteria", &i], "Input should be a valid string", level));
                }
            }
            Json::Array(levels)
        }
        (Kind::Choice | Kind::Score, None) => {
            errors.push(entry("missing", &at("criteria"), "Field required", q));
            Json::Null
        }
        (Kind::Noul, Some(c)) => {
            errors.push(entry(
                "model_attributes_type",
                &at("criteria"),
                "Input should be a valid dictionary or object to extract fields from",
                &c,
            ));
            Json::Null
        }
        (Kind::Choice, Some(c)) => {
            errors.push(entry("dict_type", &at("criteria"), "Input should be a valid dictionary", &c));
            Json::Null
        }
        (Kind::Score, Some(c)) => {
            errors.push(entry("list_type", &at("criteria"), "Input should be a valid list", &c));
            Json::Null
        }
    };
    let name = match kind {
        Kind::Noul => "noul",
        Kind::Choice => "choice",
        Kind::Score => "score",
    };
    let dumped = Json::Object(vec![
        ("type".into(), Json::String(name.into())),
        ("instructions".into(), instructions),
        ("criteria".into(), criteria),
    ]);
    Ok(Some((kind, dumped)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errors(images: &str) -> Vec<(String, serde_json::Value)> {
        let body = format!(r#"{{"state": "x", "model": "m", "questions": {{"q": {{"type": "noul"}}}}, "images": {images}}}"#);
        let r = parse(body.as_bytes()).unwrap_err();
        assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
        r.body["detail"].as_array().unwrap().iter().map(|e| (e["type"].as_str().unwrap().to_string(), e["loc"].clone())).collect()
    }

    /// pydantic's errors for `list[Union[str, ImageObject]] | None` (`openjev/api.py`): each
    /// member's, its tag in the location.
    #[test]
    fn images_are_validated_as_pydantic_validates_them() {
        let ok = parse(
            br#"{"state": "x", "model": "m", "questions": {"q": {"type": "noul"}},
            "images": ["data:image/png;base64,AAAA", {"content_type": "image/png", "base64": "AAAA", "more": 1}]}"#,
        )
        .unwrap();
        assert!(matches!(&ok.images[..], [ImageArg::Url(_), ImageArg::Object { .. }]));
        use serde_json::json;
        assert_eq!(errors("\"one\""), [("list_type".to_string(), json!(["body", "images"]))]);
        assert_eq!(
            errors("[5]"),
            [
                ("string_type".to_string(), json!(["body", "images", 0, "str"])),
                ("model_attributes_type".to_string(), json!(["body", "images", 0, "ImageObject"]))
            ]
        );
        assert_eq!(
            errors(r#"["ok", {"content_type": 3}]"#),
            [
                ("string_type".to_string(), json!(["body", "images", 1, "str"])),
                ("string_type".to_string(), json!(["body", "images", 1, "ImageObject", "content_type"])),
                ("missing".to_string(), json!(["body", "images", 1, "ImageObject", "base64"]))
            ]
        );
    }
}

//! OpenAI's request and error shapes: parsing and checking `POST /v1/chat/completions` and
//! `POST /v1/completions` bodies field by field (each bad field named in the error's `param`), the
//! fields that mean nothing for a diffusion model (accepted as documented no-ops, or refused with a
//! 400), and the `dg` extension object with the diffusion settings. Chat requests' tools and the
//! tool calls and reasoning of replies: [`tools`]; their image parts: [`images`]; vLLM's structured
//! reads: [`vllm`].

pub mod images;
pub mod tools;
pub mod vllm;

use axum::http::StatusCode;
use serde_json::{Map, Value, json};
use tools::Chat;

/// An error answered in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl ApiError {
    /// A 400 `invalid_request_error` about `param`.
    pub fn invalid(param: Option<&str>, message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: param.map(str::to_string),
            code: None,
        }
    }

    pub fn with(mut self, status: StatusCode, code: &'static str) -> Self {
        self.status = status;
        self.code = Some(code);
        self
    }

    pub fn body(&self) -> Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }
}

/// Which endpoint a body is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completion,
}

/// The prompt as given.
#[derive(Debug, Clone, PartialEq)]
pub enum PromptInput {
    /// A conversation (and its tools), to go through the chat template.
    Chat(Chat),
    /// Completion text, tokenized with the tokenizer's special tokens (e.g. `<bos>`).
    Text(String),
    /// Completion token ids, as given.
    Ids(Vec<u64>),
}

/// The `dg` extension object: drafts and the diffusion settings.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Extension {
    pub drafts: bool,
    pub steps: Option<usize>,
    pub entropy_bound: Option<f64>,
    pub t_min: Option<f64>,
    pub t_max: Option<f64>,
    pub stability_threshold: Option<usize>,
    pub confidence_threshold: Option<f64>,
    /// `dg.test_output`: the reply's text per attempt, for `dg serve --test-hooks` only.
    pub test_output: Vec<String>,
}

/// A checked request.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub model: String,
    pub prompt: PromptInput,
    pub max_tokens: Option<usize>,
    pub stream: bool,
    pub stop: Vec<String>,
    pub seed: Option<u64>,
    pub dg: Extension,
}

/// Fields accepted and ignored (docs/serving.md's field table says why).
const IGNORED: &[&str] = &["temperature", "top_p", "user", "stream_options", "metadata", "store", "service_tier"];

/// Fields refused with a 400 unless they hold their no-op value.
fn inert(field: &str, value: &Value) -> Option<bool> {
    let zero = |v: &Value| v.as_f64() == Some(0.0);
    Some(match field {
        "n" | "best_of" => value.as_u64() == Some(1),
        "presence_penalty" | "frequency_penalty" => zero(value),
        "logprobs" => value == &Value::Bool(false),
        "top_logprobs" => zero(value),
        "echo" => value == &Value::Bool(false),
        "logit_bias" => value.as_object().is_some_and(Map::is_empty),
        "functions" => value.as_array().is_some_and(Vec::is_empty),
        "function_call" => value == "none",
        "response_format" => value.get("type").is_some_and(|t| t == "text"),
        "suffix" => value.as_str() == Some(""),
        "modalities" => value.as_array().is_some_and(|a| a.iter().all(|m| m == "text")),
        _ => return None,
    })
}

/// Parses and checks a body of `endpoint`.
pub fn parse(endpoint: Endpoint, body: &[u8]) -> Result<Request, ApiError> {
    let text = std::str::from_utf8(body).map_err(|e| ApiError::invalid(None, format!("the request body is not valid UTF-8: {e}")))?;
    let value: Value =
        serde_json::from_str(text).map_err(|e| ApiError::invalid(None, format!("the request body is not valid JSON: {e}")))?;
    let Value::Object(map) = value else {
        return Err(ApiError::invalid(None, "the request body must be a JSON object"));
    };
    let prompt_field = match endpoint {
        Endpoint::Chat => "messages",
        Endpoint::Completion => "prompt",
    };
    let known = ["model", prompt_field, "max_tokens", "max_completion_tokens", "stream", "stop", "seed", "dg"];
    let chat_fields = if endpoint == Endpoint::Chat { tools::FIELDS } else { &[] };
    for (key, value) in &map {
        if known.contains(&key.as_str()) || chat_fields.contains(&key.as_str()) || IGNORED.contains(&key.as_str()) || value.is_null() {
            continue;
        }
        match inert(key, value) {
            Some(true) => {}
            Some(false) => {
                return Err(ApiError::invalid(
                    Some(key),
                    format!("{key} = {value} is not supported by this server (see the field table of docs/serving.md)"),
                ));
            }
            None => return Err(ApiError::invalid(Some(key), format!("unrecognized request argument: {key}"))),
        }
    }
    let field = |k: &str| map.get(k).filter(|v| !v.is_null());
    let model = match field("model") {
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err(ApiError::invalid(Some("model"), "model must be a string")),
        None => return Err(ApiError::invalid(Some("model"), "model is required")),
    };
    let prompt = match endpoint {
        Endpoint::Chat => PromptInput::Chat(tools::chat(&map)?),
        Endpoint::Completion => completion_prompt(field("prompt"))?,
    };
    let max_tokens = match (field("max_tokens"), field("max_completion_tokens")) {
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(Some("max_tokens"), "give max_tokens or max_completion_tokens, not both"));
        }
        (Some(v), None) => Some(positive(v, "max_tokens")?),
        (None, Some(v)) => Some(positive(v, "max_completion_tokens")?),
        (None, None) => None,
    };
    let stream = match field("stream") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(ApiError::invalid(Some("stream"), "stream must be a boolean")),
    };
    let seed = match field("seed") {
        None => None,
        Some(v) => Some(
            v.as_u64()
                .or_else(|| v.as_i64().map(|s| s as u64))
                .ok_or_else(|| ApiError::invalid(Some("seed"), "seed must be an integer"))?,
        ),
    };
    Ok(Request { model, prompt, max_tokens, stream, stop: stop(field("stop"))?, seed, dg: extension(field("dg"))? })
}

/// An integer >= 1.
fn positive(v: &Value, param: &str) -> Result<usize, ApiError> {
    match v.as_u64() {
        Some(n) if n >= 1 => Ok(usize::try_from(n).unwrap_or(usize::MAX)),
        _ => Err(ApiError::invalid(Some(param), format!("{param} must be an integer >= 1 (got {v})"))),
    }
}

fn completion_prompt(v: Option<&Value>) -> Result<PromptInput, ApiError> {
    let p = Some("prompt");
    let wrong = || ApiError::invalid(p, "prompt must be a string, a list of one string, or a list of token ids");
    let prompt = match v {
        None => return Err(ApiError::invalid(p, "prompt is required")),
        Some(Value::String(s)) => PromptInput::Text(s.clone()),
        Some(Value::Array(items)) => match items.as_slice() {
            [Value::String(s)] => PromptInput::Text(s.clone()),
            [] => return Err(ApiError::invalid(p, "prompt must not be empty")),
            items if items.iter().all(Value::is_u64) => PromptInput::Ids(items.iter().filter_map(Value::as_u64).collect()),
            [Value::String(_), ..] => return Err(ApiError::invalid(p, "one prompt per request (n > 1 is not supported)")),
            _ => return Err(wrong()),
        },
        Some(_) => return Err(wrong()),
    };
    if prompt == PromptInput::Text(String::new()) {
        return Err(ApiError::invalid(p, "prompt must not be empty"));
    }
    Ok(prompt)
}

fn stop(v: Option<&Value>) -> Result<Vec<String>, ApiError> {
    let p = Some("stop");
    let list = match v {
        None => return Ok(Vec::new()),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => items
            .iter()
            .map(|s| s.as_str().map(str::to_string).ok_or_else(|| ApiError::invalid(p, "stop must be a string or a list of strings")))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(ApiError::invalid(p, "stop must be a string or a list of strings")),
    };
    if list.len() > 4 || list.iter().any(String::is_empty) {
        return Err(ApiError::invalid(p, "stop takes at most 4 non-empty strings"));
    }
    Ok(list)
}

fn extension(v: Option<&Value>) -> Result<Extension, ApiError> {
    let Some(v) = v else { return Ok(Extension::default()) };
    let Value::Object(map) = v else {
        return Err(ApiError::invalid(Some("dg"), "dg must be an object"));
    };
    let mut ext = Extension::default();
    for (key, value) in map {
        let param = format!("dg.{key}");
        let number =
            || value.as_f64().filter(|x| x.is_finite()).ok_or_else(|| ApiError::invalid(Some(&param), format!("{param} must be a number")));
        let count = || {
            value.as_u64().map(|n| n as usize).ok_or_else(|| ApiError::invalid(Some(&param), format!("{param} must be an integer >= 0")))
        };
        match key.as_str() {
            "drafts" => ext.drafts = value.as_bool().ok_or_else(|| ApiError::invalid(Some(&param), "dg.drafts must be a boolean"))?,
            "steps" => ext.steps = Some(count()?),
            "entropy_bound" => ext.entropy_bound = Some(number()?),
            "t_min" => ext.t_min = Some(number()?),
            "t_max" => ext.t_max = Some(number()?),
            "stability_threshold" => ext.stability_threshold = Some(count()?),
            "confidence_threshold" => ext.confidence_threshold = Some(number()?),
            "test_output" => {
                ext.test_output = match value {
                    Value::String(s) => vec![s.clone()],
                    Value::Array(items) if items.iter().all(Value::is_string) => {
                        items.iter().filter_map(Value::as_str).map(str::to_string).collect()
                    }
                    _ => return Err(ApiError::invalid(Some(&param), "dg.test_output must be a string or a list of strings")),
                }
            }
            _ => return Err(ApiError::invalid(Some(&param), format!("unknown extension field {param}"))),
        }
    }
    Ok(ext)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(endpoint: Endpoint, body: &str) -> ApiError {
        parse(endpoint, body.as_bytes()).unwrap_err()
    }

    #[test]
    fn chat_requests_parse_with_the_extension() {
        let body = r#"{"model": "m", "messages": [{"role": "system", "content": "s"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
            "max_tokens": 5, "stream": true, "stop": "x", "seed": 3, "temperature": 0.7,
            "dg": {"drafts": true, "steps": 4, "t_min": 0.1}}"#;
        let r = parse(Endpoint::Chat, body.as_bytes()).unwrap();
        let PromptInput::Chat(chat) = &r.prompt else { panic!("{:?}", r.prompt) };
        assert_eq!(chat.messages[1]["content"][1]["text"], "b");
        assert_eq!(chat.tool_choice, tools::ToolChoice::None);
        assert_eq!((r.max_tokens, r.stream, r.seed), (Some(5), true, Some(3)));
        assert_eq!(r.stop, ["x"]);
        assert!(r.dg.drafts && r.dg.steps == Some(4) && r.dg.t_min == Some(0.1));
    }

    #[test]
    fn bad_fields_are_named() {
        let c = Endpoint::Chat;
        assert_eq!(err(c, "{").param, None);
        assert_eq!(err(c, r#"{"model": "m", "messages": []}"#).param.as_deref(), Some("messages"));
        assert_eq!(err(c, r#"{"model": 1, "messages": [{"role": "user", "content": "a"}]}"#).param.as_deref(), Some("model"));
        let with = |extra: &str| format!(r#"{{"model": "m", "messages": [{{"role": "user", "content": "a"}}], {extra}}}"#);
        for (extra, param) in [
            (r#""max_tokens": 0"#, "max_tokens"),
            (r#""max_tokens": "5""#, "max_tokens"),
            (r#""n": 2"#, "n"),
            (r#""logprobs": true"#, "logprobs"),
            (r#""frequency_penalty": 0.5"#, "frequency_penalty"),
            (r#""tools": [{"type": "function"}]"#, "tools[0]"),
            (r#""tool_choice": "required""#, "tool_choice"),
            (r#""chat_template_kwargs": {"messages": []}"#, "chat_template_kwargs"),
            (r#""stop": ["", "a"]"#, "stop"),
            (r#""dg": {"stpes": 3}"#, "dg.stpes"),
            (r#""bogus": 1"#, "bogus"),
        ] {
            let e = err(c, &with(extra));
            assert_eq!((e.status, e.param.as_deref()), (StatusCode::BAD_REQUEST, Some(param)), "{extra}: {}", e.message);
        }
        assert!(parse(c, with(r#""n": 1, "presence_penalty": 0, "top_p": 0.9"#).as_bytes()).is_ok());
        assert!(err(c, "\"x\"").message.contains("JSON object"));
        assert!(parse(c, b"{\"model\": \"\xff\"}").unwrap_err().message.contains("UTF-8"));
    }

    #[test]
    fn completion_prompts() {
        let p = |s: &str| parse(Endpoint::Completion, format!(r#"{{"model": "m", "prompt": {s}}}"#).as_bytes());
        assert_eq!(p(r#""hi""#).unwrap().prompt, PromptInput::Text("hi".into()));
        assert_eq!(p("[2, 17]").unwrap().prompt, PromptInput::Ids(vec![2, 17]));
        assert!(p(r#""""#).is_err() && p("[]").is_err() && p(r#"["a", "b"]"#).is_err() && p("3").is_err());
    }
}

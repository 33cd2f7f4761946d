//! vLLM's structured generation mode on `/v1/completions` and `/v1/chat/completions`
//! (vllm-project/vllm PR #57250 and the fields it builds on), the wire OpenJev's `engine.py` speaks
//! to its upstream: `vllm_xargs` (`diffusion_seed_canvas`, `diffusion_canvas_length`,
//! `diffusion_pinned`, `diffusion_max_steps`, `diffusion_read_only`, `diffusion_constrained`),
//! `logprob_token_ids` (at most 128), `logprobs`/`top_logprobs` (at most 20) and
//! `return_tokens_as_token_ids`, checked with vLLM's messages (`validate_diffusion_sampling_params`,
//! `SamplingParams._validate_logprobs`, the protocols' `check_logprobs`) as 400s.
//!
//! A read-only request is a read ([`dg_sampler::read`]) of the seed canvas after the prompt, with
//! its pins and step cap. As vLLM answers it: the reply is the canvas's first `max_tokens` rows
//! (at most the canvas), each the row's most likely token, with temperature-1 log-probabilities
//! per row: the `top_logprobs` most likely tokens, then every id of `logprob_token_ids` not among
//! them (the set `/v1/systemone` takes its entropy over), each the f32 value widened to f64 as
//! vLLM's `tolist()` writes it. A read of more than one step draws from the request's `seed`
//! (else the server's). Served only read-only: a canvas that is generated (`diffusion_read_only`
//! unset), `diffusion_constrained`, `diffusion_samples` (of a later revision of the PR) and a
//! read-only request without a seed canvas are refused with a 400 naming the field.

use serde_json::{Map, Value, json};

use super::{ApiError, Endpoint, Request};

/// vLLM's `max_logprobs` default: the most `top_logprobs` (chat) or `logprobs` (completions).
pub const MAX_LOGPROBS: usize = 20;
/// vLLM's `MAX_LOGPROB_TOKEN_IDS`: the most ids of `logprob_token_ids`.
pub const MAX_LOGPROB_TOKEN_IDS: usize = 128;

/// The body fields this wire adds to OpenAI's.
const FIELDS: [&str; 5] = ["vllm_xargs", "logprob_token_ids", "return_tokens_as_token_ids", "logprobs", "top_logprobs"];

/// What the served model allows.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub vocab_size: usize,
    /// The served canvas (`canvas_length`).
    pub canvas_length: usize,
}

/// A checked read-only request.
#[derive(Debug, Clone, PartialEq)]
pub struct Structured {
    /// The OpenAI part (model, prompt, `max_tokens`, seed).
    pub request: Request,
    pub canvas: Vec<u32>,
    /// Per canvas row, whether it is pinned (`None`: no pins).
    pub pinned: Option<Vec<bool>>,
    pub steps: usize,
    /// Tokens per row besides the requested ids (`None`: no logprobs asked).
    pub top: Option<usize>,
    pub token_ids: Vec<u32>,
    /// Tokens written `token_id:ID` rather than as text.
    pub as_ids: bool,
}

impl Structured {
    /// The rows the reply covers: the first `max_tokens` of the canvas (all of it by default).
    pub fn rows(&self) -> usize {
        self.request.max_tokens.map_or(self.canvas.len(), |m| m.min(self.canvas.len()))
    }

    /// The read's slots: every reply row, with the requested ids as its labels (the row's seed id
    /// where none are asked: a slot needs one).
    pub fn slots(&self) -> Vec<dg_sampler::Slot> {
        let labels = |row: usize| if self.token_ids.is_empty() { vec![self.canvas[row]] } else { self.token_ids.clone() };
        (0..self.rows()).map(|position| dg_sampler::Slot { position, labels: labels(position) }).collect()
    }
}

fn invalid(param: &str, message: impl Into<String>) -> ApiError {
    ApiError::invalid(Some(param), message)
}

/// The structured read of a body, `None` when the body uses none of this wire's fields (an
/// ordinary request); a body with them that is not a read-only structured request is refused.
pub fn parse(endpoint: Endpoint, body: &[u8], limits: Limits) -> Result<Option<Structured>, ApiError> {
    let Ok(Value::Object(mut map)) = serde_json::from_slice::<Value>(body) else { return Ok(None) };
    let present = |k: &str, map: &Map<String, Value>| map.get(k).is_some_and(|v| !v.is_null());
    if !present("vllm_xargs", &map) && !present("logprob_token_ids", &map) && !present("return_tokens_as_token_ids", &map) {
        return Ok(None);
    }
    let taken: Map<String, Value> =
        FIELDS.iter().filter_map(|&k| map.remove(k).filter(|v| !v.is_null()).map(|v| (k.to_string(), v))).collect();
    let request = super::parse(endpoint, &serde_json::to_vec(&map).expect("a JSON map serializes"))?;
    let top = logprobs(endpoint, &taken)?;
    let token_ids = token_ids(taken.get("logprob_token_ids"), limits.vocab_size)?;
    let as_ids = match taken.get("return_tokens_as_token_ids") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(invalid("return_tokens_as_token_ids", "return_tokens_as_token_ids must be a boolean")),
    };
    let xargs = match taken.get("vllm_xargs") {
        None => Map::new(),
        Some(Value::Object(m)) => m.iter().map(|(k, v)| Ok((k.clone(), narrowed(k, v)?))).collect::<Result<_, ApiError>>()?,
        Some(_) => return Err(invalid("vllm_xargs", "vllm_xargs must be an object")),
    };
    let x = xargs::check(&xargs, limits, !token_ids.is_empty())?;
    let refuse = |field: &str, why: &str| Err(invalid("vllm_xargs", format!("{field}: {why}")));
    if !x.read_only {
        return refuse("diffusion_read_only", "this server serves vllm_xargs and logprob_token_ids on read-only requests only");
    }
    if x.constrained {
        return refuse("diffusion_constrained", "not supported by this server");
    }
    // A later revision of the PR fans a read out into `diffusion_samples` re-noised children.
    if xargs.get("diffusion_samples").is_some_and(|n| n != &json!(1)) {
        return refuse("diffusion_samples", "not supported by this server (send one request per sample)");
    }
    let Some(canvas) = x.seed else {
        return refuse("diffusion_seed_canvas", "a read-only request on this server needs a seed canvas");
    };
    if request.stream {
        return Err(invalid("stream", "a read-only request is answered whole: send it without stream"));
    }
    let pinned = x.pinned.map(|rows| (0..canvas.len()).map(|r| rows.contains(&r)).collect());
    Ok(Some(Structured { request, canvas, pinned, steps: x.max_steps.unwrap_or(1), top, token_ids, as_ids }))
}

/// The tokens per row asked for: chat's `logprobs` and `top_logprobs`, completions' `logprobs`.
fn logprobs(endpoint: Endpoint, taken: &Map<String, Value>) -> Result<Option<usize>, ApiError> {
    let count = |field: &str, v: &Value, message: &str| -> Result<i64, ApiError> { v.as_i64().ok_or_else(|| invalid(field, message)) };
    let n = match endpoint {
        Endpoint::Chat => {
            let on = match taken.get("logprobs") {
                None => false,
                Some(Value::Bool(b)) => *b,
                Some(_) => return Err(invalid("logprobs", "logprobs must be a boolean")),
            };
            let top = match taken.get("top_logprobs") {
                None => None,
                Some(v) => Some(count("top_logprobs", v, "`top_logprobs` must be a positive value or -1.")?),
            };
            match top {
                Some(t) if t < -1 => return Err(invalid("top_logprobs", "`top_logprobs` must be a positive value or -1.")),
                Some(t) if t != 0 && !on => {
                    return Err(invalid("top_logprobs", "when using `top_logprobs`, `logprobs` must be set to true."));
                }
                _ => {}
            }
            if !on {
                return Ok(None);
            }
            top.unwrap_or(0)
        }
        Endpoint::Completion => match taken.get("logprobs") {
            None => return Ok(None),
            Some(v) => match count("logprobs", v, "`logprobs` must be a positive value or -1.")? {
                n if n < -1 => return Err(invalid("logprobs", "`logprobs` must be a positive value or -1.")),
                n => n,
            },
        },
    };
    // -1 asks for the whole vocabulary: over the limit as vLLM counts it.
    let n = if n == -1 { u64::MAX } else { n as u64 };
    if n > MAX_LOGPROBS as u64 {
        let shown = if n == u64::MAX { "the whole vocabulary".to_string() } else { n.to_string() };
        return Err(invalid(
            "logprobs",
            format!("Requested sample logprobs of {shown}, which is greater than max allowed: {MAX_LOGPROBS}"),
        ));
    }
    Ok(Some(n as usize))
}

/// `logprob_token_ids`: at most [`MAX_LOGPROB_TOKEN_IDS`] ids inside the vocabulary.
fn token_ids(v: Option<&Value>, vocab: usize) -> Result<Vec<u32>, ApiError> {
    let param = "logprob_token_ids";
    let Some(v) = v else { return Ok(Vec::new()) };
    let ids: Vec<i64> = match v {
        Value::Array(items) if items.iter().all(|i| i.is_i64() || i.is_u64()) => {
            items.iter().map(|i| i.as_i64().unwrap_or(i64::MAX)).collect()
        }
        _ => return Err(invalid(param, "logprob_token_ids must be a list of integers")),
    };
    if ids.len() > MAX_LOGPROB_TOKEN_IDS {
        return Err(invalid(
            param,
            format!("Requested logprob_token_ids of length {}, which is greater than max allowed: {MAX_LOGPROB_TOKEN_IDS}", ids.len()),
        ));
    }
    let outside: Vec<String> = ids.iter().filter(|&&id| id < 0 || id >= vocab as i64).map(i64::to_string).collect();
    if !outside.is_empty() {
        return Err(invalid(
            param,
            format!("token_id(s) [{}] in logprob_token_ids contain out-of-vocab token ids. Vocabulary size: {vocab}", outside.join(", ")),
        ));
    }
    Ok(ids.into_iter().map(|id| id as u32).collect())
}

/// A `vllm_xargs` value as vLLM's OpenAI server takes it (a string, a number or a list of them),
/// JSON booleans narrowed to 0/1.
fn narrowed(key: &str, v: &Value) -> Result<Value, ApiError> {
    let scalar = |v: &Value| match v {
        Value::Bool(b) => Some(json!(u8::from(*b))),
        Value::String(_) | Value::Number(_) => Some(v.clone()),
        _ => None,
    };
    let out = match v {
        Value::Array(items) => items.iter().map(scalar).collect::<Option<Vec<_>>>().map(Value::Array),
        v => scalar(v),
    };
    out.ok_or_else(|| invalid("vllm_xargs", format!("vllm_xargs.{key} must be a string, a number or a list of them")))
}

mod xargs {
    //! `validate_diffusion_sampling_params` of vLLM PR #57250: the diffusion fields of `vllm_xargs`.

    use serde_json::{Map, Value};

    use super::{ApiError, Limits, invalid};

    /// The checked fields.
    #[derive(Debug, Default)]
    pub struct Xargs {
        pub seed: Option<Vec<u32>>,
        pub pinned: Option<Vec<usize>>,
        pub max_steps: Option<usize>,
        pub read_only: bool,
        pub constrained: bool,
    }

    fn check_that(valid: bool, message: impl Into<String>) -> Result<(), ApiError> {
        if valid { Ok(()) } else { Err(invalid("extra_args", message)) }
    }

    /// An integer (not a float: vLLM's `isinstance(x, int)`).
    fn int(v: &Value) -> Option<i64> {
        v.as_i64().or_else(|| v.as_u64().map(|_| i64::MAX))
    }

    /// A 0/1 flag.
    fn flag(v: Option<&Value>, message: &str) -> Result<bool, ApiError> {
        let Some(v) = v else { return Ok(false) };
        let n = int(v);
        check_that(matches!(n, Some(0 | 1)), message)?;
        Ok(n == Some(1))
    }

    pub fn check(x: &Map<String, Value>, limits: Limits, has_token_ids: bool) -> Result<Xargs, ApiError> {
        let get = |k: &str| x.get(k);
        let width = match get("diffusion_canvas_length") {
            None => None,
            Some(v) => {
                let w = int(v).filter(|&w| w > 0 && w as u64 <= limits.canvas_length as u64);
                check_that(w.is_some(), "diffusion_canvas_length must be a positive integer no larger than the served canvas.")?;
                w.map(|w| w as usize)
            }
        };
        let expected = width.unwrap_or(limits.canvas_length);
        let ints = |v: &Value| v.as_array().and_then(|items| items.iter().map(int).collect::<Option<Vec<i64>>>());
        let seed = match get("diffusion_seed_canvas") {
            None => None,
            Some(v) => {
                let ids = ints(v);
                check_that(ids.is_some(), "diffusion_seed_canvas must be a list of token ids.")?;
                let ids = ids.unwrap_or_default();
                let vocab = limits.vocab_size;
                check_that(ids.iter().all(|&t| t >= 0 && t < vocab as i64), format!("diffusion_seed_canvas ids must be in [0, {vocab})."))?;
                check_that(ids.len() == expected, format!("diffusion_seed_canvas must hold exactly {expected} ids, got {}.", ids.len()))?;
                Some(ids.into_iter().map(|t| t as u32).collect::<Vec<u32>>())
            }
        };
        let pinned = match get("diffusion_pinned") {
            None => None,
            Some(v) => {
                let rows = ints(v);
                check_that(rows.is_some(), "diffusion_pinned must be a list of canvas positions.")?;
                check_that(seed.is_some(), "diffusion_pinned needs a diffusion_seed_canvas to hold.")?;
                let rows = rows.unwrap_or_default();
                check_that(
                    rows.iter().all(|&p| p >= 0 && (p as u64) < expected as u64),
                    "diffusion_pinned positions must lie inside the canvas.",
                )?;
                Some(rows.into_iter().map(|p| p as usize).collect())
            }
        };
        let max_steps = match get("diffusion_max_steps") {
            None => None,
            Some(v) => {
                let n = int(v).filter(|&n| n > 0);
                check_that(n.is_some(), "diffusion_max_steps must be a positive integer.")?;
                n.map(|n| usize::try_from(n).unwrap_or(usize::MAX))
            }
        };
        let read_only = flag(get("diffusion_read_only"), "diffusion_read_only must be a boolean (or 0/1).")?;
        let constrained = flag(get("diffusion_constrained"), "diffusion_constrained must be a boolean (or 0/1).")?;
        if constrained {
            check_that(has_token_ids, "diffusion_constrained needs logprob_token_ids: they are the allowed set.")?;
        }
        Ok(Xargs { seed, pinned, max_steps, read_only, constrained })
    }
}

/// One token as the reply names it: `token_id:ID`, or its text.
fn token(id: u32, as_ids: bool, text: &dyn Fn(u32) -> String) -> String {
    if as_ids { format!("token_id:{id}") } else { text(id) }
}

/// The reply to `s` from its read: vLLM's chat or completion body. `text` decodes one token,
/// `reply` is the text of the reply's tokens.
#[allow(clippy::too_many_arguments)]
pub fn response(
    endpoint: Endpoint,
    s: &Structured,
    read: &dg_sampler::Read,
    text: &dyn Fn(u32) -> String,
    reply: String,
    prompt_tokens: usize,
    id: u64,
    created: u64,
) -> Value {
    let rows = &read.slots;
    let chosen: Vec<(u32, f32)> = rows.iter().map(|r| (r.argmax, r.top[0].1)).collect();
    // Per row: the top tokens asked for, then the requested ids not among them.
    let listed = |r: &dg_sampler::SlotRead, n: usize| -> Vec<(u32, f32)> {
        let mut out: Vec<(u32, f32)> = r.top.iter().take(n).copied().collect();
        for (&id, &lp) in s.token_ids.iter().zip(&r.label_logprobs) {
            if !out.iter().any(|&(t, _)| t == id) {
                out.push((id, lp));
            }
        }
        out
    };
    let logprobs = s.top.map(|n| match endpoint {
        Endpoint::Chat => {
            let entry = |id: u32, lp: f32| {
                let t = token(id, s.as_ids, text);
                json!({"token": t, "logprob": f64::from(lp), "bytes": t.as_bytes()})
            };
            let content: Vec<Value> = rows
                .iter()
                .zip(&chosen)
                .map(|(r, &(id, lp))| {
                    let mut e = entry(id, lp);
                    e["top_logprobs"] = listed(r, n).into_iter().map(|(t, lp)| entry(t, lp)).collect();
                    e
                })
                .collect();
            json!({"content": content})
        }
        Endpoint::Completion => {
            let tokens: Vec<String> = chosen.iter().map(|&(id, _)| token(id, s.as_ids, text)).collect();
            let mut offset = 0;
            let offsets: Vec<usize> = chosen
                .iter()
                .map(|&(id, _)| {
                    let at = offset;
                    offset += text(id).len();
                    at
                })
                .collect();
            let top: Vec<Value> = rows
                .iter()
                .map(|r| Value::Object(listed(r, n).into_iter().map(|(t, lp)| (token(t, s.as_ids, text), json!(f64::from(lp)))).collect()))
                .collect();
            json!({"tokens": tokens, "token_logprobs": chosen.iter().map(|&(_, lp)| f64::from(lp)).collect::<Vec<_>>(),
                   "top_logprobs": top, "text_offset": offsets})
        }
    });
    let n = rows.len();
    let usage = json!({"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n});
    let model = &s.request.model;
    match endpoint {
        Endpoint::Chat => json!({
            "id": format!("chatcmpl-{id}"), "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": reply}, "logprobs": logprobs, "finish_reason": "length"}],
            "usage": usage,
        }),
        Endpoint::Completion => json!({
            "id": format!("cmpl-{id}"), "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": 0, "text": reply, "logprobs": logprobs, "finish_reason": "length"}],
            "usage": usage,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits { vocab_size: 1000, canvas_length: 32 };

    fn chat(extra: &str) -> Result<Option<Structured>, ApiError> {
        let body = format!(r#"{{"model": "m", "messages": [{{"role": "user", "content": "a"}}], {extra}}}"#);
        parse(Endpoint::Chat, body.as_bytes(), LIMITS)
    }

    fn canvas(w: usize) -> String {
        format!("[{}]", vec!["5"; w].join(", "))
    }

    /// The message of a refused body.
    fn refused(extra: &str) -> String {
        chat(extra).unwrap_err().message
    }

    #[test]
    fn openjevs_request_is_a_read() {
        let xargs = format!(
            r#""vllm_xargs": {{"diffusion_seed_canvas": {}, "diffusion_canvas_length": 16, "diffusion_max_steps": 2,
                "diffusion_read_only": true, "diffusion_pinned": [0, 3]}}"#,
            canvas(16)
        );
        let extra = format!(
            r#""max_tokens": 9, "logprobs": true, "top_logprobs": 20, "logprob_token_ids": [7, 9],
               "return_tokens_as_token_ids": true, "chat_template_kwargs": {{"enable_thinking": false}}, {xargs}"#
        );
        let s = chat(&extra).unwrap().unwrap();
        assert_eq!((s.canvas.len(), s.steps, s.top, s.as_ids), (16, 2, Some(20), true));
        assert_eq!(s.token_ids, [7, 9]);
        let pinned = s.pinned.as_ref().unwrap();
        assert!(pinned[0] && pinned[3] && pinned.iter().filter(|&&p| p).count() == 2);
        assert_eq!((s.rows(), s.slots().len(), s.slots()[8].position), (9, 9, 8));
        // Completions: `logprobs` is the count; prompt ids as given.
        let body = format!(r#"{{"model": "m", "prompt": [1, 2], "logprobs": 20, "logprob_token_ids": [7], {xargs}}}"#);
        let s = parse(Endpoint::Completion, body.as_bytes(), LIMITS).unwrap().unwrap();
        assert_eq!((s.top, s.rows()), (Some(20), 16));
        // Without this wire's fields a body is an ordinary request.
        assert!(chat(r#""max_tokens": 3"#).unwrap().is_none());
    }

    #[test]
    fn vllms_messages() {
        let read = |x: &str| format!(r#""vllm_xargs": {{"diffusion_read_only": true, {x}}}"#);
        let seeded = |x: &str| read(&format!(r#""diffusion_seed_canvas": {}, {x}"#, canvas(32)));
        for (extra, message) in [
            (
                read(r#""diffusion_canvas_length": 33"#),
                "diffusion_canvas_length must be a positive integer no larger than the served canvas.",
            ),
            (
                read(r#""diffusion_canvas_length": 0"#),
                "diffusion_canvas_length must be a positive integer no larger than the served canvas.",
            ),
            (read(r#""diffusion_seed_canvas": "abc""#), "diffusion_seed_canvas must be a list of token ids."),
            (read(r#""diffusion_seed_canvas": [1, 2.5]"#), "diffusion_seed_canvas must be a list of token ids."),
            (read(r#""diffusion_seed_canvas": [0, 1000]"#), "diffusion_seed_canvas ids must be in [0, 1000)."),
            (read(r#""diffusion_seed_canvas": [0, -1]"#), "diffusion_seed_canvas ids must be in [0, 1000)."),
            (read(r#""diffusion_seed_canvas": [0, 1]"#), "diffusion_seed_canvas must hold exactly 32 ids, got 2."),
            (read(r#""diffusion_pinned": [0]"#), "diffusion_pinned needs a diffusion_seed_canvas to hold."),
            (seeded(r#""diffusion_pinned": "0,1""#), "diffusion_pinned must be a list of canvas positions."),
            (seeded(r#""diffusion_pinned": [32]"#), "diffusion_pinned positions must lie inside the canvas."),
            (seeded(r#""diffusion_max_steps": 0"#), "diffusion_max_steps must be a positive integer."),
            (seeded(r#""diffusion_max_steps": "1""#), "diffusion_max_steps must be a positive integer."),
            (r#""vllm_xargs": {"diffusion_read_only": "yes"}"#.into(), "diffusion_read_only must be a boolean (or 0/1)."),
            (r#""vllm_xargs": {"diffusion_read_only": 2}"#.into(), "diffusion_read_only must be a boolean (or 0/1)."),
            (seeded(r#""diffusion_constrained": 3"#), "diffusion_constrained must be a boolean (or 0/1)."),
            (seeded(r#""diffusion_constrained": true"#), "diffusion_constrained needs logprob_token_ids: they are the allowed set."),
            (seeded(r#""x": {"a": 1}"#), "vllm_xargs.x must be a string, a number or a list of them"),
            (format!(r#""top_logprobs": 3, {}"#, seeded(r#""y": 1"#)), "when using `top_logprobs`, `logprobs` must be set to true."),
            (format!(r#""logprobs": true, "top_logprobs": -2, {}"#, seeded(r#""y": 1"#)), "`top_logprobs` must be a positive value or -1."),
            (
                format!(r#""logprobs": true, "top_logprobs": 21, {}"#, seeded(r#""y": 1"#)),
                "Requested sample logprobs of 21, which is greater than max allowed: 20",
            ),
            (
                format!(r#""logprob_token_ids": [{}], {}"#, vec!["1"; 129].join(","), seeded(r#""y": 1"#)),
                "Requested logprob_token_ids of length 129, which is greater than max allowed: 128",
            ),
            (
                format!(r#""logprob_token_ids": [3, 1000, -4], {}"#, seeded(r#""y": 1"#)),
                "token_id(s) [1000, -4] in logprob_token_ids contain out-of-vocab token ids. Vocabulary size: 1000",
            ),
        ] {
            assert_eq!(refused(&extra), message, "{extra}");
        }
        // What the server does not serve: named, not a panic nor a silent generation.
        assert!(refused(&format!(r#""vllm_xargs": {{"diffusion_seed_canvas": {}}}"#, canvas(32))).starts_with("diffusion_read_only:"));
        assert!(refused(r#""vllm_xargs": {"diffusion_read_only": true}"#).starts_with("diffusion_seed_canvas:"));
        assert!(
            refused(&format!(r#""logprob_token_ids": [1], {}"#, seeded(r#""diffusion_constrained": 1"#)))
                .starts_with("diffusion_constrained:")
        );
        assert!(refused(&seeded(r#""diffusion_samples": 4"#)).starts_with("diffusion_samples:"));
        assert_eq!(chat(&seeded(r#""diffusion_samples": 1"#)).unwrap().unwrap().steps, 1);
        assert_eq!(chat(&format!(r#""stream": true, {}"#, seeded(r#""y": 1"#))).unwrap_err().param.as_deref(), Some("stream"));
        // JSON booleans are 0/1, as vLLM's vllm_xargs narrows them.
        assert_eq!(chat(&seeded(r#""diffusion_max_steps": true"#)).unwrap().unwrap().steps, 1);
        // The OpenAI part is still checked.
        assert_eq!(chat(&format!(r#""n": 2, {}"#, seeded(r#""y": 1"#))).unwrap_err().param.as_deref(), Some("n"));
        let e = parse(Endpoint::Completion, br#"{"model": "m", "prompt": "a", "logprobs": 30, "vllm_xargs": {}}"#, LIMITS).unwrap_err();
        assert_eq!(e.message, "Requested sample logprobs of 30, which is greater than max allowed: 20");
    }

    #[test]
    fn rows_list_the_top_tokens_then_the_requested_ids() {
        let body = format!(
            r#"{{"model": "m", "prompt": [1], "logprobs": 1, "logprob_token_ids": [4, 8], "return_tokens_as_token_ids": true,
                "max_tokens": 2, "vllm_xargs": {{"diffusion_read_only": 1, "diffusion_seed_canvas": {}}}}}"#,
            canvas(32)
        );
        let s = parse(Endpoint::Completion, body.as_bytes(), LIMITS).unwrap().unwrap();
        let row = |argmax: u32| dg_sampler::SlotRead {
            label_logprobs: vec![-0.5, -3.0],
            probabilities: vec![0.9, 0.1],
            top: vec![(argmax, -0.5), (2, -1.5)],
            top_entropy: 0.0,
            argmax,
        };
        let read = dg_sampler::Read { slots: vec![row(4), row(6)], canvas: vec![5; 32], logits: Vec::new() };
        let v = response(Endpoint::Completion, &s, &read, &|id| format!("<{id}>"), "r".into(), 1, 7, 0);
        let lp = &v["choices"][0]["logprobs"];
        assert_eq!(lp["tokens"], json!(["token_id:4", "token_id:6"]));
        assert_eq!(lp["top_logprobs"][0], json!({"token_id:4": -0.5, "token_id:8": -3.0}));
        assert_eq!(lp["top_logprobs"][1], json!({"token_id:6": -0.5, "token_id:4": -0.5, "token_id:8": -3.0}));
        assert_eq!(lp["text_offset"], json!([0, 3]));
        assert_eq!(v["usage"], json!({"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}));
        let v = response(Endpoint::Chat, &s, &read, &|id| format!("<{id}>"), "r".into(), 1, 7, 0);
        let row = &v["choices"][0]["logprobs"]["content"][1];
        assert_eq!((&row["token"], &row["logprob"]), (&json!("token_id:6"), &json!(-0.5)));
        assert_eq!(row["top_logprobs"].as_array().unwrap().len(), 3);
    }
}

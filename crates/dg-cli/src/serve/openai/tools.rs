//! Chat requests with tools, and replies with tool calls and reasoning, in OpenAI's Chat
//! Completions shapes as vLLM and llama.cpp's server give them.
//!
//! Requests: `messages` (with assistant `tool_calls` and `tool` messages), `tools`, `tool_choice`,
//! `parallel_tool_calls` and `chat_template_kwargs` are checked and handed to the model's chat
//! template as transformers' `apply_chat_template(messages, tools=tools, **chat_template_kwargs)`
//! does; a call's `arguments` (a JSON string in OpenAI's shape) is decoded into the object the
//! template renders, as vLLM does. `tool_choice` `"required"` or a named function pins the start
//! of the reply (`<|tool_call>call:` and the name) after the generation prompt.
//!
//! Replies: [`crate::chat::reply`] splits the text into `reasoning_content`, `content` and
//! `tool_calls`; [`ChatReply`] turns its parts into OpenAI's message (whole) or deltas (streamed).

use serde_json::{Map, Value, json};

use super::{ApiError, images};
use crate::chat::reply::{CALL_OPEN, CHANNEL_CLOSE, Part, ReplyParser, ToolCall};

/// The chat fields of a request besides `model`, `messages` and the sampling fields.
pub const FIELDS: &[&str] = &["tools", "tool_choice", "parallel_tool_calls", "chat_template_kwargs"];

/// The template variables a request may not set through `chat_template_kwargs`.
const RESERVED_KWARGS: &[&str] = &["messages", "tools", "add_generation_prompt", "bos_token", "eos_token"];

/// The generation prompt's end when the template opens the reasoning channel for the reply.
const OPEN_CHANNEL: &str = "<|channel>thought\n";

/// What a request asks of tool calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model decides (OpenAI's default with tools).
    Auto,
    /// No calls: calls' text comes back as content (OpenAI's default without tools).
    None,
    /// A call, of any of the tools.
    Required,
    /// A call of this function.
    Named(String),
}

/// A checked chat request.
#[derive(Debug, Clone, PartialEq)]
pub struct Chat {
    /// The messages as the template takes them.
    pub messages: Vec<Value>,
    pub tools: Vec<Value>,
    pub tool_choice: ToolChoice,
    pub parallel_tool_calls: bool,
    /// Template variables (`chat_template_kwargs`), e.g. `enable_thinking`.
    pub kwargs: Map<String, Value>,
}

fn bad(param: &str, what: impl std::fmt::Display) -> ApiError {
    ApiError::invalid(Some(param), format!("{param}: {what}"))
}

/// The chat request of a body's fields.
pub fn chat(map: &Map<String, Value>) -> Result<Chat, ApiError> {
    let field = |k: &str| map.get(k).filter(|v| !v.is_null());
    let tools = match field("tools") {
        None => Vec::new(),
        Some(Value::Array(list)) => list.iter().enumerate().map(|(i, t)| tool(t, &format!("tools[{i}]"))).collect::<Result<_, _>>()?,
        Some(_) => return Err(bad("tools", "must be an array of {\"type\": \"function\", \"function\": {...}} objects")),
    };
    let names: Vec<&str> = tools.iter().filter_map(|t| t["function"]["name"].as_str()).collect();
    let tool_choice = match field("tool_choice") {
        None if tools.is_empty() => ToolChoice::None,
        None => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required,
            other => return Err(bad("tool_choice", format!("{other:?} is not one of \"auto\", \"none\", \"required\""))),
        },
        Some(v) => match v.pointer("/function/name").and_then(Value::as_str) {
            Some(name) if v["type"] == "function" => ToolChoice::Named(name.to_string()),
            _ => {
                return Err(bad(
                    "tool_choice",
                    "must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}",
                ));
            }
        },
    };
    match &tool_choice {
        ToolChoice::Required if tools.is_empty() => return Err(bad("tool_choice", "\"required\" needs tools")),
        ToolChoice::Named(name) if !names.contains(&name.as_str()) => {
            return Err(bad("tool_choice", format!("{name:?} is not one of the tools ({})", names.join(", "))));
        }
        _ => {}
    }
    let parallel_tool_calls = match field("parallel_tool_calls") {
        None => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(bad("parallel_tool_calls", "must be a boolean")),
    };
    let kwargs = match field("chat_template_kwargs") {
        None => Map::new(),
        Some(Value::Object(o)) => {
            if let Some(key) = o.keys().find(|k| RESERVED_KWARGS.contains(&k.as_str())) {
                return Err(bad("chat_template_kwargs", format!("{key} is set by the request itself")));
            }
            o.clone()
        }
        Some(_) => return Err(bad("chat_template_kwargs", "must be an object")),
    };
    Ok(Chat { messages: messages(field("messages"))?, tools, tool_choice, parallel_tool_calls, kwargs })
}

/// A function tool, as given.
fn tool(t: &Value, param: &str) -> Result<Value, ApiError> {
    if t["type"] != "function" {
        return Err(bad(param, "type must be \"function\""));
    }
    match t["function"]["name"].as_str() {
        Some(name) if !name.is_empty() => {}
        _ => return Err(bad(param, "function.name must be a non-empty string")),
    }
    if !matches!(t["function"].get("parameters"), None | Some(Value::Null | Value::Object(_))) {
        return Err(bad(param, "function.parameters must be a JSON schema object"));
    }
    Ok(t.clone())
}

fn messages(v: Option<&Value>) -> Result<Vec<Value>, ApiError> {
    let list = match v {
        Some(Value::Array(list)) if !list.is_empty() => list,
        Some(Value::Array(_)) => return Err(ApiError::invalid(Some("messages"), "messages must not be empty")),
        Some(_) => return Err(ApiError::invalid(Some("messages"), "messages must be an array of {role, content} objects")),
        None => return Err(ApiError::invalid(Some("messages"), "messages is required")),
    };
    list.iter().enumerate().map(|(i, m)| message(m, &format!("messages[{i}]"))).collect()
}

/// One message, checked; a call's arguments decoded into an object.
fn message(m: &Value, param: &str) -> Result<Value, ApiError> {
    let bad = |what: &str| bad(param, what);
    let Value::Object(fields) = m else { return Err(bad("must be an object")) };
    let role = fields.get("role").and_then(Value::as_str).ok_or_else(|| bad("needs a string role"))?;
    let mut out = fields.clone();
    let content = fields.get("content").filter(|c| !c.is_null());
    let text_parts = |parts: &[Value]| parts.iter().all(|p| p["type"] == "text" && p["text"].is_string());
    let content_ok = match content {
        Some(Value::String(_)) => true,
        Some(Value::Array(parts)) if role == "user" => {
            parts.iter().all(|p| text_parts(std::slice::from_ref(p)) || images::is_image_part(p))
        }
        Some(Value::Array(parts)) => text_parts(parts),
        _ => false,
    };
    match role {
        "user" if !content_ok => return Err(bad("needs content: a string or a list of text and image_url parts")),
        "system" | "developer" | "user" if !content_ok => return Err(bad("needs content: a string or a list of text parts")),
        "system" | "developer" | "user" => {}
        "assistant" => {
            if content.is_some() && !content_ok {
                return Err(bad("content must be a string or a list of text parts"));
            }
            match fields.get("tool_calls").filter(|c| !c.is_null()) {
                None if content.is_none() => return Err(bad("an assistant message needs content or tool_calls")),
                None => {}
                Some(Value::Array(calls)) => {
                    let calls = calls
                        .iter()
                        .enumerate()
                        .map(|(j, c)| assistant_call(c, &format!("{param}.tool_calls[{j}]")))
                        .collect::<Result<Vec<_>, _>>()?;
                    out.insert("tool_calls".into(), Value::Array(calls));
                }
                Some(_) => return Err(bad("tool_calls must be an array")),
            }
        }
        "tool" => {
            if !fields.get("tool_call_id").is_some_and(Value::is_string) {
                return Err(bad("a tool message needs a string tool_call_id"));
            }
            if !content_ok {
                return Err(bad("needs content: a string or a list of text parts"));
            }
        }
        other => return Err(bad(&format!("role {other:?} is not supported (system, developer, user, assistant, tool)"))),
    }
    Ok(Value::Object(out))
}

/// An assistant's call with its arguments decoded.
fn assistant_call(c: &Value, param: &str) -> Result<Value, ApiError> {
    let name = c.pointer("/function/name").and_then(Value::as_str).ok_or_else(|| bad(param, "needs function.name"))?;
    let arguments = match c.pointer("/function/arguments") {
        None | Some(Value::Null) => Value::Object(Map::new()),
        Some(Value::String(s)) if s.trim().is_empty() => Value::Object(Map::new()),
        Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
            Ok(v @ Value::Object(_)) => v,
            _ => return Err(bad(&format!("{param}.function.arguments"), format!("must be a JSON object, not {s:?}"))),
        },
        Some(v @ Value::Object(_)) => v.clone(),
        Some(v) => return Err(bad(&format!("{param}.function.arguments"), format!("must be a JSON object, not {v}"))),
    };
    let mut out = c.clone();
    out["function"] = json!({"name": name, "arguments": arguments});
    Ok(out)
}

/// How to read a chat reply: what the prompt pinned at its start, and whether calls are parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplySetup {
    /// The prompt ended inside the reasoning channel (thinking on, after a tool response).
    pub in_reasoning: bool,
    /// Text appended to the prompt that the reply continues (`tool_choice` required or named).
    pub pinned: String,
    /// Calls are parsed (not with `tool_choice: "none"`).
    pub calls: bool,
    pub parallel_tool_calls: bool,
}

impl ReplySetup {
    /// The setup of `chat` whose rendered prompt is `prompt`.
    pub fn new(chat: &Chat, prompt: &str) -> Self {
        let in_reasoning = prompt.ends_with(OPEN_CHANNEL);
        let call = match &chat.tool_choice {
            ToolChoice::Required => Some(format!("{CALL_OPEN}call:")),
            ToolChoice::Named(name) => Some(format!("{CALL_OPEN}call:{name}{{")),
            ToolChoice::Auto | ToolChoice::None => None,
        };
        // A pinned call closes an open channel first.
        let pinned = match call {
            Some(call) if in_reasoning => format!("{CHANNEL_CLOSE}{call}"),
            Some(call) => call,
            None => String::new(),
        };
        ReplySetup { in_reasoning, pinned, calls: chat.tool_choice != ToolChoice::None, parallel_tool_calls: chat.parallel_tool_calls }
    }
}

/// A chat reply read as it is committed: OpenAI's deltas, and the whole message at the end.
#[derive(Debug)]
pub struct ChatReply {
    parser: ReplyParser,
    setup: ReplySetup,
    /// Prefix of the calls' ids (unique per request).
    id: String,
    calls: usize,
    /// Calls that did not parse, and calls beyond the first without `parallel_tool_calls`.
    warnings: Vec<String>,
}

impl ChatReply {
    /// The reader of request `request_id`'s reply, and the deltas its pinned start gives.
    pub fn new(setup: ReplySetup, request_id: u64) -> (Self, Vec<Value>) {
        let mut reply = ChatReply {
            parser: ReplyParser::new(setup.in_reasoning, setup.calls),
            setup,
            id: format!("call_{request_id}"),
            calls: 0,
            warnings: vec![],
        };
        let pinned = reply.setup.pinned.clone();
        let deltas = reply.push(&pinned);
        (reply, deltas)
    }

    /// The deltas (`{"content"}`, `{"reasoning_content"}`, `{"tool_calls": [...]}`) that `text`
    /// decides.
    pub fn push(&mut self, text: &str) -> Vec<Value> {
        let parts = self.parser.push(text);
        self.deltas(parts)
    }

    /// The last deltas, whether the reply made calls, and the warnings.
    pub fn finish(mut self) -> (Vec<Value>, bool, Vec<String>) {
        let parts = self.parser.finish();
        let deltas = self.deltas(parts);
        (deltas, self.calls > 0, self.warnings)
    }

    fn deltas(&mut self, parts: Vec<Part>) -> Vec<Value> {
        parts.into_iter().filter_map(|part| self.delta(part)).collect()
    }

    fn delta(&mut self, part: Part) -> Option<Value> {
        Some(match part {
            Part::Content(text) => json!({"content": text}),
            Part::Reasoning(text) => json!({"reasoning_content": text}),
            Part::Call(call) if self.calls > 0 && !self.setup.parallel_tool_calls => {
                self.warn(format!("parallel_tool_calls is false: a further call, of {}, left out", call.name));
                return None;
            }
            Part::Call(ToolCall { name, arguments }) => {
                let index = self.calls;
                self.calls += 1;
                json!({"tool_calls": [{"index": index, "id": format!("{}_{index}", self.id), "type": "function",
                    "function": {"name": name, "arguments": arguments.to_string()}}]})
            }
            Part::Malformed { text, error } => {
                self.warn(format!("a tool call does not parse, returned as content: {error}"));
                json!({"content": text})
            }
        })
    }

    fn warn(&mut self, message: String) {
        eprintln!("warning: {}: {message}", self.id);
        self.warnings.push(message);
    }
}

/// The assistant message of `deltas` merged: content (null when empty and there are calls),
/// reasoning_content (when any) and tool_calls (when any).
pub fn reply_message(deltas: &[Value]) -> Value {
    let (mut content, mut reasoning, mut calls) = (String::new(), String::new(), Vec::new());
    for d in deltas {
        if let Some(t) = d["content"].as_str() {
            content.push_str(t);
        }
        if let Some(t) = d["reasoning_content"].as_str() {
            reasoning.push_str(t);
        }
        if let Some(c) = d["tool_calls"].as_array() {
            calls.extend(c.iter().map(|c| {
                let mut c = c.clone();
                if let Some(o) = c.as_object_mut() {
                    o.remove("index");
                }
                c
            }));
        }
    }
    let mut m = json!({"role": "assistant", "content": content});
    if !reasoning.is_empty() {
        m["reasoning_content"] = json!(reasoning);
    }
    if !calls.is_empty() {
        if content.is_empty() {
            m["content"] = Value::Null;
        }
        m["tool_calls"] = json!(calls);
    }
    m
}

#[cfg(test)]
mod tests;

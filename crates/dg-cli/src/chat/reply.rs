//! A model's reply in Gemma 4's chat syntax, split into OpenAI's message parts: the reasoning
//! channel (`<|channel>thought\n ... <channel|>`, vLLM's and llama.cpp's `reasoning_content`), tool
//! calls (`<|tool_call>call:NAME{key:value,...}<tool_call|>`, OpenAI's `tool_calls`) and the
//! content around them. The call syntax is read as the inverse of the chat template's
//! `format_argument` macro (strings between `<|"|>` delimiters, bare keys sorted, `null`, `true`,
//! `false`, numbers as Python prints them); [`ReplyParser`] takes the text as it is committed, so a
//! stream gives each part as soon as it is decided.

use std::cell::Cell;

use serde_json::{Map, Value as Json};

pub const CHANNEL_OPEN: &str = "<|channel>";
pub const CHANNEL_CLOSE: &str = "<channel|>";
pub const CALL_OPEN: &str = "<|tool_call>";
pub const CALL_CLOSE: &str = "<tool_call|>";
/// Opens the tool's answer: the model writes it after its calls, where its turn ends.
pub const RESPONSE_OPEN: &str = "<|tool_response>";
/// The string delimiter.
pub const QUOTE: &str = "<|\"|>";
/// The special tokens the reply is read by: the text of a chat reply keeps them.
pub const MARKUP: [&str; 6] = [CHANNEL_OPEN, CHANNEL_CLOSE, CALL_OPEN, CALL_CLOSE, RESPONSE_OPEN, QUOTE];
/// The channel's name the template writes after [`CHANNEL_OPEN`].
const THOUGHT: &str = "thought\n";
/// Nesting the call parser follows at most (a deeper reply is malformed).
const MAX_DEPTH: usize = 64;
/// Parser steps at most per call: the string delimiter may also occur inside strings, so the
/// parser backtracks over where each string ends; this bounds adversarial text.
const MAX_STEPS: usize = 100_000;

/// A parsed tool call.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub name: String,
    /// A JSON object.
    pub arguments: Json,
}

/// A decided piece of a reply.
#[derive(Debug, Clone, PartialEq)]
pub enum Part {
    Content(String),
    Reasoning(String),
    Call(ToolCall),
    /// A call that does not parse: its text (delimiters included, returned as content) and why.
    Malformed {
        text: String,
        error: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Content,
    /// In the channel; `fresh` until its name (`thought\n`) has been passed.
    Reasoning {
        fresh: bool,
    },
    Call,
}

/// Splits a reply given in pieces into [`Part`]s.
#[derive(Debug)]
pub struct ReplyParser {
    buf: String,
    state: State,
    calls: bool,
}

impl ReplyParser {
    /// A parser for a reply that starts inside the reasoning channel when the prompt ended by
    /// opening it (`in_reasoning`), and that reads tool calls when `calls` (else their text is
    /// content).
    pub fn new(in_reasoning: bool, calls: bool) -> Self {
        let state = if in_reasoning { State::Reasoning { fresh: false } } else { State::Content };
        ReplyParser { buf: String::new(), state, calls }
    }

    /// Takes more text; returns the parts it decides (a tail that may start a delimiter, and an
    /// open call, wait for more).
    pub fn push(&mut self, text: &str) -> Vec<Part> {
        self.buf.push_str(text);
        let mut parts = Vec::new();
        loop {
            match self.state {
                State::Content => {
                    let opens: &[&str] = if self.calls { &[CHANNEL_OPEN, CALL_OPEN] } else { &[CHANNEL_OPEN] };
                    match opens.iter().filter_map(|o| self.buf.find(o).map(|at| (at, *o))).min() {
                        Some((at, open)) => {
                            self.emit(&mut parts, at, Part::Content);
                            self.buf.drain(..open.len());
                            self.state = if open == CALL_OPEN { State::Call } else { State::Reasoning { fresh: true } };
                        }
                        None => {
                            let keep = held_tail(&self.buf, opens);
                            self.emit(&mut parts, self.buf.len() - keep, Part::Content);
                            return parts;
                        }
                    }
                }
                State::Reasoning { fresh: true } => {
                    if self.buf.len() < THOUGHT.len() && THOUGHT.starts_with(self.buf.as_str()) {
                        return parts;
                    }
                    if self.buf.starts_with(THOUGHT) {
                        self.buf.drain(..THOUGHT.len());
                    }
                    self.state = State::Reasoning { fresh: false };
                }
                State::Reasoning { fresh: false } => match self.buf.find(CHANNEL_CLOSE) {
                    Some(at) => {
                        self.emit(&mut parts, at, Part::Reasoning);
                        self.buf.drain(..CHANNEL_CLOSE.len());
                        self.state = State::Content;
                    }
                    None => {
                        let keep = held_tail(&self.buf, &[CHANNEL_CLOSE]);
                        self.emit(&mut parts, self.buf.len() - keep, Part::Reasoning);
                        return parts;
                    }
                },
                State::Call => match self.buf.find(CALL_CLOSE) {
                    Some(at) => {
                        let body: String = self.buf.drain(..at + CALL_CLOSE.len()).collect();
                        let body = &body[..at];
                        parts.push(match parse_call(body) {
                            Ok(call) => Part::Call(call),
                            Err(error) => Part::Malformed { text: format!("{CALL_OPEN}{body}{CALL_CLOSE}"), error },
                        });
                        self.state = State::Content;
                    }
                    None => return parts,
                },
            }
        }
    }

    /// Ends the reply: what was held back, and an unclosed call as malformed.
    pub fn finish(&mut self) -> Vec<Part> {
        let mut parts = Vec::new();
        let rest = std::mem::take(&mut self.buf);
        match std::mem::replace(&mut self.state, State::Content) {
            State::Content if !rest.is_empty() => parts.push(Part::Content(rest)),
            State::Reasoning { .. } if !rest.is_empty() => parts.push(Part::Reasoning(rest)),
            State::Call => {
                parts.push(Part::Malformed { text: format!("{CALL_OPEN}{rest}"), error: format!("the call has no closing {CALL_CLOSE}") })
            }
            _ => {}
        }
        parts
    }

    /// Moves `buf[..end]` out as a part made by `make` (nothing when empty).
    fn emit(&mut self, parts: &mut Vec<Part>, end: usize, make: fn(String) -> Part) {
        if end > 0 {
            parts.push(make(self.buf.drain(..end).collect()));
        }
    }
}

/// The length of the longest tail of `text` that is a proper prefix of one of `delims`.
fn held_tail(text: &str, delims: &[&str]) -> usize {
    delims
        .iter()
        .flat_map(|d| (1..d.len()).filter(|&n| d.is_char_boundary(n)).map(move |n| &d[..n]))
        .filter(|prefix| text.ends_with(prefix))
        .map(str::len)
        .max()
        .unwrap_or(0)
}

/// A call's text between its delimiters: `call:NAME{key:value,...}`.
pub fn parse_call(body: &str) -> Result<ToolCall, String> {
    let rest = body.trim().strip_prefix("call:").ok_or_else(|| format!("a call starts with \"call:\", not {:?}", preview(body)))?;
    let brace = rest.find('{').ok_or_else(|| "the call has no argument object ({...})".to_string())?;
    let name = rest[..brace].trim();
    if name.is_empty() || name.contains(|c: char| c.is_whitespace() || ",:[]{}\"".contains(c)) {
        return Err(format!("{:?} is not a function name", preview(name)));
    }
    let parser = Values { s: rest, steps: Cell::new(0) };
    let arguments =
        parser.object(brace + 1, Map::new(), true, 0, &mut |v, end| (parser.skip_ws(end) == rest.len()).then_some(v)).ok_or_else(|| {
            if parser.steps.get() > MAX_STEPS {
                "the arguments are too complex to parse".to_string()
            } else {
                format!("the arguments of {name} do not parse: {:?}", preview(&rest[brace..]))
            }
        })?;
    Ok(ToolCall { name: name.to_string(), arguments })
}

fn preview(s: &str) -> String {
    s.chars().take(80).collect()
}

/// A number as Python prints it (an int, or a float's `repr`): integers exactly, floats correctly
/// rounded (the nearest `f64`, as Python reads them back); `inf` and `nan` are not JSON.
fn parse_number(text: &str) -> Option<serde_json::Number> {
    let digits = text.strip_prefix('-').unwrap_or(text);
    if !digits.starts_with(|c: char| c.is_ascii_digit()) || !text.chars().all(|c| c.is_ascii_digit() || "+-.eE".contains(c)) {
        return None;
    }
    if let Ok(i) = text.parse::<i64>() {
        return Some(i.into());
    }
    if let Ok(u) = text.parse::<u64>() {
        return Some(u.into());
    }
    text.parse::<f64>().ok().and_then(serde_json::Number::from_f64)
}

/// The continuation of a parse: takes a value and where it ended; gives the whole result, or
/// `None` to try another reading.
type Cont<'k> = &'k mut dyn FnMut(Json, usize) -> Option<Json>;

/// A backtracking parser of the template's values: where a string ends is tried at each delimiter
/// in turn, the first reading under which the rest parses wins.
struct Values<'a> {
    s: &'a str,
    steps: Cell<usize>,
}

impl Values<'_> {
    fn skip_ws(&self, at: usize) -> usize {
        at + self.s[at..].len() - self.s[at..].trim_start().len()
    }

    fn budget(&self, depth: usize) -> bool {
        self.steps.set(self.steps.get() + 1);
        depth <= MAX_DEPTH && self.steps.get() <= MAX_STEPS
    }

    fn value(&self, at: usize, depth: usize, k: Cont<'_>) -> Option<Json> {
        if !self.budget(depth) {
            return None;
        }
        let at = self.skip_ws(at);
        let rest = &self.s[at..];
        if rest.starts_with(QUOTE) {
            self.string(at, k)
        } else if rest.starts_with('{') {
            self.object(at + 1, Map::new(), true, depth + 1, k)
        } else if rest.starts_with('[') {
            self.array(at + 1, Vec::new(), true, depth + 1, k)
        } else {
            let len = rest.find(|c: char| ",}]".contains(c) || c.is_whitespace()).unwrap_or(rest.len());
            let scalar = match &rest[..len] {
                "null" | "None" => Json::Null,
                "true" | "True" => Json::Bool(true),
                "false" | "False" => Json::Bool(false),
                number => Json::Number(parse_number(number)?),
            };
            k(scalar, at + len)
        }
    }

    /// A delimited string at `at`: each following delimiter in turn as its end.
    fn string(&self, at: usize, k: Cont<'_>) -> Option<Json> {
        let start = at + QUOTE.len();
        let mut from = start;
        while let Some(i) = self.s[from..].find(QUOTE) {
            let end = from + i;
            if !self.budget(0) {
                return None;
            }
            if let Some(result) = k(Json::String(self.s[start..end].to_string()), end + QUOTE.len()) {
                return Some(result);
            }
            from = end + QUOTE.len();
        }
        None
    }

    /// The members of an object after its `{` (or after a `,` when not `first`).
    fn object(&self, at: usize, map: Map<String, Json>, first: bool, depth: usize, k: Cont<'_>) -> Option<Json> {
        if !self.budget(depth) {
            return None;
        }
        let at = self.skip_ws(at);
        if first && self.s[at..].starts_with('}') {
            return k(Json::Object(map), at + 1);
        }
        let mut member = |key: String, after_key: usize| -> Option<Json> {
            let colon = self.skip_ws(after_key);
            if !self.s[colon..].starts_with(':') {
                return None;
            }
            self.value(colon + 1, depth, &mut |v, end| {
                let mut map = map.clone();
                map.insert(key.clone(), v);
                let next = self.skip_ws(end);
                match self.s[next..].chars().next() {
                    Some(',') => self.object(next + 1, map, false, depth, &mut *k),
                    Some('}') => k(Json::Object(map), next + 1),
                    _ => None,
                }
            })
        };
        if self.s[at..].starts_with(QUOTE) {
            // A key the model delimited as a string.
            self.string(at, &mut |key, end| member(key.as_str().unwrap_or_default().to_string(), end))
        } else {
            let len = self.s[at..].find(':')?;
            let key = self.s[at..at + len].trim_end();
            if key.is_empty() || key.contains(|c: char| ",[]{}".contains(c)) || key.contains(QUOTE) {
                return None;
            }
            member(key.to_string(), at + key.len())
        }
    }

    /// The items of an array after its `[` (or after a `,` when not `first`).
    fn array(&self, at: usize, items: Vec<Json>, first: bool, depth: usize, k: Cont<'_>) -> Option<Json> {
        if !self.budget(depth) {
            return None;
        }
        let at = self.skip_ws(at);
        if first && self.s[at..].starts_with(']') {
            return k(Json::Array(items), at + 1);
        }
        self.value(at, depth, &mut |v, end| {
            let mut items = items.clone();
            items.push(v);
            let next = self.skip_ws(end);
            match self.s[next..].chars().next() {
                Some(',') => self.array(next + 1, items, false, depth, &mut *k),
                Some(']') => k(Json::Array(items), next + 1),
                _ => None,
            }
        })
    }
}

#[cfg(test)]
mod tests;

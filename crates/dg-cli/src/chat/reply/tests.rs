//! The reply reader's tests: calls in transformers' renderings and random calls through the real
//! template parse back, the ambiguous delimiter, replies split into reasoning, content and calls,
//! malformed calls as text.

use std::path::Path;

use serde_json::json;

use super::*;
use crate::chat::{ChatTemplate, Conversation};

fn fixtures() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

fn template() -> ChatTemplate {
    ChatTemplate::from_dir(&fixtures().join("converter-gemma4-vocab/hf")).unwrap().unwrap()
}

/// The texts between the call delimiters of `text`, in order.
fn call_bodies(text: &str) -> Vec<&str> {
    text.split(CALL_OPEN).skip(1).map(|s| &s[..s.find(CALL_CLOSE).expect("closed")]).collect()
}

/// Every call of the committed conversations, as transformers rendered it, parses back to the
/// call's name and arguments.
#[test]
fn calls_transformers_rendered_parse_back() {
    let text = std::fs::read_to_string(fixtures().join("chat-tools/conversations.jsonl")).unwrap();
    let mut checked = 0;
    for line in text.lines() {
        let case: Json = serde_json::from_str(line).unwrap();
        let calls: Vec<&Json> = case["messages"].as_array().unwrap().iter().filter_map(|m| m["tool_calls"].as_array()).flatten().collect();
        let bodies = call_bodies(case["text"].as_str().unwrap());
        assert_eq!(bodies.len(), calls.len(), "{}", case["name"]);
        for (body, call) in bodies.iter().zip(calls) {
            let parsed = parse_call(body).unwrap_or_else(|e| panic!("{}: {e}", case["name"]));
            let want = match &call["function"]["arguments"] {
                Json::Null => json!({}),
                args => args.clone(),
            };
            assert_eq!(parsed, ToolCall { name: call["function"]["name"].as_str().unwrap().into(), arguments: want });
            checked += 1;
        }
    }
    assert!(checked >= 10, "{checked} calls");
}

/// A small deterministic generator (xorshift64*).
struct Gen(u64);

impl Gen {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len())]
    }

    /// A string of pieces that stress the syntax: quotes, the delimiter, brackets, separators,
    /// escapes, unicode, words that read as other values.
    fn string(&mut self) -> String {
        const PIECES: &[&str] =
            &["a", "Z", "é", "日本", "🙂", " ", "\"", "'", "\\", "\n", "{", "}", "[", "]", ",", ":", QUOTE, "null", "1.5", "call:"];
        let mut s: String = (0..self.below(6)).map(|_| self.pick(PIECES)).collect();
        // The one ambiguity of the syntax (see `the_delimiter_before_a_separator_is_ambiguous`):
        // a delimiter inside a string followed by a separator.
        while let Some(at) = ambiguous_delimiter(&s) {
            s.replace_range(at..at + QUOTE.len(), "\"");
        }
        s
    }

    fn key(&mut self) -> String {
        const PIECES: &[&str] = &["a", "b", "Key", "_", "x1", "é", "日"];
        (0..1 + self.below(3)).map(|_| self.pick(PIECES)).collect()
    }

    fn value(&mut self, depth: usize) -> Json {
        let kinds = if depth >= 3 { 5 } else { 7 };
        match self.below(kinds) {
            0 => Json::Null,
            1 => Json::Bool(self.below(2) == 1),
            2 => json!(self.next() as i64 >> self.below(64)),
            3 => json!((self.next() as i64 >> 20) as f64 / 1024.0),
            4 => Json::String(self.string()),
            5 => Json::Array((0..self.below(4)).map(|_| self.value(depth + 1)).collect()),
            _ => self.object(depth + 1),
        }
    }

    fn object(&mut self, depth: usize) -> Json {
        Json::Object((0..self.below(4)).map(|_| (self.key(), self.value(depth))).collect())
    }
}

/// Where `s` has a delimiter followed (after spaces) by `,`, `}` or `]`.
fn ambiguous_delimiter(s: &str) -> Option<usize> {
    s.match_indices(QUOTE).map(|(at, _)| at).find(|&at| s[at + QUOTE.len()..].trim_start().starts_with([',', '}', ']']))
}

/// parse(render(call)) = call for random calls rendered by the model's chat template: nested
/// objects and arrays, integers, floats, booleans, null, unicode, quotes and the delimiter inside
/// strings.
#[test]
fn parse_inverts_the_template_on_random_calls() {
    let template = template();
    let mut g = Gen(0x9E37_79B9_7F4A_7C15);
    for case in 0..400 {
        let calls: Vec<ToolCall> =
            (0..1 + g.below(3)).map(|_| ToolCall { name: g.pick(&["f", "get_weather", "a.b-c"]).into(), arguments: g.object(0) }).collect();
        let tool_calls: Vec<Json> = calls
            .iter()
            .enumerate()
            .map(|(i, c)| json!({"id": format!("c{i}"), "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
            .collect();
        let messages = [json!({"role": "user", "content": "go"}), json!({"role": "assistant", "tool_calls": tool_calls})];
        let conversation = Conversation { messages: &messages, tools: None, kwargs: &Map::new(), add_generation_prompt: false };
        let text = template.render_conversation(&conversation).unwrap();
        let reply = &text[text.find(CALL_OPEN).unwrap()..];
        let parsed: Vec<ToolCall> = parts_of(reply, false)
            .into_iter()
            .filter_map(|p| match p {
                Part::Call(c) => Some(c),
                Part::Malformed { error, text } => panic!("case {case}: {error}: {text}"),
                _ => None,
            })
            .collect();
        assert_eq!(parsed, calls, "case {case}: {reply}");
    }
}

/// `{a: "x<|"|>,k:<|"|>y"}` and `{a: "x", k: "y"}` render the same text: the parser gives the
/// reading with the shortest strings.
#[test]
fn the_delimiter_before_a_separator_is_ambiguous() {
    let q = QUOTE;
    let body = format!("call:f{{a:{q}x{q},k:{q}y{q}}}");
    assert_eq!(parse_call(&body).unwrap().arguments, json!({"a": "x", "k": "y"}));
    // The delimiter followed by anything else is read inside the string.
    let body = format!("call:f{{a:{q}say {q}hi{q} now{q},b:1}}");
    assert_eq!(parse_call(&body).unwrap().arguments, json!({"a": format!("say {q}hi{q} now"), "b": 1}));
}

/// The parts of `text` given whole, and given in pieces of every size up to 7 bytes (the parts
/// merged): the same.
fn parts_of(text: &str, in_reasoning: bool) -> Vec<Part> {
    let whole = {
        let mut p = ReplyParser::new(in_reasoning, true);
        let mut parts = p.push(text);
        parts.extend(p.finish());
        merge(parts)
    };
    for size in 1..8 {
        let mut p = ReplyParser::new(in_reasoning, true);
        let mut parts = Vec::new();
        let chars: Vec<char> = text.chars().collect();
        for piece in chars.chunks(size) {
            parts.extend(p.push(&piece.iter().collect::<String>()));
        }
        parts.extend(p.finish());
        assert_eq!(merge(parts), whole, "pieces of {size} chars");
    }
    whole
}

/// Adjacent content (or reasoning) parts joined.
fn merge(parts: Vec<Part>) -> Vec<Part> {
    let mut out: Vec<Part> = Vec::new();
    for part in parts {
        match (out.last_mut(), part) {
            (Some(Part::Content(a)), Part::Content(b)) | (Some(Part::Reasoning(a)), Part::Reasoning(b)) => a.push_str(&b),
            (_, part) => out.push(part),
        }
    }
    out
}

#[test]
fn replies_split_into_reasoning_content_and_calls() {
    let q = QUOTE;
    let text = format!(
        "<|channel>thought\nThe user wants Paris.<channel|>Let me check.<|tool_call>call:get_weather{{city:{q}Paris{q}}}<tool_call|>"
    );
    assert_eq!(
        parts_of(&text, false),
        [
            Part::Reasoning("The user wants Paris.".into()),
            Part::Content("Let me check.".into()),
            Part::Call(ToolCall { name: "get_weather".into(), arguments: json!({"city": "Paris"}) }),
        ]
    );
    // After a tool response with thinking on, the prompt opened the channel.
    assert_eq!(
        parts_of("Sunny, so.<channel|>It is sunny.", true),
        [Part::Reasoning("Sunny, so.".into()), Part::Content("It is sunny.".into())]
    );
    // Without tools, a call's text is content.
    let mut p = ReplyParser::new(false, false);
    let mut parts = p.push("a<|tool_call>call:f{}<tool_call|>b");
    parts.extend(p.finish());
    assert_eq!(merge(parts), [Part::Content("a<|tool_call>call:f{}<tool_call|>b".into())]);
    // Text that only looks like a delimiter's start is given at the end.
    assert_eq!(parts_of("a <|tool", false), [Part::Content("a <|tool".into())]);
}

#[test]
fn malformed_calls_are_text_with_a_reason() {
    let q = QUOTE;
    for (body, why) in [
        (format!("call:f{{a:{q}x}}"), "do not parse"),
        ("call:f{a:}".to_string(), "do not parse"),
        ("call:f{a:1,}".to_string(), "do not parse"),
        ("call:f{a:nope}".to_string(), "do not parse"),
        ("call:f".to_string(), "no argument object"),
        ("call: {}".to_string(), "not a function name"),
        ("f{}".to_string(), "starts with"),
        (format!("call:f{{a:{}{}}}", "[".repeat(200), "]".repeat(200)), "do not parse"),
    ] {
        let text = format!("{CALL_OPEN}{body}{CALL_CLOSE}");
        match parts_of(&text, false).as_slice() {
            [Part::Malformed { text: t, error }] => {
                assert_eq!(t, &text);
                assert!(error.contains(why), "{body}: {error}");
            }
            other => panic!("{body}: {other:?}"),
        }
    }
    // Deep nesting is refused, not a stack overflow.
    let deep = format!("call:f{{a:{}{}}}", "[".repeat(10_000), "]".repeat(10_000));
    assert!(parse_call(&deep).is_err());
    // Many delimiters: each one is tried as a string's end in turn.
    let many = format!("call:f{{a:{}}}", q.repeat(5_000));
    assert_eq!(parse_call(&many).unwrap().arguments, json!({"a": q.repeat(4_998)}));
    // Readings that grow exponentially (every way to split the strings, none closing) are cut off.
    let tangled = format!("call:f{{a:[{}}}", [q, ","].concat().repeat(60));
    assert!(parse_call(&tangled).unwrap_err().contains("too complex"));
    // A call cut off by the end of the reply.
    assert_eq!(
        parts_of("ok<|tool_call>call:f{a:", false),
        [
            Part::Content("ok".into()),
            Part::Malformed { text: "<|tool_call>call:f{a:".into(), error: "the call has no closing <tool_call|>".into() }
        ]
    );
}

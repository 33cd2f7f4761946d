//! JSON as Python holds it: objects keep their keys in the order sent (a `dict`), and
//! [`Json::dumps`] writes a value as `json.dumps` does (`", "` and `": "` separators, `repr` floats,
//! `ensure_ascii`, `sort_keys`).
//!
//! OpenJev derives a request's noise seed from `json.dumps([state, questions], sort_keys=True)`
//! (`openjev/api.py`) and shows structured descriptions to the model as
//! `json.dumps(value, ensure_ascii=False)` (`engine.py`, `text_of`); answering with the same canvases
//! and prompts needs the same bytes. [`seed`] is that seed: the first 4 bytes of the SHA-256, big
//! endian.

use std::fmt::Write;

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use sha2::Digest;

/// A JSON value with its objects' keys in the order they were sent.
#[derive(Debug, Clone, PartialEq)]
pub enum Json {
    Null,
    Bool(bool),
    Number(serde_json::Number),
    String(String),
    Array(Vec<Json>),
    Object(Vec<(String, Json)>),
}

impl Json {
    /// The value of `key` in an object (the last one sent, as a Python dict keeps it).
    pub fn get(&self, key: &str) -> Option<&Json> {
        match self {
            Json::Object(entries) => entries.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// An object's entries with repeated keys collapsed as a Python dict collapses them: the first
    /// position, the last value.
    pub fn dict(entries: &[(String, Json)]) -> Vec<(String, Json)> {
        let mut out: Vec<(String, Json)> = Vec::with_capacity(entries.len());
        for (k, v) in entries {
            match out.iter_mut().find(|(seen, _)| seen == k) {
                Some(slot) => slot.1 = v.clone(),
                None => out.push((k.clone(), v.clone())),
            }
        }
        out
    }

    /// `json.dumps(self, ensure_ascii=ensure_ascii, sort_keys=sort_keys)`.
    pub fn dumps(&self, ensure_ascii: bool, sort_keys: bool) -> String {
        let mut out = String::new();
        self.write(&mut out, ensure_ascii, sort_keys);
        out
    }

    fn write(&self, out: &mut String, ascii: bool, sort: bool) {
        match self {
            Json::Null => out.push_str("null"),
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Json::Number(n) => write_number(out, n),
            Json::String(s) => write_string(out, s, ascii),
            Json::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    item.write(out, ascii, sort);
                }
                out.push(']');
            }
            Json::Object(entries) => {
                let mut entries = Json::dict(entries);
                if sort {
                    entries.sort_by(|a, b| a.0.cmp(&b.0));
                }
                out.push('{');
                for (i, (k, v)) in entries.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    write_string(out, k, ascii);
                    out.push_str(": ");
                    v.write(out, ascii, sort);
                }
                out.push('}');
            }
        }
    }
}

/// An int as `str(int)`, a float as `float.__repr__`.
fn write_number(out: &mut String, n: &serde_json::Number) {
    match n.as_f64() {
        Some(x) if !(n.is_i64() || n.is_u64()) => out.push_str(&crate::py_repr::float_repr(x)),
        _ => {
            let _ = write!(out, "{n}");
        }
    }
}

/// A string as `json.dumps` quotes it.
fn write_string(out: &mut String, s: &str, ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ascii && !c.is_ascii()) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

impl<'de> Deserialize<'de> for Json {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Json;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_unit<E>(self) -> Result<Json, E> {
                Ok(Json::Null)
            }
            fn visit_none<E>(self) -> Result<Json, E> {
                Ok(Json::Null)
            }
            fn visit_bool<E>(self, b: bool) -> Result<Json, E> {
                Ok(Json::Bool(b))
            }
            fn visit_i64<E>(self, n: i64) -> Result<Json, E> {
                Ok(Json::Number(n.into()))
            }
            fn visit_u64<E>(self, n: u64) -> Result<Json, E> {
                Ok(Json::Number(n.into()))
            }
            fn visit_f64<E: serde::de::Error>(self, x: f64) -> Result<Json, E> {
                serde_json::Number::from_f64(x).map(Json::Number).ok_or_else(|| E::custom("a number that is not finite"))
            }
            fn visit_str<E>(self, s: &str) -> Result<Json, E> {
                Ok(Json::String(s.to_string()))
            }
            fn visit_string<E>(self, s: String) -> Result<Json, E> {
                Ok(Json::String(s))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Json, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element()? {
                    items.push(item);
                }
                Ok(Json::Array(items))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Json, A::Error> {
                let mut entries = Vec::new();
                while let Some((k, v)) = map.next_entry()? {
                    entries.push((k, v));
                }
                Ok(Json::Object(entries))
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// OpenJev's noise seed of a request: `int.from_bytes(sha256(json.dumps(key,
/// sort_keys=True).encode()).digest()[:4], "big")`, where `key` is `[state, questions]` (the
/// validated questions as pydantic dumps them), with the images' data URLs (a list) after them
/// when the request has images.
pub fn seed(key: &[Json]) -> u32 {
    let text = Json::Array(key.to_vec()).dumps(true, true);
    let digest = sha2::Sha256::digest(text.as_bytes());
    u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Json {
        serde_json::from_str(s).unwrap()
    }

    #[test]
    fn dumps_and_seeds_as_python() {
        // Expected values from CPython 3.11's json.dumps and hashlib.
        let v = parse(r#"{"b": [1, 2.5, 1e16, 1e-5, 100.0, 0.0001, -3], "a": "é\u2028😀\n", "c": null, "d": true}"#);
        assert_eq!(
            v.dumps(true, true),
            r#"{"a": "\u00e9\u2028\ud83d\ude00\n", "b": [1, 2.5, 1e+16, 1e-05, 100.0, 0.0001, -3], "c": null, "d": true}"#
        );
        assert_eq!(
            v.dumps(false, false),
            "{\"b\": [1, 2.5, 1e+16, 1e-05, 100.0, 0.0001, -3], \"a\": \"é\u{2028}😀\\n\", \"c\": null, \"d\": true}"
        );
        let questions = parse(r#"{"q": {"type": "noul", "instructions": "Is it late?", "criteria": null}}"#);
        assert_eq!(seed(&[Json::String("The train left at 9.".into()), questions.clone()]), SEED_OF_EXAMPLE);
        let urls = Json::Array(vec![Json::String("data:image/png;base64,AAEC".into())]);
        assert_eq!(seed(&[Json::String("The train left at 9.".into()), questions, urls]), SEED_WITH_IMAGE);
    }

    /// `int.from_bytes(hashlib.sha256(json.dumps(["The train left at 9.", {"q": {"type": "noul",
    /// "instructions": "Is it late?", "criteria": None}}], sort_keys=True).encode()).digest()[:4], "big")`.
    const SEED_OF_EXAMPLE: u32 = 2_034_459_031;
    /// The same with `[["data:image/png;base64,AAEC"]]` after the questions (a request with one
    /// image).
    const SEED_WITH_IMAGE: u32 = 1_297_066_542;
}

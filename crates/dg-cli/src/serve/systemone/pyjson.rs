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

/// OpenJev's noise seed of a request: `int.from_bytes(sha256(json.dumps([state, questions],
/// sort_keys=True).encode()).digest()[:4], "big")`, where `questions` are the validated questions
/// as pydantic dumps them.
pub fn seed(state: &Json, questions: &Json) -> u32 {
    let text = Json::Array(vec![state.clone(), questions.clone()]).dumps(true, true);
    let digest = sha256(text.as_bytes());
    u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]])
}

/// SHA-256 (FIPS 180-4).
fn sha256(data: &[u8]) -> [u8; 32] {
    const K: [u32; 64] = [
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be,
        0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa,
        0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85,
        0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3,
        0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f,
        0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
    ];
    let mut h: [u32; 8] = [0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19];
    let mut msg = data.to_vec();
    msg.push(0x80);
    while msg.len() % 64 != 56 {
        msg.push(0);
    }
    msg.extend_from_slice(&((data.len() as u64) * 8).to_be_bytes());
    for block in msg.chunks_exact(64) {
        let mut w = [0u32; 64];
        for (i, word) in block.chunks_exact(4).enumerate() {
            w[i] = u32::from_be_bytes([word[0], word[1], word[2], word[3]]);
        }
        for i in 16..64 {
            let s0 = w[i - 15].rotate_right(7) ^ w[i - 15].rotate_right(18) ^ (w[i - 15] >> 3);
            let s1 = w[i - 2].rotate_right(17) ^ w[i - 2].rotate_right(19) ^ (w[i - 2] >> 10);
            w[i] = w[i - 16].wrapping_add(s0).wrapping_add(w[i - 7]).wrapping_add(s1);
        }
        let mut v = h;
        for i in 0..64 {
            let s1 = v[4].rotate_right(6) ^ v[4].rotate_right(11) ^ v[4].rotate_right(25);
            let ch = (v[4] & v[5]) ^ (!v[4] & v[6]);
            let t1 = v[7].wrapping_add(s1).wrapping_add(ch).wrapping_add(K[i]).wrapping_add(w[i]);
            let s0 = v[0].rotate_right(2) ^ v[0].rotate_right(13) ^ v[0].rotate_right(22);
            let maj = (v[0] & v[1]) ^ (v[0] & v[2]) ^ (v[1] & v[2]);
            let t2 = s0.wrapping_add(maj);
            v = [t1.wrapping_add(t2), v[0], v[1], v[2], v[3].wrapping_add(t1), v[4], v[5], v[6]];
        }
        for (h, v) in h.iter_mut().zip(v) {
            *h = h.wrapping_add(v);
        }
    }
    let mut out = [0u8; 32];
    for (o, h) in out.chunks_exact_mut(4).zip(h) {
        o.copy_from_slice(&h.to_be_bytes());
    }
    out
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
        assert_eq!(hex(&sha256(b"abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        let questions = parse(r#"{"q": {"type": "noul", "instructions": "Is it late?", "criteria": null}}"#);
        assert_eq!(seed(&Json::String("The train left at 9.".into()), &questions), SEED_OF_EXAMPLE);
    }

    /// `int.from_bytes(hashlib.sha256(json.dumps(["The train left at 9.", {"q": {"type": "noul",
    /// "instructions": "Is it late?", "criteria": None}}], sort_keys=True).encode()).digest()[:4], "big")`.
    const SEED_OF_EXAMPLE: u32 = 2_034_459_031;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }
}

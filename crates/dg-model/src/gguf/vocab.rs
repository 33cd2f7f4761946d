//! The tokenizer and chat template a GGUF file carries (`tokenizer.ggml.*`,
//! `tokenizer.chat_template`), read and validated into a plain [`Vocab`], and written back from one.
//!
//! Mirrors what llama.cpp's converter writes for DiffusionGemma (`Gemma4Model.set_vocab` over
//! gguf-py's `LlamaHfVocab` and `SpecialVocab`) and what llama.cpp reads (`llama_vocab::impl::load`
//! in `src/llama-vocab.cpp`): the `"gemma4"` model, a BPE over SentencePiece-style `▁` spaces with
//! `<0xXX>` byte fallback, whose merges are `"left right"` strings split at the first space after
//! the first character. Every count, type, id and merge is checked, and an error names the key.

use std::collections::HashMap;

use super::GgufFile;
use super::read::{MetaValue, ty};
use crate::error::{ModelError, Result};

/// `tokenizer.ggml.model` of the vocabularies dg reads.
pub const GEMMA4: &str = "gemma4";

/// A token's type (`llama_token_type` / gguf-py's `TokenType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenType {
    Undefined = 0,
    Normal = 1,
    Unknown = 2,
    /// A special token the tokenizer matches whole and decoding leaves out.
    Control = 3,
    /// A special token that decoding renders (the converter's chat-parser tokens).
    UserDefined = 4,
    Unused = 5,
    /// `<0xXX>`: one byte of a character the vocabulary lacks.
    Byte = 6,
}

impl TokenType {
    fn from_i64(v: i64) -> Option<Self> {
        Some(match v {
            0 => Self::Undefined,
            1 => Self::Normal,
            2 => Self::Unknown,
            3 => Self::Control,
            4 => Self::UserDefined,
            5 => Self::Unused,
            6 => Self::Byte,
            _ => return None,
        })
    }

    /// Whether the tokenizer matches the token whole, before the model sees the text (an added
    /// token of HF `tokenizers`).
    pub fn is_special(self) -> bool {
        matches!(self, Self::Control | Self::UserDefined)
    }
}

/// The special ids a vocabulary names (`tokenizer.ggml.*_token_id`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpecialIds {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub unk: Option<u32>,
    pub pad: Option<u32>,
    pub mask: Option<u32>,
}

/// The GGUF key suffix of each special id, as gguf-py's `Keys.Tokenizer` names them.
const SPECIAL_KEYS: [&str; 6] = ["bos", "eos", "unknown", "padding", "mask", "eot"];

impl SpecialIds {
    fn slots(&mut self) -> [&mut Option<u32>; 6] {
        [&mut self.bos, &mut self.eos, &mut self.unk, &mut self.pad, &mut self.mask, &mut self.eot]
    }

    fn values(&self) -> [Option<u32>; 6] {
        [self.bos, self.eos, self.unk, self.pad, self.mask, self.eot]
    }
}

/// A GGUF file's tokenizer: the vocabulary, its merges and special ids, and the chat template.
#[derive(Debug, Clone, PartialEq)]
pub struct Vocab {
    /// `tokenizer.ggml.model` ([`GEMMA4`]).
    pub model: String,
    /// Token strings by id.
    pub tokens: Vec<String>,
    /// Scores by id (the converter writes -1000 for every BPE token); empty when absent.
    pub scores: Vec<f32>,
    pub types: Vec<TokenType>,
    /// BPE merges in rank order.
    pub merges: Vec<(String, String)>,
    pub special: SpecialIds,
    pub add_bos: bool,
    pub add_eos: bool,
    pub add_space_prefix: bool,
    pub chat_template: Option<String>,
}

const PREFIX: &str = "tokenizer.ggml.";

fn key(name: &str) -> String {
    format!("{PREFIX}{name}")
}

impl GgufFile {
    /// The file's tokenizer, or `None` when it carries none (no `tokenizer.ggml.model`).
    pub fn vocab(&self) -> Result<Option<Vocab>> {
        let bad = |key: &str, message: String| ModelError::GgufMetadata { path: self.path().into(), key: key.into(), message };
        let model_key = key("model");
        let model = match self.meta(&model_key) {
            None => return Ok(None),
            Some(MetaValue::Str(m)) => m,
            Some(other) => return Err(bad(&model_key, format!("expected a string, got {}", short(&other)))),
        };
        if model != GEMMA4 {
            return Err(bad(&model_key, format!("tokenizer model {model:?} is not supported (dg reads {GEMMA4:?})")));
        }
        let array = |name: &str, elem: u32, required: bool| -> Result<Option<Vec<MetaValue>>> {
            let k = key(name);
            match self.meta(&k) {
                None if required => Err(bad(&k, format!("missing (a {GEMMA4:?} tokenizer needs it)"))),
                None => Ok(None),
                Some(MetaValue::Array(t, v)) if t == elem || v.is_empty() => Ok(Some(v)),
                Some(other) => Err(bad(&k, format!("expected an array of {}, got {}", type_name(elem), short(&other)))),
            }
        };
        let tokens: Vec<String> = array("tokens", ty::STRING, true)?
            .unwrap_or_default()
            .into_iter()
            .map(|v| match v {
                MetaValue::Str(s) => s,
                _ => unreachable!("an array of strings"),
            })
            .collect();
        let n = tokens.len();
        if n == 0 {
            return Err(bad(&key("tokens"), "is empty".into()));
        }
        let mut by_text = HashMap::with_capacity(n);
        for (id, t) in tokens.iter().enumerate() {
            if let Some(first) = by_text.insert(t.as_str(), id) {
                return Err(bad(&key("tokens"), format!("token {t:?} appears twice (ids {first} and {id})")));
            }
        }
        let same_len = |name: &str, len: usize| {
            if len == n { Ok(()) } else { Err(bad(&key(name), format!("has {len} entries for {n} tokens"))) }
        };
        let scores: Vec<f32> = match array("scores", ty::F32, false)? {
            None => Vec::new(),
            Some(v) => {
                same_len("scores", v.len())?;
                v.iter().map(|s| if let MetaValue::F32(f) = s { *f } else { unreachable!("an array of f32") }).collect()
            }
        };
        let types_key = key("token_type");
        let types: Vec<TokenType> = match self.meta(&types_key) {
            None => return Err(bad(&types_key, format!("missing (a {GEMMA4:?} tokenizer needs it)"))),
            Some(MetaValue::Array(_, v)) => {
                same_len("token_type", v.len())?;
                v.iter()
                    .enumerate()
                    .map(|(id, t)| {
                        let raw = match *t {
                            MetaValue::I32(x) => Some(i64::from(x)),
                            MetaValue::U32(x) => Some(i64::from(x)),
                            _ => None,
                        };
                        raw.and_then(TokenType::from_i64).ok_or_else(|| {
                            bad(&types_key, format!("token {id} ({:?}) has type {}, not one of 0..=6", tokens[id], short(t)))
                        })
                    })
                    .collect::<Result<_>>()?
            }
            Some(other) => return Err(bad(&types_key, format!("expected an array of int32, got {}", short(&other)))),
        };
        let merges_key = key("merges");
        let merges = array("merges", ty::STRING, true)?
            .unwrap_or_default()
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let MetaValue::Str(m) = m else { unreachable!("an array of strings") };
                let (left, right) = split_merge(m).ok_or_else(|| bad(&merges_key, format!("merge {i} {m:?} is not \"left right\"")))?;
                for part in [left, right, &format!("{left}{right}")] {
                    if !by_text.contains_key(part) {
                        return Err(bad(&merges_key, format!("merge {i} {m:?}: {part:?} is not a token")));
                    }
                }
                Ok((left.to_string(), right.to_string()))
            })
            .collect::<Result<Vec<_>>>()?;
        let mut special = SpecialIds::default();
        for (name, slot) in SPECIAL_KEYS.iter().zip(special.slots()) {
            let k = key(&format!("{name}_token_id"));
            *slot = match self.meta(&k) {
                None => None,
                Some(v) => match v.as_u64() {
                    Some(id) if id < n as u64 => Some(id as u32),
                    _ => return Err(bad(&k, format!("{} is not a token id (the vocabulary has {n})", short(&v)))),
                },
            };
        }
        let flag = |name: &str, default: bool| -> Result<bool> {
            let k = key(name);
            match self.meta(&k) {
                None => Ok(default),
                Some(MetaValue::Bool(b)) => Ok(b),
                Some(other) => Err(bad(&k, format!("expected a bool, got {}", short(&other)))),
            }
        };
        // llama.cpp adds <bos> to every "gemma4" prompt whatever the file says.
        let _ = flag("add_bos_token", true)?;
        let add_bos = true;
        if special.bos.is_none() {
            return Err(bad(&key("bos_token_id"), format!("missing (a {GEMMA4:?} tokenizer adds <bos> to every prompt)")));
        }
        let add_eos = flag("add_eos_token", false)?;
        if add_eos && special.eos.is_none() {
            return Err(bad(&key("eos_token_id"), "missing, but add_eos_token is true".into()));
        }
        let add_space_prefix = flag("add_space_prefix", false)?;
        if add_space_prefix {
            return Err(bad(&key("add_space_prefix"), format!("is true; a {GEMMA4:?} tokenizer adds no space prefix")));
        }
        let template_key = "tokenizer.chat_template";
        let chat_template = match self.meta(template_key) {
            None => None,
            Some(MetaValue::Str(s)) => Some(s),
            Some(other) => return Err(bad(template_key, format!("expected a string, got {}", short(&other)))),
        };
        Ok(Some(Vocab { model, tokens, scores, types, merges, special, add_bos, add_eos, add_space_prefix, chat_template }))
    }
}

/// `"left right"` split as llama.cpp splits it: at the first space after the first character.
fn split_merge(m: &str) -> Option<(&str, &str)> {
    let first = m.chars().next()?.len_utf8();
    let pos = first + m[first..].find(' ')?;
    let (left, right) = (&m[..pos], &m[pos + 1..]);
    (!right.is_empty()).then_some((left, right))
}

/// A value for an error message: scalars whole, arrays by type and length.
fn short(v: &MetaValue) -> String {
    match v {
        MetaValue::Array(t, items) => format!("an array of {} {}", items.len(), type_name(*t)),
        MetaValue::Str(s) if s.len() > 40 => format!("a string of {} bytes", s.len()),
        other => format!("{other:?}"),
    }
}

fn type_name(t: u32) -> &'static str {
    match t {
        ty::STRING => "strings",
        ty::F32 => "float32",
        ty::I32 => "int32",
        ty::U32 => "uint32",
        ty::BOOL => "bools",
        ty::ARRAY => "arrays",
        _ => "numbers",
    }
}

impl Vocab {
    /// The metadata a GGUF file carries for this vocabulary, in the converter's key order and types.
    pub fn metadata(&self) -> Vec<(String, MetaValue)> {
        let strings = |v: Vec<String>| MetaValue::Array(ty::STRING, v.into_iter().map(MetaValue::Str).collect());
        let mut m = vec![(key("model"), MetaValue::Str(self.model.clone())), (key("tokens"), strings(self.tokens.clone()))];
        if !self.scores.is_empty() {
            m.push((key("scores"), MetaValue::Array(ty::F32, self.scores.iter().map(|&s| MetaValue::F32(s)).collect())));
        }
        m.push((key("token_type"), MetaValue::Array(ty::I32, self.types.iter().map(|&t| MetaValue::I32(t as i32)).collect())));
        m.push((key("merges"), strings(self.merges.iter().map(|(a, b)| format!("{a} {b}")).collect())));
        for (name, id) in SPECIAL_KEYS.iter().zip(self.special.values()) {
            if let Some(id) = id {
                m.push((key(&format!("{name}_token_id")), MetaValue::U32(id)));
            }
        }
        m.push((key("add_bos_token"), MetaValue::Bool(self.add_bos)));
        m.push((key("add_eos_token"), MetaValue::Bool(self.add_eos)));
        if let Some(t) = &self.chat_template {
            m.push(("tokenizer.chat_template".into(), MetaValue::Str(t.clone())));
        }
        m.push((key("add_space_prefix"), MetaValue::Bool(self.add_space_prefix)));
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_split_at_the_first_space_after_the_first_character() {
        assert_eq!(split_merge("▁ a"), Some(("▁", "a")));
        assert_eq!(split_merge("ab cd"), Some(("ab", "cd")));
        assert_eq!(split_merge("  x"), Some((" ", "x")));
        assert_eq!(split_merge("ab"), None);
        assert_eq!(split_merge("ab "), None);
        assert_eq!(split_merge(""), None);
    }
}

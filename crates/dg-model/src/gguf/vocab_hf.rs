//! A model directory's HF tokenizer (`tokenizer.json`, `tokenizer_config.json`, `config.json`,
//! the chat template) as the GGUF [`Vocab`] llama.cpp's converter writes from it.
//!
//! Mirrors `Gemma4Model.set_vocab` (`conversion/gemma.py`) over gguf-py's `LlamaHfVocab` and
//! `SpecialVocab` (`gguf/vocab.py`): tokens by id, score -1000 each, type byte for `<0xXX>`,
//! control for the special tokens, user-defined for the few the converter wants rendered
//! ([`RENDERED`]), normal otherwise; the merges as `"left right"`; the special ids named by
//! `tokenizer_config.json` (then `config.json`); `add_bos_token` / `add_eos_token` from the
//! post-processor and `tokenizer_config.json`; the chat template of `tokenizer_config.json`, else
//! `chat_template.jinja`. The `"gemma4"` model fixes the rest of the tokenizer (normalizer,
//! pre-tokenizer, decoder: see dg-cli's `gguf_tokenizer`), so a `tokenizer.json` that differs
//! from it there is refused, saying what differs, rather than written as something it is not.

use std::path::Path;

use serde_json::{Value, json};

use super::vocab::{GEMMA4, SpecialIds, TokenType, Vocab};
use crate::error::{ModelError, Result};

/// The special tokens the converter marks user-defined, so that llama.cpp renders them for its
/// chat parser.
pub const RENDERED: [&str; 7] =
    ["<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", "<|tool_response>", "<tool_response|>", "<|\"|>"];

/// The score the converter gives every token of a BPE vocabulary.
const SCORE: f32 = -1000.0;

fn read_json(path: &Path) -> Result<Option<Value>> {
    if !path.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path).map_err(|source| ModelError::Io { path: path.into(), source })?;
    serde_json::from_str(&text).map(Some).map_err(|e| ModelError::Gguf { path: path.into(), message: format!("malformed JSON: {e}") })
}

impl Vocab {
    /// The vocabulary of the model directory `dir`, or `None` when it has no `tokenizer.json`.
    /// A tokenizer the `"gemma4"` model cannot represent exactly is an error naming what differs.
    pub fn from_hf_dir(dir: &Path) -> Result<Option<Vocab>> {
        let path = dir.join("tokenizer.json");
        let Some(tok) = read_json(&path)? else { return Ok(None) };
        let bad = |message: String| ModelError::Gguf { path: path.clone(), message };
        let unfaithful = |what: &str, got: &Value| {
            bad(format!("{what} is {got}, which a {GEMMA4:?} GGUF vocabulary cannot represent (dg writes Gemma 4's tokenizer layout only)"))
        };
        check_layout(&tok).map_err(|(what, got)| unfaithful(what, &got))?;
        let model = &tok["model"];

        // Tokens by id: the model's vocabulary, then added tokens beyond it.
        let mut slots: Vec<Option<String>> = Vec::new();
        let mut put = |text: &str, id: &Value| -> Result<()> {
            let id = id.as_u64().and_then(|i| usize::try_from(i).ok()).ok_or_else(|| bad(format!("token {text:?} has id {id}")))?;
            if id >= slots.len() {
                slots.resize(id + 1, None);
            }
            match &slots[id] {
                Some(other) if other != text => Err(bad(format!("id {id} is both {other:?} and {text:?}"))),
                _ => {
                    slots[id] = Some(text.to_string());
                    Ok(())
                }
            }
        };
        for (text, id) in model["vocab"].as_object().ok_or_else(|| bad("model.vocab is not an object".into()))? {
            put(text, id)?;
        }
        let added = tok["added_tokens"].as_array().cloned().unwrap_or_default();
        let mut special_texts = Vec::new();
        for a in &added {
            let text = a["content"].as_str().ok_or_else(|| bad(format!("added token {a} has no content")))?;
            put(text, &a["id"])?;
            let flags = ["lstrip", "rstrip", "single_word"].iter().any(|f| a[*f] == json!(true));
            if a["special"] != json!(true) || flags || (a["normalized"] == json!(true) && text.contains(' ')) {
                return Err(unfaithful(&format!("added token {text:?}"), a));
            }
            special_texts.push(text.to_string());
        }
        let tokens = slots
            .into_iter()
            .enumerate()
            .map(|(id, t)| t.ok_or_else(|| bad(format!("no token has id {id}"))))
            .collect::<Result<Vec<_>>>()?;
        let types = tokens
            .iter()
            .map(|t| {
                let special = special_texts.contains(t);
                if RENDERED.contains(&t.as_str()) && !special {
                    Err(unfaithful(&format!("token {t:?}"), &json!("not a special token")))
                } else if RENDERED.contains(&t.as_str()) {
                    Ok(TokenType::UserDefined)
                } else if special {
                    Ok(TokenType::Control)
                } else if is_byte_token(t) {
                    Ok(TokenType::Byte)
                } else {
                    Ok(TokenType::Normal)
                }
            })
            .collect::<Result<Vec<_>>>()?;
        let merges = merges(&model["merges"]).ok_or_else(|| bad(format!("model.merges is not a list of pairs: {}", model["merges"])))?;

        let config = read_json(&dir.join("tokenizer_config.json"))?.unwrap_or(Value::Null);
        let id_of = |typ: &str| -> Option<u32> {
            let entry = &config[format!("{typ}_token")];
            let text = entry.as_str().or_else(|| entry["content"].as_str())?;
            added.iter().find(|a| a["content"] == text).and_then(|a| a["id"].as_u64()).and_then(|i| u32::try_from(i).ok())
        };
        let model_config = read_json(&dir.join("config.json"))?.unwrap_or(Value::Null);
        let from_config = |typ: &str| -> Option<u32> {
            let key = format!("{typ}_token_id");
            let v = if model_config[&key].is_null() { &model_config["text_config"][&key] } else { &model_config[&key] };
            v.as_u64().and_then(|i| u32::try_from(i).ok())
        };
        let n = tokens.len() as u32;
        let pick = |typ: &str| id_of(typ).or_else(|| from_config(typ)).filter(|&id| id < n);
        let special = SpecialIds { bos: pick("bos"), eos: pick("eos"), unk: pick("unk"), pad: pick("pad"), mask: pick("mask"), eot: None };

        let (mut add_bos, mut add_eos) = post_processor_adds(&tok["post_processor"], &tokens, &special);
        if let Some(b) = config["add_bos_token"].as_bool() {
            add_bos = b;
        }
        if let Some(b) = config["add_eos_token"].as_bool() {
            add_eos = b;
        }
        if !add_bos {
            return Err(unfaithful("the tokenizer without <bos>", &json!(tok["post_processor"])));
        }
        if special.bos.is_none() || (add_eos && special.eos.is_none()) {
            return Err(bad("tokenizer_config.json names no <bos> (or <eos>) among the added tokens".into()));
        }
        let chat_template = chat_template(dir, &config)?;
        Ok(Some(Vocab {
            model: GEMMA4.into(),
            scores: vec![SCORE; tokens.len()],
            tokens,
            types,
            merges,
            special,
            add_bos,
            add_eos,
            add_space_prefix: false,
            chat_template,
        }))
    }
}

/// Checks `tokenizer.json` has Gemma 4's layout; else the part that differs and its value.
fn check_layout(tok: &Value) -> std::result::Result<(), (&'static str, Value)> {
    let model = &tok["model"];
    let wanted = [
        ("model.type", &model["type"], json!("BPE")),
        ("model.byte_fallback", &model["byte_fallback"], json!(true)),
        ("model.fuse_unk", &model["fuse_unk"], json!(true)),
    ];
    for (what, got, want) in wanted {
        if *got != want {
            return Err((what, got.clone()));
        }
    }
    for (what, key) in [
        ("model.dropout", "dropout"),
        ("model.continuing_subword_prefix", "continuing_subword_prefix"),
        ("model.end_of_word_suffix", "end_of_word_suffix"),
    ] {
        if !model[key].is_null() {
            return Err((what, model[key].clone()));
        }
    }
    if model["ignore_merges"] == json!(true) {
        return Err(("model.ignore_merges", json!(true)));
    }
    let normalizer = json!({"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"});
    if tok["normalizer"] != normalizer {
        return Err(("the normalizer", tok["normalizer"].clone()));
    }
    let split = json!({"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious", "invert": false});
    if !tok["pre_tokenizer"].is_null() && tok["pre_tokenizer"] != split {
        return Err(("the pre-tokenizer", tok["pre_tokenizer"].clone()));
    }
    let decoder = json!({"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "},
        {"type": "ByteFallback"},
        {"type": "Fuse"},
    ]});
    if tok["decoder"] != decoder {
        return Err(("the decoder", tok["decoder"].clone()));
    }
    Ok(())
}

/// `<0xXX>`, as `LlamaHfVocab.get_token_type` matches it.
fn is_byte_token(t: &str) -> bool {
    let b = t.as_bytes();
    b.len() == 6 && t.starts_with("<0x") && t.ends_with('>') && b[3].is_ascii_hexdigit() && b[4].is_ascii_hexdigit()
}

/// The merges as pairs: `"a b"` strings, or `[a, b]` lists whose spaces the converter writes
/// as U+0120 (`SpecialVocab._try_load_from_tokenizer_json`).
fn merges(v: &Value) -> Option<Vec<(String, String)>> {
    let space = |s: &str| s.replace(' ', "\u{120}");
    v.as_array()?
        .iter()
        .map(|m| match m {
            Value::String(s) => s.split_once(' ').map(|(a, b)| (a.to_string(), b.to_string())),
            Value::Array(pair) if pair.len() == 2 => Some((space(pair[0].as_str()?), space(pair[1].as_str()?))),
            _ => None,
        })
        .collect()
}

/// Whether the post-processor puts `<bos>` first and `<eos>` last (`SpecialVocab`'s reading of a
/// `TemplateProcessing`, for the single-sequence template).
fn post_processor_adds(pp: &Value, tokens: &[String], special: &SpecialIds) -> (bool, bool) {
    let processors = match pp["type"].as_str() {
        Some("Sequence") => pp["processors"].as_array().cloned().unwrap_or_default(),
        Some(_) => vec![pp.clone()],
        None => Vec::new(),
    };
    let named = |id: Option<u32>| id.map(|i| tokens[i as usize].as_str());
    let (mut bos, mut eos) = (false, false);
    for p in processors.iter().filter(|p| p["type"] == "TemplateProcessing") {
        let single = p["single"].as_array().cloned().unwrap_or_default();
        if single.len() > 1 {
            let first = single[0]["SpecialToken"]["id"].as_str();
            let last = single[single.len() - 1]["SpecialToken"]["id"].as_str();
            bos = first.is_some() && first == named(special.bos);
            eos = last.is_some() && last == named(special.eos);
        }
    }
    (bos, eos)
}

/// `chat_template` of `tokenizer_config.json` (a string, or the template named "default" of a
/// list), else `chat_template.jinja`.
fn chat_template(dir: &Path, config: &Value) -> Result<Option<String>> {
    match &config["chat_template"] {
        Value::String(s) => return Ok(Some(s.clone())),
        Value::Array(list) => {
            let named = list.iter().find(|t| t["name"] == "default").or(list.first());
            if let Some(t) = named.and_then(|t| t["template"].as_str()) {
                return Ok(Some(t.to_string()));
            }
        }
        _ => {}
    }
    let jinja = dir.join("chat_template.jinja");
    if !jinja.is_file() {
        return Ok(None);
    }
    std::fs::read_to_string(&jinja).map(Some).map_err(|source| ModelError::Io { path: jinja, source })
}

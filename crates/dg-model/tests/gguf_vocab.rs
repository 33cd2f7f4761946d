//! The tokenizer a GGUF file carries: the converter fixture's (`fixtures/converter-gemma4-vocab`,
//! written by llama.cpp's converter) reads as gguf-py reads it, a vocabulary dg writes reads back
//! the same, and broken tokenizer metadata is an error naming the key and the value.

use std::path::{Path, PathBuf};

use dg_model::gguf::{GEMMA4, GgufFile, GgufWriter, MetaValue, SpecialIds, TokenType, Vocab};
use tempfile::TempDir;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/converter-gemma4-vocab")
}

fn converter_vocab() -> Vocab {
    GgufFile::open(&fixture().join("model.gguf")).unwrap().vocab().unwrap().expect("the converter writes a tokenizer")
}

#[test]
fn the_converter_fixture_reads_as_gguf_py_reads_it() {
    let v = converter_vocab();
    assert_eq!(v.model, GEMMA4);
    assert_eq!(v.tokens.len(), 881);
    assert_eq!(&v.tokens[..3], ["<pad>", "<eos>", "<bos>"]);
    assert_eq!(v.special, SpecialIds { bos: Some(2), eos: Some(1), unk: Some(3), pad: Some(0), mask: Some(4), eot: None });
    let count = |t: TokenType| v.types.iter().filter(|&&x| x == t).count();
    assert_eq!((count(TokenType::Control), count(TokenType::UserDefined), count(TokenType::Byte)), (17, 7, 256));
    for visible in ["<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", "<|tool_response>", "<tool_response|>", "<|\"|>"] {
        let id = v.tokens.iter().position(|t| t == visible).unwrap();
        assert_eq!(v.types[id], TokenType::UserDefined, "{visible}");
    }
    assert_eq!(v.tokens[24 + 0x41], "<0x41>");
    assert!(v.scores.iter().all(|&s| s == -1000.0));
    assert_eq!(v.merges[0], ("▁".to_string(), "a".to_string()));
    assert!((v.add_bos, v.add_eos, v.add_space_prefix) == (true, false, false));
    let template = std::fs::read_to_string(fixture().join("hf/chat_template.jinja")).unwrap();
    assert_eq!(v.chat_template.as_deref(), Some(template.as_str()));
}

#[test]
fn a_written_vocabulary_reads_back_the_same() {
    let v = converter_vocab();
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("v.gguf");
    GgufWriter::create(&path, &v.metadata(), &[]).unwrap().finish().unwrap();
    assert_eq!(GgufFile::open(&path).unwrap().vocab().unwrap().unwrap(), v);
}

/// A change to a file's metadata.
type Edit = dyn FnOnce(&mut Vec<(String, MetaValue)>);

/// A change to a `tokenizer.json`, and what the error then names.
type JsonEdit = (fn(&mut serde_json::Value), &'static str);

/// A GGUF holding the converter's tokenizer metadata with `edit` applied, and the error reading it.
fn error_with(edit: impl FnOnce(&mut Vec<(String, MetaValue)>)) -> String {
    let mut meta = converter_vocab().metadata();
    edit(&mut meta);
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("bad.gguf");
    GgufWriter::create(&path, &meta, &[]).unwrap().finish().unwrap();
    let file = GgufFile::open(&path).unwrap();
    format!("{}", file.vocab().expect_err("the tokenizer metadata is broken"))
}

fn set(meta: &mut [(String, MetaValue)], key: &str, value: MetaValue) {
    meta.iter_mut().find(|(k, _)| k == key).unwrap_or_else(|| panic!("{key} is written")).1 = value;
}

fn strings(v: &[&str]) -> MetaValue {
    MetaValue::Array(8, v.iter().map(|s| MetaValue::Str(s.to_string())).collect())
}

#[test]
fn broken_tokenizer_metadata_is_an_error_naming_the_key() {
    let cases: Vec<(Box<Edit>, &[&str])> = vec![
        (Box::new(|m| set(m, "tokenizer.ggml.model", MetaValue::Str("llama".into()))), &["tokenizer.ggml.model", "\"llama\"", "gemma4"]),
        (Box::new(|m| set(m, "tokenizer.ggml.model", MetaValue::U32(1))), &["tokenizer.ggml.model", "expected a string"]),
        (Box::new(|m| m.retain(|(k, _)| k != "tokenizer.ggml.tokens")), &["tokenizer.ggml.tokens", "missing"]),
        (Box::new(|m| set(m, "tokenizer.ggml.tokens", MetaValue::U32(3))), &["tokenizer.ggml.tokens", "expected an array of strings"]),
        (
            Box::new(|m| set(m, "tokenizer.ggml.tokens", strings(&["a", "b", "a"]))),
            &["tokenizer.ggml.tokens", "\"a\" appears twice (ids 0 and 2)"],
        ),
        (
            Box::new(|m| set(m, "tokenizer.ggml.scores", MetaValue::Array(6, vec![MetaValue::F32(0.0)]))),
            &["tokenizer.ggml.scores", "1 entries for 881 tokens"],
        ),
        (
            Box::new(|m| set(m, "tokenizer.ggml.token_type", MetaValue::Array(5, vec![MetaValue::I32(1); 880]))),
            &["tokenizer.ggml.token_type", "880 entries"],
        ),
        (
            Box::new(|m| {
                set(
                    m,
                    "tokenizer.ggml.token_type",
                    MetaValue::Array(5, (0..881).map(|i| MetaValue::I32(if i == 9 { 7 } else { 1 })).collect()),
                )
            }),
            &["tokenizer.ggml.token_type", "token 9", "7"],
        ),
        (Box::new(|m| set(m, "tokenizer.ggml.merges", strings(&["▁a"]))), &["tokenizer.ggml.merges", "merge 0 \"▁a\""]),
        (
            Box::new(|m| set(m, "tokenizer.ggml.merges", strings(&["▁ a", "▁ zz"]))),
            &["tokenizer.ggml.merges", "merge 1", "\"zz\" is not a token"],
        ),
        (Box::new(|m| set(m, "tokenizer.ggml.bos_token_id", MetaValue::U32(881))), &["tokenizer.ggml.bos_token_id", "881", "881"]),
        (Box::new(|m| set(m, "tokenizer.ggml.eos_token_id", MetaValue::I32(-1))), &["tokenizer.ggml.eos_token_id", "-1"]),
        (Box::new(|m| m.retain(|(k, _)| k != "tokenizer.ggml.bos_token_id")), &["tokenizer.ggml.bos_token_id", "missing"]),
        (
            Box::new(|m| set(m, "tokenizer.ggml.add_space_prefix", MetaValue::Bool(true))),
            &["tokenizer.ggml.add_space_prefix", "no space prefix"],
        ),
        (Box::new(|m| set(m, "tokenizer.ggml.add_eos_token", MetaValue::U8(1))), &["tokenizer.ggml.add_eos_token", "expected a bool"]),
        (Box::new(|m| set(m, "tokenizer.chat_template", MetaValue::U8(1))), &["tokenizer.chat_template", "expected a string"]),
    ];
    for (i, (edit, wanted)) in cases.into_iter().enumerate() {
        let e = error_with(edit);
        for w in wanted {
            assert!(e.contains(w), "case {i}: {w:?} not in {e:?}");
        }
        assert!(e.contains("bad.gguf"), "case {i}: the file is named in {e:?}");
    }
}

#[test]
fn a_file_without_a_tokenizer_has_none() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("none.gguf");
    GgufWriter::create(&path, &[("general.architecture".into(), MetaValue::Str("diffusion-gemma".into()))], &[]).unwrap().finish().unwrap();
    assert_eq!(GgufFile::open(&path).unwrap().vocab().unwrap(), None);
}

/// dg's writer takes the vocabulary from the HF files as the converter does: from the fixture's
/// `hf/` directory dg makes exactly what the converter wrote into `model.gguf`.
#[test]
fn from_the_hf_files_dg_makes_the_vocabulary_the_converter_wrote() {
    let ours = Vocab::from_hf_dir(&fixture().join("hf")).unwrap().expect("hf/ has a tokenizer.json");
    let theirs = converter_vocab();
    assert_eq!(ours.tokens, theirs.tokens);
    assert_eq!(ours.types, theirs.types);
    assert_eq!(ours.merges, theirs.merges);
    assert_eq!(ours, theirs);
}

/// A `tokenizer.json` the "gemma4" model cannot represent is refused, naming what differs.
#[test]
fn a_tokenizer_gemma4_cannot_represent_is_refused() {
    let hf = fixture().join("hf");
    let original: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(hf.join("tokenizer.json")).unwrap()).unwrap();
    let edits: Vec<JsonEdit> = vec![
        (|t| t["model"]["byte_fallback"] = false.into(), "model.byte_fallback"),
        (|t| t["normalizer"] = serde_json::Value::Null, "the normalizer"),
        (
            |t| {
                t["pre_tokenizer"] =
                    serde_json::json!({"type": "Metaspace", "replacement": "\u{2581}", "prepend_scheme": "first", "split": true})
            },
            "the pre-tokenizer",
        ),
        (|t| t["decoder"]["decoders"][2] = serde_json::json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}), "the decoder"),
        (|t| t["added_tokens"][5]["special"] = false.into(), "added token \"<|turn>\""),
        (|t| t["post_processor"] = serde_json::Value::Null, "without <bos>"),
    ];
    for (edit, wanted) in edits {
        let dir = TempDir::new().unwrap();
        for f in ["tokenizer_config.json", "config.json"] {
            std::fs::copy(hf.join(f), dir.path().join(f)).unwrap();
        }
        let mut t = original.clone();
        edit(&mut t);
        if wanted == "without <bos>" {
            let mut config: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(hf.join("tokenizer_config.json")).unwrap()).unwrap();
            config.as_object_mut().unwrap().remove("add_bos_token");
            std::fs::write(dir.path().join("tokenizer_config.json"), config.to_string()).unwrap();
        }
        std::fs::write(dir.path().join("tokenizer.json"), t.to_string()).unwrap();
        let e = Vocab::from_hf_dir(dir.path()).expect_err(wanted).to_string();
        assert!(e.contains(wanted) && e.contains("tokenizer.json") && e.contains("gemma4"), "{wanted:?} not in {e}");
    }
}

/// The keys dg writes and the converter does not (and why).
const DG_ONLY: [&str; 4] = [
    "diffusion-gemma.vocab_size",  // the model's vocabulary, which may exceed the tokenizer's
    "general.alignment",           // written explicitly, the default value
    "tokenizer.ggml.eot_token_id", // config.json's second end id (<turn|>)
    // transformers' default (30.0), which the fixture's config.json leaves implicit; the converter
    // writes the key only when config.json names it.
    "diffusion-gemma.final_logit_softcapping",
];
/// The converter's keys dg does not write: descriptive, or naming the converter's output type.
const CONVERTER_ONLY: [&str; 3] = ["general.name", "general.size_label", "general.file_type"];

/// dg's writer, from the fixture's HF files, writes the converter's keys with the converter's value
/// types (`head_count_kv` as INT32, ...), the same tensors in the same types (norms and scalars
/// F32, as ggml's binary ops need) and the same tokenizer.
#[test]
fn dg_writes_the_converters_keys_types_and_tensor_types() {
    let hf = fixture().join("hf");
    let model = dg_model::ModelDir::open(&hf).unwrap();
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("dg.gguf");
    let vocab = model.vocab().unwrap();
    dg_model::gguf::write_model_as_stored(&path, &model.config, Some(&model.generation), vocab.as_ref(), &model.checkpoint).unwrap();
    let ours = GgufFile::open(&path).unwrap();
    let theirs = GgufFile::open(&fixture().join("model.gguf")).unwrap();
    let types = |f: &GgufFile| -> std::collections::BTreeMap<String, String> {
        f.keys()
            .map(|k| {
                let v = f.meta(k).unwrap();
                let t = match &v {
                    MetaValue::Array(e, _) => format!("array of type {e}"),
                    other => format!("type {}", other.type_id()),
                };
                (k.to_string(), t)
            })
            .collect()
    };
    let (ours_t, theirs_t) = (types(&ours), types(&theirs));
    for (k, t) in &theirs_t {
        if CONVERTER_ONLY.contains(&k.as_str()) {
            continue;
        }
        assert_eq!(ours_t.get(k), Some(t), "{k}: dg writes {:?}, the converter {t}", ours_t.get(k));
        if !k.starts_with("general.") {
            assert_eq!(ours.meta(k), theirs.meta(k), "{k}");
        }
    }
    for k in ours_t.keys() {
        assert!(theirs_t.contains_key(k) || DG_ONLY.contains(&k.as_str()), "dg writes {k}, the converter does not");
    }
    // The converter keeps the router in F32; dg keeps it as stored, so that a BF16 checkpoint's
    // matrices stay all BF16 (what dg's exact BF16 mode checks).
    let router = |name: &str| name.ends_with("ffn_gate_inp.weight");
    let tensor_types = |f: &GgufFile| -> Vec<(String, String, Vec<usize>)> {
        let mut v: Vec<_> = f
            .tensors()
            .iter()
            .map(|t| (t.name.clone(), if router(&t.name) { "router".into() } else { t.dtype.name().to_string() }, t.dims.clone()))
            .collect();
        v.sort();
        v
    };
    assert_eq!(tensor_types(&ours), tensor_types(&theirs));
    for t in theirs.tensors().iter().filter(|t| router(&t.name)) {
        assert_eq!((t.dtype.name(), ours.tensor(&t.name).unwrap().dtype.name()), ("F32", "BF16"), "{}", t.name);
    }
}

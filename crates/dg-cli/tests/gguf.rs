//! `--model FILE.gguf`: the bundled model written as GGUF (its BF16 tensors as stored, the
//! geometry in the metadata, tokenizer and chat template beside it) generates the same tokens as
//! the model directory, on the CPU and on the GPU; `dg info` lists its tensors' types and sizes;
//! broken or missing GGUF files are input errors naming the file.

mod common;

use std::path::PathBuf;

use common::{bundled, copy_model, dg, ids};
use dg_model::ModelDir;

const INPUT: i32 = 2;

/// The bundled model as `model.gguf` in a temp dir with its tokenizer, chat template and
/// generation config, without `config.json` (the geometry comes from the GGUF metadata).
fn bundled_gguf() -> (tempfile::TempDir, PathBuf) {
    let dir = copy_model(&bundled(), &["config.json", "model.safetensors"]);
    let path = dir.path().join("model.gguf");
    let model = ModelDir::open(&bundled()).unwrap();
    dg_model::gguf::write_model_as_stored(&path, &model.config, Some(&model.generation), None, &model.checkpoint).unwrap();
    (dir, path)
}

fn generate(model: &str, backend: &str, extra: &[&str]) -> common::Run {
    let mut args = vec!["generate", "--model", model, "--prompt", "the old clock", "--backend", backend, "--json", "-q", "--seed", "5"];
    args.extend(extra);
    dg(&args)
}

#[test]
fn a_gguf_of_the_bundled_model_generates_the_same_tokens_on_the_cpu() {
    let (_dir, path) = bundled_gguf();
    let from_dir = generate(bundled().to_str().unwrap(), "cpu", &[]).ok().json();
    let from_gguf = generate(path.to_str().unwrap(), "cpu", &[]).ok().json();
    assert_eq!(from_gguf["prompt_ids"], from_dir["prompt_ids"], "the tokenizer beside the GGUF is used");
    assert!(!ids(&from_gguf["output_ids"]).is_empty());
    assert_eq!(from_gguf["output_ids"], from_dir["output_ids"]);
    assert_eq!(from_gguf["steps_per_canvas"], from_dir["steps_per_canvas"]);
    assert_eq!(from_gguf["text"], from_dir["text"]);
}

#[test]
fn a_gguf_of_the_bundled_model_generates_the_same_tokens_on_the_gpu() {
    let (_dir, path) = bundled_gguf();
    let extra = ["--max-new-tokens", "32", "--steps", "4"];
    let from_gguf = generate(path.to_str().unwrap(), "gpu", &extra);
    if from_gguf.found_no_gpu("a_gguf_of_the_bundled_model_generates_the_same_tokens_on_the_gpu") {
        return;
    }
    let from_gguf = from_gguf.ok().json();
    let from_dir = generate(bundled().to_str().unwrap(), "gpu", &extra).ok().json();
    assert_eq!(ids(&from_gguf["output_ids"]).len(), 32);
    assert_eq!(from_gguf["output_ids"], from_dir["output_ids"]);
}

#[test]
fn info_lists_the_gguf_tensors_with_types_and_sizes() {
    let (_dir, path) = bundled_gguf();
    let run = dg(&["info", "--model", path.to_str().unwrap()]).ok();
    for needle in ["checkpoint BF16 (", "(gguf ", "model.gguf", "token_embd.weight", "blk.3.ffn_gate_up_exps.weight", "parameters 342,960"]
    {
        assert!(run.stdout.contains(needle), "info lacks {needle:?}:\n{}", run.stdout);
    }
    let v = dg(&["info", "--json", "--model", path.to_str().unwrap()]).ok().json();
    let c = &v["checkpoint"];
    assert_eq!(c["format"], "gguf");
    let tensors = c["tensors"].as_array().unwrap();
    let embed = tensors.iter().find(|t| t["gguf_name"] == "token_embd.weight").unwrap();
    assert_eq!((embed["dtype"].as_str(), embed["bytes"].as_u64()), (Some("BF16"), Some(986 * 64 * 2)));
    let total: u64 = tensors.iter().map(|t| t["bytes"].as_u64().unwrap()).sum();
    assert_eq!(c["text_bytes"], total);
}

#[test]
fn missing_and_broken_gguf_files_are_input_errors_naming_the_file() {
    dg(&["info", "--model", "/nonexistent/dg.gguf"]).fails(INPUT, &["GGUF file /nonexistent/dg.gguf does not exist"]);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("broken.gguf");
    std::fs::write(&path, b"GGUF\x03\x00\x00\x00 not really").unwrap();
    let shown = path.to_str().unwrap();
    dg(&["generate", "--model", shown, "--prompt", "hi"]).fails(INPUT, &["cannot open GGUF model", shown, "truncated"]);
}

/// A GGUF written by llama.cpp's converter (`fixtures/converter-gemma4-vocab`), alone in a
/// directory: `--chat --prompt` text is tokenized with the file's vocabulary and wrapped in the
/// file's chat template, exactly as the HF files it was converted from give (the fixture's
/// `chat.jsonl`, `hf_tokens.jsonl`).
#[test]
fn a_converter_gguf_generates_from_a_chat_prompt_with_nothing_beside_it() {
    let fixture = common::fixture("converter-gemma4-vocab");
    let dir = tempfile::TempDir::new().unwrap();
    let path = dir.path().join("alone.gguf");
    std::fs::copy(fixture.join("model.gguf"), &path).unwrap();
    let run = dg(&["generate", "--model", path.to_str().unwrap(), "--chat", "--prompt", "hello", "--backend", "cpu", "--json", "-q"]);
    let out = run.ok().json();
    let chat: serde_json::Value =
        serde_json::from_str(std::fs::read_to_string(fixture.join("chat.jsonl")).unwrap().lines().next().unwrap()).unwrap();
    assert_eq!(chat["messages"][0]["content"], "hello");
    let corpus = std::fs::read_to_string(fixture.join("corpus.jsonl")).unwrap();
    let line = corpus.lines().position(|l| serde_json::from_str::<serde_json::Value>(l).unwrap() == chat["text"]).unwrap();
    let hf: serde_json::Value =
        serde_json::from_str(std::fs::read_to_string(fixture.join("hf_tokens.jsonl")).unwrap().lines().nth(line).unwrap()).unwrap();
    // The template writes <bos> itself: the prompt is HF's ids without the post-processor's.
    assert_eq!(ids(&out["prompt_ids"]), ids(&hf["ids"])[1..]);
    assert!(!ids(&out["output_ids"]).is_empty());
    dg(&["generate", "--model", path.to_str().unwrap(), "--prompt", "hello", "--backend", "cpu", "-q", "--max-new-tokens", "8"]).ok();
}

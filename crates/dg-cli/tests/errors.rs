//! Every error of `dg generate` / `dg info` that a user can cause: its exit status (2 for usage and
//! input errors, 1 for runtime failures) and a message that says what is wrong.

mod common;

use common::{bundled, command, copy_model, dg, dg_without_gpu, fixture, run_cmd};

const INPUT: i32 = 2;
const RUNTIME: i32 = 1;

#[test]
fn missing_model_directory() {
    dg(&["generate", "--model", "/nonexistent/dg-model", "--prompt", "hi"])
        .fails(INPUT, &["model directory /nonexistent/dg-model does not exist"]);
    dg(&["info", "--model", "/nonexistent/dg-model"]).fails(INPUT, &["does not exist"]);
}

#[test]
fn incomplete_model_directories() {
    let empty = tempfile::tempdir().unwrap();
    let path = empty.path().to_str().unwrap();
    dg(&["generate", "--model", path, "--prompt", "hi"]).fails(INPUT, &["incomplete", "config.json is missing"]);

    let no_weights = copy_model(&bundled(), &["model.safetensors"]);
    let path = no_weights.path().to_str().unwrap();
    dg(&["generate", "--model", path, "--prompt", "hi"]).fails(INPUT, &["incomplete", "model.safetensors"]);

    let truncated = copy_model(&bundled(), &[]);
    let weights = truncated.path().join("model.safetensors");
    let bytes = std::fs::read(&weights).unwrap();
    std::fs::write(&weights, &bytes[..bytes.len() / 2]).unwrap();
    let path = truncated.path().to_str().unwrap();
    dg(&["generate", "--model", path, "--prompt", "hi", "--backend", "cpu"])
        .fails(INPUT, &["cannot open model directory", "model.safetensors"]);

    let bad_config = copy_model(&bundled(), &[]);
    std::fs::write(bad_config.path().join("config.json"), "{\"model_type\": \"llama\"}").unwrap();
    let path = bad_config.path().to_str().unwrap();
    dg(&["info", "--model", path]).fails(INPUT, &["unsupported model_type \"llama\""]);
}

/// A BF16 weight past f16's range (1e6) cannot be stored as F16: `--weights f16` names the tensor
/// and the formats that hold it; BF16 still loads.
#[test]
fn a_weight_past_f16_range_refuses_f16_storage() {
    let big = copy_model(&bundled(), &[]);
    let weights = big.path().join("model.safetensors");
    let mut bytes = std::fs::read(&weights).unwrap();
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + header_len]).unwrap();
    let name = "model.decoder.layers.1.experts.down_proj";
    assert_eq!(header[name]["dtype"], "BF16", "the bundled model's {name}");
    let at = 8 + header_len + header[name]["data_offsets"][0].as_u64().unwrap() as usize;
    bytes[at..at + 2].copy_from_slice(&0x4974u16.to_le_bytes()); // BF16 1.0e6
    std::fs::write(&weights, bytes).unwrap();
    let path = big.path().to_str().unwrap();
    let f16 = dg(&["generate", "--model", path, "--prompt", "hi", "--backend", "gpu", "--weights", "f16", "-q"]);
    if f16.found_no_gpu("a_weight_past_f16_range_refuses_f16_storage") {
        return;
    }
    f16.fails(INPUT, &[name, "beyond ±65504", "--weights bf16"]);
    let bf16 = dg(&["generate", "--model", path, "--prompt", "hi", "--backend", "gpu", "--weights", "bf16", "-q", "--max-new-tokens", "8"]);
    bf16.ok();
}

#[test]
fn text_prompt_without_a_tokenizer() {
    let dir = fixture("sliding-long-prompt");
    dg(&["generate", "--model", dir.to_str().unwrap(), "--prompt", "hello", "--backend", "cpu"])
        .fails(INPUT, &["has no tokenizer.json", "--prompt-ids"]);
}

#[test]
fn token_id_out_of_range() {
    let dir = fixture("sliding-long-prompt");
    dg(&["generate", "--model", dir.to_str().unwrap(), "--prompt-ids", "2,320", "--backend", "cpu"])
        .fails(INPUT, &["token id 320 at position 1 is out of range", "320 ids"]);
    dg(&["generate", "--prompt-ids", "2,x", "--backend", "cpu"]).fails(INPUT, &["\"x\" is not a token id"]);
}

#[test]
fn prompt_longer_than_the_positions() {
    // The bundled model has max_position_embeddings 4096 and canvases of 32.
    dg(&["generate", "--prompt", "hi", "--max-new-tokens", "5000", "--backend", "cpu"])
        .fails(INPUT, &["the prompt is too long", "max_position_embeddings 4096"]);
    let long = vec!["7"; 4070].join(",");
    dg(&["generate", "--prompt-ids", &long, "--max-new-tokens", "32", "--backend", "cpu"])
        .fails(INPUT, &["4070 prompt tokens + 1 canvas(es) of 32 tokens need 4102 positions"]);
}

#[test]
fn no_adapter_for_the_gpu_backend() {
    dg_without_gpu(&["generate", "--prompt", "hi", "--backend", "gpu"])
        .fails(RUNTIME, &["no GPU adapter found", "apt-get install -y mesa-vulkan-drivers libvulkan1"]);
}

#[test]
fn unknown_adapter_name() {
    let run = dg(&["generate", "--prompt", "hi", "--backend", "gpu", "--adapter", "no-such-adapter-xyz"]);
    if run.stderr.contains("no GPU adapter found") {
        // Without any adapter the name cannot be checked; the runtime error is the right one.
        run.fails(RUNTIME, &["apt-get install"]);
    } else {
        run.fails(INPUT, &["no adapter matches \"no-such-adapter-xyz\""]);
    }
    dg(&["generate", "--prompt", "hi", "--backend", "cpu", "--adapter", "x"]).fails(INPUT, &["--backend cpu"]);
}

#[test]
fn bad_tuning_variables() {
    let mut cmd = command(&["generate", "--prompt", "hi", "--backend", "cpu"]);
    cmd.env("DG_KV_CACHE", "bf16");
    run_cmd(cmd, "").fails(INPUT, &["DG_KV_CACHE=\"bf16\" is not a valid value", "auto, f32 or f16"]);
    let mut cmd = command(&["generate", "--prompt", "hi"]);
    cmd.env("DG_KV_CACHES", "f16");
    run_cmd(cmd, "").fails(INPUT, &["unknown variable DG_KV_CACHES", "DG_KV_CACHE,"]);
    // The lab's variables are refused by dg, saying whose they are.
    let mut cmd = command(&["generate", "--prompt", "hi", "--backend", "cpu"]);
    cmd.env("DG_COOP_PATH", "direct");
    run_cmd(cmd, "").fails(INPUT, &["DG_COOP_PATH", "lab override"]);
    let mut cmd = command(&["generate", "--prompt-ids", "2,17", "--max-new-tokens", "4", "--steps", "2", "--backend", "cpu"]);
    cmd.env("DG_KV_CACHE", "f32").env("DG_ALLOW_NO_GPU", "1");
    let run = run_cmd(cmd, "");
    assert_eq!(run.code, 0, "valid variables are accepted: {}", run.stderr);
}

#[test]
fn chat_without_a_template() {
    let dir = copy_model(&bundled(), &["chat_template.jinja"]);
    dg(&["generate", "--model", dir.path().to_str().unwrap(), "--chat", "--prompt", "hi", "--backend", "cpu"])
        .fails(INPUT, &["--chat needs a chat template"]);
}

#[test]
fn bad_prompts_and_settings() {
    dg(&["generate", "--prompt", "", "--backend", "cpu"]).fails(INPUT, &["the prompt is empty"]);
    dg(&["generate", "--backend", "cpu"]).fails(INPUT, &["the prompt is empty"]);
    dg(&["generate", "--prompt-file", "/nonexistent/prompt.txt"]).fails(INPUT, &["cannot read the prompt file"]);
    dg(&["generate", "--prompt", "hi", "--t-min", "0.9", "--t-max", "0.5", "--backend", "cpu"]).fails(INPUT, &["t_min < t_max"]);
    dg(&["generate", "--prompt", "hi", "--steps", "0", "--backend", "cpu"]).fails(INPUT, &["max_denoising_steps"]);
    dg(&["generate", "--prompt", "hi", "--entropy-bound=-1", "--backend", "cpu"]).fails(INPUT, &["entropy_bound"]);
}

#[test]
fn usage_errors_exit_with_2() {
    for args in [
        &["generate", "--prompt", "a", "--prompt-ids", "1"][..],
        &["generate", "--chat", "--prompt-ids", "1"],
        &["generate", "--steps", "many"],
        &["generate", "--backend", "tpu"],
        &["nonsense"],
    ] {
        let run = dg(args);
        assert_eq!(run.code, INPUT, "{args:?}: {}", run.stderr);
        assert!(run.stderr.contains("error"), "{args:?}: {}", run.stderr);
    }
}

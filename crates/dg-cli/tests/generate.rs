//! `dg generate` success paths: the bundled model with a text prompt, the chat template, stdin and
//! prompt files, the JSON report, option overrides, and both backends.

mod common;

use common::{dg, dg_stdin, dg_without_gpu, ids};

/// The README's first command: default backend, bundled model, text on stdout.
#[test]
fn text_prompt_prints_text_from_the_bundled_model() {
    let run = dg(&["generate", "--prompt", "hello"]).ok();
    assert!(!run.stdout.trim().is_empty(), "no text on stdout; stderr: {}", run.stderr);
    assert!(!run.stdout.contains('\x1b') && !run.stderr.contains('\x1b'), "ANSI codes without a terminal");
    assert!(
        run.stderr.contains("backend: gpu: ") || run.stderr.contains("backend: cpu ("),
        "the backend choice is not printed: {}",
        run.stderr
    );
    assert!(run.stderr.contains("its text is noise"), "{}", run.stderr);
    for needle in ["summary: prefill", "steps per canvas [", "tokens/forward", "tokens/s"] {
        assert!(run.stderr.contains(needle), "stderr lacks {needle:?}: {}", run.stderr);
    }
}

#[test]
fn without_an_adapter_the_default_backend_is_the_cpu() {
    let run = dg_without_gpu(&["generate", "--prompt", "hello", "--json"]).ok();
    assert!(run.stderr.contains("backend: cpu (no GPU adapter found)"), "{}", run.stderr);
    assert_eq!(run.json()["backend"], "cpu");
}

#[test]
fn text_is_tokenized_like_the_python_tokenizer() {
    // Ids from the Python `tokenizers` library that trained the bundled tokenizer (with <bos>); no
    // prefix space (Gemma 4's layout), so the first word is "H" "ello," rather than "▁Hello,".
    let run = dg(&["generate", "--prompt", "Hello, how are you?", "--backend", "cpu", "--json", "-q"]).ok();
    let v = run.json();
    assert_eq!(ids(&v["prompt_ids"]), vec![2, 48, 737, 373, 254, 253, 39]);
    assert_eq!(v["prompt_text"], "Hello, how are you?");
    assert_eq!(run.stderr, "", "--quiet prints nothing on stderr");
}

#[test]
fn chat_applies_the_template_like_transformers() {
    let v = dg(&["generate", "--chat", "--prompt", "hello", "--backend", "cpu", "--json", "-q"]).ok().json();
    // transformers' apply_chat_template(..., add_generation_prompt=True) on the bundled model.
    assert_eq!(v["prompt_text"], "<bos><|turn>user\nhello<turn|>\n<|turn>model\n");
    assert_eq!(ids(&v["prompt_ids"]), vec![2, 5, 93, 91, 115, 7, 106, 132, 87, 6, 7, 5, 85, 87, 76, 233, 7]);
}

#[test]
fn stdin_and_prompt_files_give_the_same_run_as_prompt() {
    let base = ["generate", "--backend", "cpu", "--json", "-q", "--seed", "5"];
    let with = |extra: &[&str], stdin: &str| {
        let args: Vec<&str> = base.iter().chain(extra).copied().collect();
        dg_stdin(&args, stdin).ok().json()
    };
    let direct = with(&["--prompt", "the old clock"], "");
    let piped = with(&[], "the old clock\n");
    let dash = with(&["--prompt-file", "-"], "the old clock\n");
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), "the old clock\n").unwrap();
    let from_file = with(&["--prompt-file", file.path().to_str().unwrap()], "");
    for other in [&piped, &dash, &from_file] {
        assert_eq!(other["prompt_ids"], direct["prompt_ids"]);
        assert_eq!(other["output_ids"], direct["output_ids"]);
        assert_eq!(other["text"], direct["text"]);
    }
}

#[test]
fn json_report_has_ids_text_steps_and_timings() {
    let run =
        dg(&["generate", "--prompt", "hello", "--backend", "cpu", "--json", "--steps", "3", "--max-new-tokens", "40", "--seed", "11"]).ok();
    let v = run.json();
    assert_eq!(v["backend"], "cpu");
    assert!(v["adapter"].is_null());
    assert_eq!(v["seed"], 11);
    assert!(v["model"].as_str().unwrap().ends_with("tiny-random"));
    let canvases = v["canvases"].as_array().unwrap();
    let steps = ids(&v["steps_per_canvas"]);
    let output = ids(&v["output_ids"]);
    assert!(!canvases.is_empty() && canvases.len() <= 2, "40 new tokens are 2 canvases of 32 at most");
    assert_eq!(steps.len(), canvases.len());
    assert_eq!(output.len(), 32 * canvases.len(), "whole canvases");
    for (c, &s) in canvases.iter().zip(&steps) {
        assert!((1..=3).contains(&s), "--steps 3 bounds every canvas");
        assert_eq!(c["steps"], s);
        assert_eq!(c["accepted"].as_array().unwrap().len(), s as usize);
        assert_eq!(c["mean_entropy"].as_array().unwrap().len(), s as usize);
        assert!(c["stopped_early"].is_boolean());
    }
    assert_eq!(v["decoder_passes"], steps.iter().sum::<u32>());
    assert!(v["tokens_per_forward"].as_f64().unwrap() > 0.0);
    assert!(v["valid_tokens"].as_u64().unwrap() <= output.len() as u64);
    assert!(v["text"].is_string());
    assert!(["eos", "all_canvases"].contains(&v["stop_reason"].as_str().unwrap()));
    let g = &v["generation"];
    assert_eq!(g["max_denoising_steps"], 3);
    assert_eq!(g["max_new_tokens"], 40);
    assert_eq!(ids(&g["eos_token_ids"]), vec![1, 6], "the bundled generation_config.json");
    for key in ["load_s", "prefill_s", "commit_encode_s", "forward_s", "generate_s", "total_s", "tokens_per_second"] {
        assert!(v["timings"][key].as_f64().is_some_and(|t| t >= 0.0), "timings.{key}: {}", v["timings"]);
    }
    // Plain stdout is the JSON object alone.
    assert!(run.stdout.trim_start().starts_with('{') && run.stdout.trim_end().ends_with('}'));
}

#[test]
fn sampler_options_override_the_generation_config() {
    let base = ["generate", "--prompt", "hello", "--backend", "cpu", "--json", "-q"];
    let run = |extra: &[&str]| {
        let args: Vec<&str> = base.iter().chain(extra).copied().collect();
        dg(&args).ok().json()
    };
    let v = run(&[
        "--entropy-bound",
        "0.5",
        "--t-min",
        "0.2",
        "--t-max",
        "0.9",
        "--stability-threshold",
        "0",
        "--confidence-threshold",
        "0.01",
    ]);
    let g = &v["generation"];
    assert_eq!(g["entropy_bound"], 0.5);
    assert_eq!(g["t_min"], 0.2);
    assert_eq!(g["t_max"], 0.9);
    assert_eq!(g["stability_threshold"], 0);
    assert!((g["confidence_threshold"].as_f64().unwrap() - 0.01).abs() < 1e-6);
    // Same seed, same tokens; another seed, other tokens.
    let a = run(&["--seed", "1"]);
    assert_eq!(a["output_ids"], run(&["--seed", "1"])["output_ids"]);
    assert_ne!(a["output_ids"], run(&["--seed", "2"])["output_ids"]);
}

#[test]
fn gpu_backend_generates() {
    let run = dg(&["generate", "--prompt", "hello", "--backend", "gpu", "--json", "--max-new-tokens", "32", "--steps", "4"]);
    if run.found_no_gpu("gpu_backend_generates") {
        return;
    }
    let v = run.ok().json();
    assert_eq!(v["backend"], "gpu");
    assert!(!v["adapter"].as_str().unwrap().is_empty());
    assert_eq!(ids(&v["output_ids"]).len(), 32);
    assert!(v["text"].is_string());
}

/// The bundled model's checkpoint is BF16: the GPU keeps its matrices as BF16 (2 bytes per
/// parameter; the f32 norms add a fraction of a percent) unless `--weights f32` asks otherwise.
#[test]
fn gpu_backend_reports_bf16_weights_for_a_bf16_checkpoint() {
    let args = |w: &'static str| {
        vec!["generate", "--prompt", "hello", "--backend", "gpu", "--max-new-tokens", "32", "--steps", "2", "--weights", w]
    };
    let run = dg(&args("auto"));
    if run.found_no_gpu("gpu_backend_reports_bf16_weights_for_a_bf16_checkpoint") {
        return;
    }
    let run = run.ok();
    assert!(run.stderr.contains("bf16 (2.0"), "{}", run.stderr);
    let run = dg(&args("f32")).ok();
    assert!(run.stderr.contains("f32 (4.00 bytes per parameter)"), "{}", run.stderr);
}

//! `dg generate --prompts-file`: one JSON line per prompt, in input order, each equal to
//! `dg generate --prompt LINE --seed S --json` run alone (the bundled model on the CPU, batched);
//! bad files and conflicting options are input errors naming the file and line.

mod common;

use common::dg;
use serde_json::Value;

/// A prompts file in a fresh temporary directory.
fn prompts(bytes: &[u8]) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("prompts.txt");
    std::fs::write(&path, bytes).unwrap();
    (dir, path.to_str().unwrap().to_string())
}

/// `--json`'s object without what differs between a batched and a lone run.
fn comparable(mut v: Value) -> Value {
    let map = v.as_object_mut().expect("a JSON object");
    for key in ["timings", "line", "prompt"] {
        map.remove(key);
    }
    v
}

/// Runs the file through `dg generate --prompts-file` with `extra` options (and `batch`), then
/// every line alone with `extra`.
fn check_against_lone_runs(lines: &[&str], batch: &[&str], extra: &[&str], seed: u64) -> Vec<Value> {
    let run = run_file(lines, "cpu", batch, extra, seed).ok();
    compare_with_lone_runs(&run, lines, "cpu", extra, seed)
}

/// `dg generate --prompts-file` on the lines, on `backend`.
fn run_file(lines: &[&str], backend: &str, batch: &[&str], extra: &[&str], seed: u64) -> common::Run {
    let (_dir, path) = prompts(format!("{}\n", lines.join("\n")).as_bytes());
    let seed_arg = seed.to_string();
    let mut args = vec!["generate", "--prompts-file", &path, "--backend", backend, "--seed", &seed_arg];
    args.extend_from_slice(batch);
    args.extend_from_slice(extra);
    dg(&args)
}

/// Each JSON line of `run` against `dg generate --prompt LINE --seed S --json` alone.
fn compare_with_lone_runs(run: &common::Run, lines: &[&str], backend: &str, extra: &[&str], seed: u64) -> Vec<Value> {
    let out: Vec<Value> = run.stdout.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"))).collect();
    assert_eq!(out.len(), lines.len(), "one JSON line per prompt:\n{}", run.stdout);
    for (i, (line, got)) in lines.iter().zip(&out).enumerate() {
        assert_eq!(got["line"], i + 1, "input order");
        assert_eq!(got["prompt"], *line);
        let seed = (seed + i as u64).to_string();
        assert_eq!(got["seed"].to_string(), seed, "line {}: the seed is --seed + the line index", i + 1);
        let mut alone = vec!["generate", "--prompt", line, "--backend", backend, "--seed", &seed, "--json", "-q"];
        alone.extend_from_slice(extra);
        let want = dg(&alone).ok().json();
        assert_eq!(comparable(got.clone()), comparable(want), "line {} batched and alone", i + 1);
    }
    out
}

#[test]
fn each_line_equals_its_prompt_generated_alone() {
    let lines = [
        "hello",
        "Why is the sky blue? Tell me in a few words, please.",
        "a",
        "the quick brown fox jumps over the lazy dog again and again",
    ];
    // Two at a time: the third and fourth lines start when a slot frees; early stopping makes the
    // sequences' canvases take different steps (the second line leaves first), the last ends on EOS
    // (seed 16 on the bundled model; the seed picks which lines stop where).
    let settings = ["--max-new-tokens", "100", "--steps", "12", "--confidence-threshold", "1.2", "--stability-threshold", "0"];
    let out = check_against_lone_runs(&lines, &["--batch", "2"], &settings, 16);
    let lengths: Vec<usize> = out.iter().map(|v| v["prompt_ids"].as_array().unwrap().len()).collect();
    assert!(lengths.windows(2).all(|w| w[0] != w[1]), "different prompt lengths: {lengths:?}");
    let steps: Vec<&Value> = out.iter().map(|v| &v["steps_per_canvas"]).collect();
    assert!(steps.windows(2).all(|w| w[0] != w[1]), "different stopping steps: {steps:?}");
    assert_eq!(out[3]["stop_reason"], "eos");
}

#[test]
fn chat_lines_equal_their_prompts_generated_alone() {
    let out = check_against_lone_runs(&["hello", "What is 2 + 2?"], &[], &["--chat", "--max-new-tokens", "20"], 11);
    assert!(out[0]["prompt_text"].as_str().unwrap().contains("<|turn>user\nhello"), "{}", out[0]["prompt_text"]);
}

/// On the GPU a batch's canvases run as one forward a step (here two at a time, the third line
/// taking the place of the first to end); each line still equals its lone run.
#[test]
fn gpu_lines_equal_their_prompts_generated_alone() {
    let lines = ["hello", "Why is the sky blue?", "A third line, longer than the others by a few words."];
    let extra = ["--max-new-tokens", "32", "--steps", "4"];
    let run = run_file(&lines, "gpu", &["--batch", "2"], &extra, 5);
    if run.found_no_gpu("gpu_lines_equal_their_prompts_generated_alone") {
        return;
    }
    let out = compare_with_lone_runs(&run.ok(), &lines, "gpu", &extra, 5);
    assert_eq!(out[0]["backend"], "gpu");
}

#[test]
fn bad_files_name_the_file_and_line() {
    let (_d, empty) = prompts(b"");
    dg(&["generate", "--prompts-file", &empty, "--backend", "cpu"]).fails(2, &["prompts.txt is empty"]);
    let (_d, blank) = prompts(b"hello\n\nworld\n");
    dg(&["generate", "--prompts-file", &blank, "--backend", "cpu"]).fails(2, &["prompts.txt line 2: the line is empty"]);
    let (_d, binary) = prompts(b"hello\nw\xc3orld\n");
    dg(&["generate", "--prompts-file", &binary, "--backend", "cpu"]).fails(2, &["prompts.txt line 2: not valid UTF-8"]);
    dg(&["generate", "--prompts-file", "/nonexistent/dg/prompts.txt", "--backend", "cpu"])
        .fails(2, &["cannot read the prompts file /nonexistent/dg/prompts.txt"]);
    // A line too long for the model's positions.
    let long = "word ".repeat(3000);
    let (_d, too_long) = prompts(format!("hello\n{long}\n").as_bytes());
    dg(&["generate", "--prompts-file", &too_long, "--backend", "cpu"]).fails(2, &["prompts.txt line 2", "the prompt is too long"]);
}

#[test]
fn conflicting_options_are_usage_errors() {
    let (_d, path) = prompts(b"hello\n");
    for other in [&["--prompt", "x"][..], &["--prompt-file", "x.txt"], &["--prompt-ids", "2,3"]] {
        let mut args = vec!["generate", "--prompts-file", &path];
        args.extend_from_slice(other);
        dg(&args).fails(2, &["cannot be used with"]);
    }
    dg(&["generate", "--prompts-file", &path, "--batch", "0"]).fails(2, &["--batch"]);
    dg(&["generate", "--prompt", "x", "--batch", "2"]).fails(2, &["--prompts-file"]);
}

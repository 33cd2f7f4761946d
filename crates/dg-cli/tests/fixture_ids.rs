//! `dg generate --prompt-ids` on a reference fixture (no tokenizer): its tokens equal those of the
//! CPU sampler (`dg_sampler::generate` with `SeededRng::new(seed)` on `CpuModel`) for the same seed
//! and settings.

mod common;

use common::{dg, fixture, ids};
use dg_cpu::CpuModel;
use dg_model::{ModelDir, RawGenerationConfig};
use dg_sampler::{NoHooks, SeededRng};

const PROMPT: [u32; 21] = [2, 17, 42, 99, 5, 250, 31, 64, 77, 1, 300, 12, 8, 160, 19, 2, 44, 201, 90, 3, 55];

/// The tokens the library gives for `seed`, 40 new tokens and 12 steps.
fn library_tokens(seed: u64) -> (Vec<u32>, Vec<usize>) {
    let dir = ModelDir::open(&fixture("sliding-long-prompt")).unwrap();
    let over = RawGenerationConfig { max_new_tokens: Some(40), max_denoising_steps: Some(12), ..Default::default() };
    let cfg = dir.generation.clone().overridden_by(over).resolve(&dir.config, dir.dir.as_path()).unwrap();
    let mut model = CpuModel::new(dir.config.clone(), dir.load_weights().unwrap());
    let (c, v) = (dir.config.canvas_length, dir.config.text.vocab_size);
    let g = dg_sampler::generate(&mut model, &PROMPT, &cfg, c, v, &mut SeededRng::new(seed), &mut NoHooks).unwrap();
    (g.new_tokens().to_vec(), g.steps_per_canvas)
}

fn prompt_arg() -> String {
    PROMPT.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

#[test]
fn prompt_ids_on_a_fixture_equal_the_cpu_sampler() {
    let dir = fixture("sliding-long-prompt");
    let prompt = prompt_arg();
    for seed in [0u64, 7] {
        let seed_arg = seed.to_string();
        let args = [
            "generate",
            "--model",
            dir.to_str().unwrap(),
            "--prompt-ids",
            &prompt,
            "--backend",
            "cpu",
            "--seed",
            &seed_arg,
            "--max-new-tokens",
            "40",
            "--steps",
            "12",
            "--json",
        ];
        let v = dg(&args).ok().json();
        let (tokens, steps) = library_tokens(seed);
        assert_eq!(ids(&v["prompt_ids"]), PROMPT.to_vec());
        assert_eq!(ids(&v["output_ids"]), tokens, "seed {seed}");
        assert_eq!(v["steps_per_canvas"], serde_json::json!(steps));
        assert!(v["text"].is_null(), "no tokenizer, no text");
        assert!(v["prompt_text"].is_null());
    }
}

#[test]
fn without_json_the_output_ids_go_to_stdout() {
    let dir = fixture("sliding-long-prompt");
    let prompt = prompt_arg();
    let run = dg(&[
        "generate",
        "--model",
        dir.to_str().unwrap(),
        "--prompt-ids",
        &prompt,
        "--backend",
        "cpu",
        "--seed",
        "7",
        "--max-new-tokens",
        "40",
        "--steps",
        "12",
    ])
    .ok();
    let printed: Vec<u32> = run.stdout.split_whitespace().map(|s| s.parse().unwrap()).collect();
    assert_eq!(printed, library_tokens(7).0);
    assert!(run.stderr.contains("backend: cpu"), "{}", run.stderr);
}

#[test]
fn bracketed_and_spaced_id_lists_are_accepted() {
    let dir = fixture("sliding-long-prompt");
    let spaced = PROMPT.iter().map(u32::to_string).collect::<Vec<_>>().join(" ");
    let bracketed = format!("[{}]", PROMPT.iter().map(u32::to_string).collect::<Vec<_>>().join(", "));
    for list in [spaced, bracketed] {
        let args = [
            "generate",
            "--model",
            dir.to_str().unwrap(),
            "--prompt-ids",
            &list,
            "--backend",
            "cpu",
            "--max-new-tokens",
            "16",
            "--steps",
            "2",
            "--json",
            "-q",
        ];
        assert_eq!(ids(&dg(&args).ok().json()["prompt_ids"]), PROMPT.to_vec());
    }
}

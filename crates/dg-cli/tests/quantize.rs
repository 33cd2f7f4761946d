//! `dg quantize` and `--weights q8_0|q4_k_m`: the bundled model quantized into a GGUF (ggml blocks
//! as the scheme says, the model's other files copied beside it) generates exactly what the same
//! scheme applied at load generates, on the CPU; bad options are input errors.

mod common;

use common::{dg, ids};
use dg_model::{ModelDir, StoredDtype};

const INPUT: i32 = 2;

fn generate(args: &[&str]) -> serde_json::Value {
    let mut all =
        vec!["generate", "--prompt", "the old clock", "--backend", "cpu", "--json", "-q", "--seed", "5", "--max-new-tokens", "32"];
    all.extend(args);
    dg(&all).ok().json()
}

#[test]
fn a_quantized_gguf_generates_what_quantizing_at_load_generates() {
    for scheme in ["q8_0", "q4_k_m"] {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join(format!("tiny-{scheme}.gguf"));
        dg(&["quantize", "--scheme", scheme, "--out", out.to_str().unwrap(), "-q"]).ok();
        for copied in ["tokenizer.json", "generation_config.json", "config.json"] {
            assert!(dir.path().join(copied).is_file(), "{scheme}: {copied} copied beside the GGUF");
        }
        let model = ModelDir::open(&out).unwrap();
        let (name, shape) = dg_model::tensor_manifest(&model.config.text)
            .into_iter()
            .find(|(n, _)| n.ends_with("layers.0.self_attn.q_proj.weight"))
            .unwrap();
        assert_eq!(model.checkpoint.stored(&name, &shape).unwrap().dtype, StoredDtype::Q8_0, "{scheme}: {name}");
        let from_gguf = generate(&["--model", out.to_str().unwrap()]);
        let at_load = generate(&["--weights", scheme]);
        assert_eq!(ids(&from_gguf["output_ids"]).len(), 32);
        assert_eq!(from_gguf["output_ids"], at_load["output_ids"], "{scheme}");
        assert_eq!(from_gguf["steps_per_canvas"], at_load["steps_per_canvas"], "{scheme}");
    }
}

#[test]
fn bad_quantize_options_are_input_errors() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x.bin");
    dg(&["quantize", "--scheme", "q8_0", "--out", out.to_str().unwrap()]).fails(INPUT, &["x.bin", ".gguf"]);
    dg(&["quantize", "--scheme", "q3_k", "--out", "x.gguf"]).fails(INPUT, &["q3_k"]);
    dg(&["quantize", "--scheme", "q8_0", "--model", "/nonexistent-dir", "--out", "x.gguf"]).fails(INPUT, &["nonexistent-dir"]);
}

/// A GGUF whose embedding (and tied head) is quantized, as released GGUFs store it: the GPU
/// dequantizes it into its lookup format and generates the CPU's tokens.
#[test]
fn a_gguf_with_a_quantized_embedding_runs_on_the_gpu_as_on_the_cpu() {
    let model = ModelDir::open(&common::bundled()).unwrap();
    let dir = common::copy_model(&common::bundled(), &["model.safetensors"]);
    let path = dir.path().join("model.gguf");
    let embed = dg_model::SharedNames::new(&model.config.text).embed.name;
    let dtype = |hf: &str, stored| if hf == embed { StoredDtype::Q8_0 } else { stored };
    dg_model::gguf::write_model(&path, &model.config, Some(&model.generation), None, &model.checkpoint, &dtype, &mut |hf, t, want| {
        Ok(dg_model::quantize_tensor(t, want, hf)?.bytes().to_vec())
    })
    .unwrap();
    let gguf = ModelDir::open(&path).unwrap();
    let shape = [model.config.text.vocab_size, model.config.text.hidden_size];
    assert_eq!(gguf.checkpoint.stored(&embed, &shape).unwrap().dtype, StoredDtype::Q8_0);
    let run = |backend: &str| {
        let mut args = vec!["generate", "--model", path.to_str().unwrap(), "--prompt", "the old clock", "--json", "-q", "--seed", "5"];
        args.extend(["--max-new-tokens", "32", "--steps", "4", "--backend", backend]);
        dg(&args)
    };
    let gpu = run("gpu");
    if gpu.found_no_gpu("a_gguf_with_a_quantized_embedding_runs_on_the_gpu_as_on_the_cpu") {
        return;
    }
    let (gpu, cpu) = (gpu.ok().json(), run("cpu").ok().json());
    assert_eq!(ids(&gpu["output_ids"]).len(), 32);
    assert_eq!(gpu["output_ids"], cpu["output_ids"]);
}

//! `dg quantize` and `--weights q8_0|q4_k_m`: the bundled model quantized into a GGUF (ggml blocks
//! as the scheme says, the model's other files copied beside it) generates exactly what the same
//! scheme applied at load generates, on the CPU; the schemes for small GPUs (`q2_k`, `q3_k_m`,
//! `iq4_xs`) write the types they name and generate on the CPU; bad options are input errors.

mod common;

use common::{dg, ids};
use dg_model::{ModelDir, Scheme, StoredDtype};

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

/// The schemes for small GPUs on the bundled model: every matrix in the type the scheme gives it,
/// every 1-D tensor F32.
/// At hidden 64 and expert width 32 no row is a whole 256-value super-block, so the experts take
/// llama.cpp's fallbacks (Q2_K, Q3_K → Q4_0; Q4_K → Q5_0; IQ4_XS → IQ4_NL); the K-quant and IQ4_XS
/// blocks themselves are the fixtures' (`fixtures/gguf-q2_k`, `gguf-iq`). Each file generates on
/// the CPU backend.
#[test]
fn the_small_gpu_schemes_write_their_types_and_generate_on_the_cpu() {
    use StoredDtype::*;
    for (scheme, types) in [
        (Scheme::Q2K, &[F32, BF16, Q4_0, Q8_0][..]),
        (Scheme::Q3KM, &[F32, BF16, Q4_0, Q5_0, Q8_0]),
        (Scheme::IQ4XS, &[F32, BF16, IQ4_NL, Q8_0]),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join(format!("tiny-{}.gguf", scheme.name()));
        dg(&["quantize", "--scheme", scheme.name(), "--out", out.to_str().unwrap(), "-q"]).ok();
        let model = ModelDir::open(&out).unwrap();
        let file = model.checkpoint.gguf().unwrap();
        let mut seen = std::collections::BTreeSet::new();
        for (hf, shape) in dg_model::tensor_manifest(&model.config.text) {
            let t = file.find_hf(&hf).unwrap();
            // Norms and other 1-D tensors are written F32, as llama.cpp's converter writes them.
            let want = if shape.len() < 2 { F32 } else { scheme.dtype_of(&model.config.text, &hf).unwrap_or(BF16) };
            assert_eq!(t.dtype, want, "{}: {hf}", scheme.name());
            assert_eq!(t.shape(), shape, "{}: {hf}", scheme.name());
            seen.insert(t.dtype.name());
        }
        assert_eq!(seen, types.iter().map(|d| d.name()).collect(), "{}", scheme.name());
        let run = generate(&["--model", out.to_str().unwrap()]);
        assert_eq!(ids(&run["output_ids"]).len(), 32, "{}", scheme.name());
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

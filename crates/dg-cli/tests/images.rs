//! `dg generate --image`: the prompt transformers' processor makes (chat template and placeholder
//! expansion, fixtures/vision-generate), an image that changes the output, and every bad image or
//! option an input error naming what is wrong.

mod common;

use common::{bundled, dg, fixture, ids};
use dg_model::SafetensorsFile;

const INPUT: i32 = 2;

fn image(name: &str) -> String {
    fixture("image-processor").join(name).to_str().unwrap().to_string()
}

fn model() -> String {
    fixture("vision-generate").to_str().unwrap().to_string()
}

/// `dg generate --chat --image ... --json -q` on the fixture's model, at 70 soft tokens, on the CPU.
fn generate(images: &[&str], extra: &[&str]) -> serde_json::Value {
    generate_on("cpu", images, &[&["-q"], extra].concat()).ok().json()
}

/// `dg generate --chat --image ... --json` on `backend` (its report lines on stderr).
fn generate_on(backend: &str, images: &[&str], extra: &[&str]) -> common::Run {
    let model = model();
    let mut args = vec!["generate", "--model", &model, "--chat", "--prompt", "What is in this image?", "--image-tokens", "70"];
    let paths: Vec<String> = images.iter().map(|name| image(name)).collect();
    for path in &paths {
        args.extend(["--image", path]);
    }
    args.extend(["--json", "--backend", backend]);
    args.extend(extra);
    dg(&args)
}

#[test]
fn the_image_prompt_is_the_one_transformers_processor_makes() {
    let reference = SafetensorsFile::open(&fixture("vision-generate").join("generate.safetensors")).unwrap();
    let want: Vec<u32> = reference.tensor_i64("prompt_ids").unwrap().1.into_iter().map(|v| v as u32).collect();
    let out = generate(&["wide.png"], &[]);
    assert_eq!(ids(&out["prompt_ids"]), want);
}

/// The GPU backend runs the tower on the GPU too, and generates what the CPU does.
#[test]
fn the_gpu_backend_takes_images_and_generates_what_the_cpu_does() {
    // F32 weights: the GPU's tower and forward within their tolerances of the CPU's, and this
    // short generation's decisions far enough from their thresholds to come out the same.
    let run = generate_on("gpu", &["wide.png", "tall.png"], &["--weights", "f32"]);
    if run.found_no_gpu("the_gpu_backend_takes_images_and_generates_what_the_cpu_does") {
        return;
    }
    let run = run.ok();
    assert!(run.stderr.contains("images: 2 through the vision tower on the GPU (f32 matrices, "), "{}", run.stderr);
    let gpu = run.json();
    assert_eq!(gpu["backend"], "gpu");
    let cpu = generate(&["wide.png", "tall.png"], &[]);
    assert_eq!(ids(&gpu["prompt_ids"]), ids(&cpu["prompt_ids"]));
    assert_eq!(ids(&gpu["output_ids"]), ids(&cpu["output_ids"]), "the GPU's image generation differs from the CPU's");
}

#[test]
fn the_images_change_the_output_and_each_gets_its_soft_tokens() {
    let wide = generate(&["wide.png"], &[]);
    let tall = generate(&["tall.png"], &[]);
    assert_ne!(ids(&wide["output_ids"]), ids(&tall["output_ids"]), "two images, the same output");
    let both = generate(&["wide.png", "tall.png"], &[]);
    let cpu = generate_on("cpu", &["wide.png"], &[]).ok();
    assert!(cpu.stderr.contains("images: 1 through the vision tower on the CPU (f32)"), "{}", cpu.stderr);
    let image_token = 19;
    let soft = |v: &serde_json::Value| ids(&v["prompt_ids"]).iter().filter(|&&id| id == image_token).count();
    assert_eq!(soft(&both), soft(&wide) + soft(&tall));
    // Without --chat the text places the image itself.
    let model = model();
    let wide_path = image("wide.png");
    let raw =
        dg(&["generate", "--model", &model, "--prompt", "<|image|>a cat", "--image", &wide_path, "--image-tokens", "70", "--json", "-q"])
            .ok()
            .json();
    assert_eq!(soft(&raw), soft(&wide));
}

/// A PNG whose header says `width`×`height`, its pixel data an empty zlib stream.
fn png_header(width: u32, height: u32) -> Vec<u8> {
    let mut header = width.to_be_bytes().to_vec();
    header.extend(height.to_be_bytes());
    header.extend([8, 2, 0, 0, 0]);
    let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
    for (kind, data) in [(b"IHDR", &header[..]), (b"IDAT", &[0x78, 0x9c, 0x03, 0, 0, 0, 0, 1][..]), (b"IEND", &[][..])] {
        let mut chunk = kind.to_vec();
        chunk.extend(data);
        png.extend((data.len() as u32).to_be_bytes());
        png.extend(&chunk);
        png.extend(crc32(&chunk).to_be_bytes());
    }
    png
}

fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 { (crc >> 1) ^ 0xEDB8_8320 } else { crc >> 1 };
        }
    }
    !crc
}

#[test]
fn bad_images_and_options_are_input_errors_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    let wide = std::fs::read(image("wide.png")).unwrap();
    let truncated = dir.path().join("truncated.png");
    std::fs::write(&truncated, &wide[..wide.len() / 3]).unwrap();
    let text = dir.path().join("notes.png");
    std::fs::write(&text, "not an image").unwrap();
    let huge = dir.path().join("huge.png");
    std::fs::write(&huge, png_header(20_000, 20_000)).unwrap();
    let model = model();
    let run = |path: &str, extra: &[&str]| {
        let mut args = vec!["generate", "--model", &model, "--chat", "--prompt", "hi", "--image", path, "-q"];
        args.extend(extra);
        dg(&args)
    };
    let path = |p: &std::path::Path| p.to_str().unwrap().to_string();
    run(&path(&truncated), &[]).fails(INPUT, &["--image", "truncated.png", "could not be decoded"]);
    run(&path(&text), &[]).fails(INPUT, &["--image", "notes.png", "not recognised"]);
    run(&path(&huge), &[]).fails(INPUT, &["--image", "huge.png", "20000x20000", "over the limit"]);
    run("/nonexistent/x.png", &[]).fails(INPUT, &["--image /nonexistent/x.png", "cannot read"]);
    let wide = image("wide.png");
    run(&wide, &["--image-tokens", "100"]).fails(INPUT, &["--image-tokens", "100", "[70, 140, 280, 560, 1120]"]);
    dg(&["generate", "--model", &model, "--prompt", "no placeholder", "--image", &wide, "-q"])
        .fails(INPUT, &["0 image placeholder", "--chat"]);
    let bundled = bundled();
    dg(&["generate", "--model", bundled.to_str().unwrap(), "--chat", "--prompt", "hi", "--image", &wide, "-q"])
        .fails(INPUT, &["has no vision tower"]);
}

/// A GGUF text model holds no tower (dg's quantizer, like llama.cpp's DiffusionGemma converter,
/// writes only the text model): its images need `--mmproj`, llama.cpp's projector file of the
/// tower (fixtures/vision-generate/mmproj-f32.gguf, written by llama.cpp's converter), and with it
/// the prompt is the one transformers' processor makes. A model file given as the projector is an
/// input error naming it.
#[test]
fn a_gguf_model_takes_images_through_an_mmproj_file() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("model-q8_0.gguf");
    let (model, gguf) = (model(), gguf.to_str().unwrap().to_string());
    dg(&["quantize", "--model", &model, "--scheme", "q8_0", "--out", &gguf, "-q"]).ok();
    let wide = image("wide.png");
    let mmproj = fixture("vision-generate").join("mmproj-f32.gguf");
    let run = |extra: &[&str]| {
        let mut args = vec!["generate", "--model", &gguf, "--chat", "--prompt", "What is in this image?", "--image-tokens", "70"];
        args.extend(["--image", &wide, "--json", "-q", "--backend", "cpu"]);
        args.extend(extra);
        dg(&args)
    };
    run(&[]).fails(INPUT, &["vision tower", "--mmproj", "model.encoder.vision_tower"]);
    let out = run(&["--mmproj", mmproj.to_str().unwrap()]).ok().json();
    let reference = SafetensorsFile::open(&fixture("vision-generate").join("generate.safetensors")).unwrap();
    let want: Vec<u32> = reference.tensor_i64("prompt_ids").unwrap().1.into_iter().map(|v| v as u32).collect();
    assert_eq!(ids(&out["prompt_ids"]), want);
    assert!(!ids(&out["output_ids"]).is_empty());
    run(&["--mmproj", &gguf]).fails(INPUT, &["--mmproj", "model-q8_0.gguf", "not a multimodal projector"]);
    run(&["--mmproj", "/nonexistent/mmproj.gguf"]).fails(INPUT, &["--mmproj /nonexistent/mmproj.gguf", "no such file"]);
}

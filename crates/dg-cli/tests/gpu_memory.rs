//! `dg info`'s GPU memory: the weights `--weights auto` holds on the GPU, held to two independent
//! counts: the tensors' bytes as the GGUF reader finds them in a file `dg quantize` wrote (its
//! blocks, the rest by dtype), and the bytes a `GpuModel` actually uploads (lavapipe here); and
//! `dg info --schemes`, whose rows add up the same way at the real geometry.

mod common;

use std::path::Path;

use common::{bundled, dg, fixture, repo};
use dg_gpu::{GpuContext, GpuError, GpuModel, GpuOptions, ModelOptions, WeightFormat};
use dg_model::{ModelDir, StoredDtype, tensor_manifest};

/// Every buffer of the upload is padded to a whole 4-byte word.
const WORD: u64 = 4;

fn quantized(scheme: &str, dir: &Path) -> std::path::PathBuf {
    let out = dir.join(format!("tiny-{scheme}.gguf"));
    dg(&["quantize", "--scheme", scheme, "--out", out.to_str().unwrap(), "-q"]).ok();
    out
}

fn info(model: &Path) -> serde_json::Value {
    dg(&["info", "--json", "--model", model.to_str().unwrap()]).ok().json()
}

#[test]
fn info_counts_a_quantized_ggufs_blocks_as_the_file_stores_them() {
    let dir = tempfile::tempdir().unwrap();
    for scheme in ["q8_0", "q4_k_m"] {
        let path = quantized(scheme, dir.path());
        let model = ModelDir::open(&path).unwrap();
        let file = model.checkpoint.gguf().unwrap();
        // The file's tensors: quantized ones by their data's byte range in the file, the kept BF16
        // matrices at 2 bytes and norm vectors at 4 (f32 on the GPU), the layer scalars on the host.
        let (mut blocks, mut rest, mut buffers) = (0u64, 0u64, 0u64);
        for (hf, shape) in tensor_manifest(&model.config.text) {
            let t = file.find_hf(&hf).unwrap();
            let n = shape.iter().product::<usize>() as u64;
            match shape.len() {
                _ if t.dtype.is_quantized() => blocks += t.bytes.len() as u64,
                1 if n == 1 => continue,
                1 => rest += 4 * n,
                _ => {
                    assert_eq!(t.dtype, StoredDtype::BF16, "{scheme}: {hf}");
                    rest += 2 * n
                }
            }
            buffers += 1;
        }
        let v = info(&path);
        let gpu = &v["memory"]["gpu"];
        assert_eq!(gpu["dtype"], "bf16", "{scheme}");
        let by_format = gpu["device_bytes_by_format"].as_object().unwrap();
        let quantized: u64 =
            by_format.iter().filter(|(f, _)| !["F32", "BF16", "F16"].contains(&f.as_str())).map(|(_, b)| b.as_u64().unwrap()).sum();
        let total = gpu["device_bytes"].as_u64().unwrap();
        // Stacked matrices share one buffer, so the padding is at most a word per tensor.
        assert!((blocks..blocks + WORD * buffers).contains(&quantized), "{scheme}: info {quantized} bytes of blocks, the file {blocks}");
        assert!(
            (blocks + rest..blocks + rest + WORD * buffers).contains(&total),
            "{scheme}: info {total} bytes, the file {}",
            blocks + rest
        );
        assert!(total < model.config.text.num_parameters() * 2, "{scheme}: the blocks are smaller than BF16");
    }
}

/// The device's bytes of `model` loaded as `dg generate --weights auto` loads it on an adapter
/// without tensor cores (the format `dg info` reports).
fn uploaded(ctx: GpuContext, model: &ModelDir, format: WeightFormat) -> u64 {
    let gpu = GpuModel::load(ctx, &model.config, &model.checkpoint, ModelOptions::new(64).format(format)).unwrap();
    gpu.weight_bytes()
}

/// The bundled model as a GGUF whose embedding (and tied head) is Q8_0, as released GGUFs store it:
/// the GPU holds it dequantized in f32.
fn quantized_embedding(dir: &Path) -> std::path::PathBuf {
    let model = ModelDir::open(&bundled()).unwrap();
    let path = dir.join("embed-q8_0.gguf");
    let embed = dg_model::SharedNames::new(&model.config.text).embed.name;
    let dtype = |hf: &str, stored| if hf == embed { StoredDtype::Q8_0 } else { stored };
    let vocab = model.vocab().unwrap();
    dg_model::gguf::write_model(
        &path,
        &model.config,
        Some(&model.generation),
        vocab.as_ref(),
        &model.checkpoint,
        &dtype,
        &mut |hf, t, want| Ok(dg_model::quantize_tensor(t, want, hf)?.bytes().to_vec()),
    )
    .unwrap();
    path
}

#[test]
fn info_gives_the_bytes_a_gpu_upload_takes() {
    let test = "info_gives_the_bytes_a_gpu_upload_takes";
    let dir = tempfile::tempdir().unwrap();
    let models = [
        bundled(),
        quantized("q4_k_m", dir.path()),
        quantized_embedding(dir.path()),
        fixture("gguf-q8_0"),
        fixture("gguf-iq"),
        fixture("gguf-fp4"),
    ];
    for path in models {
        let ctx = match GpuContext::new(&GpuOptions::from_env().unwrap()) {
            Ok(ctx) => ctx,
            Err(e @ GpuError::NoAdapter { .. }) if std::env::var("DG_ALLOW_NO_GPU").as_deref() == Ok("1") => {
                eprintln!("SKIP {test}: {e}");
                return;
            }
            Err(e) => panic!("{test}: {e} (or set DG_ALLOW_NO_GPU=1 to skip GPU tests)"),
        };
        let v = info(&path);
        let format = match v["memory"]["gpu"]["dtype"].as_str().unwrap() {
            "bf16" => WeightFormat::Bf16,
            "f32" => WeightFormat::F32,
            other => panic!("{}: dg info says {other}", path.display()),
        };
        let model = ModelDir::open(&path).unwrap();
        assert_eq!(v["memory"]["gpu"]["device_bytes"], uploaded(ctx, &model, format), "{}", path.display());
    }
}

#[test]
fn the_schemes_table_adds_up_at_the_real_geometry() {
    let config = repo().join("bench/configs/real-30layer.json");
    let v = dg(&["info", "--schemes", "--json", "--config", config.to_str().unwrap()]).ok().json();
    assert_eq!(v["context"], 4096);
    let rows = v["schemes"].as_array().unwrap();
    let names: Vec<&str> = rows.iter().map(|r| r["storage"].as_str().unwrap()).collect();
    assert_eq!(names, ["as stored", "q4_k_m", "q8_0", "q2_k", "q3_k_m", "iq4_xs"]);
    let cfg = dg_model::ModelConfig::from_file(&config).unwrap().text;
    let of = |name: &str, key: &str| rows.iter().find(|r| r["storage"] == name).unwrap()[key].as_u64().unwrap();
    // The released checkpoint in BF16: 2 bytes a parameter in the file, the two layer scalars of
    // each layer (outside the parameter count) included; on the GPU the norm vectors are f32 and
    // the layer scalars stay on the host.
    assert_eq!(of("as stored", "file_bytes"), 2 * (cfg.num_parameters() + 2 * cfg.num_layers() as u64));
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    assert!((46.5..47.5).contains(&gib(of("as stored", "gpu_weight_bytes"))), "{}", gib(of("as stored", "gpu_weight_bytes")));
    // q4_k_m's file is 18.41 GB (dg-model's scheme test); the GPU holds all its types as blocks.
    assert!((18.3e9..18.5e9).contains(&(of("q4_k_m", "file_bytes") as f64)));
    for r in rows {
        let total = r["gpu_weight_bytes"].as_u64().unwrap() + r["arena_bytes"].as_u64().unwrap();
        assert_eq!(r["total_bytes"], total);
        let by_format: u64 = r["gpu_weight_bytes_by_format"].as_object().unwrap().values().map(|b| b.as_u64().unwrap()).sum();
        assert_eq!(r["gpu_weight_bytes"], by_format);
        for card in r["fits_gib"].as_array().unwrap() {
            assert!(total + (512 << 20) <= card.as_u64().unwrap() << 30, "{}: {card} GiB", r["storage"]);
        }
    }
    // The text form is the same table.
    let text = dg(&["info", "--schemes", "--config", config.to_str().unwrap()]).ok().stdout;
    assert!(text.contains("| q2_k | ") && text.contains("8 GiB | 12 GiB | 16 GiB | 24 GiB"), "{text}");
    dg(&["info", "--config", config.to_str().unwrap()]).fails(2, &["--schemes"]);
}

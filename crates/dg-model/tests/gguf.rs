//! GGUF files: dg's writer and reader round trip (bytes, shapes, types, geometry), a GGUF of the
//! bundled model loads the same weights as its safetensors, and broken files (truncated, bad
//! magic, absurd counts, unknown types, duplicate or unknown tensors, missing keys) are errors
//! naming the file and the field or tensor, never panics.

use std::path::{Path, PathBuf};

use dg_model::gguf::{self, GgufFile, GgufWriter, MetaValue, PlannedTensor};
use dg_model::{ModelConfig, ModelDir, RandomWeights, StoredDtype, StoredTensor, TensorSource, tensor_manifest};
use tempfile::TempDir;

fn bundled() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/tiny-random")
}

fn bundled_config() -> ModelConfig {
    ModelConfig::from_file(&bundled().join("config.json")).unwrap()
}

/// The type each tensor is written in: experts as opaque Q8_0 blocks, the other matrices
/// alternating F16 and BF16, everything of rank ≤ 1 in F32.
fn mixed_dtype(hf: &str, shape: &[usize]) -> StoredDtype {
    if hf.contains("experts.") {
        StoredDtype::Q8_0
    } else if shape.len() < 2 {
        StoredDtype::F32
    } else if hf.len().is_multiple_of(2) {
        StoredDtype::F16
    } else {
        StoredDtype::BF16
    }
}

/// `t` in `dtype`: floats rounded to nearest, Q8_0 as deterministic opaque bytes of the right
/// length (their values are not checked here; dequantization is tested with the block formats).
fn encode(hf: &str, t: &StoredTensor<'_>, dtype: StoredDtype) -> Vec<u8> {
    let v = t.to_f32();
    match dtype {
        StoredDtype::F32 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        StoredDtype::F16 => v.iter().flat_map(|&x| half::f16::from_f32(x).to_le_bytes()).collect(),
        StoredDtype::BF16 => v.iter().flat_map(|&x| half::bf16::from_f32(x).to_le_bytes()).collect(),
        q => {
            let n = q.bytes_for(v.len()).unwrap();
            let seed = hf.bytes().fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(b.into()));
            (0..n as u32).map(|i| (i.wrapping_mul(2_654_435_761) ^ seed).to_le_bytes()[1]).collect()
        }
    }
}

fn write_mixed(path: &Path, config: &ModelConfig) {
    let shapes: std::collections::HashMap<String, Vec<usize>> = tensor_manifest(&config.text).into_iter().collect();
    gguf::write_model(path, config, None, None, &RandomWeights::new(3), &|hf, _| mixed_dtype(hf, &shapes[hf]), &mut |hf, t, d| {
        Ok(encode(hf, t, d))
    })
    .unwrap();
}

#[test]
fn round_trip_keeps_bytes_shapes_types_and_geometry() {
    let config = bundled_config();
    let tmp = TempDir::new().unwrap();
    let path = tmp.path().join("mixed.gguf");
    write_mixed(&path, &config);
    // CI reads this file back with gguf-py (tools/gguf_check/read_gguf.py).
    if let Some(dir) = std::env::var_os("DG_GGUF_TEST_OUT") {
        std::fs::copy(&path, Path::new(&dir).join("mixed.gguf")).unwrap();
    }
    let file = GgufFile::open(&path).unwrap();
    assert_eq!(file.header().version, 3);
    assert_eq!(file.header().alignment, 32);
    assert_eq!(file.header().data_start % 32, 0);
    assert_eq!(file.first_unknown(), None);
    let manifest = tensor_manifest(&config.text);
    assert_eq!(file.tensors().len(), manifest.len() + 1, "the text tensors and rope_freqs.weight");
    let src = RandomWeights::new(3);
    let mut quantized = 0;
    for (hf, shape) in &manifest {
        let t = file.stored(hf, shape).unwrap();
        let want_dtype = mixed_dtype(hf, shape);
        assert_eq!((t.dtype, &t.shape), (want_dtype, shape), "{hf}");
        assert_eq!(t.bytes(), encode(hf, &src.stored(hf, shape).unwrap(), want_dtype), "{hf}");
        let info = file.find_hf(hf).unwrap();
        assert_eq!(info.dims, shape.iter().rev().copied().collect::<Vec<_>>(), "ggml dims are the shape reversed");
        assert_eq!((info.bytes.start - file.header().data_start) % 32, 0, "{hf} is aligned");
        quantized += usize::from(want_dtype.is_quantized());
    }
    assert_eq!(quantized, 2 * config.text.num_layers());
    // F32/F16/BF16 values: exactly the rounded source values.
    let embed = "model.decoder.embed_tokens.weight";
    let shape = [config.text.vocab_size, config.text.hidden_size];
    let want: Vec<f32> = src.get(embed, &shape).unwrap().iter().map(|&x| round(mixed_dtype(embed, &shape), x)).collect();
    assert_eq!(file.get(embed, &shape).unwrap(), want);

    let back = file.model_config().unwrap();
    assert_eq!(back.text, config.text);
    assert_eq!(back.canvas_length, config.canvas_length);
    assert_eq!(back.eos_token_ids, config.eos_token_ids);
    let freqs = file.tensor("rope_freqs.weight").unwrap();
    assert_eq!(
        file.stored_gguf(freqs).to_f32(),
        [1.0, 1.0, 1.0, 1.0, 1e30, 1e30, 1e30, 1e30, 1e30, 1e30, 1e30, 1e30, 1e30, 1e30, 1e30, 1e30]
    );
}

fn round(dtype: StoredDtype, x: f32) -> f32 {
    match dtype {
        StoredDtype::F16 => half::f16::from_f32(x).to_f32(),
        StoredDtype::BF16 => half::bf16::from_f32(x).to_f32(),
        _ => x,
    }
}

/// Writes the bundled model as `model.gguf` (its BF16 tensors as stored) into a fresh directory.
fn bundled_gguf() -> (TempDir, PathBuf) {
    let model = ModelDir::open(&bundled()).unwrap();
    let tmp = TempDir::new().unwrap();
    let path = tmp.path().join("model.gguf");
    gguf::write_model_as_stored(&path, &model.config, Some(&model.generation), None, &model.checkpoint).unwrap();
    (tmp, path)
}

#[test]
fn a_gguf_of_the_bundled_model_loads_the_same_weights_and_settings() {
    let reference = ModelDir::open(&bundled()).unwrap();
    let (_tmp, path) = bundled_gguf();
    let model = ModelDir::open(&path).unwrap();
    assert_eq!(model.dir, path.parent().unwrap());
    assert_eq!(model.config.text, reference.config.text);
    assert_eq!(model.config.canvas_length, reference.config.canvas_length);
    assert!(model.matrices_are_bf16(), "BF16 stays BF16");
    assert_eq!(model.checkpoint.names().count(), tensor_manifest(&model.config.text).len());
    assert_eq!(model.load_weights().unwrap(), reference.load_weights().unwrap());
    let (g, r) = (model.generation_config().unwrap(), reference.generation_config().unwrap());
    assert_eq!(
        (g.max_denoising_steps, g.entropy_bound, g.temperature, g.stopping),
        (r.max_denoising_steps, r.entropy_bound, r.temperature, r.stopping)
    );
}

#[test]
fn a_directory_whose_weights_are_model_gguf_opens_like_a_model_directory() {
    let (tmp, _path) = bundled_gguf();
    std::fs::copy(bundled().join("config.json"), tmp.path().join("config.json")).unwrap();
    let model = ModelDir::open(tmp.path()).unwrap();
    assert_eq!(model.checkpoint.origin(), tmp.path().join("model.gguf"));
    assert_eq!(model.config, bundled_config(), "config.json beside it is read whole (image_token_id included)");
    assert_eq!(model.load_weights().unwrap(), ModelDir::open(&bundled()).unwrap().load_weights().unwrap());
}

#[test]
fn a_config_json_beside_the_gguf_wins_over_its_metadata() {
    let (tmp, path) = bundled_gguf();
    let text = std::fs::read_to_string(bundled().join("config.json")).unwrap().replace("\"canvas_length\": 32", "\"canvas_length\": 16");
    std::fs::write(tmp.path().join("config.json"), text).unwrap();
    assert_eq!(ModelDir::open(&path).unwrap().config.canvas_length, 16);
    // The architecture is checked even then: a file of another model is not half-read.
    let mut bytes = std::fs::read(&path).unwrap();
    let at = bytes.windows(15).position(|w| w == b"diffusion-gemma").unwrap();
    bytes[at..at + 15].copy_from_slice(b"diffusion-gemmb");
    let other = tmp.path().join("other.gguf");
    std::fs::write(&other, bytes).unwrap();
    assert_err(ModelDir::open(&other), &["other.gguf", "general.architecture", "diffusion-gemmb"]);
    // A config.json that disagrees with the tensors is caught by the shape checks.
    let text = std::fs::read_to_string(bundled().join("config.json")).unwrap().replace("\"hidden_size\": 64", "\"hidden_size\": 32");
    std::fs::write(tmp.path().join("config.json"), text).unwrap();
    let e = ModelDir::open(&path).unwrap().load_weights().unwrap_err().to_string();
    assert!(e.contains("token_embd.weight") && e.contains("model.gguf") && e.contains("shape"), "{e}");
}

fn assert_err<T>(r: dg_model::Result<T>, needles: &[&str]) {
    let Err(e) = r else { panic!("expected an error naming {needles:?}") };
    let e = e.to_string();
    for n in needles {
        assert!(e.contains(n), "error {e:?} lacks {n:?}");
    }
}

/// A valid GGUF header by hand: `kvs` are (key, type, value bytes); tensors (name, ggml dims,
/// type id, offset); then `data` zero bytes after the aligned header.
fn raw(version: u32, kvs: &[(&str, u32, Vec<u8>)], tensors: &[(&str, &[u64], u32, u64)], data: usize) -> Vec<u8> {
    let s = |out: &mut Vec<u8>, s: &str| {
        out.extend((s.len() as u64).to_le_bytes());
        out.extend(s.as_bytes());
    };
    let mut b = b"GGUF".to_vec();
    b.extend(version.to_le_bytes());
    b.extend((tensors.len() as u64).to_le_bytes());
    b.extend((kvs.len() as u64).to_le_bytes());
    for (k, t, v) in kvs {
        s(&mut b, k);
        b.extend(t.to_le_bytes());
        b.extend(v);
    }
    for (name, dims, ty, off) in tensors {
        s(&mut b, name);
        b.extend((dims.len() as u32).to_le_bytes());
        for d in *dims {
            b.extend(d.to_le_bytes());
        }
        b.extend(ty.to_le_bytes());
        b.extend(off.to_le_bytes());
    }
    b.resize(b.len().next_multiple_of(32) + data, 0);
    b
}

fn parse(bytes: Vec<u8>) -> dg_model::Result<GgufFile> {
    GgufFile::from_vec(bytes, Path::new("bad.gguf"))
}

#[test]
fn broken_headers_are_errors_naming_the_file_and_field() {
    let norm: (&str, &[u64], u32, u64) = ("output_norm.weight", &[8], 0, 0);
    assert!(parse(raw(3, &[], &[norm], 32)).is_ok());
    assert!(parse(raw(2, &[], &[norm], 32)).is_ok(), "version 2 reads too");
    let mut bad_magic = raw(3, &[], &[norm], 32);
    bad_magic[0] = b'X';
    assert_err(parse(bad_magic), &["bad.gguf", "magic"]);
    assert_err(parse(raw(1, &[], &[], 0)), &["bad.gguf", "version 1"]);
    assert_err(parse(raw(3, &[], &[norm], 31)), &["bad.gguf", "output_norm.weight", "truncated"]);
    let mut huge = raw(3, &[], &[], 0);
    huge[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    assert_err(parse(huge), &["tensor count", "at most"]);
    let long_key = raw(3, &[("k", 8, u64::MAX.to_le_bytes().to_vec())], &[], 0);
    assert_err(parse(long_key), &["metadata \"k\"", "length"]);
    let array = [8u32.to_le_bytes().to_vec(), (1u64 << 40).to_le_bytes().to_vec()].concat();
    assert_err(parse(raw(3, &[("tokens", 9, array)], &[], 0)), &["tokens", "array length"]);
    assert_err(parse(raw(3, &[("k", 13, vec![0; 8])], &[], 0)), &["\"k\"", "unknown value type 13"]);
    assert_err(parse(raw(3, &[("general.alignment", 4, 3u32.to_le_bytes().to_vec())], &[], 0)), &["general.alignment", "power of two"]);
    let dup = raw(3, &[], &[norm, ("output_norm.weight", &[8], 0, 32)], 64);
    assert_err(parse(dup), &["output_norm.weight", "twice"]);
    // Types dg does not read: the ternary ones; Q8_K and Q1_0, which gguf-py does not dequantize; ids ggml dropped or never had.
    for (id, name) in [(34, "TQ1_0"), (35, "TQ2_0"), (15, "Q8_K"), (41, "Q1_0"), (99, "unknown"), (4, "Q4_2")] {
        let e = parse(raw(3, &[], &[("output_norm.weight", &[256], id, 0)], 1024));
        assert_err(
            e,
            &["bad.gguf", "\"output_norm.weight\"", &format!("type {id} ({name}), which dg does not read (it reads F32, F16, BF16, Q4_0")],
        );
    }
    // Every type dg reads parses, and a row that is not whole blocks is an error naming the tensor.
    for dtype in StoredDtype::ALL {
        let (id, block) = (dtype.ggml_type(), dtype.block_len() as u64);
        assert!(parse(raw(3, &[], &[("t", &[block, 2], id, 0)], 2 * dtype.block_bytes())).is_ok(), "{}", dtype.name());
        if block > 1 {
            let e = parse(raw(3, &[], &[("blk.0.ffn_down_exps.weight", &[block / 2 * 3, 2], id, 0)], 4 * dtype.block_bytes()));
            assert_err(
                e,
                &[
                    "\"blk.0.ffn_down_exps.weight\"",
                    &format!("{} rows of {} elements are not whole blocks of {block}", dtype.name(), block / 2 * 3),
                ],
            );
        }
    }
    // The experts' down projection of DiffusionGemma (K = 704) in a 256-value block type.
    let e = parse(raw(3, &[], &[("blk.0.ffn_down_exps.weight", &[704, 2816, 128], 23, 0)], 0));
    assert_err(e, &["\"blk.0.ffn_down_exps.weight\"", "IQ4_XS rows of 704 elements are not whole blocks of 256"]);
    assert_err(parse(raw(3, &[], &[("t", &[1, 1, 1, 1, 1], 0, 0)], 32)), &["\"t\"", "5 dimensions"]);
    assert_err(parse(raw(3, &[], &[("t", &[u64::MAX, u64::MAX], 0, 0)], 32)), &["\"t\"", "overflow"]);
    assert_err(parse(raw(3, &[], &[("t", &[1 << 62], 0, 0)], 32)), &["\"t\"", "F32 elements overflow"]);
    assert_err(parse(raw(3, &[], &[("t", &[8], 0, 8)], 64)), &["\"t\"", "not a multiple of the alignment"]);
    assert_err(parse(raw(3, &[], &[("t", &[8], 0, 1 << 62)], 32)), &["\"t\"", "beyond the end"]);
}

#[test]
fn no_prefix_and_no_flipped_byte_of_a_valid_file_panics() {
    let tmp = TempDir::new().unwrap();
    let path = tmp.path().join("m.gguf");
    write_mixed(&path, &bundled_config());
    let bytes = std::fs::read(&path).unwrap();
    let file = GgufFile::open(&path).unwrap();
    let header_end = file.header().data_start;
    let data_end = file.tensors().iter().map(|t| t.bytes.end).max().unwrap();
    for cut in (0..header_end).chain([data_end - 1]) {
        assert!(parse(bytes[..cut].to_vec()).is_err(), "a file cut at {cut} of {} parses", bytes.len());
    }
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    for _ in 0..3000 {
        state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        let mut b = bytes[..header_end].to_vec();
        let at = (state >> 33) as usize % b.len();
        b[at] ^= 1 << ((state >> 8) % 8);
        if let Ok(f) = parse(b) {
            let _ = f.model_config();
            for t in f.tensors() {
                let _ = f.stored_gguf(t).byte_len();
            }
        }
    }
}

/// Writes a GGUF with the bundled model's metadata and the given tensors (all F32 zeros).
fn write_tensors(path: &Path, tensors: &[(String, Vec<usize>)], drop_key: Option<&str>) {
    let config = bundled_config();
    let metadata: Vec<(String, MetaValue)> =
        gguf::model_metadata(&config, None).unwrap().into_iter().filter(|(k, _)| Some(k.as_str()) != drop_key).collect();
    let plan: Vec<PlannedTensor> =
        tensors.iter().map(|(n, s)| PlannedTensor { name: n.clone(), shape: s.clone(), dtype: StoredDtype::F32 }).collect();
    let mut w = GgufWriter::create(path, &metadata, &plan).unwrap();
    for (n, s) in tensors {
        w.write_tensor(n, &vec![0u8; 4 * s.iter().product::<usize>()]).unwrap();
    }
    w.finish().unwrap();
}

fn gguf_manifest() -> Vec<(String, Vec<usize>)> {
    tensor_manifest(&bundled_config().text).into_iter().map(|(hf, s)| (gguf::to_gguf(&hf).unwrap(), s)).collect()
}

#[test]
fn unknown_missing_and_misshapen_tensors_and_missing_keys_are_named() {
    let tmp = TempDir::new().unwrap();
    let path = tmp.path().join("model.gguf");
    let mut tensors = gguf_manifest();
    write_tensors(&path, &tensors, None);
    assert!(ModelDir::open(&path).unwrap().load_weights().is_ok(), "rope_freqs.weight may be absent (default RoPE is not asked)");

    tensors.push(("v.blk.0.attn_q.weight".into(), vec![4, 4]));
    write_tensors(&path, &tensors, None);
    assert_err(ModelDir::open(&path), &["model.gguf", "v.blk.0.attn_q.weight", "not a DiffusionGemma text tensor"]);

    tensors.pop();
    let at = tensors.iter().position(|(n, _)| n == "blk.0.attn_k.weight").unwrap();
    let removed = tensors.remove(at);
    write_tensors(&path, &tensors, None);
    let hf = gguf::to_hf(&removed.0).unwrap();
    assert_err(ModelDir::open(&path).unwrap().load_weights(), &[&hf, &removed.0, "model.gguf", "not found"]);

    tensors.insert(at, (removed.0.clone(), removed.1.iter().rev().copied().collect()));
    write_tensors(&path, &tensors, None);
    assert_err(ModelDir::open(&path).unwrap().load_weights(), &[&hf, &removed.0, "shape"]);

    for key in [
        "diffusion-gemma.expert_count",
        "diffusion.canvas_length",
        "diffusion-gemma.attention.sliding_window_pattern",
        "general.architecture",
    ] {
        write_tensors(&path, &gguf_manifest(), Some(key));
        assert_err(ModelDir::open(&path), &["model.gguf", key, "missing"]);
    }
}

#[test]
fn the_writer_refuses_plans_it_cannot_write() {
    let tmp = TempDir::new().unwrap();
    let path = tmp.path().join("w.gguf");
    let t = |name: &str, shape: &[usize], dtype| PlannedTensor { name: name.into(), shape: shape.to_vec(), dtype };
    let e = GgufWriter::create(&path, &[], &[t("a", &[2, 16], StoredDtype::Q8_0)]).unwrap_err().to_string();
    assert!(e.contains("whole blocks of 32"), "{e}");
    let e = GgufWriter::create(&path, &[], &[t("a", &[2], StoredDtype::F32), t("a", &[2], StoredDtype::F32)]).unwrap_err().to_string();
    assert!(e.contains("twice"), "{e}");
    let mut w = GgufWriter::create(&path, &[], &[t("a", &[2], StoredDtype::F32), t("b", &[2], StoredDtype::F32)]).unwrap();
    assert!(w.write_tensor("b", &[0; 8]).unwrap_err().to_string().contains("where \"a\" was planned"));
    assert!(w.write_tensor("a", &[0; 4]).unwrap_err().to_string().contains("4 bytes given, 8 planned"));
    w.write_tensor("a", &[0; 8]).unwrap();
    assert!(w.finish().unwrap_err().to_string().contains("\"b\" was planned but never written"));
}

/// A file gguf-py's `GGUFWriter` wrote (committed as a fuzz seed): dg reads its metadata of every
/// kind and its F32, F16 and Q8_0 tensors where gguf-py put them.
#[test]
fn a_file_written_by_gguf_py_reads_as_gguf_py_wrote_it() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds/gguf_header/gguf_py_metadata.gguf");
    let file = GgufFile::open(&path).unwrap();
    assert_eq!(file.meta("general.architecture"), Some(MetaValue::Str("diffusion-gemma".into())));
    let tokens = file.meta("tokenizer.ggml.tokens").unwrap();
    let tokens: Vec<&str> = tokens.as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    assert_eq!(tokens, ["<pad>", "<eos>", "a", "b"]);
    let scores = file.meta("tokenizer.ggml.scores").unwrap();
    assert_eq!(scores.as_array().unwrap().iter().map(|s| s.as_f64().unwrap()).collect::<Vec<_>>(), [0.0, -1.0, -2.0, -3.0]);
    assert_eq!(file.meta("x.f64"), Some(MetaValue::F64(1.5)));
    assert_eq!(file.meta("x.i64"), Some(MetaValue::I64(-3)));
    assert_eq!(file.meta("diffusion-gemma.attention.causal"), Some(MetaValue::Bool(false)));
    assert_eq!(file.meta("diffusion.canvas_length").and_then(|v| v.as_u64()), Some(8));
    let t = |name: &str| file.tensor(name).unwrap();
    assert_eq!((t("output_norm.weight").dtype, t("output_norm.weight").shape()), (StoredDtype::F32, vec![32]));
    assert_eq!(file.stored_gguf(t("output_norm.weight")).to_f32(), vec![1.0; 32]);
    assert_eq!((t("token_embd.weight").dtype, t("token_embd.weight").shape()), (StoredDtype::F16, vec![4, 32]));
    assert_eq!(file.stored_gguf(t("token_embd.weight")).to_f32(), vec![1.0; 128]);
    let q = t("blk.0.ffn_down.weight");
    assert_eq!((q.dtype, q.shape(), q.bytes.len()), (StoredDtype::Q8_0, vec![2, 32], 68));
    assert_eq!(file.first_unknown(), None);
    assert_err(file.model_config(), &["gguf_py_metadata.gguf", "diffusion-gemma.block_count", "missing"]);
}

/// The real 26B-A4B geometry survives GGUF's metadata (and `rope_freqs.weight`, which carries the
/// full layers' partial rotary factor): the keys and values llama.cpp's converter writes for it.
#[test]
fn the_real_geometry_round_trips_through_the_metadata() {
    let real = r#"{"model_type":"diffusion_gemma","canvas_length":256,"eos_token_id":[1,106],
      "text_config":{"vocab_size":262144,"hidden_size":2816,"intermediate_size":2112,"num_hidden_layers":30,
      "num_attention_heads":16,"num_key_value_heads":8,"num_global_key_value_heads":2,"head_dim":256,
      "global_head_dim":512,"sliding_window":1024,"num_experts":128,"top_k_experts":8,"moe_intermediate_size":704,
      "max_position_embeddings":262144,"rope_parameters":{"sliding_attention":{"rope_type":"default","rope_theta":10000.0},
        "full_attention":{"rope_type":"proportional","rope_theta":1000000.0,"partial_rotary_factor":0.25}},
      "final_logit_softcapping":30.0}}"#;
    let config = ModelConfig::from_json_str(real, Path::new("config.json")).unwrap();
    let metadata = gguf::model_metadata(&config, None).unwrap();
    let value = |k: &str| metadata.iter().find(|(key, _)| key == k).map(|(_, v)| v.clone()).unwrap();
    assert_eq!(value("diffusion-gemma.attention.key_length"), MetaValue::U32(512));
    assert_eq!(value("diffusion-gemma.attention.key_length_swa"), MetaValue::U32(256));
    assert_eq!(value("diffusion-gemma.rope.dimension_count"), MetaValue::U32(512));
    let kv: Vec<u64> = value("diffusion-gemma.attention.head_count_kv").as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
    assert_eq!(kv, [8, 8, 8, 8, 8, 2].repeat(5));
    let freqs = gguf::rope_freqs(&config).unwrap();
    assert_eq!(freqs.len(), 256);
    assert_eq!(freqs.iter().filter(|&&f| f == 1.0).count(), 64, "64 rotated slots of 256, as the converter writes them");
    let tmp = TempDir::new().unwrap();
    let path = tmp.path().join("real.gguf");
    let plan = [PlannedTensor { name: "rope_freqs.weight".into(), shape: vec![256], dtype: StoredDtype::F32 }];
    let mut w = GgufWriter::create(&path, &metadata, &plan).unwrap();
    w.write_tensor("rope_freqs.weight", &freqs.iter().flat_map(|f| f.to_le_bytes()).collect::<Vec<_>>()).unwrap();
    w.finish().unwrap();
    let back = GgufFile::open(&path).unwrap().model_config().unwrap();
    assert_eq!(back.text, config.text);
    assert_eq!((back.canvas_length, back.eos_token_ids), (256, vec![1, 106]));
    assert_eq!(back.text.num_parameters(), 25_250_986_752);
}

/// GGUF metadata as dg writes it: (key, value) pairs.
type Metadata = Vec<(String, MetaValue)>;

/// `final_logit_softcapping` as llama.cpp reads it: absent (llama.cpp's converter writes it only
/// when config.json names it) it is 30, and 0 means no softcap, which is what dg writes for a
/// config without one (so that it round trips).
#[test]
fn the_softcap_key_reads_as_llama_cpp_reads_it() {
    let key = "diffusion-gemma.final_logit_softcapping";
    let read = |edit: &dyn Fn(&mut Metadata)| {
        let mut metadata = gguf::model_metadata(&bundled_config(), None).unwrap();
        edit(&mut metadata);
        let tmp = TempDir::new().unwrap();
        let path = tmp.path().join("softcap.gguf");
        GgufWriter::create(&path, &metadata, &[]).unwrap().finish().unwrap();
        GgufFile::open(&path).unwrap().model_config().unwrap().text.final_logit_softcapping
    };
    assert_eq!(read(&|_| {}), Some(30.0), "the bundled model's softcap round trips");
    assert_eq!(read(&|m| m.retain(|(k, _)| k != key)), Some(30.0), "absent: llama.cpp's default");
    let set = |v: f32| move |m: &mut Metadata| m.iter_mut().filter(|(k, _)| k == key).for_each(|(_, x)| *x = MetaValue::F32(v));
    assert_eq!(read(&set(0.0)), None, "0: no softcap");
    assert_eq!(read(&set(12.5)), Some(12.5));
    let mut none = bundled_config();
    none.text.final_logit_softcapping = None;
    let written = gguf::model_metadata(&none, None).unwrap();
    assert!(written.contains(&(key.to_string(), MetaValue::F32(0.0))), "no softcap is written as 0");
}

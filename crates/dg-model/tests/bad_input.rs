//! Loading model directories that are broken in one way each, plus the valid cases they are
//! broken from.
//!
//! Every fixture starts from a complete tiny model directory (`config.json`,
//! `generation_config.json`, `model.safetensors` written from `tensor_manifest` with seeded random
//! values) in a temp dir. A broken variant must load to an `Err` whose message names the file and,
//! where there is one, the tensor or field at fault; nothing may panic.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use dg_model::{
    Checkpoint, LayerKind, ModelConfig, ModelDir, RandomWeights, Result, SafetensorsFile, StoredDtype, StoredTensor, TensorSource, Weights,
    tensor_manifest, vision_manifest,
};
use half::{bf16, f16};
use safetensors::tensor::{Dtype, View};
use tempfile::TempDir;

/// Seed of the random values written into every fixture checkpoint.
const SEED: u64 = 7;

/// A tiny config with one sliding layer (with `v_proj`) and one full layer (without). The hidden
/// size differs from every projection width, so a transposed weight has a different shape.
const TINY_CONFIG: &str = r#"{
  "model_type": "diffusion_gemma",
  "architectures": ["DiffusionGemmaForBlockDiffusion"],
  "canvas_length": 8,
  "eos_token_id": [1, 6],
  "text_config": {
    "model_type": "diffusion_gemma_text",
    "vocab_size": 32, "hidden_size": 12, "intermediate_size": 10,
    "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
    "num_global_key_value_heads": 1, "head_dim": 4, "global_head_dim": 8,
    "sliding_window": 4, "num_experts": 4, "top_k_experts": 2, "moe_intermediate_size": 6,
    "layer_types": ["sliding_attention", "full_attention"]
  }
}"#;

const TINY_GENERATION: &str = r#"{
  "max_new_tokens": 16, "max_denoising_steps": 5,
  "sampler_config": {"_cls_name": "EntropyBoundSamplerConfig", "entropy_bound": 0.1},
  "t_min": 0.4, "t_max": 0.8, "stability_threshold": 1, "confidence_threshold": 0.005,
  "eos_token_id": [1, 6, 5], "pad_token_id": 0
}"#;

/// The real 26B-A4B `config.json` (spec §1.1–1.2).
const REAL_CONFIG: &str = r#"{
  "architectures": ["DiffusionGemmaForBlockDiffusion"],
  "model_type": "diffusion_gemma",
  "canvas_length": 256,
  "tie_word_embeddings": true,
  "boi_token_id": 255999, "eoi_token_id": 258882, "image_token_id": 258880,
  "eos_token_id": [1, 106],
  "vision_soft_tokens_per_image": 280,
  "initializer_range": 0.02,
  "text_config": {
    "model_type": "diffusion_gemma_text",
    "vocab_size": 262144, "hidden_size": 2816, "intermediate_size": 2112,
    "num_hidden_layers": 30, "num_attention_heads": 16, "num_key_value_heads": 8,
    "num_global_key_value_heads": 2, "head_dim": 256, "global_head_dim": 512,
    "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 262144,
    "rms_norm_eps": 1e-06, "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2,
    "tie_word_embeddings": true,
    "rope_parameters": {
      "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
      "full_attention": {"rope_type": "proportional", "rope_theta": 1000000.0, "partial_rotary_factor": 0.25}
    },
    "attention_bias": false, "attention_dropout": 0.0, "sliding_window": 1024,
    "layer_types": [
      "sliding_attention", "sliding_attention", "sliding_attention", "sliding_attention", "sliding_attention", "full_attention",
      "sliding_attention", "sliding_attention", "sliding_attention", "sliding_attention", "sliding_attention", "full_attention",
      "sliding_attention", "sliding_attention", "sliding_attention", "sliding_attention", "sliding_attention", "full_attention",
      "sliding_attention", "sliding_attention", "sliding_attention", "sliding_attention", "sliding_attention", "full_attention",
      "sliding_attention", "sliding_attention", "sliding_attention", "sliding_attention", "sliding_attention", "full_attention"
    ],
    "final_logit_softcapping": 30.0, "use_bidirectional_attention": "vision",
    "num_experts": 128, "top_k_experts": 8, "moe_intermediate_size": 704,
    "initializer_range": 0.02, "dtype": "bfloat16"
  },
  "vision_config": {
    "model_type": "gemma4_vision", "hidden_size": 1152, "intermediate_size": 4304,
    "num_hidden_layers": 27, "num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": 72,
    "patch_size": 16, "pooling_kernel_size": 3, "position_embedding_size": 10240, "standardize": true,
    "use_clipped_linears": false, "rope_parameters": {"rope_theta": 100.0, "rope_type": "axial"}
  }
}"#;

// ---------------------------------------------------------------------------------------------
// Fixture helpers
// ---------------------------------------------------------------------------------------------

/// One tensor as it lies in a safetensors file.
#[derive(Debug, Clone)]
struct RawTensor {
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

impl View for &RawTensor {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.bytes)
    }
    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}

impl RawTensor {
    /// `values` stored as `dtype` (floats rounded to nearest, integers truncated).
    fn new(dtype: Dtype, shape: &[usize], values: &[f32]) -> Self {
        let bytes = match dtype {
            Dtype::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            Dtype::BF16 => values.iter().flat_map(|&v| bf16::from_f32(v).to_le_bytes()).collect(),
            Dtype::F16 => values.iter().flat_map(|&v| f16::from_f32(v).to_le_bytes()).collect(),
            Dtype::F64 => values.iter().flat_map(|&v| f64::from(v).to_le_bytes()).collect(),
            Dtype::I32 => values.iter().flat_map(|&v| (v as i32).to_le_bytes()).collect(),
            Dtype::I64 => values.iter().flat_map(|&v| (v as i64).to_le_bytes()).collect(),
            other => panic!("test helper cannot encode {other:?}"),
        };
        RawTensor { dtype, shape: shape.to_vec(), bytes }
    }
}

/// Named tensors of one checkpoint, sorted by name.
type Tensors = BTreeMap<String, RawTensor>;

/// The value a float written as `dtype` reads back as.
fn upcast(dtype: Dtype, v: f32) -> f32 {
    match dtype {
        Dtype::F32 => v,
        Dtype::BF16 => bf16::from_f32(v).to_f32(),
        Dtype::F16 => f16::from_f32(v).to_f32(),
        other => panic!("not a float dtype the loader accepts: {other:?}"),
    }
}

/// `RandomWeights` rounded through `dtype`: what a checkpoint written by [`checkpoint`] holds.
struct Stored {
    dtype: Dtype,
}

impl TensorSource for Stored {
    fn stored(&self, name: &str, shape: &[usize]) -> Result<StoredTensor<'_>> {
        let values = RandomWeights { seed: SEED }.get(name, shape)?;
        Ok(StoredTensor::from_f32(shape.to_vec(), values.into_iter().map(|v| upcast(self.dtype, v)).collect()))
    }
}

/// Records every tensor request while delegating to `RandomWeights`.
#[derive(Default)]
struct Recorder {
    requests: std::cell::RefCell<Vec<(String, Vec<usize>)>>,
}

impl TensorSource for Recorder {
    fn stored(&self, name: &str, shape: &[usize]) -> Result<StoredTensor<'_>> {
        self.requests.borrow_mut().push((name.to_string(), shape.to_vec()));
        RandomWeights { seed: SEED }.stored(name, shape)
    }
}

fn tiny_config() -> ModelConfig {
    ModelConfig::from_json_str(TINY_CONFIG, Path::new("config.json")).expect("tiny config parses")
}

/// Every manifest tensor of the tiny config, seeded random values stored as `dtype`.
fn checkpoint(dtype: Dtype) -> Tensors {
    tensor_manifest(&tiny_config().text)
        .into_iter()
        .map(|(name, shape)| {
            let values = RandomWeights { seed: SEED }.get(&name, &shape).unwrap();
            let tensor = RawTensor::new(dtype, &shape, &values);
            (name, tensor)
        })
        .collect()
}

/// The weights a checkpoint from [`checkpoint`]`(dtype)` must load to.
fn expected_weights(dtype: Dtype) -> Weights {
    Weights::build(&Stored { dtype }, &tiny_config().text).unwrap()
}

fn write_safetensors(path: &Path, tensors: &Tensors) {
    safetensors::serialize_to_file(tensors.iter(), None, path).expect("write safetensors");
}

/// A model directory in a temp dir; dropped with the test.
struct ModelFixture {
    dir: TempDir,
}

impl ModelFixture {
    /// Config files only, no checkpoint.
    fn configs_only() -> Self {
        let fixture = ModelFixture { dir: tempfile::tempdir().expect("temp dir") };
        fixture.write("config.json", TINY_CONFIG);
        fixture.write("generation_config.json", TINY_GENERATION);
        fixture
    }

    /// A complete directory whose single `model.safetensors` holds `tensors`.
    fn with_tensors(tensors: &Tensors) -> Self {
        let fixture = Self::configs_only();
        write_safetensors(&fixture.file("model.safetensors"), tensors);
        fixture
    }

    /// A complete, valid F32 directory.
    fn valid() -> Self {
        Self::with_tensors(&checkpoint(Dtype::F32))
    }

    /// A directory whose tensors are spread over two shards plus `model.safetensors.index.json`.
    fn sharded(tensors: &Tensors) -> Self {
        let fixture = Self::configs_only();
        let shard_names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"];
        let mut shards = [Tensors::new(), Tensors::new()];
        let mut weight_map = serde_json::Map::new();
        for (i, (name, tensor)) in tensors.iter().enumerate() {
            shards[i % 2].insert(name.clone(), tensor.clone());
            weight_map.insert(name.clone(), shard_names[i % 2].into());
        }
        for (shard, name) in shards.iter().zip(shard_names) {
            write_safetensors(&fixture.file(name), shard);
        }
        let index = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": weight_map});
        fixture.write("model.safetensors.index.json", index.to_string());
        fixture
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn file(&self, name: &str) -> PathBuf {
        self.path().join(name)
    }

    fn write(&self, name: &str, contents: impl AsRef<[u8]>) {
        std::fs::write(self.file(name), contents).expect("write fixture file");
    }

    fn read(&self, name: &str) -> Vec<u8> {
        std::fs::read(self.file(name)).expect("read fixture file")
    }

    fn remove(&self, name: &str) {
        std::fs::remove_file(self.file(name)).expect("remove fixture file");
    }

    /// Replaces `name` by the result of `edit` on its bytes.
    fn edit(&self, name: &str, edit: impl FnOnce(&mut Vec<u8>)) {
        let mut bytes = self.read(name);
        edit(&mut bytes);
        self.write(name, bytes);
    }

    /// Opens the directory and converts the weights, as a user of the crate would.
    fn load(&self) -> Result<Weights> {
        ModelDir::open(self.path())?.load_weights()
    }
}

/// The JSON header length stored in the first 8 bytes of a safetensors file.
fn header_len(bytes: &[u8]) -> usize {
    u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize
}

/// Asserts `result` is an error whose message contains every one of `needles`; returns the message.
#[track_caller]
fn assert_err<T>(result: Result<T>, needles: &[&str]) -> String {
    let message = match result {
        Ok(_) => panic!("expected an error mentioning {needles:?}, got Ok"),
        Err(e) => e.to_string(),
    };
    for needle in needles {
        assert!(message.contains(needle), "error {message:?} does not mention {needle:?}");
    }
    message
}

/// Asserts a fixture whose checkpoint holds `tensors` fails to load, naming `needles`.
#[track_caller]
fn assert_tensors_rejected(tensors: &Tensors, needles: &[&str]) -> String {
    assert_err(ModelFixture::with_tensors(tensors).load(), needles)
}

const PER_EXPERT_SCALE: &str = "model.decoder.layers.1.router.per_expert_scale";
const ENCODER_SCALAR: &str = "model.encoder.language_model.layers.0.layer_scalar";
const Q_PROJ: &str = "model.decoder.layers.0.self_attn.q_proj.weight";

// ---------------------------------------------------------------------------------------------
// Broken directories and config files
// ---------------------------------------------------------------------------------------------

#[test]
fn missing_directory() {
    let fixture = ModelFixture::valid();
    let missing = fixture.file("no-such-model");
    assert_err(ModelDir::open(&missing), &["no-such-model", "not found"]);
}

#[test]
fn missing_config_json() {
    let fixture = ModelFixture::valid();
    fixture.remove("config.json");
    assert_err(fixture.load(), &["config.json", "cannot read"]);
}

#[test]
fn truncated_config_json() {
    let fixture = ModelFixture::valid();
    fixture.write("config.json", &TINY_CONFIG[..TINY_CONFIG.len() / 2]);
    assert_err(fixture.load(), &["config.json", "malformed JSON"]);
}

#[test]
fn unknown_model_type() {
    let fixture = ModelFixture::valid();
    fixture.write("config.json", TINY_CONFIG.replacen("\"diffusion_gemma\"", "\"gemma4\"", 1));
    assert_err(fixture.load(), &["config.json", "model_type", "gemma4"]);

    fixture.write("config.json", TINY_CONFIG.replace("diffusion_gemma_text", "gemma4_text"));
    assert_err(fixture.load(), &["config.json", "model_type", "gemma4_text"]);
}

#[test]
fn config_field_of_wrong_type_names_the_field() {
    let fixture = ModelFixture::valid();
    fixture.write("config.json", TINY_CONFIG.replace("\"hidden_size\": 12", "\"hidden_size\": \"12\""));
    let message = assert_err(fixture.load(), &["config.json", "malformed JSON"]);
    assert!(message.contains("line") || message.contains("column"), "{message}");
}

/// [`TINY_CONFIG`] with `fields` replacing those of its `text_config`.
fn tiny_config_with(fields: serde_json::Value) -> String {
    let mut config: serde_json::Value = serde_json::from_str(TINY_CONFIG).unwrap();
    for (key, value) in fields.as_object().expect("fields are an object") {
        config["text_config"][key] = value.clone();
    }
    config.to_string()
}

/// Regression: these configs made `ModelConfig` allocate per-layer tables of 10^11 entries
/// (process abort) or overflow in `num_parameters` / `tensor_manifest` (panic).
#[test]
fn absurd_sizes_in_config_json() {
    let fixture = ModelFixture::valid();
    fixture.write("config.json", tiny_config_with(serde_json::json!({"num_hidden_layers": 100_000_000_000_u64, "layer_types": null})));
    assert_err(fixture.load(), &["config.json", "num_hidden_layers", "100000000000"]);

    for fields in [
        serde_json::json!({"num_attention_heads": 1_u64 << 32, "num_key_value_heads": 1, "num_global_key_value_heads": 1,
            "head_dim": 1_u64 << 32, "global_head_dim": 1_u64 << 32}),
        serde_json::json!({"hidden_size": 1_u64 << 40, "vocab_size": u32::MAX}),
        serde_json::json!({"num_experts": 1_u64 << 32, "moe_intermediate_size": 1_u64 << 32}),
    ] {
        fixture.write("config.json", tiny_config_with(fields));
        assert_err(fixture.load(), &["config.json", "text_config", "overflow"]);
    }
}

#[test]
fn out_of_range_eos_in_config_json() {
    let fixture = ModelFixture::valid();
    fixture.write("config.json", TINY_CONFIG.replace("[1, 6]", "[1, 32]"));
    assert_err(fixture.load(), &["config.json", "eos_token_id", "32"]);
}

#[test]
fn malformed_generation_config() {
    let fixture = ModelFixture::valid();
    fixture.write("generation_config.json", &TINY_GENERATION[..TINY_GENERATION.len() - 3]);
    assert_err(fixture.load(), &["generation_config.json", "malformed JSON"]);

    // Sampling keys the reference rejects are rejected here too.
    fixture.write("generation_config.json", r#"{"top_k": 5}"#);
    assert_err(fixture.load(), &["generation_config.json", "top_k"]);
}

#[test]
fn generation_config_with_t_min_above_t_max() {
    let fixture = ModelFixture::valid();
    fixture.write("generation_config.json", TINY_GENERATION.replace("\"t_min\": 0.4", "\"t_min\": 0.9"));
    let dir = ModelDir::open(fixture.path()).expect("the raw file parses");
    assert_err(dir.generation_config(), &["generation_config.json", "t_min", "t_max"]);
}

#[test]
fn generation_config_with_out_of_range_eos() {
    let fixture = ModelFixture::valid();
    fixture.write("generation_config.json", TINY_GENERATION.replace("[1, 6, 5]", "[1, 6, 99999]"));
    let dir = ModelDir::open(fixture.path()).expect("the raw file parses");
    assert_err(dir.generation_config(), &["generation_config.json", "eos_token_id", "99999"]);

    fixture.write("generation_config.json", TINY_GENERATION.replace("\"pad_token_id\": 0", "\"pad_token_id\": 32"));
    let dir = ModelDir::open(fixture.path()).expect("the raw file parses");
    assert_err(dir.generation_config(), &["generation_config.json", "pad_token_id", "32"]);

    fixture.write("generation_config.json", TINY_GENERATION.replace("[1, 6, 5]", "-1"));
    assert_err(fixture.load(), &["generation_config.json", "malformed JSON"]);
}

// ---------------------------------------------------------------------------------------------
// Broken tensors
// ---------------------------------------------------------------------------------------------

#[test]
fn missing_text_tensor() {
    let mut tensors = checkpoint(Dtype::F32);
    tensors.remove(PER_EXPERT_SCALE).expect("manifest lists it");
    assert_tensors_rejected(&tensors, &["model.safetensors", PER_EXPERT_SCALE, "not found"]);
}

#[test]
fn missing_encoder_layer_scalar() {
    let mut tensors = checkpoint(Dtype::F32);
    tensors.remove(ENCODER_SCALAR).expect("manifest lists it");
    assert_tensors_rejected(&tensors, &["model.safetensors", ENCODER_SCALAR, "not found"]);
}

#[test]
fn transposed_weight_is_a_shape_mismatch() {
    let mut tensors = checkpoint(Dtype::F32);
    let q = tensors.get_mut(Q_PROJ).expect("manifest lists it");
    assert_eq!(q.shape, [8, 12]);
    q.shape.reverse();
    assert_tensors_rejected(&tensors, &["model.safetensors", Q_PROJ, "[12, 8]", "[8, 12]"]);
}

#[test]
fn unsupported_dtypes_are_rejected() {
    for (dtype, label) in [(Dtype::I32, "I32"), (Dtype::F64, "F64"), (Dtype::I64, "I64")] {
        let mut tensors = checkpoint(Dtype::F32);
        let shape = tensors[Q_PROJ].shape.clone();
        let count = shape.iter().product();
        tensors.insert(Q_PROJ.into(), RawTensor::new(dtype, &shape, &vec![1.0; count]));
        assert_tensors_rejected(&tensors, &["model.safetensors", Q_PROJ, "unsupported dtype", label]);
    }
}

#[test]
fn safetensors_truncated_in_data_section() {
    let fixture = ModelFixture::valid();
    fixture.edit("model.safetensors", |bytes| {
        let data_start = 8 + header_len(bytes);
        bytes.truncate(data_start + (bytes.len() - data_start) / 2);
    });
    assert_err(fixture.load(), &["model.safetensors", "truncated"]);
}

#[test]
fn safetensors_padded_after_data_section() {
    let fixture = ModelFixture::valid();
    fixture.edit("model.safetensors", |bytes| bytes.extend_from_slice(&[0; 16]));
    assert_err(fixture.load(), &["model.safetensors", "padded"]);
}

#[test]
fn safetensors_truncated_inside_header() {
    let fixture = ModelFixture::valid();
    fixture.edit("model.safetensors", |bytes| {
        let cut = 8 + header_len(bytes) / 2;
        bytes.truncate(cut);
    });
    assert_err(fixture.load(), &["model.safetensors", "header length"]);
}

#[test]
fn safetensors_header_length_past_eof() {
    let fixture = ModelFixture::valid();
    let file_len = fixture.read("model.safetensors").len() as u64;
    fixture.edit("model.safetensors", |bytes| bytes[..8].copy_from_slice(&file_len.to_le_bytes()));
    assert_err(fixture.load(), &["model.safetensors", "past the end"]);

    fixture.edit("model.safetensors", |bytes| bytes[..8].copy_from_slice(&u64::MAX.to_le_bytes()));
    assert_err(fixture.load(), &["model.safetensors", "header too large"]);
}

#[test]
fn safetensors_header_that_is_not_json() {
    let fixture = ModelFixture::valid();
    fixture.edit("model.safetensors", |bytes| bytes[8] = b'[');
    assert_err(fixture.load(), &["model.safetensors", "header"]);
}

#[test]
fn safetensors_shorter_than_8_bytes() {
    let fixture = ModelFixture::valid();
    let original = fixture.read("model.safetensors");
    for len in [0, 5, 7] {
        fixture.write("model.safetensors", &original[..len]);
        assert_err(fixture.load(), &["model.safetensors", &format!("{len} bytes long")]);
    }
}

#[test]
fn missing_checkpoint() {
    let fixture = ModelFixture::configs_only();
    assert_err(fixture.load(), &["model.safetensors", "neither"]);
}

#[test]
fn shard_index_naming_a_missing_shard() {
    let fixture = ModelFixture::sharded(&checkpoint(Dtype::F32));
    fixture.remove("model-00002-of-00002.safetensors");
    let message = assert_err(fixture.load(), &["model.safetensors.index.json", "model-00002-of-00002.safetensors", "missing"]);
    // The error names one of the tensors the index maps to the missing shard.
    assert!(message.contains("tensor \"model."), "{message}");
}

#[test]
fn shard_index_naming_a_shard_without_the_tensor() {
    let tensors = checkpoint(Dtype::F32);
    let fixture = ModelFixture::sharded(&tensors);
    // Point one tensor at the shard that does not hold it.
    let index = String::from_utf8(fixture.read("model.safetensors.index.json")).unwrap();
    let mut index: serde_json::Value = serde_json::from_str(&index).unwrap();
    let entry = &mut index["weight_map"][PER_EXPERT_SCALE];
    let other = match entry.as_str().unwrap() {
        "model-00001-of-00002.safetensors" => "model-00002-of-00002.safetensors",
        _ => "model-00001-of-00002.safetensors",
    };
    *entry = other.into();
    fixture.write("model.safetensors.index.json", index.to_string());

    assert_err(fixture.load(), &[other, PER_EXPERT_SCALE, "not found"]);
    let checkpoint = Checkpoint::open_dir(fixture.path()).unwrap();
    assert!(checkpoint.contains(PER_EXPERT_SCALE), "the index lists it");
    assert_err(checkpoint.shape(PER_EXPERT_SCALE), &[other, PER_EXPERT_SCALE, "not found"]);
}

#[test]
fn malformed_shard_index() {
    let fixture = ModelFixture::sharded(&checkpoint(Dtype::F32));
    fixture.write("model.safetensors.index.json", r#"{"metadata": {}}"#);
    assert_err(fixture.load(), &["model.safetensors.index.json", "weight_map"]);
}

// ---------------------------------------------------------------------------------------------
// Valid directories
// ---------------------------------------------------------------------------------------------

#[test]
fn valid_directory_loads() {
    let fixture = ModelFixture::valid();
    let dir = ModelDir::open(fixture.path()).unwrap();
    assert_eq!(dir.config, tiny_config());
    assert_eq!(dir.checkpoint.names().count(), tensor_manifest(&dir.config.text).len());
    assert_eq!(dir.checkpoint.shape(Q_PROJ).unwrap(), (vec![8, 12], "F32".to_string()));

    let weights = dir.load_weights().unwrap();
    assert_eq!(weights, Weights::random(&dir.config.text, SEED).unwrap(), "F32 values load bit-exact");
    assert_eq!(weights.layers.len(), 2);
    assert_eq!(weights.layers[0].kind, LayerKind::Sliding);
    assert!(weights.layers[0].v_proj.is_some());
    assert_eq!(weights.layers[1].kind, LayerKind::Full);
    assert!(weights.layers[1].v_proj.is_none());

    let generation = dir.generation_config().unwrap();
    assert_eq!(generation.eos_token_ids, [1, 6, 5]);
    assert_eq!(generation.max_denoising_steps, 5);
    assert_eq!(generation.new_canvases(3, dir.config.canvas_length), 2);
}

#[test]
fn directory_without_generation_config_uses_defaults() {
    let fixture = ModelFixture::valid();
    fixture.remove("generation_config.json");
    let dir = ModelDir::open(fixture.path()).unwrap();
    let generation = dir.generation_config().unwrap();
    assert_eq!(generation.max_denoising_steps, 48);
    assert_eq!(generation.eos_token_ids, [1, 6], "falls back to config.json's eos_token_id");
}

#[test]
fn half_precision_checkpoints_load_as_exact_upcasts() {
    let f32_weights = expected_weights(Dtype::F32);
    for dtype in [Dtype::BF16, Dtype::F16] {
        let fixture = ModelFixture::with_tensors(&checkpoint(dtype));
        let weights = fixture.load().unwrap();
        assert_eq!(weights, expected_weights(dtype), "{dtype:?}");
        assert_ne!(weights, f32_weights, "{dtype:?} rounding must be visible in the test data");
    }
}

#[test]
fn mixed_dtype_checkpoint_loads() {
    let mut tensors = checkpoint(Dtype::F32);
    let bf16_tensors = checkpoint(Dtype::BF16);
    tensors.insert(Q_PROJ.into(), bf16_tensors[Q_PROJ].clone());
    let weights = ModelFixture::with_tensors(&tensors).load().unwrap();
    let expected = expected_weights(Dtype::BF16).layers[0].q_proj.clone();
    assert_eq!(weights.layers[0].q_proj, expected);
    assert_eq!(weights.layers[0].k_proj, expected_weights(Dtype::F32).layers[0].k_proj);
}

#[test]
fn sharded_checkpoint_loads_like_a_single_file() {
    let tensors = checkpoint(Dtype::BF16);
    let sharded = ModelFixture::sharded(&tensors).load().unwrap();
    let single = ModelFixture::with_tensors(&tensors).load().unwrap();
    assert_eq!(sharded, single);
    assert_eq!(sharded, expected_weights(Dtype::BF16));
}

#[test]
fn vision_tower_tensors_are_ignored() {
    let mut tensors = checkpoint(Dtype::BF16);
    let extra = [
        ("model.encoder.vision_tower.encoder.layers.0.self_attn.q_proj.weight", vec![6, 6]),
        ("model.encoder.vision_tower.patch_embedder.input_proj.weight", vec![6, 12]),
        ("model.encoder.vision_tower.std_bias", vec![6]),
        ("model.encoder.embed_vision.embedding_projection.weight", vec![12, 6]),
    ];
    for (name, shape) in &extra {
        let count = shape.iter().product();
        tensors.insert(name.to_string(), RawTensor::new(Dtype::BF16, shape, &vec![0.5; count]));
    }
    let fixture = ModelFixture::with_tensors(&tensors);
    let dir = ModelDir::open(fixture.path()).unwrap();
    assert!(dir.checkpoint.contains(extra[0].0));
    assert_eq!(dir.load_weights().unwrap(), expected_weights(Dtype::BF16));
}

#[test]
fn safetensors_file_reads_integer_and_float_tensors() {
    let fixture = ModelFixture::configs_only();
    let path = fixture.file("mixed.safetensors");
    let tensors: Tensors = [
        ("ids".to_string(), RawTensor::new(Dtype::I64, &[3], &[1.0, -2.0, 300.0])),
        ("ids32".to_string(), RawTensor::new(Dtype::I32, &[2], &[7.0, -8.0])),
        ("x".to_string(), RawTensor::new(Dtype::BF16, &[2], &[0.1, -3.0])),
    ]
    .into_iter()
    .collect();
    write_safetensors(&path, &tensors);
    let file = SafetensorsFile::open(&path).unwrap();
    assert_eq!(file.tensor_i64("ids").unwrap(), (vec![3], vec![1, -2, 300]));
    assert_eq!(file.tensor_i64("ids32").unwrap(), (vec![2], vec![7, -8]));
    assert_eq!(file.tensor_f32("x").unwrap().data, [upcast(Dtype::BF16, 0.1), -3.0]);
    assert_err(file.tensor_i64("x"), &["mixed.safetensors", "\"x\"", "BF16"]);
    assert_err(file.tensor_f32("ids"), &["mixed.safetensors", "\"ids\"", "I64"]);
    assert_err(file.tensor_f32("nope"), &["mixed.safetensors", "\"nope\"", "not found"]);
}

// ---------------------------------------------------------------------------------------------
// Random weights and the real geometry
// ---------------------------------------------------------------------------------------------

#[test]
fn random_weights_are_deterministic_and_seed_dependent() {
    let cfg = tiny_config().text;
    let a = Weights::random(&cfg, 1).unwrap();
    assert_eq!(a, Weights::random(&cfg, 1).unwrap());
    let b = Weights::random(&cfg, 2).unwrap();
    assert_ne!(a.embed.data, b.embed.data);
    assert_ne!(a.layers[1].experts.gate_up, b.layers[1].experts.gate_up);
    assert_ne!(a.layers[0].decoder_scalar, b.layers[0].decoder_scalar);
    // Different tensors of one seed are not copies of each other.
    assert_ne!(a.layers[0].mlp_gate.data, a.layers[0].mlp_up.data);
}

#[test]
fn random_weights_have_the_manifest_shapes() {
    let cfg = tiny_config().text;
    let recorder = Recorder::default();
    let weights = Weights::build(&recorder, &cfg).unwrap();
    let mut requested = recorder.requests.into_inner();
    let mut manifest = tensor_manifest(&cfg);
    requested.sort();
    manifest.sort();
    assert_eq!(requested, manifest);

    let (h, e, ie) = (cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size);
    assert_eq!((weights.embed.rows, weights.embed.cols), (cfg.vocab_size, h));
    assert_eq!(weights.embed.data.len(), cfg.vocab_size * h);
    for (layer, spec) in weights.layers.iter().zip(&cfg.layers) {
        let q = cfg.num_attention_heads * spec.head_dim;
        assert_eq!((layer.q_proj.rows, layer.q_proj.cols), (q, h));
        assert_eq!((layer.o_proj.rows, layer.o_proj.cols), (h, q));
        assert_eq!(layer.k_proj.rows, spec.num_kv_heads * spec.head_dim);
        assert_eq!(layer.q_norm.len(), spec.head_dim);
        assert_eq!(layer.experts.gate_up.len(), e * 2 * ie * h);
        assert_eq!(layer.experts.down.len(), e * h * ie);
        assert_eq!(layer.v_proj.is_some(), spec.kind == LayerKind::Sliding);
    }
}

/// `RandomWeights` with every tensor of rank ≥ 2 rounded by the function (what
/// `Weights::round_matrices_to_*` must give) and the others (norms, scales, scalars) left as f32.
struct MatricesRounded(fn(f32) -> f32);

impl TensorSource for MatricesRounded {
    fn stored(&self, name: &str, shape: &[usize]) -> Result<StoredTensor<'_>> {
        let values = RandomWeights { seed: SEED }.get(name, shape)?;
        let values = if shape.len() >= 2 { values.into_iter().map(self.0).collect() } else { values };
        Ok(StoredTensor::from_f32(shape.to_vec(), values))
    }
}

/// `round_matrices` on random weights equals rounding exactly their tensors of rank ≥ 2 by `round`.
fn check_matrix_rounding(name: &str, round_matrices: fn(&mut Weights), round: fn(f32) -> f32) {
    let cfg = tiny_config().text;
    let f32_weights = Weights::build(&RandomWeights { seed: SEED }, &cfg).unwrap();
    let mut rounded = f32_weights.clone();
    round_matrices(&mut rounded);
    assert_eq!(rounded, Weights::build(&MatricesRounded(round), &cfg).unwrap(), "{name}");
    assert_ne!(rounded, f32_weights, "{name}: nothing was rounded");
}

#[test]
fn rounding_the_matrices_rounds_every_matrix_and_nothing_else() {
    check_matrix_rounding("bf16", Weights::round_matrices_to_bf16, |v| bf16::from_f32(v).to_f32());
    check_matrix_rounding("f16", Weights::round_matrices_to_f16, |v| f16::from_f32(v).to_f32());
}

#[test]
fn real_config_parameter_count_and_manifest() {
    let config = ModelConfig::from_json_str(REAL_CONFIG, Path::new("config.json")).unwrap();
    let text = &config.text;
    assert_eq!(text.num_parameters(), 25_250_986_752, "spec §2.4");
    assert_eq!(config.canvas_length, 256);
    assert_eq!(config.eos_token_ids, [1, 106]);
    assert_eq!(config.image_token_id, Some(258_880));
    // The vision tower's parameters are the measured total_parameters less the text's (spec §2.4);
    // the manifest also lists std_bias and std_scale, buffers of 1152 each.
    let vision = config.vision.as_ref().expect("the real config has a vision tower");
    let vision_elements: usize = vision_manifest(vision, text.hidden_size).iter().map(|(_, s)| s.iter().product::<usize>()).sum();
    assert_eq!(vision_elements, 25_823_778_864 - 25_250_986_752 + 2 * 1152);
    assert!(config.images_bidirectional);

    let manifest = tensor_manifest(text);
    let decoder: Vec<_> = manifest.iter().filter(|(n, _)| n.starts_with("model.decoder.")).collect();
    let encoder: Vec<_> = manifest.iter().filter(|(n, _)| n.starts_with("model.encoder.")).collect();
    assert_eq!(decoder.len(), 661, "spec §2.2");
    assert_eq!(encoder.len(), 30);
    assert_eq!(manifest.len(), 691);
    assert!(
        encoder.iter().all(|(n, s)| n.starts_with("model.encoder.language_model.layers.") && n.ends_with(".layer_scalar") && s == &[1])
    );
    let count = |suffix: &str| decoder.iter().filter(|(n, _)| n.ends_with(suffix)).count();
    assert_eq!(count(".layer_scalar"), 30);
    assert_eq!(count(".v_proj.weight"), 25);
    assert_eq!(count("self_conditioning.pre_norm.weight"), 1);
    assert_eq!(decoder.iter().filter(|(n, _)| n.contains(".self_conditioning.")).count(), 4);

    let mut names: Vec<_> = manifest.iter().map(|(n, _)| n).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), manifest.len(), "names are unique");

    // Element count of the manifest = parameters + the 60 layer scalars.
    let elements: u64 = manifest.iter().map(|(_, s)| s.iter().product::<usize>() as u64).sum();
    assert_eq!(elements, text.num_parameters() + 60);

    let shape = |name: &str| &manifest.iter().find(|(n, _)| n == name).unwrap().1;
    assert_eq!(shape("model.decoder.embed_tokens.weight"), &[262_144, 2816]);
    assert_eq!(shape("model.decoder.layers.5.self_attn.q_proj.weight"), &[8192, 2816]);
    assert_eq!(shape("model.decoder.layers.5.self_attn.k_proj.weight"), &[1024, 2816]);
    assert_eq!(shape("model.decoder.layers.0.self_attn.o_proj.weight"), &[2816, 4096]);
    assert_eq!(shape("model.decoder.layers.29.experts.gate_up_proj"), &[128, 1408, 2816]);
    assert_eq!(shape("model.decoder.layers.29.experts.down_proj"), &[128, 2816, 704]);
}

/// In-memory weights serve every manifest tensor by its HF name: building weights from them gives
/// them back (a swapped name, e.g. gate for up, would break the equality: their values differ).
#[test]
fn in_memory_weights_serve_every_tensor_by_name() {
    let cfg = tiny_config().text;
    let weights = Weights::random(&cfg, SEED).unwrap();
    assert_eq!(Weights::build(&weights, &cfg).unwrap(), weights);
    let t = weights.stored("model.decoder.layers.0.self_attn.q_norm.weight", &[cfg.layers[0].head_dim]).unwrap();
    assert_eq!(t.dtype, StoredDtype::F32);
    assert_err(weights.stored("model.decoder.layers.0.nope", &[1]), &["\"model.decoder.layers.0.nope\"", "not found"]);
    assert_err(weights.stored("model.decoder.norm.weight", &[cfg.hidden_size + 1]), &["model.decoder.norm.weight", "shape"]);
}

/// A checkpoint hands out its tensors as stored: BF16 bytes stay BF16, borrowed from the file.
#[test]
fn checkpoint_tensors_come_as_stored() {
    let fixture = ModelFixture::with_tensors(&checkpoint(Dtype::BF16));
    let model = ModelDir::open(fixture.path()).unwrap();
    let name = "model.decoder.embed_tokens.weight";
    let shape = [model.config.text.vocab_size, model.config.text.hidden_size];
    let t = model.checkpoint.stored(name, &shape).unwrap();
    assert_eq!((t.dtype, t.byte_len()), (StoredDtype::BF16, shape[0] * shape[1] * 2));
    assert_eq!(t.to_f32(), model.checkpoint.tensor(name, &shape).unwrap());
    assert_err(model.checkpoint.stored(name, &[1, 2]), &[name, "shape"]);
}

#[test]
fn vision_config_problems_name_the_field() {
    for (vision, needle) in [
        (r#"{"num_attention_heads": 16}"#, "num_attention_heads 16 is not a multiple of num_key_value_heads 12"),
        (r#"{"use_clipped_linears": true}"#, "use_clipped_linears"),
        (r#"{"head_dim": 70}"#, "head_dim 70"),
        (r#"{"hidden_activation": "relu"}"#, "relu"),
        (r#"{"model_type": "siglip_vision_model"}"#, "siglip_vision_model"),
    ] {
        let json = format!(
            r#"{{"model_type":"diffusion_gemma","text_config":{{"num_experts":4,"top_k_experts":2,"moe_intermediate_size":8}},"vision_config":{vision}}}"#
        );
        let err = ModelConfig::from_json_str(&json, Path::new("config.json")).unwrap_err().to_string();
        assert!(err.contains(needle), "{vision}: {err}");
    }
}

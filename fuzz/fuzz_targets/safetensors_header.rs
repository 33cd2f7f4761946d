//! Fuzzes safetensors parsing: arbitrary bytes are written to a file, opened with
//! `SafetensorsFile::open`, and every tensor it lists is read as f32 and as i64, through the file
//! and through a `Checkpoint`. Errors are fine; panics are not.

#![no_main]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use dg_model::{Checkpoint, ModelConfig, SafetensorsFile, Weights};
use libfuzzer_sys::fuzz_target;
use tempfile::TempDir;

/// A tiny valid config: loading weights from the fuzzed file must fail cleanly (or succeed).
const TINY_CONFIG: &str = r#"{"model_type":"diffusion_gemma","text_config":{"vocab_size":4,"hidden_size":2,
  "intermediate_size":2,"num_hidden_layers":1,"num_attention_heads":1,"num_key_value_heads":1,"head_dim":2,
  "global_head_dim":2,"num_experts":1,"top_k_experts":1,"moe_intermediate_size":1}}"#;

/// One scratch directory per fuzzing process, removed when the process exits normally.
fn scratch() -> &'static (TempDir, PathBuf) {
    static SCRATCH: OnceLock<(TempDir, PathBuf)> = OnceLock::new();
    SCRATCH.get_or_init(|| {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("model.safetensors");
        (dir, file)
    })
}

fuzz_target!(|data: &[u8]| {
    let (dir, path) = scratch();
    std::fs::write(path, data).expect("write scratch file");
    let Ok(file) = SafetensorsFile::open(path) else { return };
    for name in file.names() {
        let (shape, _dtype) = file.shape(&name).expect("listed names have a shape");
        if let Ok(tensor) = file.tensor_f32(&name) {
            assert_eq!(tensor.shape, shape);
            assert_eq!(tensor.data.len(), shape.iter().product::<usize>());
        }
        if let Ok((int_shape, values)) = file.tensor_i64(&name) {
            assert_eq!(int_shape, shape);
            assert_eq!(values.len(), shape.iter().product::<usize>());
        }
    }
    exercise_checkpoint(dir.path(), file);
});

fn exercise_checkpoint(dir: &Path, file: SafetensorsFile) {
    let names = file.names();
    let Ok(checkpoint) = Checkpoint::from_files(dir, vec![file]) else {
        return;
    };
    for name in &names {
        assert!(checkpoint.contains(name));
        if let Ok((shape, _)) = checkpoint.shape(name) {
            let _ = checkpoint.tensor(name, &shape);
        }
    }
    let config = ModelConfig::from_json_str(TINY_CONFIG, Path::new("config.json")).expect("tiny config is valid");
    let _ = Weights::from_checkpoint(&checkpoint, &config.text);
}

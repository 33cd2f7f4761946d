//! Fuzzes GGUF parsing: arbitrary bytes are parsed as a GGUF file (`GgufFile::from_vec`, the same
//! parser `GgufFile::open` runs on the memory map); then every metadata value is decoded, the
//! geometry and sampler settings are read, every tensor is borrowed as stored (and widened when it
//! is a float type), and, when the file's own geometry resolves, the weights are assembled from it
//! through a `Checkpoint`. Errors are fine; panics are not.

#![no_main]

use std::path::Path;

use dg_model::gguf::GgufFile;
use dg_model::{Checkpoint, Weights};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(file) = GgufFile::from_vec(data.to_vec(), Path::new("fuzz.gguf")) else { return };
    let keys: Vec<String> = file.keys().map(str::to_string).collect();
    for key in &keys {
        assert!(file.meta(key).is_some(), "listed key {key:?} decodes");
    }
    let _ = file.generation_config();
    let _ = file.first_unknown();
    let mut quantized = false;
    for t in file.tensors() {
        let stored = file.stored_gguf(t);
        assert_eq!(stored.shape, t.shape());
        assert_eq!(stored.bytes().len(), t.bytes.len());
        if t.dtype.is_quantized() {
            quantized = true;
        } else {
            assert_eq!(stored.to_f32().len(), t.dims.iter().product::<usize>());
        }
    }
    let Ok(config) = file.model_config() else { return };
    let _ = dg_model::tensor_manifest(&config.text);
    // Quantized tensors widen through the block formats; only float files are assembled here.
    if !quantized {
        let _ = Weights::build(&Checkpoint::from_gguf(file), &config.text);
    }
});

//! The committed GGUF fixtures (`fixtures/gguf-*`, made by the oracle's `gguf_fixture`) open as
//! model directories whose weights are `model.gguf`, and store every tensor in the type their
//! quantization scheme gives it: a change of [`Scheme::dtype_of`] without regenerating them fails
//! here, not as a puzzling parity difference.

use std::collections::BTreeSet;
use std::path::Path;

use dg_model::{ModelDir, Scheme, StoredDtype, tensor_manifest};

/// Fixture, its scheme, the type of the tensors the scheme keeps, and every type the file holds.
const FIXTURES: [(&str, Scheme, StoredDtype, &[StoredDtype]); 3] = [
    ("gguf-q8_0", Scheme::Q8_0, StoredDtype::F32, &[StoredDtype::F32, StoredDtype::Q8_0]),
    ("gguf-q4_k_m", Scheme::Q4KM, StoredDtype::BF16, &[StoredDtype::BF16, StoredDtype::Q4_K, StoredDtype::Q5_0, StoredDtype::Q8_0]),
    ("gguf-q4_k_m-k256", Scheme::Q4KM, StoredDtype::BF16, &[StoredDtype::BF16, StoredDtype::Q4_K, StoredDtype::Q6_K, StoredDtype::Q8_0]),
];

#[test]
fn gguf_fixtures_store_their_schemes_types() {
    for (name, scheme, kept, types) in FIXTURES {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures").join(name);
        assert!(!dir.join("model.safetensors").exists(), "{name}: the weights must be model.gguf only");
        let model = ModelDir::open(&dir).unwrap();
        let file = model.checkpoint.gguf().unwrap_or_else(|| panic!("{name} did not open as GGUF"));
        let mut seen = BTreeSet::new();
        for (hf, shape) in tensor_manifest(&model.config.text) {
            let t = file.find_hf(&hf).unwrap();
            let want = scheme.dtype_of(&model.config.text, &hf).unwrap_or(kept);
            assert_eq!(t.dtype, want, "{name}: {hf}");
            assert_eq!(t.shape(), shape, "{name}: {hf}");
            seen.insert(t.dtype.name());
        }
        assert_eq!(seen, types.iter().map(|d| d.name()).collect(), "{name}");
    }
}

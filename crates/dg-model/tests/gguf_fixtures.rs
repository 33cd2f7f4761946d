//! The committed GGUF fixtures (`fixtures/gguf-*`, made by the oracle's `gguf_fixture`) open as
//! model directories whose weights are `model.gguf`, and store every tensor in the type their
//! quantization scheme gives it: a change of [`Scheme::dtype_of`] without regenerating them fails
//! here, not as a puzzling parity difference. The family fixtures (`gguf-q2_k`, `gguf-legacy`,
//! `gguf-iq`, `gguf-fp4`) cover every ggml type dg reads but F16; the tensors their presets write in
//! other types are listed here too.

use std::collections::BTreeSet;
use std::path::Path;

use dg_model::{ModelDir, Scheme, StoredDtype, tensor_manifest};

/// A committed GGUF fixture: its scheme, the type of the tensors the scheme keeps, the tensors its
/// preset writes in other types (`gguf_tensors` in `tools/oracle/presets.py`: names under
/// `model.decoder.`), and every type the file holds.
struct Fixture {
    name: &'static str,
    scheme: Scheme,
    kept: StoredDtype,
    tensors: &'static [(&'static str, StoredDtype)],
    types: &'static [StoredDtype],
}

const FIXTURES: [Fixture; 7] = {
    use StoredDtype::*;
    [
        Fixture { name: "gguf-q8_0", scheme: Scheme::Q8_0, kept: F32, tensors: &[], types: &[F32, Q8_0] },
        Fixture { name: "gguf-q4_k_m", scheme: Scheme::Q4KM, kept: BF16, tensors: &[], types: &[BF16, Q4_K, Q5_0, Q8_0] },
        Fixture { name: "gguf-q4_k_m-k256", scheme: Scheme::Q4KM, kept: BF16, tensors: &[], types: &[BF16, Q4_K, Q6_K, Q8_0] },
        Fixture {
            name: "gguf-q2_k",
            scheme: Scheme::Q2K,
            kept: BF16,
            tensors: &[("layers.0.experts.down_proj", Q5_K)],
            types: &[BF16, Q2_K, Q3_K, Q5_K, Q8_0],
        },
        Fixture {
            name: "gguf-legacy",
            scheme: Scheme::Q2K,
            kept: F32,
            tensors: &[
                ("layers.1.experts.gate_up_proj", Q4_1),
                ("layers.1.experts.down_proj", Q4_1),
                ("layers.2.experts.gate_up_proj", Q5_1),
                ("layers.2.experts.down_proj", Q5_1),
            ],
            types: &[F32, Q4_0, Q4_1, Q5_1, Q8_0],
        },
        Fixture {
            name: "gguf-iq",
            scheme: Scheme::IQ4XS,
            kept: BF16,
            tensors: &[
                ("layers.0.experts.gate_up_proj", IQ2_XXS),
                ("layers.1.experts.gate_up_proj", IQ2_XS),
                ("layers.2.experts.gate_up_proj", IQ2_S),
                ("layers.0.mlp.gate_proj.weight", IQ3_XXS),
                ("layers.0.mlp.up_proj.weight", IQ3_XXS),
                ("layers.1.mlp.gate_proj.weight", IQ3_S),
                ("layers.1.mlp.up_proj.weight", IQ3_S),
                ("layers.2.mlp.gate_proj.weight", IQ1_S),
                ("layers.2.mlp.up_proj.weight", IQ1_S),
                ("layers.3.mlp.gate_proj.weight", IQ1_M),
                ("layers.3.mlp.up_proj.weight", IQ1_M),
            ],
            types: &[BF16, IQ1_M, IQ1_S, IQ2_S, IQ2_XS, IQ2_XXS, IQ3_S, IQ3_XXS, IQ4_NL, IQ4_XS, Q8_0],
        },
        Fixture {
            name: "gguf-fp4",
            scheme: Scheme::Q8_0,
            kept: F32,
            tensors: &[
                ("layers.0.experts.down_proj", MXFP4),
                ("layers.1.experts.down_proj", MXFP4),
                ("layers.2.experts.down_proj", MXFP4),
                ("layers.3.experts.down_proj", MXFP4),
                ("layers.0.experts.gate_up_proj", MXFP4),
                ("layers.1.experts.gate_up_proj", NVFP4),
                ("layers.2.experts.gate_up_proj", MXFP4),
                ("layers.3.experts.gate_up_proj", NVFP4),
            ],
            types: &[F32, MXFP4, NVFP4, Q8_0],
        },
    ]
};

#[test]
fn gguf_fixtures_store_their_schemes_types() {
    for Fixture { name, scheme, kept, tensors, types } in FIXTURES {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures").join(name);
        assert!(!dir.join("model.safetensors").exists(), "{name}: the weights must be model.gguf only");
        let model = ModelDir::open(&dir).unwrap();
        let file = model.checkpoint.gguf().unwrap_or_else(|| panic!("{name} did not open as GGUF"));
        let mut seen = BTreeSet::new();
        for (hf, shape) in tensor_manifest(&model.config.text) {
            let t = file.find_hf(&hf).unwrap();
            let preset = tensors.iter().find(|(n, _)| hf.strip_prefix("model.decoder.") == Some(n)).map(|t| t.1);
            let want = preset.or_else(|| scheme.dtype_of(&model.config.text, &hf)).unwrap_or(kept);
            assert_eq!(t.dtype, want, "{name}: {hf}");
            assert_eq!(t.shape(), shape, "{name}: {hf}");
            seen.insert(t.dtype.name());
        }
        assert_eq!(seen, types.iter().map(|d| d.name()).collect(), "{name}");
    }
}

/// Together the GGUF fixtures hold every type dg reads but F16 (an element type, whose GGUF tensors
/// `tests/gguf.rs` round-trips): a type added to [`StoredDtype::ALL`] needs a fixture to pass parity on.
#[test]
fn the_gguf_fixtures_cover_every_type_dg_reads_but_f16() {
    let covered: BTreeSet<&str> = FIXTURES.iter().flat_map(|f| f.types.iter().map(|d| d.name())).collect();
    let all: BTreeSet<&str> = StoredDtype::ALL.iter().filter(|d| **d != StoredDtype::F16).map(|d| d.name()).collect();
    assert_eq!(covered, all);
}

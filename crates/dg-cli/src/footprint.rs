//! The device memory of a model's weights on the GPU, computed from its geometry and the ggml type
//! or dtype of each tensor, without opening a device: what `dg info` prints for a checkpoint and
//! for each quantization scheme, and for the vision tower ([`tower_bytes`]).
//!
//! The formats are dg-gpu's own rules, the ones its upload applies (`GpuWeights::upload`):
//! [`dg_gpu::matrix_format`] for each matrix (q/K/V stacked, o, the dense and self-conditioning
//! gate/up stacked and down, the router, each experts tensor: its ggml blocks where all its parts
//! store one block type, else the upload's format) and [`dg_gpu::embedding_format`] for the
//! embedding (also the tied head). What this count adds:
//! - norm weights and scales are f32, the layer scalars stay on the host;
//! - every buffer is padded to a whole 4-byte word, and an IQ type's buffer holds its grid after
//!   the blocks (`QuantFormat::table`; once per matrix: a matrix split across bindings, on a
//!   device whose bindings are smaller than it, holds it once per part, a few KiB more).
//!
//! A test (`crates/dg-cli/tests/gpu_memory.rs`) holds this count to what a `GpuModel` uploads;
//! the tower's (`dg_gpu::GpuVisionTower::load`: each linear a matrix, gate and up stacked, the
//! position table as an embedding, the standardization as an f32 `[hidden, hidden]` diagonal and
//! a row) is held to `GpuVisionTower::bytes` by dg-cli's `images` tests.

use std::collections::BTreeMap;

use dg_gpu::WeightFormat;
use dg_model::{LayerNames, Named, SharedNames, StoredDtype, TextConfig, VisionConfig, vision_manifest};

/// The GPU's bytes of a model's weights: in all, and by the format that holds them (`F32`,
/// `BF16`, `F16`, or a ggml type's name).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WeightBytes {
    pub total: u64,
    pub by_format: BTreeMap<&'static str, u64>,
}

impl WeightBytes {
    fn add(&mut self, format: WeightFormat, elements: usize) {
        let table = match format {
            WeightFormat::Quantized(q) => 4 * q.table().len(),
            _ => 0,
        };
        let bytes = (format.bytes_for(elements).unwrap_or_else(|| WeightFormat::F32.bytes() * elements).next_multiple_of(4) + table) as u64;
        self.total += bytes;
        *self.by_format.entry(format_name(format)).or_default() += bytes;
    }
}

/// `F32`, `BF16`, `F16`, or the ggml type of a block format.
pub fn format_name(format: WeightFormat) -> &'static str {
    match format {
        WeightFormat::F32 => "F32",
        WeightFormat::Bf16 => "BF16",
        WeightFormat::F16 => "F16",
        WeightFormat::Quantized(q) => q.name(),
    }
}

/// The GPU's bytes of `cfg`'s weights uploaded in `format` when each tensor is stored as
/// `dtype(name)`.
pub fn weight_bytes(cfg: &TextConfig, dtype: &dyn Fn(&str) -> StoredDtype, format: WeightFormat) -> WeightBytes {
    let mut out = WeightBytes::default();
    let elements = |t: &Named| t.shape.iter().product::<usize>();
    let matrix = |out: &mut WeightBytes, parts: &[&Named]| {
        let dtypes: Vec<StoredDtype> = parts.iter().map(|t| dtype(&t.name)).collect();
        out.add(dg_gpu::matrix_format(&dtypes, format), parts.iter().map(|t| elements(t)).sum());
    };
    let vector = |out: &mut WeightBytes, t: &Named| out.add(WeightFormat::F32, elements(t));
    let shared = SharedNames::new(cfg);
    let embed = dg_gpu::embedding_format(dtype(&shared.embed.name), format);
    out.add(embed, elements(&shared.embed));
    vector(&mut out, &shared.final_norm);
    vector(&mut out, &shared.sc_pre_norm);
    matrix(&mut out, &[&shared.sc_gate, &shared.sc_up]);
    matrix(&mut out, &[&shared.sc_down]);
    for i in 0..cfg.num_layers() {
        let l = LayerNames::new(cfg, i);
        for t in l.norms.iter().chain([&l.q_norm, &l.k_norm, &l.router_scale, &l.per_expert_scale]) {
            vector(&mut out, t);
        }
        let qkv: Vec<&Named> = [&l.q_proj, &l.k_proj].into_iter().chain(l.v_proj.as_ref()).collect();
        matrix(&mut out, &qkv);
        for parts in [&[&l.o_proj][..], &[&l.mlp_gate, &l.mlp_up], &[&l.mlp_down], &[&l.router_proj]] {
            matrix(&mut out, parts);
        }
        matrix(&mut out, &[&l.experts_gate_up]);
        matrix(&mut out, &[&l.experts_down]);
    }
    out
}

/// The GPU's bytes of the vision tower of `c` (projecting into `text_hidden`) uploaded in `format`
/// when each tensor is stored as `dtype(name)`.
pub fn tower_bytes(c: &VisionConfig, text_hidden: usize, dtype: &dyn Fn(&str) -> StoredDtype, format: WeightFormat) -> WeightBytes {
    let mut out = WeightBytes::default();
    let mut gate: Option<(String, usize)> = None;
    for (name, shape) in vision_manifest(c, text_hidden) {
        let elements: usize = shape.iter().product();
        if name.ends_with("position_embedding_table") {
            out.add(dg_gpu::embedding_format(dtype(&name), format), elements);
        } else if name.ends_with("std_bias") || name.ends_with("std_scale") {
            // Read on the host into the diagonal and the row below.
        } else if shape.len() == 1 {
            out.add(WeightFormat::F32, elements);
        } else if name.ends_with("mlp.gate_proj.linear.weight") {
            gate = Some((name, elements));
        } else if name.ends_with("mlp.up_proj.linear.weight") {
            let (gate, gate_elements) = gate.take().expect("the manifest lists each gate before its up projection");
            out.add(dg_gpu::matrix_format(&[dtype(&gate), dtype(&name)], format), gate_elements + elements);
        } else {
            out.add(dg_gpu::matrix_format(&[dtype(&name)], format), elements);
        }
    }
    out.add(WeightFormat::F32, c.hidden_size * c.hidden_size);
    out.add(WeightFormat::F32, c.hidden_size);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> TextConfig {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/tiny-random/config.json");
        dg_model::ModelConfig::from_file(&path).unwrap().text
    }

    #[test]
    fn an_unquantized_model_takes_its_formats_bytes_per_matrix_parameter_and_f32_vectors() {
        let cfg = tiny();
        let names: Vec<(String, Vec<usize>)> = dg_model::tensor_manifest(&cfg);
        let count = |pred: &dyn Fn(&[usize]) -> bool| {
            names.iter().filter(|(_, s)| pred(s)).map(|(_, s)| s.iter().product::<usize>() as u64).sum::<u64>()
        };
        // The parameter count leaves out the layer scalars ([1]), which stay on the host.
        let vectors = count(&|s| s.len() == 1 && s[0] > 1);
        let matrices = cfg.num_parameters() - vectors;
        for (format, bytes) in [(WeightFormat::F32, 4), (WeightFormat::Bf16, 2), (WeightFormat::F16, 2)] {
            let got = weight_bytes(&cfg, &|_| StoredDtype::BF16, format);
            assert_eq!(got.total, matrices * bytes + vectors * 4, "{format:?}");
        }
    }
}

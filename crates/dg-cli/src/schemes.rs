//! `dg info --schemes`: the GPU memory each quantization scheme needs at a model's geometry (a
//! model directory's, or a bare `config.json`'s with `--config`), and which graphics cards it fits.
//!
//! Per storage (the checkpoint as stored, then every [`Scheme`]): the GGUF file's bytes (each
//! tensor in the scheme's ggml type, the rest as the checkpoint stores it), the weights on a GPU
//! with tensor cores as `--weights auto` uploads them ([`crate::footprint`]: blocks the GPU reads
//! as stored stay blocks, other types are dequantized into the F16 mode's 16 bits), and the
//! caches and activations of one sequence at `--context` positions (dg-gpu's arena, with the KV
//! cache format the tensor cores pick), summed and held against 8, 12, 16 and 24 GiB cards.

use dg_gpu::WeightFormat;
use dg_model::{ModelConfig, Scheme, StoredDtype, tensor_manifest};
use serde_json::{Value, json};

use crate::footprint::{WeightBytes, weight_bytes};

/// Card sizes the table is held against, in GiB (consumer GPUs' 8, 12, 16 and 24 GB are GiB).
pub const CARDS_GIB: [u64; 4] = [8, 12, 16, 24];

/// Device memory a card does not give to dg: the driver's context, the display and the allocator's
/// slack take a few hundred MiB on a desktop GPU.
pub const HEADROOM: u64 = 512 << 20;

/// The context (positions of one sequence) the table is computed at unless `--context` says.
pub const DEFAULT_CONTEXT: usize = 4096;

/// One storage's memory.
#[derive(Debug, Clone)]
pub struct Row {
    /// `as stored` or the scheme's name.
    pub storage: String,
    pub file_bytes: u64,
    /// The types the file stores its tensors in.
    pub file_types: Vec<StoredDtype>,
    pub weights: WeightBytes,
    /// Caches and activations of one sequence on a GPU with tensor cores, and without.
    pub arena_bytes: u64,
    pub portable_arena_bytes: u64,
}

impl Row {
    pub fn total(&self) -> u64 {
        self.weights.total + self.arena_bytes
    }

    /// Whether the weights and one sequence's buffers fit a card of `gib` GiB, beside [`HEADROOM`].
    pub fn fits(&self, gib: u64) -> bool {
        self.total() + HEADROOM <= gib << 30
    }
}

/// The rows of `config` whose tensors the checkpoint stores as `stored(name)`, at `context` positions.
pub fn rows(config: &ModelConfig, stored: &dyn Fn(&str) -> StoredDtype, context: usize) -> anyhow::Result<Vec<Row>> {
    let cfg = &config.text;
    let context = context.min(cfg.max_position_embeddings);
    let cache = dg_gpu::tensor_core_cache_format(config);
    let arena = dg_gpu::arena_bytes(config, context, 1, cache, (u64::MAX, true))?;
    let portable = dg_gpu::arena_bytes(config, context, 1, WeightFormat::F32, (u64::MAX, false))?;
    let storages = std::iter::once(None).chain(Scheme::ALL.into_iter().map(Some));
    Ok(storages
        .map(|scheme| {
            let dtype = |name: &str| scheme.and_then(|s| s.dtype_of(cfg, name)).unwrap_or_else(|| stored(name));
            let file_bytes =
                tensor_manifest(cfg).iter().map(|(name, shape)| dtype(name).bytes_for(shape.iter().product()).unwrap_or(0) as u64).sum();
            let mut file_types: Vec<StoredDtype> = tensor_manifest(cfg).iter().map(|(name, _)| dtype(name)).collect();
            file_types.sort_by_key(|d| d.name());
            file_types.dedup();
            Row {
                storage: scheme.map_or("as stored".to_string(), |s| s.name().to_string()),
                file_bytes,
                file_types,
                weights: weight_bytes(cfg, &dtype, WeightFormat::F16),
                arena_bytes: arena,
                portable_arena_bytes: portable,
            }
        })
        .collect())
}

/// The rows as JSON.
pub fn json(rows: &[Row], context: usize) -> Value {
    json!({
        "context": context,
        "headroom_bytes": HEADROOM,
        "schemes": rows.iter().map(|r| json!({
            "storage": r.storage,
            "file_bytes": r.file_bytes,
            "gpu_weight_bytes": r.weights.total,
            "gpu_weight_bytes_by_format": r.weights.by_format,
            "arena_bytes": r.arena_bytes,
            "portable_arena_bytes": r.portable_arena_bytes,
            "total_bytes": r.total(),
            "fits_gib": CARDS_GIB.iter().filter(|&&g| r.fits(g)).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    })
}

fn gib(bytes: u64) -> String {
    format!("{:.2}", bytes as f64 / (1u64 << 30) as f64)
}

/// The rows as a markdown table, with what they assume.
pub fn render(rows: &[Row], context: usize) -> String {
    let cards: Vec<String> = CARDS_GIB.iter().map(|g| format!("{g} GiB")).collect();
    let mut out = format!(
        "| storage | file GiB | GPU weights GiB | + one sequence at {context} positions GiB | total GiB | {} |\n",
        cards.join(" | ")
    );
    out += &format!("|---|--:|--:|--:|--:|{}\n", ":-:|".repeat(CARDS_GIB.len()));
    for r in rows {
        let fits: Vec<&str> = CARDS_GIB.iter().map(|&g| if r.fits(g) { "yes" } else { "no" }).collect();
        out += &format!(
            "| {} | {} | {} | {} | {} | {} |\n",
            r.storage,
            gib(r.file_bytes),
            gib(r.weights.total),
            gib(r.arena_bytes),
            gib(r.total()),
            fits.join(" | ")
        );
    }
    if let Some(r) = rows.first() {
        let dequantized = dequantized_types(rows);
        let dequantized = match dequantized.is_empty() {
            true => String::new(),
            false => format!("; {} have no GPU kernels yet and are held dequantized to 16 bits", dequantized.join(", ")),
        };
        out += &format!(
            "\nGPU weights as `--weights auto` holds them on a GPU with tensor cores{dequantized}. One sequence's \
             caches and activations with the tensor cores' KV cache ({} GiB without tensor cores, f32). A card fits \
             when the total and {} MiB for the driver do.\n",
            gib(r.portable_arena_bytes),
            HEADROOM >> 20
        );
    }
    out
}

/// The ggml types of the rows' files that the GPU holds dequantized (no kernel reads their blocks).
fn dequantized_types(rows: &[Row]) -> Vec<&'static str> {
    let mut types: Vec<&'static str> = rows
        .iter()
        .flat_map(|r| r.file_types.iter().copied())
        .filter(|d| d.is_quantized() && dg_gpu::pack::quant_format(*d).is_none())
        .map(StoredDtype::name)
        .collect();
    types.sort_unstable();
    types.dedup();
    types
}

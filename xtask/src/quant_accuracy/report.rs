//! The markdown of `cargo xtask quant-accuracy`: the table (rows: model × weights), the tensors
//! each scheme quantized per model, the caveats, and the section's place in a markdown file.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};
use dg_model::StoredDtype;

use super::{Diff, Row, SECTION, Served, Variant, by_dtype, mean_entropy};

/// The whole section: heading, how it was measured, the table, the quantization map, caveats.
pub fn section(rows: &[Row], forced: &[String], command: &str) -> String {
    let mut s = String::new();
    let commit = commit().map_or_else(String::new, |c| format!(" (commit {c})"));
    let _ = writeln!(s, "{SECTION}\n");
    let _ = writeln!(s, "Measured with `{command}`{commit} on this 2-core machine.\n");
    s += INTRO;
    s += "\n\n";
    s += &table(rows);
    s += "\nTensors each scheme quantized (rank-2 and rank-3 tensors; norms and scalars always stay as stored):\n\n";
    s += &quantization_map(rows);
    s += "\nCaveats:\n\n";
    for c in CAVEATS {
        let _ = writeln!(s, "- {c}");
    }
    if forced.is_empty() {
        s += "- Adaptive stopping is on in every model's generation config; none had to be turned on.\n";
    } else {
        let _ = writeln!(s, "- Adaptive stopping was off in the generation config of {} and was turned on here.", forced.join(", "));
    }
    s
}

const INTRO: &str = "Each model runs six times in f32 on the CPU: on its weights as stored, on \
its matrices rounded to BF16 (the scale of the smallest rounding any 16-bit copy makes), on \
its weights quantized by each scheme and dequantized (bit-exact with ggml), and on each scheme's \
weights with the experts' activations quantized per 32-value block to int8 with an f32 scale \
(*int8 activations*: llama.cpp's `quantize_row_q8_1`, the numerics of the int8 tensor-core \
kernels, `DG_INT8=1`; only expert products whose K is whole 32-value blocks, as the kernels \
take them). *weights Δ*: \
‖W′−W‖/‖W‖ over the tensors the variant changed. *Logits*: the canvas forward after the prompt \
(the fixture's `prompt_ids`/`canvas_ids`; seeded random ids on random configs), plain / with a \
self-conditioning input (the fixture's `sc_logits`; on random weights the stored model's own plain \
logits). Δ is against the stored weights' logits: normwise ‖a−b‖/‖b‖ over the [C, V] logits and \
max |a−b|; *argmax agree* is the fraction of canvas rows whose argmax agrees; *vs transformers* is \
the normwise error against transformers' f32 logits on the stored weights; *row entropy* the mean \
entropy of the plain logits' rows at temperature 1, beside ln V (uniform rows). *Generation*: one \
seeded run per variant (same seed and prompt), the model's `generation_config.json` (steps, \
entropy bound, temperatures, stopping thresholds; built-in defaults on random configs) with \
adaptive stopping on and the EOS ids removed, so every run generates the same canvases; \
*tokens/forward* is generated tokens per decoder pass, *tokens agree* the fraction of generated \
positions holding the stored run's token. *bytes/param*: every text tensor as served, quantized \
ones at their ggml size, kept ones at their stored size.";

const CAVEATS: [&str; 7] = [
    "*int8 activations* quantizes the inputs of the expert products whose K is whole 32-value blocks \
     (the int8 kernels take no other): on the fixtures the experts' down projections (K 16–24) and, at \
     hidden 48, their gate/up keep f32 activations, so those rows differ from their scheme's only \
     where the hidden size is 32 or 64; cpu-medium (hidden 512, experts 256 wide) quantizes both. \
     Compare each with its scheme's row and with the BF16 row of the same model.",
    "The fixtures' hidden sizes are 32–64, so no row holds a Q4_K super-block of 256 values: q4_k_m on a \
     fixture is llama.cpp's fallback (Q5_0 where Q4_K was wanted, Q8_0 where Q6_K was), and a row \
     whose length is not a multiple of 32 (hidden 48, the experts' down projections of 16–24) holds \
     no block at all and stays as stored under both schemes (listed above): in the hidden-48 \
     fixtures the two schemes quantize the same few matrices and their rows are identical. Only \
     the random config at hidden 512 exercises Q4_K and Q6_K.",
    "Every model here has random weights, and random networks amplify any weight error layer by \
     layer: on the fixtures each variant's logits Δ is about 2 to 50 times its weights Δ, and on cpu-medium (6 layers, hidden 512) the hidden state's Δ grows about 3× per \
     layer (for the BF16 rounding: 2e-2 after the first layer, 1.1 after the sixth), so there every \
     variant, BF16 rounding included, ends with logits unrelated to the stored model's (Δ ≈ 1, \
     argmax agreement at chance). Those rows show Q4_K and Q6_K at work and their weights error, \
     not the logits error a trained model would see; whether a trained model amplifies as much is \
     not measured here. Read each scheme's row against the BF16 row of the same model rather than \
     against an absolute bar.",
    "The sampler: with random weights the mean entropy never falls below the stopping threshold, so \
     blocks run to `max_denoising_steps` in every variant (early-stop-eos, built to stop early, is \
     the exception, and its step counts move as much under BF16 rounding as under quantization), \
     and tokens/forward is then the canvas length over the step budget. These columns therefore \
     cannot show whether quantized logits cost the entropy-bound sampler its speed-up on a trained \
     model (mlx-vlm's finding for 4-bit); that needs the trained checkpoint. The row entropy says \
     how peaked the logits are: about 1 nat on the fixtures, about two thirds of ln V on the random \
     config (many of its logits sit near the final soft cap).",
    "The generations share the seed, but one different acceptance or sample changes every later \
     step's input, so *tokens agree* says how soon the trajectories part rather than how accurate \
     each token is (the BF16 row shows how little it takes); positions after the split agree only \
     by chance.",
    "*vs transformers* is on the unquantized weights: on the other rows it is the rounding or \
     quantization error (the stored row shows dg's own f32 error, about 1e-6, for scale).",
    "*bytes/param* counts kept tensors at their stored size: F32 in the f32 fixtures and the random \
     configs, BF16 in bf16-checkpoint; the embedding (kept by both schemes, it is also the tied head) \
     is a large share of these small models, so the figures lie far above the schemes' own rates \
     (Q8_0 1.06, Q6_K 0.82, Q5_0 0.69, Q4_K 0.56 bytes per value). The real model's sizes are in \
     the memory section.",
];

/// The table: one row per model and weights variant.
fn table(rows: &[Row]) -> String {
    let mut s = String::from(
        "| model | weights | quantized (share of parameters) | bytes/param | weights Δ normwise | Δ normwise (plain / sc) | max \\|Δ\\| (plain / sc) \
         | argmax agree (plain / sc) | vs transformers (plain / sc) | row entropy (nats; ln V) | steps per canvas | tokens/forward | tokens agree |\n",
    );
    s += "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
    for r in rows {
        let served = &r.run.served;
        let vocab = r.run.vocab;
        let params: usize = served.iter().map(|t| t.shape.iter().product::<usize>()).sum();
        // A BF16 copy holds every matrix in 2 bytes per value.
        let bf16 = |t: &Served| if t.shape.len() >= 2 { 2 * t.shape.iter().product::<usize>() } else { t.bytes };
        let bytes: usize = served.iter().map(|t| if r.variant == Variant::Bf16 { bf16(t) } else { t.bytes }).sum();
        let quantized: Vec<String> = by_dtype(served)
            .into_iter()
            .filter(|(name, _)| is_quantized(name))
            .map(|(name, (_, p))| format!("{name} {:.0}%", 100.0 * p as f64 / params.max(1) as f64))
            .collect();
        let weights = match r.variant {
            Variant::Scheme(scheme) => scheme.name().to_string(),
            Variant::Int8(scheme) => format!("{}, int8 activations", scheme.name()),
            Variant::Bf16 => "matrices rounded to BF16".to_string(),
            Variant::Stored => format!("as stored ({})", main_dtype(served)),
        };
        let pair = |f: fn(&Diff) -> String| r.vs_stored.as_ref().map_or("—".into(), |(p, sc)| format!("{} / {}", f(p), f(sc)));
        let reference =
            r.vs_reference.map_or("—".into(), |(p, sc)| format!("{p:.1e} / {}", sc.map_or("—".into(), |x| format!("{x:.1e}"))));
        let g = &r.run.generation;
        let steps: Vec<String> = g.steps_per_canvas.iter().map(usize::to_string).collect();
        let per_forward = g.new_tokens().len() as f64 / g.decoder_passes.max(1) as f64;
        let _ = writeln!(
            s,
            "| {} | {weights} | {} | {:.2} | {} | {} | {} | {} | {reference} | {:.2}; {:.2} | {} | {per_forward:.2} | {} |",
            r.model,
            if quantized.is_empty() { "—".to_string() } else { quantized.join(", ") },
            bytes as f64 / params.max(1) as f64,
            r.run.weight_error.map_or("—".into(), |e| format!("{e:.1e}")),
            pair(|d| format!("{:.1e}", d.normwise)),
            pair(|d| format!("{:.1e}", d.max_abs)),
            pair(|d| percent(d.argmax)),
            mean_entropy(&r.run.plain, vocab),
            (vocab as f64).ln(),
            steps.join(", "),
            r.tokens_agree.map_or("—".into(), percent),
        );
    }
    s
}

fn percent(x: f64) -> String {
    format!("{:.1}%", 100.0 * x)
}

fn is_quantized(dtype_name: &str) -> bool {
    !matches!(dtype_name, "F32" | "F16" | "BF16")
}

/// The type most of the parameters are stored in.
fn main_dtype(served: &[Served]) -> &'static str {
    by_dtype(served).into_iter().max_by_key(|(_, (_, p))| *p).map_or("none", |(name, _)| name)
}

/// Per model, per scheme: each type and the tensor kinds it holds (kind: the name without its
/// layer index), and the matrices kept as stored with the row length where no block fits it.
fn quantization_map(rows: &[Row]) -> String {
    let mut s = String::new();
    for r in rows {
        let Variant::Scheme(scheme) = r.variant else { continue };
        let mut groups: Vec<(String, Vec<String>)> = Vec::new();
        for (kind, types, row) in kinds(&r.run.served) {
            let names: Vec<&str> = types.iter().map(|(d, _)| *d).collect();
            let key = if names.iter().all(|n| !is_quantized(n)) { "kept".to_string() } else { names.join(" + ") };
            let mut label = format!("`{kind}`");
            if types.len() > 1 {
                let counts: Vec<String> = types.iter().map(|(d, n)| format!("{d} ×{n}")).collect();
                label += &format!(" ({})", counts.join(", "));
            }
            if key == "kept" && !row.is_multiple_of(StoredDtype::Q8_0.block_len()) {
                label += &format!(" (rows of {row}: no block fits)");
            }
            match groups.iter_mut().find(|(k, _)| *k == key) {
                Some((_, v)) => v.push(label),
                None => groups.push((key, vec![label])),
            }
        }
        groups.sort_by_key(|(k, _)| k == "kept");
        let parts: Vec<String> = groups.into_iter().map(|(k, v)| format!("{k}: {}", v.join(", "))).collect();
        let _ = writeln!(s, "- {} **{}**: {}", r.model, scheme.name(), parts.join("; "));
    }
    s
}

/// Tensors of one kind per type: (type name, tensors).
type TypeCounts = Vec<(&'static str, usize)>;

/// The matrix kinds of `served` in load order: (kind, tensors per type, row length).
fn kinds(served: &[Served]) -> Vec<(String, TypeCounts, usize)> {
    let mut out: Vec<(String, TypeCounts, usize)> = Vec::new();
    for t in served.iter().filter(|t| t.shape.len() >= 2) {
        let kind = kind_of(&t.name);
        let row = *t.shape.last().expect("rank >= 2");
        let entry = match out.iter().position(|(k, _, _)| *k == kind) {
            Some(i) => &mut out[i],
            None => {
                out.push((kind, Vec::new(), row));
                out.last_mut().expect("pushed")
            }
        };
        match entry.1.iter_mut().find(|(d, _)| *d == t.dtype.name()) {
            Some((_, n)) => *n += 1,
            None => entry.1.push((t.dtype.name(), 1)),
        }
    }
    out
}

/// `model.decoder.layers.3.self_attn.q_proj.weight` → `self_attn.q_proj`.
fn kind_of(name: &str) -> String {
    let rest = name.strip_prefix("model.decoder.").unwrap_or(name);
    let rest = match rest.strip_prefix("layers.").and_then(|r| r.split_once('.')) {
        Some((_, tail)) => tail,
        None => rest,
    };
    rest.strip_suffix(".weight").unwrap_or(rest).to_string()
}

/// The short hash of the checked-out commit, when git can tell.
fn commit() -> Option<String> {
    let out = std::process::Command::new("git").args(["rev-parse", "--short", "HEAD"]).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Puts `text` (a section starting with [`SECTION`]) into the markdown file `path`: in place of
/// the section already there (up to the next `## ` heading), or at the end.
pub fn write_section(path: &Path, text: &str) -> Result<()> {
    let old = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let new = replace_section(&old, text);
    std::fs::write(path, new).with_context(|| format!("writing {}", path.display()))
}

fn replace_section(old: &str, text: &str) -> String {
    let text = text.trim_end();
    match old.find(&format!("\n{SECTION}\n")) {
        Some(start) => {
            let body = start + 1 + SECTION.len();
            let end = old[body..].find("\n## ").map_or(old.len(), |i| body + i + 1);
            let tail = &old[end..];
            format!("{}{text}\n{}{tail}", &old[..start + 1], if tail.is_empty() { "" } else { "\n" })
        }
        None => format!("{}\n\n{text}\n", old.trim_end()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_drop_the_layer_index_and_weight_suffix() {
        assert_eq!(kind_of("model.decoder.layers.3.self_attn.q_proj.weight"), "self_attn.q_proj");
        assert_eq!(kind_of("model.decoder.layers.12.experts.down_proj"), "experts.down_proj");
        assert_eq!(kind_of("model.decoder.embed_tokens.weight"), "embed_tokens");
    }

    #[test]
    fn a_section_is_appended_once_then_replaced_in_place() {
        let doc = "# B\n\n## One\n\nx\n";
        let first = replace_section(doc, &format!("{SECTION}\n\nv1\n"));
        assert_eq!(first, format!("# B\n\n## One\n\nx\n\n{SECTION}\n\nv1\n"));
        assert_eq!(replace_section(&first, &format!("{SECTION}\n\nv2\n")), format!("# B\n\n## One\n\nx\n\n{SECTION}\n\nv2\n"));
        let middle = format!("# B\n\n{SECTION}\n\nold\n\n## Two\n\ny\n");
        assert_eq!(replace_section(&middle, &format!("{SECTION}\n\nnew")), format!("# B\n\n{SECTION}\n\nnew\n\n## Two\n\ny\n"));
    }
}

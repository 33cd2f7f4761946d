//! The generation settings both `dg generate` and `dg serve` resolve (generation_config.json
//! overridden by options or a request, checked), the positions check, and the option values they
//! parse (byte counts, the server's default context).

use std::path::Path;

use anyhow::Result;
use dg_model::{GenerationConfig, ModelDir, RawGenerationConfig};

use crate::error::input;

/// Most positions `dg serve`'s default `--context` takes.
pub const DEFAULT_CONTEXT_CAP: usize = 16384;

/// generation_config.json of `model` with the fields `over` sets replaced, resolved and checked.
pub fn resolve_settings(model: &ModelDir, over: RawGenerationConfig) -> Result<GenerationConfig> {
    let raw = model.generation.clone().overridden_by(over);
    let source = Path::new("generation settings (generation_config.json and options)");
    let cfg = raw.resolve(&model.config, source).map_err(|e| input(e.to_string()))?;
    if !cfg.entropy_bound.is_finite() {
        return Err(input("--entropy-bound must be finite"));
    }
    Ok(cfg)
}

/// The prompt and every decoded canvas must fit in the model's positions.
pub fn check_positions(prompt_len: usize, canvases: usize, canvas: usize, max: usize) -> Result<()> {
    let needed = prompt_len + canvases * canvas;
    if needed > max {
        return Err(input(format!(
            "the prompt is too long: {prompt_len} prompt tokens + {canvases} canvas(es) of {canvas} tokens \
             need {needed} positions, but the model has max_position_embeddings {max}; shorten the \
             prompt or lower --max-new-tokens"
        )));
    }
    Ok(())
}

/// Parses a byte count: digits with an optional unit, `K`/`KiB`, `M`/`MiB`, `G`/`GiB` (powers of
/// 1024) or `B` (`--cache-budget`).
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|ch: char| !ch.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kib" => 10,
        "m" | "mib" => 20,
        "g" | "gib" => 30,
        other => return Err(format!("unknown unit {other:?} in {text:?}: use B, K, M or G (KiB, MiB, GiB)")),
    };
    let n: u64 = digits.parse().map_err(|_| format!("{text:?} is not a byte count (e.g. 2GiB, 512M, 0)"))?;
    n.checked_mul(1 << shift).ok_or_else(|| format!("{text:?} is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_count_every_canvas() {
        assert!(check_positions(10, 2, 32, 74).is_ok());
        let e = check_positions(11, 2, 32, 74).unwrap_err().to_string();
        assert!(e.contains("need 75 positions") && e.contains("max_position_embeddings 74"), "{e}");
    }

    #[test]
    fn byte_counts_parse_with_units() {
        assert_eq!(parse_bytes("0"), Ok(0));
        assert_eq!(parse_bytes("1234"), Ok(1234));
        assert_eq!(parse_bytes("64K"), Ok(64 << 10));
        assert_eq!(parse_bytes("512MiB"), Ok(512 << 20));
        assert_eq!(parse_bytes("2GiB"), Ok(2 << 30));
        assert_eq!(parse_bytes("3g"), Ok(3 << 30));
        assert!(parse_bytes("2TB").unwrap_err().contains("unknown unit"));
        assert!(parse_bytes("GiB").unwrap_err().contains("not a byte count"));
        assert!(parse_bytes("-1").is_err());
        assert!(parse_bytes("99999999999999G").unwrap_err().contains("too large"));
    }
}

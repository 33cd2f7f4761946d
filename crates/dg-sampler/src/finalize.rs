//! End-of-block handling: `DiffusionGemmaGenerationMixin._finalize_canvas` (EOS and max-length stopping,
//! padding after the first EOS) and `_compute_tokens_per_forward`, for one sequence.
//!
//! For a single sequence no row can have finished in an earlier block (generation stops as soon as it
//! finishes), so of the reference's two padding rules only "pad every token after the first EOS of the
//! canvas that finished" applies. It applies only when `pad_token_id` is set, EOS ids are configured and
//! the canvas finished; a canvas finished by the length limit alone contains no EOS and is left as is.

use dg_model::GenerationConfig;

/// Why a block ended the generation, if it did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CanvasEnd {
    /// No stopping criterion fired: generation continues if canvases remain.
    Continue,
    /// The canvas contains an EOS id, first at `position` within the canvas (`EosTokenCriteria`).
    Eos { position: usize },
    /// No EOS, but the sequence reached `max_length` (`MaxLengthCriteria`).
    MaxLength,
}

impl CanvasEnd {
    pub fn finished(self) -> bool {
        self != CanvasEnd::Continue
    }
}

/// Applies the stopping criteria and EOS padding to `canvas`, the newest block of a sequence that is now
/// `sequence_len` tokens long (canvas included).
pub fn finalize_canvas(canvas: &mut [u32], sequence_len: usize, cfg: &GenerationConfig) -> CanvasEnd {
    let eos = canvas.iter().position(|t| cfg.eos_token_ids.contains(t));
    let end = match eos {
        Some(position) => CanvasEnd::Eos { position },
        None if cfg.max_length.is_some_and(|m| sequence_len >= m) => CanvasEnd::MaxLength,
        None => CanvasEnd::Continue,
    };
    if let (Some(pad), Some(first)) = (cfg.pad_token_id, eos) {
        for t in &mut canvas[first + 1..] {
            *t = pad;
        }
    }
    end
}

/// New tokens that are not the pad id (all of them when there is no pad id).
pub fn valid_tokens(new_tokens: &[u32], pad_token_id: Option<u32>) -> usize {
    match pad_token_id {
        Some(pad) => new_tokens.iter().filter(|&&t| t != pad).count(),
        None => new_tokens.len(),
    }
}

/// `_compute_tokens_per_forward`: valid new tokens per decoder pass (0 when there was no pass; the
/// reference would divide 0 by 0).
pub fn tokens_per_forward(new_tokens: &[u32], pad_token_id: Option<u32>, decoder_passes: usize) -> f64 {
    if decoder_passes == 0 {
        return 0.0;
    }
    valid_tokens(new_tokens, pad_token_id) as f64 / decoder_passes as f64
}

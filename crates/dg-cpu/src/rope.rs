//! Rotary position embedding, rotate-half convention (`DiffusionGemmaTextRotaryEmbedding` and
//! `apply_rotary_pos_emb`): `x' = x·cos + rotate_half(x)·sin`, dimension k paired with k + d/2.

use dg_model::LayerSpec;

/// cos/sin of `pos · inv_freq` for a run of consecutive positions, `[T, d/2]` each.
#[derive(Debug, Clone)]
pub struct RopeTable {
    pub half: usize,
    pub cos: Vec<f32>,
    pub sin: Vec<f32>,
}

impl RopeTable {
    /// Table for `tokens` positions starting at `start`, for the head size and RoPE of `spec`.
    pub fn new(spec: &LayerSpec, start: usize, tokens: usize) -> Self {
        let (cos, sin) = spec.rope.cos_sin(spec.head_dim, start, tokens);
        RopeTable { half: spec.head_dim / 2, cos, sin }
    }

    /// Rotates every head of `x: [T, heads, d]` in place.
    pub fn apply(&self, x: &mut [f32], heads: usize) {
        let d = 2 * self.half;
        for (t, token) in x.chunks_exact_mut(heads * d).enumerate() {
            let cos = &self.cos[t * self.half..(t + 1) * self.half];
            let sin = &self.sin[t * self.half..(t + 1) * self.half];
            for head in token.chunks_exact_mut(d) {
                let (lo, hi) = head.split_at_mut(self.half);
                for i in 0..self.half {
                    let (x1, x2) = (lo[i], hi[i]);
                    lo[i] = x1 * cos[i] + (-x2) * sin[i];
                    hi[i] = x2 * cos[i] + x1 * sin[i];
                }
            }
        }
    }
}

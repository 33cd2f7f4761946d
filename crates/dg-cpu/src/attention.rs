//! Scaled-dot-product attention with scaling 1.0, GQA and the reference's masks
//! (`eager_attention_forward`): f32 scores, masked keys excluded, f32 softmax, weighted sum of V.
//!
//! Query head `h` reads kv head `h / (heads / kv_heads)` (`repeat_kv`, consecutive repeats).

use std::ops::Range;

use rayon::prelude::*;

use crate::linalg::{Threads, View, matmul};
use crate::ops::softmax_in_place;

/// Which keys a query may see.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mask<'a> {
    /// Every key (the decoder: bidirectional over [cache | canvas]).
    None,
    /// Causal over absolute positions, optionally with a sliding window of `window` tokens
    /// including the query (`j ≤ p` and `j > p − window`); a query inside one of the `spans`
    /// (absolute positions of an image's soft tokens) also sees that whole span, as
    /// `blockwise_overlay` ORs it into HF's masks.
    Causal { key_start: usize, query_start: usize, window: Option<usize>, spans: &'a [Range<usize>] },
}

impl Mask<'_> {
    /// Range of visible keys `[lo, hi)` for query `t` out of `keys` keys.
    pub fn visible(&self, t: usize, keys: usize) -> (usize, usize) {
        match *self {
            Mask::None => (0, keys),
            Mask::Causal { key_start, query_start, window, spans } => {
                let p = query_start + t;
                let (mut lo, mut hi) = (window.map_or(0, |w| (p + 1).saturating_sub(w)), p + 1);
                // Both ranges hold p, so their union is one range.
                if let Some(span) = spans.iter().find(|s| s.contains(&p)) {
                    (lo, hi) = (lo.min(span.start), hi.max(span.end));
                }
                let hi = hi.saturating_sub(key_start).min(keys);
                (lo.saturating_sub(key_start).min(hi), hi)
            }
        }
    }
}

/// Shapes of one attention call.
#[derive(Debug, Clone, Copy)]
pub struct AttnShape {
    pub queries: usize,
    pub keys: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

/// `out[T, heads, d] = softmax(q · kᵀ + mask) · v` for `q: [T, heads, d]`, `k, v: [S, kv_heads, d]`.
pub fn attention(out: &mut [f32], q: &[f32], k: &[f32], v: &[f32], s: AttnShape, mask: Mask) {
    let AttnShape { queries: t, keys: n, heads, kv_heads, head_dim: d } = s;
    assert_eq!(q.len(), t * heads * d);
    assert_eq!(k.len(), n * kv_heads * d);
    assert_eq!(v.len(), n * kv_heads * d);
    assert_eq!(out.len(), t * heads * d);
    let group = heads / kv_heads;
    let mut per_head = vec![0f32; heads * t * d];
    let mut scores = vec![0f32; heads * t * n];
    per_head.par_chunks_mut(t * d).zip(scores.par_chunks_mut(t * n)).enumerate().for_each(|(h, (head_out, sc))| {
        let g = h / group;
        let qv = View { data: &q[h * d..], rows: t, cols: d, row_stride: heads * d, col_stride: 1 };
        let kt = View { data: &k[g * d..], rows: d, cols: n, row_stride: 1, col_stride: kv_heads * d };
        matmul(sc, n, qv, kt, false, Threads::One);
        for (row_idx, row) in sc.chunks_exact_mut(n).enumerate() {
            let (lo, hi) = mask.visible(row_idx, n);
            row[..lo].fill(0.0);
            row[hi..].fill(0.0);
            softmax_in_place(&mut row[lo..hi]);
        }
        let pv = View::rows(sc, t, n);
        let vv = View { data: &v[g * d..], rows: n, cols: d, row_stride: kv_heads * d, col_stride: 1 };
        matmul(head_out, d, pv, vv, false, Threads::One);
    });
    for h in 0..heads {
        for row in 0..t {
            let src = &per_head[(h * t + row) * d..(h * t + row + 1) * d];
            out[(row * heads + h) * d..(row * heads + h + 1) * d].copy_from_slice(src);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Straightforward reference: loops, f64 accumulation.
    fn naive(q: &[f32], k: &[f32], v: &[f32], s: AttnShape, mask: Mask) -> Vec<f32> {
        let AttnShape { queries: t, keys: n, heads, kv_heads, head_dim: d } = s;
        let mut out = vec![0f32; t * heads * d];
        for h in 0..heads {
            let g = h / (heads / kv_heads);
            for i in 0..t {
                let (lo, hi) = mask.visible(i, n);
                let sc: Vec<f64> = (lo..hi)
                    .map(|j| (0..d).map(|x| q[(i * heads + h) * d + x] as f64 * k[(j * kv_heads + g) * d + x] as f64).sum())
                    .collect();
                let m = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = sc.iter().map(|s| (s - m).exp()).sum();
                for x in 0..d {
                    let acc: f64 = (lo..hi).zip(&sc).map(|(j, s)| (s - m).exp() / z * v[(j * kv_heads + g) * d + x] as f64).sum();
                    out[(i * heads + h) * d + x] = acc as f32;
                }
            }
        }
        out
    }

    fn data(n: usize, seed: u32) -> Vec<f32> {
        (0..n).map(|i| (((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 16) % 200) as f32 / 100.0 - 1.0).collect()
    }

    #[test]
    fn matches_naive_with_gqa_and_masks() {
        let s = AttnShape { queries: 5, keys: 9, heads: 4, kv_heads: 2, head_dim: 6 };
        let (q, k, v) = (data(5 * 4 * 6, 1), data(9 * 2 * 6, 2), data(9 * 2 * 6, 3));
        for mask in [
            Mask::None,
            Mask::Causal { key_start: 10, query_start: 14, window: None, spans: &[] },
            Mask::Causal { key_start: 10, query_start: 14, window: Some(3), spans: &[] },
            Mask::Causal { key_start: 10, query_start: 14, window: None, spans: &[13..17, 20..22] },
        ] {
            let mut out = vec![0f32; q.len()];
            attention(&mut out, &q, &k, &v, s, mask);
            let want = naive(&q, &k, &v, s, mask);
            for (a, b) in out.iter().zip(&want) {
                assert!((a - b).abs() < 1e-5, "{mask:?}: {a} vs {b}");
            }
        }
    }

    #[test]
    fn sliding_window_counts_the_query_itself() {
        let m = Mask::Causal { key_start: 0, query_start: 5, window: Some(3), spans: &[] };
        // Query at position 5 sees keys 3, 4, 5.
        assert_eq!(m.visible(0, 10), (3, 6));
    }

    #[test]
    fn an_image_span_is_seen_whole_from_inside_and_causally_from_outside() {
        let spans = [2..7, 9..10];
        let m = Mask::Causal { key_start: 0, query_start: 0, window: Some(2), spans: &spans };
        // Inside the span: the whole span, and the window before it.
        assert_eq!(m.visible(3, 10), (2, 7));
        assert_eq!(m.visible(2, 10), (1, 7));
        // After it: causal with the window only.
        assert_eq!(m.visible(8, 10), (7, 9));
        // Before it: causal.
        assert_eq!(m.visible(1, 10), (0, 2));
    }
}

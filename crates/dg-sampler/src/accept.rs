//! Entropy-bound acceptance and renoising: `EntropyBoundSampler.accept_canvas` and
//! `EntropyBoundSampler.renoise_canvas` of the reference.
//!
//! Acceptance sorts the per-position entropies ascending, takes the inclusive cumulative sum `S` in
//! sorted order and accepts where `S − H ≤ B` (the reference's "cumsum minus current", not an exclusive
//! scan). Details that the reference leaves to PyTorch are fixed here:
//! - Ties are ordered by position: the sort is on `(entropy, index)` (`torch.sort` is not stable).
//! - The cumulative sum is accumulated in f64 and each prefix rounded to f32, which is exactly what
//!   PyTorch's CPU `cumsum` does for f32 input; the subtraction and the comparison are in f32.

use std::cmp::Ordering;

/// Order of two entropies (then positions): ascending, `-0.0 == 0.0`, NaN last.
fn by_entropy_then_index(entropy: &[f32], a: u32, b: u32) -> Ordering {
    let key = |i: u32| {
        let h = entropy[i as usize];
        if h == 0.0 { 0.0 } else { h }
    };
    key(a).total_cmp(&key(b)).then(a.cmp(&b))
}

/// Writes the acceptance mask for `entropy` with budget `bound` into `accepted`; `order` is scratch of
/// the same length (left holding the sorted positions). Returns the number of accepted positions.
/// Does not allocate.
///
/// # Panics
/// If the three slices differ in length.
pub fn entropy_bound_accept(entropy: &[f32], bound: f32, order: &mut [u32], accepted: &mut [bool]) -> usize {
    assert!(entropy.len() == order.len() && entropy.len() == accepted.len(), "entropy_bound_accept: slice lengths differ");
    for (i, o) in order.iter_mut().enumerate() {
        *o = i as u32;
    }
    order.sort_unstable_by(|&a, &b| by_entropy_then_index(entropy, a, b));
    let mut cumulative = 0f64;
    let mut count = 0;
    for &i in order.iter() {
        let h = entropy[i as usize];
        cumulative += f64::from(h);
        let accept = (cumulative as f32) - h <= bound;
        accepted[i as usize] = accept;
        count += usize::from(accept);
    }
    count
}

/// Allocating convenience form of [`entropy_bound_accept`].
pub fn accept_mask(entropy: &[f32], bound: f32) -> Vec<bool> {
    let mut order = vec![0; entropy.len()];
    let mut accepted = vec![false; entropy.len()];
    entropy_bound_accept(entropy, bound, &mut order, &mut accepted);
    accepted
}

/// The next canvas: accepted positions take the sampled token, every other position the fresh noise
/// token (even one that was accepted at an earlier step: nothing is frozen).
///
/// The reference computes `where(mask, sampled, current)` and then `where(~mask, noise, ·)`, so the
/// current canvas never survives; this writes the same result directly.
///
/// # Panics
/// If the slices differ in length.
pub fn renoise(next: &mut [u32], accepted: &[bool], sampled: &[u32], noise: &[u32]) {
    assert!(next.len() == accepted.len() && next.len() == sampled.len() && next.len() == noise.len(), "renoise: slice lengths differ");
    for (((n, &a), &s), &z) in next.iter_mut().zip(accepted).zip(sampled).zip(noise) {
        *n = if a { s } else { z };
    }
}

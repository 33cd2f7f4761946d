//! Entropy-bound acceptance (spec §6.3 worked example, ties, the always-accepted minimum) and renoising.

use dg_sampler::accept::{accept_mask, entropy_bound_accept, renoise};
use dg_sampler::rows;

const V: usize = 10_000;
const C: usize = 256;

/// Per-position entropies of the §6.3 canvas: position 0 has logits [18, 0, …], positions 1 and 2 have a
/// 14.5 somewhere, the rest are all zero (entropy ln V).
fn worked_example_entropies(zero_entropy_positions: usize) -> Vec<f32> {
    let row = |spike: Option<(usize, f32)>| {
        let mut r = vec![0.0f32; V];
        if let Some((at, v)) = spike {
            r[at] = v;
        }
        rows::entropy(&r)
    };
    let (h18, h145, h_uniform, h_zero) = (row(Some((0, 18.0))), row(Some((5, 14.5))), row(None), row(Some((9, 1e6))));
    let mut h = vec![h_uniform; C];
    h[0] = h18;
    h[1] = h145;
    h[2] = h145;
    for x in h.iter_mut().skip(3).take(zero_entropy_positions) {
        *x = h_zero;
    }
    h
}

#[test]
fn worked_example_bound_0_1_accepts_three() {
    let h = worked_example_entropies(0);
    // Exclusive prefixes in sorted order: 0, 0.00289, 0.0807, 0.1585 → three are ≤ 0.1.
    let mask = accept_mask(&h, 0.1);
    assert_eq!(mask.iter().filter(|&&a| a).count(), 3);
    assert!(mask[0] && mask[1] && mask[2]);
}

#[test]
fn worked_example_bound_0_01_accepts_two() {
    let h = worked_example_entropies(0);
    // 0 and 0.00289 are ≤ 0.01; 0.0807 is not. Positions 1 and 2 tie: the lower index goes first.
    let mask = accept_mask(&h, 0.01);
    assert_eq!(mask.iter().filter(|&&a| a).count(), 2);
    assert!(mask[0] && mask[1] && !mask[2]);
}

#[test]
fn nine_zero_entropy_positions_then_high_entropy_accept_ten() {
    // Spec §6.3: 9 positions with a logit of 1e6 (entropy exactly 0), every other position all-zero logits
    // (entropy ln V). Sorted prefixes: 0 (×9), then 0 for the first high-entropy position, then ln V > B.
    let mut spike = vec![0.0f32; V];
    spike[123] = 1e6;
    let (h_zero, h_uniform) = (rows::entropy(&spike), rows::entropy(&vec![0.0; V]));
    assert_eq!(h_zero, 0.0);
    let mut h = vec![h_uniform; C];
    for i in [3, 40, 41, 77, 100, 101, 200, 254, 255] {
        h[i] = h_zero;
    }
    for bound in [0.1, 0.01] {
        let mask = accept_mask(&h, bound);
        assert_eq!(mask.iter().filter(|&&a| a).count(), 10, "bound {bound}");
        // The accepted high-entropy position is the first one by index.
        assert!(mask[0] && !mask[1]);
    }
}

#[test]
fn lowest_entropy_position_is_always_accepted() {
    for bound in [1e-30f32, 1e-6, 0.1] {
        let h: Vec<f32> = (0..50).map(|i| 5.0 + ((i * 17) % 23) as f32).collect();
        let min = (0..h.len()).min_by(|&a, &b| h[a].total_cmp(&h[b]).then(a.cmp(&b))).unwrap();
        let mask = accept_mask(&h, bound);
        assert!(mask[min], "bound {bound}");
        assert_eq!(mask.iter().filter(|&&a| a).count(), 1, "bound {bound}");
    }
}

#[test]
fn ties_are_ordered_by_position() {
    // Four equal entropies of 0.06: prefixes 0, 0.06, 0.12, … → B = 0.1 accepts two, the lowest positions.
    let mut h = vec![3.0f32; 8];
    for i in [6, 2, 5, 3] {
        h[i] = 0.06;
    }
    let mut order = vec![0; 8];
    let mut mask = vec![false; 8];
    assert_eq!(entropy_bound_accept(&h, 0.1, &mut order, &mut mask), 2);
    assert_eq!(mask, vec![false, false, true, true, false, false, false, false]);
    assert_eq!(&order[..4], &[2, 3, 5, 6], "sorted order is (entropy, index)");
    // -0.0 and 0.0 tie too.
    let h = [0.5f32, 0.0, -0.0, 0.0];
    entropy_bound_accept(&h, 0.0, &mut order[..4], &mut mask[..4]);
    assert_eq!(&order[..4], &[1, 2, 3, 0]);
}

#[test]
fn cumsum_is_accumulated_like_pytorch_on_cpu() {
    // PyTorch's CPU cumsum of f32 accumulates in f64 and rounds each prefix to f32. For these entropies
    // it accepts all four positions (torch 2.11: `cumsum(h) - h <= 0.1` is all true), whereas an f32
    // running sum would reject the last one.
    let sorted = [0.029_414_64_f32, 0.035_234_65, 0.035_350_714, 0.050_000_01];
    let f32_running: f32 = sorted.iter().sum();
    assert!(f32_running - sorted[3] > 0.1, "the example must separate the two accumulations");
    let h = [sorted[3], sorted[1], sorted[0], sorted[2]];
    let mut order = [0u32; 4];
    let mut mask = [false; 4];
    assert_eq!(entropy_bound_accept(&h, 0.1, &mut order, &mut mask), 4);
    assert_eq!(order, [2, 1, 3, 0]);
}

#[test]
fn renoise_keeps_accepted_samples_and_replaces_everything_else() {
    let accepted = [true, false, true, false];
    let sampled = [10, 11, 12, 13];
    let noise = [20, 21, 22, 23];
    let mut next = [0u32; 4];
    renoise(&mut next, &accepted, &sampled, &noise);
    assert_eq!(next, [10, 21, 12, 23]);
}

#[test]
fn a_position_accepted_earlier_but_not_now_is_renoised() {
    // Step 1 accepts position 1; step 2 accepts only position 0: position 1 must take step 2's noise.
    let mut canvas = [0u32; 3];
    renoise(&mut canvas, &[false, true, false], &[5, 6, 7], &[30, 31, 32]);
    assert_eq!(canvas, [30, 6, 32]);
    // Position 0 has the lowest entropy (prefix 0); position 1's prefix is 0.2 > 0.1.
    let h = [0.2f32, 4.0, 4.0];
    let mask = accept_mask(&h, 0.1);
    assert_eq!(mask, vec![true, false, false]);
    renoise(&mut canvas, &mask, &[8, 9, 10], &[40, 41, 42]);
    assert_eq!(canvas, [8, 41, 42]);
}

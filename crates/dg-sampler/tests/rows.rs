//! Per-row math: entropy (spec §8.3 vectors), softmax, argmax, temperature, exp accuracy, finiteness.

use dg_sampler::rows::{self, NonFinite};
use dg_sampler::{RowDistributions, RowStat};

/// Row of `vocab` zeros with `value` at `at`.
fn spike(vocab: usize, at: usize, value: f32) -> Vec<f32> {
    let mut row = vec![0.0; vocab];
    row[at] = value;
    row
}

/// Closed form for one logit `a` and `k` zeros: S = 1 + k·e^(−a), H = ln S + k·a·e^(−a) / S.
fn spike_entropy(a: f64, k: f64) -> f64 {
    let s = 1.0 + k * (-a).exp();
    s.ln() + k * a * (-a).exp() / s
}

#[test]
fn entropy_matches_spec_vectors() {
    let h18 = rows::entropy(&spike(10_000, 0, 18.0));
    let h145 = rows::entropy(&spike(10_000, 3, 14.5));
    let uniform = rows::entropy(&vec![0.0; 10_000]);
    // Spec §8.3: 0.0028930, 0.0777865, ln 10000 = 9.2103404.
    assert!((h18 - 0.002_893_0).abs() < 5e-8, "{h18}");
    assert!((h145 - 0.077_786_5).abs() < 5e-8, "{h145}");
    assert!((uniform - 9.210_340_4).abs() < 1e-6, "{uniform}");
    // And the closed forms, to f32 precision.
    assert!(((h18 as f64) / spike_entropy(18.0, 9999.0) - 1.0).abs() < 1e-5);
    assert!(((h145 as f64) / spike_entropy(14.5, 9999.0) - 1.0).abs() < 1e-5);
}

#[test]
fn entropy_is_exactly_zero_when_other_probabilities_underflow() {
    let h = rows::entropy(&spike(1000, 7, 1e6));
    assert_eq!(h.to_bits(), 0f32.to_bits(), "expected +0.0, got {h}");
    // Two equal maxima and the rest underflowing: ln 2.
    let mut row = spike(1000, 1, 200.0);
    row[5] = 200.0;
    assert!((rows::entropy(&row) - std::f32::consts::LN_2).abs() < 1e-7);
}

#[test]
fn softmax_sums_to_one_and_matches_f64() {
    let logits: Vec<f32> = (0..1000).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.3).collect();
    let t = 0.7f32;
    let p = rows::softmax(&logits, t);
    let scaled: Vec<f64> = logits.iter().map(|&x| f64::from(x / t)).collect();
    let max = scaled.iter().cloned().fold(f64::MIN, f64::max);
    let s: f64 = scaled.iter().map(|x| (x - max).exp()).sum();
    for (i, (&pi, x)) in p.iter().zip(&scaled).enumerate() {
        let want = (x - max).exp() / s;
        // f32 rounding of x − max (relative |x − max|·2⁻²⁴ after exp) plus a few ulp for exp and the division.
        let tol = ((max - x) * 6e-8 + 4e-7) * want;
        assert!((f64::from(pi) - want).abs() <= tol, "p[{i}] = {pi}, want {want}");
    }
    let total: f64 = p.iter().map(|&x| f64::from(x)).sum();
    assert!((total - 1.0).abs() < 1e-5);
}

#[test]
fn argmax_takes_the_first_maximal_index() {
    let mut row = vec![0.0f32; 100];
    row[17] = 5.0;
    row[42] = 5.0;
    row[90] = 5.0;
    assert_eq!(rows::argmax(&row), 17);
    // Across lanes and into the remainder.
    let mut row = vec![-1.0f32; 37];
    row[35] = 2.0;
    row[36] = 2.0;
    assert_eq!(rows::argmax(&row), 35);
}

#[test]
fn process_rows_scales_in_place_and_reports_per_row_results() {
    let (c, v) = (3, 20);
    let mut logits = vec![0.0f32; c * v];
    logits[3] = 8.0; // row 0 → argmax 3
    logits[v + 11] = -1.0; // row 1: all zero except one smaller → argmax 0
    for (i, x) in logits[2 * v..].iter_mut().enumerate() {
        *x = i as f32; // row 2 → argmax 19
    }
    let raw = logits.clone();
    let mut stats = vec![RowStat::default(); c];
    let t = 0.8f32;
    rows::process_rows(&mut logits, v, t, &mut stats).unwrap();
    let argmax: Vec<u32> = stats.iter().map(|s| s.argmax).collect();
    assert_eq!(argmax, vec![3, 0, 19]);
    for (scaled, r) in logits.iter().zip(&raw) {
        assert_eq!(scaled.to_bits(), (r / t).to_bits(), "proc must be raw / T (f32 division)");
    }
    for (r, stat) in stats.iter().enumerate() {
        let row = &logits[r * v..(r + 1) * v];
        assert_eq!(stat.entropy.to_bits(), rows::entropy(row).to_bits());
        assert_eq!(stat.max, row[stat.argmax as usize]);
        let s: f64 = row.iter().map(|&x| (f64::from(x) - f64::from(stat.max)).exp()).sum();
        assert!((f64::from(stat.sum) / s - 1.0).abs() < 1e-6);
    }
    // The distributions: p = exp(x − max) / S, summing to 1.
    let dists = RowDistributions::new(&logits, &stats, v);
    assert_eq!((dists.rows(), dists.vocab_size()), (3, 20));
    for r in 0..c {
        let p = dists.probs(r);
        let total: f64 = p.iter().map(|&x| f64::from(x)).sum();
        assert!((total - 1.0).abs() < 1e-6);
        assert_eq!(p, rows::softmax(&raw[r * v..(r + 1) * v], t));
    }
}

#[test]
fn non_finite_logits_name_row_and_column() {
    let (c, v) = (4, 33);
    let mut logits = vec![0.5f32; c * v];
    logits[2 * v + 30] = f32::NAN;
    logits[3 * v + 1] = f32::INFINITY;
    let mut stats = vec![RowStat::default(); c];
    let e = rows::process_rows(&mut logits, v, 1.0, &mut stats).unwrap_err();
    assert_eq!((e.row, e.column), (2, 30));
    assert!(e.value.is_nan());
    // A finite logit that overflows when divided by the temperature is caught too.
    let mut logits = vec![0.0f32; v];
    logits[9] = f32::MAX;
    let e = rows::process_rows(&mut logits, v, 0.5, &mut stats[..1]).unwrap_err();
    assert_eq!(e, NonFinite { row: 0, column: 9, value: f32::INFINITY });
}

#[test]
fn exp_is_within_two_ulp_of_f64() {
    let mut worst = 0f64;
    let mut x = 0f32;
    while x > -87.3 {
        let got = f64::from(rows::exp_nonpositive(x));
        let want = f64::from(x).exp();
        let ulp = f64::from(f32::EPSILON) * want;
        worst = worst.max((got - want).abs() / ulp);
        x -= 0.000_731;
    }
    assert!(worst <= 2.0, "worst error {worst} ulp");
    assert_eq!(rows::exp_nonpositive(0.0), 1.0);
    assert_eq!(rows::exp_nonpositive(-88.0), 0.0);
    assert_eq!(rows::exp_nonpositive(-1e30), 0.0);
    assert_eq!(rows::exp_nonpositive(f32::NEG_INFINITY), 0.0);
}

#[test]
fn vectorised_and_portable_kernels_agree_bit_for_bit() {
    for v in [1usize, 15, 16, 17, 1023, 1024, 1025, 5000] {
        let raw: Vec<f32> = (0..v).map(|i| (((i * 7919) % 613) as f32 - 300.0) * 0.1).collect();
        let mut a = raw.clone();
        let portable = rows::process_row_portable(&mut a, 0.6);
        let mut b = raw.clone();
        let mut stats = [RowStat::default()];
        rows::process_rows(&mut b, v, 0.6, &mut stats).unwrap();
        let bits = |s: &RowStat| (s.entropy.to_bits(), s.argmax, s.max.to_bits(), s.sum.to_bits());
        assert_eq!(bits(&portable), bits(&stats[0]), "v = {v}");
        // Probabilities (vectorised where available) are exactly the portable exp over the f32 sum.
        let p = RowDistributions::new(&b, &stats, v).probs(0);
        for (pi, &x) in p.iter().zip(&b) {
            let want = rows::exp_nonpositive(x - portable.max) / portable.sum;
            assert_eq!(pi.to_bits(), want.to_bits(), "v = {v}");
        }
    }
}

//! SeededRng (golden outputs, determinism, ranges, categorical sampling) and Replay (order, kinds, errors).

use dg_sampler::rows;
use dg_sampler::{DrawError, DrawKind, RandomSource, Replay, RowDistributions, RowStat, SeededRng};

/// `rows` copies of one row of logits, scaled at temperature 1, with their statistics.
fn dists(row: &[f32], rows: usize) -> (Vec<f32>, Vec<RowStat>) {
    let mut logits = row.repeat(rows);
    let mut stats = vec![RowStat::default(); rows];
    rows::process_rows(&mut logits, row.len(), 1.0, &mut stats).unwrap();
    (logits, stats)
}

#[test]
fn golden_xoshiro256starstar_outputs() {
    // xoshiro256** seeded by SplitMix64(seed); values from an independent implementation of both.
    let mut r = SeededRng::new(0);
    let got: Vec<u64> = (0..4).map(|_| r.next_u64()).collect();
    assert_eq!(got, [0x99ec5f36cb75f2b4, 0xbf6e1f784956452a, 0x1a5f849d4933e6e0, 0x6aa594f1262d2d2c]);
    let mut r = SeededRng::new(42);
    let got: Vec<u64> = (0..4).map(|_| r.next_u64()).collect();
    assert_eq!(got, [0x15780b2e0c2ec716, 0x6104d9866d113a7e, 0xae17533239e499a1, 0xecb8ad4703b360a1]);
}

#[test]
fn golden_uniform_tokens() {
    // Lemire's method on the upper 32 bits: id = (x · V) >> 32, rejecting the low products below 2^32 mod V.
    let mut r = SeededRng::new(42);
    let mut out = [0u32; 5];
    r.uniform_tokens(262_144, &mut out).unwrap();
    assert_eq!(out, [21984, 99347, 178269, 242402, 259995]);
    let mut r = SeededRng::new(42);
    let mut out = [0u32; 8];
    r.uniform_tokens(10, &mut out).unwrap();
    assert_eq!(out, [0, 3, 6, 9, 9, 7, 7, 8]);
}

#[test]
fn golden_categorical() {
    // Seed 7 gives the uniforms 0.70057…, 0.27875…, 0.83962…; with p = [0.25, 0.25, 0.5] (logits
    // [0, 0, ln 2]) the inverse CDF (first index whose running sum exceeds u) gives 2, 1, 2.
    let mut r = SeededRng::new(7);
    assert!((r.next_f64() - 0.700_576_482_179_689_6).abs() < 1e-15);
    let (logits, stats) = dists(&[0.0, 0.0, std::f32::consts::LN_2], 3);
    let d = RowDistributions::new(&logits, &stats, 3);
    let p = d.probs(0);
    assert!((p[0] - 0.25).abs() < 1e-7 && (p[2] - 0.5).abs() < 1e-7, "{p:?}");
    let mut r = SeededRng::new(7);
    let mut out = [9u32; 3];
    r.categorical(&d, &mut out).unwrap();
    assert_eq!(out, [2, 1, 2]);
}

#[test]
fn same_seed_same_draws() {
    let row: Vec<f32> = (0..300).map(|i| (i as f32).ln_1p()).collect();
    let (logits, stats) = dists(&row, 4);
    let d = RowDistributions::new(&logits, &stats, 300);
    let run = |seed| {
        let mut r = SeededRng::new(seed);
        let (mut a, mut b, mut c) = ([0u32; 64], [0u32; 4], [0u32; 64]);
        r.uniform_tokens(1000, &mut a).unwrap();
        r.categorical(&d, &mut b).unwrap();
        r.uniform_tokens(1000, &mut c).unwrap();
        (a, b, c)
    };
    assert_eq!(run(3), run(3));
    assert_ne!(run(3), run(4));
}

#[test]
fn uniform_tokens_stay_in_range_and_cover_it() {
    let mut r = SeededRng::new(1);
    let mut counts = [0usize; 7];
    let mut out = [0u32; 7000];
    r.uniform_tokens(7, &mut out).unwrap();
    for &t in &out {
        counts[t as usize] += 1;
    }
    assert!(counts.iter().all(|&c| (850..1150).contains(&c)), "{counts:?}");
    let mut r = SeededRng::new(2);
    r.uniform_tokens(1, &mut out).unwrap();
    assert!(out.iter().all(|&t| t == 0));
}

#[test]
fn categorical_follows_the_probabilities_and_skips_zeros() {
    // p = [0, 0.1, 0, 0.6, 0.3].
    let row = [-1e6f32, 0.1f32.ln(), -1e6, 0.6f32.ln(), 0.3f32.ln()];
    let n = 4000;
    let (logits, stats) = dists(&row, n);
    let mut r = SeededRng::new(11);
    let mut out = vec![0u32; n];
    r.categorical(&RowDistributions::new(&logits, &stats, 5), &mut out).unwrap();
    let mut counts = [0usize; 5];
    for &t in &out {
        counts[t as usize] += 1;
    }
    assert_eq!((counts[0], counts[2]), (0, 0));
    assert!((300..500).contains(&counts[1]) && (2250..2550).contains(&counts[3]), "{counts:?}");
}

#[test]
fn inverse_cdf_edges() {
    // One-hot row: always the hot index.
    let mut row = vec![-1e6f32; 200];
    row[150] = 0.0;
    let (logits, stats) = dists(&row, 1);
    let d = RowDistributions::new(&logits, &stats, 200);
    assert_eq!((d.sample(0, 0.0), d.sample(0, 0.999_999)), (150, 150));
    // 25 equal entries have p = f32(1/25) = 0.039999999, summing to 0.99999998: above that, the last
    // entry with non-zero probability (the 26th has p = 0).
    let mut row = vec![0.0f32; 26];
    row[25] = -1e6;
    let (logits, stats) = dists(&row, 1);
    let d = RowDistributions::new(&logits, &stats, 26);
    assert_eq!(d.sample(0, 0.999_999_99), 24);
    assert_eq!(d.sample(0, 0.999_999), 24);
    assert_eq!(d.sample(0, 0.03), 0);
    // Boundaries: the running sum must exceed u strictly.
    let (logits, stats) = dists(&[0.0, 0.0], 1);
    let d = RowDistributions::new(&logits, &stats, 2);
    assert_eq!((d.sample(0, 0.5), d.sample(0, 0.499_999)), (1, 0));
    // Across 64-entry chunks.
    let (logits, stats) = dists(&vec![0.0; 1000], 1);
    let d = RowDistributions::new(&logits, &stats, 1000);
    assert_eq!(d.sample(0, 0.5005), 500);
}

#[test]
fn categorical_rejects_a_bad_output_length() {
    let (logits, stats) = dists(&[0.0; 3], 2);
    let e = SeededRng::new(0).categorical(&RowDistributions::new(&logits, &stats, 3), &mut [0; 3]);
    assert_eq!(e.unwrap_err(), DrawError::RowCount { expected: 2, got: 3 });
}

#[test]
fn draw_kinds_parse_and_print_as_in_reference_json() {
    for k in [DrawKind::UniformTokens, DrawKind::Categorical] {
        assert_eq!(k.as_str().parse::<DrawKind>().unwrap(), k);
    }
    assert_eq!(DrawKind::UniformTokens.to_string(), "uniform_tokens");
    assert!("gumbel".parse::<DrawKind>().unwrap_err().contains("gumbel"));
}

fn u(ids: &[u32]) -> (DrawKind, Vec<u32>) {
    (DrawKind::UniformTokens, ids.to_vec())
}
fn cat(ids: &[u32]) -> (DrawKind, Vec<u32>) {
    (DrawKind::Categorical, ids.to_vec())
}

#[test]
fn replay_hands_back_draws_in_order() {
    let z = dists(&[0.0; 10], 2);
    let mut r = Replay::new(vec![u(&[1, 2]), cat(&[3, 4]), u(&[5, 6])]);
    let mut out = [0u32; 2];
    r.uniform_tokens(10, &mut out).unwrap();
    assert_eq!(out, [1, 2]);
    r.categorical(&RowDistributions::new(&z.0, &z.1, 10), &mut out).unwrap();
    assert_eq!(out, [3, 4]);
    assert_eq!(r.check_consumed().unwrap_err(), DrawError::Unconsumed { consumed: 2, left: 1, next: DrawKind::UniformTokens });
    r.uniform_tokens(10, &mut out).unwrap();
    assert_eq!(out, [5, 6]);
    assert_eq!((r.consumed(), r.remaining()), (3, 0));
    r.finish().unwrap();
    let kinds: Vec<_> = r.consumed_kinds().collect();
    assert_eq!(kinds, [DrawKind::UniformTokens, DrawKind::Categorical, DrawKind::UniformTokens]);
}

#[test]
fn replay_errors_name_the_draw() {
    let z = dists(&[0.0; 10], 2);
    let mut out = [0u32; 2];
    let mut r = Replay::new(vec![cat(&[1, 2])]);
    let e = r.uniform_tokens(10, &mut out).unwrap_err();
    assert_eq!(e, DrawError::KindMismatch { index: 0, expected: DrawKind::UniformTokens, recorded: DrawKind::Categorical });
    assert!(e.to_string().contains("draw 0: expected a uniform_tokens draw but the recorded draw is categorical"));
    let mut r = Replay::new(vec![u(&[1, 2, 3])]);
    let e = r.uniform_tokens(10, &mut out).unwrap_err();
    assert_eq!(e, DrawError::LengthMismatch { index: 0, kind: DrawKind::UniformTokens, expected: 2, recorded: 3 });
    let mut r = Replay::new(vec![u(&[1, 10])]);
    let e = r.uniform_tokens(10, &mut out).unwrap_err();
    assert_eq!(e, DrawError::IdOutOfRange { index: 0, kind: DrawKind::UniformTokens, position: 1, id: 10, vocab_size: 10 });
    let mut r = Replay::new(vec![]);
    let e = r.categorical(&RowDistributions::new(&z.0, &z.1, 10), &mut out).unwrap_err();
    assert_eq!(e, DrawError::Exhausted { index: 0, expected: DrawKind::Categorical });
}

//! Kernel-level parity of `sample_rows` (the per-row work of a sampler step on the GPU) against its CPU
//! twin `dg_sampler::rows`: `scaled` bit for bit, argmax exactly (ties to the first index), the entropy
//! within a relative tolerance, the draw equal to `RowDistributions::sample` unless `u` lies within
//! rounding of a CDF boundary, given ids passed through, and the first non-finite column reported. Rows
//! of 1, 3, 1000 and 262144 entries, peaked, flat and tied rows; every output carries a guard band, and
//! the random cases also run with the workgroups folded into y (an artificially small per-dimension
//! limit) to exercise the wrap-around indexing and the out-of-range workgroups.

use dg_gpu::ops::Recorder;
use dg_gpu::{GpuContext, Pipelines, PlanBuilder, groups_1d};
use dg_kernels::sample_rows::{
    self, MODE_GIVEN, MODE_UNIFORM, RESULT_ARGMAX, RESULT_ENTROPY, RESULT_NON_FINITE, RESULT_SAMPLED, RESULT_WORDS, SampleRowsParams,
    SampleStep,
};
use dg_parity::testing::{guarded_output, read_guarded, seeded, test_context};
use dg_sampler::rows::{RowDistributions, RowStat, process_row_portable, process_rows};

/// Entropy, relative: the GPU's f32 sums (blocks of 32 terms, ≤ 32 block sums per invocation, a tree
/// of 8 levels: ≤ ~70 roundings of 2⁻²⁴ relative, all terms ≥ 0) against the CPU's f32 lanes of ≤ 64
/// terms flushed into f64 (≤ ~64 roundings), plus a few ulps for `exp`, `ln` and the division (both
/// terms of `ln S + N/S` are ≥ 0, so nothing cancels): ≈ 8e-6 in the worst case.
const ENTROPY_TOLERANCE: f64 = 1e-5;
/// Entropy, absolute, per row entry: the GPU may flush subnormal `e` (below 2⁻¹²⁶) to zero where the
/// CPU keeps them; each carries at most 88·2⁻¹²⁶ of `N` (only rows whose entropy is itself ~1e-36 notice).
const ENTROPY_SUBNORMAL_PER_ENTRY: f64 = 88.0 * 1.1755e-38;
/// The draw, absolute on the CDF: the GPU's cumulative probability at an index differs from the exact
/// f64 sum of the CPU's f32 probabilities by the rounding of its f32 `S` (≈ 70 roundings relative, as
/// above), of its blocked chunk sums and prefix scan (≈ 64 + 9 roundings of the running sum ≤ 1) and of
/// `exp`/division (a few ulps): ≈ 9e-6 at worst. A differing sample is accepted only if every CDF
/// boundary between the two indices lies within this distance of `u`.
const CDF_TOLERANCE: f64 = 1e-5;

/// The per-dimension limits to run every case with: the device's own and a tiny one that folds
/// the workgroups into y.
fn limits(ctx: &GpuContext) -> [u32; 2] {
    [ctx.limits.max_compute_workgroups_per_dimension, 3]
}

/// What the kernel returned.
struct GpuRows {
    scaled: Vec<f32>,
    entropy: Vec<f32>,
    argmax: Vec<u32>,
    sampled: Vec<u32>,
    non_finite: Vec<u32>,
}

/// Runs the kernel once: through `Recorder::sample_rows` with the device's limit, else through a plan
/// folded by `max_dim`.
fn run_gpu(ctx: &GpuContext, logits: &[f32], vocab: usize, step: SampleStep, draws: &[u32], max_dim: u32) -> GpuRows {
    let rows = draws.len();
    assert_eq!(logits.len(), rows * vocab);
    let mut pipelines = Pipelines::default();
    let lb = ctx.upload("logits", logits).unwrap();
    let sb = guarded_output(ctx, "scaled", logits.len());
    let stepb = ctx.upload("step", &[step]).unwrap();
    let db = ctx.upload("draws", draws).unwrap();
    let rb = guarded_output(ctx, "results", rows * RESULT_WORDS);
    if max_dim == ctx.limits.max_compute_workgroups_per_dimension {
        let mut rec = Recorder::new(ctx, &mut pipelines);
        rec.sample_rows(&lb, &sb, &stepb, &db, &rb, (rows, 0, 0), vocab).unwrap();
        rec.finish().unwrap().run(ctx).unwrap();
    } else {
        let p = pipelines.get_source(ctx, sample_rows::source()).unwrap();
        let params = SampleRowsParams { rows: rows as u32, vocab: vocab as u32, rows_per_step: 0, first_row: 0 };
        let mut plan = PlanBuilder::new(ctx);
        plan.push(&p, &params, &[&lb, &sb, &stepb, &db, &rb], groups_1d(sample_rows::workgroups(&params), max_dim));
        plan.finish(ctx).unwrap().run(ctx).unwrap();
    }
    let scaled = read_guarded(ctx, &sb, logits.len());
    let res: Vec<u32> = read_guarded(ctx, &rb, rows * RESULT_WORDS).iter().map(|v| v.to_bits()).collect();
    let field = |k: usize| res.chunks_exact(RESULT_WORDS).map(|r| r[k]).collect::<Vec<u32>>();
    GpuRows {
        scaled,
        entropy: field(RESULT_ENTROPY).into_iter().map(f32::from_bits).collect(),
        argmax: field(RESULT_ARGMAX),
        sampled: field(RESULT_SAMPLED),
        non_finite: field(RESULT_NON_FINITE),
    }
}

/// The CPU twin: every row through `process_row_portable` (the scaled rows and their statistics).
fn run_cpu(logits: &[f32], vocab: usize, t: f32) -> (Vec<f32>, Vec<RowStat>) {
    let mut scaled = logits.to_vec();
    let stats = scaled.chunks_exact_mut(vocab).map(|row| process_row_portable(row, t)).collect();
    (scaled, stats)
}

/// Worst errors seen by [`check`], printed by the tests (run with `--nocapture`).
#[derive(Default)]
struct Seen {
    worst_entropy_rel: f64,
    draws: usize,
    boundary_mismatches: usize,
    /// The largest distance from `u` to a CDF boundary that a differing draw needed.
    widest_gap: f64,
}

/// Compares one run with the CPU.
fn check(got: &GpuRows, logits: &[f32], vocab: usize, step: SampleStep, draws: &[u32], what: &str, seen: &mut Seen) {
    let (scaled, stats) = run_cpu(logits, vocab, step.temperature);
    for (i, (g, c)) in got.scaled.iter().zip(&scaled).enumerate() {
        assert!(g.to_bits() == c.to_bits() || (g.is_nan() && c.is_nan()), "{what}: scaled[{i}] = {g:e}, CPU {c:e}");
    }
    let dist = RowDistributions::new(&scaled, &stats, vocab);
    for (r, stat) in stats.iter().enumerate() {
        let row = &scaled[r * vocab..(r + 1) * vocab];
        let what = format!("{what}: row {r}");
        if stat.entropy.is_nan() {
            let column = row.iter().position(|v| !v.is_finite()).expect("a NaN entropy has a non-finite entry");
            assert_eq!(got.non_finite[r], column as u32 + 1, "{what}: first non-finite column");
            assert!(got.entropy[r].is_nan(), "{what}: entropy {} of a non-finite row", got.entropy[r]);
            let want = if step.mode == MODE_UNIFORM { 0 } else { draws[r] };
            assert_eq!(got.sampled[r], want, "{what}: sampled of a non-finite row");
            continue;
        }
        assert_eq!(got.non_finite[r], 0, "{what}: finite row reported non-finite");
        assert_eq!(got.argmax[r], stat.argmax, "{what}: argmax");
        let (g, c) = (f64::from(got.entropy[r]), f64::from(stat.entropy));
        let err = (g - c).abs();
        assert!(
            err <= ENTROPY_TOLERANCE * c.abs() + ENTROPY_SUBNORMAL_PER_ENTRY * vocab as f64,
            "{what}: entropy {g:e}, CPU {c:e} (rel {:e})",
            err / c.abs()
        );
        if c > 0.0 {
            seen.worst_entropy_rel = seen.worst_entropy_rel.max(err / c);
        }
        if step.mode != MODE_UNIFORM {
            assert_eq!(got.sampled[r], draws[r], "{what}: given id");
            continue;
        }
        let u = f32::from_bits(draws[r]);
        let (gs, cs) = (got.sampled[r], dist.sample(r, f64::from(u)));
        seen.draws += 1;
        assert!((gs as usize) < vocab, "{what}: sampled {gs} out of range");
        if gs != cs {
            let probs = dist.probs(r);
            assert!(probs[gs as usize] > 0.0, "{what}: sampled {gs} has probability 0");
            let (lo, hi) = (gs.min(cs) as usize, gs.max(cs) as usize);
            let cdf = |v: usize| probs[..=v].iter().map(|&p| f64::from(p)).sum::<f64>();
            let (first, last) = (cdf(lo), cdf(hi - 1));
            let u = f64::from(u);
            assert!(
                first > u - CDF_TOLERANCE && last <= u + CDF_TOLERANCE,
                "{what}: u = {u} sampled {gs}, CPU {cs}: boundaries {first} .. {last} not within {CDF_TOLERANCE} of u"
            );
            seen.boundary_mismatches += 1;
            seen.widest_gap = seen.widest_gap.max(u - first).max(last - u);
        }
    }
}

/// Deterministic uniforms in [0, 1) as f32 (24 random bits), then the edge cases 0 and 1 − 2⁻²⁴.
fn uniforms(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut u: Vec<f32> = (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32
        })
        .collect();
    if n >= 2 {
        u[0] = 0.0;
        u[1] = f32::from_bits(0x3f7f_ffff);
    }
    u
}

fn bits(u: &[f32]) -> Vec<u32> {
    u.iter().map(|v| v.to_bits()).collect()
}

/// `base` rows repeated `reps` times (row `k·base + b` is base row `b`), so that one dispatch draws
/// many uniforms from the same distributions.
fn repeated(base: &[f32], reps: usize) -> Vec<f32> {
    base.iter().copied().cycle().take(base.len() * reps).collect()
}

#[test]
fn random_rows_match_cpu() {
    let Some(ctx) = test_context("random_rows_match_cpu") else { return };
    let mut seen = Seen::default();
    // (V, distinct rows, repetitions): up to 256 rows per dispatch, the real canvas height.
    for &(vocab, base_rows, reps) in &[(1, 2, 8), (3, 4, 16), (1000, 4, 64), (262_144, 2, 6)] {
        let base = seeded(base_rows * vocab, 31 + vocab as u64 * 3 + base_rows as u64, 30.0);
        let logits = repeated(&base, reps);
        let rows = base_rows * reps;
        for t in [0.8f32, 0.408] {
            let draws = bits(&uniforms(rows, 7 + vocab as u64 + t.to_bits() as u64));
            for max_dim in limits(&ctx) {
                let what = format!("V={vocab} rows={rows} T={t} fold={max_dim}");
                let step = SampleStep::new(t, MODE_UNIFORM);
                let got = run_gpu(&ctx, &logits, vocab, step, &draws, max_dim);
                check(&got, &logits, vocab, step, &draws, &what, &mut seen);
                // Given ids: passed through, and nothing else changes.
                let ids: Vec<u32> = (0..rows).map(|r| ((r * 7919 + 13) % vocab) as u32).collect();
                let step = SampleStep::new(t, MODE_GIVEN);
                let given = run_gpu(&ctx, &logits, vocab, step, &ids, max_dim);
                check(&given, &logits, vocab, step, &ids, &format!("{what} given"), &mut seen);
                assert_eq!(bits(&given.entropy), bits(&got.entropy), "{what}: entropy differs between modes");
                assert_eq!(given.argmax, got.argmax, "{what}: argmax differs between modes");
            }
        }
    }
    eprintln!(
        "random rows: worst entropy rel err {:e}; {} of {} draws differ from the CPU, at most {:e} from a CDF boundary",
        seen.worst_entropy_rel, seen.boundary_mismatches, seen.draws, seen.widest_gap
    );
}

/// The CDF boundaries themselves as uniforms: the cumulative probability (rounded to f32) at a few
/// indices around the argmax and at random indices, and just below and above each.
#[test]
fn draws_at_cdf_boundaries_match_cpu_within_rounding() {
    let Some(ctx) = test_context("draws_at_cdf_boundaries_match_cpu_within_rounding") else { return };
    let mut seen = Seen::default();
    for &(vocab, t) in &[(1000, 0.8f32), (262_144, 0.408)] {
        let row = seeded(vocab, 500 + vocab as u64, 30.0);
        let (scaled, stats) = run_cpu(&row, vocab, t);
        let probs = RowDistributions::new(&scaled, &stats, vocab).probs(0);
        let mut cum = Vec::with_capacity(vocab);
        let mut acc = 0f64;
        for &p in &probs {
            acc += f64::from(p);
            cum.push(acc);
        }
        let a = stats[0].argmax as usize;
        let mut at: Vec<usize> = vec![a.saturating_sub(1), a, (a + 1).min(vocab - 1), vocab / 2, vocab - 1];
        at.extend(uniforms(16, 3).iter().map(|&u| (u * vocab as f32) as usize));
        let mut u = Vec::new();
        for v in at {
            let b = cum[v] as f32;
            u.extend([b, f32::from_bits(b.to_bits().saturating_sub(1)), f32::from_bits(b.to_bits() + 1)]);
        }
        u.retain(|&x| (0.0..1.0).contains(&x));
        let logits = repeated(&row, u.len());
        let step = SampleStep::new(t, MODE_UNIFORM);
        let draws = bits(&u);
        let got = run_gpu(&ctx, &logits, vocab, step, &draws, ctx.limits.max_compute_workgroups_per_dimension);
        check(&got, &logits, vocab, step, &draws, &format!("V={vocab} boundaries"), &mut seen);
    }
    eprintln!(
        "boundaries: {} of {} draws differ from the CPU, at most {:e} from a CDF boundary",
        seen.boundary_mismatches, seen.draws, seen.widest_gap
    );
}

#[test]
fn peaked_and_flat_rows() {
    let Some(ctx) = test_context("peaked_and_flat_rows") else { return };
    let mut seen = Seen::default();
    let max_dim = ctx.limits.max_compute_workgroups_per_dimension;
    // One logit 18, the others 0 (V = 10000, T = 1): S − 1 ≈ 1.5e-4, entropy 2.893e-3 (spec §8.3).
    let vocab = 10_000;
    let mut row = vec![0f32; vocab];
    row[4321] = 18.0;
    let u = uniforms(32, 11);
    let logits = repeated(&row, u.len());
    let step = SampleStep::new(1.0, MODE_UNIFORM);
    let got = run_gpu(&ctx, &logits, vocab, step, &bits(&u), max_dim);
    check(&got, &logits, vocab, step, &bits(&u), "peaked row", &mut seen);
    let tail = (vocab - 1) as f64 * (-18f64).exp();
    let exact = tail.ln_1p() + 18.0 * tail / (1.0 + tail);
    assert!((exact - 2.893e-3).abs() < 5e-7, "closed form {exact}");
    for (r, &e) in got.entropy.iter().enumerate() {
        let err = (f64::from(e) - exact).abs() / exact;
        assert!(err <= ENTROPY_TOLERANCE, "peaked row {r}: entropy {e:e}, exact {exact:e} (rel {err:e})");
        seen.worst_entropy_rel = seen.worst_entropy_rel.max(err);
        assert_eq!(got.argmax[r], 4321);
    }
    let cpu = f64::from(run_cpu(&row, vocab, 1.0).1[0].entropy);
    eprintln!("peaked row: GPU entropy {:e}, CPU {cpu:e}, exact {exact:e}", got.entropy[0]);
    // All entries equal: entropy ln V, argmax 0, every index as likely.
    for &(vocab, t) in &[(1000, 0.8f32), (262_144, 0.408)] {
        let row = vec![3.25f32; vocab];
        let u = uniforms(24, vocab as u64);
        let logits = repeated(&row, u.len());
        let step = SampleStep::new(t, MODE_UNIFORM);
        let got = run_gpu(&ctx, &logits, vocab, step, &bits(&u), max_dim);
        check(&got, &logits, vocab, step, &bits(&u), &format!("flat V={vocab}"), &mut seen);
        let exact = (vocab as f64).ln();
        for (r, &e) in got.entropy.iter().enumerate() {
            let err = (f64::from(e) - exact).abs() / exact;
            assert!(err <= ENTROPY_TOLERANCE, "flat V={vocab} row {r}: entropy {e}, ln V {exact} (rel {err:e})");
            seen.worst_entropy_rel = seen.worst_entropy_rel.max(err);
            assert_eq!(got.argmax[r], 0);
        }
    }
    eprintln!(
        "peaked and flat rows: worst entropy rel err {:e}; {} of {} draws differ from the CPU, at most {:e} from a CDF boundary",
        seen.worst_entropy_rel, seen.boundary_mismatches, seen.draws, seen.widest_gap
    );
}

#[test]
fn argmax_ties_take_the_first_index() {
    let Some(ctx) = test_context("argmax_ties_take_the_first_index") else { return };
    let mut seen = Seen::default();
    let max_dim = ctx.limits.max_compute_workgroups_per_dimension;
    // (V, tied indices, first): the same invocation (5 and 261 are both column ≡ 5 mod 256), a lower
    // index in a higher invocation (260 < 300, invocations 4 and 44), ends of the row, a vocab row.
    let cases: &[(usize, &[usize], u32)] = &[
        (1000, &[261, 5, 700], 5),
        (1000, &[999, 517], 517),
        (1000, &[300, 260], 260),
        (3, &[2, 1], 1),
        (262_144, &[262_143, 131_072, 70_000], 70_000),
    ];
    for (k, &(vocab, tied, first)) in cases.iter().enumerate() {
        let mut row: Vec<f32> = seeded(vocab, 900 + k as u64, 8.0);
        for &i in tied {
            row[i] = 9.5;
        }
        let u = uniforms(8, 40 + k as u64);
        let logits = repeated(&row, u.len());
        for t in [0.8f32, 0.408] {
            let step = SampleStep::new(t, MODE_UNIFORM);
            let got = run_gpu(&ctx, &logits, vocab, step, &bits(&u), max_dim);
            check(&got, &logits, vocab, step, &bits(&u), &format!("ties V={vocab} {tied:?} T={t}"), &mut seen);
            assert!(got.argmax.iter().all(|&a| a == first), "ties {tied:?}: argmax {:?}, want {first}", got.argmax);
        }
    }
    // All negative with a tie at the max.
    let row = vec![-4.0f32, -1.5, -3.0, -1.5, -2.0];
    let step = SampleStep::new(0.8, MODE_UNIFORM);
    let got = run_gpu(&ctx, &row, 5, step, &bits(&[0.3]), max_dim);
    check(&got, &row, 5, step, &bits(&[0.3]), "negative ties", &mut seen);
    assert_eq!(got.argmax, [1]);
}

#[test]
fn non_finite_rows_report_their_first_column() {
    let Some(ctx) = test_context("non_finite_rows_report_their_first_column") else { return };
    let mut seen = Seen::default();
    let t = 0.408f32;
    for &vocab in &[1000usize, 262_144] {
        let rows = 6;
        let mut logits = seeded(rows * vocab, 77 + vocab as u64, 30.0);
        let last = vocab - 1;
        // Row 0 and row 5 stay finite.
        logits[vocab + 600] = f32::NAN; // row 1: NaN at 600 after +inf at 17
        logits[vocab + 17] = f32::INFINITY;
        logits[2 * vocab + last] = f32::NEG_INFINITY; // row 2: -inf in the last column
        logits[3 * vocab + 2] = 3.0e38; // row 3: finite, but 3e38 / 0.408 overflows
        logits[4 * vocab] = f32::NAN; // row 4: NaN in column 0
        let want = [0, 18, vocab as u32, 3, 1, 0];
        // The CPU's own report for each row alone.
        for (r, &w) in want.iter().enumerate() {
            let mut row = logits[r * vocab..(r + 1) * vocab].to_vec();
            let mut stat = [RowStat::default()];
            match process_rows(&mut row, vocab, t, &mut stat) {
                Ok(()) => assert_eq!(w, 0, "row {r}: the CPU finds it finite"),
                Err(e) => assert_eq!(e.column as u32 + 1, w, "row {r}: the CPU reports column {}", e.column),
            }
        }
        for mode in [MODE_UNIFORM, MODE_GIVEN] {
            let step = SampleStep::new(t, mode);
            let draws = if mode == MODE_UNIFORM { bits(&uniforms(rows, 5)) } else { (0..rows as u32).map(|r| r + 100).collect() };
            let got = run_gpu(&ctx, &logits, vocab, step, &draws, ctx.limits.max_compute_workgroups_per_dimension);
            check(&got, &logits, vocab, step, &draws, &format!("non-finite V={vocab} mode {mode}"), &mut seen);
            assert_eq!(got.non_finite, want, "V={vocab} mode {mode}: first non-finite columns + 1");
        }
    }
}

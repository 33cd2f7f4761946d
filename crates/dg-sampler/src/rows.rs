//! Per-row work on the logits of one denoising step: temperature, softmax, entropy, argmax, and the
//! per-row categorical distributions the sample is drawn from.
//!
//! Mirrors, for each canvas row, what `DiffusionGemmaGenerationMixin._denoising_step` does with the raw
//! logits: `LinearTemperatureScheduleLogitsProcessor` (`raw / T`, an f32 division), `torch.softmax(..,
//! dtype=float32)`, `torch.argmax` (first maximal index) and the entropy of
//! `torch.distributions.Categorical(logits=proc)` used by `EntropyBoundSampler.accept_canvas` and
//! `StableAndConfidentStoppingCriteria`.
//!
//! With `d = proc − max`, `e = exp(d)`, `S = Σ e` and `N = −Σ e·d`, the probabilities are `e / S` and the
//! entropy `−Σ p·log p = ln S + N / S` (the same sum as the reference's `−Σ p·(proc − logsumexp)`, where
//! entries with `p = 0` contribute 0). Every row is reduced by one thread in a fixed order (16 f32 lanes
//! flushed into f64 every 1024 entries), so the results do not depend on the thread count; `exp` is a
//! fixed polynomial, so they do not depend on the platform's math library either (only the final
//! `ln` per row does). Entries equal to the row maximum are counted apart from the other terms of `S`,
//! so a peaked row's tiny terms are not lost next to the maximum's exact 1 (spec §8.3 needs
//! `S − 1 ≈ 1.5e−4` to better than f32 precision of `S`).
//!
//! The probabilities are not stored: [`RowDistributions`] evaluates `exp(x − max) / S` when the random
//! source reads them (a C×V probability buffer would double the memory traffic of a step).

use rayon::prelude::*;

const LANES: usize = 16;
/// Entries per f32 partial sum before it is added into f64.
const BLOCK: usize = 1024;

const LOG2E: f32 = std::f32::consts::LOG2_E;
const LN2_HI: f32 = 355.0 / 512.0; // n·LN2_HI is exact for |n| ≤ 2^15
const LN2_LO: f32 = -2.121_944_4e-4;
/// Below ln(f32::MIN_POSITIVE) the result is 0: such entries have no weight in the sums or the draw.
const EXP_LO: f32 = -87.336_55;
/// 1.5·2^23: adding it rounds a float below 2^22 in magnitude to the nearest integer.
const ROUND_MAGIC: f32 = 12_582_912.0;

/// `(exp(d), max(d, EXP_LO))` for `d ≤ 0` (Cephes' `expf`: Cody–Waite reduction and a degree-5
/// polynomial, within 2 ulp; exactly 1 at 0 and exactly 0 below `EXP_LO`). Branch-free, so that the
/// loops using it vectorise.
#[inline(always)]
fn exp_nonpos(d: f32) -> (f32, f32) {
    let dc = d.max(EXP_LO);
    let t = dc * LOG2E + ROUND_MAGIC;
    let n = t - ROUND_MAGIC;
    let r = (dc - n * LN2_HI) - n * LN2_LO;
    let mut y = 1.987_569_2e-4_f32;
    y = y * r + 1.398_199_9e-3;
    y = y * r + 8.333_452e-3;
    y = y * r + 4.166_579_6e-2;
    y = y * r + 1.666_666_5e-1;
    y = y * r + 0.5; // Cephes: 5.0000001201e-1, which is 0.5 in f32
    y = y * (r * r) + r + 1.0;
    // t's bits are ROUND_MAGIC's plus n, so the exponent field of 2^n is (n + 127) << 23.
    let n_int = (t.to_bits() as i32).wrapping_sub(ROUND_MAGIC.to_bits() as i32);
    let scale = f32::from_bits(((n_int + 127) << 23) as u32);
    let keep = u32::from(d >= EXP_LO).wrapping_neg(); // all ones, or zero below EXP_LO (and for NaN)
    (f32::from_bits((y * scale).to_bits() & keep), dc)
}

/// `exp(x)` for `x ≤ 0` with the sampler's own polynomial (exposed for tests).
pub fn exp_nonpositive(x: f32) -> f32 {
    exp_nonpos(x).0
}

/// Divides the row by `t` in place; returns the maximum, its first index, and whether all values are finite.
#[inline(always)]
fn scale_argmax(row: &mut [f32], t: f32) -> (f32, u32, bool) {
    let mut m = [f32::NEG_INFINITY; LANES];
    let mut bad = [0f32; LANES];
    let mut chunks = row.chunks_exact_mut(LANES);
    for ch in &mut chunks {
        let ch: &mut [f32; LANES] = ch.try_into().unwrap();
        for l in 0..LANES {
            let y = ch[l] / t;
            ch[l] = y;
            bad[l] += y * 0.0; // stays 0 for finite values, becomes NaN for ±inf or NaN
            m[l] = if y > m[l] { y } else { m[l] };
        }
    }
    for (l, x) in chunks.into_remainder().iter_mut().enumerate() {
        let y = *x / t;
        *x = y;
        bad[l] += y * 0.0;
        m[l] = if y > m[l] { y } else { m[l] };
    }
    let mut max = m[0];
    for &v in &m[1..] {
        max = if v > max { v } else { max };
    }
    let finite = bad.iter().all(|&b| b == 0.0);
    (max, first_index_of(row, max), finite)
}

/// First index of `value` in `row` (0 if absent), testing 64 entries at a time.
#[inline(always)]
fn first_index_of(row: &[f32], value: f32) -> u32 {
    for (c, chunk) in row.chunks(64).enumerate() {
        if chunk.iter().fold(false, |any, &y| any | (y == value)) {
            let i = chunk.iter().position(|&y| y == value).unwrap_or(0);
            return (c * 64 + i) as u32;
        }
    }
    0
}

fn sum_lanes(lanes: &[f32; LANES]) -> f64 {
    lanes.iter().map(|&v| f64::from(v)).sum()
}

/// Sums of one row's exponentials. Entries equal to the maximum (`e` exactly 1) are counted apart, so
/// that the f32 partial sums never hold a 1 next to the tiny terms of a peaked row (`S − 1` stays exact
/// enough for small entropies).
#[derive(Debug, Clone, Copy)]
struct ExpSums {
    /// Number of entries equal to the maximum.
    at_max: f64,
    /// Σ e over the other entries.
    rest: f64,
    /// N = −Σ e·(x − max).
    weighted: f64,
}

/// The sums of `exp(x − max)` over a row: f32 lanes, added into f64 every `BLOCK` entries.
#[inline(always)]
fn exp_sums(row: &[f32], max: f32) -> ExpSums {
    let mut sums = ExpSums { at_max: 0.0, rest: 0.0, weighted: 0.0 };
    for block in row.chunks(BLOCK) {
        let mut lc = [0f32; LANES];
        let mut ls = [0f32; LANES];
        let mut ln = [0f32; LANES];
        let mut chunks = block.chunks_exact(LANES);
        for x in &mut chunks {
            let x: &[f32; LANES] = x.try_into().unwrap();
            for l in 0..LANES {
                let (e, dc) = exp_nonpos(x[l] - max);
                let one = f32::from_bits(u32::from(x[l] == max).wrapping_neg() & 1f32.to_bits());
                lc[l] += one;
                ls[l] += e - one;
                ln[l] -= e * dc;
            }
        }
        for (l, x) in chunks.remainder().iter().enumerate() {
            let (e, dc) = exp_nonpos(*x - max);
            let one = if *x == max { 1.0 } else { 0.0 };
            lc[l] += one;
            ls[l] += e - one;
            ln[l] -= e * dc;
        }
        sums.at_max += sum_lanes(&lc);
        sums.rest += sum_lanes(&ls);
        sums.weighted += sum_lanes(&ln);
    }
    sums
}

/// Per-row results of one step.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RowStat {
    /// Entropy (nats) of the row's softmax; NaN when the scaled row is not finite.
    pub entropy: f32,
    /// First index of the maximum.
    pub argmax: u32,
    /// The maximum scaled logit.
    pub max: f32,
    /// `S = Σ exp(x − max)`, rounded to f32: the softmax is `exp(x − max) / S`.
    pub sum: f32,
}

/// The three steps of a row, given the implementations of each (portable or CPU-specific builds).
#[inline(always)]
fn process_row_with(
    row: &mut [f32],
    t: f32,
    scale: impl Fn(&mut [f32], f32) -> (f32, u32, bool),
    exp: impl Fn(&[f32], f32) -> ExpSums,
) -> RowStat {
    let (max, argmax, finite) = scale(row, t);
    if !finite {
        return RowStat { entropy: f32::NAN, argmax, max, sum: f32::NAN };
    }
    let sums = exp(row, max);
    let s = sums.at_max + sums.rest;
    let ln_s = ((sums.at_max - 1.0) + sums.rest).ln_1p();
    RowStat { entropy: (ln_s + sums.weighted / s) as f32, argmax, max, sum: s as f32 }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! The same kernels compiled for AVX2 and AVX-512. Only IEEE add/sub/mul/div, comparisons and bit
    //! operations are used and Rust never contracts them into FMA, so every build gives identical bits.
    use super::ExpSums;

    #[target_feature(enable = "avx2")]
    pub fn scale_argmax_avx2(row: &mut [f32], t: f32) -> (f32, u32, bool) {
        super::scale_argmax(row, t)
    }
    #[target_feature(enable = "avx2")]
    pub fn exp_sums_avx2(row: &[f32], max: f32) -> ExpSums {
        super::exp_sums(row, max)
    }
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl")]
    pub fn exp_sums_avx512(row: &[f32], max: f32) -> ExpSums {
        super::exp_sums(row, max)
    }
    #[target_feature(enable = "avx2")]
    pub fn probs_avx2(row: &[f32], max: f32, sum: f32, out: &mut [f32]) {
        super::probs_of(row, max, sum, out)
    }
    #[target_feature(enable = "avx2")]
    pub fn sample_avx2(row: &[f32], max: f32, sum: f32, u: f64) -> u32 {
        super::sample_row(row, max, sum, u)
    }
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl")]
    pub fn sample_avx512(row: &[f32], max: f32, sum: f32, u: f64) -> u32 {
        super::sample_row(row, max, sum, u)
    }

    pub fn has_avx512() -> bool {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512dq")
            && std::arch::is_x86_feature_detected!("avx512vl")
    }
}

/// `row ← row / t` and the row's statistics, with the widest vector build the CPU supports.
fn process_row(row: &mut [f32], t: f32) -> RowStat {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY (all closures): the CPU supports the features each function is built for, checked
        // here and just below.
        let scale = |r: &mut [f32], t: f32| unsafe { x86::scale_argmax_avx2(r, t) };
        return if x86::has_avx512() {
            process_row_with(row, t, scale, |r, m| unsafe { x86::exp_sums_avx512(r, m) })
        } else {
            process_row_with(row, t, scale, |r, m| unsafe { x86::exp_sums_avx2(r, m) })
        };
    }
    process_row_portable(row, t)
}

/// The portable build of the row kernel, exposed so tests can check that every build agrees bit for bit.
pub fn process_row_portable(row: &mut [f32], t: f32) -> RowStat {
    process_row_with(row, t, scale_argmax, exp_sums)
}

/// `exp(x − max) / sum` for a row.
#[inline(always)]
fn probs_of(row: &[f32], max: f32, sum: f32, out: &mut [f32]) {
    for (o, &x) in out.iter_mut().zip(row) {
        *o = exp_nonpos(x - max).0 / sum;
    }
}

/// A logit that is not finite after temperature scaling.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NonFinite {
    pub row: usize,
    pub column: usize,
    pub value: f32,
}

/// For every row of `logits` (`rows × vocab_size`, row-major, `rows = stats.len()`), in parallel over
/// rows: divides by `temperature` in place and writes the row's entropy, argmax, max and softmax sum.
/// Reports the first (lowest row, then column) non-finite scaled logit.
///
/// # Panics
/// If `logits.len() != stats.len() × vocab_size` or `vocab_size == 0`.
pub fn process_rows(logits: &mut [f32], vocab_size: usize, temperature: f32, stats: &mut [RowStat]) -> Result<(), NonFinite> {
    assert!(
        vocab_size > 0 && logits.len() == stats.len() * vocab_size,
        "process_rows: {} logits for {} rows of {vocab_size}",
        logits.len(),
        stats.len()
    );
    logits.par_chunks_mut(vocab_size).zip(stats.par_iter_mut()).for_each(|(row, stat)| *stat = process_row(row, temperature));
    match stats.iter().position(|s| s.entropy.is_nan()) {
        None => Ok(()),
        Some(row) => {
            let values = &logits[row * vocab_size..(row + 1) * vocab_size];
            let column = values.iter().position(|v| !v.is_finite()).unwrap_or(0);
            Err(NonFinite { row, column, value: values[column] })
        }
    }
}

/// The categorical distributions of one step, one per canvas row: `p[r][v] = exp(x[r][v] − max[r]) /
/// sum[r]` over the temperature-scaled logits `x` (`torch.softmax(proc, dtype=float32)`), evaluated on
/// demand with the sampler's `exp` so that no C×V probability buffer is written.
#[derive(Debug, Clone, Copy)]
pub struct RowDistributions<'a> {
    scaled_logits: &'a [f32],
    stats: &'a [RowStat],
    vocab_size: usize,
}

const CDF_CHUNK: usize = 64;

impl<'a> RowDistributions<'a> {
    /// # Panics
    /// If `scaled_logits.len() != stats.len() × vocab_size` or `vocab_size == 0`.
    pub fn new(scaled_logits: &'a [f32], stats: &'a [RowStat], vocab_size: usize) -> Self {
        assert!(
            vocab_size > 0 && scaled_logits.len() == stats.len() * vocab_size,
            "RowDistributions: {} logits for {} rows of {vocab_size}",
            scaled_logits.len(),
            stats.len()
        );
        RowDistributions { scaled_logits, stats, vocab_size }
    }

    pub fn rows(&self) -> usize {
        self.stats.len()
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    fn row(&self, row: usize) -> (&'a [f32], f32, f32) {
        let s = &self.stats[row];
        let x = &self.scaled_logits[row * self.vocab_size..(row + 1) * self.vocab_size];
        (x, s.max, s.sum)
    }

    /// Writes the probabilities of `row` into `out` (`vocab_size` long).
    pub fn probs_into(&self, row: usize, out: &mut [f32]) {
        let (x, max, sum) = self.row(row);
        assert_eq!(out.len(), x.len(), "probs_into: output length");
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2, checked just above.
            return unsafe { x86::probs_avx2(x, max, sum, out) };
        }
        probs_of(x, max, sum, out)
    }

    /// The probabilities of `row`, allocated.
    pub fn probs(&self, row: usize) -> Vec<f32> {
        let mut out = vec![0.0; self.vocab_size];
        self.probs_into(row, &mut out);
        out
    }

    /// Inverse CDF: the first index of `row` whose running probability sum exceeds `u ∈ [0, 1)`. The
    /// f32 probabilities are summed in index order in f64, 64 at a time (a chunk is rescanned entry by
    /// entry when its sum crosses `u`). Zero-probability entries are never returned; if rounding leaves
    /// `u` above the row total, the last entry with non-zero probability is returned.
    pub fn sample(&self, row: usize, u: f64) -> u32 {
        let (x, max, sum) = self.row(row);
        #[cfg(target_arch = "x86_64")]
        {
            // SAFETY: the CPU supports the features each build needs, checked just before the call.
            if x86::has_avx512() {
                return unsafe { x86::sample_avx512(x, max, sum, u) };
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                return unsafe { x86::sample_avx2(x, max, sum, u) };
            }
        }
        sample_row(x, max, sum, u)
    }
}

/// See [`RowDistributions::sample`].
#[inline(always)]
fn sample_row(x: &[f32], max: f32, sum: f32, u: f64) -> u32 {
    let mut cum = 0f64;
    let mut buf = [0f32; CDF_CHUNK];
    for (c, chunk) in x.chunks(CDF_CHUNK).enumerate() {
        let p = &mut buf[..chunk.len()];
        probs_of(chunk, max, sum, p);
        let mut lanes = [0f64; 8];
        let mut groups = p.chunks_exact(8);
        for g in &mut groups {
            for (l, &pi) in lanes.iter_mut().zip(g) {
                *l += f64::from(pi);
            }
        }
        for (l, &pi) in lanes.iter_mut().zip(groups.remainder()) {
            *l += f64::from(pi);
        }
        let chunk_sum = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
        if cum + chunk_sum > u {
            let mut within = cum;
            for (i, &pi) in p.iter().enumerate() {
                within += f64::from(pi);
                if within > u && pi > 0.0 {
                    return (c * CDF_CHUNK + i) as u32;
                }
            }
        }
        cum += chunk_sum;
    }
    let last = x.iter().rposition(|&xi| exp_nonpos(xi - max).0 / sum > 0.0);
    last.unwrap_or(0) as u32
}

/// Entropy (nats) of `softmax(logits)` for one row, as `Categorical(logits=..).entropy()` defines it.
pub fn entropy(logits: &[f32]) -> f32 {
    process_row(&mut logits.to_vec(), 1.0).entropy
}

/// `softmax(logits / temperature)` for one row, with the sampler's arithmetic.
pub fn softmax(logits: &[f32], temperature: f32) -> Vec<f32> {
    let mut row = logits.to_vec();
    let stat = [process_row(&mut row, temperature)];
    RowDistributions::new(&row, &stat, row.len()).probs(0)
}

/// First index of the maximum of one row (`torch.argmax`).
pub fn argmax(logits: &[f32]) -> u32 {
    scale_argmax(&mut logits.to_vec(), 1.0).1
}

//! Randomness of the sampler: the two kinds of draw the reference makes, and a portable seeded source.
//!
//! The reference draws with `torch.randint` (`EntropyBoundSampler.initialize_canvas`, used for the initial
//! canvas of a block and for the renoise candidates of every step) and `torch.multinomial` (one sample per
//! canvas row in `DiffusionGemmaGenerationMixin._denoising_step`). PyTorch's generators cannot be
//! reproduced here, so the sampler takes a [`RandomSource`]: [`SeededRng`] for users, and
//! [`crate::Replay`] to consume draws recorded from a reference run.
//!
//! `SeededRng` is xoshiro256** seeded through SplitMix64. Every output is defined by integer arithmetic
//! and IEEE f32/f64 operations in a fixed order (the probabilities use the sampler's own `exp`), so the
//! same seed and logits give the same draws on every platform and with any number of threads.

use rayon::prelude::*;

use crate::error::DrawError;
use crate::rows::RowDistributions;

/// The two kinds of random draw, in the names used by `reference.json`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DrawKind {
    /// C ids uniform in `[0, V)` (`torch.randint`).
    UniformTokens,
    /// One id per canvas row, sampled from that row's probabilities (`torch.multinomial`).
    Categorical,
}

impl DrawKind {
    /// The name used in `reference.json` (`"uniform_tokens"` or `"categorical"`).
    pub fn as_str(self) -> &'static str {
        match self {
            DrawKind::UniformTokens => "uniform_tokens",
            DrawKind::Categorical => "categorical",
        }
    }
}

impl std::fmt::Display for DrawKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for DrawKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "uniform_tokens" => Ok(DrawKind::UniformTokens),
            "categorical" => Ok(DrawKind::Categorical),
            other => Err(format!("unknown draw kind {other:?} (expected \"uniform_tokens\" or \"categorical\")")),
        }
    }
}

/// Source of the reference's random draws, consumed in call order.
pub trait RandomSource {
    /// Fills `out` (one canvas, C ids) with ids uniform in `[0, vocab_size)`.
    fn uniform_tokens(&mut self, vocab_size: usize, out: &mut [u32]) -> Result<(), DrawError>;

    /// Samples one id per row of `dists` (the softmax of each canvas row) into `out` (`dists.rows()`
    /// long).
    fn categorical(&mut self, dists: &RowDistributions<'_>, out: &mut [u32]) -> Result<(), DrawError>;

    /// The next categorical draw of `rows` rows over `vocab_size` ids, as inputs for a model that
    /// samples where the probabilities live (on the GPU): consumes exactly the randomness
    /// [`Self::categorical`] would.
    fn categorical_request(&mut self, rows: usize, vocab_size: usize) -> Result<CategoricalRequest<'_>, DrawError>;

    /// Called once when a generation completes; a recording reports draws left unconsumed here.
    fn finish(&mut self) -> Result<(), DrawError> {
        Ok(())
    }
}

impl<R: RandomSource + ?Sized> RandomSource for &mut R {
    fn uniform_tokens(&mut self, vocab_size: usize, out: &mut [u32]) -> Result<(), DrawError> {
        (**self).uniform_tokens(vocab_size, out)
    }
    fn categorical(&mut self, dists: &RowDistributions<'_>, out: &mut [u32]) -> Result<(), DrawError> {
        (**self).categorical(dists, out)
    }
    fn categorical_request(&mut self, rows: usize, vocab_size: usize) -> Result<CategoricalRequest<'_>, DrawError> {
        (**self).categorical_request(rows, vocab_size)
    }
    fn finish(&mut self) -> Result<(), DrawError> {
        (**self).finish()
    }
}

/// The categorical draw of one step, handed to a model that samples where the logits live.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum CategoricalRequest<'a> {
    /// One uniform `u ∈ [0, 1)` per row: the sample is the first id whose cumulative probability
    /// (in index order) exceeds `u`, as [`RowDistributions::sample`] does.
    Uniforms(&'a [f64]),
    /// The sampled ids themselves (a recorded draw).
    Ids(&'a [u32]),
}

/// SplitMix64 step (Steele, Lea, Flood 2014): used only to expand a seed into xoshiro state.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Seeded, portable generator: xoshiro256** (Blackman & Vigna) with SplitMix64 seeding.
///
/// - `uniform_tokens`: each id takes the upper 32 bits of one output and maps them to `[0, V)` with
///   Lemire's multiply-and-reject method (no modulo bias; a rejected value draws again).
/// - `categorical`: one uniform `u = (x >> 11) · 2⁻⁵³ ∈ [0, 1)` per row, drawn for all rows in row order
///   first; then each row (in parallel, independently) is sampled by inverse CDF over its f32
///   probabilities in index order ([`RowDistributions::sample`]).
#[derive(Debug, Clone)]
pub struct SeededRng {
    s: [u64; 4],
    /// Per-row uniforms of the current categorical draw; reused, so steady-state draws do not allocate.
    uniforms: Vec<f64>,
}

impl SeededRng {
    pub fn new(seed: u64) -> Self {
        let mut sm = seed;
        let s = [splitmix64(&mut sm), splitmix64(&mut sm), splitmix64(&mut sm), splitmix64(&mut sm)];
        SeededRng { s, uniforms: Vec::new() }
    }

    /// The next raw 64-bit output.
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// A uniform f64 in `[0, 1)` from the top 53 bits of one output.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// The per-row uniforms of one categorical draw, in row order.
    fn fill_uniforms(&mut self, rows: usize) {
        self.uniforms.clear();
        for _ in 0..rows {
            let u = self.next_f64();
            self.uniforms.push(u);
        }
    }

    /// A uniform integer in `[0, n)` (`n ≥ 1`), without modulo bias.
    pub fn below(&mut self, n: u32) -> u32 {
        assert!(n > 0, "SeededRng::below needs n >= 1");
        loop {
            let x = (self.next_u64() >> 32) as u32;
            let m = u64::from(x) * u64::from(n);
            let low = m as u32;
            // Reject the 2^32 mod n values of x that would over-represent the smallest results.
            if low >= n || low >= n.wrapping_neg() % n {
                return (m >> 32) as u32;
            }
        }
    }
}

impl RandomSource for SeededRng {
    fn uniform_tokens(&mut self, vocab_size: usize, out: &mut [u32]) -> Result<(), DrawError> {
        let n = u32::try_from(vocab_size).expect("vocab_size fits in u32 (checked by the sampler)");
        for o in out.iter_mut() {
            *o = self.below(n);
        }
        Ok(())
    }

    fn categorical(&mut self, dists: &RowDistributions<'_>, out: &mut [u32]) -> Result<(), DrawError> {
        if out.len() != dists.rows() {
            return Err(DrawError::RowCount { expected: dists.rows(), got: out.len() });
        }
        self.fill_uniforms(out.len());
        out.par_iter_mut().zip(self.uniforms.par_iter()).enumerate().for_each(|(row, (o, &u))| *o = dists.sample(row, u));
        Ok(())
    }

    fn categorical_request(&mut self, rows: usize, _vocab_size: usize) -> Result<CategoricalRequest<'_>, DrawError> {
        self.fill_uniforms(rows);
        Ok(CategoricalRequest::Uniforms(&self.uniforms))
    }
}

//! The per-row work of one denoising step on the GPU, so that the `[rows, V]` logits never leave it:
//! temperature scaling, max and first argmax, the entropy of the row's softmax, and the inverse-CDF
//! draw of the sampled token.
//!
//! Mirrors `dg_sampler::rows`: `process_row` (`proc = x / T` as an f32 division, max and FIRST index
//! of the max, `S = count_at_max + Σ_{x<max} e`, `N = −Σ e·(x − max)`, entropy `ln S + N / S`, with
//! `e = exp(x − max)` by the same Cephes polynomial as `exp_nonpos`) and `RowDistributions::sample`
//! (probabilities `e / S` rounded to f32 in index order; the first index whose running sum exceeds `u`
//! and whose probability is > 0; if rounding leaves `u` above the total, the last index with
//! probability > 0).
//!
//! One workgroup per row, looping over rows of any length `V ≥ 1` (262144 for the vocab). WGSL has no
//! f64, so the sums are f32: per invocation in blocks of [`SUM_BLOCK`] terms (the block sums added
//! into a second accumulator, like the CPU's f32 lanes flushed into f64), then a workgroup tree. The
//! entries equal to the max are counted apart (as an integer) so peaked rows keep `S − 1` exact enough.
//! The draw gives each invocation a contiguous chunk of the row: chunk sums, a workgroup prefix scan,
//! then the invocation whose chunk crosses `u` rescans it entry by entry with the same arithmetic.
//!
//! `scaled` equals the CPU's `x / T` bit for bit: Vulkan lets the hardware's f32 division be off by 2.5
//! ulp (an H200's is off by one for some logits), so the kernel corrects the hardware quotient with an
//! exact integer test of its rounding interval (`div_rn` in the WGSL; its logic is mirrored and checked
//! from guesses up to 3 ulps off in the tests below). `exp` is the CPU's Cephes polynomial and `ln S`
//! Cephes' `logf` on `S − 1` (the CPU takes an f64 `ln_1p`), so no result depends on the platform's
//! transcendentals, which Vulkan bounds loosely (`log` only to 2⁻²¹ absolute near 1).

use bytemuck::{Pod, Zeroable};

use crate::{Access, KernelSource, with_prelude};

/// Invocations per workgroup (one workgroup per row).
pub const WORKGROUP: u32 = 256;
/// Terms per f32 partial sum before it is added into the invocation's running sum.
pub const SUM_BLOCK: u32 = 32;
/// [`SampleStep::mode`]: draw by inverse CDF with the f32 uniform whose bits are `draws[row]`.
pub const MODE_UNIFORM: u32 = 0;
/// [`SampleStep::mode`]: the ids are given: `sampled = draws[row]` (replay, or ids drawn elsewhere).
/// Any mode other than [`MODE_UNIFORM`] behaves like this one.
pub const MODE_GIVEN: u32 = 1;
/// u32 words per row of `results`.
pub const RESULT_WORDS: usize = 4;
/// `results[row][RESULT_ENTROPY]`: the entropy's f32 bits (a NaN when the row is not finite).
pub const RESULT_ENTROPY: usize = 0;
/// `results[row][RESULT_ARGMAX]`: first index of the maximum scaled logit.
pub const RESULT_ARGMAX: usize = 1;
/// `results[row][RESULT_SAMPLED]`: the sampled id (0 for a row that is not finite in
/// [`MODE_UNIFORM`], as the CPU's draw gives when every probability is NaN).
pub const RESULT_SAMPLED: usize = 2;
/// `results[row][RESULT_NON_FINITE]`: first column whose scaled logit is not finite, plus 1; 0 if
/// the row is all finite.
pub const RESULT_NON_FINITE: usize = 3;

/// Uniform parameters of `sample_rows.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable, PartialEq)]
pub struct SampleRowsParams {
    pub rows: u32,
    /// Row length V ≥ 1.
    pub vocab: u32,
    /// Rows that share one [`SampleStep`]: row `r` reads step `r / rows_per_step` (the canvases of
    /// a batched forward, each with its own temperature and draw mode); 0: every row reads step 0.
    pub rows_per_step: u32,
    /// The row of `draws`, `results` and the steps that logits row 0 takes (one group of a
    /// batch's canvases, whose logits are a buffer of their own).
    pub first_row: u32,
}

/// The per-step inputs, in a small storage buffer the host rewrites every step (so that a recorded
/// plan's uniform parameters stay fixed).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable, PartialEq)]
pub struct SampleStep {
    /// `proc = logits / temperature`.
    pub temperature: f32,
    /// [`MODE_UNIFORM`] or [`MODE_GIVEN`].
    pub mode: u32,
    pub _pad: [u32; 2],
}

impl SampleStep {
    pub fn new(temperature: f32, mode: u32) -> Self {
        SampleStep { temperature, mode, _pad: [0; 2] }
    }
}

/// Workgroups to dispatch (one per row; fold through `groups_1d`).
pub fn workgroups(p: &SampleRowsParams) -> u32 {
    p.rows
}

/// Bindings: `logits` (read, `[rows, V]`), `scaled` (read-write, `[rows, V]`: `logits / T`), `step`
/// (read, [`SampleStep`]s: one, or one per `rows_per_step` rows), `draws` (read, u32 `[rows]`: uniform bits or given ids), `results`
/// (read-write, u32 `[rows, RESULT_WORDS]`).
pub fn source() -> KernelSource {
    KernelSource {
        name: "sample_rows".into(),
        wgsl: with_prelude(&[("WG", WORKGROUP), ("BLOCK", SUM_BLOCK)], include_str!("wgsl/sample_rows.wgsl")),
        entry: "main",
        buffers: vec![Access::Read, Access::ReadWrite, Access::Read, Access::Read, Access::ReadWrite],
        params_size: size_of::<SampleRowsParams>() as u64,
    }
}

#[cfg(test)]
mod tests {
    //! Mirrors of the kernel's integer helpers: the exact division must recover `x / t` from any
    //! hardware quotient Vulkan allows, which the device under test (lavapipe divides exactly) cannot show.

    /// `mul_wide` of `sample_rows.wgsl`, line for line.
    fn mul_wide(a: u32, b: u32) -> (u32, u32) {
        let (al, ah, bl, bh) = (a & 0xffff, a >> 16, b & 0xffff, b >> 16);
        let (ll, lh, hl) = (al * bl, al * bh, ah * bl);
        let mid = (ll >> 16) + (lh & 0xffff) + (hl & 0xffff);
        ((ll & 0xffff) | (mid << 16), ah * bh + (lh >> 16) + (hl >> 16) + (mid >> 16))
    }

    fn gt64(a: (u32, u32), b: (u32, u32)) -> bool {
        a.1 > b.1 || (a.1 == b.1 && a.0 > b.0)
    }

    /// `div_rn` of `sample_rows.wgsl`, line for line, with the hardware quotient `q0` given.
    fn div_rn(x: f32, t: f32, q0: f32) -> f32 {
        let (xb, tb) = (x.to_bits() & 0x7fff_ffff, t.to_bits() & 0x7fff_ffff);
        let (ex, et) = (xb >> 23, tb >> 23);
        if ex == 0 || ex == 255 || et == 0 || et == 255 {
            return q0;
        }
        let (mx, mt) = ((xb & 0x7f_ffff) | 0x80_0000, (tb & 0x7f_ffff) | 0x80_0000);
        let mut qb = q0.to_bits() & 0x7fff_ffff;
        for _ in 0..4 {
            let eq = qb >> 23;
            let sh = ex as i32 - et as i32 - eq as i32 + 152;
            if eq == 0 || eq == 255 || !(1..=31).contains(&sh) {
                return q0;
            }
            let mq = (qb & 0x7f_ffff) | 0x80_0000;
            let a = (mx << sh as u32, mx >> (32 - sh) as u32);
            if gt64(a, mul_wide(mt, 4 * mq + 2)) {
                qb += 1;
            } else if gt64(mul_wide(mt, 4 * mq - if mq == 0x80_0000 { 1 } else { 2 }), a) {
                qb -= 1;
            } else {
                break;
            }
        }
        f32::from_bits(qb | (q0.to_bits() & 0x8000_0000))
    }

    #[test]
    fn mul_wide_is_the_u64_product() {
        let mut s = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..100_000 {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let (a, b) = (s as u32, (s >> 32) as u32);
            let (lo, hi) = mul_wide(a, b);
            assert_eq!(u64::from(lo) | (u64::from(hi) << 32), u64::from(a) * u64::from(b), "{a} * {b}");
        }
    }

    /// The division's correction recovers `x / t` from guesses up to 3 ulps off (Vulkan allows 2.5),
    /// across binade edges (significands near 1 and 2, powers of two) and the temperatures in use.
    #[test]
    fn div_rn_corrects_guesses_within_three_ulps() {
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let mut checked = 0;
        for case in 0..200_000 {
            let r = next();
            let x = match case % 4 {
                0 => f32::from_bits(r as u32 & 0x807f_ffff | (((r >> 40) % 40 + 110) as u32) << 23), // |x| in ~[2^-17, 2^23)
                1 => f32::from_bits((r as u32 & 0x8000_0007) | ((((r >> 40) % 8 + 124) as u32) << 23)), // significand near 1
                2 => f32::from_bits((r as u32 | 0x007f_fff8) & 0x807f_ffff | ((((r >> 40) % 8 + 124) as u32) << 23)), // near 2
                _ => ((r >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * 30.0,
            };
            let t = match (r >> 20) % 4 {
                0 => 0.8,
                1 => 0.408,
                2 => 1.0,
                _ => f32::from_bits((r >> 8) as u32 & 0x007f_ffff | 0x3f00_0000), // [0.5, 1)
            };
            let want = x / t;
            let wb = want.to_bits() & 0x7fff_ffff;
            if x == 0.0 || !want.is_normal() || !(0x0100_0000..=0x7f00_0000).contains(&wb) {
                continue;
            }
            for k in -3i32..=3 {
                let guess = f32::from_bits(((wb as i32 + k) as u32) | (want.to_bits() & 0x8000_0000));
                let got = div_rn(x, t, guess);
                assert_eq!(got.to_bits(), want.to_bits(), "{x:e} / {t:e}: guess {guess:e} ({k:+} ulp) gave {got:e}, want {want:e}");
            }
            checked += 1;
        }
        assert!(checked > 150_000, "only {checked} cases checked");
    }
}

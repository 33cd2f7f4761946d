//! The K-quant quantizers as first ported from ggml's C reference, one sub-block at a time and
//! operation for operation (`quantize_row_q4_K_ref` with `make_qkx2_quants`,
//! `quantize_row_q6_K_ref` with `make_qx_quants`): the oracles the faster quantizers of
//! [`super::q4_k`] and [`super::q6_k`] must match byte for byte on every input, and the blocks
//! they are compared on.

use super::q4_k::BLOCK_LEN;

pub(super) mod q4_k {
    use crate::quant::q4_k::{BLOCK_BYTES, BLOCK_LEN, SUB, scale_min};
    use crate::quant::qkx::make_qkx2_quants;
    use crate::quant::{f16_le, f16_round, nearest_int};

    /// 256 finite values as one block (`quantize_row_q4_K_ref`).
    pub(in crate::quant) fn quantize_block(x: &[f32; BLOCK_LEN]) -> [u8; BLOCK_BYTES] {
        let mut levels = [0u8; BLOCK_LEN];
        let mut scales = [0f32; BLOCK_LEN / SUB];
        let mut mins = [0f32; BLOCK_LEN / SUB];
        let (mut max_scale, mut max_min) = (0f32, 0f32);
        for (j, (xs, ls)) in x.chunks_exact(SUB).zip(levels.chunks_exact_mut(SUB)).enumerate() {
            let mut sum_x2 = 0f32;
            for &v in xs {
                sum_x2 += v * v;
            }
            let av_x = (sum_x2 / 32.0).sqrt();
            let weights: [f32; SUB] = std::array::from_fn(|l| av_x + xs[l].abs());
            (scales[j], mins[j]) = make_qkx2_quants(15, xs, &weights, ls, -1.0, 0.1, 20, false);
            if scales[j] > max_scale {
                max_scale = scales[j];
            }
            if mins[j] > max_min {
                max_min = mins[j];
            }
        }

        let mut block = [0u8; BLOCK_BYTES];
        let inv_scale = if max_scale > 0.0 { 63.0 / max_scale } else { 0.0 };
        let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
        let packed = &mut block[4..16];
        for j in 0..BLOCK_LEN / SUB {
            // ggml stores nearest_int's int in a uint8_t, then caps it at 63.
            let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
            let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
            if j < 4 {
                packed[j] = ls;
                packed[j + 4] = lm;
            } else {
                packed[j + 4] = (ls & 0x0f) | ((lm & 0x0f) << 4);
                packed[j - 4] |= (ls >> 4) << 6;
                packed[j] |= (lm >> 4) << 6;
            }
        }
        block[..2].copy_from_slice(&f16_le(max_scale / 63.0));
        block[2..4].copy_from_slice(&f16_le(max_min / 63.0));

        let (d_all, dmin_all) = (f16_round(max_scale / 63.0), f16_round(max_min / 63.0));
        for j in 0..BLOCK_LEN / SUB {
            let (sc, m) = scale_min(j, &block[4..16]);
            let d = d_all * f32::from(sc);
            if d == 0.0 {
                continue;
            }
            let dm = dmin_all * f32::from(m);
            for i in SUB * j..SUB * (j + 1) {
                levels[i] = nearest_int((x[i] + dm) / d).clamp(0, 15) as u8;
            }
        }
        for (pair, qs) in block[16..].chunks_exact_mut(SUB).enumerate() {
            let ls = &levels[2 * SUB * pair..2 * SUB * (pair + 1)];
            for (l, q) in qs.iter_mut().enumerate() {
                *q = ls[l] | (ls[l + SUB] << 4);
            }
        }
        block
    }
}

pub(super) mod q6_k {
    use crate::quant::q6_k::{BLOCK_BYTES, BLOCK_LEN, GROUP_MAX_EPS, SUB};
    use crate::quant::{f16_le, f16_round, nearest_int};

    /// 256 finite values as one block (`quantize_row_q6_K_ref`).
    pub(in crate::quant) fn quantize_block(x: &[f32; BLOCK_LEN]) -> [u8; BLOCK_BYTES] {
        let mut levels = [0u8; BLOCK_LEN];
        let mut scales = [0f32; BLOCK_LEN / SUB];
        let (mut max_scale, mut max_abs_scale) = (0f32, 0f32);
        for (ib, (xs, ls)) in x.chunks_exact(SUB).zip(levels.chunks_exact_mut(SUB)).enumerate() {
            scales[ib] = make_qx_quants(32, xs, ls);
            if scales[ib].abs() > max_abs_scale {
                max_abs_scale = scales[ib].abs();
                max_scale = scales[ib];
            }
        }
        let mut block = [0u8; BLOCK_BYTES];
        if max_abs_scale < GROUP_MAX_EPS {
            return block;
        }
        let iscale = -128.0 / max_scale;
        block[208..].copy_from_slice(&f16_le(1.0 / iscale));
        let d_all = f16_round(1.0 / iscale);
        for (ib, &scale) in scales.iter().enumerate() {
            // ggml stores MIN(127, nearest_int(...)) in an int8_t.
            block[192 + ib] = nearest_int(iscale * scale).min(127) as i8 as u8;
        }
        for j in 0..BLOCK_LEN / SUB {
            let d = d_all * f32::from(block[192 + j] as i8);
            if d == 0.0 {
                continue;
            }
            for i in SUB * j..SUB * (j + 1) {
                levels[i] = (nearest_int(x[i] / d).clamp(-32, 31) + 32) as u8;
            }
        }
        for half in 0..2 {
            let ls = &levels[128 * half..128 * (half + 1)];
            for l in 0..32 {
                block[64 * half + l] = (ls[l] & 0x0f) | ((ls[l + 64] & 0x0f) << 4);
                block[64 * half + l + 32] = (ls[l + 32] & 0x0f) | ((ls[l + 96] & 0x0f) << 4);
                block[128 + 32 * half + l] = (ls[l] >> 4) | ((ls[l + 32] >> 4) << 2) | ((ls[l + 64] >> 4) << 4) | ((ls[l + 96] >> 4) << 6);
            }
        }
        block
    }

    /// ggml's `make_qx_quants` as `quantize_row_q6_K_ref` calls it (`rmse_type` 1, no importance
    /// weights, so each value weighs `x * x`): the scale of a symmetric `2 * nmax`-level grid for `x`,
    /// trying 19 grid widths around `nmax`, and the levels (offset by `nmax`) in `levels`.
    fn make_qx_quants(nmax: i32, x: &[f32], levels: &mut [u8]) -> f32 {
        let (mut max, mut amax) = (0f32, 0f32);
        for &v in x {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax < GROUP_MAX_EPS {
            levels.fill(0);
            return 0.0;
        }
        let level = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-nmax, nmax - 1);
        let sums = |iscale: f32| {
            let (mut sumlx, mut suml2) = (0f32, 0f32);
            for &v in x {
                let l = level(iscale, v) as f32;
                let w = v * v;
                sumlx += w * v * l;
                suml2 += w * l * l;
            }
            (sumlx, suml2)
        };
        let set_levels = |levels: &mut [u8], iscale: f32| {
            for (q, &v) in levels.iter_mut().zip(x) {
                *q = (level(iscale, v) + nmax) as u8;
            }
        };
        let iscale = -(nmax as f32) / max;
        set_levels(levels, iscale);
        let (sumlx, suml2) = sums(iscale);
        let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
        let mut best = scale * sumlx;
        for is in (-9..=9).filter(|&is| is != 0) {
            let iscale = -(nmax as f32 + 0.1 * is as f32) / max;
            let (sumlx, suml2) = sums(iscale);
            if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
                set_levels(levels, iscale);
                scale = sumlx / suml2;
                best = scale * sumlx;
            }
        }
        scale
    }
}

/// The kinds of block [`awkward_blocks`] draws (one per block, or one per run of 16, 32 or 64
/// values for [`Kind::Mixed`]).
#[derive(Debug, Clone, Copy)]
enum Kind {
    Gaussian,
    Uniform,
    HeavyTailed,
    Zero,
    Constant,
    Outlier,
    Subnormal,
    OneSigned,
    Ties,
    Huge,
    Sparse,
    Mixed,
}

const KINDS: [Kind; 12] = [
    Kind::Gaussian,
    Kind::Uniform,
    Kind::HeavyTailed,
    Kind::Zero,
    Kind::Constant,
    Kind::Outlier,
    Kind::Subnormal,
    Kind::OneSigned,
    Kind::Ties,
    Kind::Huge,
    Kind::Sparse,
    Kind::Mixed,
];

/// xorshift64 from a fixed seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in (0, 1).
    fn uniform(&mut self) -> f64 {
        ((self.next() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    fn gaussian(&mut self) -> f64 {
        (-2.0 * self.uniform().ln()).sqrt() * (std::f64::consts::TAU * self.uniform()).cos()
    }

    /// 10 to a uniform power in `lo..hi`.
    fn magnitude(&mut self, lo: f64, hi: f64) -> f64 {
        10f64.powf(lo + (hi - lo) * self.uniform())
    }

    fn sign(&mut self) -> f64 {
        if self.next() & 1 == 0 { 1.0 } else { -1.0 }
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// `n` blocks of 256 finite values meant to reach every branch of the quantizers: Gaussian,
/// uniform and heavy-tailed values at scales from 1e-8 to 1e4, all-zero blocks (with negative
/// zeros), constant blocks, one huge outlier, subnormal magnitudes, runs of one sign (positive
/// runs make `make_qkx2_quants` clamp its min to 0), values on a quarter grid (rounding ties),
/// magnitudes up to `f32::MAX` (whose ranges overflow), sparse blocks, and blocks mixing all of
/// these run by run. Each block comes with the kind it was drawn as.
pub(super) fn awkward_blocks(n: usize, seed: u64) -> Vec<(String, [f32; BLOCK_LEN])> {
    let mut rng = Rng(seed);
    (0..n)
        .map(|_| {
            let kind = KINDS[rng.below(KINDS.len())];
            let mut x = [0f32; BLOCK_LEN];
            if let Kind::Mixed = kind {
                let run = [16, 32, 64][rng.below(3)];
                for xs in x.chunks_exact_mut(run) {
                    let kind = KINDS[rng.below(KINDS.len() - 1)];
                    fill(&mut rng, kind, xs);
                }
            } else {
                fill(&mut rng, kind, &mut x);
            }
            (format!("{kind:?}"), x)
        })
        .collect()
}

fn fill(rng: &mut Rng, kind: Kind, xs: &mut [f32]) {
    let scale = rng.magnitude(-8.0, 4.0);
    let finite = |v: f64| (v as f32).clamp(f32::MIN, f32::MAX);
    match kind {
        Kind::Gaussian => xs.iter_mut().for_each(|v| *v = finite(scale * rng.gaussian())),
        Kind::Uniform => xs.iter_mut().for_each(|v| *v = finite(scale * (2.0 * rng.uniform() - 1.0))),
        Kind::HeavyTailed => xs.iter_mut().for_each(|v| *v = finite(scale * rng.gaussian() / rng.uniform())),
        Kind::Zero => xs.iter_mut().for_each(|v| *v = if rng.next() & 1 == 0 { 0.0 } else { -0.0 }),
        Kind::Constant => xs.fill(finite(rng.sign() * scale)),
        Kind::Outlier => {
            xs.iter_mut().for_each(|v| *v = finite(scale * rng.gaussian()));
            let at = rng.below(xs.len());
            xs[at] = finite(rng.sign() * scale * rng.magnitude(2.0, 6.0));
        }
        Kind::Subnormal => {
            let tiny = rng.magnitude(-45.0, -36.0);
            xs.iter_mut().for_each(|v| *v = (tiny * rng.gaussian()) as f32);
        }
        Kind::OneSigned => {
            let sign = rng.sign();
            let offset = scale * rng.uniform();
            xs.iter_mut().for_each(|v| *v = finite(sign * (offset + scale * rng.gaussian().abs())));
        }
        Kind::Ties => xs.iter_mut().for_each(|v| *v = finite(scale * (rng.gaussian() * 4.0).round() / 4.0)),
        Kind::Huge => {
            let huge = rng.magnitude(30.0, 38.6);
            xs.iter_mut().for_each(|v| *v = finite(huge * (2.0 * rng.uniform() - 1.0)));
        }
        Kind::Sparse => {
            xs.fill(0.0);
            for _ in 0..1 + rng.below(4) {
                let at = rng.below(xs.len());
                xs[at] = finite(scale * rng.gaussian());
            }
        }
        Kind::Mixed => unreachable!("mixed blocks fill each run with another kind"),
    }
}

//! ggml's `make_qkx2_quants` (`ggml/src/ggml-quants.c`), one group at a time and operation for
//! operation: the affine grid search of the K-quants with a min (`Q2_K`, `Q5_K`, and the `Q4_K`
//! port in `reference`, which holds the fast `Q4_K` quantizer to it byte for byte).

use super::nearest_int;

/// The largest group ggml searches (`Q4_K`'s and `Q5_K`'s 32 values; `Q2_K`'s are 16).
const MAX_N: usize = 32;

/// ggml's `make_qkx2_quants`: the scale and (negated) min of an affine `nmax + 1`-level grid for
/// `x` under `weights`, searching `nstep + 1` grid widths from `nmax + rmin` in steps of `rdelta`,
/// and the levels in `levels`. Returns `(scale, -min)`.
#[allow(clippy::too_many_arguments)] // ggml's signature, kept so the port reads against it
pub(super) fn make_qkx2_quants(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    levels: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> (f32, f32) {
    let n = x.len();
    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        levels.fill(0);
        return (0.0, -min);
    }
    let error = |diff: f32| if use_mad { diff.abs() } else { diff * diff };
    // `min` changes as better grids are found and later widths start from it, as in ggml.
    let level = |iscale: f32, v: f32, min: f32| nearest_int(iscale * (v - min)).clamp(0, nmax) as u8;
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0f32;
    for i in 0..n {
        levels[i] = level(iscale, x[i], min);
        best_error += weights[i] * error(scale * f32::from(levels[i]) + min - x[i]);
    }
    if nstep < 1 {
        return (scale, -min);
    }
    let mut aux = [0u8; MAX_N];
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0f32, 0f32, 0f32);
        for i in 0..n {
            aux[i] = level(iscale, x[i], min);
            let (w, l) = (weights[i], f32::from(aux[i]));
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * x[i];
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0f32;
            for i in 0..n {
                cur_error += weights[i] * error(this_scale * f32::from(aux[i]) + this_min - x[i]);
            }
            if cur_error < best_error {
                levels[..n].copy_from_slice(&aux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

// The row factor of the scaled gated activations (gelu_glu.rs, fused_scaled and pair_scaled):
// rows whose largest magnitude m exceeds LIMIT = 2^15 are multiplied by the power of two 2^-e that
// brings m to at most LIMIT, half of f16's largest finite value (65504), so that a factor one off
// still keeps every value finite; other rows by 1. Powers of two multiply exactly in f32 and f16
// (short of their subnormal range), so the consumer's multiplication by the inverse restores the
// product of the unscaled row up to the f16 rounding of the scaled values.

const LIMIT: f32 = 32768.0;

fn row_factor(m: f32) -> f32 {
    if (!(m > LIMIT)) {
        return 1.0;
    }
    // m in [2^b, 2^(b + 1)), b >= 15: 2^(14 - b) brings it below 2^15.
    let b = i32((bitcast<u32>(m) >> 23u) & 0xffu) - 127;
    let e = min(b - 14, 126);
    return bitcast<f32>(u32(127 - e) << 23u);
}

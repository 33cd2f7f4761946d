// The workgroup-wide sum of a row's per-invocation partial sums (rmsnorm.wgsl and the fused norms
// of residual_norms: one tree, so that the fused kernels compute every norm exactly as rmsnorm.wgsl
// does). RowSum is f32, or vec2<f32> for two sums side by side (vector addition is per component,
// so each follows the same tree). Called from uniform control flow by every invocation, live row
// or not; returns the total to every invocation.
var<workgroup> partial: array<RowSum, WG>;

fn row_sum(acc: RowSum, lane: u32) -> RowSum {
    partial[lane] = acc;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        if (lane < s) {
            partial[lane] += partial[lane + s];
        }
        workgroupBarrier();
    }
    let total = partial[0];
    // Everyone must have read the total before a next reduction overwrites partial.
    workgroupBarrier();
    return total;
}

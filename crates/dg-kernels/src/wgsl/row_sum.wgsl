// The workgroup-wide sum of the invocations' partial sums, as a tree through workgroup memory
// (row_reduce.rs, RowReduce::Tree). RowSum is f32, or vec2<f32> for two sums side by side (vector
// addition is per component, so each follows the same tree).

fn row_sum(acc: RowSum, lanes: RowLanes) -> RowSum {
    let lane = lanes.lane;
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

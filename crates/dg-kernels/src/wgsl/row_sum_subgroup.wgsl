// The workgroup-wide sum of the invocations' partial sums through subgroups (row_reduce.rs,
// RowReduce::Subgroup): each subgroup's sum, then the subgroups' sums added in subgroup order by
// every invocation. RowSum is f32 or a vector of f32 (per component).

fn row_sum(acc: RowSum, lanes: RowLanes) -> RowSum {
    let s = subgroupAdd(acc);
    if (lanes.sg_lane == 0u) {
        partial[lanes.sg] = s;
    }
    workgroupBarrier();
    var total = partial[0];
    for (var i = 1u; i < lanes.sgs; i++) {
        total += partial[i];
    }
    // Everyone must have read the sums before a next reduction overwrites partial.
    workgroupBarrier();
    return total;
}

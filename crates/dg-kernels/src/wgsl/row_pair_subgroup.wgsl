// The workgroup-wide merge of online-softmax (max, sum) pairs through subgroups (row_reduce.rs,
// RowReduce::Subgroup): each subgroup's max, its sums rescaled to it and added (exp(0) = 1 exactly
// for the invocations that hold the max), then the subgroups' pairs merged in subgroup order with
// the kernel's merge().

fn row_max_sum(m: f32, s: f32, lanes: RowLanes) -> vec2<f32> {
    let gm = subgroupMax(m);
    let gs = subgroupAdd(s * exp(m - gm));
    if (lanes.sg_lane == 0u) {
        part_max[lanes.sg] = gm;
        part_sum[lanes.sg] = gs;
    }
    workgroupBarrier();
    var total = vec2<f32>(part_max[0], part_sum[0]);
    for (var i = 1u; i < lanes.sgs; i++) {
        total = merge(total.x, total.y, part_max[i], part_sum[i]);
    }
    workgroupBarrier();
    return total;
}

// The workgroup-wide merge of online-softmax (max, sum) pairs as a tree through workgroup memory
// (row_reduce.rs, RowReduce::Tree), with the kernel's merge().

fn row_max_sum(m: f32, s: f32, lanes: RowLanes) -> vec2<f32> {
    let lane = lanes.lane;
    part_max[lane] = m;
    part_sum[lane] = s;
    workgroupBarrier();
    for (var k = WG / 2u; k > 0u; k = k >> 1u) {
        if (lane < k) {
            let r = merge(part_max[lane], part_sum[lane], part_max[lane + k], part_sum[lane + k]);
            part_max[lane] = r.x;
            part_sum[lane] = r.y;
        }
        workgroupBarrier();
    }
    let total = vec2<f32>(part_max[0], part_sum[0]);
    workgroupBarrier();
    return total;
}

// The workgroup-wide maximum, and the argmax (strict maximum, ties to the lower index), through
// subgroups (row_reduce.rs, RowReduce::Subgroup): each subgroup's, then the subgroups' in subgroup
// order. Values are never NaN.

fn row_max(v: f32, lanes: RowLanes) -> f32 {
    let m = subgroupMax(v);
    if (lanes.sg_lane == 0u) {
        red_v[lanes.sg] = m;
    }
    workgroupBarrier();
    var total = red_v[0];
    for (var j = 1u; j < lanes.sgs; j++) {
        total = max(total, red_v[j]);
    }
    workgroupBarrier();
    return total;
}

fn row_argmax(v: f32, i: u32, lanes: RowLanes) -> ArgMax {
    let m = subgroupMax(v);
    let at = subgroupMin(select(0xffffffffu, i, v == m));
    if (lanes.sg_lane == 0u) {
        red_v[lanes.sg] = m;
        red_i[lanes.sg] = at;
    }
    workgroupBarrier();
    var best = ArgMax(red_v[0], red_i[0]);
    for (var j = 1u; j < lanes.sgs; j++) {
        let ov = red_v[j];
        let oi = red_i[j];
        if (ov > best.v || (ov == best.v && oi < best.i)) {
            best = ArgMax(ov, oi);
        }
    }
    workgroupBarrier();
    return best;
}

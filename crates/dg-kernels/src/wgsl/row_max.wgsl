// The workgroup-wide maximum, and the argmax (strict maximum, ties to the lower index), as trees
// through workgroup memory (row_reduce.rs, RowReduce::Tree; red_v, red_i and ArgMax declared
// there). Values are never NaN.

fn row_max(v: f32, lanes: RowLanes) -> f32 {
    let lane = lanes.lane;
    red_v[lane] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        if (lane < s) {
            red_v[lane] = max(red_v[lane], red_v[lane + s]);
        }
        workgroupBarrier();
    }
    let m = red_v[0];
    workgroupBarrier();
    return m;
}

fn row_argmax(v: f32, i: u32, lanes: RowLanes) -> ArgMax {
    let lane = lanes.lane;
    red_v[lane] = v;
    red_i[lane] = i;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        if (lane < s) {
            let ov = red_v[lane + s];
            let oi = red_i[lane + s];
            let mv = red_v[lane];
            if (ov > mv || (ov == mv && oi < red_i[lane])) {
                red_v[lane] = ov;
                red_i[lane] = oi;
            }
        }
        workgroupBarrier();
    }
    let best = ArgMax(red_v[0], red_i[0]);
    workgroupBarrier();
    return best;
}

// The K loop of a tensor-core GEMM whose W fragments load straight from the storage buffer
// (W in K panels; no staging of W in workgroup memory): A goes through two stages of workgroup
// memory as in coop_kloop.wgsl, while each subgroup holds its W fragments of the current step and
// loads those of the next step before multiplying. Expects in scope: a_src (LA vec4 indices into
// `a` at step 0), `w_sub` (the vec4 index of the subgroup's first W column at step 0), `w_step`
// (vec4s of W between steps), `stride_w` (vec4s between W rows in a panel), `steps`, `stride_s`,
// `sg`, `sm`, `sn`; leaves the accumulators acc_i_j.
    var ra: array<vec4<f32>, LA>;
    // @unroll
    for (var l = 0u; l < LA; l++) {
        ra[l] = a[a_src[l]];
    }
    // @unroll
    for (var l = 0u; l < LA; l++) {
        put_a(dst_of(lt + l * WT), vec4<f16>(ra[l]));
    }
    workgroupBarrier();

//@ACC
//@FB_INIT
    for (var s = 0u; s < steps; s++) {
        let more = s + 1u < steps;
        if (more) {
            let ka = (s + 1u) * BK4;
            // @unroll
            for (var l = 0u; l < LA; l++) {
                ra[l] = a[a_src[l] + ka];
            }
        }
        let w_next = w_sub + min(s + 1u, steps - 1u) * w_step;
//@FB_NEXT
        let a_st = (s & 1u) * (BM * KP);
//@MULTIPLY
//@FB_ROTATE
        if (more) {
            let a_nx = ((s + 1u) & 1u) * (BM * KP);
            // @unroll
            for (var l = 0u; l < LA; l++) {
                put_a(a_nx + dst_of(lt + l * WT), vec4<f16>(ra[l]));
            }
        }
        workgroupBarrier();
    }

// The K loop shared by the tensor-core GEMMs (coop_gemm.wgsl, coop_grouped_gemm.wgsl): stage step
// 0, then per step multiply the current stage while the next step's A and W vec4s are loaded into
// registers, and write them into the other stage; one barrier a step. Expects in scope: a_src
// (LA vec4 indices into `a` at step 0), W_AT(l) (the index into `w` of vec4 l at step 0),
// `steps` (K / BK), `w_step` (vec4s of W between steps), `stride_s`, `sg`, `sm`, `sn`; leaves
// the accumulators acc_i_j.
    var ra: array<vec4<f32>, LA>;
    var rw: array<vec4<f16>, LW>;
    // @unroll
    for (var l = 0u; l < LA; l++) {
        ra[l] = a[a_src[l]];
    }
    // @unroll
    for (var l = 0u; l < LW; l++) {
        rw[l] = load_w(W_AT);
    }
    // @unroll
    for (var l = 0u; l < LA; l++) {
        put_a(dst_of(lt + l * WT), vec4<f16>(ra[l]));
    }
    // @unroll
    for (var l = 0u; l < LW; l++) {
        put_b(dst_w(lt + l * WT), rw[l]);
    }
    workgroupBarrier();

//@ACC
    for (var s = 0u; s < steps; s++) {
        let more = s + 1u < steps;
        if (more) {
            let ka = (s + 1u) * BK4;
            // @unroll
            for (var l = 0u; l < LA; l++) {
                ra[l] = a[a_src[l] + ka];
            }
            // @unroll
            for (var l = 0u; l < LW; l++) {
                rw[l] = load_w(W_AT + (s + 1u) * w_step);
            }
        }
        let a_st = (s & 1u) * (BM * KP);
        let b_st = (s & 1u) * SBS;
//@MULTIPLY
        if (more) {
            let a_nx = ((s + 1u) & 1u) * (BM * KP);
            let b_nx = ((s + 1u) & 1u) * SBS;
            // @unroll
            for (var l = 0u; l < LA; l++) {
                put_a(a_nx + dst_of(lt + l * WT), vec4<f16>(ra[l]));
            }
            // @unroll
            for (var l = 0u; l < LW; l++) {
                put_b(b_nx + dst_w(lt + l * WT), rw[l]);
            }
        }
        workgroupBarrier();
    }

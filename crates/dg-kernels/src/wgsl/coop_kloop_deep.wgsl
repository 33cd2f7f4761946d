// The K loop of coop_kloop.wgsl with two steps of global loads in flight instead of one: two
// register sets (0 and 1) alternate. Entering step s, stage s & 1 holds step s, the set of s's
// parity's complement holds step s + 1 and the other set step s + 2; step s multiplies its stage,
// writes step s + 1's set into the other stage and refills that set with step s + 3. A set's
// loads thus have two multiplies and two barriers to arrive instead of one multiply. (The sets are
// chosen by branches around plain code only: the cooperative operations stay in uniform control
// flow.)
// Expects what coop_kloop.wgsl expects; leaves the accumulators acc_i_j.
    var ra0: array<vec4<f32>, LA>;
    var rw0: array<vec4<f16>, LW>;
    var ra1: array<vec4<f32>, LA>;
    var rw1: array<vec4<f16>, LW>;
    // @unroll
    for (var l = 0u; l < LA; l++) {
        ra0[l] = a[a_src[l]];
    }
    // @unroll
    for (var l = 0u; l < LW; l++) {
        rw0[l] = load_w(W_AT);
    }
    // @unroll
    for (var l = 0u; l < LA; l++) {
        put_a(dst_of(lt + l * WT), vec4<f16>(ra0[l]));
    }
    // @unroll
    for (var l = 0u; l < LW; l++) {
        put_b(dst_w(lt + l * WT), rw0[l]);
    }
    if (steps > 1u) {
        // @unroll
        for (var l = 0u; l < LA; l++) {
            ra1[l] = a[a_src[l] + BK4];
        }
        // @unroll
        for (var l = 0u; l < LW; l++) {
            rw1[l] = load_w(W_AT + w_step);
        }
    }
    if (steps > 2u) {
        // @unroll
        for (var l = 0u; l < LA; l++) {
            ra0[l] = a[a_src[l] + 2u * BK4];
        }
        // @unroll
        for (var l = 0u; l < LW; l++) {
            rw0[l] = load_w(W_AT + 2u * w_step);
        }
    }
    workgroupBarrier();

//@ACC
    for (var s = 0u; s < steps; s++) {
        let a_st = (s & 1u) * (BM * KP);
        let b_st = (s & 1u) * SBS;
//@MULTIPLY
        if (s + 1u < steps) {
            let a_nx = ((s + 1u) & 1u) * (BM * KP);
            let b_nx = ((s + 1u) & 1u) * SBS;
            let refill = s + 3u < steps;
            let ka = (s + 3u) * BK4;
            let kw = (s + 3u) * w_step;
            if ((s & 1u) == 0u) {
                // @unroll
                for (var l = 0u; l < LA; l++) {
                    put_a(a_nx + dst_of(lt + l * WT), vec4<f16>(ra1[l]));
                }
                // @unroll
                for (var l = 0u; l < LW; l++) {
                    put_b(b_nx + dst_w(lt + l * WT), rw1[l]);
                }
                if (refill) {
                    // @unroll
                    for (var l = 0u; l < LA; l++) {
                        ra1[l] = a[a_src[l] + ka];
                    }
                    // @unroll
                    for (var l = 0u; l < LW; l++) {
                        rw1[l] = load_w(W_AT + kw);
                    }
                }
            } else {
                // @unroll
                for (var l = 0u; l < LA; l++) {
                    put_a(a_nx + dst_of(lt + l * WT), vec4<f16>(ra0[l]));
                }
                // @unroll
                for (var l = 0u; l < LW; l++) {
                    put_b(b_nx + dst_w(lt + l * WT), rw0[l]);
                }
                if (refill) {
                    // @unroll
                    for (var l = 0u; l < LA; l++) {
                        ra0[l] = a[a_src[l] + ka];
                    }
                    // @unroll
                    for (var l = 0u; l < LW; l++) {
                        rw0[l] = load_w(W_AT + kw);
                    }
                }
            }
        }
        workgroupBarrier();
    }

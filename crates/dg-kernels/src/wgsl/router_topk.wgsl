// Router tail, per token t (mirrors dg_cpu::moe::route after the projection):
//   prob = softmax(logits[t, :]) in f32: max, exp(l - max) summed, times 1/sum;
//   top K by prob, descending, ties to the lower expert index (repeated strict-max selection);
//   w_k = (prob_k / sum of the K chosen, summed in chosen order) * per_expert_scale[idx_k].
// One workgroup per token, one invocation per expert (E <= MAX_E = WG, K <= MAX_K); the max and
// the sum are workgroup tree reductions, each of the K selections a workgroup argmax. Workgroups
// beyond 65535 wrap into y.

struct Params {
    tokens: u32,
    experts: u32,
    k: u32,
    // logits may be a split-K GEMM's partials (split_k.rs `with_reader`).
    splits: u32,
    split_stride: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read> per_expert_scale: array<f32>;
@group(0) @binding(3) var<storage, read_write> idx: array<u32>;
@group(0) @binding(4) var<storage, read_write> weights: array<f32>;

//@SPLIT_READER

const LOWEST: f32 = -0x1.fffffep+127f;
// Below every probability (>= 0) and every knocked-out entry (-1): the sequential reference's
// initial best, which nothing equal to it (or NaN) can displace.
const NONE: f32 = -2.0;

var<workgroup> red_v: array<f32, WG>;
var<workgroup> red_i: array<u32, WG>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    // t and everything derived from p are workgroup-uniform: the early return and the loops
    // around the barriers below are uniform control flow.
    let t = wid.x + wid.y * nwg.x;
    if (t >= p.tokens) {
        return;
    }
    let e_n = min(p.experts, MAX_E);
    let k_n = min(p.k, min(MAX_K, e_n));
    let e = lid.x;
    let live = e < e_n;
    var l = LOWEST;
    if (live) {
        l = logits_at(t * p.experts + e);
    }

    // Max over the experts.
    red_v[e] = l;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        if (e < s) {
            red_v[e] = max(red_v[e], red_v[e + s]);
        }
        workgroupBarrier();
    }
    let m = red_v[0];
    workgroupBarrier();

    // Sum of exp(l - max).
    var v = 0.0;
    if (live) {
        v = exp(l - m);
    }
    red_v[e] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        if (e < s) {
            red_v[e] += red_v[e + s];
        }
        workgroupBarrier();
    }
    let inv = 1.0 / red_v[0];
    workgroupBarrier();
    var prob = NONE;
    if (live) {
        prob = v * inv;
    }

    // Top K: K workgroup argmaxes of the strict maximum, ties to the lower expert index (the
    // sequential scan's first strict maximum); the chosen entry is knocked out with -1. Entries
    // that the scan could never pick (padding, NaN) enter as (NONE, 0), its initial best.
    var chosen: array<u32, MAX_K>;
    var value: array<f32, MAX_K>;
    for (var k = 0u; k < k_n; k++) {
        let ok = prob > NONE;
        red_v[e] = select(NONE, prob, ok);
        red_i[e] = select(0u, e, ok);
        workgroupBarrier();
        for (var s = WG / 2u; s > 0u; s = s >> 1u) {
            if (e < s) {
                let ov = red_v[e + s];
                let oi = red_i[e + s];
                let mv = red_v[e];
                if (ov > mv || (ov == mv && oi < red_i[e])) {
                    red_v[e] = ov;
                    red_i[e] = oi;
                }
            }
            workgroupBarrier();
        }
        let best = red_i[0];
        chosen[k] = best;
        value[k] = red_v[0];
        workgroupBarrier();
        if (e == best) {
            prob = -1.0;
        }
    }

    if (e == 0u) {
        var total = 0.0;
        for (var k = 0u; k < k_n; k++) {
            total += value[k];
        }
        let out = t * p.k;
        for (var k = 0u; k < k_n; k++) {
            idx[out + k] = chosen[k];
            weights[out + k] = (value[k] / total) * per_expert_scale[chosen[k]];
        }
    }
}

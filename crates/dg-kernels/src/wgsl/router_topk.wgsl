// Router tail, per token t (mirrors dg_cpu::moe::route after the projection):
//   prob = softmax(logits[t, :]) in f32: max, exp(l - max) summed, times 1/sum;
//   top K by prob, descending, ties to the lower expert index (repeated strict-max selection);
//   w_k = (prob_k / sum of the K chosen, summed in chosen order) * per_expert_scale[idx_k].
// One workgroup per token, one invocation per expert (E <= MAX_E = WG, K <= MAX_K); the max and
// the sum are workgroup reductions (row_reduce.rs), each of the K selections a workgroup argmax. Workgroups
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

//@ROW_REDUCE

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>, lanes: RowLanes) {
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

    // Max over the experts, then the sum of exp(l - max).
    let m = row_max(l, lanes);
    var v = 0.0;
    if (live) {
        v = exp(l - m);
    }
    let inv = 1.0 / row_sum(v, lanes);
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
        let best_of = row_argmax(select(NONE, prob, ok), select(0u, e, ok), lanes);
        let best = best_of.i;
        chosen[k] = best;
        value[k] = best_of.v;
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

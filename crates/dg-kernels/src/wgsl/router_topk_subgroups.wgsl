// Router tail (router_topk.wgsl's contract, the subgroup variant): per token t,
//   prob = softmax(logits[t, :]) in f32: max, exp(l - max) summed, times 1/sum;
//   top K by prob, descending, ties to the lower expert index (repeated strict-max selection);
//   w_k = (prob_k / sum of the K chosen, summed in chosen order) * per_expert_scale[idx_k].
// TOKENS tokens a workgroup, one subgroup a token: the workgroup stages its tokens' logits (the
// split partials added) in workgroup memory, then subgroup g takes tokens g, g + subgroups, ...,
// lane j experts j, j + subgroup size, ...; the max, the sum and each of the K argmaxes are
// subgroup operations, with no barrier. A lane keeps the strict maximum of its experts in
// ascending order (ties to the lower index), then the subgroup takes the largest value and the
// lowest index holding it; the chosen entry is knocked out with -1, and entries that the
// sequential scan could never pick (padding, NaN) enter as (NONE, 0), its initial best. Any
// subgroup size; every subgroup runs the same rounds, so the subgroup operations stay in uniform
// control flow. Workgroups beyond 65535 wrap into y.

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
const NONE: f32 = -2.0;

// The workgroup's tokens' logits, then (each row by its own subgroup) their probabilities.
var<workgroup> lg: array<f32, TOKENS * MAX_E>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) i: u32, @builtin(subgroup_invocation_id) lane: u32,
        @builtin(subgroup_size) sg_size: u32, @builtin(subgroup_id) sg: u32,
        @builtin(num_subgroups) sgs: u32) {
    let t0 = (wid.x + wid.y * nwg.x) * TOKENS;
    if (t0 >= p.tokens) {
        return;   // padding of a folded grid (uniform: the whole workgroup leaves)
    }
    let e_n = min(p.experts, MAX_E);
    let k_n = min(p.k, min(MAX_K, e_n));
    for (var s = i; s < TOKENS * e_n; s += WG) {
        let tt = s / e_n;
        var v = LOWEST;
        if (t0 + tt < p.tokens) {
            v = logits_at((t0 + tt) * p.experts + s % e_n);
        }
        lg[tt * MAX_E + s % e_n] = v;
    }
    workgroupBarrier();

    let rounds = (TOKENS + sgs - 1u) / sgs;
    let per_lane = (e_n + sg_size - 1u) / sg_size;
    for (var r = 0u; r < rounds; r++) {
        let token = sg + r * sgs;
        let row = min(token, TOKENS - 1u) * MAX_E;
        // Max over the experts, then the sum of exp(l - max), each lane's in expert order.
        var m = LOWEST;
        for (var s = 0u; s < per_lane; s++) {
            let e = s * sg_size + lane;
            if (e < e_n) {
                m = max(m, lg[row + e]);
            }
        }
        m = subgroupMax(m);
        var sum = 0.0;
        for (var s = 0u; s < per_lane; s++) {
            let e = s * sg_size + lane;
            if (e < e_n) {
                sum += exp(lg[row + e] - m);
            }
        }
        let inv = 1.0 / subgroupAdd(sum);
        // Rows past TOKENS repeat the last one: only its own subgroup's lanes write a row, with
        // the same values.
        for (var s = 0u; s < per_lane; s++) {
            let e = s * sg_size + lane;
            if (e < e_n && token < TOKENS) {
                lg[row + e] = exp(lg[row + e] - m) * inv;
            }
        }

        var chosen: array<u32, MAX_K>;
        var value: array<f32, MAX_K>;
        // The experts chosen so far (the first k entries), knocked out with -1.
        var knocked: array<u32, MAX_K>;
        for (var k = 0u; k < k_n; k++) {
            var bv = NONE;
            var bi = 0u;
            for (var s = 0u; s < per_lane; s++) {
                let e = s * sg_size + lane;
                if (e < e_n) {
                    var prob = select(lg[row + e], -1.0, is_chosen(e, knocked, k));
                    if (token >= TOKENS) {
                        prob = NONE;
                    }
                    if (prob > bv) {
                        bv = prob;
                        bi = e;
                    }
                }
            }
            let best = subgroupMax(bv);
            let at = subgroupMin(select(0xffffffffu, bi, bv == best));
            chosen[k] = at;
            value[k] = best;
            knocked[k] = at;
        }
        if (lane == 0u && token < TOKENS && t0 + token < p.tokens) {
            var total = 0.0;
            for (var k = 0u; k < k_n; k++) {
                total += value[k];
            }
            let out = (t0 + token) * p.k;
            for (var k = 0u; k < k_n; k++) {
                idx[out + k] = chosen[k];
                weights[out + k] = (value[k] / total) * per_expert_scale[chosen[k]];
            }
        }
    }
}

// Whether expert e is among the first n chosen.
fn is_chosen(e: u32, knocked: array<u32, MAX_K>, n: u32) -> bool {
    var hit = false;
    for (var k = 0u; k < n; k++) {
        hit = hit || knocked[k] == e;
    }
    return hit;
}

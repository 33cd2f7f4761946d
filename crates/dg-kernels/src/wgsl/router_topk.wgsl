// Router tail, per token t (mirrors dg_cpu::moe::route after the projection):
//   prob = softmax(logits[t, :]) in f32: max, exp(l - max) summed in expert order, times 1/sum;
//   top K by prob, descending, ties to the lower expert index (repeated strict-max selection);
//   w_k = (prob_k / sum of the K chosen, summed in chosen order) * per_expert_scale[idx_k].
// One invocation per token (E <= MAX_E, K <= MAX_K); workgroups beyond 65535 wrap into y.

struct Params {
    tokens: u32,
    experts: u32,
    k: u32,
    _pad0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read> per_expert_scale: array<f32>;
@group(0) @binding(3) var<storage, read_write> idx: array<u32>;
@group(0) @binding(4) var<storage, read_write> weights: array<f32>;

const LOWEST: f32 = -0x1.fffffep+127f;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = (wid.x + wid.y * nwg.x) * WG + lid.x;
    if (t >= p.tokens) {
        return;
    }
    let e_n = min(p.experts, MAX_E);
    let k_n = min(p.k, min(MAX_K, e_n));
    let base = t * p.experts;

    var prob: array<f32, MAX_E>;
    var m = LOWEST;
    for (var e = 0u; e < e_n; e++) {
        m = max(m, logits[base + e]);
    }
    var sum = 0.0;
    for (var e = 0u; e < e_n; e++) {
        let v = exp(logits[base + e] - m);
        prob[e] = v;
        sum += v;
    }
    let inv = 1.0 / sum;
    for (var e = 0u; e < e_n; e++) {
        prob[e] = prob[e] * inv;
    }

    // Top K: repeated selection of the strict maximum (the first, lowest index, wins ties);
    // chosen entries are knocked out with -1 (probabilities are >= 0).
    var chosen: array<u32, MAX_K>;
    var value: array<f32, MAX_K>;
    var total = 0.0;
    for (var k = 0u; k < k_n; k++) {
        var best = 0u;
        var best_v = -2.0;
        for (var e = 0u; e < e_n; e++) {
            if (prob[e] > best_v) {
                best_v = prob[e];
                best = e;
            }
        }
        chosen[k] = best;
        value[k] = best_v;
        total += best_v;
        prob[best] = -1.0;
    }
    let out = t * p.k;
    for (var k = 0u; k < k_n; k++) {
        idx[out + k] = chosen[k];
        weights[out + k] = (value[k] / total) * per_expert_scale[chosen[k]];
    }
}

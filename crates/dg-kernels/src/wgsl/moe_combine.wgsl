// MoE combine, per token t:
//   out[t, :] = 0 + sum over its K entries in ascending expert order of weights[t, k] * y[slot_of[t, k], :]
// (ties in expert id, which top-k never produces, in k order; entries with slot 0xffffffff are
// skipped). One workgroup per token, tokens beyond 65535 wrap into y. Invocations k < K each
// read one entry and place it at its rank in that order (the count of the valid entries before
// it); then each invocation owns the output columns lid, lid + WG, ... and adds the (at most
// MAX_K, unrolled) entries in that order. Columns go LANES at a time: V is f32 (LANES 1) or
// vec4<f32> (LANES 4, H a multiple of 4), whose adds are per component, so both give the same
// bits.

struct Params {
    tokens: u32,
    k: u32,
    hidden: u32,
    _pad0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> y: array<V>;
@group(0) @binding(2) var<storage, read> idx: array<u32>;
@group(0) @binding(3) var<storage, read> weights: array<f32>;
@group(0) @binding(4) var<storage, read> slot_of: array<u32>;
@group(0) @binding(5) var<storage, read_write> out: array<V>;

const NO_SLOT: u32 = 0xffffffffu;

// The token's entries as read (expert, or NO_SLOT when skipped), then sorted by (expert, k):
// weights and slots, and how many there are.
var<workgroup> entry_e: array<u32, MAX_K>;
var<workgroup> sorted_w: array<f32, MAX_K>;
var<workgroup> sorted_s: array<u32, MAX_K>;
var<workgroup> sorted_n: u32;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = wid.x + wid.y * nwg.x;
    if (t >= p.tokens) {
        return;
    }
    let kn = min(p.k, MAX_K);
    let k = lid.x;
    var e = NO_SLOT;
    var s = NO_SLOT;
    var w = 0.0;
    if (k < kn) {
        s = slot_of[t * p.k + k];
        if (s != NO_SLOT) {
            e = idx[t * p.k + k];
            w = weights[t * p.k + k];
        }
    }
    if (k < MAX_K) {
        entry_e[k] = e;
    }
    workgroupBarrier();
    if (k < kn && s != NO_SLOT) {
        // Rank among the valid entries by (expert, k).
        var rank = 0u;
        for (var j = 0u; j < kn; j++) {
            let ej = entry_e[j];
            if (ej != NO_SLOT && (ej < e || (ej == e && j < k))) {
                rank++;
            }
        }
        sorted_w[rank] = w;
        sorted_s[rank] = s;
    }
    if (k == 0u) {
        var n = 0u;
        for (var j = 0u; j < kn; j++) {
            n += u32(entry_e[j] != NO_SLOT);
        }
        sorted_n = n;
    }
    let n = workgroupUniformLoad(&sorted_n);
    let width = p.hidden / LANES;
    let dst = t * width;
    for (var c = lid.x; c < width; c += WG) {
        var acc = V(0.0);
        for (var i = 0u; i < MAX_K; i++) {
            if (i < n) {
                acc += sorted_w[i] * y[sorted_s[i] * width + c];
            }
        }
        out[dst + c] = acc;
    }
}

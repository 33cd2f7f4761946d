// MoE combine, per token t:
//   out[t, :] = 0 + sum over its K entries in ascending expert order of weights[t, k] * y[slot_of[t, k], :]
// (ties in expert id, which top-k never produces, in k order; entries with slot 0xffffffff are
// skipped). One workgroup per token, tokens beyond 65535 wrap into y. Invocation 0 sorts the
// token's entries into workgroup memory once; then each invocation owns the output columns lid,
// lid + WG, ... and adds the (at most MAX_K, unrolled) entries in that order.

struct Params {
    tokens: u32,
    k: u32,
    hidden: u32,
    _pad0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> y: array<f32>;
@group(0) @binding(2) var<storage, read> idx: array<u32>;
@group(0) @binding(3) var<storage, read> weights: array<f32>;
@group(0) @binding(4) var<storage, read> slot_of: array<u32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;

const NO_SLOT: u32 = 0xffffffffu;

// The token's entries sorted by (expert, k): weights and slots, and how many there are.
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
    if (lid.x == 0u) {
        // Insertion sort of at most MAX_K entries by expert (stable: ties keep k order).
        let kn = min(p.k, MAX_K);
        var order_e: array<u32, MAX_K>;
        var order_w: array<f32, MAX_K>;
        var order_s: array<u32, MAX_K>;
        var n = 0u;
        for (var k = 0u; k < kn; k++) {
            let s = slot_of[t * p.k + k];
            if (s == NO_SLOT) {
                continue;
            }
            let e = idx[t * p.k + k];
            let w = weights[t * p.k + k];
            var i = n;
            while (i > 0u && order_e[i - 1u] > e) {
                order_e[i] = order_e[i - 1u];
                order_w[i] = order_w[i - 1u];
                order_s[i] = order_s[i - 1u];
                i--;
            }
            order_e[i] = e;
            order_w[i] = w;
            order_s[i] = s;
            n++;
        }
        for (var i = 0u; i < MAX_K; i++) {
            sorted_w[i] = order_w[i];
            sorted_s[i] = order_s[i];
        }
        sorted_n = n;
    }
    let n = workgroupUniformLoad(&sorted_n);
    let dst = t * p.hidden;
    for (var c = lid.x; c < p.hidden; c += WG) {
        var acc = 0.0;
        for (var i = 0u; i < MAX_K; i++) {
            if (i < n) {
                acc += sorted_w[i] * y[sorted_s[i] * p.hidden + c];
            }
        }
        out[dst + c] = acc;
    }
}

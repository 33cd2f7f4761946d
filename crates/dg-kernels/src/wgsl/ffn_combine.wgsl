// The combine variant's source of moe (ffn_residual_norms.wgsl, //@MOE_SOURCE): per row t,
//   moe[t, :] = 0 + sum over its K entries in ascending expert order of weights[t, k] * y[slot_of[t, k], :]
// as moe_combine.wgsl computes it (the same ranking, the same adds in the same order), one
// element at a time as the first pass reaches it.

@group(0) @binding(9) var<storage, read> y: array<V>;
@group(0) @binding(10) var<storage, read> idx: array<u32>;
@group(0) @binding(11) var<storage, read> weights: array<f32>;
@group(0) @binding(12) var<storage, read> slot_of: array<u32>;

const NO_SLOT: u32 = 0xffffffffu;

// The row's entries as read (expert, or NO_SLOT when skipped), then sorted by (expert, k):
// weights and slots, and how many there are.
var<workgroup> entry_e: array<u32, MAX_K>;
var<workgroup> sorted_w: array<f32, MAX_K>;
var<workgroup> sorted_s: array<u32, MAX_K>;
var<workgroup> sorted_n: u32;
var<private> entries: u32;

// Ranks the row's entries (invocations k < K each place one); every invocation calls it.
fn rank_entries(t: u32, live: bool, k: u32) {
    let kn = min(p.top_k, MAX_K);
    var e = NO_SLOT;
    var s = NO_SLOT;
    var w = 0.0;
    if (live && k < kn) {
        s = slot_of[t * p.top_k + k];
        if (s != NO_SLOT) {
            e = idx[t * p.top_k + k];
            w = weights[t * p.top_k + k];
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
    entries = workgroupUniformLoad(&sorted_n);
}

// Element i of the row at base: summed from the entries and stored for the later passes.
fn moe_first(base: u32, i: u32) -> V {
    let width = p.dim / LANES;
    var acc = V(0.0);
    for (var j = 0u; j < MAX_K; j++) {
        if (j < entries) {
            acc += sorted_w[j] * y[sorted_s[j] * width + i];
        }
    }
    moe[base + i] = acc;
    return acc;
}

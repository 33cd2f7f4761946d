// The MoE combine's sum for one token t (moe_combine.wgsl, and the closing norms' combine variant,
// ffn_combine.wgsl, which include this text with the placeholder of K replaced by their own
// parameter, moe_combine.rs rank_text):
//   sum over its K entries in ascending expert order of weights[t, k] * y[slot_of[t, k], :]
// from 0 (ties in expert id, which top-k never produces, in k order; entries with slot NO_SLOT
// skipped). The including kernel declares y (array<V>), idx, weights and slot_of, and
// slot_factor(slot) -> f32, what the slot's row of y is multiplied by (folded into its weight: 1,
// or the inverse of the row factor of a scaled input, a power of two, so exact either way). rank_entries,
// called by every invocation of the workgroup, has invocations k < K each read one entry and
// place it at its rank in that order (the count of the valid entries before it); combined then
// adds the (at most MAX_K, unrolled) ranked entries' element i of rows of `width` V.

const NO_SLOT: u32 = 0xffffffffu;

// The token's entries as read (expert, or NO_SLOT when skipped), then sorted by (expert, k):
// weights and slots, and how many there are.
var<workgroup> entry_e: array<u32, MAX_K>;
var<workgroup> sorted_w: array<f32, MAX_K>;
var<workgroup> sorted_s: array<u32, MAX_K>;
var<workgroup> sorted_n: u32;
var<private> entries: u32;

fn rank_entries(t: u32, live: bool, k: u32) {
    let kn = min(TOP_K, MAX_K);
    var e = NO_SLOT;
    var s = NO_SLOT;
    var w = 0.0;
    if (live && k < kn) {
        s = slot_of[t * TOP_K + k];
        if (s != NO_SLOT) {
            e = idx[t * TOP_K + k];
            w = weights[t * TOP_K + k] * slot_factor(s);
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

fn combined(i: u32, width: u32) -> V {
    var acc = V(0.0);
    for (var j = 0u; j < MAX_K; j++) {
        if (j < entries) {
            acc += sorted_w[j] * y[sorted_s[j] * width + i];
        }
    }
    return acc;
}

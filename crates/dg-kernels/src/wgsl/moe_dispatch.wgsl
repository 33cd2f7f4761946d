// MoE dispatch: counting sort of the routing entries idx[t, k] by expert, in one workgroup.
//   offsets[e] .. offsets[e + 1]: the slots of expert e (offsets[E] = number of valid entries);
//   rows[slot] = t; slot_of[t * K + k] = slot (0xffffffff for an expert id >= E).
// Within an expert, slots follow (k, t) order: k major, then t, like dg_cpu::moe::experts.
// 1. workgroup-atomic counts; 2. serial exclusive scan by invocation 0; 3. invocation e owns
// expert e and walks the entries in (k, t) order, staged WG at a time through workgroup memory.

struct Params {
    tokens: u32,
    k: u32,
    experts: u32,
    _pad0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> idx: array<u32>;
@group(0) @binding(2) var<storage, read_write> offsets: array<u32>;
@group(0) @binding(3) var<storage, read_write> rows: array<u32>;
@group(0) @binding(4) var<storage, read_write> slot_of: array<u32>;

var<workgroup> counts: array<atomic<u32>, WG>;
var<workgroup> starts: array<u32, WG>;
var<workgroup> stage: array<u32, WG>;

const NO_SLOT: u32 = 0xffffffffu;

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_id) lid: vec3<u32>) {
    let n = p.tokens * p.k;
    let experts = min(p.experts, WG);
    atomicStore(&counts[lid.x], 0u);
    workgroupBarrier();
    for (var i = lid.x; i < n; i += WG) {
        let e = idx[i];
        if (e < experts) {
            atomicAdd(&counts[e], 1u);
        } else {
            slot_of[i] = NO_SLOT;
        }
    }
    workgroupBarrier();
    if (lid.x == 0u) {
        var acc = 0u;
        for (var e = 0u; e < experts; e++) {
            starts[e] = acc;
            offsets[e] = acc;
            acc += atomicLoad(&counts[e]);
        }
        offsets[experts] = acc;
    }
    workgroupBarrier();

    let mine = lid.x;
    var cursor = 0u;
    if (mine < experts) {
        cursor = starts[mine];
    }
    // Entry j in (k, t) order is idx[t * K + k] with k = j / tokens, t = j % tokens.
    for (var block = 0u; block < n; block += WG) {
        let j = block + lid.x;
        var e = NO_SLOT;
        if (j < n) {
            let k = j / p.tokens;
            let t = j - k * p.tokens;
            e = idx[t * p.k + k];
        }
        stage[lid.x] = e;
        workgroupBarrier();
        if (mine < experts) {
            let len = min(WG, n - block);
            for (var i = 0u; i < len; i++) {
                if (stage[i] == mine) {
                    let jj = block + i;
                    let k = jj / p.tokens;
                    let t = jj - k * p.tokens;
                    rows[cursor] = t;
                    slot_of[t * p.k + k] = cursor;
                    cursor += 1u;
                }
            }
        }
        workgroupBarrier();
    }
}

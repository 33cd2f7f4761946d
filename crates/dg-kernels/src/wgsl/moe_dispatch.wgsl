// MoE dispatch: counting sort of the routing entries idx[t, k] by expert.
//   offsets[e] .. offsets[e + 1]: the slots of expert e (offsets[E] = number of valid entries);
//   rows[slot] = t; slot_of[t * K + k] = slot (0xffffffff for an expert id >= E).
// Within an expert, slots follow (k, t) order: k major, then t, like dg_cpu::moe::experts.
//
// E + 1 workgroups (a linear index over a possibly folded grid). Entry j of the (k, t) order is
// idx[t * K + k] with k = j / T, t = j % T; invocation i owns the run of entries
// [i * chunk, (i + 1) * chunk) of that order. Workgroup e:
//   1. each invocation counts, in its run, the valid entries below expert e and those of e;
//   2. a workgroup inclusive scan of both counts gives offsets[e] (all entries below e) and each
//      run's first slot among expert e's (the entries of e in the earlier runs);
//   3. each invocation places its run's entries of e at consecutive slots, in (k, t) order.
// Workgroup E writes offsets[E] and marks the out-of-range entries. Every workgroup reads the
// whole (small) routing table; nothing is shared between workgroups, so no order is left to timing.
//
// With p.tile_rows != 0 (at most TABLE_EXPERTS experts), workgroup E also writes the tensor-core
// grouped GEMM's tile table after the offsets: offsets[E + 1 + t] for t < table_len (see
// coop_grouped_gemm.rs) holds, for each expert in order and each m tile of tile_rows slots that
// expert's count needs, e | (m << 16); then NO_TILE. It counts each expert's entries itself (the
// offsets are being written by the other workgroups), with workgroup atomics: sums, so the result
// is the same in any order.

struct Params {
    tokens: u32,
    k: u32,
    experts: u32,
    tile_rows: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> idx: array<u32>;
@group(0) @binding(2) var<storage, read_write> offsets: array<u32>;
@group(0) @binding(3) var<storage, read_write> rows: array<u32>;
@group(0) @binding(4) var<storage, read_write> slot_of: array<u32>;

var<workgroup> scan: array<vec2<u32>, WG>;
var<workgroup> expert_count: array<atomic<u32>, TABLE_EXPERTS>;

const NO_SLOT: u32 = 0xffffffffu;
const NO_TILE: u32 = 0xffffffffu;

// Inclusive Hillis-Steele scan of every invocation's `mine` over the workgroup (in `scan`).
fn inclusive_scan(i: u32, mine: vec2<u32>) {
    scan[i] = mine;
    workgroupBarrier();
    for (var d = 1u; d < WG; d *= 2u) {
        var v = scan[i];
        if (i >= d) {
            v += scan[i - d];
        }
        workgroupBarrier();
        scan[i] = v;
        workgroupBarrier();
    }
}

// Workgroup E's tile table, from the valid entries of the invocations' runs [j0, j1).
fn write_tile_table(i: u32, j0: u32, j1: u32) {
    for (var x = i; x < p.experts; x += WG) {
        atomicStore(&expert_count[x], 0u);
    }
    workgroupBarrier();
    for (var j = j0; j < j1; j++) {
        let kk = j / p.tokens;
        let x = idx[(j - kk * p.tokens) * p.k + kk];
        if (x < p.experts) {
            atomicAdd(&expert_count[x], 1u);
        }
    }
    workgroupBarrier();
    // Invocation i lists the m tiles of experts [x0, x1); their first entry follows a scan.
    let chunk = (p.experts + WG - 1u) / WG;
    let x0 = min(p.experts, i * chunk);
    let x1 = min(p.experts, x0 + chunk);
    var mine = 0u;
    for (var x = x0; x < x1; x++) {
        mine += (atomicLoad(&expert_count[x]) + p.tile_rows - 1u) / p.tile_rows;
    }
    workgroupBarrier();
    inclusive_scan(i, vec2<u32>(mine, 0u));
    let table = p.experts + 1u;
    var at = scan[i].x - mine;
    for (var x = x0; x < x1; x++) {
        let tiles = (atomicLoad(&expert_count[x]) + p.tile_rows - 1u) / p.tile_rows;
        for (var m = 0u; m < tiles; m++) {
            offsets[table + at] = x | (m << 16u);
            at += 1u;
        }
    }
    let len = (p.tokens * p.k + p.experts * (p.tile_rows - 1u)) / p.tile_rows;
    for (var t = scan[WG - 1u].x + i; t < len; t += WG) {
        offsets[table + t] = NO_TILE;
    }
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) i: u32) {
    let e = wid.x + nwg.x * (wid.y + nwg.y * wid.z);
    if (e > p.experts) {
        return;   // padding of a folded grid (uniform: the whole workgroup leaves)
    }
    let n = p.tokens * p.k;
    let chunk = (n + WG - 1u) / WG;
    let j0 = min(n, i * chunk);
    let j1 = min(n, j0 + chunk);

    // 1. Counts in this invocation's run: (valid entries below e, entries of e).
    var mine = vec2<u32>(0u, 0u);
    for (var j = j0; j < j1; j++) {
        let kk = j / p.tokens;
        let x = idx[(j - kk * p.tokens) * p.k + kk];
        mine += vec2<u32>(select(0u, 1u, x < e), select(0u, 1u, x == e));
    }

    // 2. Inclusive scan over the runs.
    inclusive_scan(i, mine);
    let below = scan[WG - 1u].x;   // slots of the experts before e (for e = E: every valid entry)
    if (i == 0u) {
        offsets[e] = below;
    }

    // 3. Placement.
    if (e < p.experts) {
        var cursor = below + scan[i].y - mine.y;
        for (var j = j0; j < j1; j++) {
            let kk = j / p.tokens;
            let t = j - kk * p.tokens;
            if (idx[t * p.k + kk] == e) {
                rows[cursor] = t;
                slot_of[t * p.k + kk] = cursor;
                cursor += 1u;
            }
        }
    } else {
        for (var j = j0; j < j1; j++) {
            let kk = j / p.tokens;
            let at = (j - kk * p.tokens) * p.k + kk;
            if (idx[at] >= p.experts) {
                slot_of[at] = NO_SLOT;
            }
        }
        if (p.tile_rows != 0u) {
            write_tile_table(i, j0, j1);
        }
    }
}

// The decoder's attention in one kernel on the tensor cores (see coop_attention.rs for the
// contract): for query head h = wid.y and queries q0 = wid.x * QM .. q0 + QM,
//   O[i] = sum over visible keys j of softmax_j(q_i · k_j) v_j   (scaling 1)
// over the KV cache's keys 0..p.keys of K/V head h / p.group, keys gap_start..gap_end masked.
// q: f32 rows p.q_rs apart from p.q_offset (head h at column h * D), rounded to f16 when staged;
// K and V: the f16 cache, key j's head at kv_offset + j * kv_rs + (h / group) * D; O: f32 rows
// p.o_rs apart from p.o_offset, head h at column h * D. The last block's rows past p.queries
// stage the last query and are not stored.
//
// Pass 1 runs the key tiles (BKEY keys) for each row's maximum; pass 2 runs them again for
// e = exp(s - max) (0 where masked), summed per row in f32 and staged as f16 for O += E · V;
// the end divides O by the row's sum (a row with no visible key is all zeros). The scores
// never leave workgroup memory.
//
// K and V reach the tensor cores through one stage of workgroup memory (`kv`, rows of KP4 vec4s):
// every invocation loads its share of the next tile into registers (`rk`, `rv`) a phase before
// it is stored there, as the GEMMs' rings do. The stage first holds the block's queries, from
// which each subgroup keeps its q fragments in registers. Keys past p.keys load the last key
// (and are masked).
//
// Subgroup s computes S's 16 × 16 block at rows (s % 2) * 16, keys ((s / 2) % KB) * 16 of a key
// tile (KB = BKEY / 16) over part s / (2 KB) of the head's SPLIT parts of DP dims (the parts summed
// as the softmax reads them), and owns O's block at rows (s / 4) * 16, columns (s % 4) * D / 4.
// Invocation t reduces row t / 8 over key columns (t % 8) * CPI .. + CPI of a tile. Requires
// subgroups of exactly 32 invocations (cooperative operations of a subgroup take the same pointer
// and stride).

struct Params {
    q_offset: u32,
    q_rs: u32,
    kv_offset: u32,
    kv_rs: u32,
    group: u32,
    keys: u32,
    gap_start: u32,
    gap_end: u32,
    o_offset: u32,
    o_rs: u32,
    queries: u32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> kc: array<vec4<f16>>;
@group(0) @binding(3) var<storage, read> vc: array<vec4<f16>>;
@group(0) @binding(4) var<storage, read_write> o: array<f32>;

// The stage: the block's queries, then a key tile's K or V (rows of KP4 vec4s; BKEY ≥ QM).
var<workgroup> kv: array<vec4<f16>, BKEY * KP4>;
// A key tile's SPLIT partial scores (parts of the head, SSH f32s apart, rows of SP), then the
// end's O fragments (256 f32s a subgroup).
var<workgroup> ss: array<f32, SSL>;
// A key tile's exp(s - max) as f16, rows of PP4 vec4s.
var<workgroup> sp: array<vec4<f16>, QM * PP4>;
// Each invocation's partial: a row maximum in pass 1, a row sum at the end.
var<workgroup> red: array<f32, WT>;
// Each row's sum at the end.
var<workgroup> rowsum: array<f32, QM>;

//@ONLINE

// The cache index of invocation lt's vec4 number l of key tile `tile` (past the last key, the
// last key), and where it goes in the stage.
fn kv_src(base: u32, rs4: u32, lt: u32, l: u32, tile: u32) -> u32 {
    let e = lt + l * WT;
    return base + min(tile * BKEY + e / (D / 4u), p.keys - 1u) * rs4 + e % (D / 4u);
}

fn kv_dst(lt: u32, l: u32) -> u32 {
    let e = lt + l * WT;
    return (e / (D / 4u)) * KP4 + e % (D / 4u);
}

fn visible(key: u32) -> bool {
    return key < p.keys && (key < p.gap_start || key >= p.gap_end);
}

@compute @workgroup_size(WT)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lt: u32) {
    let h = wid.y;
    let q0 = wid.x * QM;
    let sg = lt / 32u;
    let lane = lt % 32u;
    let sr = (sg % 2u) * 16u;
    let sc = ((sg / 2u) % KB) * 16u;
    let part = sg / (2u * KB);
    let sd = part * DP;
    let orow = (sg / 4u) * 16u;
    let oc = (sg % 4u) * (D / 4u);
    let row = lt / 8u;
    let c0 = (lt % 8u) * CPI;
    let kv_base = (p.kv_offset + (h / p.group) * D) / 4u;
    let rs4 = p.kv_rs / 4u;
    let stride_kv = KP4;
    let stride_s = SP;
    let stride_p = PP4;
    let stride_o = p.o_rs;
    let tiles = (p.keys + BKEY - 1u) / BKEY;

    // The block's queries, rounded to f16, into the stage; each subgroup's q fragments from it.
    let q_base = p.q_offset / 4u + h * (D / 4u);
    let q_rs4 = p.q_rs / 4u;
    for (var e = lt; e < QM * (D / 4u); e += WT) {
        let r = e / (D / 4u);
        let c = e % (D / 4u);
        kv[r * KP4 + c] = vec4<f16>(q[q_base + min(q0 + r, p.queries - 1u) * q_rs4 + c]);
    }
    workgroupBarrier();
//@QFRAGS
    workgroupBarrier();

    // Pass 1: each row's maximum over its visible keys. K of tile 0 staged, tile 1 in rk.
    var rk: array<vec4<f16>, LKV>;
    var rv: array<vec4<f16>, LKV>;
//@LOAD rk kc 0u
//@PUT rk
//@LOAD rk kc 1u
    workgroupBarrier();
    var row_max = LOWEST;
    for (var t = 0u; t < tiles; t++) {
//@SCORES
        workgroupBarrier();
        var m = LOWEST;
        // @unroll
        for (var j = 0u; j < CPI; j++) {
            if (visible(t * BKEY + c0 + j)) {
                m = max(m, SCORE_AT);
            }
        }
        red[lt] = m;
        // The next tile's K into the stage (its scores are done), and the one after it ahead.
//@PUT rk
//@LOAD rk kc t + 2u
        workgroupBarrier();
        // @unroll
        for (var i = 0u; i < 8u; i++) {
            row_max = max(row_max, red[row * 8u + i]);
        }
    }

    // Pass 2: O = sum of exp(s - max) · V over the key tiles, and each row's sum. K of tile 0
    // staged, V of tile 0 in rv.
    workgroupBarrier();
//@LOAD rk kc 0u
//@PUT rk
//@LOAD rv vc 0u
    workgroupBarrier();
//@ACC
    var sum = 0.0;
    for (var t = 0u; t < tiles; t++) {
//@SCORES
        workgroupBarrier();
        var e: array<f32, CPI>;
        // @unroll
        for (var j = 0u; j < CPI; j++) {
            let s = SCORE_AT;
            e[j] = select(0.0, exp(s - row_max), visible(t * BKEY + c0 + j));
            sum += e[j];
        }
        // @unroll
        for (var j = 0u; j < CQ; j++) {
            sp[row * PP4 + c0 / 4u + j] = vec4<f16>(vec4<f32>(e[4u * j], e[4u * j + 1u], e[4u * j + 2u], e[4u * j + 3u]));
        }
        // V of this tile into the stage (its scores are done), the next tile's K ahead.
//@PUT rv
//@LOAD rk kc t + 1u
        workgroupBarrier();
//@VALUES
        workgroupBarrier();
        // The next tile's K into the stage (its values are done), its V ahead.
//@PUT rk
//@LOAD rv vc t + 1u
        workgroupBarrier();
    }

    // The end: O / sum, fragment by fragment through the subgroup's 256 f32s of ss.
    red[lt] = sum;
    workgroupBarrier();
    if (lt % 8u == 0u) {
        var total = 0.0;
        for (var i = 0u; i < 8u; i++) {
            total += red[row * 8u + i];
        }
        rowsum[row] = total;
    }
    workgroupBarrier();
    let scratch = sg * 256u;
    let stride_f = FRAGMENT_SIDE;
//@STORE
}

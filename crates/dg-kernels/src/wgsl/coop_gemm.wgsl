// Tensor-core GEMM through cooperative matrices (see coop_gemm.rs for the contract):
//   C[m, n] = sum over k of f16(A[m, k]) * W[n, k]     (f16 products, f32 accumulation)
// A: f32 [M, K] row-major, read as vec4s and rounded to f16 when staged in workgroup memory.
// W: f16 [N, K] row-major, read as vec4<f16>: the same bytes as f16 pairs packed in u32 words
//    (element i in the half i & 1 of word i >> 1, low half first).
// C: f32 [M, N] row-major, written whole (no accumulate).
// Batches: workgroup row y computes batch b = wid.y, whose A, W and C start a_batch, w_batch,
// c_batch elements further (the first two multiples of 4). C's rows are c_rs apart, from element
// c_offset on. Epilogue 1 (softcap): C = cap * tanh(acc / cap), applied fragment by fragment in a
// scratch of workgroup memory (cooperative matrices have no elementwise functions).
// Requires M % BM == 0, N % BN == 0, K % BK == 0 and subgroups of exactly 32 invocations
// (invocation t belongs to subgroup t / 32: every cooperative operation of a subgroup takes the
// same pointer and stride).
//
// One workgroup computes one BM x BN tile of C (workgroups numbered m tile fastest, so the ones
// that read the same W tile run together). Subgroup s owns the WM x WN block at rows
// (s / SGN) * WM, columns (s % SGN) * WN of the tile, as FM x FN accumulators of 16 x 16 f32.
// K runs in steps of BK through two stages of workgroup memory: while the subgroups multiply the
// tiles of step s, every invocation holds its share of step s + 1 in registers and then writes it
// into the other stage; one barrier a step. A staged row is KP = BK + 8 halves (16 bytes of
// padding, so that the 8 rows of a fragment load fall in distinct banks).
// A stage holds A as [BM][KP] and W as [BN][KP]: the A fragments load row-major (coopLoadT), the
// B fragments (B[k][n] = W[n][k]) column-major (coopLoad) from the same [n][k] rows.
// Every index and stride handed to a cooperative load or store is a `let` of its own.

// (`enable f16;` and `enable wgpu_cooperative_matrix;` come first, ahead of the const prelude.)

// The element of the staged tiles: f16, or vec4<f16> (then SE = 4 halves an element, one
// 8-byte store per staged vec4, and the cooperative loads count their stride in vec4s).
alias SElem = SELEM_TYPE;

struct Params {
    m: u32,
    n: u32,
    k: u32,
    a_batch: u32,
    w_batch: u32,
    c_batch: u32,
    c_rs: u32,
    c_offset: u32,
    cap: f32,
    epilogue: u32,
    pad0: u32,
    pad1: u32,
    pad2: u32,
    pad3: u32,
    pad4: u32,
    pad5: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> a: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> w: array<W_ELEM>;
@group(0) @binding(3) var<storage, read_write> c: array<f32>;

// Two stages of A ([BM][KP] halves each) and of W ([BN][KP] halves each).
var<workgroup> sa: array<SElem, SAL>;
var<workgroup> sb: array<SElem, SBL>;
// One 16 x 16 f32 fragment per subgroup, for the epilogue.
var<workgroup> scratch: array<f32, WT * 8u>;

//@PUT

@compute @workgroup_size(WT)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lt: u32) {
    let tiles_m = p.m / BM;
    let m0 = (wid.x % tiles_m) * BM;
    let n0 = (wid.x / tiles_m) * BN;
    let sg = lt / 32u;
    let sm = (sg / SGN) * WM;
    let sn = (sg % SGN) * WN;
    let k4 = p.k / 4u;
    let steps = p.k / BK;
    let stride_s = KPS;
    let w_step = BK4;
    let stride_c = p.c_rs;
    let stride_f = 16u;
    let lane = lt % 32u;
    let a_base = wid.y * (p.a_batch / 4u);
    let w_base = wid.y * (p.w_batch / 4u);
    let c_base = p.c_offset + wid.y * p.c_batch;

    // The vec4s of A and W this invocation stages: their index at step 0 (a step adds BK4) and
    // their place (in halves) in a stage.
    var a_src: array<u32, LA>;
    // @unroll
    for (var l = 0u; l < LA; l++) {
        let e = lt + l * WT;
        a_src[l] = a_base + (m0 + e / BK4) * k4 + e % BK4;
    }
    var w_src: array<u32, LW>;
    // @unroll
    for (var l = 0u; l < LW; l++) {
        let e = lt + l * WT;
        w_src[l] = w_base + (n0 + e / BK4) * k4 + e % BK4;
    }
    // Direct W fragments (coop_kloop_direct.wgsl): the subgroup's first W row, rows k4 apart.
    let w_sub = w_base + (n0 + sn) * k4;
    let stride_w = k4;

//@KLOOP
    if (p.epilogue == 0u) {
//@STORE
    } else {
//@STORE_CAPPED
    }
}

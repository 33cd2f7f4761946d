// Tensor-core GEMM through cooperative matrices (see coop_gemm.rs for the contract), the f32
// GEMM's strided product (gemm.wgsl, the same GemmParams) with f16 operands:
//   C[b][i, j] = epilogue(alpha * sum over q of f16(A[b][i, q]) * f16(B[b / div][q, j]) (+ C))
//   A[b][i, q] = a[a_offset + b * a_batch + i * a_rs + q]                (a_cs = 1)
//   B[b][q, j] = w[b_offset + b * b_batch + q * b_rs + j * b_cs]
//   (or, W in K panels: W[b][j, q] = w[b_offset + b * b_batch + (q / BK) * n * BK + j * BK + q % BK])
//   C[b][i, j] = c[c_offset + b * c_batch + i * c_rs + j]
// A: f32, read as vec4s (a_offset, a_rs, a_batch multiples of 4) and rounded to f16 when staged.
// B: W_ELEM vec4s (4 elements each: f16, BF16 pairs in u32 words, or f32), rounded to f16 when
//    staged; laid out as B_LAYOUT: NK (b_rs = 1: W[n][k] rows of b_cs, PyTorch's [out, in]) or KN
//    (b_cs = 1: B[k][n] rows of b_rs), that stride, b_offset and b_batch multiples of 4.
// Epilogue (scratch path): alpha, then accumulate (C += ...), then softcap (epilogue 1:
// cap * tanh(v / cap)), applied fragment by fragment in a scratch of workgroup memory (cooperative
// matrices have no elementwise functions); a plain product (alpha 1, no accumulate, no softcap)
// stores its fragments straight to C.
// Batches: workgroup row y computes batch b = wid.y.
// Causal (p.causal_n, p.causal_k != 0): tiles whose columns lie past every row's j < i + causal_n
// do nothing; K stops after the steps that hold some q < i + causal_k for the tile's last row.
// Split K (p.split_steps > 0): workgroup layer z runs the K steps z * split_steps .. (at most
// split_steps of them) and stores its plain product at c_offset + z * split_stride (the Recorder
// passes alpha 1, no accumulate and no epilogue; split_k_reduce.wgsl adds the partials).
// Requires N % BN == 0, K % BK == 0 and subgroups of exactly 32 invocations
// (invocation t belongs to subgroup t / 32: every cooperative operation of a subgroup takes the
// same pointer and stride).
//
// One workgroup computes one BM x BN tile of C (workgroups numbered m tile fastest, so the ones
// that read the same W tile run together). The last m tile may be partial: its rows past M stage
// A's last row and are never stored (the store goes through the scratch path, row by row). Subgroup s owns the WM x WN block at rows
// (s / SGN) * WM, columns (s % SGN) * WN of the tile, as FM x FN accumulators of 16 x 16 f32.
// K runs in steps of BK through two stages of workgroup memory: while the subgroups multiply the
// tiles of step s, every invocation holds its share of step s + 1 in registers and then writes it
// into the other stage; one barrier a step. A staged row is KP = BK + 8 halves (16 bytes of
// padding, so that the 8 rows of a fragment load fall in distinct banks).
// A stage holds A as [BM][KP] (fragments load row-major, coopLoadT) and W as [BN][KP] for NK
// (B fragments column-major, coopLoad) or [BK][NP = BN + 8] for KN (B fragments row-major).
// Every index and stride handed to a cooperative load or store is a `let` of its own.

// (`enable f16;` and `enable wgpu_cooperative_matrix;` come first, ahead of the const prelude.)

// The element of the staged tiles: f16, or vec4<f16> (then SE = 4 halves an element, one
// 8-byte store per staged vec4, and the cooperative loads count their stride in vec4s).
alias SElem = SELEM_TYPE;

//@PARAMS

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> a: array<A_ELEM>;
@group(0) @binding(2) var<storage, read> w: array<W_WORD>;
@group(0) @binding(3) var<storage, read_write> c: array<f32>;

// Two stages of A ([BM][KP] halves each) and of W ([BN][KP] halves each).
var<workgroup> sa: array<SElem, SAL>;
var<workgroup> sb: array<SElem, SBL>;
// One 16 x 16 f32 fragment per subgroup, for the epilogue.
var<workgroup> scratch: array<f32, WT * 8u>;

//@PUT

@compute @workgroup_size(WT)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lt: u32) {
    let tiles_m = (p.m + BM - 1u) / BM;
    let m0 = (wid.x % tiles_m) * BM;
    let n0 = (wid.x / tiles_m) * BN;
    let sg = lt / 32u;
    let sm = (sg / SGN) * WM;
    let sn = (sg % SGN) * WN;
    // Causal products (p.causal_n, p.causal_k): the tile's last row bounds the columns it needs
    // and the K steps whose A is not all zero. A tile with no column needed does nothing (the
    // whole body is under `if (!skipped)`: an early return would leave the cooperative operations
    // in control flow naga cannot prove uniform, and so would `&&`, which naga lowers through a
    // variable); a split whose range lies past the zeros still runs one step (adding exact
    // zeros) and stores its partial.
    let last_row = min(m0 + BM, p.m) - 1u;
    let skipped = (p.causal_n != 0u) & (n0 >= last_row + p.causal_n);
    if (!skipped) {
    let all_steps = p.k / BK;
    let live_steps = select(all_steps, min(all_steps, (last_row + p.causal_k + BK - 1u) / BK), p.causal_k != 0u);
    let s0 = wid.z * p.split_steps;
    let split_live = select(1u, live_steps - s0, live_steps > s0);
    let steps = max(1u, select(live_steps, min(p.split_steps, split_live), p.split_steps != 0u));
    let stride_s = KPS;
    let stride_n = NPS;
    let stride_c = p.c_rs;
    let stride_f = FRAGMENT_SIDE;
    let lane = lt % 32u;
    let a_base = (p.a_offset + wid.y * p.a_batch) / 4u;
    let w_base = (p.b_offset + (wid.y / max(p.b_batch_div, 1u)) * p.b_batch) / 4u;
    let c_base = p.c_offset + wid.y * p.c_batch + wid.z * p.split_stride;
    let a_rs4 = p.a_rs / 4u;

    // The vec4s of A this invocation stages: their index at step 0 (a step adds BK4).
    var a_src: array<u32, LA>;
    // @unroll
    for (var l = 0u; l < LA; l++) {
        let e = lt + l * WT;
        a_src[l] = a_base + min(m0 + e / BK4, p.m - 1u) * a_rs4 + e % BK4 + s0 * BK4;
    }
    // The vec4s of W: NK, vec4 e of a step is row n0 + e / BK4 (rows b_cs apart), column e % BK4,
    // a step adds BK4; KN, row e / BN4 of the step's BK rows (b_rs apart), column n0 / 4 + e % BN4,
    // a step adds BK rows; K panels, the step's BN x BK block is contiguous from row n0 of the
    // panel, a step adds one panel (N * BK4).
    let w_step = W_STEP;
    var w_src: array<u32, LW>;
    // @unroll
    for (var l = 0u; l < LW; l++) {
        let e = WU * (lt + l * WT);
        w_src[l] = W_SRC + s0 * w_step;
    }
    // Direct W fragments (coop_kloop.rs, direct): the subgroup's first W row, W rows
    // stride_w vec4s apart.
    let stride_w = W_ROW;
    let w_sub = w_base + (n0 + sn) * stride_w + s0 * w_step;

//@KLOOP
    if (p.epilogue == 0u && p.accumulate == 0u && p.alpha == 1.0 && m0 + BM <= p.m) {
//@STORE
    } else {
//@STORE_EPILOGUE
    }
    }
}

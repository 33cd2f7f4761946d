// Shared tiling core of gemm.wgsl and grouped_gemm.wgsl (concatenated in front of each).
//
// One workgroup computes one BM x BN tile of C = A·B, walking K in steps of BK:
//   - each step, every invocation stages LA elements of the BM x BK A tile and LB elements of the
//     BK x BN B tile from registers into workgroup memory, then prefetches the next step's elements
//     into registers (global loads in flight while the tile is multiplied);
//   - invocation (tx, ty) owns a TM x TN register block of C: rows ty + r*WM, columns tx + c*WN
//     (strided, so neighbouring invocations read neighbouring words of the shared tiles: no bank
//     conflicts, and their final stores to C are coalesced).
// Which invocation stages which element depends on the operand layout (a uniform choice per
// dispatch): consecutive invocations walk the dimension whose stride is 1, so global loads coalesce
// for row-major and transposed operands alike. The shared row strides AP and BP are padded so that
// the transposed staging pattern (BK consecutive k values x 32/BK rows per 32 lanes) hits 32
// distinct banks.
//
// Loops marked `// @unroll` have constant trip counts and are expanded by the renderer (gemm.rs,
// `unroll`) into straight-line blocks that bind the loop variable as a `const`. Register arrays are
// then only ever indexed by constants (they stay in registers), and the K loop is the only loop
// left in the hot path: naga's loop bounding otherwise stops drivers from unrolling, and lavapipe
// silently leaves any shader after 65535 loop iterations in total.
//
// Prelude constants: BM, BN, BK (tile), TM, TN (register block), WM = BM/TM, WN = BN/TN,
// WG = WM*WN (invocations), LA = BM*BK/WG, LB = BK*BN/WG (elements each invocation stages per
// step), AP, BP (padded shared row strides). The including kernel declares the storage buffers
// `a` and `b`.

const_assert WM * TM == BM && WN * TN == BN && WG == WM * WN;
const_assert LA * WG == BM * BK && LB * WG == BK * BN;
const_assert AP >= BM && BP >= BN;

var<workgroup> a_tile: array<f32, BK * AP>;   // a_tile[kk * AP + i] = A(m0 + i, k0 + kk)
var<workgroup> b_tile: array<f32, BK * BP>;   // b_tile[kk * BP + j] = B(k0 + kk, n0 + j)

// The element of the A tile that invocation t stages in its slot l, as (row i, k index kk).
// k_fast: consecutive invocations take consecutive kk (A row-major, a_cs = 1); else consecutive i.
fn a_slot(t: u32, l: u32, k_fast: bool) -> vec2<u32> {
    let e = t + l * WG;
    if (k_fast) {
        return vec2<u32>(e / BK, e % BK);
    }
    return vec2<u32>(e % BM, e / BM);
}

// The element of the B tile that invocation t stages in its slot l, as (k index kk, column j).
// n_fast: consecutive invocations take consecutive j (B row-major, b_cs = 1); else consecutive kk
// (B is a transposed [N, K] weight, b_rs = 1).
fn b_slot(t: u32, l: u32, n_fast: bool) -> vec2<u32> {
    let e = t + l * WG;
    if (n_fast) {
        return vec2<u32>(e / BN, e % BN);
    }
    return vec2<u32>(e % BK, e / BK);
}

// How one workgroup reads its operands. Element (i, kk) of the A tile of step k0 is
// a[a_off[l] + (k0 + kk) * a_cs], where a_off[l] is the offset of A(m0 + i, 0) for the row of
// slot l (precomputed by the kernel: a gathered row costs one lookup per dispatch, not per step);
// element (kk, j) of the B tile is b[b_off[l] + (k0 + kk) * b_rs] likewise.
// rows, cols: the valid rows and columns of this tile.
struct Job {
    k: u32,
    rows: u32,
    cols: u32,
    a_cs: u32,
    b_rs: u32,
    a_k_fast: bool,
    b_n_fast: bool,
}

// Loads the A elements of step k0 into registers (zero outside the matrix).
fn fetch_a(t: u32, k0: u32, job: Job, a_off: ptr<function, array<u32, LA>>) -> array<f32, LA> {
    var r: array<f32, LA>;
    // @unroll
    for (var l = 0u; l < LA; l++) {
        let s = a_slot(t, l, job.a_k_fast);
        let kp = k0 + s.y;
        if (s.x < job.rows && kp < job.k) {
            r[l] = a[(*a_off)[l] + kp * job.a_cs];
        }
    }
    return r;
}

// Loads the B elements of step k0 into registers (zero outside the matrix).
fn fetch_b(t: u32, k0: u32, job: Job, b_off: ptr<function, array<u32, LB>>) -> array<f32, LB> {
    var r: array<f32, LB>;
    // @unroll
    for (var l = 0u; l < LB; l++) {
        let s = b_slot(t, l, job.b_n_fast);
        let kp = k0 + s.x;
        if (s.y < job.cols && kp < job.k) {
            r[l] = b[(*b_off)[l] + kp * job.b_rs];
        }
    }
    return r;
}

// The TM x TN block of A·B owned by invocation t (element [r * TN + c] is row ty + r*WM, column
// tx + c*WN of the tile), accumulated in f32 over all of K.
// Must be called in uniform control flow (it synchronises the workgroup).
fn gemm_tile(t: u32, job: Job, a_off: ptr<function, array<u32, LA>>,
             b_off: ptr<function, array<u32, LB>>) -> array<f32, TM * TN> {
    let tx = t % WN;
    let ty = t / WN;
    var acc: array<f32, TM * TN>;
    var ra = fetch_a(t, 0u, job, a_off);
    var rb = fetch_b(t, 0u, job, b_off);
    for (var k0 = 0u; k0 < job.k; k0 += BK) {
        // Stage this step's registers into the shared tiles.
        // @unroll
        for (var l = 0u; l < LA; l++) {
            let s = a_slot(t, l, job.a_k_fast);
            a_tile[s.y * AP + s.x] = ra[l];
        }
        // @unroll
        for (var l = 0u; l < LB; l++) {
            let s = b_slot(t, l, job.b_n_fast);
            b_tile[s.x * BP + s.y] = rb[l];
        }
        workgroupBarrier();
        // Prefetch the next step while this one is multiplied.
        if (k0 + BK < job.k) {
            ra = fetch_a(t, k0 + BK, job, a_off);
            rb = fetch_b(t, k0 + BK, job, b_off);
        }
        // acc += (column kk of the A tile) x (row kk of the B tile), for each kk of the step.
        // @unroll
        for (var kk = 0u; kk < BK; kk++) {
            var av: array<f32, TM>;
            var bv: array<f32, TN>;
            // @unroll
            for (var r = 0u; r < TM; r++) {
                av[r] = a_tile[kk * AP + ty + r * WM];
            }
            // @unroll
            for (var c = 0u; c < TN; c++) {
                bv[c] = b_tile[kk * BP + tx + c * WN];
            }
            // @unroll
            for (var r = 0u; r < TM; r++) {
                // @unroll
                for (var c = 0u; c < TN; c++) {
                    acc[r * TN + c] += av[r] * bv[c];
                }
            }
        }
        workgroupBarrier();
    }
    return acc;
}

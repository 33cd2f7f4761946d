// Shared tiling core of gemm.wgsl and grouped_gemm.wgsl (concatenated in front of each).
//
// One workgroup computes one BM x BN tile of C = A·B, walking K in steps of BK:
//   - each step, every invocation stages LA elements of the BM x BK A tile and LB elements of the
//     BK x BN B tile from registers into workgroup memory, then prefetches the next step's elements
//     into registers (global loads in flight while the tile is multiplied);
//   - invocation (tx, ty) owns a TM x TN register block of C: rows ty + r*WM, columns tx + c*WN
//     (strided, so neighbouring invocations read neighbouring words of the shared tiles: no bank
//     conflicts, and their final stores to C are coalesced).
// Which thread stages which element depends on the operand layout (a uniform choice per dispatch):
// consecutive invocations walk the dimension whose stride is 1, so global loads coalesce for both
// row-major and transposed operands. The shared row strides AP and BP (from the prelude) are padded
// so that the transposed staging pattern (BK consecutive k values x 32/BK rows per 32 lanes) hits 32
// distinct banks.
//
// Prelude constants: BM, BN, BK (tile), TM, TN (register block), AP, BP (padded shared strides).
// The including kernel declares the storage buffers `a` and `b`.

const WM: u32 = BM / TM;           // invocations along m
const WN: u32 = BN / TN;           // invocations along n
const WG: u32 = WM * WN;           // invocations per workgroup
const LA: u32 = BM * BK / WG;      // A elements each invocation stages per k step
const LB: u32 = BK * BN / WG;      // B elements each invocation stages per k step

var<workgroup> a_tile: array<f32, BK * AP>;   // a_tile[p * AP + i] = A(m0 + i, k0 + p)
var<workgroup> b_tile: array<f32, BK * BP>;   // b_tile[p * BP + j] = B(k0 + p, n0 + j)

// The element of the A tile that invocation t stages in its slot l, as (row i, k index p).
// k_fast: consecutive invocations take consecutive p (A row-major, a_cs = 1); else consecutive i.
fn a_slot(t: u32, l: u32, k_fast: bool) -> vec2<u32> {
    let e = t + l * WG;
    if (k_fast) {
        return vec2<u32>(e / BK, e % BK);
    }
    return vec2<u32>(e % BM, e / BM);
}

// The element of the B tile that invocation t stages in its slot l, as (k index p, column j).
// n_fast: consecutive invocations take consecutive j (B row-major, b_cs = 1); else consecutive p
// (B is a transposed [N, K] weight, b_rs = 1).
fn b_slot(t: u32, l: u32, n_fast: bool) -> vec2<u32> {
    let e = t + l * WG;
    if (n_fast) {
        return vec2<u32>(e / BN, e % BN);
    }
    return vec2<u32>(e % BK, e / BK);
}

// How one workgroup reads its operands. Element (i, p) of the A tile is a[a_off[l] + (k0 + p) * a_cs]
// where a_off[l] is the offset of A(m0 + i, 0) for the row of slot l (precomputed by the kernel, so
// a gathered row costs one lookup per dispatch, not per k step); element (p, j) of the B tile is
// b[b_off[l] + (k0 + p) * b_rs] likewise. rows/cols: valid rows and columns of this tile.
struct Job {
    k: u32,
    rows: u32,
    cols: u32,
    a_cs: u32,
    b_rs: u32,
    a_k_fast: bool,
    b_n_fast: bool,
}

// Loads the A elements of k step k0 (zero outside the matrix).
fn fetch_a(t: u32, k0: u32, job: Job, a_off: ptr<function, array<u32, LA>>) -> array<f32, LA> {
    var r: array<f32, LA>;
    for (var l = 0u; l < LA; l++) {
        let s = a_slot(t, l, job.a_k_fast);
        let p = k0 + s.y;
        if (s.x < job.rows && p < job.k) {
            r[l] = a[(*a_off)[l] + p * job.a_cs];
        }
    }
    return r;
}

// Loads the B elements of k step k0 (zero outside the matrix).
fn fetch_b(t: u32, k0: u32, job: Job, b_off: ptr<function, array<u32, LB>>) -> array<f32, LB> {
    var r: array<f32, LB>;
    for (var l = 0u; l < LB; l++) {
        let s = b_slot(t, l, job.b_n_fast);
        let p = k0 + s.x;
        if (s.y < job.cols && p < job.k) {
            r[l] = b[(*b_off)[l] + p * job.b_rs];
        }
    }
    return r;
}

// The TM x TN block of A·B owned by invocation t, accumulated in f32 over all of K.
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
        for (var l = 0u; l < LA; l++) {
            let s = a_slot(t, l, job.a_k_fast);
            a_tile[s.y * AP + s.x] = ra[l];
        }
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
        for (var p = 0u; p < BK; p++) {
            var av: array<f32, TM>;
            var bv: array<f32, TN>;
            for (var r = 0u; r < TM; r++) {
                av[r] = a_tile[p * AP + ty + r * WM];
            }
            for (var c = 0u; c < TN; c++) {
                bv[c] = b_tile[p * BP + tx + c * WN];
            }
            for (var r = 0u; r < TM; r++) {
                for (var c = 0u; c < TN; c++) {
                    acc[r * TN + c] += av[r] * bv[c];
                }
            }
        }
        workgroupBarrier();
    }
    return acc;
}

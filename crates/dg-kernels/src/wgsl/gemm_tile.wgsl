// Shared tiling core of gemm.wgsl (concatenated in front of it).
//
// One workgroup computes one BM x BN tile of C = A·B, walking K in steps of BK. With NS > 1 slices
// the workgroup holds NS groups of WG invocations; slice s walks the s-th contiguous run of
// `steps` K steps with its own shared tiles (the kernel then sums the slices' blocks in a fixed
// order). Per slice:
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
// WG = WM*WN (invocations per slice), NS (slices), NS1 = NS - 1, WT = WG*NS (invocations),
// LA = BM*BK/WG, LB = BK*BN/WG (elements each invocation stages per step), AP, BP (padded shared
// row strides), SA = BK*(AP+BP) (shared words per slice), SMEM (shared words in all). The
// including kernel declares the storage buffers `a` and `b`.

const_assert WM * TM == BM && WN * TN == BN && WG == WM * WN && WT == WG * NS && NS1 + 1u == NS;
const_assert LA * WG == BM * BK && LB * WG == BK * BN;
const_assert AP >= BM && BP >= BN && SA == BK * (AP + BP) && SMEM >= NS * SA && SMEM >= NS1 * BM * BN;

// Slice s's tiles: smem[s*SA + kk*AP + i] = A(m0 + i, k0 + kk), smem[s*SA + BK*AP + kk*BP + j] =
// B(k0 + kk, n0 + j). After the K loop the kernel may reuse all of it.
var<workgroup> smem: array<f32, SMEM>;

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
// k_begin, k_end: this slice's K range; steps: K steps per slice (the same for every slice: the
// loop holds barriers); tiles: this slice's first shared word; rows, cols: the valid rows and
// columns of this tile.
struct Job {
    k_begin: u32,
    k_end: u32,
    steps: u32,
    tiles: u32,
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
        if (s.x < job.rows && kp < job.k_end) {
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
        if (s.y < job.cols && kp < job.k_end) {
            r[l] = load_b((*b_off)[l] + kp * job.b_rs);
        }
    }
    return r;
}

// The TM x TN block of A·B owned by invocation t of its slice (element [r * TN + c] is row
// ty + r*WM, column tx + c*WN of the tile), accumulated in f32 over the slice's K range.
// Must be called in uniform control flow (it synchronises the workgroup).
fn gemm_tile(t: u32, job: Job, a_off: ptr<function, array<u32, LA>>,
             b_off: ptr<function, array<u32, LB>>) -> array<f32, TM * TN> {
    let tx = t % WN;
    let ty = t / WN;
    let at = job.tiles;
    let bt = job.tiles + BK * AP;
    var acc: array<f32, TM * TN>;
    var k0 = job.k_begin;
    var ra = fetch_a(t, k0, job, a_off);
    var rb = fetch_b(t, k0, job, b_off);
    for (var step = 0u; step < job.steps; step++) {
        // Stage this step's registers into the shared tiles.
        // @unroll
        for (var l = 0u; l < LA; l++) {
            let s = a_slot(t, l, job.a_k_fast);
            smem[at + s.y * AP + s.x] = ra[l];
        }
        // @unroll
        for (var l = 0u; l < LB; l++) {
            let s = b_slot(t, l, job.b_n_fast);
            smem[bt + s.x * BP + s.y] = rb[l];
        }
        workgroupBarrier();
        // Prefetch the next step while this one is multiplied.
        if (step + 1u < job.steps) {
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
                av[r] = smem[at + kk * AP + ty + r * WM];
            }
            // @unroll
            for (var c = 0u; c < TN; c++) {
                bv[c] = smem[bt + kk * BP + tx + c * WN];
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
        k0 += BK;
    }
    return acc;
}

// The K range of slice `slice` for a K of `k`: every slice runs `steps` steps (the last ones may
// run past k, masked), slice s starts at step s * steps.
fn slice_job(k: u32, slice: u32) -> Job {
    var job: Job;
    let steps = ((k + BK - 1u) / BK + NS - 1u) / NS;
    job.steps = steps;
    job.k_begin = min(k, slice * steps * BK);
    job.k_end = min(k, job.k_begin + steps * BK);
    job.tiles = slice * SA;
    return job;
}

// Adds the blocks of slices 1..NS-1 to slice 0's, in ascending slice order (a fixed order: the
// result does not depend on timing). Slice 0's invocations hold the sum afterwards; the others'
// blocks are left as they were. Must be called in uniform control flow, after gemm_tile (whose
// last barrier frees the shared memory).
fn reduce_slices(t: u32, slice: u32, acc: ptr<function, array<f32, TM * TN>>) {
    if (NS > 1u) {
        if (slice > 0u) {
            let base = (slice - 1u) * (TM * TN * WG);
            // @unroll
            for (var e = 0u; e < TM; e++) {
                // @unroll
                for (var f = 0u; f < TN; f++) {
                    smem[base + (e * TN + f) * WG + t] = (*acc)[e * TN + f];
                }
            }
        }
        workgroupBarrier();
        if (slice == 0u) {
            // @unroll
            for (var s = 0u; s < NS1; s++) {
                // @unroll
                for (var e = 0u; e < TM; e++) {
                    // @unroll
                    for (var f = 0u; f < TN; f++) {
                        (*acc)[e * TN + f] += smem[s * (TM * TN * WG) + (e * TN + f) * WG + t];
                    }
                }
            }
        }
    }
}

// Grouped GEMM of the MoE experts. Tokens are grouped by expert into slots; the slots of expert e
// are offsets[e] .. offsets[e + 1]. W holds experts first_group .. first_group + groups (0 ..
// unless the experts are split across bindings, one dispatch per part); for every slot s of its
// expert g (expert first_group + g):
//   C[s, j] = sum_p A[row(s), p] * W[g, j, p]      (W: [groups, N, K], PyTorch [out, in] per expert)
// with row(s) = gather_rows[s] when `gather` != 0, else s;  A[r, p] = a[r * a_rs + p],
// W[g, j, p] = b[g * b_group_stride + j * K + p],  C[s, j] = c[s * c_rs + j].
// The grid covers max_rows (an upper bound on any group's slot count, known without a readback):
// a workgroup whose m tile starts past its group's count leaves at once. Linear workgroup index
// decoded m tile fastest, then n tile, then group (see grouped_gemm.rs `workgroups`): the m tiles
// of one expert's column block run together and share its weights through the cache.
//
// Tiling, for few rows per group and large N and K. One workgroup computes a BM x BN block of C,
// walking K in steps of BK through shared memory (registers prefetch the next step's elements
// while the current one is multiplied). Invocation (tx, ty) owns TM consecutive rows
// ty*TM .. ty*TM+TM-1 and TN columns in runs of 4: c*4*WN + 4*tx + q (q < 4, c < TN/4), so
//   - every shared read is a vec4: the A tile's TM rows are one broadcast per 4 rows (a warp of
//     32 invocations shares ty when WN >= 32), the B tile's columns one vec4 per invocation;
//   - one k step costs TM*TN FMAs per TM/4 + TN/4 shared reads;
//   - a row block past the group's count (ty*TM >= rows) skips the multiply entirely: with
//     WN >= 32 that is a whole warp, so a group of 20 slots costs 24 rows of work, not 32.
// Both operands are K-contiguous. Staging works on quads of 4 tile rows (A) or columns (B): slot l
// of invocation t holds k index t % BK of quad t / BK + l * RS, so BK consecutive invocations read
// BK consecutive words of one row (whole 32-byte sectors) and every shared store is a whole vec4.
// The shared row strides AP4, BP4 (in vec4s: odd for BK = 8, twice an odd number for BK = 4) keep
// the 8 invocations of a quarter warp (a 128-bit access's unit) on distinct banks.
//
// Loops marked `// @unroll` are expanded by the renderer (gemm.rs `unroll`): register arrays are
// only indexed by constants and the K loop is the only loop left.
//
// Prelude constants: BM, BN, BK, TM, TN, TM4 = TM/4, TN4 = TN/4, WM = BM/TM, WN = BN/TN,
// WG = WM*WN (invocations), RS = WG/BK (quads staged per slot), QA = BM/4 (quads of the A tile;
// invocations t < QA*BK stage them), LA = ceil(QA/RS), LB = BN/4/RS (quads each invocation stages
// per step), AP4, BP4 (padded shared row strides, in vec4s).

const_assert TM4 * 4u == TM && TN4 * 4u == TN && WM * TM == BM && WN * TN == BN && WG == WM * WN;
const_assert RS * BK == WG && LB * RS * 4u == BN && QA * 4u == BM && AP4 * 4u >= BM && BP4 * 4u >= BN;
const_assert ((LA == 1u && QA <= RS) || LA * RS == QA);

struct Params {
    n: u32,
    k: u32,
    groups: u32,
    max_rows: u32,
    a_rs: u32,
    b_group_stride: u32,
    c_rs: u32,
    gather: u32,
    tiles: u32,       // (the tensor-core kernel's tile table; unused here)
    tile_rows: u32,
    first_group: u32, // the experts' first in `offsets` (W holds experts first_group ..)
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<b_word>;
@group(0) @binding(3) var<storage, read> offsets: array<u32>;
@group(0) @binding(4) var<storage, read> gather_rows: array<u32>;
@group(0) @binding(5) var<storage, read_write> c: array<f32>;

// a_tile[kk * AP4 + i / 4][i % 4] = A(row(first + m0 + i), k0 + kk)
var<workgroup> a_tile: array<vec4<f32>, BK * AP4>;
// b_tile[kk * BP4 + j / 4][j % 4] = W[g](n0 + j, k0 + kk)
var<workgroup> b_tile: array<vec4<f32>, BK * BP4>;

// The A quads of step k0 (zero past the group's rows or past K): slot l is rows 4 * (u0 + l * RS)
// + q at k index k0 + kk, read at a_off[l * 4 + q] + k0 (only for invocations that stage A).
fn fetch_a(k0: u32, kk: u32, u0: u32, rows: u32, a_off: ptr<function, array<u32, LA * 4u>>) -> array<vec4<f32>, LA> {
    var r: array<vec4<f32>, LA>;
    if (k0 + kk < p.k) {
        // @unroll
        for (var l = 0u; l < LA; l++) {
            // @unroll
            for (var q = 0u; q < 4u; q++) {
                if (4u * (u0 + l * RS) + q < rows) {
                    r[l][q] = a[(*a_off)[l * 4u + q] + k0];
                }
            }
        }
    }
    return r;
}

// The B quads of step k0 (zero past N or K): slot l is columns 4 * (u0 + l * RS) + q at k index
// k0 + kk, read at b_first + (4 * l * RS + q) * K + k0.
fn fetch_b(k0: u32, kk: u32, u0: u32, cols: u32, b_first: u32) -> array<vec4<f32>, LB> {
    var r: array<vec4<f32>, LB>;
    if (k0 + kk < p.k) {
        // @unroll
        for (var l = 0u; l < LB; l++) {
            // @unroll
            for (var q = 0u; q < 4u; q++) {
                if (4u * (u0 + l * RS) + q < cols) {
                    r[l][q] = load_b(b_first + (4u * l * RS + q) * p.k + k0);
                }
            }
        }
    }
    return r;
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) t: u32) {
    let tiles_m = (p.max_rows + BM - 1u) / BM;
    let tiles_n = (p.n + BN - 1u) / BN;
    let id = wid.x + nwg.x * (wid.y + nwg.y * wid.z);
    if (id >= tiles_m * tiles_n * p.groups) {
        return;   // padding of a folded grid
    }
    let m0 = (id % tiles_m) * BM;
    let n0 = ((id / tiles_m) % tiles_n) * BN;
    let g = id / (tiles_m * tiles_n);
    // Read-only storage indexed by a uniform value: uniform, so the early exit keeps the barriers
    // below in uniform control flow.
    let first = offsets[p.first_group + g];
    let count = offsets[p.first_group + g + 1u] - first;
    if (m0 >= count) {
        return;   // this group has fewer slots than the m tile's start (an empty expert included)
    }
    let rows = min(BM, count - m0);
    let cols = min(BN, p.n - n0);

    // Staging: k index kk of quad u0 + l * RS. Invocations t >= QA * BK stage no A (when the A
    // tile has fewer quads than RS).
    let kk = t % BK;
    let u0 = t / BK;
    let stages_a = u0 < QA;
    var a_off: array<u32, LA * 4u>;
    // @unroll
    for (var l = 0u; l < LA; l++) {
        // @unroll
        for (var q = 0u; q < 4u; q++) {
            let i = 4u * (u0 + l * RS) + q;
            if (i < rows) {
                let s = first + m0 + i;
                var row = s;
                if (p.gather != 0u) {
                    row = gather_rows[s];
                }
                a_off[l * 4u + q] = row * p.a_rs + kk;
            }
        }
    }
    let b_first = g * p.b_group_stride + (n0 + 4u * u0) * p.k + kk;

    let tx = t % WN;
    let ty = t / WN;
    let busy = ty * TM < rows;
    var acc: array<vec4<f32>, TM * TN4>;   // acc[r * TN4 + c][q]: row ty*TM + r, column c*4*WN + 4*tx + q
    var ra: array<vec4<f32>, LA>;
    if (stages_a) {
        ra = fetch_a(0u, kk, u0, rows, &a_off);
    }
    var rb = fetch_b(0u, kk, u0, cols, b_first);
    for (var k0 = 0u; k0 < p.k; k0 += BK) {
        if (stages_a) {
            // @unroll
            for (var l = 0u; l < LA; l++) {
                a_tile[kk * AP4 + u0 + l * RS] = ra[l];
            }
        }
        // @unroll
        for (var l = 0u; l < LB; l++) {
            b_tile[kk * BP4 + u0 + l * RS] = rb[l];
        }
        workgroupBarrier();
        if (k0 + BK < p.k) {
            if (stages_a) {
                ra = fetch_a(k0 + BK, kk, u0, rows, &a_off);
            }
            rb = fetch_b(k0 + BK, kk, u0, cols, b_first);
        }
        if (busy) {
            // @unroll
            for (var x = 0u; x < BK; x++) {
                var av: array<vec4<f32>, TM4>;
                var bv: array<vec4<f32>, TN4>;
                // @unroll
                for (var r = 0u; r < TM4; r++) {
                    av[r] = a_tile[x * AP4 + ty * TM4 + r];
                }
                // @unroll
                for (var cc = 0u; cc < TN4; cc++) {
                    bv[cc] = b_tile[x * BP4 + cc * WN + tx];
                }
                // @unroll
                for (var r = 0u; r < TM4; r++) {
                    // @unroll
                    for (var q = 0u; q < 4u; q++) {
                        // @unroll
                        for (var cc = 0u; cc < TN4; cc++) {
                            acc[(r * 4u + q) * TN4 + cc] += av[r][q] * bv[cc];
                        }
                    }
                }
            }
        }
        workgroupBarrier();
    }

    if (!busy) {
        return;
    }
    let c_base = (first + m0) * p.c_rs + n0;
    // @unroll
    for (var r = 0u; r < TM; r++) {
        let i = ty * TM + r;
        if (i < rows) {
            // @unroll
            for (var cc = 0u; cc < TN4; cc++) {
                let j = cc * 4u * WN + 4u * tx;
                let v = acc[r * TN4 + cc];
                let at = c_base + i * p.c_rs + j;
                // @unroll
                for (var q = 0u; q < 4u; q++) {
                    if (j + q < cols) {
                        c[at + q] = v[q];
                    }
                }
            }
        }
    }
}

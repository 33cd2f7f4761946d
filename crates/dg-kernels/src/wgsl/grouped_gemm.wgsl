// Grouped GEMM of the MoE experts (after gemm_tile.wgsl). Tokens are grouped by expert into slots;
// the slots of expert e are offsets[e] .. offsets[e + 1]. For every slot s of expert e:
//   C[s, j] = sum_p A[row(s), p] * W[e, j, p]      (W: [groups, N, K], PyTorch [out, in] per expert)
// with row(s) = gather_rows[s] when `gather` != 0, else s;  A[r, p] = a[r * a_rs + p],
// W[e, j, p] = b[e * b_group_stride + j * K + p],  C[s, j] = c[s * c_rs + j].
// The grid covers max_rows (an upper bound on any group's slot count, known without a readback):
// a workgroup whose m tile starts past its group's count leaves at once. Linear workgroup index
// decoded m tile fastest, then n tile, then group (see grouped_gemm.rs `workgroups`).

struct Params {
    n: u32,
    k: u32,
    groups: u32,
    max_rows: u32,
    a_rs: u32,
    b_group_stride: u32,
    c_rs: u32,
    gather: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read> offsets: array<u32>;
@group(0) @binding(4) var<storage, read> gather_rows: array<u32>;
@group(0) @binding(5) var<storage, read_write> c: array<f32>;

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
    // in gemm_tile in uniform control flow.
    let first = offsets[g];
    let count = offsets[g + 1u] - first;
    if (m0 >= count) {
        return;   // this group has fewer slots than the m tile's start (an empty expert included)
    }

    var job: Job;
    job.k = p.k;
    job.rows = min(BM, count - m0);
    job.cols = min(BN, p.n - n0);
    job.a_cs = 1u;
    job.b_rs = 1u;
    job.a_k_fast = true;           // activations are row-major
    job.b_n_fast = p.k == 1u;      // W[e] is [N, K]: K is the unit-stride dimension

    // Offsets of A(row(s), 0) and W[g](n0 + j, 0) for the rows and columns this invocation stages.
    var a_off: array<u32, LA>;
    // @unroll
    for (var l = 0u; l < LA; l++) {
        let i = a_slot(t, l, true).x;
        if (i < job.rows) {
            let s = first + m0 + i;
            var row = s;
            if (p.gather != 0u) {
                row = gather_rows[s];
            }
            a_off[l] = row * p.a_rs;
        }
    }
    let b_base = g * p.b_group_stride + n0 * p.k;
    var b_off: array<u32, LB>;
    // @unroll
    for (var l = 0u; l < LB; l++) {
        b_off[l] = b_base + b_slot(t, l, job.b_n_fast).y * p.k;
    }

    var acc = gemm_tile(t, job, &a_off, &b_off);

    let tx = t % WN;
    let ty = t / WN;
    let c_base = (first + m0) * p.c_rs + n0;
    // @unroll
    for (var r = 0u; r < TM; r++) {
        // @unroll
        for (var cc = 0u; cc < TN; cc++) {
            let i = ty + r * WM;
            let j = tx + cc * WN;
            if (i < job.rows && j < job.cols) {
                c[c_base + i * p.c_rs + j] = acc[r * TN + cc];
            }
        }
    }
}

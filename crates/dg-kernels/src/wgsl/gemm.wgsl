// Batched, strided f32 GEMM (after gemm_tile.wgsl), for every batch b < batch:
//   C(b, i, j) = (accumulate ? C(b, i, j) : 0) + alpha * sum_p A(b, i, p) * B(b / b_batch_div, p, j)
// then the epilogue (1: softcap, cap * tanh(x / cap)), where
//   A(b, i, p) = a[a_offset + b*a_batch + i*a_rs + p*a_cs]
//   B(g, p, j) = b[b_offset + g*b_batch + p*b_rs + j*b_cs]
//   C(b, i, j) = c[c_offset + b*c_batch + i*c_rs + j]
// Workgroups form one linear index (x + y*nx + z*nx*ny, see gemm.rs `workgroups`) decoded m tile
// fastest, then n tile, then batch: workgroups that share a B tile run together, so a weight
// matrix streams from memory about once even when several m tiles read it. With NS > 1 slices,
// each slice sums its own contiguous part of K and slice 0 adds the others' in slice order, then
// applies the epilogue alone.

//@PARAMS

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<b_word>;
@group(0) @binding(3) var<storage, read_write> c: array<f32>;

@compute @workgroup_size(WT)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lt: u32) {
    // Without a split, slice 0 as a constant (the tile offsets fold away).
    let slice = select(lt / WG, 0u, NS == 1u);
    let t = lt - slice * WG;
    let tiles_m = (p.m + BM - 1u) / BM;
    let tiles_n = (p.n + BN - 1u) / BN;
    let id = wid.x + nwg.x * (wid.y + nwg.y * wid.z);
    if (id >= tiles_m * tiles_n * p.batch) {
        return;   // padding of a folded grid (uniform: the whole workgroup leaves)
    }
    let m0 = (id % tiles_m) * BM;
    let n0 = ((id / tiles_m) % tiles_n) * BN;
    let bi = id / (tiles_m * tiles_n);

    var job = slice_job(p.k, slice);
    job.rows = min(BM, p.m - m0);
    job.cols = min(BN, p.n - n0);
    job.a_cs = p.a_cs;
    job.b_rs = p.b_rs;
    job.a_k_fast = p.a_cs == 1u;
    job.b_n_fast = p.b_cs == 1u;

    // Offsets of A(m0 + i, 0) and B(0, n0 + j) for the rows and columns this invocation stages.
    let a_base = p.a_offset + bi * p.a_batch + m0 * p.a_rs;
    var a_off: array<u32, LA>;
    // @unroll
    for (var l = 0u; l < LA; l++) {
        a_off[l] = a_base + a_slot(t, l, job.a_k_fast).x * p.a_rs;
    }
    let b_base = p.b_offset + (bi / max(p.b_batch_div, 1u)) * p.b_batch + n0 * p.b_cs;
    var b_off: array<u32, LB>;
    // @unroll
    for (var l = 0u; l < LB; l++) {
        b_off[l] = b_base + b_slot(t, l, job.b_n_fast).y * p.b_cs;
    }

    var acc = gemm_tile(t, job, &a_off, &b_off);
    reduce_slices(t, slice, &acc);
    if (slice != 0u) {
        return;   // slice 0 holds the sum
    }

    // Epilogue: scale, accumulate, softcap, store (neighbouring invocations: neighbouring columns).
    let tx = t % WN;
    let ty = t / WN;
    let c_base = p.c_offset + bi * p.c_batch + m0 * p.c_rs + n0;
    // @unroll
    for (var r = 0u; r < TM; r++) {
        // @unroll
        for (var cc = 0u; cc < TN; cc++) {
            let i = ty + r * WM;
            let j = tx + cc * WN;
            if (i < job.rows && j < job.cols) {
                let at = c_base + i * p.c_rs + j;
                var v = p.alpha * acc[r * TN + cc];
                if (p.accumulate != 0u) {
                    v += c[at];
                }
                if (p.epilogue == 1u) {
                    // tanh(±10) is already ±1 in f32; the clamp keeps exp-based tanh lowerings finite.
                    v = p.cap * tanh(clamp(v / p.cap, -10.0, 10.0));
                }
                c[at] = v;
            }
        }
    }
}

// Split-K reduction (see split_k.rs): C[b][i, j] = epilogue(alpha * sum over z of
// part[z * split_stride + (b * m + i) * n + j] (+ C)), the splits added in order.
// One invocation per element of C; workgroups beyond 65535 wrap into y.

struct Params {
    m: u32,
    n: u32,
    batch: u32,
    splits: u32,
    split_stride: u32,
    c_offset: u32,
    c_rs: u32,
    c_batch: u32,
    alpha: f32,
    accumulate: u32,
    epilogue: u32,
    cap: f32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> part: array<f32>;
@group(0) @binding(2) var<storage, read_write> c: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = (wid.x + wid.y * nwg.x) * WG + lid.x;
    if (e >= max(p.batch, 1u) * p.m * p.n) {
        return;
    }
    let j = e % p.n;
    let row = e / p.n;
    let i = row % p.m;
    let b = row / p.m;
    var sum = 0.0;
    for (var z = 0u; z < p.splits; z++) {
        sum += part[z * p.split_stride + e];
    }
    let dst = p.c_offset + b * p.c_batch + i * p.c_rs + j;
    var v = p.alpha * sum;
    if (p.accumulate != 0u) {
        v += c[dst];
    }
    if (p.epilogue == 1u) {
        // As the GEMMs' epilogue: tanh(±10) is already ±1 in f32.
        v = p.cap * tanh(clamp(v / p.cap, -10.0, 10.0));
    }
    c[dst] = v;
}

// out = out * beta + x * alpha, element-wise over n elements; beta == 0 does not read out.
// One invocation per element; workgroups beyond 65535 wrap into y. The variants (axpby.rs) bind
// scale (x[i] * scale[i / row]) and gate (rows whose gate is 0 are not written) at //@BINDINGS.

struct Params {
    n: u32,
    alpha: f32,
    beta: f32,
    row: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
//@BINDINGS

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = (wid.x + wid.y * nwg.x) * WG + lid.x;
    if (i >= p.n) {
        return;
    }
    var y = x[i] * p.alpha;
    if (p.beta != 0.0) {
        y = out[i] * p.beta + y;
    }
    out[i] = y;
}

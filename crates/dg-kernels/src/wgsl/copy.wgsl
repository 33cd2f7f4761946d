// dst[dst_offset + i] = src[src_offset + i] for i < n (element offsets).
// One invocation per element; workgroups beyond 65535 wrap into y.

struct Params {
    n: u32,
    src_offset: u32,
    dst_offset: u32,
    _pad0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read_write> dst: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = (wid.x + wid.y * nwg.x) * WG + lid.x;
    if (i >= p.n) {
        return;
    }
    dst[p.dst_offset + i] = src[p.src_offset + i];
}

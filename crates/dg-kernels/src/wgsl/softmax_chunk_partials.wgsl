// Chunked row softmax, pass 1 of 2 (see softmax_chunked.rs): x: [rows, cols] read-only. Workgroup
// id = row * chunks + c covers columns [c * chunk, min((c + 1) * chunk, cols)) of its row: each
// invocation keeps a running (max, sum of exp(x - max)) over its strided columns, the pairs are
// merged across the workgroup (row_max_sum, as softmax.wgsl merges a whole row), and invocation 0 stores the chunk's pair
// in part[id]. Workgroups past rows * chunks (padding of a folded grid) leave at once.

//@COMMON
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> part: array<vec2<f32>>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>, lanes: RowLanes) {
    let id = wid.x + wid.y * nwg.x;
    if (id >= p.rows * p.chunks) {
        return;
    }
    let row = id / p.chunks;
    let first = (id % p.chunks) * p.chunk;
    let end = min(first + p.chunk, p.cols);
    let base = row * p.cols;
    var ms = vec2<f32>(LOWEST, 0.0);
    for (var j = first + lid.x; j < end; j += WG) {
        ms = online(ms, x[base + j]);
    }
    let total = row_max_sum(ms.x, ms.y, lanes);
    if (lid.x == 0u) {
        part[id] = total;
    }
}

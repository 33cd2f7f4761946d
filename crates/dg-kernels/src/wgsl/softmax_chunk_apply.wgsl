// Chunked row softmax, pass 2 of 2 (see softmax_chunked.rs): x: [rows, cols] in place. Workgroup
// id = row * chunks + c merges its row's `chunks` pairs from pass 1 (invocation i the pairs i,
// i + WG, ... in order, then row_max_sum) and writes x = exp(x - max) * (1 / sum) over the columns
// of chunk c. Workgroups past rows * chunks (padding of a folded grid) leave at once.

//@COMMON
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read> part: array<vec2<f32>>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>, lanes: RowLanes) {
    let id = wid.x + wid.y * nwg.x;
    if (id >= p.rows * p.chunks) {
        return;
    }
    let row = id / p.chunks;
    var acc = vec2<f32>(LOWEST, 0.0);
    for (var i = lid.x; i < p.chunks; i += WG) {
        let q = part[row * p.chunks + i];
        acc = merge(acc.x, acc.y, q.x, q.y);
    }
    let total = row_max_sum(acc.x, acc.y, lanes);
    let inv = 1.0 / total.y;
    let first = (id % p.chunks) * p.chunk;
    let end = min(first + p.chunk, p.cols);
    let base = row * p.cols;
    for (var j = first + lid.x; j < end; j += WG) {
        x[base + j] = exp(x[base + j] - total.x) * inv;
    }
}

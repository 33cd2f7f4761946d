// RMSNorm over the rows of x (DiffusionGemmaRMSNorm): y = x * (mean(x^2) + eps)^-1/2 [* w],
// optionally added to the previous contents of out, then multiplied by `scale`:
//   out = ((accumulate ? out : 0) + rms(x) [* w]) * scale
// One workgroup per row; rows beyond 65535 workgroups wrap into the y dimension.
// Also serves the per-head q/k/v norms (rows = tokens * heads, dim = head_dim). Rows start
// x_offset elements into x and out_offset into out. Columns go LANES at a time: V is f32 or
// vec4<f32> (dim and the offsets multiples of 4; sq() sums a vec4's squares in a fixed order).

struct Params {
    rows: u32,
    dim: u32,
    eps: f32,
    flags: u32,   // bit 0: multiply by w; bit 1: accumulate into out
    scale: f32,
    // x may be a split-K GEMM's partials (split_k.rs `with_reader`).
    splits: u32,
    split_stride: u32,
    // Elements before row 0 of x (and of each partial) and of out.
    x_offset: u32,
    out_offset: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<V>;
@group(0) @binding(2) var<storage, read> w: array<V>;
@group(0) @binding(3) var<storage, read_write> out: array<V>;

//@SPLIT_READER

//@ROW_REDUCE

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>, lanes: RowLanes) {
    let row = wid.x + wid.y * nwg.x;
    let cols = p.dim / LANES;
    let base = p.x_offset / LANES + row * cols;
    let out_base = p.out_offset / LANES + row * cols;
    let live = row < p.rows;
    var acc = 0.0;
    if (live) {
        for (var i = lid.x; i < cols; i += WG) {
            let v = x_at(base + i);
            acc += sq(v);
        }
    }
    let total = row_sum(acc, lanes);
    if (!live) {
        return;
    }
    let inv = 1.0 / sqrt(total / f32(p.dim) + p.eps);
    for (var i = lid.x; i < cols; i += WG) {
        var y = x_at(base + i) * inv;
        if ((p.flags & 1u) != 0u) {
            y = y * w[i];
        }
        if ((p.flags & 2u) != 0u) {
            y = out[out_base + i] + y;
        }
        out[out_base + i] = y * p.scale;
    }
}

// Per-head RMSNorm then RoPE (rotate-half), fused: for each row (token, head) of x: [tokens,
// heads, d], d = 2 * half,
//   y = x * (mean(x^2) + eps)^-1/2 * w        (as rmsnorm.wgsl: weighted, scale 1)
//   out[i]        = y[i] * cos + (-y[i + half]) * sin
//   out[i + half] = y[i + half] * cos + y[i] * sin      (as rope.wgsl)
// with cos/sin = table[token, i]. One workgroup per row; rows beyond 65535 workgroups wrap into y.
// The sum of squares reduces with row_sum (row_reduce.rs), as rmsnorm.wgsl's does.

struct Params {
    tokens: u32,
    heads: u32,
    dim: u32,
    eps: f32,
    // x may be a split-K GEMM's partials (split_k.rs `with_reader`).
    splits: u32,
    split_stride: u32,
    // Elements before row 0 of out.
    out_offset: u32,
    _pad0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read> cos_t: array<f32>;
@group(0) @binding(4) var<storage, read> sin_t: array<f32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;

//@SPLIT_READER

//@ROW_REDUCE

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>, lanes: RowLanes) {
    let row = wid.x + wid.y * nwg.x;
    let base = row * p.dim;
    let live = row < p.tokens * p.heads;
    var acc = 0.0;
    if (live) {
        for (var i = lid.x; i < p.dim; i += WG) {
            let v = x_at(base + i);
            acc += v * v;
        }
    }
    let total = row_sum(acc, lanes);
    if (!live) {
        return;
    }
    let inv = 1.0 / sqrt(total / f32(p.dim) + p.eps);
    let half = p.dim / 2u;
    let table = (row / p.heads) * half;
    for (var j = lid.x; j < half; j += WG) {
        let y1 = (x_at(base + j) * inv) * w[j];
        let y2 = (x_at(base + j + half) * inv) * w[j + half];
        let c = cos_t[table + j];
        let s = sin_t[table + j];
        out[p.out_offset + base + j] = y1 * c + (-y2) * s;
        out[p.out_offset + base + j + half] = y2 * c + y1 * s;
    }
}

// Rotary position embedding (rotate-half) in place on x: [tokens, heads, d], d = 2 * half.
// For each head vector, pair i of [0, half): (x1, x2) = (x[i], x[i + half]),
//   x[i]        = x1 * cos + (-x2) * sin
//   x[i + half] = x2 * cos + x1 * sin
// with cos/sin = table[token, i]. One invocation per pair; workgroups beyond 65535 wrap into y.

struct Params {
    tokens: u32,
    heads: u32,
    half: u32,
    _pad0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read> cos_t: array<f32>;
@group(0) @binding(3) var<storage, read> sin_t: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = (wid.x + wid.y * nwg.x) * WG + lid.x;
    let pairs = p.tokens * p.heads * p.half;
    if (i >= pairs) {
        return;
    }
    let row = i / p.half;
    let j = i - row * p.half;
    let token = row / p.heads;
    let c = cos_t[token * p.half + j];
    let s = sin_t[token * p.half + j];
    let lo = row * 2u * p.half + j;
    let hi = lo + p.half;
    let x1 = x[lo];
    let x2 = x[hi];
    x[lo] = x1 * c + (-x2) * s;
    x[hi] = x2 * c + x1 * s;
}

// The residual add after attention and the three norms of the updated stream, fused: for each row
// of x, hidden, out_a: [rows, dim] and out_bc: [2, rows, dim],
//   hidden          = hidden + rms(x) * w_res          (as rmsnorm.wgsl: weighted, accumulate)
//   out_a           = (rms(hidden) * w_a) * scale_a     (as rmsnorm.wgsl: weighted, scale_a)
//   out_bc[0][row]  = (rms(hidden) * w_b) * scale_b
//   out_bc[1][row]  = (rms(hidden) * w_c) * scale_c
// with rms(v) = v * (mean(v^2) + eps)^-1/2 over the row, the last three over the UPDATED hidden.
// (Two outputs share a binding: eight storage buffers is WebGPU's default limit.) One workgroup
// per row; rows beyond 65535 workgroups wrap into y. Columns go LANES at a time (V: f32 or
// vec4<f32>, as in rmsnorm.wgsl). The half variant (residual_norms.rs, source_attention_half;
// LANES 4 only) stores out_bc[0] as f16 (the experts' input, which the tensor cores round to f16
// anyway): row r's halves from half r * dim of out_bc on, packed by pack2x16float; out_bc[1]
// stays f32 where it was (from word rows * dim on).

struct Params {
    rows: u32,
    dim: u32,
    eps: f32,
    scale_a: f32,
    scale_b: f32,
    scale_c: f32,
    // x may be a split-K GEMM's partials (split_k.rs `with_reader`).
    splits: u32,
    split_stride: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<V>;
@group(0) @binding(2) var<storage, read> w_res: array<V>;
@group(0) @binding(3) var<storage, read> w_a: array<V>;
@group(0) @binding(4) var<storage, read> w_b: array<V>;
@group(0) @binding(5) var<storage, read> w_c: array<V>;
@group(0) @binding(6) var<storage, read_write> hidden: array<V>;
@group(0) @binding(7) var<storage, read_write> out_a: array<V>;
@group(0) @binding(8) var<storage, read_write> out_bc: array<BC_ELEM>;

//@STORE_BC

//@SPLIT_READER

//@ROW_REDUCE

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>, lanes: RowLanes) {
    let row = wid.x + wid.y * nwg.x;
    let cols = p.dim / LANES;
    let base = row * cols;
    let live = row < p.rows;

    var acc_x = 0.0;
    if (live) {
        for (var i = lid.x; i < cols; i += WG) {
            let v = x_at(base + i);
            acc_x += sq(v);
        }
    }
    let inv_x = 1.0 / sqrt(row_sum(acc_x, lanes) / f32(p.dim) + p.eps);

    // The residual add. Each invocation updates elements lid.x, lid.x + WG, ... and sums the
    // squares of exactly those, the elements rmsnorm.wgsl would have it sum, so no other
    // invocation's write has to be visible before the second reduction.
    var acc_h = 0.0;
    if (live) {
        for (var i = lid.x; i < cols; i += WG) {
            let h = hidden[base + i] + (x_at(base + i) * inv_x) * w_res[i];
            hidden[base + i] = h;
            acc_h += sq(h);
        }
    }
    let inv_h = 1.0 / sqrt(row_sum(acc_h, lanes) / f32(p.dim) + p.eps);
    if (!live) {
        return;
    }
    for (var i = lid.x; i < cols; i += WG) {
        // This invocation's own write above.
        let n = hidden[base + i] * inv_h;
        out_a[base + i] = (n * w_a[i]) * p.scale_a;
        store_bc(base + i, (n * w_b[i]) * p.scale_b, (n * w_c[i]) * p.scale_c);
    }
}

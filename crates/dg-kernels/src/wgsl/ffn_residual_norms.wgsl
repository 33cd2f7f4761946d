// The norms and residual add after the feed-forward blocks, fused: for each row of mlp, moe,
// dense, hidden: [rows, dim],
//   dense  = rms(mlp) * w_1                          (as rmsnorm.wgsl: weighted)
//   dense  = dense + rms(moe) * w_2                  (as rmsnorm.wgsl: weighted, accumulate)
//   hidden = (hidden + rms(dense) * w_3) * scalar    (as rmsnorm.wgsl: weighted, accumulate, scale)
// with rms(v) = v * (mean(v^2) + eps)^-1/2 over the row, the last over the summed dense. dense's
// previous contents are never read. One workgroup per row; rows beyond 65535 workgroups wrap
// into y.

struct Params {
    rows: u32,
    dim: u32,
    eps: f32,
    scalar: f32,
    // mlp may be a split-K GEMM's partials (split_k.rs `with_reader`).
    splits: u32,
    split_stride: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> mlp: array<f32>;
@group(0) @binding(2) var<storage, read> w_1: array<f32>;
@group(0) @binding(3) var<storage, read> moe: array<f32>;
@group(0) @binding(4) var<storage, read> w_2: array<f32>;
@group(0) @binding(5) var<storage, read> w_3: array<f32>;
@group(0) @binding(6) var<storage, read_write> dense: array<f32>;
@group(0) @binding(7) var<storage, read_write> hidden: array<f32>;

//@SPLIT_READER

// Two sums side by side (RowSum = vec2<f32>), so that the mlp and moe rows reduce in one pass.
//@ROW_REDUCE

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>, lanes: RowLanes) {
    let row = wid.x + wid.y * nwg.x;
    let base = row * p.dim;
    let live = row < p.rows;

    var acc_mlp = 0.0;
    var acc_moe = 0.0;
    if (live) {
        for (var i = lid.x; i < p.dim; i += WG) {
            let m = mlp_at(base + i);
            acc_mlp += m * m;
            let e = moe[base + i];
            acc_moe += e * e;
        }
    }
    let sums = row_sum(vec2<f32>(acc_mlp, acc_moe), lanes);
    let inv_mlp = 1.0 / sqrt(sums.x / f32(p.dim) + p.eps);
    let inv_moe = 1.0 / sqrt(sums.y / f32(p.dim) + p.eps);

    // The two branch norms, summed. Each invocation writes elements lid.x, lid.x + WG, ... and
    // sums the squares of exactly those, the elements rmsnorm.wgsl would have it sum, so no other
    // invocation's write has to be visible before the second reduction.
    var acc_dense = 0.0;
    if (live) {
        for (var i = lid.x; i < p.dim; i += WG) {
            let d = (mlp_at(base + i) * inv_mlp) * w_1[i] + (moe[base + i] * inv_moe) * w_2[i];
            dense[base + i] = d;
            acc_dense += d * d;
        }
    }
    let inv_dense = 1.0 / sqrt(row_sum(vec2<f32>(acc_dense, 0.0), lanes).x / f32(p.dim) + p.eps);
    if (!live) {
        return;
    }
    for (var i = lid.x; i < p.dim; i += WG) {
        // This invocation's own write above.
        hidden[base + i] = (hidden[base + i] + (dense[base + i] * inv_dense) * w_3[i]) * p.scalar;
    }
}

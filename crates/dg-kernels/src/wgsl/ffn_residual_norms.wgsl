// The norms and residual add after the feed-forward blocks, fused: for each row of mlp, moe,
// hidden, normed: [rows, dim],
//   dense  = rms(mlp) * w_1                          (as rmsnorm.wgsl: weighted)
//   dense  = dense + rms(moe) * w_2                  (as rmsnorm.wgsl: weighted, accumulate)
//   hidden = (hidden + rms(dense) * w_3) * scalar    (as rmsnorm.wgsl: weighted, accumulate, scale)
// and, when p.next_norm != 0, the norm the next op applies to the new stream (the next layer's
// input_layernorm, or the final norm ahead of the head):
//   normed = rms(hidden) * w_next                    (as rmsnorm.wgsl: weighted)
// with rms(v) = v * (mean(v^2) + eps)^-1/2 over the row. dense lives in no buffer: each
// invocation computes its elements lid.x, lid.x + WG, ... once to sum their squares and again,
// by the same expression, to add them to hidden. One workgroup per row; rows beyond 65535
// workgroups wrap into y. Columns go LANES at a time (V: f32 or vec4<f32>, as in rmsnorm.wgsl).
// The combine variant (residual_norms.rs, source_ffn_combine) also computes moe itself, as
// moe_combine.wgsl does, from the experts' outputs by slot (bindings 9 to 12): the first pass
// writes each element to moe as it sums its square, and the later passes read back the elements
// the same invocation wrote.
// The scaled variants (residual_norms.rs) multiply each row of mlp by mlp_scale[row], and the
// combine variant each expert output by slot_scale[slot] (folded into its weight, moe_rank.wgsl):
// the inverses of the factors their inputs were scaled by before the tensor cores rounded them.

struct Params {
    rows: u32,
    dim: u32,
    eps: f32,
    scalar: f32,
    // mlp may be a split-K GEMM's partials (split_k.rs `with_reader`).
    splits: u32,
    split_stride: u32,
    // 1: also write normed = rms(hidden) * w_next.
    next_norm: u32,
    // The combine variant: K entries a row in idx, weights and slot_of.
    top_k: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> mlp: array<V>;
@group(0) @binding(2) var<storage, read> w_1: array<V>;
@group(0) @binding(3) var<storage, MOE_ACCESS> moe: array<V>;
@group(0) @binding(4) var<storage, read> w_2: array<V>;
@group(0) @binding(5) var<storage, read> w_3: array<V>;
@group(0) @binding(6) var<storage, read_write> hidden: array<V>;
@group(0) @binding(7) var<storage, read> w_next: array<V>;
@group(0) @binding(8) var<storage, read_write> normed: array<V>;

//@SPLIT_READER

//@MOE_SOURCE

// mlp's element i of the row: the product (or the sum of its partials), times the row's factor in
// the scaled variants (its input rows were scaled: gelu_glu.rs, fused_scaled).
//@MLP_IN

// Two sums side by side (RowSum = vec2<f32>), so that the mlp and moe rows reduce in one pass.
//@ROW_REDUCE

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>, lanes: RowLanes) {
    let row = wid.x + wid.y * nwg.x;
    let cols = p.dim / LANES;
    let base = row * cols;
    let live = row < p.rows;

    rank_entries(row, live, lid.x);
    var acc_mlp = 0.0;
    var acc_moe = 0.0;
    if (live) {
        for (var i = lid.x; i < cols; i += WG) {
            let m = mlp_in(row, base + i);
            acc_mlp += sq(m);
            let e = moe_first(base, i);
            acc_moe += sq(e);
        }
    }
    let sums = row_sum(vec2<f32>(acc_mlp, acc_moe), lanes);
    let inv_mlp = 1.0 / sqrt(sums.x / f32(p.dim) + p.eps);
    let inv_moe = 1.0 / sqrt(sums.y / f32(p.dim) + p.eps);

    // The two branch norms, summed: the elements rmsnorm.wgsl would have this invocation sum.
    var acc_dense = 0.0;
    if (live) {
        for (var i = lid.x; i < cols; i += WG) {
            let d = (mlp_in(row, base + i) * inv_mlp) * w_1[i] + (moe[base + i] * inv_moe) * w_2[i];
            acc_dense += sq(d);
        }
    }
    let inv_dense = 1.0 / sqrt(row_sum(vec2<f32>(acc_dense, 0.0), lanes).x / f32(p.dim) + p.eps);

    // The residual add: each invocation updates exactly the elements it sums for the next norm,
    // so no other invocation's write has to be visible before that reduction.
    var acc_h = 0.0;
    if (live) {
        for (var i = lid.x; i < cols; i += WG) {
            let d = (mlp_in(row, base + i) * inv_mlp) * w_1[i] + (moe[base + i] * inv_moe) * w_2[i];
            let h = (hidden[base + i] + (d * inv_dense) * w_3[i]) * p.scalar;
            hidden[base + i] = h;
            acc_h += sq(h);
        }
    }
    if (p.next_norm == 0u) {
        return;
    }
    let inv_h = 1.0 / sqrt(row_sum(vec2<f32>(acc_h, 0.0), lanes).x / f32(p.dim) + p.eps);
    if (!live) {
        return;
    }
    for (var i = lid.x; i < cols; i += WG) {
        // This invocation's own write above.
        normed[base + i] = (hidden[base + i] * inv_h) * w_next[i];
    }
}

// The combine variant's source of moe (ffn_residual_norms.wgsl, //@MOE_SOURCE): per row t,
//   moe[t, :] = 0 + sum over its K entries in ascending expert order of weights[t, k] * y[slot_of[t, k], :]
// as moe_combine.wgsl computes it (the same ranking and adds: moe_rank.wgsl, which follows), one
// element at a time as the first pass reaches it.

@group(0) @binding(9) var<storage, read> y: array<V>;
@group(0) @binding(10) var<storage, read> idx: array<u32>;
@group(0) @binding(11) var<storage, read> weights: array<f32>;
@group(0) @binding(12) var<storage, read> slot_of: array<u32>;

// Element i of the row at base: summed from the entries and stored for the later passes.
fn moe_first(base: u32, i: u32) -> V {
    let acc = combined(i, p.dim / LANES);
    moe[base + i] = acc;
    return acc;
}

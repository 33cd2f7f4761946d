// MoE combine, per token t:
//   out[t, :] = 0 + sum over its K entries in ascending expert order of weights[t, k] * y[slot_of[t, k], :]
// (ties in expert id, which top-k never produces, in k order; entries with slot 0xffffffff are
// skipped). One workgroup per token, tokens beyond 65535 wrap into y. The entries are ranked in
// that order (moe_rank.wgsl, at //@RANK); then each invocation owns the output columns lid,
// lid + WG, ... and adds the (at most MAX_K, unrolled) entries in that order. Columns go LANES at
// a time: V is f32 (LANES 1) or vec4<f32> (LANES 4, H a multiple of 4), whose adds are per
// component, so both give the same bits.

struct Params {
    tokens: u32,
    k: u32,
    hidden: u32,
    _pad0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> y: array<V>;
@group(0) @binding(2) var<storage, read> idx: array<u32>;
@group(0) @binding(3) var<storage, read> weights: array<f32>;
@group(0) @binding(4) var<storage, read> slot_of: array<u32>;
@group(0) @binding(5) var<storage, read_write> out: array<V>;

//@RANK

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = wid.x + wid.y * nwg.x;
    let live = t < p.tokens;
    rank_entries(t, live, lid.x);
    if (!live) {
        return;
    }
    let width = p.hidden / LANES;
    let dst = t * width;
    for (var c = lid.x; c < width; c += WG) {
        out[dst + c] = combined(c, width);
    }
}

// The whole router (Gemma4TextRouter after its input norm; dg_cpu::moe::route): per token t,
//   logits[e] = sum over p of x[t, p] * W[e, p]           (f32 products of the f16 weights)
//   prob = softmax(logits) in f32: max, exp(l - max) summed, times 1/sum;
//   top K by prob, descending, ties to the lower expert index (repeated strict-max selection);
//   w_k = (prob_k / sum of the K chosen, summed in chosen order) * per_expert_scale[idx_k].
// x: [tokens, hidden] f32 rows from element x_offset; W: [experts, hidden] f16 in K panels of 32
// columns ([hidden / 32, experts, 32] halves, two a word; coop_grouped_gemm.rs pack_f16_panels).
//
// One workgroup per TOKENS tokens, in one dispatch: every workgroup streams all of W (the router's
// 720 KB at the real geometry) once for its tokens, so the projection costs no split partials and
// the top-k no dispatch of its own. Projection: invocation i takes expert i % 128 and half i / 128
// of each chunk's panels, TOKENS sums (sequential in p within a half; the two halves then added),
// the chunk's columns of x staged in workgroup memory. Top-k: group g of 32 invocations takes
// token g, lane j experts j, j + 32, j + 64, j + 96; the max, the sum and each of the K argmaxes
// (strictly greater wins, ties to the lower index; knocked-out entries -1, NaN and padding never
// picked) are trees over the 32 lanes in workgroup memory, uniform across the workgroup.
// Requires experts <= 128, k <= MAX_K, hidden a multiple of 32, x_offset a multiple of 4.

struct Params {
    tokens: u32,
    experts: u32,
    k: u32,
    hidden: u32,
    x_offset: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> per_expert_scale: array<f32>;
@group(0) @binding(4) var<storage, read_write> idx: array<u32>;
@group(0) @binding(5) var<storage, read_write> weights: array<f32>;

const WG: u32 = 256u;
const EXPERTS: u32 = 128u;
// Panels of 32 columns staged a chunk (each half of the workgroup takes half of them).
const CHUNK: u32 = 8u;
const CHUNK4: u32 = CHUNK * 8u;   // vec4s of x a token a chunk
const LOWEST: f32 = -0x1.fffffep+127f;
const NONE: f32 = -2.0;

var<workgroup> xs: array<vec4<f32>, TOKENS * CHUNK4>;
var<workgroup> lg: array<f32, TOKENS * EXPERTS>;
var<workgroup> red_v: array<f32, WG>;
var<workgroup> red_i: array<u32, WG>;

// Tree reductions over the 32 lanes of each group (every invocation calls them: uniform).
fn group_max(i: u32, v: f32) -> f32 {
    red_v[i] = v;
    workgroupBarrier();
    let lane = i % 32u;
    for (var s = 16u; s > 0u; s /= 2u) {
        if (lane < s) {
            red_v[i] = max(red_v[i], red_v[i + s]);
        }
        workgroupBarrier();
    }
    let r = red_v[i - lane];
    workgroupBarrier();
    return r;
}

fn group_sum(i: u32, v: f32) -> f32 {
    red_v[i] = v;
    workgroupBarrier();
    let lane = i % 32u;
    for (var s = 16u; s > 0u; s /= 2u) {
        if (lane < s) {
            red_v[i] = red_v[i] + red_v[i + s];
        }
        workgroupBarrier();
    }
    let r = red_v[i - lane];
    workgroupBarrier();
    return r;
}

// The larger value, ties to the lower index.
fn group_argmax(i: u32, v: f32, e: u32) -> vec2<u32> {
    red_v[i] = v;
    red_i[i] = e;
    workgroupBarrier();
    let lane = i % 32u;
    for (var s = 16u; s > 0u; s /= 2u) {
        if (lane < s) {
            let bv = red_v[i + s];
            let bi = red_i[i + s];
            if (bv > red_v[i] || (bv == red_v[i] && bi < red_i[i])) {
                red_v[i] = bv;
                red_i[i] = bi;
            }
        }
        workgroupBarrier();
    }
    let r = vec2<u32>(bitcast<u32>(red_v[i - lane]), red_i[i - lane]);
    workgroupBarrier();
    return r;
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) i: u32) {
    let t0 = (wid.x + wid.y * nwg.x) * TOKENS;
    if (t0 >= p.tokens) {
        return;   // padding of a folded grid (uniform: the whole workgroup leaves)
    }
    let e = i % EXPERTS;
    let half = i / EXPERTS;
    let live = e < p.experts;
    let panels = p.hidden / 32u;
    let row4 = p.hidden / 4u;

    // Projection.
    var acc: array<f32, TOKENS>;
    for (var c0 = 0u; c0 < panels; c0 += CHUNK) {
        for (var s = i; s < TOKENS * CHUNK4; s += WG) {
            let tt = s / CHUNK4;
            let col4 = c0 * 8u + s % CHUNK4;
            var v = vec4<f32>(0.0);
            if (t0 + tt < p.tokens && col4 < row4) {
                v = x[p.x_offset / 4u + (t0 + tt) * row4 + col4];
            }
            xs[s] = v;
        }
        workgroupBarrier();
        if (live) {
            for (var pp = 0u; pp < CHUNK / 2u; pp++) {
                let local = half * (CHUNK / 2u) + pp;
                let panel = c0 + local;
                if (panel < panels) {
                    let base = (panel * p.experts + e) * 4u;
                    for (var q = 0u; q < 4u; q++) {
                        let words = w[base + q];
                        let w0 = unpack2x16float(words.x);
                        let w1 = unpack2x16float(words.y);
                        let w2 = unpack2x16float(words.z);
                        let w3 = unpack2x16float(words.w);
                        let wa = vec4<f32>(w0.x, w0.y, w1.x, w1.y);
                        let wb = vec4<f32>(w2.x, w2.y, w3.x, w3.y);
                        for (var tt = 0u; tt < TOKENS; tt++) {
                            let xa = xs[tt * CHUNK4 + local * 8u + q * 2u];
                            let xb = xs[tt * CHUNK4 + local * 8u + q * 2u + 1u];
                            var a = acc[tt];
                            a = fma(wa.x, xa.x, a);
                            a = fma(wa.y, xa.y, a);
                            a = fma(wa.z, xa.z, a);
                            a = fma(wa.w, xa.w, a);
                            a = fma(wb.x, xb.x, a);
                            a = fma(wb.y, xb.y, a);
                            a = fma(wb.z, xb.z, a);
                            a = fma(wb.w, xb.w, a);
                            acc[tt] = a;
                        }
                    }
                }
            }
        }
        workgroupBarrier();
    }
    // The second half's sums, then the logits.
    if (half == 1u) {
        for (var tt = 0u; tt < TOKENS; tt++) {
            lg[tt * EXPERTS + e] = acc[tt];
        }
    }
    workgroupBarrier();
    if (half == 0u) {
        for (var tt = 0u; tt < TOKENS; tt++) {
            lg[tt * EXPERTS + e] = select(LOWEST, acc[tt] + lg[tt * EXPERTS + e], live);
        }
    }
    workgroupBarrier();

    // Top-k: group g takes token t0 + g (groups past TOKENS, or past the last token, compute
    // alongside and store nothing).
    let g = i / 32u;
    let lane = i % 32u;
    let tt = min(g, TOKENS - 1u);
    let t = t0 + g;
    let e_n = min(p.experts, EXPERTS);
    let k_n = min(p.k, min(MAX_K, e_n));
    var l: array<f32, 4>;
    var m = LOWEST;
    for (var s = 0u; s < 4u; s++) {
        l[s] = lg[tt * EXPERTS + lane + 32u * s];
        if (lane + 32u * s < e_n) {
            m = max(m, l[s]);
        }
    }
    m = group_max(i, m);
    var v: array<f32, 4>;
    var local_sum = 0.0;
    for (var s = 0u; s < 4u; s++) {
        v[s] = 0.0;
        if (lane + 32u * s < e_n) {
            v[s] = exp(l[s] - m);
        }
        local_sum += v[s];
    }
    let inv = 1.0 / group_sum(i, local_sum);
    var prob: array<f32, 4>;
    for (var s = 0u; s < 4u; s++) {
        prob[s] = NONE;
        if (lane + 32u * s < e_n) {
            prob[s] = v[s] * inv;
        }
    }
    var chosen: array<u32, MAX_K>;
    var value: array<f32, MAX_K>;
    for (var k = 0u; k < k_n; k++) {
        // This lane's best: strictly greater wins, so the lowest of its experts among equals.
        var bv = NONE;
        var bi = 0u;
        for (var s = 0u; s < 4u; s++) {
            let ok = prob[s] > NONE;
            if (ok && prob[s] > bv) {
                bv = prob[s];
                bi = lane + 32u * s;
            }
        }
        let best = group_argmax(i, bv, bi);
        chosen[k] = best.y;
        value[k] = bitcast<f32>(best.x);
        for (var s = 0u; s < 4u; s++) {
            if (lane + 32u * s == best.y) {
                prob[s] = -1.0;
            }
        }
    }
    if (lane == 0u && g < TOKENS && t < p.tokens) {
        var total = 0.0;
        for (var k = 0u; k < k_n; k++) {
            total += value[k];
        }
        let out = t * p.k;
        for (var k = 0u; k < k_n; k++) {
            idx[out + k] = chosen[k];
            weights[out + k] = (value[k] / total) * per_expert_scale[chosen[k]];
        }
    }
}

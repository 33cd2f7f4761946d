// What both passes of the chunked softmax share: their parameters, and the (max, sum of
// exp(x - max)) pairs with their merge (as softmax.wgsl's).

struct Params {
    rows: u32,
    cols: u32,
    chunk: u32,
    chunks: u32,
}

var<workgroup> pairs: array<vec2<f32>, WG>;

// The lowest finite f32 (WGSL has no infinity literal): the max of an empty set.
const LOWEST: f32 = -0x1.fffffep+127f;

// Merges two (max, sum) pairs; an empty side has max LOWEST and sum 0. The side holding the
// larger max keeps its sum unscaled (exp(0) = 1 exactly).
fn merge(m1: f32, s1: f32, m2: f32, s2: f32) -> vec2<f32> {
    if (m1 >= m2) {
        return vec2<f32>(m1, s1 + s2 * exp(m2 - m1));
    }
    return vec2<f32>(m2, s1 * exp(m1 - m2) + s2);
}

// The workgroup's merge of every invocation's pair (a tree). Called from uniform control flow;
// returns the result to every invocation.
fn merge_tree(v: vec2<f32>, lane: u32) -> vec2<f32> {
    pairs[lane] = v;
    workgroupBarrier();
    for (var k = WG / 2u; k > 0u; k = k >> 1u) {
        if (lane < k) {
            let a = pairs[lane];
            let b = pairs[lane + k];
            pairs[lane] = merge(a.x, a.y, b.x, b.y);
        }
        workgroupBarrier();
    }
    let r = pairs[0];
    workgroupBarrier();
    return r;
}

// The online softmax's (max, sum of exp(x - max)) pairs, shared by softmax.wgsl and the chunked
// softmax (softmax_chunked.rs); their workgroup merge is row_reduce.rs's row_max_sum.

// The lowest finite f32 (WGSL has no infinity literal): the max of an empty set. Inputs of -inf
// (pre-masked scores) contribute exp(-inf) = 0.
const LOWEST: f32 = -0x1.fffffep+127f;

// Merges two (max, sum) pairs; an empty side has max LOWEST and sum 0. The side holding the
// larger max keeps its sum unscaled (exp(0) = 1 exactly).
fn merge(m1: f32, s1: f32, m2: f32, s2: f32) -> vec2<f32> {
    if (m1 >= m2) {
        return vec2<f32>(m1, s1 + s2 * exp(m2 - m1));
    }
    return vec2<f32>(m2, s1 * exp(m1 - m2) + s2);
}

// One element into an invocation's running (max, sum of exp(x - max)).
fn online(ms: vec2<f32>, v: f32) -> vec2<f32> {
    if (v > ms.x) {
        return vec2<f32>(v, ms.y * exp(ms.x - v) + 1.0);
    }
    return vec2<f32>(ms.x, ms.y + exp(v - ms.x));
}

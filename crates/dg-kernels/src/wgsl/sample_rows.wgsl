// Per-row work of one denoising step (mirrors dg_sampler::rows: process_row, RowDistributions::sample).
// Row r of logits: [rows, V]. With y = logits / T (the correctly rounded f32 division), max = max(y),
// e = exp(y - max):
//   scaled[r, :] = y;
//   results[r] = (entropy bits, first argmax, sampled, first non-finite column + 1 or 0);
//   S = count(y == max) + sum over y < max of e,  N = -sum e * (y - max),  entropy = ln S + N / S;
//   mode 0: sampled = first v with sum_{k <= v} p_k > u and p_v > 0, p = e / S in f32, u = bitcast(draws[r]);
//           no such v (rounding): the last v with p_v > 0.  Other modes: sampled = draws[r].
// One workgroup per row; rows beyond 65535 workgroups wrap into the y dimension.
// Pass 1 (strided): y, scaled, first non-finite column, per-invocation (max, first index) merged by a tree.
// Pass 2 (strided, reading back what the same invocation wrote to scaled): count at max (u32), sum of the
// other e and N in f32 blocks of BLOCK terms, then a tree.
// Pass 3 (mode 0, contiguous chunks of ceil(V / WG)): chunk sums of p in the same blocked f32 arithmetic,
// a Hillis-Steele prefix scan of the chunk sums, then the first chunk whose inclusive sum exceeds u is
// rescanned entry by entry; its last partial sum equals the chunk sum bit for bit, so it holds the crossing.
// Pass 3 reads scaled entries written by other invocations: a storage barrier follows pass 1.

struct Params {
    rows: u32,
    vocab: u32,
    // Rows that share one Step (a canvas of a batched forward; 0: every row reads step 0).
    rows_per_step: u32,
    // The draws', results' and steps' row of logits row 0.
    first_row: u32,
}

struct Step {
    temperature: f32,
    mode: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read_write> scaled: array<f32>;
@group(0) @binding(3) var<storage, read> steps: array<Step>;
@group(0) @binding(4) var<storage, read> draws: array<u32>;
@group(0) @binding(5) var<storage, read_write> results: array<u32>;

var<workgroup> red_max: array<f32, WG>;
var<workgroup> red_idx: array<u32, WG>;
var<workgroup> red_cnt: array<u32, WG>;
var<workgroup> red_rest: array<f32, WG>;
var<workgroup> red_wsum: array<f32, WG>;
var<workgroup> scan: array<f32, WG>;
var<workgroup> row_sum: f32;
var<workgroup> first_bad: atomic<u32>;
var<workgroup> cross_chunk: atomic<u32>;
var<workgroup> last_chunk: atomic<u32>;

const MODE_UNIFORM: u32 = 0u;
const NONE: u32 = 0xffffffffu;
// The lowest finite f32 (WGSL has no infinity literal): the start of the running max.
const LOWEST: f32 = -0x1.fffffep+127f;
const NAN_BITS: u32 = 0x7fc00000u;

// exp_nonpos of dg_sampler::rows, constant for constant (hex literals: the f32 values of the CPU's
// decimal constants, so that no decimal-to-f32 rounding differs).
const LOG2E: f32 = 0x1.715476p+0f;     // f32 log2(e)
const LN2_HI: f32 = 0x1.63p-1f;        // 355/512: n * LN2_HI is exact for |n| <= 2^15
const LN2_LO: f32 = -0x1.bd0106p-13f;  // -2.1219444e-4
const EXP_LO: f32 = -0x1.5d58a0p+6f;   // -87.33655 ~ ln(f32 MIN_POSITIVE): below it exp is 0
const EXP_P0: f32 = 0x1.a0d2d0p-13f;   // 1.9875692e-4
const EXP_P1: f32 = 0x1.6e879cp-10f;   // 1.3981999e-3
const EXP_P2: f32 = 0x1.111210p-7f;    // 8.333452e-3
const EXP_P3: f32 = 0x1.555382p-5f;    // 4.1665796e-2
const EXP_P4: f32 = 0x1.555554p-3f;    // 1.6666665e-1

// (exp(d), max(d, EXP_LO)) for d <= 0: Cephes expf as in dg_sampler::rows::exp_nonpos (Cody-Waite
// reduction, degree-5 polynomial, 2^n built from its exponent bits; exactly 1 at 0, exactly 0 below
// EXP_LO). n = round(d * log2 e) with ties to even is what the CPU's add-and-subtract of 1.5 * 2^23
// computes; the builtin is used because a shader compiler may fold that add and subtract away.
fn exp_nonpos(d: f32) -> vec2<f32> {
    let dc = max(d, EXP_LO);
    let n = round(dc * LOG2E);
    let r = (dc - n * LN2_HI) - n * LN2_LO;
    var y = EXP_P0;
    y = y * r + EXP_P1;
    y = y * r + EXP_P2;
    y = y * r + EXP_P3;
    y = y * r + EXP_P4;
    y = y * r + 0.5;
    y = y * (r * r) + r + 1.0;
    let scale = bitcast<f32>(u32(i32(n) + 127) << 23u);
    return vec2<f32>(select(0.0, y * scale, d >= EXP_LO), dc);
}

// ln(1 + r) for r >= 0 with Cephes' logf polynomial (not the platform's log, which Vulkan only
// bounds to 2^-21 absolute near 1). While 1 + r < sqrt(2) the reduced argument is r itself, so the
// ln S of a peaked row (S - 1 ~ 1e-4) keeps r's relative precision; above, S = 1 + r is split into
// 2^e * m with m in [sqrt(1/2), sqrt(2)) by its bits and f = m - 1 is exact.
fn ln1p_nonneg(r: f32) -> f32 {
    var f = r;
    var e = 0.0;
    if (r >= 0x1.a82798p-2f) { // sqrt(2) - 1
        let bits = bitcast<u32>(1.0 + r);
        var m = bitcast<f32>((bits & 0x007fffffu) | 0x3f800000u); // [1, 2)
        var ei = i32((bits >> 23u) & 0xffu) - 127;
        if (m > 0x1.6a09e6p+0f) { // sqrt(2)
            m = m * 0.5;
            ei += 1;
        }
        f = m - 1.0;
        e = f32(ei);
    }
    let z = f * f;
    var y = 0x1.204376p-4f;           // 7.0376836292e-2
    y = y * f - 0x1.d7a370p-4f;       // 1.1514610310e-1
    y = y * f + 0x1.de4a34p-4f;       // 1.1676998740e-1
    y = y * f - 0x1.fcba9ep-4f;       // 1.2420140846e-1
    y = y * f + 0x1.23d37ep-3f;       // 1.4249322787e-1
    y = y * f - 0x1.555ca0p-3f;       // 1.6668057665e-1
    y = y * f + 0x1.999d58p-3f;       // 2.0000714765e-1
    y = y * f - 0x1.fffff8p-3f;       // 2.4999993993e-1
    y = y * f + 0x1.555554p-2f;       // 3.3333331174e-1
    y = y * f * z;
    y += LN2_LO * e;
    y += -0.5 * z;
    return (f + y) + LN2_HI * e;
}

// The 64-bit product of two u32 as (low, high) words, from 16-bit halves.
fn mul_wide(a: u32, b: u32) -> vec2<u32> {
    let al = a & 0xffffu;
    let ah = a >> 16u;
    let bl = b & 0xffffu;
    let bh = b >> 16u;
    let ll = al * bl;
    let lh = al * bh;
    let hl = ah * bl;
    let mid = (ll >> 16u) + (lh & 0xffffu) + (hl & 0xffffu);
    return vec2<u32>((ll & 0xffffu) | (mid << 16u), ah * bh + (lh >> 16u) + (hl >> 16u) + (mid >> 16u));
}

// a > b for (low, high) pairs.
fn gt64(a: vec2<u32>, b: vec2<u32>) -> bool {
    return a.y > b.y || (a.y == b.y && a.x > b.x);
}

// x / t rounded to nearest even, as the CPU's f32 division. Vulkan lets the hardware quotient be off by
// 2.5 ulp (an H200's is off by one ulp for some inputs), so it is only the first guess q. With the 24-bit
// significands mx, mt, mq (x = mx 2^(ex-150), likewise t and q), q is the rounded quotient iff
// 4 mx 2^(ex-et-eq+150) lies within [mt (4 mq - 2), mt (4 mq + 2)] (the lower end mt (4 mq - 1) when q is a
// power of two, whose lower neighbour is half as far), which 64-bit integer products decide exactly;
// otherwise q moves one ulp towards x / t and is tested again. No tie is possible (a quotient of 24-bit
// significands is never a 25-bit midpoint), so the ends need no rule. Zero, subnormal or non-finite
// x, t or q (and results that would leave the normal range) keep the hardware quotient.
fn div_rn(x: f32, t: f32) -> f32 {
    let q0 = x / t;
    let xb = bitcast<u32>(x) & 0x7fffffffu;
    let tb = bitcast<u32>(t) & 0x7fffffffu;
    let ex = xb >> 23u;
    let et = tb >> 23u;
    if (ex == 0u || ex == 255u || et == 0u || et == 255u) {
        return q0;
    }
    let mx = (xb & 0x7fffffu) | 0x800000u;
    let mt = (tb & 0x7fffffu) | 0x800000u;
    var qb = bitcast<u32>(q0) & 0x7fffffffu;
    for (var k = 0u; k < 4u; k++) {
        let eq = qb >> 23u;
        let sh = i32(ex) - i32(et) - i32(eq) + 152; // 24..27 for q within a few ulps of x / t
        if (eq == 0u || eq == 255u || sh < 1 || sh > 31) {
            return q0;
        }
        let mq = (qb & 0x7fffffu) | 0x800000u;
        let a = vec2<u32>(mx << u32(sh), mx >> u32(32 - sh));
        if (gt64(a, mul_wide(mt, 4u * mq + 2u))) {
            qb += 1u;
        } else if (gt64(mul_wide(mt, 4u * mq - select(2u, 1u, mq == 0x800000u)), a)) {
            qb -= 1u;
        } else {
            break;
        }
    }
    return bitcast<f32>(qb | (bitcast<u32>(q0) & 0x80000000u));
}

// Exponent bits all ones: +-inf or NaN (bit test, so no compiler assumption about NaN can remove it).
fn non_finite(y: f32) -> bool {
    return (bitcast<u32>(y) & 0x7f800000u) == 0x7f800000u;
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    // local: the row of logits and scaled; row: the row of draws, results and steps.
    let local = wid.x + wid.y * nwg.x;
    if (local >= p.rows) {
        return;
    }
    let row = p.first_row + local;
    let i = lid.x;
    let v_n = p.vocab;
    let base = local * v_n;
    let step_in = steps[select(0u, row / p.rows_per_step, p.rows_per_step != 0u)];
    let t = step_in.temperature;
    let mode = step_in.mode;
    if (i == 0u) {
        atomicStore(&first_bad, NONE);
        atomicStore(&cross_chunk, NONE);
        atomicStore(&last_chunk, 0u);
    }

    // Pass 1. Strided columns increase, so an invocation's first hit is its lowest one. A value equal
    // to LOWEST (or a row of -inf, where the CPU's max is -inf at index 0) needs the m_idx == NONE case.
    var m = LOWEST;
    var m_idx = NONE;
    var bad = NONE;
    for (var j = i; j < v_n; j += WG) {
        let y = div_rn(logits[base + j], t);
        scaled[base + j] = y;
        if (bad == NONE && non_finite(y)) {
            bad = j;
        }
        if (y > m || (m_idx == NONE && y == m)) {
            m = y;
            m_idx = j;
        }
    }
    red_max[i] = m;
    red_idx[i] = m_idx;
    storageBarrier();
    workgroupBarrier();
    if (bad != NONE) {
        atomicMin(&first_bad, bad);
    }
    for (var k = WG / 2u; k > 0u; k = k >> 1u) {
        if (i < k) {
            let m2 = red_max[i + k];
            let i2 = red_idx[i + k];
            if (m2 > red_max[i] || (m2 == red_max[i] && i2 < red_idx[i])) {
                red_max[i] = m2;
                red_idx[i] = i2;
            }
        }
        workgroupBarrier();
    }
    let row_max = red_max[0];

    // Pass 2.
    var cnt = 0u;
    var rest = 0.0;
    var wsum = 0.0;
    var b_rest = 0.0;
    var b_wsum = 0.0;
    var b_n = 0u;
    for (var j = i; j < v_n; j += WG) {
        let y = scaled[base + j];
        let ed = exp_nonpos(y - row_max);
        let at_max = y == row_max;
        cnt += select(0u, 1u, at_max);
        b_rest += ed.x - select(0.0, 1.0, at_max);
        b_wsum -= ed.x * ed.y;
        b_n += 1u;
        if (b_n == BLOCK) {
            rest += b_rest;
            wsum += b_wsum;
            b_rest = 0.0;
            b_wsum = 0.0;
            b_n = 0u;
        }
    }
    red_cnt[i] = cnt;
    red_rest[i] = rest + b_rest;
    red_wsum[i] = wsum + b_wsum;
    workgroupBarrier();
    for (var k = WG / 2u; k > 0u; k = k >> 1u) {
        if (i < k) {
            red_cnt[i] += red_cnt[i + k];
            red_rest[i] += red_rest[i + k];
            red_wsum[i] += red_wsum[i + k];
        }
        workgroupBarrier();
    }
    if (i == 0u) {
        row_sum = f32(red_cnt[0]) + red_rest[0];
    }
    workgroupBarrier();
    let s = row_sum;

    // Pass 3 (mode comes from a read-only buffer: uniform across the workgroup).
    if (mode == MODE_UNIFORM) {
        let u = bitcast<f32>(draws[row]);
        let chunk = v_n / WG + select(0u, 1u, v_n % WG != 0u);
        let lo = min(i * chunk, v_n);
        let hi = min(lo + chunk, v_n);
        var outer = 0.0;
        var inner = 0.0;
        var n_in = 0u;
        for (var j = lo; j < hi; j++) {
            inner += exp_nonpos(scaled[base + j] - row_max).x / s;
            n_in += 1u;
            if (n_in == BLOCK) {
                outer += inner;
                inner = 0.0;
                n_in = 0u;
            }
        }
        let csum = outer + inner;
        scan[i] = csum;
        workgroupBarrier();
        for (var k = 1u; k < WG; k = k << 1u) {
            var acc = scan[i];
            if (i >= k) {
                acc = scan[i - k] + acc;
            }
            workgroupBarrier();
            scan[i] = acc;
            workgroupBarrier();
        }
        var excl = 0.0;
        if (i > 0u) {
            excl = scan[i - 1u];
        }
        if (csum > 0.0) {
            atomicMax(&last_chunk, i);
            if (excl + csum > u) {
                atomicMin(&cross_chunk, i);
            }
        }
        workgroupBarrier();
        let crossing = atomicLoad(&cross_chunk);
        let finite = atomicLoad(&first_bad) == NONE;
        if (finite && crossing == i) {
            // The same partial sums as the chunk sum, entry by entry: the last one is csum.
            outer = 0.0;
            inner = 0.0;
            n_in = 0u;
            var found = hi - 1u;
            for (var j = lo; j < hi; j++) {
                let pj = exp_nonpos(scaled[base + j] - row_max).x / s;
                inner += pj;
                n_in += 1u;
                let part = outer + inner;
                if (excl + part > u && pj > 0.0) {
                    found = j;
                    break;
                }
                if (n_in == BLOCK) {
                    outer = part;
                    inner = 0.0;
                    n_in = 0u;
                }
            }
            results[row * 4u + 2u] = found;
        } else if (finite && crossing == NONE && i == atomicLoad(&last_chunk)) {
            // u is above the rounded total: the last entry with non-zero probability.
            var found = lo;
            for (var j = lo; j < hi; j++) {
                if (exp_nonpos(scaled[base + j] - row_max).x / s > 0.0) {
                    found = j;
                }
            }
            results[row * 4u + 2u] = found;
        }
    }

    if (i == 0u) {
        let out = row * 4u;
        let bad_col = atomicLoad(&first_bad);
        results[out + 1u] = select(red_idx[0], 0u, red_idx[0] == NONE);
        if (bad_col == NONE) {
            // count >= 1 in a finite row (the max is one of its values), so count - 1 is exact.
            let entropy = ln1p_nonneg(f32(red_cnt[0] - 1u) + red_rest[0]) + red_wsum[0] / s;
            results[out] = bitcast<u32>(entropy);
            results[out + 3u] = 0u;
        } else {
            results[out] = NAN_BITS;
            results[out + 3u] = bad_col + 1u;
        }
        if (mode != MODE_UNIFORM) {
            results[out + 2u] = draws[row];
        } else if (bad_col != NONE) {
            results[out + 2u] = 0u;
        }
    }
}

// Row softmax in place on x: [rows, cols], optionally masked like dg_cpu::attention::Mask.
// Mode 1 (causal): row r is query t = r % queries at absolute position p = query_start + t; key
// column j (absolute key_start + j) is visible iff key_start + j <= p and (window == 0 or
// key_start + j + window > p). The visible keys form one range [lo, hi); entries outside it are
// written as 0 and excluded from the max and the sum. A query inside [span_start, span_end) (an
// image's soft tokens, absolute positions) also sees that whole span: [lo, hi) grows to hold it
// (both hold the query, so their union is one range).
// Columns [gap_start, gap_end) are masked in every mode (written as 0, outside the max and sum).
// One workgroup per row; rows beyond 65535 workgroups wrap into the y dimension.
// Pass 1: each invocation keeps a running (max, sum of exp(x - max)) over its strided elements;
// the pairs are merged across the workgroup by row_max_sum (row_reduce.rs). The LANES4 variant
// reads and writes four columns at a time (cols a multiple of 4), each column as the plain one.
// Pass 2: x = exp(x - max) * (1 / sum), reading only what is visible (masked entries are written
// as 0 unread).

struct Params {
    rows: u32,
    cols: u32,
    queries: u32,
    mode: u32,
    key_start: u32,
    query_start: u32,
    window: u32,
    gap_start: u32,
    gap_end: u32,
    span_start: u32,
    span_end: u32,
    _pad0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<XELEM>;

//@ONLINE

// Column j is in the row's visible range and outside the gap.
fn visible(j: u32, lo: u32, hi: u32) -> bool {
    return j >= lo && j < hi && !(j >= p.gap_start && j < p.gap_end);
}

//@ROW_REDUCE

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>, lanes: RowLanes) {
    let row = wid.x + wid.y * nwg.x;
    let live = row < p.rows;
    let base = row * p.cols;

    // Visible key range [lo, hi) of this row.
    var lo = 0u;
    var hi = p.cols;
    if (p.mode == 1u) {
        let t = row % max(p.queries, 1u);
        let end = p.query_start + t + 1u; // one past the query's absolute position
        hi = min(select(0u, end - p.key_start, end > p.key_start), p.cols);
        if (p.window != 0u) {
            let first = select(0u, end - p.window, end > p.window); // first visible absolute key
            lo = min(select(0u, first - p.key_start, first > p.key_start), hi);
        }
        let pos = end - 1u;
        if (pos >= p.span_start && pos < p.span_end) {
            hi = max(hi, min(select(0u, p.span_end - p.key_start, p.span_end > p.key_start), p.cols));
            lo = min(lo, select(0u, p.span_start - p.key_start, p.span_start > p.key_start));
        }
    }

    var ms = vec2<f32>(LOWEST, 0.0);
    if (live) {
#if LANES4
        // Four columns a load (cols a multiple of 4): the quads lid.x, lid.x + WG, ... that meet
        // [lo, hi), each visible column of a quad taken in order.
        for (var q = lo / 4u + lid.x; q * 4u < hi; q += WG) {
            let v4 = x[base / 4u + q];
            for (var c = 0u; c < 4u; c++) {
                if (visible(q * 4u + c, lo, hi)) {
                    ms = online(ms, v4[c]);
                }
            }
        }
#else
        for (var j = lo + lid.x; j < hi; j += WG) {
            if (visible(j, lo, hi)) {
                ms = online(ms, x[base + j]);
            }
        }
#endif
    }
    let total = row_max_sum(ms.x, ms.y, lanes);
    if (!live) {
        return;
    }
    let row_max = total.x;
    let inv = 1.0 / total.y;
#if LANES4
    for (var q = lid.x; q * 4u < p.cols; q += WG) {
        var y = vec4<f32>(0.0);
        // Quads wholly outside [lo, hi) are written as zeros without being read (the causal
        // prefill's rows are half masked).
        if (q * 4u + 4u > lo && q * 4u < hi) {
            let v4 = x[base / 4u + q];
            for (var c = 0u; c < 4u; c++) {
                if (visible(q * 4u + c, lo, hi)) {
                    y[c] = exp(v4[c] - row_max) * inv;
                }
            }
        }
        x[base / 4u + q] = y;
    }
#else
    for (var j = lid.x; j < p.cols; j += WG) {
        var y = 0.0;
        if (visible(j, lo, hi)) {
            y = exp(x[base + j] - row_max) * inv;
        }
        x[base + j] = y;
    }
#endif
}

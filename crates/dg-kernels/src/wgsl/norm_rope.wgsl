// Per-head RMSNorm then RoPE (rotate-half), fused: for each row (token, head) of x: [tokens,
// heads, d], d = 2 * half,
//   y = x * (mean(x^2) + eps)^-1/2 * w        (as rmsnorm.wgsl: weighted, scale 1)
//   out[i]        = y[i] * cos + (-y[i + half]) * sin
//   out[i + half] = y[i + half] * cos + y[i] * sin      (as rope.wgsl)
// with cos/sin = table[token, i]. The rows of one dispatch, in order:
// - Q rows (p.q_blocks blocks of [tokens, heads, d] at the start of x: a batched q projection whose
//   batch b holds q heads b * heads ..): normed with q_w and rotated into q_out, [tokens,
//   q_blocks * heads, d];
// - K rows ([tokens, heads, d] right after them, unless p.skip_k): normed with w and rotated into
//   out from element out_offset;
// - V rows (p.v_heads per token, from element v_offset of x), each normed without weight and rope
//   (as rmsnorm.wgsl: weightless, scale 1) into values:
//   values[out_offset + r * d + i] = x[v_offset + r * d + i] * (mean(x^2) + eps)^-1/2
// so that one projection of q, K and V reaches q and the cache in one dispatch. Every row is
// computed the same way whatever else the dispatch holds.
// One workgroup per row; rows beyond 65535 workgroups wrap into y. The sum of
// squares reduces with row_sum (row_reduce.rs), as rmsnorm.wgsl's does. Columns go LANES at a
// time (V: f32, or vec4<f32> with d / 2 and the offsets multiples of 4), as in rmsnorm.wgsl.
// out and values (the KV cache) hold CV: V, or its f16 form (each value rounded to the nearest
// f16 as it is stored).

struct Params {
    tokens: u32,
    heads: u32,
    dim: u32,
    eps: f32,
    // x may be a split-K GEMM's partials (split_k.rs `with_reader`).
    splits: u32,
    split_stride: u32,
    // Elements before row 0 of out (and of values).
    out_offset: u32,
    // V rows per token (0: none), and the element of x where they start.
    v_heads: u32,
    v_offset: u32,
    // Blocks of Q rows ahead of the K rows (0: none), and whether the K rows are left out.
    q_blocks: u32,
    skip_k: u32,
    // Element of x where the first q block (else the K block) starts, elements from one block to
    // the next (0: tokens * heads * dim), and the tables' row of token 0.
    x_offset: u32,
    block_stride: u32,
    table_row0: u32,
    // Elements before row 0 of q_out.
    q_offset: u32,
    _pad0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<V>;
@group(0) @binding(2) var<storage, read> w: array<V>;
@group(0) @binding(3) var<storage, read> cos_t: array<V>;
@group(0) @binding(4) var<storage, read> sin_t: array<V>;
@group(0) @binding(5) var<storage, read_write> out: array<CV>;
@group(0) @binding(6) var<storage, read_write> values: array<CV>;
@group(0) @binding(7) var<storage, read> q_w: array<V>;
@group(0) @binding(8) var<storage, read_write> q_out: array<V>;

//@SPLIT_READER

//@ROW_REDUCE

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>, lanes: RowLanes) {
    let row = wid.x + wid.y * nwg.x;
    let block_rows = p.tokens * p.heads;
    let q_rows = p.q_blocks * block_rows;
    let k_rows = select(block_rows, 0u, p.skip_k != 0u);
    // Workgroup-uniform: which part this row belongs to.
    let is_q = row < q_rows;
    let is_v = row >= q_rows + k_rows;
    let v_row = row - q_rows - k_rows;
    let cols = p.dim / LANES;
    let stride = select(block_rows * cols, p.block_stride / LANES, p.block_stride != 0u);
    // Row r of block b (q blocks, then K) starts at x_offset + b * stride + r * cols.
    let blk = select(p.q_blocks, row / block_rows, is_q);
    let in_blk = select(row - q_rows, row % block_rows, is_q);
    let base = select(p.x_offset / LANES + blk * stride + in_blk * cols, p.v_offset / LANES + v_row * cols, is_v);
    let live = select(true, v_row < p.tokens * p.v_heads, is_v);
    var acc = 0.0;
    if (live) {
        for (var i = lid.x; i < cols; i += WG) {
            let v = x_at(base + i);
            acc += sq(v);
        }
    }
    let total = row_sum(acc, lanes);
    if (!live) {
        return;
    }
    let inv = 1.0 / sqrt(total / f32(p.dim) + p.eps);
    let out_base = p.out_offset / LANES;
    if (is_v) {
        let dst = out_base + v_row * cols;
        for (var i = lid.x; i < cols; i += WG) {
            values[dst + i] = CV(x_at(base + i) * inv);
        }
        return;
    }
    let half = cols / 2u;
    // The rotation is written out for q and for K: through one function returning both columns,
    // the H200's driver compiled a kernel 10% slower (norm_rope 0.131 → 0.144 ms a forward).
    if (is_q) {
        // Row (b, t, j) of the blocks: q head b * heads + j of token t.
        let b = row / block_rows;
        let t = (row % block_rows) / p.heads;
        let head = b * p.heads + row % p.heads;
        let dst = p.q_offset / LANES + (t * p.q_blocks * p.heads + head) * cols;
        let table = (p.table_row0 + t) * half;
        for (var j = lid.x; j < half; j += WG) {
            let y1 = (x_at(base + j) * inv) * q_w[j];
            let y2 = (x_at(base + j + half) * inv) * q_w[j + half];
            let c = cos_t[table + j];
            let s = sin_t[table + j];
            q_out[dst + j] = y1 * c + (-y2) * s;
            q_out[dst + j + half] = y2 * c + y1 * s;
        }
        return;
    }
    let k_row = row - q_rows;
    let table = (p.table_row0 + k_row / p.heads) * half;
    let dst = out_base + k_row * cols;
    for (var j = lid.x; j < half; j += WG) {
        let y1 = (x_at(base + j) * inv) * w[j];
        let y2 = (x_at(base + j + half) * inv) * w[j + half];
        let c = cos_t[table + j];
        let s = sin_t[table + j];
        out[dst + j] = CV(y1 * c + (-y2) * s);
        out[dst + j + half] = CV(y2 * c + y1 * s);
    }
}

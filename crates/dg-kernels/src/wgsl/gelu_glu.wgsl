// Gated-MLP activation: out = gelu_tanh(gate) * up, element-wise over [rows, inter].
// gelu_tanh(x) = 0.5 * x * (1 + tanh(0.7978845608 * (x + 0.044715 * x^3))), as dg_cpu::ops.
// The tanh argument is clamped: for |inner| > 15, tanh is exactly +-1 in f32 (it already rounds
// to 1 above ~9), and some drivers evaluate tanh through exp, which overflows to NaN there.
// One invocation per output element; workgroups beyond 65535 wrap into y.
// Variants (the Rust side picks one "@variant" section after this shared part):
//   fused: gate_up (read, [rows, 2 * inter], gate then up per row); out (read_write, [rows, inter]).
//   pair: two fused jobs in one dispatch, the first groups_a workgroups on gate_up / out (rows,
//     inter, the split-K partials), the rest on gate_up_b / out_b (rows_b, inter_b), each element
//     computed as the fused variant computes it.
// The fused and pair variants take LANES columns at a time (V: f32, or vec4<f32> with every
// width a multiple of 4); OUT is V, or its f16 twin for f16 outputs (fused_half, pair's second
// job).

struct Params {
    rows: u32,
    inter: u32,
    // The fused and pair variants' gate_up may be a split-K GEMM's partials (split_k.rs
    // `with_reader`).
    splits: u32,
    split_stride: u32,
    // pair: the second job, and the first job's workgroups.
    rows_b: u32,
    inter_b: u32,
    groups_a: u32,
    _pad0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;

const BETA: f32 = 0.7978845608; // sqrt(2 / pi)
const KAPPA: f32 = 0.044715;

// Per component for V = vec4<f32> (the fused and pair variants' four columns at a time), the
// same operations as for f32.
fn gelu_tanh(x: V) -> V {
    let inner = BETA * (x + KAPPA * (x * x * x));
    let t = select(sign(inner), tanh(inner), abs(inner) <= V(15.0));
    return 0.5 * x * (1.0 + t);
}

// Where output element i of [rows, inter] finds its gate in [rows, 2 * inter] (up is inter further).
fn gate_of(i: u32, inter: u32) -> u32 {
    let r = i / inter;
    return r * 2u * inter + (i - r * inter);
}

fn element(wid: vec3<u32>, lid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return (wid.x + wid.y * nwg.x) * WG + lid.x;
}

// @variant fused
@group(0) @binding(1) var<storage, read> gate_up: array<V>;
@group(0) @binding(2) var<storage, read_write> out: array<OUT>;

//@SPLIT_READER

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = element(wid, lid, nwg);
    let inter = p.inter / LANES;
    if (i >= p.rows * inter) {
        return;
    }
    let g = gate_of(i, inter);
    out[i] = OUT(gelu_tanh(gate_up_at(g)) * gate_up_at(g + inter));
}

// @variant pair
@group(0) @binding(1) var<storage, read> gate_up: array<V>;
@group(0) @binding(2) var<storage, read_write> out: array<V>;
@group(0) @binding(3) var<storage, read> gate_up_b: array<V>;
@group(0) @binding(4) var<storage, read_write> out_b: array<OUT>;

//@SPLIT_READER

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let group = wid.x + wid.y * nwg.x;
    if (group < p.groups_a) {
        let i = group * WG + lid.x;
        let inter = p.inter / LANES;
        if (i >= p.rows * inter) {
            return;
        }
        let g = gate_of(i, inter);
        out[i] = gelu_tanh(gate_up_at(g)) * gate_up_at(g + inter);
        return;
    }
    let i = (group - p.groups_a) * WG + lid.x;
    let inter_b = p.inter_b / LANES;
    if (i >= p.rows_b * inter_b) {
        return;
    }
    let g = gate_of(i, inter_b);
    out_b[i] = OUT(gelu_tanh(gate_up_b[g]) * gate_up_b[g + inter_b]);
}

// @variant fused_scaled
// The fused variant, one workgroup per row, the row multiplied by a power of two (row_factor)
// before it is stored, so that its largest magnitude is at most LIMIT and no finite value becomes
// inf where it is rounded to f16 (here for an f16 OUT, or in the tensor-core GEMM that stages an
// f32 row as f16); scale[row] receives the inverse, which the consumer of the product multiplies
// back (exact: both are powers of two). A row already within LIMIT is stored as the fused variant
// stores it (factor 1).
@group(0) @binding(1) var<storage, read> gate_up: array<V>;
@group(0) @binding(2) var<storage, read_write> out: array<OUT>;
@group(0) @binding(3) var<storage, read_write> scale: array<f32>;

//@SPLIT_READER

//@SCALED_ROWS

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>, lanes: RowLanes) {
    let row = wid.x + wid.y * nwg.x;
    let inter = p.inter / LANES;
    let live = row < p.rows;
    var m = 0.0;
    if (live) {
        for (var i = lid.x; i < inter; i += WG) {
            let g = row * 2u * inter + i;
            m = max(m, peak(gelu_tanh(gate_up_at(g)) * gate_up_at(g + inter)));
        }
    }
    let s = row_factor(row_max(m, lanes));
    if (!live) {
        return;
    }
    for (var i = lid.x; i < inter; i += WG) {
        let g = row * 2u * inter + i;
        out[row * inter + i] = OUT(gelu_tanh(gate_up_at(g)) * gate_up_at(g + inter) * s);
    }
    if (lid.x == 0u) {
        scale[row] = 1.0 / s;
    }
}

// @variant pair_scaled
// Two fused_scaled jobs in one dispatch: the first groups_a (= rows) workgroups take the rows of
// gate_up into out (f32) and scale, the rest the rows of gate_up_b into out_b (OUT) and scale_b.
@group(0) @binding(1) var<storage, read> gate_up: array<V>;
@group(0) @binding(2) var<storage, read_write> out: array<V>;
@group(0) @binding(3) var<storage, read> gate_up_b: array<V>;
@group(0) @binding(4) var<storage, read_write> out_b: array<OUT>;
@group(0) @binding(5) var<storage, read_write> scale: array<f32>;
@group(0) @binding(6) var<storage, read_write> scale_b: array<f32>;

//@SPLIT_READER

//@SCALED_ROWS

// Element i of a row's activation in job a (is_a) or b, the row's gate starting at g0.
fn act_of(is_a: bool, g0: u32, inter: u32, i: u32) -> V {
    if (is_a) {
        return gelu_tanh(gate_up_at(g0 + i)) * gate_up_at(g0 + inter + i);
    }
    return gelu_tanh(gate_up_b[g0 + i]) * gate_up_b[g0 + inter + i];
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>, lanes: RowLanes) {
    let group = wid.x + wid.y * nwg.x;
    let is_a = group < p.groups_a;
    let row = select(group - p.groups_a, group, is_a);
    let inter = select(p.inter_b, p.inter, is_a) / LANES;
    let live = row < select(p.rows_b, p.rows, is_a);
    let g0 = row * 2u * inter;
    var m = 0.0;
    if (live) {
        for (var i = lid.x; i < inter; i += WG) {
            m = max(m, peak(act_of(is_a, g0, inter, i)));
        }
    }
    let s = row_factor(row_max(m, lanes));
    if (!live) {
        return;
    }
    for (var i = lid.x; i < inter; i += WG) {
        let v = act_of(is_a, g0, inter, i) * s;
        if (is_a) {
            out[row * inter + i] = v;
        } else {
            out_b[row * inter + i] = OUT(v);
        }
    }
    if (lid.x == 0u) {
        if (is_a) {
            scale[row] = 1.0 / s;
        } else {
            scale_b[row] = 1.0 / s;
        }
    }
}

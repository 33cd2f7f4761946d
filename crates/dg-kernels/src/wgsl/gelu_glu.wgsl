// Gated-MLP activation: out = gelu_tanh(gate) * up, element-wise over [rows, inter].
// gelu_tanh(x) = 0.5 * x * (1 + tanh(0.7978845608 * (x + 0.044715 * x^3))), as dg_cpu::ops.
// The tanh argument is clamped: for |inner| > 15, tanh is exactly +-1 in f32 (it already rounds
// to 1 above ~9), and some drivers evaluate tanh through exp, which overflows to NaN there.
// One invocation per output element; workgroups beyond 65535 wrap into y.
// Three variants (the Rust side picks one "@variant" section after this shared part):
//   split: gate (read_write, [rows, inter]) becomes the output; up (read, [rows, inter]).
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

// @variant split
@group(0) @binding(1) var<storage, read_write> gate: array<V>;
@group(0) @binding(2) var<storage, read> up: array<V>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = element(wid, lid, nwg);
    if (i >= p.rows * p.inter) {
        return;
    }
    gate[i] = gelu_tanh(gate[i]) * up[i];
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

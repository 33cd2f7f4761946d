//! The gated-MLP activation `gelu_tanh(gate) ⊙ up` (`dg_cpu::ops::gelu_glu`): [`fused`] reads one
//! `[rows, 2·I]` buffer holding the gate then the up half of each row, as the fused `gate_up`
//! projection writes it, into a separate `[rows, I]` output, f32 or, [`fused_half`], f16.
//!
//! [`fused_scaled`] and [`pair_scaled`] are the row-scaled twins of [`fused_lanes`] and
//! [`pair_lanes`] for activations a tensor-core GEMM rounds to f16: one workgroup per row, each
//! row multiplied by a power of two that keeps its largest magnitude within 2^15, and the inverse
//! written to a `scale` buffer (one f32 a row) for the product's consumer to multiply back
//! (`wgsl/scaled_rows.wgsl`). The down projections' inputs are the only product inputs of the
//! layer that no norm bounds; Gemma-family activations there reach past f16's 65504.
//!
//! `gelu_tanh(x) = 0.5·x·(1 + tanh(0.7978845608·(x + 0.044715·x³)))`; the tanh argument is
//! clamped (|inner| > 15 gives ±1, which is tanh's f32 value there) because some drivers build
//! tanh from exp and overflow to NaN.

use bytemuck::{Pod, Zeroable};

use crate::row_reduce::{Part, RowReduce};
use crate::{Access, KernelSource, with_prelude};

/// Invocations per workgroup (one output element each).
pub const WORKGROUP: u32 = 256;

/// Uniform parameters of both variants of `gelu_glu.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable, PartialEq)]
pub struct GeluGluParams {
    pub rows: u32,
    /// I: the width of the activation (of `gate`, `up` and the output).
    pub inter: u32,
    /// [`fused`], [`pair`]: more than 1 when `gate_up` holds that many split-K partials of the
    /// gate/up product, `split_stride` elements apart (`crate::split_k::with_reader`).
    pub splits: u32,
    pub split_stride: u32,
    /// [`pair`]: the second job's rows and width (its `gate_up_b` is never split).
    pub rows_b: u32,
    pub inter_b: u32,
    /// [`pair`]: the workgroups of the first job (`(rows·I / lanes).div_ceil(WORKGROUP)`,
    /// [`GeluGluParams::pair`]).
    pub groups_a: u32,
    /// Columns an invocation takes: 1, or 4 for the kernels of [`fused_lanes`] and [`pair_lanes`]
    /// with 4 (every width a multiple of 4); the dispatch's size follows it.
    pub lanes: u32,
}

impl GeluGluParams {
    /// One job of `rows × inter` (the split and fused variants), its input split `splits` ways.
    pub fn one(rows: u32, inter: u32, splits: u32, split_stride: u32) -> Self {
        GeluGluParams { rows, inter, splits, split_stride, lanes: 1, ..Zeroable::zeroed() }
    }

    /// This job for a kernel taking `lanes` columns at a time.
    pub fn with_lanes(self, lanes: u32) -> Self {
        GeluGluParams { lanes, ..self }
    }

    /// Two jobs for [`pair`]: `a` as [`GeluGluParams::one`] (its lanes for both), then
    /// `(rows_b, inter_b)`.
    pub fn pair(a: GeluGluParams, (rows_b, inter_b): (u32, u32)) -> Self {
        GeluGluParams { rows_b, inter_b, groups_a: (a.rows * a.inter / a.lanes.max(1)).div_ceil(WORKGROUP), ..a }
    }

    /// [`pair_scaled`]'s two jobs: `a` as [`GeluGluParams::one`], then `(rows_b, inter_b)`; one
    /// workgroup a row.
    pub fn pair_rows(a: GeluGluParams, (rows_b, inter_b): (u32, u32)) -> Self {
        GeluGluParams { rows_b, inter_b, groups_a: a.rows, ..a }
    }
}

/// Workgroups to dispatch for the row-scaled variants, one per row of both jobs (fold through
/// `groups_1d`).
pub fn workgroups_scaled(p: &GeluGluParams) -> u32 {
    p.rows + p.rows_b
}

/// Workgroups to dispatch, any element-wise variant (fold through `groups_1d`).
pub fn workgroups(p: &GeluGluParams) -> u32 {
    let lanes = p.lanes.max(1);
    (p.rows * p.inter / lanes).div_ceil(WORKGROUP) + (p.rows_b * p.inter_b / lanes).div_ceil(WORKGROUP)
}

/// The const prelude and the `V` / `OUT` aliases of a variant taking `lanes` columns, its output
/// f16 with `half`.
fn prelude(body: &str, lanes: u32, half: bool) -> String {
    let (v, out) = match (lanes, half) {
        (1, false) => ("f32", "f32"),
        (1, true) => ("f32", "f16"),
        (4, false) => ("vec4<f32>", "vec4<f32>"),
        (4, true) => ("vec4<f32>", "vec4<f16>"),
        _ => panic!("gelu_glu takes 1 or 4 columns at a time, not {lanes}"),
    };
    let text = with_prelude(&[("WG", WORKGROUP), ("LANES", lanes)], &format!("alias V = {v};\nalias OUT = {out};\n{body}"));
    if half { format!("enable f16;\n{text}") } else { text }
}

/// A row-scaled variant's body: the row factor, `peak` (a V's largest magnitude) and the row
/// maximum of `reduce`, in place of the template's `//@SCALED_ROWS` line.
fn scaled_body(name: &str, reduce: RowReduce, lanes: u32) -> String {
    let peak = match lanes {
        4 => "fn peak(v: V) -> f32 {\n    let a = abs(v);\n    return max(max(a.x, a.y), max(a.z, a.w));\n}\n",
        _ => "fn peak(v: V) -> f32 {\n    return abs(v);\n}\n",
    };
    let rows = format!("{}\n{peak}\n//@ROW_REDUCE\n", include_str!("wgsl/scaled_rows.wgsl"));
    let body = variant(name).replace("//@SCALED_ROWS\n", &rows);
    crate::split_k::with_reader_lanes(&reduce.render(&body, &[Part::Max]), "gate_up_at", "gate_up")
}

/// [`fused_lanes`] scaled by rows (see the module documentation): bindings `gate_up` (read),
/// `out` (read-write, f32 or, with `half`, f16), `scale` (read-write, `[rows]` f32: what each row
/// of the product of `out` must be multiplied by). One workgroup a row
/// ([`GeluGluParams::one`], [`workgroups_scaled`]).
pub fn fused_scaled(reduce: RowReduce, lanes: u32, half: bool) -> KernelSource {
    scaled_source("fused_scaled", reduce, lanes, half, vec![Access::Read, Access::ReadWrite, Access::ReadWrite])
}

/// [`pair_lanes`] scaled by rows: bindings `gate_up` (read), `out` (read-write, f32), `gate_up_b`
/// (read), `out_b` (read-write, f16 with `half_b`), `scale` and `scale_b` (read-write, one f32 a
/// row of each job). One workgroup a row ([`GeluGluParams::pair_rows`], [`workgroups_scaled`]).
pub fn pair_scaled(reduce: RowReduce, lanes: u32, half_b: bool) -> KernelSource {
    let buffers = vec![Access::Read, Access::ReadWrite, Access::Read, Access::ReadWrite, Access::ReadWrite, Access::ReadWrite];
    scaled_source("pair_scaled", reduce, lanes, half_b, buffers)
}

/// The row-scaled `variant` of `gelu_glu.wgsl` with its bindings.
fn scaled_source(variant: &str, reduce: RowReduce, lanes: u32, half: bool, buffers: Vec<Access>) -> KernelSource {
    let suffix = format!("{}{}{}", if half { "_half" } else { "" }, if lanes == 4 { "_v4" } else { "" }, reduce.suffix());
    KernelSource {
        name: format!("gelu_glu_{variant}{suffix}"),
        wgsl: prelude(&scaled_body(variant, reduce, lanes), lanes, half),
        entry: "main",
        buffers,
        params_size: size_of::<GeluGluParams>() as u64,
    }
}

/// Bindings: `gate_up` (read, `[rows, 2·I]`: gate `[0, I)` then up `[I, 2·I)` per row, or the
/// split-K partials of that product), `out` (read-write, `[rows, I]`).
pub fn fused() -> KernelSource {
    fused_lanes(1, false)
}

/// [`fused`] storing its output as f16 (`out`: `[rows, I]` halves, two a word as
/// [`crate::pack_f16`] packs them, rounded by the device's conversion): the activations of a
/// tensor-core GEMM that reads A as f16 ([`crate::coop_gemm::AFormat::F16`]), which the GEMM would
/// otherwise round the same way as it staged them. Needs `wgpu::Features::SHADER_F16`.
pub fn fused_half() -> KernelSource {
    fused_lanes(1, true)
}

/// [`fused`] (or, with `half`, [`fused_half`]) taking `lanes` columns at a time: 1, or 4 (`I` and
/// the partials' split stride multiples of 4; each element computed as with 1).
pub fn fused_lanes(lanes: u32, half: bool) -> KernelSource {
    let name = format!("gelu_glu_fused{}{}", if half { "_half" } else { "" }, if lanes == 4 { "_v4" } else { "" });
    KernelSource {
        name,
        wgsl: prelude(&crate::split_k::with_reader_lanes(&variant("fused"), "gate_up_at", "gate_up"), lanes, half),
        entry: "main",
        buffers: vec![Access::Read, Access::ReadWrite],
        params_size: size_of::<GeluGluParams>() as u64,
    }
}

/// Two [`fused`] jobs in one dispatch (the dense MLP's and the experts' activations, which are
/// independent): the first [`GeluGluParams::groups_a`] workgroups compute `out` from `gate_up`
/// (possibly split-K partials), the rest `out_b` from `gate_up_b`, stored as f16 with `half_b`
/// (as [`fused_half`] stores them; needs `wgpu::Features::SHADER_F16`). Each element is computed
/// by the same expression as in [`fused`] / [`fused_half`]. Bindings: `gate_up` (read), `out`
/// (read-write), `gate_up_b` (read), `out_b` (read-write).
pub fn pair(half_b: bool) -> KernelSource {
    pair_lanes(half_b, 1)
}

/// [`pair`] taking `lanes` columns at a time (1, or 4 with both widths and the split stride
/// multiples of 4).
pub fn pair_lanes(half_b: bool, lanes: u32) -> KernelSource {
    let name = format!("gelu_glu_pair{}{}", if half_b { "_half" } else { "" }, if lanes == 4 { "_v4" } else { "" });
    KernelSource {
        name,
        wgsl: prelude(&crate::split_k::with_reader_lanes(&variant("pair"), "gate_up_at", "gate_up"), lanes, half_b),
        entry: "main",
        buffers: vec![Access::Read, Access::ReadWrite, Access::Read, Access::ReadWrite],
        params_size: size_of::<GeluGluParams>() as u64,
    }
}

/// The shared part of `gelu_glu.wgsl` (before the first `// @variant` line) followed by the
/// section of `name` (each variant declares its own bindings, which differ in access).
fn variant(name: &str) -> String {
    const SRC: &str = include_str!("wgsl/gelu_glu.wgsl");
    let mut sections = SRC.split("// @variant ");
    let mut out = sections.next().unwrap_or_default().to_string();
    let body = sections
        .find_map(|s| s.strip_prefix(name).filter(|rest| rest.starts_with('\n')))
        .unwrap_or_else(|| panic!("gelu_glu.wgsl has no variant {name}"));
    out.push_str(body);
    out
}

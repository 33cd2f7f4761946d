//! The experts' weights streamed with no products, by the bytes each workgroup keeps in flight
//! and by how many workgroups share a multiprocessor: the read rate the experts' loads could reach
//! with the registers they give their ring (`coop_kloop`). The decoder's F16 expert tile keeps
//! about 4 K steps of 8 KiB a workgroup in flight, two workgroups a multiprocessor.

use dg_gpu::{GpuContext, Pipelines};
use dg_kernels::{Access, KernelSource};

use super::{ProbeError, ProbeOptions, alternating, time_dispatch};

/// The gate/up projection's weights: 128 experts of 1408 × 2816 in F16 K panels (1.01 GB).
const EXPERTS: u32 = 128;
const N: u32 = 1408;
const K: u32 = 2816;
/// Columns of one expert tile (the workgroup's 8 KiB block a K step).
const TILE_N: u32 = 128;

/// K steps whose loads a workgroup issues together before it consumes them.
pub const IN_FLIGHT_STEPS: &[u32] = &[1, 2, 4, 8];
/// Workgroup memory declared (KiB), to hold the workgroups a multiprocessor runs: none, about two
/// (24 KiB; `workgroup_residency_probe`) and one (40 KiB).
pub const PAD_KIB: &[u32] = &[0, 24, 40];

/// A kernel that streams the panels as the 32 × 128 expert tile's workgroups read them (workgroup
/// `g · tiles_n + t` reads columns `128·t ..` of expert `g`, one 8 KiB block a K step, 16 bytes
/// four times an invocation, the blocks a panel apart), issuing the loads of `steps` K steps
/// before it consumes any, with `pad_kib` KiB of workgroup memory declared and used;
/// `p = (n, k, tiles_n, 0)`.
pub fn stream_in_flight_wgsl(steps: u32, pad_kib: u32) -> String {
    let load = |j: u32| -> String { (0..4).map(|q| format!("        acc_{j} ^= w[at + {j}u * step + {}u];\n", q * 128)).collect() };
    let accs: String = (0..steps).map(|j| format!("    var acc_{j} = vec4<u32>();\n")).collect();
    let body: String = (0..steps).map(load).collect();
    let fold: String = (0..steps).map(|j| format!(" ^ acc_{j}")).collect();
    let (pad_decl, pad_use) = if pad_kib == 0 {
        (String::new(), String::new())
    } else {
        let words = pad_kib * 256;
        (
            format!("var<workgroup> pad: array<u32, {words}u>;\n"),
            format!("    pad[lt * {}u] = acc.x;\n    workgroupBarrier();\n    acc.y ^= pad[{words}u - 1u - lt];\n", words / 128),
        )
    };
    format!(
        "@group(0) @binding(0) var<uniform> p: vec4<u32>;
@group(0) @binding(1) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;
{pad_decl}
@compute @workgroup_size(128)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lt: u32) {{
    let id = wid.x + nwg.x * wid.y;
    if (id >= {EXPERTS}u * p.z) {{
        return;
    }}
    let k_steps = p.y / 32u;
    let first = (id / p.z) * (p.x * p.y / 8u) + (id % p.z) * 512u + lt;
    let step = p.x * 4u;
{accs}    var s = 0u;
    for (; s + {steps}u <= k_steps; s += {steps}u) {{
        let at = first + s * step;
{body}    }}
    for (; s < k_steps; s++) {{
        let at = first + s * step;
        acc_0 ^= w[at] ^ w[at + 128u] ^ w[at + 256u] ^ w[at + 384u];
    }}
    var acc = vec4<u32>(){fold};
{pad_use}    out[id * 128u + lt] = acc.x ^ acc.y ^ acc.z ^ acc.w;
}}
"
    )
}

/// Streams the gate/up weights (filled with a pattern, so that nothing reads as zeros) with
/// [`stream_in_flight_wgsl`] for every [`IN_FLIGHT_STEPS`] and [`PAD_KIB`], twice in alternating
/// order (single timings can be far off: bench/HISTORY.md): µs, TB/s, and the KiB each workgroup
/// keeps in flight.
pub fn bytes_in_flight_probe(ctx: &GpuContext, _options: &ProbeOptions) -> Result<(), ProbeError> {
    let test = "bytes_in_flight_probe";
    let bytes = u64::from(EXPERTS * N * K) * 2;
    let w = ctx.storage_buffer("w", bytes)?;
    let chunk = 1u64 << 26;
    let mut state = 0x9e37_79b9u32;
    let mut words = vec![0u32; (chunk / 4) as usize];
    for at in (0..bytes).step_by(chunk as usize) {
        for x in words.iter_mut() {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            *x = state;
        }
        let len = chunk.min(bytes - at) as usize;
        ctx.queue.write_buffer(&w, at, &bytemuck::cast_slice(&words)[..len]);
    }
    let tiles_n = N / TILE_N;
    let groups = EXPERTS * tiles_n;
    let out = ctx.storage_buffer("out", u64::from(groups) * 128 * 4)?;
    let mut pipelines = Pipelines::default();
    let params = [N, K, tiles_n, 0u32];
    for round in 0..2 {
        for &pad in PAD_KIB {
            let mut line = format!("{test}: round {round}, {pad} KiB of workgroup memory:");
            for i in alternating(round, IN_FLIGHT_STEPS.len()) {
                let steps = IN_FLIGHT_STEPS[i];
                let source = KernelSource {
                    name: format!("stream_in_flight_{steps}_{pad}"),
                    wgsl: stream_in_flight_wgsl(steps, pad),
                    entry: "main",
                    buffers: vec![Access::Read, Access::ReadWrite],
                    params_size: 16,
                };
                let pipeline = pipelines.get_source(ctx, source)?;
                let t = time_dispatch(ctx, &pipeline, &params, &[&w, &out], dg_gpu::groups_1d(groups, 65535), 20)?;
                line += &format!(" | {steps} steps ({} KiB): {:.1} us {:.2} TB/s", steps * 8, t * 1e6, bytes as f64 / t / 1e12);
            }
            println!("{line}");
        }
    }
    Ok(())
}

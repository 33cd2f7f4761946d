//! Probes of what the GPU costs before any work: a dispatch by itself (dependent on the one
//! before or not) and how many workgroups a multiprocessor runs side by side by the workgroup
//! memory they declare.

use dg_gpu::{GpuContext, Pipelines, PlanBuilder};

use super::best_time;
use super::{ProbeError, ProbeOptions, time_dispatch};

/// What a dispatch costs by itself: 100 dispatches of a kernel
/// that adds 1 to one word per invocation, each reading the previous one's writes (the barrier
/// between dependent dispatches every layer kernel pays), by workgroups; and the same dispatches
/// writing 8 buffers in turn, so that neighbours are independent. The forward's row kernels
/// (norms, routing, reductions) are 9–30 µs each on an H200, 23 dispatches a layer: this says how
/// much of that is the dispatch itself. On an H200: 3.4 µs for one workgroup, 4.5–5.5 for 132 to
/// 1024, 8.0 for 4096, dependent or not.
pub fn dispatch_floor_probe(ctx: &GpuContext, _options: &ProbeOptions) -> Result<(), ProbeError> {
    use dg_kernels::{Access, KernelSource};
    let test = "dispatch_floor_probe";
    let mut pipelines = Pipelines::default();
    let wgsl = "@group(0) @binding(0) var<uniform> p: vec4<u32>;\n\
                @group(0) @binding(1) var<storage, read_write> out: array<u32>;\n\
                @compute @workgroup_size(256)\n\
                fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lt: u32) {\n\
                \x20   let i = wid.x * 256u + lt;\n\
                \x20   out[i] = out[i] + 1u + p.x;\n\
                }\n";
    let source =
        KernelSource { name: "dispatch_floor".into(), wgsl: wgsl.into(), entry: "main", buffers: vec![Access::ReadWrite], params_size: 16 };
    let pipeline = pipelines.get_source(ctx, source)?;
    let buffers = (0..8).map(|_| ctx.storage_buffer("out", 4096 * 256 * 4)).collect::<Result<Vec<wgpu::Buffer>, _>>()?;
    let replays = 100u32;
    for groups in [1u32, 132, 1024, 4096] {
        let mut line = format!("{test}: {groups} workgroups of 256:");
        for (what, distinct) in [("dependent", 1usize), ("8 buffers in turn", 8)] {
            let mut plan = PlanBuilder::new(ctx);
            for r in 0..replays as usize {
                plan.push(&pipeline, &[0u32; 4], &[&buffers[r % distinct]], [groups, 1, 1]);
            }
            let t = best_time(ctx, &plan.finish(ctx)?, replays);
            line += &format!(" | {what}: {:.2} us a dispatch", t * 1e6);
        }
        println!("{line}");
    }
    Ok(())
}

/// How many workgroups of 128 invocations one multiprocessor runs at once, by the workgroup
/// memory they declare: each invocation follows a chain of 400
/// dependent loads through an L2-resident permutation (latency-bound, so concurrent workgroups
/// take no longer than one), and the time is read against the number of workgroups. Where it
/// stays flat up to `k ×` the multiprocessors' count, k workgroups run side by side.
pub fn workgroup_residency_probe(ctx: &GpuContext, _options: &ProbeOptions) -> Result<(), ProbeError> {
    use dg_kernels::{Access, KernelSource};
    let test = "workgroup_residency_probe";
    let mut pipelines = Pipelines::default();
    let len = 1u32 << 20;
    // A single cycle through all entries with a large odd stride: consecutive loads are far apart.
    let chain: Vec<u32> = (0..len).map(|i| (i + 392_699) % len).collect();
    let chain = ctx.upload("chain", &chain)?;
    let max_groups = 132u32 * 16;
    let out = ctx.storage_buffer("out", u64::from(max_groups * 128) * 4)?;
    for shared_kib in [1u32, 8, 16, 24, 32, 40] {
        let words = shared_kib * 256;
        let wgsl = format!(
            "@group(0) @binding(0) var<uniform> p: vec4<u32>;\n\
             @group(0) @binding(1) var<storage, read> chain: array<u32>;\n\
             @group(0) @binding(2) var<storage, read_write> out: array<u32>;\n\
             var<workgroup> pad: array<u32, {words}>;\n\
             @compute @workgroup_size(128)\n\
             fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lt: u32) {{\n\
             \x20   for (var w = lt; w < {words}u; w += 128u) {{ pad[w] = w; }}\n\
             \x20   workgroupBarrier();\n\
             \x20   var i = (wid.x * 128u + lt) * 977u % {len}u;\n\
             \x20   for (var s = 0u; s < p.x; s++) {{ i = chain[i]; }}\n\
             \x20   out[wid.x * 128u + lt] = i + pad[(lt * 7u + i) % {words}u];\n\
             }}\n"
        );
        let source = KernelSource {
            name: format!("residency_{shared_kib}k"),
            wgsl,
            entry: "main",
            buffers: vec![Access::Read, Access::ReadWrite],
            params_size: 16,
        };
        let pipeline = pipelines.get_source(ctx, source)?;
        let mut line = format!("{test}: {shared_kib} KiB of workgroup memory, workgroups:");
        for groups in [66u32, 132, 264, 396, 528, 792, 1056, 2112] {
            let replays = 10;
            let t = time_dispatch(ctx, &pipeline, &[400u32, 0, 0, 0], &[&chain, &out], [groups, 1, 1], replays)?;
            line += &format!(" | {groups}: {:.1} us", t * 1e6);
        }
        println!("{line}");
    }
    Ok(())
}

/// What one dispatch costs the forward by itself: a plan of
/// dispatches of a kernel that writes one word per invocation of the buffer they all share (so
/// that each waits for the one before, as the forward's do), timed per dispatch against its
/// workgroups. The forward runs about 21 dispatches a layer; what this costs each is what fusing
/// two of them can save.
pub fn dispatch_overhead_probe(ctx: &GpuContext, _options: &ProbeOptions) -> Result<(), ProbeError> {
    use dg_kernels::{Access, KernelSource};
    let test = "dispatch_overhead_probe";
    let mut pipelines = Pipelines::default();
    let out = ctx.storage_buffer("out", 4096 * 256 * 4)?;
    let wgsl = "@group(0) @binding(0) var<uniform> p: vec4<u32>;\n\
                @group(0) @binding(1) var<storage, read_write> out: array<u32>;\n\
                @compute @workgroup_size(256)\n\
                fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lt: u32) {\n\
                \x20   let i = wid.x * 256u + lt;\n\
                \x20   out[i] = out[i] + p.x;\n\
                }\n";
    let source = KernelSource {
        name: "dispatch_overhead".into(),
        wgsl: wgsl.into(),
        entry: "main",
        buffers: vec![Access::ReadWrite],
        params_size: 16,
    };
    let pipeline = pipelines.get_source(ctx, source)?;
    let mut line = format!("{test}: one dispatch after another, by workgroups of 256:");
    for groups in [1u32, 132, 256, 1024, 4096] {
        let t = time_dispatch(ctx, &pipeline, &[1u32, 0, 0, 0], &[&out], [groups, 1, 1], 200)?;
        line += &format!(" | {groups}: {:.2} us", t * 1e6);
    }
    println!("{line}");
    Ok(())
}

//! Probes of the tensor cores through WGSL cooperative matrices: the decoder's dense products by
//! tile and K split, what bounds a K step, what the operands' traffic costs, the tensor cores'
//! own ceiling and whether a barrier drains the loads in flight. Their variants compute wrong
//! products on purpose; only their times mean something. The generated kernels are validated by
//! naga on every machine (`tests/tensor_cores.rs`).

use dg_gpu::{GpuContext, Pipelines};
use dg_kernels::WeightFormat;
use dg_kernels::coop_gemm::{CoopTile, Staging};
use dg_kernels::coop_grouped_gemm::{self, WPath};

use super::best_time;
use super::{ProbeError, ProbeOptions, replaced, split_into, time_dispatch};
use dg_parity::testing::coop_experts::{Buffers, Case, real_counts};
use dg_parity::testing::{push_product, seeded};

/// The decoder's dense products on the tensor cores by tile and K split: µs per product (partials and their reduction included) and TFLOP/s; and how a
/// 64×64 tile's time grows with the number of workgroups (flat while the multiprocessors have room:
/// its first value over the K steps is one step's latency).
pub fn dense_tensor_core_throughput_by_tile_and_split(ctx: &GpuContext, _options: &ProbeOptions) -> Result<(), ProbeError> {
    use dg_kernels::coop_gemm::{self, BLayout};
    use dg_kernels::gemm::GemmParams;
    use dg_kernels::split_k;
    let test = "dense_tensor_core_throughput_by_tile_and_split";
    let mut pipelines = Pipelines::default();
    let scratch = ctx.storage_buffer("split partials", 64 << 20)?;
    // Times the product (and returns C of its last run).
    let time =
        |pipelines: &mut Pipelines, tile: CoopTile, path: WPath, p: GemmParams, splits: u32| -> Result<(f64, Vec<f32>), ProbeError> {
            let a = ctx.upload("a", &seeded((p.m * p.k) as usize, 71, 1.0))?;
            let b = ctx.upload("b", &dg_kernels::pack_f16(&seeded((p.n * p.k) as usize, 72, 1.0)))?;
            let c = ctx.storage_buffer("c", u64::from(p.m * p.n) * 4)?;
            let kernel = pipelines.get_source(ctx, coop_gemm::source_for(tile, path, WeightFormat::F16, BLayout::Nk))?;
            let reduce = pipelines.get_source(ctx, split_k::source())?;
            let split = split_into(tile, p.k, splits);
            let replays = 50;
            let mut plan = dg_gpu::PlanBuilder::new(ctx);
            for _ in 0..replays {
                push_product(&mut plan, (&kernel, &reduce), tile, &p, split, [&a, &b, &scratch, &c]);
            }
            let best = best_time(ctx, &plan.finish(ctx)?, replays);
            Ok((best, ctx.read_f32(&c, 0, (p.m * p.n) as usize)?))
        };
    let big = coop_gemm::TILE_128X128;
    let tiles = [
        coop_gemm::TILE_64X64,
        coop_gemm::TILE_64X64.with_depth(2),
        coop_gemm::TILE_64X128,
        big.with_depth(1),
        big.with_depth(2),
        big.with_depth(3),
        big.with_depth(4),
        coop_gemm::TILE_32X64,
    ];
    let shapes = [
        ("q", 256, 4096, 2816),
        ("o", 256, 2816, 4096),
        ("mlp gate_up", 256, 4224, 2816),
        ("mlp down", 256, 2816, 2112),
        ("router", 256, 128, 2816),
    ];
    for (name, m, n, k) in shapes {
        let p = GemmParams::linear(m, n, k);
        let mut wholes = std::collections::HashMap::new();
        for tile in tiles {
            if !tile.fits(m, n, k) || tile.dense_shared_bytes() > ctx.limits.max_compute_workgroup_storage_size {
                continue;
            }
            let flops = 2.0 * f64::from(m) * f64::from(n) * f64::from(k);
            let mut line = format!("{test}: {name} {m}x{n}x{k} [{}]", tile.label());
            let mut whole = Vec::new();
            for splits in [1, 2, 4, 8, 16, 32] {
                if k / tile.bk / splits < 2 || u64::from(splits * m * n) * 4 > scratch.size() {
                    continue;
                }
                let (t, c) = time(&mut pipelines, tile, WPath::Staged, p, splits)?;
                if splits == 1 {
                    whole = c;
                }
                line += &format!(" | {splits}: {:.1} us {:.0} TF", t * 1e6, flops / t / 1e12);
            }
            // W straight from the buffer: the same products in the same order, so the same C.
            let (t, direct) = time(&mut pipelines, tile, WPath::Direct, p, 1)?;
            assert!(direct == whole, "{name} [{}]: direct W fragments changed C", tile.label());
            let shallow = wholes.entry(tile.with_depth(1).label()).or_insert(whole);
            assert!(direct == *shallow, "{name} [{}]: a deeper ring changed C", tile.label());
            line += &format!(" | direct: {:.1} us {:.0} TF", t * 1e6, flops / t / 1e12);
            println!("{line}");
        }
    }
    let k = 2816;
    for path in [WPath::Staged, WPath::Direct] {
        let mut line = format!("{test}: 64x64 tile {path:?}, k {k} ({} steps), workgroups:", k / 32);
        for tiles_n in [1u32, 16, 66, 132, 264, 528, 1056, 2112] {
            let (t, _) = time(&mut pipelines, coop_gemm::TILE_64X64, path, GemmParams::linear(64, 64 * tiles_n, k), 1)?;
            line += &format!(" | {tiles_n}: {:.1} us", t * 1e6);
        }
        println!("{line}");
    }
    Ok(())
}

/// What bounds a tensor-core workgroup's K step: the 64×64 tile's
/// time over 88 K steps against its number of workgroups, for the kernel as it is and for variants
/// that each take one part away: no global loads in the loop (every step restages the registers of
/// step 0), no matrix products (loads and staging only), only A's or only W's loads, scalar f16
/// staging instead of vec4s, one subgroup of 64×64 per workgroup instead of four of 32×32. The variants compute wrong products;
/// only their times mean something.
pub fn tensor_core_step_ceiling_probe(ctx: &GpuContext, _options: &ProbeOptions) -> Result<(), ProbeError> {
    use dg_kernels::KernelSource;
    use dg_kernels::coop_gemm::{self, BLayout};
    use dg_kernels::gemm::GemmParams;
    let test = "tensor_core_step_ceiling_probe";
    let mut pipelines = Pipelines::default();
    let k = 2816u32;
    let base = coop_gemm::source_for(coop_gemm::TILE_64X64, WPath::Staged, WeightFormat::F16, BLayout::Nk);
    let renamed = |name: &str, wgsl: String| KernelSource { name: format!("{}_{name}", base.name), wgsl, ..base.clone() };
    let no_loads = base.wgsl.replace("a[a_src[l] + ka]", "ra[l]").replace("load_w(w_src[l] + (s + 1u) * w_step)", "rw[l]");
    assert!(no_loads != base.wgsl, "the loop's loads were not found");
    let a_loads_only = base.wgsl.replace("load_w(w_src[l] + (s + 1u) * w_step)", "rw[l]");
    let w_loads_only = base.wgsl.replace("a[a_src[l] + ka]", "ra[l]");
    let no_products: String = base.wgsl.lines().filter(|line| !line.contains("coopMultiplyAdd")).map(|line| format!("{line}\n")).collect();
    let scalar = CoopTile { staging: Staging::Scalar, ..coop_gemm::TILE_64X64 };
    let one_subgroup = CoopTile { wm: 64, wn: 64, ..coop_gemm::TILE_64X64 };
    let variants: Vec<(&str, CoopTile, KernelSource)> = vec![
        ("as is", coop_gemm::TILE_64X64, base.clone()),
        ("no global loads in the loop", coop_gemm::TILE_64X64, renamed("noloads", no_loads)),
        ("no matrix products", coop_gemm::TILE_64X64, renamed("noproducts", no_products)),
        ("A's loads only (8 KB a step, shared by every workgroup)", coop_gemm::TILE_64X64, renamed("aonly", a_loads_only)),
        ("W's loads only (4 KB a step)", coop_gemm::TILE_64X64, renamed("wonly", w_loads_only)),
        ("scalar staging", scalar, coop_gemm::source_for(scalar, WPath::Staged, WeightFormat::F16, BLayout::Nk)),
        ("one subgroup of 64x64", one_subgroup, coop_gemm::source_for(one_subgroup, WPath::Staged, WeightFormat::F16, BLayout::Nk)),
    ];
    let max_tiles = 2112u32;
    let a = ctx.upload("a", &seeded((64 * k) as usize, 81, 1.0))?;
    let b = ctx.upload("b", &dg_kernels::pack_f16(&seeded((64 * max_tiles * k) as usize, 82, 1.0)))?;
    let c = ctx.storage_buffer("c", u64::from(64 * 64 * max_tiles) * 4)?;
    for (what, tile, source) in variants {
        let pipeline = pipelines.get_source(ctx, source)?;
        let mut line = format!("{test}: {what} [{}]:", tile.label());
        for tiles in [1u32, 66, 132, 264, 528, 1056, 2112] {
            let p = GemmParams::linear(64, 64 * tiles, k);
            let replays = 20;
            let best = time_dispatch(ctx, &pipeline, &p, &[&a, &b, &c], coop_gemm::workgroups(tile, p.m, p.n, 1), replays)?;
            let steps_per_us = f64::from(tiles * (k / 32)) / (best * 1e6);
            line += &format!(" | {tiles}: {:.1} us ({steps_per_us:.0} steps/us)", best * 1e6);
        }
        println!("{line}");
    }
    Ok(())
}

/// What the operands' traffic costs: the q projection's shape
/// (256 × 4096 × 2816) on the 64×64 and 128×128 tiles, and the experts' gate/up (1408 × 2816 over a
/// real routing) on their 32×128 direct tile, each as is and with A read as f16 (half its bytes),
/// W read in tile-major K panels (each workgroup's W one contiguous run), both, or one operand's
/// loop loads removed. The variants read the same buffers with other index maps, so their products
/// are wrong; only their times mean something.
pub fn tensor_core_operand_traffic_probe(ctx: &GpuContext, _options: &ProbeOptions) -> Result<(), ProbeError> {
    use dg_kernels::coop_gemm::{self, BLayout};
    use dg_kernels::gemm::GemmParams;
    use dg_kernels::split_k;
    let test = "tensor_core_operand_traffic_probe";
    let mut pipelines = Pipelines::default();
    let f16_a: &[(&str, &str)] = &[
        ("var<storage, read> a: array<vec4<f32>>", "var<storage, read> a: array<vec4<f16>>"),
        ("var ra: array<vec4<f32>, LA>", "var ra: array<vec4<f16>, LA>"),
    ];
    let no_a: &[(&str, &str)] = &[("a[a_src[l] + ka]", "ra[l]")];

    // Dense: the decoder's projections, W in COPIES copies used in turn (more than L2 holds, so
    // that W streams from DRAM as in the forward).
    const COPIES: u32 = 8;
    let scratch = ctx.storage_buffer("split partials", 64 << 20)?;
    let staged_panel: &[(&str, &str)] = &[
        ("let w_step = BK4;", "let w_step = BN * BK4;"),
        (
            "w_src[l] = w_base + (n0 + e / BK4) * (p.b_cs / 4u) + e % BK4 + s0 * w_step;",
            "w_src[l] = w_base + n0 * (p.k / 4u) + e + s0 * w_step;",
        ),
    ];
    let direct_panel: &[(&str, &str)] = &[
        ("let w_step = BK4;", "let w_step = BN * BK4;"),
        ("let stride_w = p.b_cs / 4u;", "let stride_w = BK4;"),
        ("let w_sub = w_base + (n0 + sn) * stride_w + s0 * w_step;", "let w_sub = w_base + n0 * (p.k / 4u) + sn * BK4 + s0 * w_step;"),
    ];
    for (name, m, n, k) in [("q", 256u32, 4096u32, 2816u32), ("o", 256, 2816, 4096), ("mlp down", 256, 2816, 2112)] {
        let a = ctx.upload("a", &seeded((m * k) as usize, 91, 1.0))?;
        let b = ctx.upload("b", &dg_kernels::pack_f16(&seeded((COPIES * n * k) as usize, 92, 1.0)))?;
        let c = ctx.storage_buffer("c", u64::from(m * n) * 4)?;
        let flops = 2.0 * f64::from(m) * f64::from(n) * f64::from(k);
        for (tile, splits) in [(coop_gemm::TILE_64X64, 1u32), (coop_gemm::TILE_64X64, 2), (coop_gemm::TILE_128X128, 4)] {
            if tile.dense_shared_bytes() > ctx.limits.max_compute_workgroup_storage_size {
                continue;
            }
            let staged = coop_gemm::source_for(tile, WPath::Staged, WeightFormat::F16, BLayout::Nk);
            let direct = coop_gemm::source_for(tile, WPath::Direct, WeightFormat::F16, BLayout::Nk);
            let both: Vec<(&str, &str)> = staged_panel.iter().chain(f16_a).copied().collect();
            let variants = [
                ("as is", staged.clone()),
                ("f16 A", replaced(&staged, "f16a", f16_a)),
                ("W panels", replaced(&staged, "panel", staged_panel)),
                ("W panels + f16 A", replaced(&staged, "panel_f16a", &both)),
                ("direct", direct.clone()),
                ("direct W panels", replaced(&direct, "panel", direct_panel)),
            ];
            let split = split_into(tile, k, splits);
            let reduce = pipelines.get_source(ctx, split_k::source())?;
            let mut line = format!("{test}: {name} {m}x{n}x{k} [{} split {splits}]", tile.label());
            for (what, source) in variants {
                let kernel = pipelines.get_source(ctx, source)?;
                let replays = 48;
                let mut plan = dg_gpu::PlanBuilder::new(ctx);
                for r in 0..replays {
                    let p = GemmParams { b_offset: (r % COPIES) * n * k, ..GemmParams::linear(m, n, k) };
                    push_product(&mut plan, (&kernel, &reduce), tile, &p, split, [&a, &b, &scratch, &c]);
                }
                let t = best_time(ctx, &plan.finish(ctx)?, replays);
                line += &format!(" | {what}: {:.1} us {:.0} TF", t * 1e6, flops / t / 1e12);
            }
            println!("{line}");
        }
    }

    // Experts: gate/up over a real routing, 32×128 direct.
    let case = Case { n: 1408, k: 2816, counts: real_counts(99), gather: true };
    let x = case.inputs(93);
    let bufs = Buffers::upload(ctx, &x, coop_grouped_gemm::PANEL);
    let tile_major: &[(&str, &str)] = &[
        ("let w_first = g * (p.b_group_stride / 4u) + n0 * BK4;", "let w_first = g * (p.b_group_stride / 4u) + n0 * (p.k / 4u);"),
        ("let w_step = p.n * BK4;", "let w_step = BN * BK4;"),
    ];
    let w_cached: &[(&str, &str)] = &[("let w_next = w_sub + min(s + 1u, steps - 1u) * w_step;", "let w_next = w_sub;")];
    let both: Vec<(&str, &str)> = tile_major.iter().chain(f16_a).copied().collect();
    for tile in [coop_grouped_gemm::TILE_32X128, CoopTile::vec4(32, 128, 64, 32, 32)] {
        let grouped = coop_grouped_gemm::source_with(tile, WPath::Direct);
        let variants = [
            ("as is", grouped.clone()),
            ("f16 A", replaced(&grouped, "f16a", f16_a)),
            ("tile-major W", replaced(&grouped, "tilemajor", tile_major)),
            ("tile-major W + f16 A", replaced(&grouped, "tilemajor_f16a", &both)),
            ("no A loads", replaced(&grouped, "noa", no_a)),
            ("W from cache", replaced(&grouped, "wcached", w_cached)),
        ];
        let mut line = format!("{test}: experts gate_up [{} direct]", tile.label());
        for (what, source) in variants {
            let pipeline = pipelines.get_source(ctx, source)?;
            let replays = 50;
            let buffers = [&bufs.a, &bufs.w.buffer, &bufs.offsets, &bufs.rows, &bufs.c];
            let t = time_dispatch(ctx, &pipeline, &x.params, &buffers, coop_grouped_gemm::workgroups(tile, &x.params), replays)?;
            line += &format!(" | {what}: {:.1} us {:.0} GB/s of W", t * 1e6, (128 * 1408 * 2816 * 2) as f64 / t / 1e9);
        }
        println!("{line}");
    }
    Ok(())
}

/// The tensor cores' own ceiling through WGSL cooperative matrices: subgroups that only multiply (fragments loaded once from workgroup memory,
/// `acc` independent accumulators each, 4 subgroups a workgroup), then with the A and B fragments
/// reloaded from workgroup memory before every product, then with a workgroup barrier every
/// iteration as well (the GEMMs' K loop has one a step); TFLOP/s by workgroups.
pub fn tensor_core_peak_probe(ctx: &GpuContext, _options: &ProbeOptions) -> Result<(), ProbeError> {
    use dg_kernels::{Access, KernelSource};
    let test = "tensor_core_peak_probe";
    let mut pipelines = Pipelines::default();
    let iters = 2048u32;
    let seed = ctx.upload("seed", &[0.01f32; 4])?;
    let max_groups = 132u32 * 8;
    let out = ctx.storage_buffer("out", u64::from(max_groups * 4 * 8 * 256) * 4)?;
    for (label, reload, barrier) in
        [("multiply only", false, false), ("fragments reloaded", true, false), ("reloaded + barrier", true, true)]
    {
        for acc in [1u32, 4, 8] {
            let source = KernelSource {
                name: format!("peak_{acc}_{reload}_{barrier}"),
                wgsl: peak_probe_wgsl(acc, reload, barrier),
                entry: "main",
                buffers: vec![Access::Read, Access::ReadWrite],
                params_size: 16,
            };
            let pipeline = pipelines.get_source(ctx, source)?;
            let mut line = format!("{test}: {label}, {acc} accumulators a subgroup, workgroups:");
            for groups in [132u32, 264, 528, 1056] {
                let replays = 5;
                let t = time_dispatch(ctx, &pipeline, &[iters, 0, 0, 0], &[&seed, &out], [groups, 1, 1], replays)?;
                let flops = f64::from(groups) * 4.0 * f64::from(acc) * f64::from(iters) * 8192.0;
                line += &format!(" | {groups}: {:.0} TFLOP/s", flops / t / 1e12);
            }
            println!("{line}");
        }
    }
    Ok(())
}

/// The peak probe's kernel: `acc` accumulators per subgroup (at most 8; the output holds 8 per
/// subgroup of up to 1056 workgroups), fragments reloaded from workgroup memory every iteration
/// or not, a barrier every iteration or not.
pub fn peak_probe_wgsl(acc: u32, reload: bool, barrier: bool) -> String {
    assert!((1..=8).contains(&acc));
    let decls: String = (0..acc).map(|i| format!("    var acc{i} = coop_mat16x16<f32, C>();\n")).collect();
    let load = "        let fa = coopLoad<coop_mat16x16<f16, A>>(&sa[(s % 2u) * 256u], 16u);\n        let fb = coopLoad<coop_mat16x16<f16, B>>(&sa[256u - (s % 2u) * 256u], 16u);\n";
    let products: String = (0..acc).map(|i| format!("        acc{i} = coopMultiplyAdd(fa, fb, acc{i});\n")).collect();
    let stores: String = (0..acc)
        .map(|i| format!("    let o{i} = ((wid.x * 4u + lt / 32u) * 8u + {i}u) * 256u;\n    coopStore(acc{i}, &out[o{i}], 16u);\n"))
        .collect();
    format!(
        "enable f16;\nenable wgpu_cooperative_matrix;\n\
         @group(0) @binding(0) var<uniform> p: vec4<u32>;\n\
         @group(0) @binding(1) var<storage, read> seed: array<f32>;\n\
         @group(0) @binding(2) var<storage, read_write> out: array<f32>;\n\
         var<workgroup> sa: array<f16, 512>;\n\
         @compute @workgroup_size(128)\n\
         fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lt: u32) {{\n\
         \x20   for (var i = lt; i < 512u; i += 128u) {{ sa[i] = f16(seed[0] * f32(i % 7u)); }}\n\
         \x20   workgroupBarrier();\n\
         {decls}\
         \x20   let fa0 = coopLoad<coop_mat16x16<f16, A>>(&sa[0], 16u);\n\
         \x20   let fb0 = coopLoad<coop_mat16x16<f16, B>>(&sa[256], 16u);\n\
         \x20   for (var s = 0u; s < p.x; s++) {{\n\
         {}\
         {products}\
         {}\
         \x20   }}\n\
         {stores}\
         }}\n",
        if reload { load.to_string() } else { "        let fa = fa0;\n        let fb = fb0;\n".to_string() },
        if barrier { "        workgroupBarrier();\n" } else { "" },
    )
}

/// Whether a workgroup barrier waits for global loads still in flight: a loop of 4 fragment products per subgroup that issues one vec4 load from a
/// 64 MiB buffer each iteration and consumes it `distance` iterations later, with and without a
/// barrier each iteration; µs per iteration at 264 workgroups (two a multiprocessor). Loads that
/// stay in flight across barriers cost the same with and without them.
pub fn barrier_drain_probe(ctx: &GpuContext, _options: &ProbeOptions) -> Result<(), ProbeError> {
    use dg_kernels::{Access, KernelSource};
    let test = "barrier_drain_probe";
    let mut pipelines = Pipelines::default();
    let iters = 1024u32;
    let data = ctx.upload("data", &vec![0.001f32; (DRAIN_PROBE_VEC4S * 4) as usize])?;
    let groups = DRAIN_PROBE_GROUPS;
    let out = ctx.storage_buffer("out", u64::from(drain_probe_sums_at(groups) + groups * 128) * 4)?;
    for &(label, loads, distance, barrier) in DRAIN_PROBE_CASES {
        let source = KernelSource {
            name: format!("drain_{loads:?}_{distance}_{barrier}"),
            wgsl: drain_probe_wgsl(loads, distance, barrier, groups),
            entry: "main",
            buffers: vec![Access::Read, Access::ReadWrite],
            params_size: 16,
        };
        let pipeline = pipelines.get_source(ctx, source)?;
        let replays = 5;
        let t = time_dispatch(ctx, &pipeline, &[iters, 0, 0, 0], &[&data, &out], [groups, 1, 1], replays)?;
        println!("{test}: {label}: {:.3} us per iteration", t * 1e6 / f64::from(iters));
    }
    Ok(())
}

/// The drain probe's loads: none, one scattered vec4 per invocation per iteration (each in its own
/// sector), or contiguous (each workgroup streams its own run, 2 KiB an iteration, as a GEMM's
/// panel of W).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum DrainLoads {
    None,
    Scattered,
    Contiguous,
}

/// The drain probe's cases: label, loads, the distance from a load to its use, a barrier every
/// iteration or not.
pub const DRAIN_PROBE_CASES: &[(&str, DrainLoads, u32, bool)] = &[
    ("products only", DrainLoads::None, 1, false),
    ("products + barrier", DrainLoads::None, 1, true),
    ("scattered loads consumed 1 later, no barrier", DrainLoads::Scattered, 1, false),
    ("scattered loads consumed 1 later, barrier", DrainLoads::Scattered, 1, true),
    ("scattered loads consumed 4 later, no barrier", DrainLoads::Scattered, 4, false),
    ("scattered loads consumed 4 later, barrier", DrainLoads::Scattered, 4, true),
    ("contiguous loads consumed 1 later, barrier", DrainLoads::Contiguous, 1, true),
    ("contiguous loads consumed 2 later, barrier", DrainLoads::Contiguous, 2, true),
    ("contiguous loads consumed 4 later, barrier", DrainLoads::Contiguous, 4, true),
];

/// vec4s of the probe's data (64 MiB).
pub const DRAIN_PROBE_VEC4S: u32 = 4 << 20;

/// Workgroups of the probe (two a multiprocessor of a 132-SM H200).
pub const DRAIN_PROBE_GROUPS: u32 = 264;

/// Where the per-invocation sums start in the output: after four 16×16 accumulators for each of
/// the four subgroups of every workgroup.
pub fn drain_probe_sums_at(groups: u32) -> u32 {
    groups * 4 * 4 * 256
}

/// The drain probe's kernel for `groups` workgroups.
pub fn drain_probe_wgsl(loads: DrainLoads, distance: u32, barrier: bool, groups: u32) -> String {
    let len = DRAIN_PROBE_VEC4S;
    // The vec4 an invocation loads at iteration `it` (a WGSL expression).
    let at = |it: &str| match loads {
        DrainLoads::Contiguous => format!("((wid.x * (p.x + {distance}u) + {it}) * 128u + lt) % {len}u"),
        _ => format!("(g * 977u + {it} * 4099u) % {len}u"),
    };
    let ring: String = (0..distance).map(|i| format!("    var r{i} = data[{}];\n", at(&format!("{i}u")))).collect();
    let rotate: String = (0..distance.saturating_sub(1)).map(|i| format!("        r{i} = r{};\n", i + 1)).collect();
    let body_loads = if loads == DrainLoads::None {
        String::new()
    } else {
        format!(
            "        let nx = data[{}];\n        sum += r0;\n{rotate}        r{} = nx;\n",
            at(&format!("(s + {distance}u)")),
            distance - 1
        )
    };
    format!(
        "enable f16;\nenable wgpu_cooperative_matrix;\n\
         @group(0) @binding(0) var<uniform> p: vec4<u32>;\n\
         @group(0) @binding(1) var<storage, read> data: array<vec4<f32>>;\n\
         @group(0) @binding(2) var<storage, read_write> out: array<f32>;\n\
         var<workgroup> sa: array<f16, 512>;\n\
         @compute @workgroup_size(128)\n\
         fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lt: u32) {{\n\
         \x20   let g = wid.x * 128u + lt;\n\
         \x20   for (var i = lt; i < 512u; i += 128u) {{ sa[i] = f16(f32(i % 7u) * 0.01); }}\n\
         \x20   workgroupBarrier();\n\
         \x20   var acc0 = coop_mat16x16<f32, C>();\n    var acc1 = coop_mat16x16<f32, C>();\n    var acc2 = coop_mat16x16<f32, C>();\n    var acc3 = coop_mat16x16<f32, C>();\n\
         \x20   var sum = vec4<f32>();\n\
         {ring}\
         \x20   for (var s = 0u; s < p.x; s++) {{\n\
         \x20       let fa = coopLoad<coop_mat16x16<f16, A>>(&sa[(s % 2u) * 256u], 16u);\n\
         \x20       let fb = coopLoad<coop_mat16x16<f16, B>>(&sa[256u - (s % 2u) * 256u], 16u);\n\
         \x20       acc0 = coopMultiplyAdd(fa, fb, acc0);\n        acc1 = coopMultiplyAdd(fa, fb, acc1);\n        acc2 = coopMultiplyAdd(fa, fb, acc2);\n        acc3 = coopMultiplyAdd(fa, fb, acc3);\n\
         {body_loads}\
         {}\
         \x20   }}\n\
         \x20   let o = (wid.x * 4u + lt / 32u) * 1024u;\n\
         \x20   coopStore(acc0, &out[o], 16u);\n    coopStore(acc1, &out[o + 256u], 16u);\n    coopStore(acc2, &out[o + 512u], 16u);\n    coopStore(acc3, &out[o + 768u], 16u);\n\
         \x20   out[{}u + g] = sum.x + sum.y + sum.z + sum.w;\n\
         }}\n",
        if barrier { "        workgroupBarrier();\n" } else { "" },
        drain_probe_sums_at(groups),
    )
}

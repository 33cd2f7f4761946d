//! The tensor-core GEMM (`dg_kernels::coop_gemm`) on a device with cooperative
//! matrices: parity against an exact CPU reference on the decoder's 256-row shapes, and (ignored
//! by default) its throughput.
//!
//! These tests open their own device, with `Features::EXPERIMENTAL_COOPERATIVE_MATRIX` and
//! `Features::SHADER_F16` (the former needs `ExperimentalFeatures::enabled()`, an unsafe opt-in)
//! and the adapter's full limits (the tiles use up to 40 KiB of workgroup memory). An adapter
//! without the features, without a 16×16×16 f16 → f32 configuration or with subgroups other than
//! 32 wide prints a visible SKIP and the test passes (lavapipe, for one). The adapter is picked as
//! dg picks it (a discrete GPU first; `DG_ADAPTER` selects one by name).
//!
//! Throughput: `cargo test -p dg-gpu --test coop_gemm --release -- --include-ignored --nocapture`.
//! The GPU tests of this file run one at a time (a lock), so the timings are not shared.

use std::sync::Mutex;
use std::time::Instant;

use dg_gpu::testing::{max_rel_err, seeded};
use dg_kernels::coop_gemm::{self, CoopTile, Staging, TILES};
use dg_kernels::gemm::GemmParams;
use wgpu::util::DeviceExt;

/// The decoder's 256-row linear layers the kernel is measured on, `(m, n, k)`.
const SHAPES: [(u32, u32, u32); 2] = [(256, 4096, 2816), (256, 2816, 4096)];

/// Value written around and into the output before a run, so that a missed or stray write shows.
const GUARD: f32 = -7.777e17;
/// Elements of guard band after the output.
const GUARD_LEN: usize = 64;

/// Dispatches per timed submission.
const REPLAYS: u32 = 100;
/// Timed submissions per (shape, tile); the best and the median are reported.
const TRIALS: usize = 5;

/// Serialises the GPU tests of this file.
static GPU: Mutex<()> = Mutex::new(());

/// Tolerance on max |C − C_ref| / max |C_ref| against the exact (f64) product of the f16-rounded
/// inputs. Products of two f16 values are exact in f32 (11-bit significands), so the only error is
/// the f32 accumulation of k of them: about ε·√k of the largest output on random data, with the
/// tensor cores adding fragment by fragment and possibly truncating rather than rounding their
/// partial sums (ε = 2⁻²³ rather than 2⁻²⁴). 16·ε·√k (1.2e-4 at k = 4096) leaves a wide margin
/// while any indexing or staging bug gives errors of order 1.
fn tolerance(k: u32) -> f32 {
    16.0 * f32::EPSILON * (k as f32).sqrt()
}

/// Bound on the error against the f64 product of the f32 activations (not rounded) with the
/// f16-rounded weights: what rounding the activations to f16 costs, ~2⁻¹² relative per element,
/// a random walk over k (printed; the bound only catches a conversion gone badly wrong).
const ACTIVATION_ROUNDING_BOUND: f32 = 1e-2;

/// The device with cooperative matrices.
struct Coop {
    device: wgpu::Device,
    queue: wgpu::Queue,
    limits: wgpu::Limits,
}

fn rank(t: wgpu::DeviceType) -> u8 {
    match t {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Other => 3,
        wgpu::DeviceType::Cpu => 4,
    }
}

/// Opens the device, or prints a SKIP line saying why not and returns `None`.
fn open(test: &str) -> Option<Coop> {
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle());
    let mut adapters = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all()));
    adapters.sort_by_key(|a| rank(a.get_info().device_type));
    let wanted = std::env::var("DG_ADAPTER").ok().filter(|s| !s.is_empty()).map(|s| s.to_lowercase());
    let adapter = match &wanted {
        Some(w) => adapters.into_iter().find(|a| a.get_info().name.to_lowercase().contains(w)),
        None => adapters.into_iter().next(),
    };
    let Some(adapter) = adapter else {
        eprintln!("SKIP {test}: no adapter");
        return None;
    };
    let info = adapter.get_info();
    let features = wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX | wgpu::Features::SHADER_F16;
    let missing = features - adapter.features();
    if !missing.is_empty() {
        eprintln!("SKIP {test}: adapter {} ({:?}) lacks {missing:?}", info.name, info.backend);
        return None;
    }
    let props = adapter.cooperative_matrix_properties();
    eprintln!("{test}: adapter {} ({:?}, driver {} {}), subgroups {}..={}", info.name, info.backend, info.driver, info.driver_info, info.subgroup_min_size, info.subgroup_max_size);
    for p in &props {
        eprintln!(
            "  cooperative matrix {}x{}x{} {:?} -> {:?}{}",
            p.m_size,
            p.n_size,
            p.k_size,
            p.ab_type,
            p.cr_type,
            if p.saturating_accumulation { " (saturating)" } else { "" }
        );
    }
    let f16_f32 = props.iter().any(|p| {
        (p.m_size, p.n_size, p.k_size) == (16, 16, 16)
            && p.ab_type == wgpu::CooperativeScalarType::F16
            && p.cr_type == wgpu::CooperativeScalarType::F32
    });
    if !f16_f32 {
        eprintln!("SKIP {test}: no 16x16x16 f16 -> f32 cooperative matrix configuration");
        return None;
    }
    if (info.subgroup_min_size, info.subgroup_max_size) != (coop_gemm::SUBGROUP_SIZE, coop_gemm::SUBGROUP_SIZE) {
        eprintln!("SKIP {test}: subgroups of {}..={} invocations, the kernel needs exactly 32", info.subgroup_min_size, info.subgroup_max_size);
        return None;
    }
    let limits = adapter.limits();
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        label: Some("coop_gemm"),
        required_features: features,
        required_limits: limits.clone(),
        // SAFETY: the experimental cooperative-matrix feature is the subject of these tests; any
        // misbehaviour shows up as a failed parity check or a lost device, within this process.
        experimental_features: unsafe { wgpu::ExperimentalFeatures::enabled() },
        ..Default::default()
    }))
    .unwrap_or_else(|e| panic!("{test}: opening {} with {features:?}: {e}", info.name));
    Some(Coop { device, queue, limits })
}

/// A compiled tile variant.
struct Kernel {
    tile: CoopTile,
    layout: wgpu::BindGroupLayout,
    pipeline: wgpu::ComputePipeline,
}

/// Why a tile does not run on this device, if it does not.
fn unfit(dev: &Coop, tile: CoopTile) -> Option<String> {
    if tile.dense_shared_bytes() > dev.limits.max_compute_workgroup_storage_size {
        return Some(format!("{} bytes of workgroup memory, limit {}", tile.dense_shared_bytes(), dev.limits.max_compute_workgroup_storage_size));
    }
    if tile.invocations() > dev.limits.max_compute_invocations_per_workgroup {
        return Some(format!("{} invocations, limit {}", tile.invocations(), dev.limits.max_compute_invocations_per_workgroup));
    }
    None
}

/// Compiles `tile`; a validation or internal (driver) error comes back as `Err`.
fn compile(dev: &Coop, tile: CoopTile) -> Result<Kernel, String> {
    let source = coop_gemm::source(tile);
    let internal = dev.device.push_error_scope(wgpu::ErrorFilter::Internal);
    let validation = dev.device.push_error_scope(wgpu::ErrorFilter::Validation);
    let mut entries = vec![wgpu::BindGroupLayoutEntry {
        binding: 0,
        visibility: wgpu::ShaderStages::COMPUTE,
        ty: wgpu::BindingType::Buffer { ty: wgpu::BufferBindingType::Uniform, has_dynamic_offset: false, min_binding_size: None },
        count: None,
    }];
    for (i, access) in source.buffers.iter().enumerate() {
        entries.push(wgpu::BindGroupLayoutEntry {
            binding: i as u32 + 1,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Storage { read_only: *access == dg_kernels::Access::Read },
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        });
    }
    let layout = dev.device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor { label: Some(&source.name), entries: &entries });
    let pipeline_layout = dev.device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
        label: Some(&source.name),
        bind_group_layouts: &[Some(&layout)],
        immediate_size: 0,
    });
    let desc = wgpu::ShaderModuleDescriptor { label: Some(&source.name), source: wgpu::ShaderSource::Wgsl(source.wgsl.as_str().into()) };
    // As dg compiles its kernels: bounds checks on, loop bounding off (it stops the K loop from
    // being pipelined).
    // SAFETY: the only loop not unrolled runs over k / bk steps, a count from the uniform
    // parameters, so no loop can run forever.
    let checks = wgpu::ShaderRuntimeChecks { bounds_checks: true, force_loop_bounding: false, ..wgpu::ShaderRuntimeChecks::checked() };
    let module = unsafe { dev.device.create_shader_module_trusted(desc, checks) };
    let pipeline = dev.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some(&source.name),
        layout: Some(&pipeline_layout),
        module: &module,
        entry_point: Some(source.entry),
        compilation_options: Default::default(),
        cache: None,
    });
    let v = pollster::block_on(validation.pop());
    let i = pollster::block_on(internal.pop());
    match v.or(i) {
        Some(e) => Err(e.to_string()),
        None => Ok(Kernel { tile, layout, pipeline }),
    }
}

/// The operands of one shape on the device, and the output with its guard band.
struct Operands {
    m: u32,
    n: u32,
    params: wgpu::Buffer,
    a: wgpu::Buffer,
    w: wgpu::Buffer,
    c: wgpu::Buffer,
}

fn operands(dev: &Coop, (m, n, k): (u32, u32, u32), a: &[f32], w_packed: &[u32]) -> Operands {
    let storage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC;
    let init = |label: &str, contents: &[u8], usage| dev.device.create_buffer_init(&wgpu::util::BufferInitDescriptor { label: Some(label), contents, usage });
    Operands {
        m,
        n,
        params: init("params", bytemuck::bytes_of(&GemmParams::linear(m, n, k)), wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST),
        a: init("a", bytemuck::cast_slice(a), storage),
        w: init("w", bytemuck::cast_slice(w_packed), storage),
        c: init("c", bytemuck::cast_slice(&vec![GUARD; (m * n) as usize + GUARD_LEN]), storage),
    }
}

/// Records `replays` dispatches of `kernel` over `ops` in one compute pass.
fn record(dev: &Coop, kernel: &Kernel, ops: &Operands, replays: u32) -> wgpu::CommandBuffer {
    let bind_group = dev.device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: Some("coop_gemm"),
        layout: &kernel.layout,
        entries: &[
            wgpu::BindGroupEntry { binding: 0, resource: ops.params.as_entire_binding() },
            wgpu::BindGroupEntry { binding: 1, resource: ops.a.as_entire_binding() },
            wgpu::BindGroupEntry { binding: 2, resource: ops.w.as_entire_binding() },
            wgpu::BindGroupEntry { binding: 3, resource: ops.c.as_entire_binding() },
        ],
    });
    let groups = coop_gemm::workgroups(kernel.tile, ops.m, ops.n, 1);
    let mut enc = dev.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("coop_gemm") });
    {
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some("coop_gemm"), timestamp_writes: None });
        pass.set_pipeline(&kernel.pipeline);
        pass.set_bind_group(0, &bind_group, &[]);
        for _ in 0..replays {
            pass.dispatch_workgroups(groups[0], groups[1], groups[2]);
        }
    }
    enc.finish()
}

fn wait(dev: &Coop) {
    dev.device.poll(wgpu::PollType::wait_indefinitely()).expect("waiting for the GPU");
}

/// Resets C to the guard value, runs the kernel once and reads C back (guard band checked).
fn run_once(dev: &Coop, kernel: &Kernel, ops: &Operands) -> Vec<f32> {
    let len = (ops.m * ops.n) as usize;
    dev.queue.write_buffer(&ops.c, 0, bytemuck::cast_slice(&vec![GUARD; len + GUARD_LEN]));
    dev.queue.submit(Some(record(dev, kernel, ops, 1)));
    let bytes = ((len + GUARD_LEN) * 4) as u64;
    let staging = dev.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("readback"),
        size: bytes,
        usage: wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::MAP_READ,
        mapped_at_creation: false,
    });
    let mut enc = dev.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("readback") });
    enc.copy_buffer_to_buffer(&ops.c, 0, &staging, 0, bytes);
    dev.queue.submit(Some(enc.finish()));
    let slice = staging.slice(..);
    let (tx, rx) = std::sync::mpsc::channel();
    slice.map_async(wgpu::MapMode::Read, move |r| {
        let _ = tx.send(r);
    });
    wait(dev);
    rx.recv().expect("map callback").expect("mapping the readback");
    let all: Vec<f32> = bytemuck::cast_slice(&slice.get_mapped_range().expect("mapped range")).to_vec();
    staging.unmap();
    if let Some(i) = all[len..].iter().position(|&v| v != GUARD) {
        panic!("out-of-bounds write {i} elements past the end of the {len}-element output");
    }
    all[..len].to_vec()
}

/// The inputs of one shape: activations A `[m, k]` (f32), weights W `[n, k]` packed as f16.
struct Inputs {
    a: Vec<f32>,
    w_packed: Vec<u32>,
    /// W as the kernel sees it (f16 values).
    w_rounded: Vec<f32>,
}

fn inputs((m, n, k): (u32, u32, u32)) -> Inputs {
    let a = seeded((m * k) as usize, 1 + u64::from(n), 1.0);
    let w = seeded((n * k) as usize, 2 + u64::from(k), 1.0);
    let w_packed = dg_kernels::pack_f16(&w);
    let w_rounded = w.iter().map(|&v| round_f16(v)).collect();
    Inputs { a, w_packed, w_rounded }
}

/// Exact references (f64 sums of products that f64 holds exactly), `[m, n]` row-major: the
/// product of the f16-rounded activations with W, and of the f32 activations with W.
fn references((m, n, k): (u32, u32, u32), inp: &Inputs) -> (Vec<f32>, Vec<f32>) {
    let (m, n, k) = (m as usize, n as usize, k as usize);
    let a_rounded: Vec<f32> = inp.a.iter().map(|&v| round_f16(v)).collect();
    let mut rounded = vec![0f32; m * n];
    let mut plain = vec![0f32; m * n];
    let threads = std::thread::available_parallelism().map_or(4, |t| t.get()).min(m);
    let rows_per = m.div_ceil(threads);
    std::thread::scope(|s| {
        for ((chunk_r, chunk_p), r0) in rounded.chunks_mut(rows_per * n).zip(plain.chunks_mut(rows_per * n)).zip((0..m).step_by(rows_per)) {
            let (a, ar, w) = (&inp.a, &a_rounded, &inp.w_rounded);
            s.spawn(move || {
                for (ri, (out_r, out_p)) in chunk_r.chunks_mut(n).zip(chunk_p.chunks_mut(n)).enumerate() {
                    let i = r0 + ri;
                    let (arow, arow_r) = (&a[i * k..(i + 1) * k], &ar[i * k..(i + 1) * k]);
                    for j in 0..n {
                        let wrow = &w[j * k..(j + 1) * k];
                        let (mut sr, mut sp) = ([0f64; 4], [0f64; 4]);
                        for p in (0..k).step_by(4) {
                            for l in 0..4 {
                                sr[l] += f64::from(arow_r[p + l]) * f64::from(wrow[p + l]);
                                sp[l] += f64::from(arow[p + l]) * f64::from(wrow[p + l]);
                            }
                        }
                        out_r[j] = (sr[0] + sr[1] + sr[2] + sr[3]) as f32;
                        out_p[j] = (sp[0] + sp[1] + sp[2] + sp[3]) as f32;
                    }
                }
            });
        }
    });
    (rounded, plain)
}

#[test]
fn coop_gemm_matches_the_exact_product_on_decoder_shapes() {
    let test = "coop_gemm_matches_the_exact_product_on_decoder_shapes";
    let _lock = GPU.lock().unwrap_or_else(|e| e.into_inner());
    let Some(dev) = open(test) else { return };
    let mut failures = Vec::new();
    for shape in SHAPES {
        let (m, n, k) = shape;
        let inp = inputs(shape);
        let (want, want_plain) = references(shape, &inp);
        let ops = operands(&dev, shape, &inp.a, &inp.w_packed);
        let tol = tolerance(k);
        // The plainest staging first: a driver that rejects a variant reports it before the others.
        let mut tiles = TILES.to_vec();
        tiles.sort_by_key(|t| t.staging != Staging::Scalar);
        for tile in tiles {
            let name = format!("{m}x{n}x{k} tile {}", tile.label());
            if !tile.fits(m, n, k) {
                eprintln!("  {name}: does not fit the shape, skipped");
                continue;
            }
            if let Some(why) = unfit(&dev, tile) {
                eprintln!("  {name}: {why}, skipped");
                continue;
            }
            let kernel = match compile(&dev, tile) {
                Ok(kernel) => kernel,
                Err(e) => {
                    eprintln!("  {name}: FAILED to compile: {e}");
                    failures.push(format!("{name}: compile: {e}"));
                    continue;
                }
            };
            let got = run_once(&dev, &kernel, &ops);
            let unwritten = got.iter().filter(|&&v| v == GUARD).count();
            let non_finite = got.iter().filter(|v| !v.is_finite()).count();
            let (err, at) = max_rel_err(&got, &want);
            let (err_plain, _) = max_rel_err(&got, &want_plain);
            eprintln!(
                "  {name}: max rel err {err:.3e} (tolerance {tol:.3e}; at [{}, {}]: {} vs {}), vs f32 activations {err_plain:.3e}, unwritten {unwritten}, non-finite {non_finite}",
                at / n as usize,
                at % n as usize,
                got[at],
                want[at]
            );
            // (A NaN output counts as non-finite, so the error comparisons may ignore NaN.)
            if unwritten > 0 || non_finite > 0 || err > tol || err_plain > ACTIVATION_ROUNDING_BOUND {
                failures.push(format!("{name}: err {err:.3e}, vs f32 activations {err_plain:.3e}, unwritten {unwritten}, non-finite {non_finite}"));
            }
        }
    }
    assert!(failures.is_empty(), "coop gemm failures:\n{}", failures.join("\n"));
}

#[test]
#[ignore = "throughput: run with --include-ignored --nocapture on a GPU with cooperative matrices"]
fn coop_gemm_throughput() {
    let test = "coop_gemm_throughput";
    let _lock = GPU.lock().unwrap_or_else(|e| e.into_inner());
    let Some(dev) = open(test) else { return };
    for shape in SHAPES {
        let (m, n, k) = shape;
        let inp = inputs(shape);
        let ops = operands(&dev, shape, &inp.a, &inp.w_packed);
        let flops = 2.0 * f64::from(m) * f64::from(n) * f64::from(k);
        for &tile in TILES {
            let name = format!("{m}x{n}x{k} tile {}", tile.label());
            if !tile.fits(m, n, k) || unfit(&dev, tile).is_some() {
                continue;
            }
            let kernel = match compile(&dev, tile) {
                Ok(kernel) => kernel,
                Err(e) => {
                    eprintln!("  {name}: FAILED to compile: {e}");
                    continue;
                }
            };
            // Warm-up (pipeline upload, clocks), then TRIALS timed submissions of REPLAYS
            // back-to-back dispatches each (wall clock from submit to the end of the wait).
            dev.queue.submit(Some(record(&dev, &kernel, &ops, REPLAYS)));
            wait(&dev);
            let mut times = Vec::with_capacity(TRIALS);
            for _ in 0..TRIALS {
                let cmd = record(&dev, &kernel, &ops, REPLAYS);
                let t0 = Instant::now();
                dev.queue.submit(Some(cmd));
                wait(&dev);
                times.push(t0.elapsed().as_secs_f64() / f64::from(REPLAYS));
            }
            times.sort_by(f64::total_cmp);
            let (best, median) = (times[0], times[TRIALS / 2]);
            let groups = coop_gemm::workgroups(tile, m, n, 1)[0];
            eprintln!(
                "THROUGHPUT {name} ({groups} workgroups of {}): best {:.4} ms, {:.1} TFLOP/s (median {:.4} ms, {:.1} TFLOP/s)",
                tile.invocations(),
                best * 1e3,
                flops / best / 1e12,
                median * 1e3,
                flops / median / 1e12
            );
        }
    }
}

/// `x` rounded to the nearest f16 (ties to even), as f32.
fn round_f16(x: f32) -> f32 {
    dg_kernels::unpack_f16(&dg_kernels::pack_f16(&[x]), 1)[0]
}

//! `cargo xtask coopmat2-probe FILE.spv...` (a lab experiment): what a GEMM written with `VK_NV_cooperative_matrix2`
//! (workgroup-scope cooperative matrices loaded through tensor layouts, the driver choosing how
//! tiles are staged) reaches on an adapter that offers it, for comparison with dg's own
//! tensor-core tiles on the same shape.
//!
//! The kernels are GLSL (`bench/coopmat2/gemm.comp`) compiled to SPIR-V beforehand
//! (`bench/coopmat2/build.py`: naga cannot express these matrices) and passed through to the
//! driver. Each file's name carries its geometry: `..._bm{BM}_bn{BN}_..._{M}x{N}x{K}.spv`. A
//! kernel computes `C[M, N] = A[M, K] · W[N, K]ᵀ` with A and W in f16 rows and C in f32, as the
//! head does (W the embedding's rows). The device is wgpu's, opened through wgpu-hal with the
//! extension and its features added; an adapter without the extension is an error that says so.

use std::ffi::{CStr, c_void};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, anyhow, bail};
use ash::vk;
use wgpu::hal;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// SPIR-V kernels, each named `..._bm{BM}_bn{BN}_..._{M}x{N}x{K}.spv`.
    files: Vec<PathBuf>,
    /// Dispatches per timed submission (the best of five submissions is reported).
    #[arg(long, default_value_t = 20)]
    replays: u32,
}

const EXTENSION: &CStr = c"VK_NV_cooperative_matrix2";
/// `VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_2_FEATURES_NV` (extension 594), which the
/// `ash` that wgpu-hal builds on predates.
const FEATURES_TYPE: i32 = 1_000_593_000;

/// `VkPhysicalDeviceCooperativeMatrix2FeaturesNV`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct Coopmat2Features {
    s_type: vk::StructureType,
    p_next: *mut c_void,
    workgroup_scope: vk::Bool32,
    flexible_dimensions: vk::Bool32,
    reductions: vk::Bool32,
    conversions: vk::Bool32,
    per_element_operations: vk::Bool32,
    tensor_addressing: vk::Bool32,
    block_loads: vk::Bool32,
}

impl Coopmat2Features {
    fn empty() -> Self {
        Coopmat2Features {
            s_type: vk::StructureType::from_raw(FEATURES_TYPE),
            p_next: std::ptr::null_mut(),
            workgroup_scope: 0,
            flexible_dimensions: 0,
            reductions: 0,
            conversions: 0,
            per_element_operations: 0,
            tensor_addressing: 0,
            block_loads: 0,
        }
    }
}

/// A kernel's geometry, read from its file name.
#[derive(Debug, Clone, Copy)]
struct Geometry {
    bm: u32,
    bn: u32,
    m: u32,
    n: u32,
    k: u32,
}

fn geometry(file: &std::path::Path) -> Result<Geometry> {
    let stem = file.file_stem().and_then(|s| s.to_str()).ok_or_else(|| anyhow!("{}: no file name", file.display()))?;
    let field = |prefix: &str| -> Result<u32> {
        let part = stem
            .split('_')
            .find_map(|p| p.strip_prefix(prefix).filter(|v| v.chars().all(|c| c.is_ascii_digit()) && !v.is_empty()))
            .ok_or_else(|| anyhow!("{}: no `_{prefix}N_` in the name", file.display()))?;
        Ok(part.parse()?)
    };
    let shape = stem.rsplit('_').next().unwrap_or_default();
    let dims: Vec<u32> =
        shape.split('x').map(str::parse).collect::<Result<_, _>>().with_context(|| format!("{}: shape `{shape}`", file.display()))?;
    let [m, n, k] = dims[..] else { bail!("{}: shape `{shape}` is not MxNxK", file.display()) };
    let (bm, bn) = (field("bm")?, field("bn")?);
    if bm == 0 || bn == 0 || !m.is_multiple_of(bm) || !n.is_multiple_of(bn) {
        bail!("{}: a {bm} x {bn} tile does not divide {m} x {n}", file.display());
    }
    Ok(Geometry { bm, bn, m, n, k })
}

pub fn run(args: Args) -> Result<bool> {
    if args.files.is_empty() {
        bail!("no SPIR-V files given");
    }
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle());
    let adapter =
        pollster::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions {
            power_preference: wgpu::PowerPreference::HighPerformance,
            ..Default::default()
        }))
        .context("no adapter")?;
    let info = adapter.get_info();
    println!("adapter: {} ({:?}, driver {})", info.name, info.backend, info.driver_info);
    let features = wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX | wgpu::Features::SHADER_F16 | wgpu::Features::PASSTHROUGH_SHADERS;
    if !adapter.features().contains(features) {
        bail!("{} lacks {:?}", info.name, features - adapter.features());
    }
    let limits = adapter.limits();
    // SAFETY: the hal adapter is only read and used to open a device of its own; the extension
    // and the features are added only where the driver reports them.
    let open = unsafe {
        let hal_adapter = adapter.as_hal::<hal::api::Vulkan>().ok_or_else(|| anyhow!("{} is not a Vulkan adapter", info.name))?;
        let raw = hal_adapter.shared_instance().raw_instance();
        let physical = hal_adapter.raw_physical_device();
        let extensions = raw.enumerate_device_extension_properties(physical)?;
        let offered = extensions.iter().any(|e| e.extension_name_as_c_str() == Ok(EXTENSION));
        if !offered {
            bail!("{} does not offer {}", info.name, EXTENSION.to_string_lossy());
        }
        let mut supported = Coopmat2Features::empty();
        let mut features2 = vk::PhysicalDeviceFeatures2 { p_next: (&raw mut supported).cast(), ..Default::default() };
        raw.get_physical_device_features2(physical, &mut features2);
        println!("{} features: {supported:?}", EXTENSION.to_string_lossy());
        if supported.workgroup_scope == 0 || supported.tensor_addressing == 0 || supported.flexible_dimensions == 0 {
            bail!("{} lacks workgroup scope, flexible dimensions or tensor addressing", info.name);
        }
        let callback = Box::new(move |args: hal::vulkan::CreateDeviceCallbackArgs| {
            args.extensions.push(EXTENSION);
            let chained = Box::leak(Box::new(Coopmat2Features { p_next: args.create_info.p_next.cast_mut(), ..supported }));
            args.create_info.p_next = (chained as *const Coopmat2Features).cast();
        });
        hal_adapter.open_with_callback(features, &limits, &wgpu::MemoryHints::Performance, Some(callback))?
    };
    let desc = wgpu::DeviceDescriptor {
        label: Some("coopmat2 probe"),
        required_features: features,
        required_limits: limits,
        // SAFETY: a probe; its results are checked against the CPU below.
        experimental_features: unsafe { wgpu::ExperimentalFeatures::enabled() },
        ..Default::default()
    };
    // SAFETY: `open` was created from this adapter with these features.
    let (device, queue) = unsafe { adapter.create_device_from_hal(open, &desc)? };
    let mut ok = true;
    for file in &args.files {
        match time_kernel(&device, &queue, file, args.replays) {
            Ok(line) => println!("{line}"),
            Err(e) => {
                println!("{}: error: {e:#}", file.display());
                ok = false;
            }
        }
    }
    Ok(ok)
}

/// Seeded values in [-1, 1) (`dg_parity::testing::seeded`), rounded to f16 as the GPU holds them.
fn seeded_halves(len: usize, seed: u64) -> Vec<f32> {
    dg_parity::testing::seeded(len, seed, 1.0).into_iter().map(|x| half::f16::from_f32(x).to_f32()).collect()
}

fn time_kernel(device: &wgpu::Device, queue: &wgpu::Queue, file: &std::path::Path, replays: u32) -> Result<String> {
    let g = geometry(file)?;
    let bytes = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
    if bytes.len() % 4 != 0 {
        bail!("{}: not whole SPIR-V words", file.display());
    }
    let words: Vec<u32> = bytes.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    let a = seeded_halves((g.m * g.k) as usize, 1);
    let w = seeded_halves((g.n * g.k) as usize, 2);
    use wgpu::util::DeviceExt;
    let a_buf = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
        label: Some("a"),
        contents: bytemuck::cast_slice(&dg_kernels::pack_f16(&a)),
        usage: wgpu::BufferUsages::STORAGE,
    });
    let w_buf = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
        label: Some("w"),
        contents: bytemuck::cast_slice(&dg_kernels::pack_f16(&w)),
        usage: wgpu::BufferUsages::STORAGE,
    });
    let c_bytes = u64::from(g.m) * u64::from(g.n) * 4;
    let c_buf = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("c"),
        size: c_bytes,
        usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    });
    let read = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("c read"),
        size: c_bytes,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let entry = |binding: u32, read_only: bool| wgpu::BindGroupLayoutEntry {
        binding,
        visibility: wgpu::ShaderStages::COMPUTE,
        ty: wgpu::BindingType::Buffer {
            ty: wgpu::BufferBindingType::Storage { read_only },
            has_dynamic_offset: false,
            min_binding_size: None,
        },
        count: None,
    };
    let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
        label: None,
        entries: &[entry(0, true), entry(1, true), entry(2, false)],
    });
    let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
        label: None,
        bind_group_layouts: &[Some(&layout)],
        immediate_size: 0,
    });
    let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
    let module_desc = wgpu::ShaderModuleDescriptorPassthrough {
        label: Some("coopmat2 gemm"),
        entry_points: std::borrow::Cow::Owned(vec![wgpu::PassthroughShaderEntryPoint { name: "main".into(), workgroup_size: (0, 0, 0) }]),
        spirv: Some(words.into()),
        ..Default::default()
    };
    // SAFETY: a probe's kernel, compiled and validated by glslang; its output is checked below.
    let module = unsafe { device.create_shader_module_passthrough(module_desc) };
    let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some("coopmat2 gemm"),
        layout: Some(&pipeline_layout),
        module: &module,
        entry_point: Some("main"),
        compilation_options: Default::default(),
        cache: None,
    });
    if let Some(e) = pollster::block_on(scope.pop()) {
        bail!("pipeline: {e}");
    }
    let bind = device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: None,
        layout: &layout,
        entries: &[
            wgpu::BindGroupEntry { binding: 0, resource: a_buf.as_entire_binding() },
            wgpu::BindGroupEntry { binding: 1, resource: w_buf.as_entire_binding() },
            wgpu::BindGroupEntry { binding: 2, resource: c_buf.as_entire_binding() },
        ],
    });
    let groups = (g.m / g.bm) * (g.n / g.bn);
    let submit = |count: u32| -> Result<f64> {
        let mut encoder = device.create_command_encoder(&Default::default());
        {
            let mut pass = encoder.begin_compute_pass(&Default::default());
            pass.set_pipeline(&pipeline);
            pass.set_bind_group(0, &bind, &[]);
            for _ in 0..count {
                pass.dispatch_workgroups(groups, 1, 1);
            }
        }
        let start = Instant::now();
        queue.submit([encoder.finish()]);
        device.poll(wgpu::PollType::wait_indefinitely()).map_err(|e| anyhow!("poll: {e}"))?;
        Ok(start.elapsed().as_secs_f64())
    };
    submit(1)?;
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        best = best.min(submit(replays)? / f64::from(replays));
    }
    // C checked against f64 dot products of the same f16 values at 64 spread entries.
    let mut encoder = device.create_command_encoder(&Default::default());
    encoder.copy_buffer_to_buffer(&c_buf, 0, &read, 0, c_bytes);
    queue.submit([encoder.finish()]);
    read.slice(..).map_async(wgpu::MapMode::Read, |_| {});
    device.poll(wgpu::PollType::wait_indefinitely()).map_err(|e| anyhow!("poll: {e}"))?;
    let c: Vec<f32> = bytemuck::cast_slice(&read.slice(..).get_mapped_range().map_err(|e| anyhow!("map: {e:?}"))?).to_vec();
    let mut worst = 0f64;
    for i in 0..64u64 {
        let (row, col) = ((i * 37) % u64::from(g.m), (i * 7919 + i * i * 104_729) % u64::from(g.n));
        let (row, col) = (row as usize, col as usize);
        let k = g.k as usize;
        let want: f64 = (0..k).map(|j| f64::from(a[row * k + j]) * f64::from(w[col * k + j])).sum();
        worst = worst.max((f64::from(c[row * g.n as usize + col]) - want).abs());
    }
    let flops = 2.0 * f64::from(g.m) * f64::from(g.n) * f64::from(g.k);
    Ok(format!(
        "{}: {:.1} us, {:.0} TFLOP/s ({} workgroups; max |C - f64| over 64 entries {worst:.2e})",
        file.file_name().and_then(|s| s.to_str()).unwrap_or("?"),
        best * 1e6,
        flops / best / 1e12,
        groups
    ))
}

#[cfg(test)]
mod tests {
    use super::geometry;
    use std::path::Path;

    #[test]
    fn geometry_comes_from_the_file_name() {
        let g = geometry(Path::new("out/gemm_b128_bm64_bn128_bk32_u4_256x65536x2816.spv")).unwrap();
        assert_eq!((g.bm, g.bn, g.m, g.n, g.k), (64, 128, 256, 65536, 2816));
    }

    #[test]
    fn names_without_a_geometry_are_errors_that_say_what_is_missing() {
        let no_tile = geometry(Path::new("gemm_b128_u4_256x65536x2816.spv")).unwrap_err().to_string();
        assert!(no_tile.contains("_bm"), "{no_tile}");
        let no_shape = geometry(Path::new("gemm_b128_bm64_bn128_256x65536.spv")).unwrap_err().to_string();
        assert!(no_shape.contains("MxNxK"), "{no_shape}");
        let ragged = geometry(Path::new("gemm_bm48_bn128_256x65536x2816.spv")).unwrap_err().to_string();
        assert!(ragged.contains("does not divide"), "{ragged}");
    }
}

//! Whether wgpu's pipeline cache (`Features::PIPELINE_CACHE`: a `VkPipelineCache` whose data
//! `PipelineCache::get_data` hands back, saved to a file and passed to the next process's
//! `Device::create_pipeline_cache`) shortens the compilation of a generation's kernels
//! (`dg_gpu::GpuModel::generation_kernels`) in a second process. Measured on lavapipe with Mesa's
//! own shader cache off (`MESA_SHADER_CACHE_DISABLE=true`, a machine that never compiled them):
//! run [`compile_with_cache`] twice over the same file (`cargo test --release -p dg-lab --test
//! pipeline_cache -- --ignored --nocapture`, twice) and compare the compile times.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use dg_kernels::KernelKey;

/// One process's compilation of a set of kernels through a pipeline cache file.
#[derive(Debug, Clone)]
pub struct Measurement {
    pub adapter: String,
    pub kernels: usize,
    /// Bytes of the cache file read at the start (0: none).
    pub loaded_bytes: usize,
    /// Bytes of the cache data written at the end.
    pub saved_bytes: usize,
    /// Compiling the kernels, the cache's creation included.
    pub compile: Duration,
}

/// Opens the adapter whose name contains `adapter` (any where None) with the pipeline cache,
/// compiles `keys` through a cache made from `file`'s bytes (where it exists), and writes the
/// cache's data back to `file`.
pub fn compile_with_cache(adapter: Option<&str>, keys: &[KernelKey], file: &Path) -> Result<Measurement> {
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle());
    let adapters = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all()));
    let wanted = adapter.map(str::to_lowercase);
    let adapter = adapters
        .into_iter()
        .find(|a| wanted.as_ref().is_none_or(|w| a.get_info().name.to_lowercase().contains(w)))
        .context("no such adapter")?;
    let info = adapter.get_info();
    if !adapter.features().contains(wgpu::Features::PIPELINE_CACHE) {
        bail!("{} has no pipeline cache", info.name);
    }
    let coop = wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX | wgpu::Features::SHADER_F16;
    let wanted = wgpu::Features::PIPELINE_CACHE | wgpu::Features::SHADER_F16 | wgpu::Features::SUBGROUP | coop;
    let features = adapter.features() & wanted;
    let (device, _queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        label: Some("pipeline cache probe"),
        required_features: features,
        required_limits: adapter.limits(),
        // SAFETY: the probe only compiles the kernels, it runs none of them.
        experimental_features: if features.contains(coop) {
            unsafe { wgpu::ExperimentalFeatures::enabled() }
        } else {
            wgpu::ExperimentalFeatures::disabled()
        },
        ..Default::default()
    }))?;
    let data = std::fs::read(file).ok();
    let start = Instant::now();
    // SAFETY: the data is what `get_data` wrote for this adapter (wgpu checks its header and
    // key, and falls back to an empty cache otherwise).
    let cache = unsafe {
        device.create_pipeline_cache(&wgpu::PipelineCacheDescriptor { label: Some("dg"), data: data.as_deref(), fallback: true })
    };
    // The native kernels are SPIR-V this device is not opened for (no passthrough): WGSL's alone.
    for key in keys.iter().filter(|k| k.native().is_none()) {
        let source = key.source();
        let desc =
            wgpu::ShaderModuleDescriptor { label: Some(&source.name), source: wgpu::ShaderSource::Wgsl(source.wgsl.as_str().into()) };
        let checks = wgpu::ShaderRuntimeChecks { bounds_checks: true, force_loop_bounding: false, ..wgpu::ShaderRuntimeChecks::checked() };
        // SAFETY: as in dg-gpu's `plan::compile`: every loop of dg's kernels is bounded.
        let module = unsafe { device.create_shader_module_trusted(desc, checks) };
        let _pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(&source.name),
            layout: None,
            module: &module,
            entry_point: Some(source.entry),
            compilation_options: Default::default(),
            cache: Some(&cache),
        });
    }
    let compile = start.elapsed();
    let saved = cache.get_data().unwrap_or_default();
    std::fs::write(file, &saved).with_context(|| format!("writing {}", file.display()))?;
    Ok(Measurement {
        adapter: info.name,
        kernels: keys.iter().filter(|k| k.native().is_none()).count(),
        loaded_bytes: data.map_or(0, |d| d.len()),
        saved_bytes: saved.len(),
        compile,
    })
}

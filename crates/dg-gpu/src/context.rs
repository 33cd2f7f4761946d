//! The GPU device: adapter choice, features and limits, and counted resource creation.
//!
//! Adapter choice: a discrete GPU first, then integrated, then virtual, then CPU (lavapipe);
//! [`GpuOptions::adapter`] (`DG_ADAPTER` where the application builds the options with
//! [`GpuOptions::from_env`]) picks one by name substring.
//! Every buffer, bind group and pipeline dg creates goes through this type, which counts them, so
//! tests can prove that nothing is created after the first denoising step.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::GpuError;
use crate::planner::{ASSUMED_MULTIPROCESSORS, Capabilities, Planner};
use crate::tuning::{RowReduceChoice, Tuning, TuningError};

/// How to pick and open the device, and how to run on it.
#[derive(Debug, Clone, Default)]
pub struct GpuOptions {
    /// Case-insensitive substring of the adapter name (none: the ranking above).
    pub adapter: Option<String>,
    /// The knobs (default: dg-gpu's own choices).
    pub tuning: Tuning,
}

impl GpuOptions {
    /// The options the `DG_*` variables of this process's environment ask for: `DG_ADAPTER` and
    /// the tuning ([`Tuning::from_env`]). Applications call this; the library itself never does.
    pub fn from_env() -> Result<GpuOptions, TuningError> {
        GpuOptions::from_vars(crate::tuning::env_vars())
    }

    /// [`Self::from_env`] over `vars` (name, value pairs) instead of the environment.
    pub fn from_vars<N: AsRef<str>, V: AsRef<str>>(vars: impl IntoIterator<Item = (N, V)>) -> Result<GpuOptions, TuningError> {
        let vars: Vec<(N, V)> = vars.into_iter().collect();
        let adapter = adapter_from(vars.iter().map(|(n, v)| (n.as_ref(), v.as_ref())));
        Ok(GpuOptions { adapter, tuning: Tuning::from_vars(vars)? })
    }
}

/// The non-empty value of `DG_ADAPTER` among `vars`.
fn adapter_from<N: AsRef<str>, V: AsRef<str>>(vars: impl IntoIterator<Item = (N, V)>) -> Option<String> {
    vars.into_iter().find(|(n, _)| n.as_ref() == "DG_ADAPTER").map(|(_, v)| v.as_ref().to_string()).filter(|v| !v.is_empty())
}

/// Numbers of GPU objects created so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Created {
    pub buffers: u64,
    pub bind_groups: u64,
    pub pipelines: u64,
}

/// Shared counters of created objects; cloning the handle lets a caller watch a context it does
/// not own (e.g. from sampler hooks while the model is borrowed).
#[derive(Debug, Default)]
pub struct Counters {
    buffers: AtomicU64,
    bind_groups: AtomicU64,
    pipelines: AtomicU64,
    /// Bytes copied from the device to the host through mapped staging buffers.
    read_back: AtomicU64,
    /// Bytes of every buffer created.
    allocated: AtomicU64,
}

impl Counters {
    /// Counts so far.
    pub fn get(&self) -> Created {
        Created {
            buffers: self.buffers.load(Ordering::Relaxed),
            bind_groups: self.bind_groups.load(Ordering::Relaxed),
            pipelines: self.pipelines.load(Ordering::Relaxed),
        }
    }

    /// Bytes read back from the device so far (every mapped readback counts).
    pub fn bytes_read_back(&self) -> u64 {
        self.read_back.load(Ordering::Relaxed)
    }

    /// Bytes of the buffers created so far (dropped ones included).
    pub fn bytes_allocated(&self) -> u64 {
        self.allocated.load(Ordering::Relaxed)
    }
}

/// An open device with its queue.
#[derive(Debug)]
pub struct GpuContext {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub info: wgpu::AdapterInfo,
    pub limits: wgpu::Limits,
    pub features: wgpu::Features,
    /// The device runs the tensor-core GEMM (`dg_kernels::coop_gemm`): cooperative matrices with a
    /// square f16 → f32 configuration, f16 shader types and subgroups of 32 (or of a fixed size
    /// that divides 32). Set [`Tuning::tensor_cores`] false to leave them off.
    pub coop_matrix: bool,
    /// Side of the fragments the tensor-core kernels multiply on this device
    /// (`dg_kernels::coop_gemm::FRAGMENTS`: 16 where offered, else 8, as on lavapipe; 16 where
    /// [`Self::coop_matrix`] is false).
    pub coop_fragment: u32,
    /// The fragment shapes of the Vulkan-native kernels the device runs ([`native_shapes`]; none
    /// where [`Self::coop_matrix`] is false or [`Tuning::native`] is).
    pub native: dg_kernels::native_grouped_gemm::NativeShapes,
    /// The fragment shapes of the native kernel's int8 mode the device runs ([`int8_shapes`]; none
    /// where [`Self::native`] is empty or [`Tuning::int8`] is false).
    pub int8: dg_kernels::native_int8_gemm::Int8Shapes,
    /// The knobs the context was opened with, which every recording reads.
    pub tuning: Tuning,
    counters: Arc<Counters>,
}

/// The bytes of a storage buffer asked for `size` bytes (whole words, at least one), or an error
/// naming `label` where that passes the device's `max_binding`.
pub(crate) fn storage_size(label: &str, size: u64, max_binding: u64) -> Result<u64, GpuError> {
    let size = size.max(4).next_multiple_of(4);
    if size > max_binding {
        return Err(GpuError::Limit {
            what: format!("buffer {label}"),
            needed: size,
            limit: max_binding,
            limit_name: "max_storage_buffer_binding_size",
        });
    }
    Ok(size)
}

/// All adapters wgpu can see, with their info.
pub fn list_adapters() -> Vec<wgpu::AdapterInfo> {
    let instance = wgpu::Instance::new(instance_descriptor());
    pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all())).iter().map(|a| a.get_info()).collect()
}

fn instance_descriptor() -> wgpu::InstanceDescriptor {
    wgpu::InstanceDescriptor::new_without_display_handle()
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

/// The features the tensor-core GEMM needs.
const COOP_FEATURES: wgpu::Features = wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX.union(wgpu::Features::SHADER_F16);

/// The fragment side on which `adapter` runs `dg_kernels::coop_gemm`, if it does: both features,
/// subgroups of one fixed size that divides the kernels' 32 (the kernels' subgroup is then that
/// many of the device's, all computing the same fragments: `dg_kernels::coop_gemm`'s
/// requirements), and the first side of `dg_kernels::coop_gemm::FRAGMENTS` with a square
/// configuration of f16 inputs and f32 accumulation (16×16×16 on NVIDIA; 8×8×8 on lavapipe).
fn coop_gemm_fragment(adapter: &wgpu::Adapter) -> Option<u32> {
    use dg_kernels::coop_gemm::{FRAGMENTS, SUBGROUP_SIZE};
    let info = adapter.get_info();
    let subgroups = info.subgroup_min_size == info.subgroup_max_size
        && info.subgroup_max_size > 0
        && SUBGROUP_SIZE.is_multiple_of(info.subgroup_max_size);
    let offers = |side: u32| {
        adapter.cooperative_matrix_properties().iter().any(|p| {
            (p.m_size, p.n_size, p.k_size) == (side, side, side)
                && p.ab_type == wgpu::CooperativeScalarType::F16
                && p.cr_type == wgpu::CooperativeScalarType::F32
        })
    };
    match adapter.features().contains(COOP_FEATURES) && subgroups {
        true => FRAGMENTS.into_iter().find(|&side| offers(side)),
        false => None,
    }
}

/// The shapes of `dg_kernels::native_grouped_gemm` that `adapter` runs: a Vulkan adapter that
/// takes SPIR-V as it is (`PASSTHROUGH_SHADERS`) and lists the shape's fragment with f16 inputs and
/// f32 accumulation, its subgroups of exactly the shape's size (lavapipe: 8×8×8 in subgroups of 8;
/// NVIDIA: 16×8×16 and 16×16×16 in subgroups of 32).
fn native_shapes(adapter: &wgpu::Adapter) -> dg_kernels::native_grouped_gemm::NativeShapes {
    use dg_kernels::native_grouped_gemm::{NativeShape, NativeShapes};
    let info = adapter.get_info();
    if info.backend != wgpu::Backend::Vulkan || !adapter.features().contains(wgpu::Features::PASSTHROUGH_SHADERS | COOP_FEATURES) {
        return NativeShapes::NONE;
    }
    let properties = adapter.cooperative_matrix_properties();
    let runs = |shape: NativeShape| {
        let (m, n, k) = shape.fragment();
        info.subgroup_min_size == shape.subgroup()
            && info.subgroup_max_size == shape.subgroup()
            && properties.iter().any(|p| {
                (p.m_size, p.n_size, p.k_size) == (m, n, k)
                    && p.ab_type == wgpu::CooperativeScalarType::F16
                    && p.cr_type == wgpu::CooperativeScalarType::F32
            })
    };
    NativeShape::ALL.into_iter().filter(|&s| runs(s)).fold(NativeShapes::NONE, NativeShapes::with)
}

/// The shapes of `dg_kernels::native_int8_gemm` that `adapter` runs: its driver lists the fragment
/// with signed 8-bit inputs and 32-bit results at subgroup scope (asked of the driver itself:
/// wgpu's `cooperative_matrix_properties` lists float fragments only), offers `shaderInt8` (which
/// wgpu enables on the device where the driver has it), and the subgroups are exactly the shape's
/// size. Called only where the adapter runs native kernels (a Vulkan adapter).
fn int8_shapes(adapter: &wgpu::Adapter) -> dg_kernels::native_int8_gemm::Int8Shapes {
    use ash::vk;
    use dg_kernels::native_int8_gemm::{Int8Shape, Int8Shapes};
    let info = adapter.get_info();
    // SAFETY: the hal adapter and its instance are only read; the extension's query is made only
    // where the driver lists the extension, on the adapter's own physical device.
    let offered = unsafe {
        let Some(hal) = adapter.as_hal::<wgpu::hal::api::Vulkan>() else { return Int8Shapes::NONE };
        let shared = hal.shared_instance();
        let (entry, instance) = (shared.entry(), shared.raw_instance());
        let physical = hal.raw_physical_device();
        let Ok(extensions) = instance.enumerate_device_extension_properties(physical) else { return Int8Shapes::NONE };
        if !extensions.iter().any(|e| e.extension_name_as_c_str() == Ok(ash::khr::cooperative_matrix::NAME)) {
            return Int8Shapes::NONE;
        }
        let mut f16_int8 = vk::PhysicalDeviceShaderFloat16Int8Features::default();
        let mut features = vk::PhysicalDeviceFeatures2::default().push_next(&mut f16_int8);
        instance.get_physical_device_features2(physical, &mut features);
        if f16_int8.shader_int8 == 0 {
            return Int8Shapes::NONE;
        }
        let coop = ash::khr::cooperative_matrix::Instance::new(entry, instance);
        let properties = coop.get_physical_device_cooperative_matrix_properties(physical).unwrap_or_default();
        properties
            .iter()
            .filter(|p| {
                p.a_type == vk::ComponentTypeKHR::SINT8
                    && p.b_type == vk::ComponentTypeKHR::SINT8
                    && p.c_type == vk::ComponentTypeKHR::SINT32
                    && p.result_type == vk::ComponentTypeKHR::SINT32
                    && p.saturating_accumulation == 0
                    && p.scope == vk::ScopeKHR::SUBGROUP
            })
            .map(|p| (p.m_size, p.n_size, p.k_size))
            .collect::<Vec<_>>()
    };
    let runs = |shape: Int8Shape| {
        let (m, n, k) = shape.fragment();
        info.subgroup_min_size == shape.subgroup() && info.subgroup_max_size == shape.subgroup() && offered.contains(&(m, n, k))
    };
    Int8Shape::ALL.into_iter().filter(|&s| runs(s)).fold(Int8Shapes::NONE, Int8Shapes::with)
}

impl GpuContext {
    /// Picks an adapter and opens a device with the adapter's full limits.
    pub fn new(opts: &GpuOptions) -> Result<Self, GpuError> {
        let instance = wgpu::Instance::new(instance_descriptor());
        let mut adapters = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all()));
        if adapters.is_empty() {
            return Err(GpuError::NoAdapter { detail: String::new() });
        }
        let wanted = opts.adapter.clone().filter(|s| !s.is_empty());
        adapters.sort_by_key(|a| rank(a.get_info().device_type));
        let adapter = match &wanted {
            Some(w) => {
                let lw = w.to_lowercase();
                let pos = adapters.iter().position(|a| a.get_info().name.to_lowercase().contains(&lw));
                match pos {
                    Some(i) => adapters.swap_remove(i),
                    None => {
                        let available = adapters.iter().map(|a| a.get_info().name).collect::<Vec<_>>().join(", ");
                        return Err(GpuError::AdapterNotFound { wanted: w.clone(), available });
                    }
                }
            }
            None => adapters.remove(0),
        };
        let info = adapter.get_info();
        let limits = adapter.limits();
        let fragment = coop_gemm_fragment(&adapter).filter(|_| opts.tuning.tensor_cores);
        let (coop_matrix, coop_fragment) = (fragment.is_some(), fragment.unwrap_or(dg_kernels::coop_gemm::FRAGMENT));
        let native = match coop_matrix && opts.tuning.native {
            true => native_shapes(&adapter),
            false => dg_kernels::native_grouped_gemm::NativeShapes::NONE,
        };
        let int8 = match !native.is_empty() && opts.tuning.int8 {
            true => int8_shapes(&adapter),
            false => dg_kernels::native_int8_gemm::Int8Shapes::NONE,
        };
        // f16 in shaders wherever offered: the tensor-core kernels need it, and so do the kernels
        // that store their activations as f16 for them (tested on every adapter that has it).
        // Subgroups wherever offered: the row kernels reduce through them (`Self::row_reduce`).
        let wanted = wgpu::Features::TIMESTAMP_QUERY
            | wgpu::Features::TIMESTAMP_QUERY_INSIDE_ENCODERS
            | wgpu::Features::SHADER_F16
            | wgpu::Features::SUBGROUP;
        let mut features = adapter.features() & wanted;
        if coop_matrix {
            features |= COOP_FEATURES;
        }
        if !native.is_empty() {
            features |= wgpu::Features::PASSTHROUGH_SHADERS;
        }
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("dg"),
            required_features: features,
            required_limits: limits.clone(),
            experimental_features: if coop_matrix {
                // SAFETY: only requested where the adapter reports the cooperative-matrix
                // configuration the tensor-core GEMM uses; its results are gated against the f32
                // kernels (dg-parity tests/coop_gemm.rs) on such devices, the native kernels'
                // against the CPU (tests/native_kernels.rs).
                unsafe { wgpu::ExperimentalFeatures::enabled() }
            } else {
                wgpu::ExperimentalFeatures::disabled()
            },
            ..Default::default()
        }))
        .map_err(|e| GpuError::Device { adapter: info.name.clone(), message: e.to_string() })?;
        Ok(GpuContext {
            device,
            queue,
            info,
            limits,
            features,
            coop_matrix,
            coop_fragment,
            native,
            int8,
            tuning: opts.tuning.clone(),
            counters: Arc::default(),
        })
    }

    /// Another handle on this device: the same device, queue and creation counters (wgpu's device
    /// and queue are reference-counted and may be used from any thread), with a copy of the
    /// tuning. What runs beside a model on its device (the vision tower on `dg serve`'s request
    /// threads) takes one; the submissions of every handle go to the one queue in turn.
    pub fn share(&self) -> GpuContext {
        GpuContext {
            device: self.device.clone(),
            queue: self.queue.clone(),
            info: self.info.clone(),
            limits: self.limits.clone(),
            features: self.features,
            coop_matrix: self.coop_matrix,
            coop_fragment: self.coop_fragment,
            native: self.native,
            int8: self.int8,
            tuning: self.tuning.clone(),
            counters: self.counters.clone(),
        }
    }

    /// Counts of created objects.
    pub fn created(&self) -> Created {
        self.counters.get()
    }

    /// A handle on the creation counters that outlives borrows of the context.
    pub fn counters(&self) -> Arc<Counters> {
        self.counters.clone()
    }

    /// How the row kernels (norms, softmax, the router's top-k) reduce across a workgroup:
    /// through subgroups where the device has them (`dg_kernels::row_reduce`), else a tree
    /// ([`Tuning::row_reduce`] keeps the tree on any device).
    pub fn row_reduce(&self) -> dg_kernels::row_reduce::RowReduce {
        use dg_kernels::row_reduce::RowReduce;
        match self.features.contains(wgpu::Features::SUBGROUP) && self.tuning.row_reduce == RowReduceChoice::Auto {
            true => RowReduce::Subgroup,
            false => RowReduce::Tree,
        }
    }

    /// The row reductions this device can run (the tree, and subgroups where it has them): what
    /// the kernel tests check.
    pub fn row_reduces(&self) -> Vec<dg_kernels::row_reduce::RowReduce> {
        use dg_kernels::row_reduce::RowReduce;
        RowReduce::ALL.into_iter().filter(|r| *r == RowReduce::Tree || self.features.contains(wgpu::Features::SUBGROUP)).collect()
    }

    /// Largest storage binding the device accepts.
    pub fn max_binding(&self) -> u64 {
        self.limits.max_storage_buffer_binding_size.min(self.limits.max_buffer_size)
    }

    /// Largest buffer one weight tensor's part may take: [`Self::max_binding`], or
    /// [`Tuning::weight_binding`] where that is lower (`crate::weights::Parts` splits by it).
    pub fn weight_binding(&self) -> u64 {
        self.tuning.weight_binding.map_or(self.max_binding(), |cap| cap.min(self.max_binding()))
    }

    /// A storage buffer of `size` bytes (at least 4), checked against the limits.
    pub fn storage_buffer(&self, label: &str, size: u64) -> Result<wgpu::Buffer, GpuError> {
        let size = storage_size(label, size, self.max_binding())?;
        self.buffer(label, size, wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC)
    }

    /// A buffer with explicit usages; allocation failures become [`GpuError::OutOfMemory`].
    pub fn buffer(&self, label: &str, size: u64, usage: wgpu::BufferUsages) -> Result<wgpu::Buffer, GpuError> {
        self.create_buffer(label, size, usage, false)
    }

    /// [`Self::buffer`], mapped at creation.
    pub fn buffer_mapped(&self, label: &str, size: u64, usage: wgpu::BufferUsages) -> Result<wgpu::Buffer, GpuError> {
        self.create_buffer(label, size, usage, true)
    }

    fn create_buffer(&self, label: &str, size: u64, usage: wgpu::BufferUsages, mapped_at_creation: bool) -> Result<wgpu::Buffer, GpuError> {
        self.counters.buffers.fetch_add(1, Ordering::Relaxed);
        self.counters.allocated.fetch_add(size, Ordering::Relaxed);
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let buffer = self.device.create_buffer(&wgpu::BufferDescriptor { label: Some(label), size, usage, mapped_at_creation });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(GpuError::OutOfMemory { context: format!("allocating {label} ({size} bytes)"), message: e.to_string() });
        }
        Ok(buffer)
    }

    /// A storage buffer filled with `data` (f32, u32 or any other plain 4-byte values).
    pub fn upload<T: bytemuck::Pod>(&self, label: &str, data: &[T]) -> Result<wgpu::Buffer, GpuError> {
        let bytes: &[u8] = bytemuck::cast_slice(data);
        let buffer = self.storage_buffer(label, bytes.len() as u64)?;
        self.queue.write_buffer(&buffer, 0, bytes);
        Ok(buffer)
    }

    /// Copies `len` u32 values from `buffer` (starting at element `offset`) to the host.
    pub fn read_u32(&self, buffer: &wgpu::Buffer, offset: usize, len: usize) -> Result<Vec<u32>, GpuError> {
        Ok(self.read_f32(buffer, offset, len)?.into_iter().map(f32::to_bits).collect())
    }

    pub(crate) fn count_bind_group(&self) {
        self.counters.bind_groups.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_pipeline(&self) {
        self.counters.pipelines.fetch_add(1, Ordering::Relaxed);
    }

    /// Copies `len` f32 values from `buffer` (starting at element `offset`) to the host.
    pub fn read_f32(&self, buffer: &wgpu::Buffer, offset: usize, len: usize) -> Result<Vec<f32>, GpuError> {
        let bytes = (len * 4) as u64;
        let staging = self.buffer("readback", bytes.max(4), wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::MAP_READ)?;
        let mut enc = self.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("readback") });
        enc.copy_buffer_to_buffer(buffer, (offset * 4) as u64, &staging, 0, bytes);
        self.queue.submit(Some(enc.finish()));
        let out = map_read(self, &staging, bytes)?;
        Ok(bytemuck::cast_slice(&out).to_vec())
    }
}

/// Maps `staging` (already filled by a submitted copy) and hands its first `bytes` bytes to `read`
/// without an intermediate copy (the logits readback is [C, V] f32: 268 MB at the real size).
pub(crate) fn map_read_with<R>(ctx: &GpuContext, staging: &wgpu::Buffer, bytes: u64, read: impl FnOnce(&[u8]) -> R) -> Result<R, GpuError> {
    let slice = staging.slice(..bytes);
    let (tx, rx) = std::sync::mpsc::channel();
    slice.map_async(wgpu::MapMode::Read, move |r| {
        let _ = tx.send(r);
    });
    ctx.device.poll(wgpu::PollType::wait_indefinitely()).map_err(|e| GpuError::Readback(e.to_string()))?;
    rx.recv().map_err(|e| GpuError::Readback(e.to_string()))?.map_err(|e| GpuError::Readback(e.to_string()))?;
    let result = {
        let view = slice.get_mapped_range().map_err(|e| GpuError::Readback(e.to_string()))?;
        read(&view)
    };
    staging.unmap();
    ctx.counters.read_back.fetch_add(bytes, Ordering::Relaxed);
    Ok(result)
}

/// [`map_read_with`] into a new vector.
pub(crate) fn map_read(ctx: &GpuContext, staging: &wgpu::Buffer, bytes: u64) -> Result<Vec<u8>, GpuError> {
    map_read_with(ctx, staging, bytes, <[u8]>::to_vec)
}

impl GpuContext {
    /// What the planner knows of this device ([`Capabilities`]).
    pub fn capabilities(&self) -> Capabilities {
        Capabilities {
            coop_matrix: self.coop_matrix,
            coop_fragment: self.coop_fragment,
            native: self.native,
            int8: self.int8,
            shader_f16: self.device.features().contains(wgpu::Features::SHADER_F16),
            max_workgroup_storage: self.limits.max_compute_workgroup_storage_size,
            max_binding: self.max_binding(),
            multiprocessors: ASSUMED_MULTIPROCESSORS,
        }
    }

    /// The planner of this device and the tuning it was opened with.
    pub fn planner(&self) -> Planner<'_> {
        Planner::new(self.capabilities(), &self.tuning)
    }
}

//! Compiled kernels and dispatch plans.
//!
//! [`Pipelines`] compiles each kernel variant once, keyed by its [`KernelKey`] (or, for a one-off
//! kernel a test or probe builds, by its name): WGSL through naga, or a Vulkan-native kernel's
//! SPIR-V handed to the driver as it is (`KernelKey::native`); with an explicit layout derived
//! from the shared binding convention of dg-kernels (uniform params at binding 0 with a dynamic offset,
//! storage buffers after it). A [`Plan`] is a list of dispatches whose parameters all live in one
//! uniform buffer at aligned offsets and whose bind groups are created once; replaying it only
//! records commands (design after huggingface/ratchet's executable, keeping the uniform across
//! steps).

use std::collections::HashMap;
use std::sync::Arc;

use dg_kernels::native_grouped_gemm::NativeSource;
use dg_kernels::{Access, KernelKey, KernelSource};

use crate::context::GpuContext;
use crate::error::GpuError;

/// A compiled kernel variant.
#[derive(Debug)]
pub struct Pipeline {
    /// The variant's unique name.
    pub name: String,
    /// Its storage bindings `1..=n`.
    pub buffers: Vec<Access>,
    /// Size in bytes of its uniform parameter struct at binding 0.
    pub params_size: u64,
    pub layout: wgpu::BindGroupLayout,
    pub pipeline: wgpu::ComputePipeline,
}

/// What a pipeline is compiled from.
enum Code {
    /// A kernel's WGSL and entry point.
    Wgsl(String, &'static str),
    /// A native kernel's SPIR-V (`KernelKey::native`).
    Spirv(NativeSource),
}

impl From<KernelSource> for Code {
    fn from(source: KernelSource) -> Code {
        Code::Wgsl(source.wgsl, source.entry)
    }
}

/// Compiled kernels by key (and one-off kernels by name).
#[derive(Debug, Default)]
pub struct Pipelines {
    by_key: HashMap<KernelKey, Arc<Pipeline>>,
    by_name: HashMap<String, Arc<Pipeline>>,
}

impl Pipelines {
    /// The pipeline of `key`, rendered and compiled on first use.
    pub fn get(&mut self, ctx: &GpuContext, key: KernelKey) -> Result<Arc<Pipeline>, GpuError> {
        if let Some(p) = self.by_key.get(&key) {
            return Ok(p.clone());
        }
        let p = Arc::new(compile_key(ctx, key)?);
        self.by_key.insert(key, p.clone());
        Ok(p)
    }

    /// Compiles each of `keys` not compiled yet, on as many threads as rayon's pool has (the
    /// device takes pipelines from several threads); returns how many it compiled. A warm-up
    /// (`GpuModel::warm_up`) hands it every kernel a generation will use, so that none is
    /// compiled while a request waits.
    pub fn compile_all(&mut self, ctx: &GpuContext, keys: impl IntoIterator<Item = KernelKey>) -> Result<usize, GpuError> {
        use rayon::prelude::*;
        let missing: std::collections::HashSet<KernelKey> = keys.into_iter().filter(|k| !self.by_key.contains_key(k)).collect();
        let compiled: Vec<(KernelKey, Pipeline)> =
            missing.into_par_iter().map(|key| compile_key(ctx, key).map(|p| (key, p))).collect::<Result<_, _>>()?;
        let count = compiled.len();
        self.by_key.extend(compiled.into_iter().map(|(k, p)| (k, Arc::new(p))));
        Ok(count)
    }

    /// The pipeline of a kernel built outside the key space (a probe's or a test's variant),
    /// compiled on first use of its name.
    pub fn get_source(&mut self, ctx: &GpuContext, source: KernelSource) -> Result<Arc<Pipeline>, GpuError> {
        if let Some(p) = self.by_name.get(&source.name) {
            return Ok(p.clone());
        }
        let p = Arc::new(compile(ctx, Interface::from(&source), source.into())?);
        self.by_name.insert(p.name.clone(), p.clone());
        Ok(p)
    }
}

/// A kernel's name and bindings, whatever its code.
struct Interface {
    name: String,
    buffers: Vec<Access>,
    params_size: u64,
}

/// The pipeline of `key`: its SPIR-V where it is a native kernel, else its WGSL.
fn compile_key(ctx: &GpuContext, key: KernelKey) -> Result<Pipeline, GpuError> {
    match key.native() {
        Some(n) => compile(ctx, Interface { name: n.name.clone(), buffers: n.buffers.clone(), params_size: n.params_size }, Code::Spirv(n)),
        None => {
            let source = key.source();
            compile(ctx, Interface::from(&source), source.into())
        }
    }
}

impl From<&KernelSource> for Interface {
    fn from(s: &KernelSource) -> Interface {
        Interface { name: s.name.clone(), buffers: s.buffers.clone(), params_size: s.params_size }
    }
}

fn compile(ctx: &GpuContext, source: Interface, code: Code) -> Result<Pipeline, GpuError> {
    let device = &ctx.device;
    let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
    let mut entries = vec![wgpu::BindGroupLayoutEntry {
        binding: 0,
        visibility: wgpu::ShaderStages::COMPUTE,
        ty: wgpu::BindingType::Buffer {
            ty: wgpu::BufferBindingType::Uniform,
            has_dynamic_offset: true,
            min_binding_size: wgpu::BufferSize::new(source.params_size),
        },
        count: None,
    }];
    for (i, access) in source.buffers.iter().enumerate() {
        entries.push(wgpu::BindGroupLayoutEntry {
            binding: i as u32 + 1,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Storage { read_only: *access == Access::Read },
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        });
    }
    let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor { label: Some(&source.name), entries: &entries });
    let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
        label: Some(&source.name),
        bind_group_layouts: &[Some(&layout)],
        immediate_size: 0,
    });
    let (module, entry) = match code {
        Code::Wgsl(wgsl, entry) => {
            let desc = wgpu::ShaderModuleDescriptor { label: Some(&source.name), source: wgpu::ShaderSource::Wgsl(wgsl.into()) };
            // Bounds checks stay on. Loop bounding is off: the counter it adds to every loop stops
            // drivers from unrolling and pipelining the GEMMs' K loops.
            // SAFETY: every loop of dg's kernels runs over a count taken from its uniform parameters (or a
            // constant), so no loop can run forever; that is the hazard loop bounding guards against.
            let checks =
                wgpu::ShaderRuntimeChecks { bounds_checks: true, force_loop_bounding: false, ..wgpu::ShaderRuntimeChecks::checked() };
            (unsafe { device.create_shader_module_trusted(desc, checks) }, entry)
        }
        Code::Spirv(native) => {
            if !ctx.features.contains(wgpu::Features::PASSTHROUGH_SHADERS) {
                return Err(GpuError::Unsupported {
                    what: format!("the native kernel {} on a device without SPIR-V passthrough", source.name),
                });
            }
            let words: Vec<u32> = native.spirv.chunks_exact(4).map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]])).collect();
            let [x, y, z] = native.workgroup_size;
            let desc = wgpu::ShaderModuleDescriptorPassthrough {
                label: Some(&source.name),
                entry_points: std::borrow::Cow::Owned(vec![wgpu::PassthroughShaderEntryPoint {
                    name: native.entry.into(),
                    workgroup_size: (x, y, z),
                }]),
                spirv: Some(words.into()),
                ..Default::default()
            };
            // SAFETY: the module is one of dg-kernels' native kernels, compiled and validated by the
            // pinned glslang (CI checks the committed SPIR-V against its GLSL); its bindings are the
            // layout above (dg-kernels' convention, `NativeSource::buffers`), its loops run over
            // counts from its parameters, and every variant is gated against the CPU
            // (dg-parity `tests/native_kernels.rs`). The planner hands it out only on adapters that
            // list its fragment and subgroup size (`GpuContext::native`).
            (unsafe { device.create_shader_module_passthrough(desc) }, native.entry)
        }
    };
    let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some(&source.name),
        layout: Some(&pipeline_layout),
        module: &module,
        entry_point: Some(entry),
        compilation_options: Default::default(),
        cache: None,
    });
    if let Some(e) = pollster::block_on(scope.pop()) {
        return Err(GpuError::Validation { context: format!("compiling kernel {}", source.name), message: e.to_string() });
    }
    ctx.count_pipeline();
    Ok(Pipeline { name: source.name, buffers: source.buffers, params_size: source.params_size, layout, pipeline })
}

/// One recorded dispatch.
#[derive(Debug)]
struct Dispatch {
    label: String,
    pipeline: Arc<Pipeline>,
    bind_group: wgpu::BindGroup,
    offset: u32,
    groups: [u32; 3],
}

/// A replayable list of dispatches.
#[derive(Debug)]
pub struct Plan {
    dispatches: Vec<Dispatch>,
    /// Keeps the parameter buffer alive as long as the bind groups that use it.
    _uniforms: wgpu::Buffer,
}

struct Pending<'a> {
    label: String,
    pipeline: Arc<Pipeline>,
    buffers: Vec<&'a wgpu::Buffer>,
    offset: u32,
    groups: [u32; 3],
}

/// Collects dispatches; [`PlanBuilder::finish`] creates the uniform buffer and bind groups.
pub struct PlanBuilder<'a> {
    params: Vec<u8>,
    align: usize,
    pending: Vec<Pending<'a>>,
}

impl std::fmt::Debug for PlanBuilder<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlanBuilder").field("dispatches", &self.pending.len()).finish()
    }
}

impl<'a> PlanBuilder<'a> {
    pub fn new(ctx: &GpuContext) -> Self {
        PlanBuilder { params: Vec::new(), align: ctx.limits.min_uniform_buffer_offset_alignment as usize, pending: Vec::new() }
    }

    /// Number of dispatches so far.
    pub fn len(&self) -> usize {
        self.pending.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Adds a dispatch of `pipeline` with `params` over `buffers` (bindings 1..) and `groups`.
    pub fn push<P: bytemuck::Pod>(&mut self, pipeline: &Arc<Pipeline>, params: &P, buffers: &[&'a wgpu::Buffer], groups: [u32; 3]) {
        self.push_labeled(String::new(), pipeline, params, buffers, groups);
    }

    /// [`PlanBuilder::push`] with a label naming where in the model the dispatch belongs
    /// (`layer3`, `head`, ...), used by profiles.
    pub fn push_labeled<P: bytemuck::Pod>(
        &mut self,
        label: String,
        pipeline: &Arc<Pipeline>,
        params: &P,
        buffers: &[&'a wgpu::Buffer],
        groups: [u32; 3],
    ) {
        assert_eq!(buffers.len(), pipeline.buffers.len(), "kernel {}: wrong number of buffers", pipeline.name);
        assert_eq!(size_of::<P>() as u64, pipeline.params_size, "kernel {}: params size", pipeline.name);
        let offset = self.params.len().next_multiple_of(self.align);
        self.params.resize(offset, 0);
        self.params.extend_from_slice(bytemuck::bytes_of(params));
        self.pending.push(Pending { label, pipeline: pipeline.clone(), buffers: buffers.to_vec(), offset: offset as u32, groups });
    }

    /// Creates the uniform buffer and one bind group per dispatch.
    pub fn finish(mut self, ctx: &GpuContext) -> Result<Plan, GpuError> {
        let size = self.params.len().next_multiple_of(self.align).max(self.align) as u64 + 256;
        self.params.resize(size as usize, 0);
        let uniforms = ctx.buffer("plan params", size, wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST)?;
        ctx.queue.write_buffer(&uniforms, 0, &self.params);
        let mut dispatches = Vec::with_capacity(self.pending.len());
        for p in self.pending {
            let mut entries = vec![wgpu::BindGroupEntry {
                binding: 0,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer: &uniforms,
                    offset: 0,
                    size: wgpu::BufferSize::new(p.pipeline.params_size),
                }),
            }];
            for (i, b) in p.buffers.iter().enumerate() {
                entries.push(wgpu::BindGroupEntry { binding: i as u32 + 1, resource: b.as_entire_binding() });
            }
            ctx.count_bind_group();
            let bind_group = ctx.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some(&p.pipeline.name),
                layout: &p.pipeline.layout,
                entries: &entries,
            });
            dispatches.push(Dispatch { label: p.label, pipeline: p.pipeline, bind_group, offset: p.offset, groups: p.groups });
        }
        Ok(Plan { dispatches, _uniforms: uniforms })
    }
}

impl Dispatch {
    fn encode(&self, pass: &mut wgpu::ComputePass<'_>) {
        pass.set_pipeline(&self.pipeline.pipeline);
        pass.set_bind_group(0, &self.bind_group, &[self.offset]);
        pass.dispatch_workgroups(self.groups[0], self.groups[1], self.groups[2]);
    }
}

/// A command encoder holding one compute pass of `dispatches`, in order.
fn encode_pass<'d>(ctx: &GpuContext, label: &str, dispatches: impl Iterator<Item = &'d Dispatch>) -> wgpu::CommandEncoder {
    let mut enc = ctx.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some(label) });
    {
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some(label), timestamp_writes: None });
        for d in dispatches {
            d.encode(&mut pass);
        }
    }
    enc
}

/// Runs `plans` one after another, as one compute pass's dispatches in their order would, in
/// `parts` command buffers of about as many dispatches each (at most one a dispatch), each
/// submitted as soon as it is encoded: the GPU starts on the first part while the host encodes
/// the rest (on the H200 encoding costs the host about 3 µs a dispatch, 1.6 ms for the real
/// model's 505 a forward, which one command buffer spends before any kernel starts). The
/// dispatches and their order are the same in any number of parts, and so are the results.
/// `tail` adds commands after the last part's pass (a readback copy); validation errors are
/// reported as [`GpuError::Validation`] under `context`.
pub fn submit_in_parts(
    ctx: &GpuContext,
    plans: &[&Plan],
    parts: usize,
    context: &str,
    tail: impl FnOnce(&mut wgpu::CommandEncoder),
) -> Result<(), GpuError> {
    let mut dispatches = plans.iter().flat_map(|p| p.dispatches.iter()).peekable();
    let total: usize = plans.iter().map(|p| p.len()).sum();
    let parts = parts.clamp(1, total.max(1));
    let scope = ctx.device.push_error_scope(wgpu::ErrorFilter::Validation);
    let mut tail = Some(tail);
    for part in 0..parts {
        // Part `part` takes dispatches [total·part/parts, total·(part+1)/parts).
        let count = total * (part + 1) / parts - total * part / parts;
        let mut enc = encode_pass(ctx, context, dispatches.by_ref().take(count));
        if part + 1 == parts {
            (tail.take().expect("the tail runs once"))(&mut enc);
        }
        ctx.queue.submit(Some(enc.finish()));
    }
    debug_assert!(dispatches.peek().is_none(), "submit_in_parts left dispatches out");
    if let Some(e) = pollster::block_on(scope.pop()) {
        return Err(GpuError::Validation { context: context.into(), message: e.to_string() });
    }
    Ok(())
}

impl Plan {
    /// The plan as one command buffer, encoded but not submitted (what [`Plan::submit`] encodes
    /// in one part; for timing the host's share of a step).
    pub fn command_buffer(&self, ctx: &GpuContext, label: &str) -> wgpu::CommandBuffer {
        encode_pass(ctx, label, self.dispatches.iter()).finish()
    }

    /// Number of dispatches.
    pub fn len(&self) -> usize {
        self.dispatches.len()
    }

    pub fn is_empty(&self) -> bool {
        self.dispatches.is_empty()
    }

    /// Kernel names in dispatch order (for per-kernel timing reports).
    pub fn kernel_names(&self) -> Vec<&str> {
        self.dispatches.iter().map(|d| d.pipeline.name.as_str()).collect()
    }

    /// Runs the plan once with a timestamp pair around every dispatch (each in its own compute
    /// pass) and returns `(label, kernel, nanoseconds)` per dispatch. Needs `TIMESTAMP_QUERY`.
    pub fn profile(&self, ctx: &GpuContext) -> Result<Vec<(String, String, f64)>, GpuError> {
        if !ctx.features.contains(wgpu::Features::TIMESTAMP_QUERY) {
            return Err(GpuError::Validation { context: "profiling".into(), message: "adapter lacks TIMESTAMP_QUERY".into() });
        }
        let n = self.dispatches.len() as u32;
        let mut out = Vec::with_capacity(n as usize);
        // Query sets hold at most 4096 queries: profile in chunks of 2048 dispatches.
        for first in (0..n).step_by(2048) {
            let count = (n - first).min(2048);
            let set = ctx.device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("profile"),
                ty: wgpu::QueryType::Timestamp,
                count: 2 * count,
            });
            let bytes = 16 * count as u64;
            let resolve = ctx.buffer("profile resolve", bytes, wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC)?;
            let staging = ctx.buffer("profile staging", bytes, wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::MAP_READ)?;
            let mut enc = ctx.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("profile") });
            for (j, d) in self.dispatches[first as usize..(first + count) as usize].iter().enumerate() {
                let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: Some(&d.label),
                    timestamp_writes: Some(wgpu::ComputePassTimestampWrites {
                        query_set: &set,
                        beginning_of_pass_write_index: Some(2 * j as u32),
                        end_of_pass_write_index: Some(2 * j as u32 + 1),
                    }),
                });
                pass.set_pipeline(&d.pipeline.pipeline);
                pass.set_bind_group(0, &d.bind_group, &[d.offset]);
                pass.dispatch_workgroups(d.groups[0], d.groups[1], d.groups[2]);
            }
            enc.resolve_query_set(&set, 0..2 * count, &resolve, 0);
            enc.copy_buffer_to_buffer(&resolve, 0, &staging, 0, bytes);
            ctx.queue.submit(Some(enc.finish()));
            let raw = crate::context::map_read(ctx, &staging, bytes)?;
            let ticks: &[u64] = bytemuck::cast_slice(&raw);
            let period = ctx.queue.get_timestamp_period() as f64;
            for (j, d) in self.dispatches[first as usize..(first + count) as usize].iter().enumerate() {
                let ns = ticks[2 * j + 1].saturating_sub(ticks[2 * j]) as f64 * period;
                out.push((d.label.clone(), d.pipeline.name.clone(), ns));
            }
        }
        Ok(out)
    }

    /// Encodes, submits and waits: for tests and one-off work.
    pub fn run(&self, ctx: &GpuContext) -> Result<(), GpuError> {
        self.submit(ctx)?;
        ctx.device.poll(wgpu::PollType::wait_indefinitely()).map_err(|e| GpuError::Readback(e.to_string()))?;
        Ok(())
    }

    /// Encodes and submits, without waiting, in the tuning's parts ([`submit_in_parts`],
    /// `DG_SUBMIT_PARTS`): the queue runs it after what was submitted before (the plan may be
    /// dropped at once: the submission keeps what it uses alive).
    pub fn submit(&self, ctx: &GpuContext) -> Result<(), GpuError> {
        submit_in_parts(ctx, &[self], ctx.tuning.submit_parts, "running a plan", |_| {})
    }
}

/// Workgroup counts for `n` workgroups, folded into y when over the per-dimension limit
/// (kernels recover the index as `x + y · num_workgroups.x`).
pub fn groups_1d(n: u32, max_per_dim: u32) -> [u32; 3] {
    if n <= max_per_dim { [n.max(1), 1, 1] } else { [max_per_dim, n.div_ceil(max_per_dim), 1] }
}

//! `cargo xtask shader-stats`: what the Vulkan driver's compiler made of each compute kernel
//! (registers, spills, shared memory, instruction counts: whatever the driver reports through
//! `VK_KHR_pipeline_executable_properties`), for the kernels the GPU forward runs, the
//! tensor-core variants included.
//!
//! The kernels are translated to SPIR-V by naga with the options wgpu's Vulkan backend uses for
//! dg's pipelines (SPIR-V 1.6, buffer bounds left to the driver's robustness, index bounds
//! restricted, loops not force-bounded, workgroup memory zeroed natively) and compiled on a device
//! of their own, created through `ash` with the extension enabled: wgpu does not expose the
//! statistics. A driver that does not offer the extension is an error that says so.
//!
//! `--filter S` keeps the kernels whose name contains `S`; `--ir DIR` also writes each
//! executable's internal representations (text ones only) under `DIR`.

use std::ffi::{CStr, c_char};
use std::path::PathBuf;

use anyhow::{Context, Result, anyhow, bail};
use ash::vk;
use dg_kernels::KernelSource;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Keep only the kernels whose name contains this.
    #[arg(long)]
    filter: Option<String>,
    /// Write the executables' text internal representations into this directory.
    #[arg(long)]
    ir: Option<PathBuf>,
}

/// Every kernel key's kernel (`dg_kernels::KernelKey::all`), the tensor-core ones included.
fn kernels() -> Vec<KernelSource> {
    dg_kernels::KernelKey::all().into_iter().map(|k| k.source()).collect()
}

pub fn run(args: Args) -> Result<bool> {
    let kernels: Vec<KernelSource> = kernels().into_iter().filter(|k| args.filter.as_deref().is_none_or(|f| k.name.contains(f))).collect();
    if kernels.is_empty() {
        bail!("no kernel name contains {:?}", args.filter);
    }
    if let Some(dir) = &args.ir {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let gpu = StatsDevice::new()?;
    println!("device: {}", gpu.name);
    for k in &kernels {
        match gpu.statistics(k, args.ir.as_deref()) {
            Ok(lines) => {
                for line in lines {
                    println!("{}: {line}", k.name);
                }
            }
            Err(e) => println!("{}: error: {e:#}", k.name),
        }
    }
    Ok(true)
}

/// A Vulkan device opened with the features dg's kernels need plus pipeline statistics.
struct StatsDevice {
    _entry: ash::Entry,
    instance: ash::Instance,
    device: ash::Device,
    stats: ash::khr::pipeline_executable_properties::Device,
    name: String,
}

impl StatsDevice {
    fn new() -> Result<Self> {
        let entry = unsafe { ash::Entry::load() }.map_err(|e| anyhow!("no Vulkan loader: {e}"))?;
        let app = vk::ApplicationInfo::default().api_version(vk::API_VERSION_1_3);
        let instance = unsafe { entry.create_instance(&vk::InstanceCreateInfo::default().application_info(&app), None) }
            .context("vkCreateInstance")?;
        let wanted = [ash::khr::pipeline_executable_properties::NAME, ash::khr::cooperative_matrix::NAME];
        let mut chosen = None;
        for pd in unsafe { instance.enumerate_physical_devices() }.context("enumerating devices")? {
            let exts = unsafe { instance.enumerate_device_extension_properties(pd) }?;
            let has = |n: &CStr| exts.iter().any(|e| e.extension_name_as_c_str() == Ok(n));
            let props = unsafe { instance.get_physical_device_properties(pd) };
            let name = props.device_name_as_c_str().map_or_else(|_| "?".into(), |c| c.to_string_lossy().into_owned());
            if has(wanted[0]) {
                let coop = has(wanted[1]);
                chosen = Some((pd, name, coop));
                if coop {
                    break;
                }
            }
        }
        let (pd, name, coop) = chosen.ok_or_else(|| anyhow!("no Vulkan device offers VK_KHR_pipeline_executable_properties"))?;
        let extensions: Vec<*const c_char> = wanted.iter().take(if coop { 2 } else { 1 }).map(|n| n.as_ptr()).collect();
        let mut f11 =
            vk::PhysicalDeviceVulkan11Features::default().storage_buffer16_bit_access(true).uniform_and_storage_buffer16_bit_access(true);
        let mut f12 = vk::PhysicalDeviceVulkan12Features::default()
            .shader_float16(true)
            .vulkan_memory_model(true)
            .vulkan_memory_model_device_scope(true);
        let mut f13 =
            vk::PhysicalDeviceVulkan13Features::default().shader_zero_initialize_workgroup_memory(true).subgroup_size_control(true);
        let mut exec = vk::PhysicalDevicePipelineExecutablePropertiesFeaturesKHR::default().pipeline_executable_info(true);
        let mut cm = vk::PhysicalDeviceCooperativeMatrixFeaturesKHR::default().cooperative_matrix(true);
        let queue = [vk::DeviceQueueCreateInfo::default().queue_family_index(0).queue_priorities(&[1.0])];
        let mut info = vk::DeviceCreateInfo::default()
            .queue_create_infos(&queue)
            .enabled_extension_names(&extensions)
            .push_next(&mut f11)
            .push_next(&mut f12)
            .push_next(&mut f13)
            .push_next(&mut exec);
        if coop {
            info = info.push_next(&mut cm);
        }
        let device = unsafe { instance.create_device(pd, &info, None) }.context("vkCreateDevice")?;
        let stats = ash::khr::pipeline_executable_properties::Device::new(&instance, &device);
        Ok(StatsDevice {
            _entry: entry,
            instance,
            device,
            stats,
            name: format!("{name}{}", if coop { "" } else { " (no cooperative matrices)" }),
        })
    }

    /// One line per statistic of each executable of `k`'s compute pipeline.
    fn statistics(&self, k: &KernelSource, ir: Option<&std::path::Path>) -> Result<Vec<String>> {
        let spirv = spirv(k)?;
        let d = &self.device;
        unsafe {
            let module =
                d.create_shader_module(&vk::ShaderModuleCreateInfo::default().code(&spirv), None).context("vkCreateShaderModule")?;
            let mut bindings = vec![
                vk::DescriptorSetLayoutBinding::default()
                    .binding(0)
                    .descriptor_type(vk::DescriptorType::UNIFORM_BUFFER)
                    .descriptor_count(1)
                    .stage_flags(vk::ShaderStageFlags::COMPUTE),
            ];
            for i in 0..k.buffers.len() {
                bindings.push(
                    vk::DescriptorSetLayoutBinding::default()
                        .binding(i as u32 + 1)
                        .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                        .descriptor_count(1)
                        .stage_flags(vk::ShaderStageFlags::COMPUTE),
                );
            }
            let set_layout = d.create_descriptor_set_layout(&vk::DescriptorSetLayoutCreateInfo::default().bindings(&bindings), None)?;
            let layouts = [set_layout];
            let layout = d.create_pipeline_layout(&vk::PipelineLayoutCreateInfo::default().set_layouts(&layouts), None)?;
            let entry = std::ffi::CString::new(k.entry)?;
            let stage = vk::PipelineShaderStageCreateInfo::default().stage(vk::ShaderStageFlags::COMPUTE).module(module).name(&entry);
            let create = vk::ComputePipelineCreateInfo::default()
                .stage(stage)
                .layout(layout)
                .flags(vk::PipelineCreateFlags::CAPTURE_STATISTICS_KHR | vk::PipelineCreateFlags::CAPTURE_INTERNAL_REPRESENTATIONS_KHR);
            let pipeline = d
                .create_compute_pipelines(vk::PipelineCache::null(), &[create], None)
                .map_err(|(_, e)| anyhow!("vkCreateComputePipelines: {e}"))?[0];
            let mut lines = Vec::new();
            let executables = self.stats.get_pipeline_executable_properties(&vk::PipelineInfoKHR::default().pipeline(pipeline))?;
            for (i, _) in executables.iter().enumerate() {
                let info = vk::PipelineExecutableInfoKHR::default().pipeline(pipeline).executable_index(i as u32);
                let mut line = Vec::new();
                for s in self.stats.get_pipeline_executable_statistics(&info)? {
                    let value = match s.format {
                        vk::PipelineExecutableStatisticFormatKHR::BOOL32 => format!("{}", s.value.b32 != 0),
                        vk::PipelineExecutableStatisticFormatKHR::INT64 => format!("{}", s.value.i64),
                        vk::PipelineExecutableStatisticFormatKHR::UINT64 => format!("{}", s.value.u64),
                        vk::PipelineExecutableStatisticFormatKHR::FLOAT64 => format!("{:.3}", s.value.f64),
                        _ => "?".into(),
                    };
                    line.push(format!("{}={value}", c_text(&s.name)));
                }
                lines.push(line.join(", "));
                if let Some(dir) = ir {
                    self.write_ir(&info, &dir.join(format!("{}.{i}", k.name)))?;
                }
            }
            d.destroy_pipeline(pipeline, None);
            d.destroy_pipeline_layout(layout, None);
            d.destroy_descriptor_set_layout(set_layout, None);
            d.destroy_shader_module(module, None);
            Ok(lines)
        }
    }

    /// Writes the text internal representations of one executable to `stem.<name>.txt`.
    unsafe fn write_ir(&self, info: &vk::PipelineExecutableInfoKHR<'_>, stem: &std::path::Path) -> Result<()> {
        let fp = self.stats.fp();
        let mut count = 0u32;
        unsafe { (fp.get_pipeline_executable_internal_representations_khr)(self.device.handle(), info, &mut count, std::ptr::null_mut()) }
            .result()?;
        let mut reps = vec![vk::PipelineExecutableInternalRepresentationKHR::default(); count as usize];
        unsafe { (fp.get_pipeline_executable_internal_representations_khr)(self.device.handle(), info, &mut count, reps.as_mut_ptr()) }
            .result()?;
        let mut buffers: Vec<Vec<u8>> = reps.iter().map(|r| vec![0u8; r.data_size]).collect();
        for (r, b) in reps.iter_mut().zip(&mut buffers) {
            r.p_data = b.as_mut_ptr().cast();
        }
        unsafe { (fp.get_pipeline_executable_internal_representations_khr)(self.device.handle(), info, &mut count, reps.as_mut_ptr()) }
            .result()?;
        for (r, b) in reps.iter().zip(&buffers) {
            let name: String = c_text(&r.name).chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
            let path = stem.with_extension(format!(
                "{}.{}",
                stem.extension().and_then(|e| e.to_str()).unwrap_or("0"),
                if r.is_text != 0 { format!("{name}.txt") } else { format!("{name}.bin") }
            ));
            let bytes = if r.is_text != 0 { b.split(|&c| c == 0).next().unwrap_or(&[]) } else { &b[..] };
            std::fs::write(&path, bytes).with_context(|| format!("writing {}", path.display()))?;
        }
        Ok(())
    }
}

impl Drop for StatsDevice {
    fn drop(&mut self) {
        unsafe {
            self.device.destroy_device(None);
            self.instance.destroy_instance(None);
        }
    }
}

fn c_text(chars: &[c_char]) -> String {
    let bytes: Vec<u8> = chars.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// `k` as SPIR-V, with the writer options wgpu's Vulkan backend gives dg's pipelines.
fn spirv(k: &KernelSource) -> Result<Vec<u32>> {
    use naga::back::spv;
    let module = naga::front::wgsl::parse_str(&k.wgsl).map_err(|e| anyhow!("{}: {}", k.name, e.emit_to_string(&k.wgsl)))?;
    let caps = naga::valid::Capabilities::all();
    let info = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps)
        .validate(&module)
        .map_err(|e| anyhow!("{}: {e:?}", k.name))?;
    let options = spv::Options {
        lang_version: (1, 6),
        flags: spv::WriterFlags::empty(),
        capabilities: None,
        bounds_check_policies: naga::proc::BoundsCheckPolicies {
            index: naga::proc::BoundsCheckPolicy::Restrict,
            buffer: naga::proc::BoundsCheckPolicy::Unchecked,
            image_load: naga::proc::BoundsCheckPolicy::Unchecked,
            binding_array: naga::proc::BoundsCheckPolicy::Unchecked,
        },
        zero_initialize_workgroup_memory: spv::ZeroInitializeWorkgroupMemoryMode::Native,
        force_loop_bounding: false,
        use_storage_input_output_16: true,
        ..spv::Options::default()
    };
    let pipeline = spv::PipelineOptions { shader_stage: naga::ShaderStage::Compute, entry_point: k.entry.to_string() };
    spv::write_vec(&module, &info, &options, Some(&pipeline)).map_err(|e| anyhow!("{}: SPIR-V: {e}", k.name))
}

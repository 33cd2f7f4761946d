//! `cargo xtask coop-configs` (a lab probe): every cooperative-matrix configuration the Vulkan
//! driver offers, read from the driver itself (`vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR`
//! through wgpu-hal's instance), beside the ones wgpu's adapter reports
//! (`Adapter::cooperative_matrix_properties`). wgpu 30 maps only float component types, so the
//! 8-bit integer fragments an int8 product would run on (`s8 × s8 → s32`) are seen only here; the
//! probe also says whether the driver offers `shaderInt8` and integer dot products, which such a
//! kernel's SPIR-V needs.

use anyhow::{Result, anyhow};
use ash::vk;
use wgpu::hal;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Adapter name substring (default: every Vulkan adapter).
    #[arg(long)]
    adapter: Option<String>,
}

/// One configuration as the driver reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub m: u32,
    pub n: u32,
    pub k: u32,
    /// Component types of A, B, C and the result (`f16`, `f32`, `s8`, `u8`, `s32`, ...).
    pub types: [&'static str; 4],
    pub saturating: bool,
    pub subgroup_scope: bool,
}

impl std::fmt::Display for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let [a, b, c, r] = self.types;
        write!(f, "{}x{}x{} {a} x {b} + {c} -> {r}", self.m, self.n, self.k)?;
        if self.saturating {
            write!(f, " (saturating)")?;
        }
        if !self.subgroup_scope {
            write!(f, " (not subgroup scope)")?;
        }
        Ok(())
    }
}

fn component(t: vk::ComponentTypeKHR) -> &'static str {
    match t {
        vk::ComponentTypeKHR::FLOAT16 => "f16",
        vk::ComponentTypeKHR::FLOAT32 => "f32",
        vk::ComponentTypeKHR::FLOAT64 => "f64",
        vk::ComponentTypeKHR::SINT8 => "s8",
        vk::ComponentTypeKHR::SINT16 => "s16",
        vk::ComponentTypeKHR::SINT32 => "s32",
        vk::ComponentTypeKHR::SINT64 => "s64",
        vk::ComponentTypeKHR::UINT8 => "u8",
        vk::ComponentTypeKHR::UINT16 => "u16",
        vk::ComponentTypeKHR::UINT32 => "u32",
        vk::ComponentTypeKHR::UINT64 => "u64",
        _ => "other",
    }
}

/// What the driver of one Vulkan adapter offers for cooperative matrices and 8-bit arithmetic.
#[derive(Debug, Clone)]
pub struct DriverOffer {
    pub configs: Vec<Config>,
    pub shader_int8: bool,
    pub integer_dot_product: bool,
}

/// The driver's own list of `adapter`'s configurations (none where it lacks the extension).
pub fn driver_offer(adapter: &wgpu::Adapter) -> Result<DriverOffer> {
    let name = adapter.get_info().name;
    // SAFETY: the hal adapter and its instance are only read; the calls take the adapter's own
    // physical device and the extension is asked for only where the driver lists it.
    unsafe {
        let hal_adapter = adapter.as_hal::<hal::api::Vulkan>().ok_or_else(|| anyhow!("{name} is not a Vulkan adapter"))?;
        let shared = hal_adapter.shared_instance();
        let (entry, instance) = (shared.entry(), shared.raw_instance());
        let physical = hal_adapter.raw_physical_device();
        let extensions = instance.enumerate_device_extension_properties(physical)?;
        let has = |ext: &std::ffi::CStr| extensions.iter().any(|e| e.extension_name_as_c_str() == Ok(ext));
        let mut f16_int8 = vk::PhysicalDeviceShaderFloat16Int8Features::default();
        let mut dot = vk::PhysicalDeviceShaderIntegerDotProductFeatures::default();
        let mut features = vk::PhysicalDeviceFeatures2::default().push_next(&mut f16_int8);
        if has(ash::khr::shader_integer_dot_product::NAME) {
            features = features.push_next(&mut dot);
        }
        instance.get_physical_device_features2(physical, &mut features);
        let configs = if has(ash::khr::cooperative_matrix::NAME) {
            let coop = ash::khr::cooperative_matrix::Instance::new(entry, instance);
            coop.get_physical_device_cooperative_matrix_properties(physical)?
                .iter()
                .map(|p| Config {
                    m: p.m_size,
                    n: p.n_size,
                    k: p.k_size,
                    types: [component(p.a_type), component(p.b_type), component(p.c_type), component(p.result_type)],
                    saturating: p.saturating_accumulation != 0,
                    subgroup_scope: p.scope == vk::ScopeKHR::SUBGROUP,
                })
                .collect()
        } else {
            Vec::new()
        };
        Ok(DriverOffer { configs, shader_int8: f16_int8.shader_int8 != 0, integer_dot_product: dot.shader_integer_dot_product != 0 })
    }
}

pub fn run(args: Args) -> Result<bool> {
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle());
    let wanted = args.adapter.as_deref().map(str::to_lowercase);
    let mut seen = false;
    for adapter in pollster::block_on(instance.enumerate_adapters(wgpu::Backends::VULKAN)) {
        let info = adapter.get_info();
        if wanted.as_ref().is_some_and(|w| !info.name.to_lowercase().contains(w)) {
            continue;
        }
        seen = true;
        println!("adapter: {} (driver {} {})", info.name, info.driver, info.driver_info);
        let offer = driver_offer(&adapter)?;
        println!("  shaderInt8: {}, shaderIntegerDotProduct: {}", offer.shader_int8, offer.integer_dot_product);
        println!("  driver's cooperative-matrix configurations ({}):", offer.configs.len());
        for c in &offer.configs {
            println!("    {c}");
        }
        let listed = adapter.cooperative_matrix_properties();
        println!("  wgpu's list ({}): {listed:?}", listed.len());
    }
    if !seen {
        return Err(anyhow!("no Vulkan adapter{}", args.adapter.map(|a| format!(" named like {a}")).unwrap_or_default()));
    }
    Ok(true)
}

//! Every kernel key ([`KernelKey::all`]: each variant the planner or a tuning knob can choose)
//! renders WGSL that parses and validates with naga, offline (no GPU needed), under the
//! capabilities it needs, and declares the bindings the shared convention promises: a uniform at
//! binding 0 and one storage buffer per declared access, read-only exactly where declared so.

use dg_kernels::{Access, KernelKey};
use naga::valid::Capabilities;

/// What a portable kernel may use: f16 in shaders (the half-activation variants, on devices with
/// `SHADER_F16`), `unpack2x16float` (the F16 weights, every backend wgpu reaches), and subgroups
/// (the subgroup reductions), never cooperative matrices.
const PORTABLE: Capabilities = Capabilities::SHADER_FLOAT16.union(Capabilities::SHADER_FLOAT16_IN_FLOAT32).union(Capabilities::SUBGROUP);

#[test]
fn every_key_validates() {
    let keys = KernelKey::all();
    assert!(keys.len() > 500, "{} keys", keys.len());
    // Thousands of keys: a share of them a thread.
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    std::thread::scope(|scope| {
        for share in keys.chunks(keys.len().div_ceil(threads)) {
            scope.spawn(move || share.iter().for_each(validate));
        }
    });
}

/// The dense kernel in either ring (`coop_gemm::source_for_ring`: the probes' variants, not
/// planner keys) validates too, on both staged paths, at every depth, with either A format, on the
/// planner's tiles (dg-lab validates its own tiles).
#[test]
fn probed_dense_rings_validate() {
    use dg_kernels::coop_gemm::{self, AFormat, BLayout, WPath};
    use dg_kernels::coop_kloop::{MAX_DEPTH, Ring};
    let caps = PORTABLE | Capabilities::COOPERATIVE_MATRIX;
    for tile in [coop_gemm::TILE_128X128, coop_gemm::TILE_64X64] {
        for path in [WPath::Staged, WPath::Single] {
            for depth in 1..=MAX_DEPTH {
                for a in [AFormat::F32, AFormat::F16] {
                    for ring in [Ring::Staggered, Ring::Batched] {
                        let k = coop_gemm::source_for_ring(
                            tile.with_depth(depth).on_path(path),
                            path,
                            dg_kernels::WeightFormat::F16,
                            BLayout::NkPanels,
                            a,
                            ring,
                        );
                        assert_eq!(k.name.ends_with("_batched"), ring == Ring::Batched, "{}", k.name);
                        let module =
                            naga::front::wgsl::parse_str(&k.wgsl).unwrap_or_else(|e| panic!("{}: {}", k.name, e.emit_to_string(&k.wgsl)));
                        naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps)
                            .validate(&module)
                            .unwrap_or_else(|e| panic!("{}: {e:?}", k.name));
                    }
                }
            }
        }
    }
}

/// `key`'s kernel parses, validates under the capabilities it needs and declares its bindings as
/// the convention promises.
fn validate(key: &KernelKey) {
    let k = key.source();
    let module = naga::front::wgsl::parse_str(&k.wgsl).unwrap_or_else(|e| panic!("{}: {}", k.name, e.emit_to_string(&k.wgsl)));
    let caps = match key.needs_cooperative_matrices() {
        true => PORTABLE | Capabilities::COOPERATIVE_MATRIX,
        false => PORTABLE,
    };
    naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps)
        .validate(&module)
        .unwrap_or_else(|e| panic!("{}: {e:?}", k.name));
    assert_eq!(k.wgsl.contains("coopMultiplyAdd"), key.needs_cooperative_matrices(), "{}", k.name);
    let placeholder = |l: &str| l.trim_start().starts_with("//@") || l.trim() == "// @unroll";
    assert!(!k.wgsl.lines().any(placeholder), "{}: a placeholder left", k.name);
    assert!(module.entry_points.iter().any(|e| e.name == k.entry), "{}: no entry {}", k.name, k.entry);
    let mut storage = Vec::new();
    let mut has_uniform = false;
    for (_, var) in module.global_variables.iter() {
        let Some(binding) = &var.binding else { continue };
        assert_eq!(binding.group, 0, "{}: group {}", k.name, binding.group);
        match var.space {
            naga::AddressSpace::Uniform => {
                assert_eq!(binding.binding, 0, "{}: uniform must be binding 0", k.name);
                has_uniform = true;
            }
            naga::AddressSpace::Storage { access } => {
                let a = if access.contains(naga::StorageAccess::STORE) { Access::ReadWrite } else { Access::Read };
                storage.push((binding.binding, a));
            }
            _ => {}
        }
    }
    storage.sort_by_key(|(b, _)| *b);
    let expected: Vec<(u32, Access)> = k.buffers.iter().enumerate().map(|(i, a)| (i as u32 + 1, *a)).collect();
    assert!(has_uniform, "{}: no uniform params", k.name);
    assert_eq!(storage, expected, "{}: storage bindings differ from the declared accesses", k.name);
}

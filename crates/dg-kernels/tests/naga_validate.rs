//! Every kernel variant parses and validates with naga, offline (no GPU needed), and declares
//! the bindings the shared convention promises: a uniform at binding 0 and one storage buffer per
//! declared access, read-only exactly where declared so.

use dg_kernels::{Access, all_variants};

#[test]
fn every_variant_validates() {
    let variants = all_variants();
    assert!(!variants.is_empty());
    for k in &variants {
        let module = naga::front::wgsl::parse_str(&k.wgsl).unwrap_or_else(|e| panic!("{}: {}", k.name, e.emit_to_string(&k.wgsl)));
        naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all())
            .validate(&module)
            .unwrap_or_else(|e| panic!("{}: {e:?}", k.name));
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
}

#[test]
fn names_are_unique() {
    let variants = all_variants();
    let mut names: Vec<&str> = variants.iter().map(|k| k.name.as_str()).collect();
    names.sort_unstable();
    let before = names.len();
    names.dedup();
    assert_eq!(before, names.len(), "duplicate kernel variant names");
}

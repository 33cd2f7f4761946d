//! The lab's tiles (`dg_lab::tiles`) render valid kernels: every tile at every prefetch depth and
//! stage naming, by every W path, format, layout and A format its kernel takes, parsed and
//! validated by naga (as dg-kernels' `naga_validate` does for the product's keys), so that a lab
//! variable naming one fails on a GPU only for what the GPU does.

use dg_kernels::coop_gemm::{self, AFormat, BLayout, CoopTile, WPath};
use dg_kernels::{CoopGemmKey, KernelKey, WeightFormat, coop_grouped_gemm, coop_kloop};
use dg_lab::tiles;

fn validate(key: KernelKey) {
    let source = key.source();
    let module =
        naga::front::wgsl::parse_str(&source.wgsl).unwrap_or_else(|e| panic!("{}: {}", source.name, e.emit_to_string(&source.wgsl)));
    naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all())
        .validate(&module)
        .unwrap_or_else(|e| panic!("{}: {e:?}", source.name));
}

fn variants(tile: CoopTile) -> impl Iterator<Item = CoopTile> {
    (1..=coop_kloop::MAX_DEPTH)
        .flat_map(move |d| coop_kloop::Stages::ALL.map(|s| tile.with_depth(d).with_stages(s)))
        .filter(|t| t.is_valid())
}

#[test]
fn the_labs_dense_tiles_render_valid_kernels() {
    let mut count = 0;
    for &tile in tiles::DENSE.iter().chain([&tiles::TILE_128X128_W4]) {
        assert!(!coop_gemm::TILES.contains(&tile), "{} is a product tile", tile.label());
        for t in variants(tile) {
            for path in [WPath::Staged, WPath::Direct, WPath::Single] {
                for w in [WeightFormat::F16, WeightFormat::Bf16] {
                    for layout in [BLayout::Nk, BLayout::NkPanels] {
                        let key = CoopGemmKey { tile: t.on_path(path), path, w, layout, a: AFormat::F32 };
                        if key.is_valid() {
                            validate(KernelKey::CoopGemm(key));
                            count += 1;
                        }
                    }
                }
            }
        }
    }
    assert!(count > 20, "only {count} kernels");
}

#[test]
fn the_labs_expert_tiles_render_valid_kernels() {
    let mut count = 0;
    for &tile in tiles::GROUPED {
        assert!(!coop_grouped_gemm::TILES.contains(&tile), "{} is a product tile", tile.label());
        for t in variants(tile) {
            for path in [WPath::Staged, WPath::Direct, WPath::Single].into_iter().filter(|&p| coop_grouped_gemm::runs(t, p)) {
                for a in [AFormat::F32, AFormat::F16] {
                    validate(KernelKey::CoopGroupedGemm { tile: t.on_path(path), path, w: WeightFormat::F16, a });
                    count += 1;
                }
            }
        }
    }
    assert!(count > 10, "only {count} kernels");
}

//! Every kernel variant dg can compile, as a typed key: the planner (dg-gpu) chooses keys, the
//! pipeline cache is keyed by them, and [`KernelKey::all`] enumerates the whole space so that a
//! test renders and validates every one with naga (`tests/naga_validate.rs`). The tiles no
//! planner rule picks are dg-lab's (`dg_lab::tiles`), validated there.
//!
//! A key is small, `Copy` and hashable; [`KernelKey::source`] renders its WGSL (on a cache miss).
//! The Vulkan-native kernels ([`KernelKey::NativeGroupedGemm`]) are keys too, with SPIR-V in place
//! of WGSL ([`KernelKey::native`]); [`KernelKey::all_native`] lists them.

use crate::coop_gemm::{self, AFormat, BLayout, CoopTile, WPath};
use crate::gemm::{self, GemmTile};
use crate::grouped_gemm::{self, GroupedTile};
use crate::native_grouped_gemm::{self, NativeShape, NativeSource};
use crate::native_int8_gemm::{self, Int8Shape};
use crate::row_reduce::RowReduce;
use crate::{
    KernelSource, WeightFormat, axpby, coop_grouped_gemm, coop_kloop, embed, gelu_glu, moe_combine, moe_dispatch, norm_rope,
    residual_norms, rmsnorm, rope, router_topk, sample_rows, softmax, softmax_chunked, split_k,
};

/// Columns a row kernel takes at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Lanes {
    One,
    /// Rows viewed as vec4s (widths, offsets and strides multiples of 4).
    Four,
}

impl Lanes {
    pub const ALL: [Lanes; 2] = [Lanes::One, Lanes::Four];

    /// `lanes` (1 or 4; what [`crate::lanes_for`] gives).
    ///
    /// # Panics
    /// On any other count.
    pub fn of(lanes: u32) -> Lanes {
        match lanes {
            1 => Lanes::One,
            4 => Lanes::Four,
            n => panic!("row kernels take 1 or 4 columns at a time, not {n}"),
        }
    }

    pub const fn count(self) -> u32 {
        match self {
            Lanes::One => 1,
            Lanes::Four => 4,
        }
    }
}

/// A tensor-core dense GEMM (`coop_gemm`): tile (with its prefetch depth), how W reaches the
/// tensor cores, W's storage format and layout, A's format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CoopGemmKey {
    pub tile: CoopTile,
    pub path: WPath,
    pub w: WeightFormat,
    pub layout: BLayout,
    pub a: AFormat,
}

impl CoopGemmKey {
    /// Whether the kernel exists: W fragments loaded directly need F16 `W[n][k]`, the single
    /// stage is F16 or quantized (BF16 and f32 W are converted as they are staged, on the
    /// double-buffered path only), K panels are F16 or blocks one panel wide
    /// (`coop_gemm::panelled`) on tiles of the panels' depth, quantized W is otherwise `W[n][k]`
    /// (ggml blocks along each row).
    pub fn is_valid(self) -> bool {
        let quantized = self.w.is_quantized();
        let path_ok = match self.path {
            WPath::Staged => true,
            WPath::Direct => self.w == WeightFormat::F16 && self.layout != BLayout::Kn,
            WPath::Single => self.w == WeightFormat::F16 || quantized,
        };
        let panels_ok = self.layout != BLayout::NkPanels || (self.tile.bk == coop_gemm::PANEL && coop_gemm::panelled(self.w));
        self.tile.is_valid() && path_ok && panels_ok && (!quantized || self.layout != BLayout::Kn)
    }
}

/// Every kernel variant: see the module documentation. Row kernels carry their reduction and
/// lanes; products their tile and formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KernelKey {
    Rope,
    /// `out = out·beta + x·alpha`, its rows scaled or gated by the variant.
    Axpby(axpby::Variant),
    SampleRows,
    SplitK,
    MoeDispatch,
    MoeCombine(Lanes),
    /// [`KernelKey::MoeCombine`] with each slot's output multiplied by its factor.
    MoeCombineScaled(Lanes),
    /// The embedding lookup from a table chunk stored as the format.
    Embed(WeightFormat),
    RmsNorm(RowReduce, Lanes),
    Softmax(RowReduce, Lanes),
    SoftmaxPartials(RowReduce),
    SoftmaxApply(RowReduce),
    RouterTopk(RowReduce),
    /// Per-head norm and RoPE in workgroups of `wg` (one of `norm_rope::WORKGROUPS`); `half_cache`
    /// stores K and V as f16 (the cache of the tensor-core modes).
    NormRope {
        reduce: RowReduce,
        lanes: Lanes,
        wg: u32,
        half_cache: bool,
    },
    /// Attention's residual and norms; `half_bc` stores the second and third outputs' first as f16
    /// (four lanes only).
    AttentionNorms {
        reduce: RowReduce,
        lanes: Lanes,
        half_bc: bool,
    },
    /// The FFN's residual and norms; `combine` also adds the experts' weighted outputs; `scaled`
    /// multiplies the dense MLP's rows (and the combined experts' slots) by their factors.
    FfnNorms {
        reduce: RowReduce,
        lanes: Lanes,
        combine: bool,
        scaled: bool,
    },
    /// `gelu(gate) ⊙ up` from one `[rows, 2·I]` buffer; `half` stores f16.
    GeluGlu {
        lanes: Lanes,
        half: bool,
    },
    /// Two [`KernelKey::GeluGlu`] jobs in one dispatch; `half_b` stores the second's output as f16.
    GeluGluPair {
        lanes: Lanes,
        half_b: bool,
    },
    /// [`KernelKey::GeluGlu`] with each row scaled into f16's range and its factor stored.
    GeluGluScaled {
        reduce: RowReduce,
        lanes: Lanes,
        half: bool,
    },
    /// [`KernelKey::GeluGluPair`] with each row of both jobs scaled into f16's range.
    GeluGluPairScaled {
        reduce: RowReduce,
        lanes: Lanes,
        half_b: bool,
    },
    /// The portable GEMM, W stored as the format.
    Gemm {
        tile: GemmTile,
        w: WeightFormat,
    },
    /// The portable grouped (experts) GEMM, W stored as the format.
    GroupedGemm {
        tile: GroupedTile,
        w: WeightFormat,
    },
    CoopGemm(CoopGemmKey),
    /// The tensor-core grouped GEMM: experts in F16 K panels, or row-major in a quantized format
    /// (`coop_grouped_gemm::reads`).
    CoopGroupedGemm {
        tile: CoopTile,
        path: WPath,
        w: WeightFormat,
        a: AFormat,
    },
    /// The Vulkan-native grouped GEMM of short groups (`native_grouped_gemm`): SPIR-V for one
    /// fragment shape, W format and A format.
    NativeGroupedGemm {
        shape: NativeShape,
        w: WeightFormat,
        a: AFormat,
    },
    /// Its int8 mode (`native_int8_gemm`): activations quantized per 32-value block, `s8 × s8 →
    /// s32` fragments of one shape, W format and A format.
    NativeInt8GroupedGemm {
        shape: Int8Shape,
        w: WeightFormat,
        a: AFormat,
    },
}

impl KernelKey {
    /// The variant's WGSL, entry point and bindings.
    ///
    /// # Panics
    /// On a key outside [`KernelKey::all`] (an invalid tile or combination, or a native kernel,
    /// which has SPIR-V and no WGSL: [`KernelKey::native`]).
    pub fn source(self) -> KernelSource {
        use KernelKey as K;
        match self {
            K::Rope => rope::source(),
            K::Axpby(variant) => axpby::source(variant),
            K::SampleRows => sample_rows::source(),
            K::SplitK => split_k::source(),
            K::MoeDispatch => moe_dispatch::source(),
            K::MoeCombine(lanes) => moe_combine::source_lanes(lanes.count()),
            K::MoeCombineScaled(lanes) => moe_combine::source_scaled(lanes.count()),
            K::Embed(format) => embed::source_for(format),
            K::RmsNorm(r, lanes) => rmsnorm::source_lanes(r, lanes.count()),
            K::Softmax(r, lanes) => softmax::source_lanes(r, lanes.count()),
            K::SoftmaxPartials(r) => softmax_chunked::partials(r),
            K::SoftmaxApply(r) => softmax_chunked::apply(r),
            K::RouterTopk(r) => router_topk::source(r),
            K::NormRope { reduce, lanes, wg, half_cache } => norm_rope::source_for(reduce, lanes.count(), wg, half_cache),
            K::AttentionNorms { reduce, lanes, half_bc: false } => residual_norms::source_attention_lanes(reduce, lanes.count()),
            K::AttentionNorms { reduce, lanes, half_bc: true } => {
                assert_eq!(lanes, Lanes::Four, "the half attention norms take four columns at a time");
                residual_norms::source_attention_half(reduce)
            }
            K::FfnNorms { reduce, lanes, combine: false, scaled: false } => residual_norms::source_ffn_lanes(reduce, lanes.count()),
            K::FfnNorms { reduce, lanes, combine: true, scaled: false } => residual_norms::source_ffn_combine_lanes(reduce, lanes.count()),
            K::FfnNorms { reduce, lanes, combine, scaled: true } => residual_norms::source_ffn_scaled(reduce, lanes.count(), combine),
            K::GeluGlu { lanes, half } => gelu_glu::fused_lanes(lanes.count(), half),
            K::GeluGluPair { lanes, half_b } => gelu_glu::pair_lanes(half_b, lanes.count()),
            K::GeluGluScaled { reduce, lanes, half } => gelu_glu::fused_scaled(reduce, lanes.count(), half),
            K::GeluGluPairScaled { reduce, lanes, half_b } => gelu_glu::pair_scaled(reduce, lanes.count(), half_b),
            K::Gemm { tile, w } => gemm::source_for(tile, w),
            K::GroupedGemm { tile, w } => grouped_gemm::source_for(tile, w),
            K::CoopGemm(k) => {
                assert!(k.is_valid(), "no tensor-core GEMM {k:?}");
                coop_gemm::source_for_a(k.tile, k.path, k.w, k.layout, k.a)
            }
            K::CoopGroupedGemm { tile, path, w, a } => coop_grouped_gemm::source_for(tile, path, w, a),
            K::NativeGroupedGemm { .. } | K::NativeInt8GroupedGemm { .. } => {
                panic!("{self:?} is a native kernel: SPIR-V, no WGSL (KernelKey::native)")
            }
        }
    }

    /// The SPIR-V of a Vulkan-native kernel; `None` for the WGSL ones ([`KernelKey::source`]).
    pub fn native(self) -> Option<NativeSource> {
        match self {
            KernelKey::NativeGroupedGemm { shape, w, a } => Some(native_grouped_gemm::source(shape, w, a)),
            KernelKey::NativeInt8GroupedGemm { shape, w, a } => Some(native_int8_gemm::source(shape, w, a)),
            _ => None,
        }
    }

    /// Every native key: each shape with each format the kernel reads and both A formats, and the
    /// same of the int8 mode.
    pub fn all_native() -> Vec<KernelKey> {
        let mut keys = Vec::new();
        for shape in NativeShape::ALL {
            for w in native_grouped_gemm::FORMATS {
                keys.extend([AFormat::F32, AFormat::F16].map(|a| KernelKey::NativeGroupedGemm { shape, w, a }));
            }
        }
        for shape in Int8Shape::ALL {
            for w in native_int8_gemm::FORMATS {
                keys.extend([AFormat::F32, AFormat::F16].map(|a| KernelKey::NativeInt8GroupedGemm { shape, w, a }));
            }
        }
        keys
    }

    /// Whether the variant runs only on devices with cooperative matrices (and f16 in shaders).
    pub fn needs_cooperative_matrices(self) -> bool {
        matches!(
            self,
            KernelKey::CoopGemm(_)
                | KernelKey::CoopGroupedGemm { .. }
                | KernelKey::NativeGroupedGemm { .. }
                | KernelKey::NativeInt8GroupedGemm { .. }
        )
    }

    /// Every WGSL key the planner can choose (the native ones: [`KernelKey::all_native`]): each product tile of each product at
    /// every prefetch depth, with every W path, format, layout and A format its kernel takes.
    pub fn all() -> Vec<KernelKey> {
        use KernelKey as K;
        const FORMATS: [WeightFormat; WeightFormat::ALL.len()] = WeightFormat::ALL;
        const PATHS: [WPath; 3] = [WPath::Staged, WPath::Direct, WPath::Single];
        const A_FORMATS: [AFormat; 2] = [AFormat::F32, AFormat::F16];
        const LAYOUTS: [BLayout; 3] = [BLayout::Nk, BLayout::Kn, BLayout::NkPanels];
        let mut keys = vec![K::Rope, K::SampleRows, K::SplitK, K::MoeDispatch];
        keys.extend(axpby::Variant::ALL.map(K::Axpby));
        keys.extend(Lanes::ALL.map(K::MoeCombine));
        keys.extend(Lanes::ALL.map(K::MoeCombineScaled));
        keys.extend(WeightFormat::ELEMENTS.map(K::Embed));
        for lanes in Lanes::ALL {
            for flag in [false, true] {
                keys.push(K::GeluGlu { lanes, half: flag });
                keys.push(K::GeluGluPair { lanes, half_b: flag });
            }
        }
        for reduce in RowReduce::ALL {
            keys.extend([K::SoftmaxPartials(reduce), K::SoftmaxApply(reduce), K::RouterTopk(reduce)]);
            keys.push(K::AttentionNorms { reduce, lanes: Lanes::Four, half_bc: true });
            for lanes in Lanes::ALL {
                keys.extend([K::RmsNorm(reduce, lanes), K::Softmax(reduce, lanes)]);
                for half_cache in [false, true] {
                    keys.extend(norm_rope::WORKGROUPS.map(|wg| K::NormRope { reduce, lanes, wg, half_cache }));
                }
                keys.push(K::AttentionNorms { reduce, lanes, half_bc: false });
                for (combine, scaled) in [(false, false), (true, false), (false, true), (true, true)] {
                    keys.push(K::FfnNorms { reduce, lanes, combine, scaled });
                }
                for half in [false, true] {
                    keys.push(K::GeluGluScaled { reduce, lanes, half });
                    keys.push(K::GeluGluPairScaled { reduce, lanes, half_b: half });
                }
            }
        }
        for w in WeightFormat::ALL {
            keys.extend(gemm::TILES.iter().map(|&tile| K::Gemm { tile, w }));
            keys.extend(grouped_gemm::TILES.iter().map(|&tile| K::GroupedGemm { tile, w }));
        }
        // Every depth, both ways of naming the stages where the loop has two (the single stage
        // has one: its kernel is the same either way), and every fragment side.
        let depths = |tiles: &'static [CoopTile]| {
            tiles
                .iter()
                .flat_map(|&t| coop_gemm::FRAGMENTS.map(|f| t.with_fragment(f)))
                .flat_map(|t| (1..=coop_kloop::MAX_DEPTH).map(move |d| t.with_depth(d)))
                .flat_map(|t| coop_kloop::Stages::ALL.map(|stages| t.with_stages(stages)))
                .filter(|t| t.is_valid())
        };
        let staged_twice = |tile: CoopTile, path: WPath| tile.on_path(path) == tile;
        for tile in depths(coop_gemm::TILES) {
            for path in PATHS {
                for w in FORMATS {
                    for layout in LAYOUTS {
                        for a in A_FORMATS {
                            let key = CoopGemmKey { tile, path, w, layout, a };
                            if key.is_valid() && staged_twice(tile, path) {
                                keys.push(K::CoopGemm(key));
                            }
                        }
                    }
                }
            }
        }
        for tile in depths(coop_grouped_gemm::TILES) {
            for path in PATHS.into_iter().filter(|&path| coop_grouped_gemm::runs(tile, path) && staged_twice(tile, path)) {
                for w in FORMATS.into_iter().filter(|&w| coop_grouped_gemm::reads(w, path)) {
                    keys.extend(A_FORMATS.map(|a| K::CoopGroupedGemm { tile, path, w, a }));
                }
            }
        }
        keys
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_unique_and_name_their_kernels_uniquely() {
        let keys = KernelKey::all();
        let unique: std::collections::HashSet<_> = keys.iter().collect();
        assert_eq!(unique.len(), keys.len(), "a key listed twice");
        let mut names: Vec<String> = keys.iter().map(|k| k.source().name).collect();
        names.sort_unstable();
        let before = names.len();
        names.dedup();
        assert_eq!(names.len(), before, "two keys render kernels of the same name");
    }

    #[test]
    fn invalid_tensor_core_combinations_are_not_keys() {
        let key =
            CoopGemmKey { tile: coop_gemm::TILE_64X64, path: WPath::Direct, w: WeightFormat::F16, layout: BLayout::Kn, a: AFormat::F32 };
        assert!(!key.is_valid(), "direct W fragments from W[k][n]");
        assert!(!CoopGemmKey { path: WPath::Single, w: WeightFormat::Bf16, layout: BLayout::Nk, ..key }.is_valid());
        assert!(CoopGemmKey { path: WPath::Single, layout: BLayout::Nk, ..key }.is_valid());
        assert!(!KernelKey::all().contains(&KernelKey::CoopGemm(key)));
    }
}

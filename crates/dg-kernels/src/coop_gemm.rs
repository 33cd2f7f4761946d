//! Tensor-core GEMM through cooperative matrices: [`crate::gemm`]'s strided, batched product,
//! with the same [`GemmParams`], whose products run on the matrix units (NVIDIA tensor cores)
//! through WGSL's cooperative matrix types, 16×16×16 fragments with f16 inputs and f32
//! accumulation. The F16 mode runs the linear layers, K/V, the tied head and attention on it.
//!
//! ```text
//! C[b][i, j] = epilogue(alpha · Σ_p f16(A[b][i, p]) · f16(B[b / div][p, j]) (+ C))
//! A[b][i, p] = a[a_offset + b·a_batch + i·a_rs + p]          (a_cs = 1)
//! B[b][p, j] = w[b_offset + b·b_batch + p·b_rs + j·b_cs]      (b_rs = 1: W[n][k]; b_cs = 1: B[k][n])
//! C[b][i, j] = c[c_offset + b·c_batch + i·c_rs + j]
//! ```
//!
//! - `a` (binding 1, read): f32, rounded to f16 (the device's conversion) when staged;
//! - `w` (binding 2, read): F16 (two per u32 word, element `i` in bits `16·(i & 1)..` of word
//!   `i >> 1`, see [`crate::pack_f16`]), BF16 (the same packing, widened exactly and then rounded
//!   to f16, exact for values in f16's normal range), f32 (rounded to f16) or ggml's quantized
//!   blocks (dequantized in f32 with ggml's arithmetic and rounded to f16 as they are staged; see
//!   [`crate::format::CoopW`]), read four elements at a time; laid out as [`BLayout::Nk`] (PyTorch's
//!   `[out, in]`), [`BLayout::Kn`], or (F16, and blocks a panel wide) [`BLayout::NkPanels`]
//!   (`[out, in]` in K panels of [`PANEL`] columns: each K step's block of W one contiguous run,
//!   which an H200 streams 10–20% faster than 64-byte pieces of `bn` rows);
//! - `c` (binding 3, read-write): f32; alpha, accumulate and the softcap epilogue as in
//!   [`crate::gemm`], applied through a per-subgroup scratch of workgroup memory (a plain product
//!   stores its fragments straight to C).
//!
//! Binding 0 is the uniform [`GemmParams`], as for the f32 GEMM; [`plan`] says whether a product
//! is one this kernel takes (vec4-aligned offsets and strides, whole n and k tiles) and with which
//! tile. The last m tile may be partial (an encoder chunk's rows): its extra rows repeat A's last
//! row and are not stored.
//!
//! Requirements, none of them checked by the kernel:
//! - `n`, `k` multiples of the tile's `bn`, `bk` ([`CoopTile::fits`]); m, k > 0; the
//!   alignment [`plan`] checks;
//! - the device opened with `wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX` and
//!   `wgpu::Features::SHADER_F16`, the former only granted with
//!   `DeviceDescriptor::experimental_features` set to `unsafe { ExperimentalFeatures::enabled() }`,
//!   and the adapter listing a configuration with f16 A/B and f32 C of the tile's fragment side,
//!   16×16×16 ([`FRAGMENT`]) or 8×8×8 ([`FRAGMENTS`]), in `Adapter::cooperative_matrix_properties()`
//!   (wgpu's Vulkan backend exposes the feature as soon as `VK_KHR_cooperative_matrix` reports any
//!   subgroup-scope configuration with sizes 8 or 16 and the device supports the Vulkan memory
//!   model at device scope; Mesa's lavapipe has 8×8×8 from Mesa 25.1 or so, with subgroups of 8);
//! - invocation `t` in the kernel's subgroup `t / 32` ([`SUBGROUP_SIZE`]): the device's subgroups
//!   of 32 (`AdapterInfo::subgroup_min_size` and `subgroup_max_size` both 32, as on NVIDIA), or of a
//!   fixed size that divides 32, whose subgroups within one of the kernel's all load, multiply and
//!   store the same fragments (the same values, written alike: lavapipe's 8);
//! - workgroup memory of [`CoopTile::dense_shared_bytes`] (up to 48 KiB, above the WebGPU default
//!   of 16 KiB: the device must be opened with the adapter's `max_compute_workgroup_storage_size`).
//!
//! The kernel is therefore not part of [`crate::all_variants`] (naga validates it offline in this
//! module's tests, with the cooperative-matrix capability).
//!
//! Tiling: one workgroup per `bm × bn` tile of C, `bm/wm · bn/wn` subgroups of 32 invocations, each
//! owning a `wm × wn` block as `(wm/16)·(wn/16)` f32 accumulator fragments (of 16 × 16, or of the
//! tile's [`CoopTile::fragment`]); K in steps of `bk`
//! through two stages of workgroup memory (the next step's global loads are in flight while the
//! current one multiplies, or [`CoopTile::depth`] steps ahead; one barrier a step;
//! [`crate::coop_kloop`], shared with [`crate::coop_grouped_gemm`]). With [`WPath::Direct`] only
//! A is staged and each subgroup loads its W fragments straight from the buffer (same module): slower
//! for these dense products on an H200, faster for the experts'. A product may also split its K
//! into ranges, one layer of workgroups each, whose partials [`crate::split_k`] adds ([`Split`]).
//! See `wgsl/coop_gemm.wgsl`.

mod render;
mod split;

pub use crate::coop_kloop::Stages;
pub use split::Split;

use crate::gemm::GemmParams;
use crate::{Access, KernelSource, WeightFormat};

/// Invocations of one subgroup the kernel assumes.
pub const SUBGROUP_SIZE: u32 = 32;
/// Side of the cooperative-matrix fragments the tiles are written for (16×16×16: NVIDIA's, AMD's
/// and Intel's f16 configurations).
pub const FRAGMENT: u32 = 16;
/// The fragment sides the kernels render, preferred first: [`FRAGMENT`], or 8×8×8 where a device
/// offers no larger one (lavapipe, whose cooperative matrices run the tensor-core kernels on the
/// CPU for tests). Every tile side is a multiple of each.
pub const FRAGMENTS: [u32; 2] = [FRAGMENT, 8];
/// Halves of padding after each staged row (16 bytes: fragment loads of 8 rows hit distinct
/// banks).
pub const ROW_PAD: u32 = 8;
/// Most invocations a tile's workgroup may have (the WebGPU default limit).
pub const MAX_INVOCATIONS: u32 = 256;
/// Most workgroup memory a tile may use, in bytes (NVIDIA's Vulkan limit, 48 KiB).
pub const MAX_SHARED_BYTES: u32 = 48 * 1024;

/// How B is laid out, given the GEMM's strides (`B[k, n] = w[k·b_rs + n·b_cs]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BLayout {
    /// `b_rs = 1`: `W[n][k]` rows of `b_cs` (PyTorch's `[out, in]`: linear layers, attention's
    /// keys).
    Nk,
    /// `b_cs = 1`: `B[k][n]` rows of `b_rs` (attention's values).
    Kn,
    /// F16 `W[n][k]` in K panels of [`PANEL`] columns (`[k / PANEL][n][PANEL]` for each batch's
    /// `n` rows, as [`crate::coop_grouped_gemm::pack_f16_panels`] writes them): every K step's
    /// `bn × bk` block of W one contiguous run. The product's `n` is the matrix's row count, `b_cs`
    /// its `k`; tiles with `bk = PANEL` only.
    NkPanels,
}

/// Columns of K per panel of [`BLayout::NkPanels`]: every panelled tile's `bk`.
pub const PANEL: u32 = 32;

/// Whether W stored as `w` can be read in [`BLayout::NkPanels`]: F16, or a quantized format whose
/// blocks are one panel wide (Q8_0, Q5_0: the upload then puts block p of every row together,
/// which is the F16 panels' element order).
pub fn panelled(w: WeightFormat) -> bool {
    match w {
        WeightFormat::F16 => true,
        WeightFormat::Quantized(q) => q.block_len() == PANEL as usize,
        WeightFormat::F32 | WeightFormat::Bf16 => false,
    }
}

impl BLayout {
    fn suffix(self) -> &'static str {
        match self {
            BLayout::Nk => "",
            BLayout::Kn => "_kn",
            BLayout::NkPanels => "_kp",
        }
    }
}

/// How the W fragments reach the tensor cores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WPath {
    /// Staged through workgroup memory with A (one barrier a step for both).
    Staged,
    /// Loaded by each subgroup straight from the buffer, one step ahead (only A is staged).
    Direct,
    /// Staged with A through a single stage (half the workgroup memory of [`WPath::Staged`], two
    /// barriers a step; the loads of later steps wait in registers).
    Single,
}

impl WPath {
    /// `""` or `"_direct"`, for kernel names.
    pub fn suffix(self) -> &'static str {
        match self {
            WPath::Staged => "",
            WPath::Direct => "_direct",
            WPath::Single => "_single",
        }
    }
}

/// How A (the activations) is stored: f32, rounded to f16 as it is staged, or already f16 (the
/// same bits reach the tensor cores; half the bytes cross from L2 to the multiprocessor).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AFormat {
    /// `array<vec4<f32>>`.
    F32,
    /// `array<vec4<f16>>`: four halves per 8 bytes, as [`crate::pack_f16`] packs them.
    F16,
}

impl AFormat {
    /// The WGSL type of one vec4 of A.
    pub fn elem(self) -> &'static str {
        match self {
            AFormat::F32 => "vec4<f32>",
            AFormat::F16 => "vec4<f16>",
        }
    }

    /// The function that pins a prefetched vec4 of A in this format (see `coop_kloop.rs`,
    /// prefetch): `pin_f` or `pin_h`.
    pub(crate) fn pin(self) -> &'static str {
        match self {
            AFormat::F32 => "pin_f",
            AFormat::F16 => "pin_h",
        }
    }

    /// `""` or `"_a16"`, for kernel names.
    pub fn suffix(self) -> &'static str {
        match self {
            AFormat::F32 => "",
            AFormat::F16 => "_a16",
        }
    }
}

/// How the staged tiles are stored in workgroup memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Staging {
    /// `array<f16>`: four 2-byte stores per staged vec4.
    Scalar,
    /// `array<vec4<f16>>`: one 8-byte store per staged vec4; fragment strides count vec4s.
    Vec4,
}

/// One tile variant: a `bm × bn` tile of C per workgroup, K in steps of `bk`, a `wm × wn` block
/// per subgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CoopTile {
    pub bm: u32,
    pub bn: u32,
    pub bk: u32,
    pub wm: u32,
    pub wn: u32,
    pub staging: Staging,
    /// K steps ahead of their use that the global loads are issued (1: the next step's; see
    /// [`crate::coop_kloop`]).
    pub depth: u32,
    /// How the K loop's phases name their stage of workgroup memory (two-stage paths; see
    /// [`Stages`]).
    pub stages: Stages,
    /// Side of the square fragments the subgroups multiply (one of [`FRAGMENTS`]; the planner
    /// sets the device's: `with_fragment`). The same products in the same order along K, in
    /// smaller pieces.
    pub fragment: u32,
}

impl CoopTile {
    /// A `bm × bn` tile in K steps of `bk`, `wm × wn` per subgroup, as the tile tables write them:
    /// vec4 staging, loads one step ahead, alternating stages (each changed with `..` or `with_*`).
    pub const fn vec4(bm: u32, bn: u32, bk: u32, wm: u32, wn: u32) -> CoopTile {
        CoopTile { bm, bn, bk, wm, wn, staging: Staging::Vec4, depth: 1, stages: Stages::Alternating, fragment: FRAGMENT }
    }

    /// Subgroups per workgroup.
    pub const fn subgroups(self) -> u32 {
        (self.bm / self.wm) * (self.bn / self.wn)
    }

    /// Invocations per workgroup.
    pub const fn invocations(self) -> u32 {
        self.subgroups() * SUBGROUP_SIZE
    }

    /// Accumulator fragments per subgroup, along m and along n.
    pub const fn fragments(self) -> (u32, u32) {
        (self.wm / self.fragment, self.wn / self.fragment)
    }

    /// The WGSL type of one fragment of `elem` in role `role` (`A`, `B` or `C`).
    pub(crate) fn fragment_type(self, elem: &str, role: &str) -> String {
        format!("coop_mat{0}x{0}<{elem}, {role}>", self.fragment)
    }

    /// How a subgroup's 32 lanes read one f32 fragment back from its scratch (row-major,
    /// `fragment` values a row): lane `l` takes `values` consecutive values of row `l / lanes`,
    /// starting at column `(l % lanes) · values`. Returns `(values, lanes)`: (8, 2) for 16×16.
    pub(crate) const fn lane_span(self) -> (u32, u32) {
        let values = self.fragment * self.fragment / SUBGROUP_SIZE;
        (values, self.fragment / values)
    }

    /// The start of a fragment's trip through the subgroup's scratch (`fs`, 256 f32s a subgroup)
    /// for the epilogues that C's elements need: accumulator `acc_{i}_{j}` stored there, a
    /// barrier, then `src`, the scratch index of the first of the `values` (of [`Self::lane_span`])
    /// that the lane reads; `indent` before each line. With [`Self::lane_row`] and
    /// [`Self::lane_column`], the one lane map of the dense and grouped kernels' scratch paths.
    pub(crate) fn scratch_trip(self, i: u32, j: u32, indent: &str) -> (String, String) {
        let ((v, lanes), f) = (self.lane_span(), self.fragment);
        let store =
            format!("{indent}let fs = sg * 256u;\n{indent}coopStoreT(acc_{i}_{j}, &scratch[fs], stride_f);\n{indent}workgroupBarrier();\n");
        (store, format!("fs + (lane / {lanes}u) * {f}u + (lane % {lanes}u) * {v}u"))
    }

    /// The fragment row the lane reads back from the scratch (a WGSL expression; see
    /// [`Self::scratch_trip`]).
    pub(crate) fn lane_row(self) -> String {
        format!("lane / {}u", self.lane_span().1)
    }

    /// The first fragment column the lane reads back from the scratch (a WGSL expression).
    pub(crate) fn lane_column(self) -> String {
        let (v, lanes) = self.lane_span();
        format!("(lane % {lanes}u) * {v}u")
    }

    /// Halves of one staged row (`bk` plus the padding).
    pub const fn row_halves(self) -> u32 {
        self.bk + ROW_PAD
    }

    /// Halves per element of the staged tiles.
    pub const fn element_halves(self) -> u32 {
        match self.staging {
            Staging::Scalar => 1,
            Staging::Vec4 => 4,
        }
    }

    /// Workgroup memory of the staging, in bytes: two stages of the A and W tiles, f16.
    pub const fn shared_bytes(self) -> u32 {
        2 * 2 * (self.bm + self.bn) * self.row_halves()
    }

    /// Workgroup memory of the dense kernel, in bytes: the staging plus one 16×16 f32 fragment per
    /// subgroup for the softcap epilogue.
    pub const fn dense_shared_bytes(self) -> u32 {
        self.shared_bytes() + self.subgroups() * FRAGMENT * FRAGMENT * 4
    }

    /// The invariants the kernel relies on: whole fragments per subgroup block, blocks that
    /// divide the tile, K steps of whole fragments, every invocation staging the same number of
    /// vec4s of A and of W, and the limits.
    pub const fn is_valid(self) -> bool {
        let positive = self.bm > 0 && self.bn > 0 && self.bk > 0 && self.wm > 0 && self.wn > 0;
        positive
            && (self.fragment == FRAGMENTS[0] || self.fragment == FRAGMENTS[1])
            && self.wm.is_multiple_of(self.fragment)
            && self.wn.is_multiple_of(self.fragment)
            && self.bk.is_multiple_of(self.fragment)
            && self.bm.is_multiple_of(self.wm)
            && self.bn.is_multiple_of(self.wn)
            && (self.bm * self.bk / 4).is_multiple_of(self.invocations())
            && (self.bn * self.bk / 4).is_multiple_of(self.invocations())
            && self.invocations() <= MAX_INVOCATIONS
            && self.shared_bytes() <= MAX_SHARED_BYTES
            && self.depth >= 1
            && self.depth <= crate::coop_kloop::MAX_DEPTH
    }

    /// Whether the kernel computes an `m × n × k` product with this tile (any `m`: the last m tile
    /// may be partial).
    pub const fn fits(self, m: u32, n: u32, k: u32) -> bool {
        m > 0 && n > 0 && k > 0 && n.is_multiple_of(self.bn) && k.is_multiple_of(self.bk)
    }

    /// This tile with its loads issued `depth` K steps ahead.
    pub const fn with_depth(self, depth: u32) -> CoopTile {
        CoopTile { depth, ..self }
    }

    /// This tile in fragments of `fragment` × `fragment` (one of [`FRAGMENTS`]).
    pub const fn with_fragment(self, fragment: u32) -> CoopTile {
        CoopTile { fragment, ..self }
    }

    /// This tile with its stages named as `stages` says.
    pub const fn with_stages(self, stages: Stages) -> CoopTile {
        CoopTile { stages, ..self }
    }

    /// This tile as `path` runs it: [`WPath::Single`] has one stage and no stages to name, so
    /// its tile keeps [`Stages::Alternating`] (one kernel, one name).
    pub fn on_path(self, path: WPath) -> CoopTile {
        match path {
            WPath::Single => self.with_stages(Stages::Alternating),
            WPath::Staged | WPath::Direct => self,
        }
    }

    /// Workgroups of an `m × n` product: `ceil(m / bm) · n / bn`.
    pub const fn tiles(self, m: u32, n: u32) -> u32 {
        m.div_ceil(self.bm) * (n / self.bn)
    }

    /// `"{bm}x{bn}x{bk}_{wm}x{wn}"` plus `"_v4"` for [`Staging::Vec4`], `"_d{depth}"` for a
    /// depth over 1, `"_cs"` for [`Stages::Constant`] and `"_f{fragment}"` for fragments other
    /// than [`FRAGMENT`].
    pub fn label(self) -> String {
        let staging = match self.staging {
            Staging::Scalar => "",
            Staging::Vec4 => "_v4",
        };
        let depth = if self.depth == 1 { String::new() } else { format!("_d{}", self.depth) };
        let stages = match self.stages {
            Stages::Alternating => "",
            Stages::Constant => "_cs",
        };
        let fragment = if self.fragment == FRAGMENT { String::new() } else { format!("_f{}", self.fragment) };
        format!("{}x{}x{}_{}x{}{staging}{depth}{stages}{fragment}", self.bm, self.bn, self.bk, self.wm, self.wn)
    }
}

/// 64×128 tile, 32×64 per subgroup (4 subgroups, 2×4 fragments each), K steps of 32, vec4
/// staging (30 KiB): 128 workgroups for `256 × 4096`, about one per SM of an H200.
pub const TILE_64X128: CoopTile = CoopTile::vec4(64, 128, 32, 32, 64);
/// 64×64 tile, 32×32 per subgroup (4 subgroups, 2×2 fragments), K steps of 32 (20 KiB): more
/// workgroups (256 for `256 × 4096`).
pub const TILE_64X64: CoopTile = CoopTile::vec4(64, 64, 32, 32, 32);
/// 128×64 tile, 64×32 per subgroup (4 subgroups, 4×2 fragments), K steps of 32 (30 KiB).
pub const TILE_128X64: CoopTile = CoopTile::vec4(128, 64, 32, 64, 32);
/// 128×128 tile, 32×64 per subgroup (8 subgroups, 2×4 fragments), K steps of 32 (40 KiB): the most
/// reuse, few workgroups at 256 rows. Its loads run 3 K steps ahead: alone on its multiprocessor
/// (48 KiB with the scratch), a workgroup has no other to hide its loads' latency behind. On an
/// H200 (`dense_tensor_core_throughput_by_tile_and_split`, 2 splits, µs at depths 1 / 2 / 3 / 4):
/// q 133 / 75 / 60 / 71, o 111 / 81 / 70 / 94, MLP gate/up 82 / 61 / 55 / 73; in the F16 forward
/// the panelled projections 348 → 289 µs a layer, the layers 1.407 → 1.355 ms.
pub const TILE_128X128: CoopTile = CoopTile::vec4(128, 128, 32, 32, 64).with_depth(3);

/// 32×64 tile, 32×32 per subgroup (2 subgroups), K steps of 32 (15 KiB): twice the workgroups of
/// [`TILE_64X64`] (352 for `256 × 2816`).
pub const TILE_32X64: CoopTile = CoopTile::vec4(32, 64, 32, 32, 32);
/// 64×32 tile, 32×32 per subgroup (2 subgroups), K steps of 32 (15 KiB).
pub const TILE_64X32: CoopTile = CoopTile::vec4(64, 32, 32, 32, 32);

/// The tile of attention's products (`B`: the KV cache) where [`TILE_128X128`] would split their
/// K and it would not (dg-gpu's planner prefers it there over [`plan`]'s rule): a sliding layer's
/// values (`N` = head dim 256: 64 tiles of 128×128). On an H200 (µs, 128×128 → 64×64): sliding
/// values 35.0 + 10.8 for the split's reduction → 40.6–42.5 whole (its 256 tiles of 64×64 do not
/// split); sliding scores 53.2 → 51.7–53.1; but a full layer's scores (head dim 512) 67.6 → 73.3
/// and values (unsplit) 50.8 → 65.0, so those keep the large tile. Where both split (a full
/// layer's values over 16640 keys, 128 queries) the large tile is faster: 245 + 26 against
/// 355 + 12.
pub const ATTENTION_TILE: CoopTile = TILE_64X64;

/// Every tile a rule of the planner can choose, in the order [`plan`] looks for the first that
/// fits: [`TILE_64X64`], the fastest on an H200 for both 256-row decoder shapes (`256 × 4096 ×
/// 2816` and `256 × 2816 × 4096`); [`TILE_64X128`] and [`TILE_128X64`] where a product has more
/// 64×64 tiles than a dispatch takes (65535), [`TILE_128X128`] (taken from
/// [`LARGE_TILE_MIN_ROWS`] rows), [`TILE_32X64`] where the workgroup memory holds no 64×64 tile,
/// [`TILE_64X32`] for N a multiple of 32 but not of 64. The tiles no rule picks are dg-lab's.
pub const TILES: &[CoopTile] = &[TILE_64X64, TILE_64X128, TILE_128X64, TILE_128X128, TILE_32X64, TILE_64X32];

const _: () = {
    let mut i = 0;
    while i < TILES.len() {
        let t = TILES[i];
        assert!(t.is_valid(), "a coop gemm tile breaks its invariants (see CoopTile::is_valid)");
        assert!(
            t.dense_shared_bytes() <= MAX_SHARED_BYTES,
            "a coop gemm tile's workgroup memory with the epilogue scratch is over the limit"
        );
        i += 1;
    }
};

/// The kernel for `tile`, named `coop_gemm_{label}`: F16 `W[n][k]`, staged. Bindings: `a` (read),
/// `w` (read), `c` (read-write); parameters [`GemmParams`].
pub fn source(tile: CoopTile) -> KernelSource {
    source_with(tile, WPath::Staged)
}

/// The kernel for `tile` with F16 `W[n][k]` reaching the tensor cores by `path`.
pub fn source_with(tile: CoopTile, path: WPath) -> KernelSource {
    source_for(tile, path, WeightFormat::F16, BLayout::Nk)
}

/// The kernel for `tile` with B stored as `w_format` (F16; BF16 or f32 only with
/// [`WPath::Staged`], each value rounded to f16 when staged) laid out as `layout` ([`WPath::Direct`]
/// only for [`BLayout::Nk`]).
pub fn source_for(tile: CoopTile, path: WPath, w_format: WeightFormat, layout: BLayout) -> KernelSource {
    source_for_a(tile, path, w_format, layout, AFormat::F32)
}

/// [`source_for`] with A stored as `a_format`.
pub fn source_for_a(tile: CoopTile, path: WPath, w_format: WeightFormat, layout: BLayout, a_format: AFormat) -> KernelSource {
    source_for_ring(tile, path, w_format, layout, a_format, crate::coop_kloop::Ring::Staggered)
}

/// [`source_for_a`] with the K loop's loads issued by `ring` (the forward's dense products use
/// [`crate::coop_kloop::Ring::Staggered`]; the batched ring is for measurements).
pub fn source_for_ring(
    tile: CoopTile,
    path: WPath,
    w_format: WeightFormat,
    layout: BLayout,
    a_format: AFormat,
    ring: crate::coop_kloop::Ring,
) -> KernelSource {
    let batched = if ring == crate::coop_kloop::Ring::Batched { "_batched" } else { "" };
    KernelSource {
        name: format!("coop_gemm_{}{}{}{}{}{batched}", tile.label(), path.suffix(), layout.suffix(), w_format.suffix(), a_format.suffix()),
        wgsl: tile.render_with_ring(path, w_format, layout, a_format, ring),
        entry: "main",
        buffers: vec![Access::Read, Access::Read, Access::ReadWrite],
        params_size: size_of::<GemmParams>() as u64,
    }
}

/// The layout in which the kernel reads `p`'s B, if it takes the product at all: A row-major
/// (`a_cs = 1`), B `[n][k]` or `[k][n]` with a unit stride (with `panels`, only a whole `[n][k]`
/// matrix in K panels, [`BLayout::NkPanels`]: `b_rs = 1`, `b_cs = k`, whole panels), every
/// vec4-read offset and stride a multiple of 4, at most 65535 batches. Which tile runs it is the
/// planner's rule (`dg_gpu::planner`).
pub fn layout(p: &GemmParams, panels: bool) -> Option<BLayout> {
    let layout = match (p.b_rs, p.b_cs) {
        (1, cs) if panels && cs == p.k && cs.is_multiple_of(PANEL) => BLayout::NkPanels,
        _ if panels => return None,
        (1, cs) if cs.is_multiple_of(4) => BLayout::Nk,
        (rs, 1) if rs.is_multiple_of(4) => BLayout::Kn,
        _ => return None,
    };
    let batched = p.batch.max(1);
    let aligned = [p.a_offset, p.a_rs, p.b_offset].iter().all(|v| v.is_multiple_of(4))
        && (batched == 1 || (p.a_batch.is_multiple_of(4) && p.b_batch.is_multiple_of(4)));
    (p.a_cs == 1 && aligned && batched <= 65535).then_some(layout)
}

/// Whether `tile` computes `p` with B in `layout` ([`layout`]) on a device with `max_shared`
/// bytes of workgroup memory: whole n and k tiles, at most 65535 tiles, its workgroup memory
/// ([`CoopTile::dense_shared_bytes`]) within the device's, K steps of a panel where B is in
/// panels.
pub fn takes(tile: CoopTile, p: &GemmParams, layout: BLayout, max_shared: u32) -> bool {
    tile.fits(p.m, p.n, p.k)
        && tile.tiles(p.m, p.n) <= 65535
        && tile.dense_shared_bytes() <= max_shared
        && (layout != BLayout::NkPanels || tile.bk == PANEL)
}

/// The dispatch of an `m × n` product over `batch` batches: one workgroup per tile (the last m tile
/// may be partial) in x (at most
/// 65535 tiles), one row per batch in y.
pub fn workgroups(tile: CoopTile, m: u32, n: u32, batch: u32) -> [u32; 3] {
    workgroups_split(tile, m, n, batch, 1)
}

/// [`workgroups`] with K split `splits` ways: one layer of workgroups per split in z.
pub fn workgroups_split(tile: CoopTile, m: u32, n: u32, batch: u32, splits: u32) -> [u32; 3] {
    let total = tile.tiles(m, n);
    assert!(total <= 65535, "coop gemm of {m}x{n}: {total} workgroups, over one dispatch dimension");
    [total, batch.max(1), splits.max(1)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_stages_are_constants_in_every_phase() {
        // The stage of a phase is `(s & 1u)` with alternating stages and a literal with constant
        // ones (the odd ring of depth 3 doubled to six phases); everything else is the same.
        for path in [WPath::Staged, WPath::Direct] {
            let alternating = source_with(TILE_128X128, path).wgsl;
            let constant = source_with(TILE_128X128.with_stages(Stages::Constant), path).wgsl;
            assert!(alternating.contains("let a_st = (s & 1u) * (BM * KP);"), "{path:?}");
            assert!(!constant.contains("& 1u)"), "{path:?}: a stage computed from the step");
            let phases = |wgsl: &str| wgsl.matches("let s = s0 + ").count();
            let sets = if path == WPath::Staged { 3 } else { 4 };
            assert_eq!(phases(&alternating), sets, "{path:?}");
            assert_eq!(phases(&constant), if sets % 2 == 1 { 2 * sets } else { sets }, "{path:?}");
            for ph in 0..phases(&constant) {
                assert!(constant.contains(&format!("let s = s0 + {ph}u;")), "{path:?}");
            }
            assert_eq!(constant.matches("let a_st = 1u * (BM * KP);").count(), phases(&constant) / 2, "{path:?}");
        }
    }

    #[test]
    fn tiles_fit_the_decoder_shapes() {
        for &tile in TILES {
            assert!(tile.fits(256, 4096, 2816), "{}", tile.label());
            assert!(tile.fits(256, 2816, 4096), "{}", tile.label());
        }
        assert!(!TILE_64X128.fits(256, 4096, 2800));
        // Ragged m (an encoder chunk): the last m tile is partial.
        assert!(TILE_64X64.fits(1000, 4096, 2816));
        assert_eq!(TILE_64X64.tiles(1000, 4096), 16 * 64);
    }
}

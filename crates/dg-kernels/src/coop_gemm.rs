//! Tensor-core GEMM through cooperative matrices: a linear layer `C = A·Wᵀ` whose
//! products run on the matrix units (NVIDIA tensor cores) through WGSL's cooperative matrix types,
//! 16×16×16 fragments with f16 inputs and f32 accumulation.
//!
//! ```text
//! C[i, j] = Σ_p f16(A[i, p]) · W[j, p]          i < m, j < n, p < k
//! ```
//!
//! - `a` (binding 1, read): f32 `[m, k]` row-major activations, rounded to f16 (the device's
//!   f32 → f16 conversion) when staged in workgroup memory;
//! - `w` (binding 2, read): f16 `[n, k]` row-major weights (PyTorch `[out, in]`), two per u32
//!   word, element `i` in bits `16·(i & 1) .. 16·(i & 1) + 16` of word `i >> 1` (see
//!   [`crate::pack_f16`]); the kernel binds it as `array<vec4<f16>>`, the same bytes;
//! - `c` (binding 3, read-write): f32 `[m, n]` row-major, every element written (no accumulate).
//!
//! Batched: workgroup row `b` of the dispatch computes batch `b`, whose A, W and C start
//! `b·a_batch`, `b·w_batch`, `b·c_batch` elements in (K and V of a layer in one dispatch).
//!
//! Binding 0 is the uniform [`CoopGemmParams`], as for every dg kernel.
//!
//! Requirements, none of them checked by the kernel:
//! - `m`, `n`, `k` multiples of the tile's `bm`, `bn`, `bk` ([`CoopTile::fits`]); k > 0;
//! - the device opened with `wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX` and
//!   `wgpu::Features::SHADER_F16`, the former only granted with
//!   `DeviceDescriptor::experimental_features` set to `unsafe { ExperimentalFeatures::enabled() }`,
//!   and the adapter listing a 16×16×16 configuration with f16 A/B and f32 C in
//!   `Adapter::cooperative_matrix_properties()` (wgpu's Vulkan backend exposes the feature as soon
//!   as `VK_KHR_cooperative_matrix` reports any subgroup-scope configuration with sizes 8 or 16 and
//!   the device supports the Vulkan memory model at device scope; lavapipe has neither);
//! - subgroups of exactly 32 invocations (`AdapterInfo::subgroup_min_size` and
//!   `subgroup_max_size` both 32, as on NVIDIA): invocation `t` is taken to be in subgroup `t / 32`;
//! - workgroup memory of [`CoopTile::shared_bytes`] (up to 40 KiB, above the WebGPU default of
//!   16 KiB: the device must be opened with the adapter's `max_compute_workgroup_storage_size`).
//!
//! The kernel is therefore not part of [`crate::all_variants`] (naga validates it offline in this
//! module's tests, with the cooperative-matrix capability).
//!
//! Tiling: one workgroup per `bm × bn` tile of C, `bm/wm · bn/wn` subgroups of 32 invocations, each
//! owning a `wm × wn` block as `(wm/16)·(wn/16)` f32 accumulator fragments; K in steps of `bk`
//! through two stages of workgroup memory (the next step's global loads are in flight while the
//! current one multiplies; one barrier a step; `wgsl/coop_kloop.wgsl`, shared with
//! [`crate::coop_grouped_gemm`]). With [`WPath::Direct`] only A is staged and each subgroup loads
//! its W fragments straight from the buffer one step ahead (`wgsl/coop_kloop_direct.wgsl`): slower
//! for these dense products on an H200, faster for the experts'. See `wgsl/coop_gemm.wgsl`.

use bytemuck::{Pod, Zeroable};

use crate::{Access, KernelSource, WeightFormat, with_prelude};

/// Invocations of one subgroup the kernel assumes.
pub const SUBGROUP_SIZE: u32 = 32;
/// Side of one cooperative matrix fragment (16×16×16).
pub const FRAGMENT: u32 = 16;
/// Halves of padding after each staged row (16 bytes: fragment loads of 8 rows hit distinct
/// banks).
pub const ROW_PAD: u32 = 8;
/// Most invocations a tile's workgroup may have (the WebGPU default limit).
pub const MAX_INVOCATIONS: u32 = 256;
/// Most workgroup memory a tile may use, in bytes (NVIDIA's Vulkan limit, 48 KiB).
pub const MAX_SHARED_BYTES: u32 = 48 * 1024;

/// Uniform parameters of `coop_gemm.wgsl`: 32 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable, PartialEq)]
pub struct CoopGemmParams {
    pub m: u32,
    pub n: u32,
    pub k: u32,
    /// Elements between the A of consecutive batches (a multiple of 4).
    pub a_batch: u32,
    /// Elements between the W of consecutive batches (a multiple of 4).
    pub w_batch: u32,
    /// Elements between the C of consecutive batches.
    pub c_batch: u32,
    /// Elements between rows of C (`n` for a packed C).
    pub c_rs: u32,
    /// First element of C.
    pub c_offset: u32,
    /// Softcap of the epilogue.
    pub cap: f32,
    /// 0: store; 1: softcap, `C = cap·tanh(acc / cap)` (the tied head's `final_logit_softcapping`).
    pub epilogue: u32,
    pub pad: [u32; 6],
}

impl CoopGemmParams {
    /// `C[m, n] = A[m, k]·W[n, k]ᵀ`, one batch.
    pub fn new(m: u32, n: u32, k: u32) -> Self {
        CoopGemmParams { m, n, k, c_rs: n, ..Zeroable::zeroed() }
    }

    /// Batch `b` (the dispatch's workgroup row, see [`workgroups`]) computes
    /// `C[b·c_batch..] = A[b·a_batch..]·W[b·w_batch..]ᵀ`.
    pub fn batched(m: u32, n: u32, k: u32, a_batch: u32, w_batch: u32, c_batch: u32) -> Self {
        CoopGemmParams { m, n, k, a_batch, w_batch, c_batch, c_rs: n, ..Zeroable::zeroed() }
    }

    /// The tied head's shape: `C[c_offset + i·c_rs + j] = softcap(A·Wᵀ)[i, j]` for a chunk of the
    /// vocabulary (`cap` `None`: no softcap).
    pub fn strided(m: u32, n: u32, k: u32, c_rs: u32, c_offset: u32, cap: Option<f32>) -> Self {
        CoopGemmParams { m, n, k, c_rs, c_offset, cap: cap.unwrap_or(0.0), epilogue: u32::from(cap.is_some()), ..Zeroable::zeroed() }
    }
}

/// How the W fragments reach the tensor cores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WPath {
    /// Staged through workgroup memory with A (one barrier a step for both).
    Staged,
    /// Loaded by each subgroup straight from the buffer, one step ahead (only A is staged).
    Direct,
}

impl WPath {
    /// `""` or `"_direct"`, for kernel names.
    pub fn suffix(self) -> &'static str {
        match self {
            WPath::Staged => "",
            WPath::Direct => "_direct",
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
}

impl CoopTile {
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
        (self.wm / FRAGMENT, self.wn / FRAGMENT)
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
            && self.wm.is_multiple_of(FRAGMENT)
            && self.wn.is_multiple_of(FRAGMENT)
            && self.bk.is_multiple_of(FRAGMENT)
            && self.bm.is_multiple_of(self.wm)
            && self.bn.is_multiple_of(self.wn)
            && (self.bm * self.bk / 4).is_multiple_of(self.invocations())
            && (self.bn * self.bk / 4).is_multiple_of(self.invocations())
            && self.invocations() <= MAX_INVOCATIONS
            && self.shared_bytes() <= MAX_SHARED_BYTES
    }

    /// Whether the kernel computes an `m × n × k` product with this tile.
    pub const fn fits(self, m: u32, n: u32, k: u32) -> bool {
        m > 0 && n > 0 && k > 0 && m.is_multiple_of(self.bm) && n.is_multiple_of(self.bn) && k.is_multiple_of(self.bk)
    }

    /// `"{bm}x{bn}x{bk}_{wm}x{wn}"` plus `"_v4"` for [`Staging::Vec4`].
    pub fn label(self) -> String {
        let staging = match self.staging {
            Staging::Scalar => "",
            Staging::Vec4 => "_v4",
        };
        format!("{}x{}x{}_{}x{}{staging}", self.bm, self.bn, self.bk, self.wm, self.wn)
    }

    fn prelude(self) -> Vec<(&'static str, u32)> {
        let kp = self.row_halves();
        let se = self.element_halves();
        let bk4 = self.bk / 4;
        vec![
            ("BM", self.bm),
            ("BN", self.bn),
            ("BK", self.bk),
            ("BK4", bk4),
            ("WM", self.wm),
            ("WN", self.wn),
            ("SGN", self.bn / self.wn),
            ("WT", self.invocations()),
            ("KP", kp),
            ("KPS", kp / se),
            ("LA", self.bm * bk4 / self.invocations()),
            ("LW", self.bn * bk4 / self.invocations()),
            ("SAL", 2 * self.bm * kp / se),
            ("SBL", 2 * self.bn * kp / se),
        ]
    }

    /// The full WGSL of the dense kernel for this variant, F16 W staged.
    pub fn render(self) -> String {
        self.render_with(WPath::Staged, WeightFormat::F16)
    }

    /// The full WGSL of the dense kernel for this variant, W stored as `w_format` (F16, or BF16
    /// when staged) reaching the tensor cores by `path`.
    pub fn render_with(self, path: WPath, w_format: WeightFormat) -> String {
        let (fm, fn_) = self.fragments();
        let mut store = String::new();
        for i in 0..fm {
            for j in 0..fn_ {
                store += &format!(
                    "    {{\n        let ic = c_base + (m0 + sm + {}u) * p.c_rs + n0 + sn + {}u;\n        coopStoreT(acc_{i}_{j}, &c[ic], stride_c);\n    }}\n",
                    i * FRAGMENT,
                    j * FRAGMENT
                );
            }
        }
        // Softcap: each fragment through the subgroup's scratch; lane l writes 8 values of row l / 2.
        let mut capped = String::new();
        for i in 0..fm {
            for j in 0..fn_ {
                let (di, dj) = (i * FRAGMENT, j * FRAGMENT);
                capped += &format!(
                    "        {{\n            let fs = sg * 256u;\n            coopStoreT(acc_{i}_{j}, &scratch[fs], stride_f);\n            workgroupBarrier();\n\
                     \x20           let src = fs + (lane / 2u) * 16u + (lane % 2u) * 8u;\n\
                     \x20           let dst = c_base + (m0 + sm + {di}u + lane / 2u) * p.c_rs + n0 + sn + {dj}u + (lane % 2u) * 8u;\n\
                     \x20           for (var q = 0u; q < 8u; q++) {{\n\
                     \x20               // tanh(±10) is already ±1 in f32; the clamp keeps exp-based tanh lowerings finite.\n\
                     \x20               c[dst + q] = p.cap * tanh(clamp(scratch[src + q] / p.cap, -10.0, 10.0));\n\
                     \x20           }}\n            workgroupBarrier();\n        }}\n"
                );
            }
        }
        self.expand_path(include_str!("wgsl/coop_gemm.wgsl"), "w_src[l]", path, w_format, vec![("//@STORE_CAPPED\n", capped), ("//@STORE\n", store)])
    }

    /// [`Self::expand`] for W reaching the tensor cores by `path`: with [`WPath::Direct`] the
    /// template's `sb` is dropped and the K loop is `coop_kloop_direct.wgsl`, whose W fragments
    /// start at `w_sub` (a `let` of the template), `stride_w` vec4s between W rows, `w_step` between
    /// steps.
    pub(crate) fn expand_path(self, template: &str, w_at: &str, path: WPath, w_format: WeightFormat, mut pieces: Vec<(&str, String)>) -> String {
        match path {
            WPath::Staged => self.expand(template, w_at, w_format, &pieces),
            WPath::Direct => {
                let (_, fn_) = self.fragments();
                let (mut init, mut next, mut rotate) = (String::new(), String::new(), String::new());
                for kk in 0..self.bk / FRAGMENT {
                    for j in 0..fn_ {
                        let at = format!("{}u * stride_w + {}u", j * FRAGMENT, kk * FRAGMENT / 4);
                        init += &format!("    let iw_{kk}_{j} = w_sub + {at};\n    var fb_{kk}_{j} = coopLoad<coop_mat16x16<f16, B>>(&w[iw_{kk}_{j}], stride_w);\n");
                        next += &format!("        let inw_{kk}_{j} = w_next + {at};\n        let nb_{kk}_{j} = coopLoad<coop_mat16x16<f16, B>>(&w[inw_{kk}_{j}], stride_w);\n");
                        rotate += &format!("        fb_{kk}_{j} = nb_{kk}_{j};\n");
                    }
                }
                pieces.extend([("//@FB_INIT\n", init), ("//@FB_NEXT\n", next), ("//@FB_ROTATE\n", rotate)]);
                let template = template.replace("var<workgroup> sb: array<SElem, SBL>;\n", "");
                let fragment = |kk: u32, j: u32| format!("fb_{kk}_{j}");
                self.expand_with(&template, include_str!("wgsl/coop_kloop_direct.wgsl"), "", w_format, Some(&fragment), &pieces)
            }
        }
    }

    /// `template` with the tile's pieces filled in: the staging element and its stores
    /// (`//@PUT`), the accumulators (`//@ACC`, inside the shared K loop `//@KLOOP`, which reads
    /// W's vec4 `l` of step 0 at the expression `w_at`), the unrolled fragment products
    /// (`//@MULTIPLY`), then the kernel's own `pieces`; `enable`s and the const prelude in front,
    /// `// @unroll` loops expanded.
    pub(crate) fn expand(self, template: &str, w_at: &str, w_format: WeightFormat, pieces: &[(&str, String)]) -> String {
        self.expand_with(template, include_str!("wgsl/coop_kloop.wgsl"), w_at, w_format, None, pieces)
    }

    /// [`Self::expand`] with the K loop `kloop`, and with `b_fragment(kk, j)` naming the B
    /// fragment of K slice `kk`, column block `j` when the W fragments do not come from the
    /// staged `sb` (then no `sb` or `put_b` exists).
    pub(crate) fn expand_with(
        self,
        template: &str,
        kloop: &str,
        w_at: &str,
        w_format: WeightFormat,
        b_fragment: Option<&dyn Fn(u32, u32) -> String>,
        pieces: &[(&str, String)],
    ) -> String {
        assert!(self.is_valid(), "coop gemm tile {} breaks its invariants", self.label());
        let (fm, fn_) = self.fragments();
        let se = self.element_halves();
        let (elem, mut put) = match self.staging {
            Staging::Scalar => (
                "f16",
                "fn put_a(at: u32, v: vec4<f16>) {\n    sa[at] = v.x;\n    sa[at + 1u] = v.y;\n    sa[at + 2u] = v.z;\n    sa[at + 3u] = v.w;\n}\n\
                 fn put_b(at: u32, v: vec4<f16>) {\n    sb[at] = v.x;\n    sb[at + 1u] = v.y;\n    sb[at + 2u] = v.z;\n    sb[at + 3u] = v.w;\n}\n",
            ),
            Staging::Vec4 => (
                "vec4<f16>",
                "fn put_a(at: u32, v: vec4<f16>) {\n    sa[at / 4u] = v;\n}\n\
                 fn put_b(at: u32, v: vec4<f16>) {\n    sb[at / 4u] = v;\n}\n",
            ),
        };
        // Named accumulators and fragments (no arrays of cooperative matrices).
        let mut acc = String::new();
        for i in 0..fm {
            for j in 0..fn_ {
                acc += &format!("    var acc_{i}_{j} = coop_mat16x16<f32, C>();\n");
            }
        }
        let mut multiply = String::new();
        for kk in 0..self.bk / FRAGMENT {
            multiply += "        {\n";
            for i in 0..fm {
                multiply += &format!(
                    "            let ia{i} = (a_st + (sm + {}u) * KP + {}u) / {se}u;\n            let fa{i} = coopLoadT<coop_mat16x16<f16, A>>(&sa[ia{i}], stride_s);\n",
                    i * FRAGMENT,
                    kk * FRAGMENT
                );
            }
            if b_fragment.is_none() {
                for j in 0..fn_ {
                    multiply += &format!(
                        "            let ib{j} = (b_st + (sn + {}u) * KP + {}u) / {se}u;\n            let fb{j} = coopLoad<coop_mat16x16<f16, B>>(&sb[ib{j}], stride_s);\n",
                        j * FRAGMENT,
                        kk * FRAGMENT
                    );
                }
            }
            for i in 0..fm {
                for j in 0..fn_ {
                    let fb = match b_fragment {
                        Some(name) => name(kk, j),
                        None => format!("fb{j}"),
                    };
                    multiply += &format!("            acc_{i}_{j} = coopMultiplyAdd(fa{i}, {fb}, acc_{i}_{j});\n");
                }
            }
            multiply += "        }\n";
        }
        if b_fragment.is_some() {
            // No staged W: drop put_b (it would name the absent `sb`).
            put = &put[..put.find("fn put_b").expect("put_b")];
        }
        // W's storage: vec4s of f16, or BF16 pairs in u32 words widened to f32 and rounded to f16
        // when loaded (exact for |w| in f16's normal range).
        let (w_elem, load_w) = match w_format {
            WeightFormat::F16 => ("vec4<f16>", "fn load_w(i: u32) -> vec4<f16> {\n    return w[i];\n}\n"),
            WeightFormat::Bf16 => (
                "vec2<u32>",
                "fn load_w(i: u32) -> vec4<f16> {\n    let v = w[i];\n    return vec4<f16>(vec4<f32>(bitcast<f32>(v.x << 16u), bitcast<f32>(v.x & 0xffff0000u), bitcast<f32>(v.y << 16u), bitcast<f32>(v.y & 0xffff0000u)));\n}\n",
            ),
            WeightFormat::F32 => panic!("the tensor-core GEMM takes 16-bit weights"),
        };
        assert!(w_format == WeightFormat::F16 || b_fragment.is_none(), "direct W fragments need F16 weights");
        let put = format!("{put}{load_w}");
        let mut body = template.replace("//@KLOOP\n", &kloop.replace("W_AT", w_at)).replace("W_ELEM", w_elem);
        // Where the invocation's vec4 number e of a step goes in a stage, in halves.
        let put = format!("{put}fn dst_of(e: u32) -> u32 {{\n    return (e / BK4) * KP + 4u * (e % BK4);\n}}\n");
        body = body.replace("SELEM_TYPE", elem).replace("//@PUT\n", &put).replace("//@ACC\n", &acc).replace("//@MULTIPLY\n", &multiply);
        for (marker, text) in pieces {
            assert!(body.contains(marker), "template lacks {marker}");
            body = body.replace(marker, text);
        }
        let consts = self.prelude();
        format!("enable f16;\nenable wgpu_cooperative_matrix;\n{}", with_prelude(&consts, &crate::gemm::unroll(&body, &consts)))
    }
}

/// 64×128 tile, 32×64 per subgroup (4 subgroups, 2×4 fragments each), K steps of 32, vec4
/// staging (30 KiB): 128 workgroups for `256 × 4096`, about one per SM of an H200.
pub const TILE_64X128: CoopTile = CoopTile { bm: 64, bn: 128, bk: 32, wm: 32, wn: 64, staging: Staging::Vec4 };
/// [`TILE_64X128`] with scalar f16 staging (the plainest WGSL).
pub const TILE_64X128_SCALAR: CoopTile = CoopTile { staging: Staging::Scalar, ..TILE_64X128 };
/// 64×64 tile, 32×32 per subgroup (4 subgroups, 2×2 fragments), K steps of 32 (20 KiB): more
/// workgroups (256 for `256 × 4096`).
pub const TILE_64X64: CoopTile = CoopTile { bm: 64, bn: 64, bk: 32, wm: 32, wn: 32, staging: Staging::Vec4 };
/// [`TILE_64X64`] with K steps of 64 (36 KiB): half the barriers.
pub const TILE_64X64_K64: CoopTile = CoopTile { bk: 64, ..TILE_64X64 };
/// 128×64 tile, 64×32 per subgroup (4 subgroups, 4×2 fragments), K steps of 32 (30 KiB).
pub const TILE_128X64: CoopTile = CoopTile { bm: 128, bn: 64, bk: 32, wm: 64, wn: 32, staging: Staging::Vec4 };
/// 128×128 tile, 32×64 per subgroup (8 subgroups, 2×4 fragments), K steps of 32 (40 KiB): the most
/// reuse, few workgroups at 256 rows.
pub const TILE_128X128: CoopTile = CoopTile { bm: 128, bn: 128, bk: 32, wm: 32, wn: 64, staging: Staging::Vec4 };

/// 32×64 tile, 32×32 per subgroup (2 subgroups), K steps of 32 (15 KiB): twice the workgroups of
/// [`TILE_64X64`] (352 for `256 × 2816`).
pub const TILE_32X64: CoopTile = CoopTile { bm: 32, bn: 64, bk: 32, wm: 32, wn: 32, staging: Staging::Vec4 };
/// 64×32 tile, 32×32 per subgroup (2 subgroups), K steps of 32 (15 KiB).
pub const TILE_64X32: CoopTile = CoopTile { bm: 64, bn: 32, bk: 32, wm: 32, wn: 32, staging: Staging::Vec4 };

/// Every tile variant, the default first: [`TILE_64X64`], the fastest on an H200 for both 256-row
/// decoder shapes (`256 × 4096 × 2816` and `256 × 2816 × 4096`).
pub const TILES: &[CoopTile] =
    &[TILE_64X64, TILE_64X64_K64, TILE_64X128, TILE_64X128_SCALAR, TILE_128X64, TILE_128X128, TILE_32X64, TILE_64X32];

const _: () = {
    let mut i = 0;
    while i < TILES.len() {
        assert!(TILES[i].is_valid(), "a coop gemm tile breaks its invariants (see CoopTile::is_valid)");
        assert!(TILES[i].dense_shared_bytes() <= MAX_SHARED_BYTES, "a coop gemm tile's workgroup memory with the epilogue scratch is over the limit");
        i += 1;
    }
};

/// The kernel for `tile`, named `coop_gemm_{label}`. Bindings: `a` (read), `w` (read), `c`
/// (read-write).
pub fn source(tile: CoopTile) -> KernelSource {
    source_with(tile, WPath::Staged)
}

/// The kernel for `tile` with F16 W reaching the tensor cores by `path`.
pub fn source_with(tile: CoopTile, path: WPath) -> KernelSource {
    source_for(tile, path, WeightFormat::F16)
}

/// The kernel for `tile` with W stored as `w_format` (F16, or BF16 with [`WPath::Staged`]: each
/// BF16 value is widened and rounded to f16 when staged) reaching the tensor cores by `path`.
pub fn source_for(tile: CoopTile, path: WPath, w_format: WeightFormat) -> KernelSource {
    KernelSource {
        name: format!("coop_gemm_{}{}{}", tile.label(), path.suffix(), w_format.suffix()),
        wgsl: tile.render_with(path, w_format),
        entry: "main",
        buffers: vec![Access::Read, Access::Read, Access::ReadWrite],
        params_size: size_of::<CoopGemmParams>() as u64,
    }
}

/// The dispatch of an `m × n` product over `batch` batches: one workgroup per tile in x (at most
/// 65535 tiles), one row per batch in y.
pub fn workgroups(tile: CoopTile, m: u32, n: u32, batch: u32) -> [u32; 3] {
    let total = (m / tile.bm) * (n / tile.bn);
    assert!(total <= 65535, "coop gemm of {m}x{n}: {total} workgroups, over one dispatch dimension");
    [total, batch.max(1), 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_are_a_multiple_of_16_bytes() {
        assert_eq!(size_of::<CoopGemmParams>(), 64);
    }

    #[test]
    fn every_tile_renders_and_validates_with_cooperative_matrices() {
        for k in TILES.iter().flat_map(|&t| [source(t), source_with(t, WPath::Direct), source_for(t, WPath::Staged, WeightFormat::Bf16)]) {
            let module = naga::front::wgsl::parse_str(&k.wgsl).unwrap_or_else(|e| panic!("{}: {}", k.name, e.emit_to_string(&k.wgsl)));
            let caps = naga::valid::Capabilities::COOPERATIVE_MATRIX | naga::valid::Capabilities::SHADER_FLOAT16;
            naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps)
                .validate(&module)
                .unwrap_or_else(|e| panic!("{}: {e:?}", k.name));
            assert!(k.wgsl.contains("coopMultiplyAdd"), "{}", k.name);
            assert!(!k.wgsl.contains("@unroll") && !k.wgsl.contains("//@"), "{}: a placeholder left", k.name);
        }
    }

    #[test]
    fn tiles_fit_the_decoder_shapes() {
        for &tile in TILES {
            assert!(tile.fits(256, 4096, 2816), "{}", tile.label());
            assert!(tile.fits(256, 2816, 4096), "{}", tile.label());
        }
        assert!(!TILE_64X128.fits(256, 4096, 2800));
    }

}

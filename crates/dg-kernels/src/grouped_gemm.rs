//! Grouped GEMM of the MoE experts: the per-expert products of tokens grouped by expert, in one
//! dispatch whose group sizes live on the GPU (no readback).
//!
//! Tokens routed to experts occupy "slots": the slots of expert `e` are
//! `offsets[e] .. offsets[e+1]`. For every slot `s` of expert `e`:
//!
//! ```text
//! C[s, j] = Σ_p A[row(s), p] · W[e, j, p]        row(s) = gather ? rows[s] : s
//! A[r, p] = a[r·a_rs + p]      W[e, j, p] = b[e·b_group_stride + j·k + p]      C[s, j] = c[s·c_rs + j]
//! ```
//!
//! W is `[groups, n, k]`, PyTorch's `[out, in]` per expert, so `C = A·Wᵀ` per expert. Bindings:
//! `a` (read), `b` (read), `offsets` (read, `groups + 1` u32), `rows` (read, one u32 per slot;
//! only read when `gather != 0`, any buffer otherwise), `c` (read-write, `[slots, n]`).
//!
//! Its own tiling (`wgsl/grouped_gemm.wgsl`), for what the MoE needs: few rows per group (2048
//! slots over 128 experts: 16 on average, unevenly spread) against large N and K. A workgroup
//! computes a `bm × bn` block with a `tm × tn` register block per invocation (8×8: 4 FMAs per
//! shared word read, 8×4: 2.7, where the general GEMM's 16×64 skinny tile, used here before,
//! managed 1), every shared access is a `vec4` (the A reads are warp-wide broadcasts), and a
//! block of 8 rows past its group's count (a whole warp) skips the multiply, so a group's cost
//! follows its slot count in steps of 8 rows. The grid covers `max_rows` rows for every
//! group; workgroups whose m tile starts past their group's count exit at once.
//!
//! W may be stored as bf16 or f16 ([`source_for`] with [`WeightFormat::Bf16`] or
//! [`WeightFormat::F16`]): the same kernel with every W load widened exactly from its packed half,
//! so it computes bit for bit what the f32 kernel computes on the 16-bit values upcast.

use bytemuck::{Pod, Zeroable};

use crate::format::with_operand;
use crate::gemm::{MAX_INVOCATIONS, MAX_SHARED_BYTES, fold, shared_stride, unroll};
use crate::{Access, KernelSource, WeightFormat, with_prelude};

/// Uniform parameters of `grouped_gemm.wgsl` and `coop_grouped_gemm.wgsl`. 48 bytes, a multiple
/// of 16.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable, PartialEq)]
pub struct GroupedGemmParams {
    pub n: u32,
    pub k: u32,
    /// Number of groups (experts); `offsets` holds `groups + 1` values.
    pub groups: u32,
    /// Upper bound on any group's slot count (sizes the dispatch; larger only costs idle
    /// workgroups, smaller leaves rows uncomputed).
    pub max_rows: u32,
    /// Row stride of A (elements).
    pub a_rs: u32,
    /// Elements per expert in W (`n · k` for a packed `[groups, n, k]` tensor).
    pub b_group_stride: u32,
    /// Row stride of C (elements).
    pub c_rs: u32,
    /// Non-zero: slot `s` reads row `rows[s]` of A; zero: row `s`.
    pub gather: u32,
    /// Tensor-core kernel only ([`crate::coop_grouped_gemm`]): the length of the tile table that
    /// follows the `groups + 1` offsets (one entry per m tile that holds slots, as
    /// [`crate::moe_dispatch`] writes it), or 0: no table, the grid covers `max_rows` rows of every
    /// group. The portable kernel ignores it.
    pub tiles: u32,
    /// The rows of one m tile of the table (its `bm`); a kernel whose tile has other rows uses the
    /// `max_rows` grid.
    pub tile_rows: u32,
    /// The first expert of W: slots of W's expert `g` are `offsets[first_group + g] ..
    /// offsets[first_group + g + 1]` (experts split across bindings run one dispatch per part;
    /// 0 otherwise). With a tile table (`tiles` non-zero) it must be 0.
    pub first_group: u32,
    pub _pad: u32,
}

impl GroupedGemmParams {
    /// The real geometry's two expert products (128 experts, hidden 2816, expert MLP 704) over a
    /// canvas of 256 slots: gate/up (rows gathered) and down. What tests of the kernels' fit and
    /// the planner's choices pin their rules to.
    pub fn real_experts() -> (GroupedGemmParams, GroupedGemmParams) {
        let gate_up = GroupedGemmParams {
            n: 1408,
            k: 2816,
            groups: 128,
            max_rows: 256,
            a_rs: 2816,
            b_group_stride: 1408 * 2816,
            c_rs: 1408,
            gather: 1,
            ..Zeroable::zeroed()
        };
        let down = GroupedGemmParams { n: 2816, k: 704, a_rs: 704, b_group_stride: 2816 * 704, c_rs: 2816, gather: 0, ..gate_up };
        (gate_up, down)
    }
}

/// One tile variant: a `bm × bn` block of C per workgroup, K in steps of `bk`, a `tm × tn`
/// register block per invocation (rows `ty·tm ..`, columns in runs of 4); `(bm/tm)·(bn/tn)`
/// invocations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GroupedTile {
    pub bm: u32,
    pub bn: u32,
    pub bk: u32,
    pub tm: u32,
    pub tn: u32,
}

impl GroupedTile {
    /// Invocations per workgroup.
    pub const fn invocations(self) -> u32 {
        (self.bm / self.tm) * (self.bn / self.tn)
    }

    /// Quads of 4 rows (or columns) staged per slot by the invocations together:
    /// `invocations / bk` (each invocation stages one k index of a quad per slot).
    const fn quad_step(self) -> u32 {
        self.invocations() / self.bk
    }

    /// Workgroup memory of the two staged tiles, in bytes.
    pub const fn shared_bytes(self) -> u32 {
        4 * self.bk * (shared_stride(self.bk, self.bm) + shared_stride(self.bk, self.bn))
    }

    /// The invariants the kernel relies on: register blocks divide the tile in whole `vec4`s,
    /// `bk` divides the invocations (each stages one k index) and is 4 or 8 (the shared strides
    /// are then whole `vec4`s and the staging conflict-free), every invocation stages the same
    /// number of B quads, and A quads either as many each or at most one per invocation, and the
    /// workgroup fits the portable limits.
    pub const fn is_valid(self) -> bool {
        let positive = self.bm > 0 && self.bn > 0 && self.tm > 0 && self.tn > 0;
        positive
            && (self.bk == 4 || self.bk == 8)
            && self.tm.is_multiple_of(4)
            && self.tn.is_multiple_of(4)
            && self.bm.is_multiple_of(self.tm)
            && self.bn.is_multiple_of(self.tn)
            && self.invocations().is_multiple_of(self.bk)
            && (self.bm / 4 <= self.quad_step() || (self.bm / 4).is_multiple_of(self.quad_step()))
            && (self.bn / 4).is_multiple_of(self.quad_step())
            && self.invocations() <= MAX_INVOCATIONS
            && self.shared_bytes() <= MAX_SHARED_BYTES
    }

    /// `"{bm}x{bn}x{bk}_{tm}x{tn}"`.
    pub fn label(self) -> String {
        format!("{}x{}x{}_{}x{}", self.bm, self.bn, self.bk, self.tm, self.tn)
    }

    fn prelude(self) -> Vec<(&'static str, u32)> {
        let (wm, wn) = (self.bm / self.tm, self.bn / self.tn);
        let rs = self.quad_step();
        let qa = self.bm / 4;
        vec![
            ("BM", self.bm),
            ("BN", self.bn),
            ("BK", self.bk),
            ("TM", self.tm),
            ("TN", self.tn),
            ("TM4", self.tm / 4),
            ("TN4", self.tn / 4),
            ("WM", wm),
            ("WN", wn),
            ("WG", wm * wn),
            ("RS", rs),
            ("QA", qa),
            ("LA", qa.div_ceil(rs)),
            ("LB", self.bn / 4 / rs),
            ("AP4", shared_stride(self.bk, self.bm) / 4),
            ("BP4", shared_stride(self.bk, self.bn) / 4),
        ]
    }
}

/// 16 rows × 256 columns, 8×8 per invocation (64 invocations, 8.8 KiB): the MoE's ~16 slots per
/// expert against wide outputs (gate‖up 1408, down 2816).
pub const TILE_16X256: GroupedTile = GroupedTile { bm: 16, bn: 256, bk: 8, tm: 8, tn: 8 };
/// 16 × 128, 8×4 per invocation (64 invocations, 4.8 KiB): small groups, narrow outputs.
pub const TILE_16X128: GroupedTile = GroupedTile { bm: 16, bn: 128, bk: 8, tm: 8, tn: 4 };
/// 32 × 256, 8×8 per invocation (128 invocations, 9.3 KiB): groups of 25–48 slots on average.
pub const TILE_32X256: GroupedTile = GroupedTile { bm: 32, bn: 256, bk: 8, tm: 8, tn: 8 };
/// 64 × 256, 8×8 per invocation (256 invocations, 10.3 KiB): large groups (many tokens or few
/// experts).
pub const TILE_64X256: GroupedTile = GroupedTile { bm: 64, bn: 256, bk: 8, tm: 8, tn: 8 };

/// Every grouped tile variant (each one is compiled only when used).
pub const TILES: &[GroupedTile] = &[TILE_16X256, TILE_16X128, TILE_32X256, TILE_64X256];

const _: () = {
    let mut i = 0;
    while i < TILES.len() {
        assert!(TILES[i].is_valid(), "a grouped gemm tile breaks its invariants (see GroupedTile::is_valid)");
        i += 1;
    }
};

/// The kernel for `tile` with f32 expert weights, named `grouped_gemm_{label}`: [`source_for`]
/// with [`WeightFormat::F32`].
pub fn source(tile: GroupedTile) -> KernelSource {
    source_for(tile, WeightFormat::F32)
}

/// The kernel for `tile` with the expert weights W (binding `b`) stored as `b` (A and C stay
/// f32), named `grouped_gemm_{label}` plus the format's suffix (`_bf16`, `_f16`). A bf16 or f16
/// W is bound as `array<u32>` and read through `load_b(i)` (see [`crate::bf16`]);
/// `b_group_stride` stays in elements, and the f32 rendering is exactly the plain kernel's.
pub fn source_for(tile: GroupedTile, b: WeightFormat) -> KernelSource {
    let consts = tile.prelude();
    let wgsl = with_prelude(&consts, &unroll(include_str!("wgsl/grouped_gemm.wgsl"), &consts));
    KernelSource {
        name: format!("grouped_gemm_{}{}", tile.label(), b.suffix()),
        wgsl: with_operand(&wgsl, "b", b),
        entry: "main",
        buffers: vec![Access::Read, Access::Read, Access::Read, Access::Read, Access::ReadWrite],
        params_size: size_of::<GroupedGemmParams>() as u64,
    }
}

/// The dispatch: `⌈max_rows/bm⌉ · ⌈n/bn⌉ · groups` workgroups as a linear index (m tile fastest,
/// then n tile, then group), folded by [`crate::gemm::fold`] when over the per-dimension limit.
pub fn workgroups(tile: GroupedTile, n: u32, max_rows: u32, groups: u32) -> [u32; 3] {
    let total = u64::from(max_rows.div_ceil(tile.bm)) * u64::from(n.div_ceil(tile.bn)) * u64::from(groups);
    assert!(total <= u64::from(u32::MAX), "grouped gemm of {max_rows} rows x {n} over {groups} groups: too many workgroups");
    fold(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_are_a_multiple_of_16_bytes() {
        assert_eq!(size_of::<GroupedGemmParams>() % 16, 0);
    }

    #[test]
    fn tiles_are_valid_and_named_uniquely() {
        let mut names: Vec<String> = TILES.iter().map(|t| t.label()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), TILES.len());
        assert!(!GroupedTile { bm: 16, bn: 256, bk: 16, tm: 8, tn: 8 }.is_valid(), "bk 16: strides not whole vec4s");
        assert!(!GroupedTile { bm: 16, bn: 128, bk: 8, tm: 2, tn: 4 }.is_valid(), "tm not a multiple of 4");
        assert!(!GroupedTile { bm: 64, bn: 512, bk: 8, tm: 8, tn: 8 }.is_valid(), "512 invocations");
    }

    #[test]
    fn vec4_staging_is_conflict_free() {
        // A quarter warp (8 lanes, the unit of a 128-bit shared access) stores k indices t % bk of
        // quads t / bk: its 8 vec4 addresses must fall in 8 distinct 4-bank groups.
        for &t in TILES.iter().chain(&[GroupedTile { bm: 16, bn: 64, bk: 4, tm: 4, tn: 4 }]) {
            assert!(t.is_valid(), "{}", t.label());
            for len in [t.bm, t.bn] {
                let stride4 = shared_stride(t.bk, len) / 4;
                let mut groups: Vec<u32> = (0..8).map(|lane| ((lane % t.bk) * stride4 + lane / t.bk) % 8).collect();
                groups.sort();
                groups.dedup();
                assert_eq!(groups.len(), 8, "{} len {len}", t.label());
            }
        }
    }

    #[test]
    fn the_real_moe_dispatch_folds() {
        // 128 experts, 256 rows bound, gate+up 1408 wide: 16 · 6 · 128 workgroups.
        assert_eq!(workgroups(TILE_16X256, 1408, 256, 128), [16 * 6 * 128, 1, 1]);
        let [x, y, z] = workgroups(TILE_16X128, 1408, 2048, 128);
        assert!(u64::from(x) * u64::from(y) * u64::from(z) >= 128 * 11 * 128);
        assert!(x <= 65_535 && y <= 65_535 && z == 1);
        assert_eq!(workgroups(TILE_32X256, 10, 0, 8), [1, 1, 1]);
    }

    #[test]
    fn formats_differ_only_in_their_operand_fragment() {
        for &t in TILES {
            let f32_src = source(t);
            assert_eq!(source_for(t, WeightFormat::F32), f32_src);
            let body = f32_src.wgsl.strip_prefix(&WeightFormat::F32.operand("b")).expect("the f32 fragment first");
            // The body reads b only through load_b (no indexing of b outside comments).
            let code = body.lines().map(|l| l.split("//").next().unwrap_or_default());
            assert!(body.contains("var<storage, read> b: array<b_word>;"), "{}", t.label());
            assert!(code.clone().all(|l| !l.contains(" b[") && !l.contains("(b[")), "{}", t.label());
            for format in [WeightFormat::Bf16, WeightFormat::F16] {
                let packed = source_for(t, format);
                assert_eq!(packed.name, format!("grouped_gemm_{}{}", t.label(), format.suffix()));
                assert_eq!(
                    (packed.buffers.clone(), packed.params_size, packed.entry),
                    (f32_src.buffers.clone(), f32_src.params_size, f32_src.entry)
                );
                assert_eq!(packed.wgsl.strip_prefix(&format.operand("b")), Some(body), "{} {format:?}", t.label());
            }
        }
    }

    #[test]
    fn renderings_keep_no_loop_but_k() {
        for &t in TILES {
            let wgsl = source(t).wgsl;
            assert!(!wgsl.lines().any(|l| l.trim() == "// @unroll"));
            assert_eq!(wgsl.lines().filter(|l| l.trim_start().starts_with("for (")).count(), 1, "{}", t.label());
        }
    }
}

//! Batched, strided f32 GEMM: every linear layer (`y = x·Wᵀ`, W `[out, in]`), both attention
//! products (scores `q·kᵀ` over strided heads with GQA, probabilities `·V`), the soft embedding
//! `P[C,V]·E[V,H]` (K = vocab) and the tied head `z·Eᵀ` (N = vocab) with the softcap epilogue.
//!
//! For every batch `b < batch`, with `g = b / b_batch_div`:
//!
//! ```text
//! A(b,i,p) = a[a_offset + b·a_batch + i·a_rs + p·a_cs]          i < m, p < k
//! B(g,p,j) = b[b_offset + g·b_batch + p·b_rs + j·b_cs]          p < k, j < n
//! C(b,i,j) = c[c_offset + b·c_batch + i·c_rs + j]
//! C(b,i,j) ← epilogue((accumulate ? C(b,i,j) : 0) + alpha · Σ_p A(b,i,p)·B(g,p,j))
//! ```
//!
//! Correct for any m, n, k (k = 0 gives `epilogue(accumulate ? C : 0)`) and any strides; only
//! `C(b,i,j)` for `i < m, j < n` is written. Bindings: `a` (read), `b` (read), `c` (read-write).
//!
//! B (the weights) may be stored as bf16 or f16 ([`source_for`] with [`WeightFormat::Bf16`] or
//! [`WeightFormat::F16`]): the same kernel with every B load widened exactly from its packed half,
//! so it computes bit for bit what the f32 kernel computes on the 16-bit values upcast (offsets
//! and strides stay in elements).
//!
//! Each workgroup computes one `bm × bn` tile through shared memory, each invocation a `tm × tn`
//! register block, accumulating in f32 per invocation (see `wgsl/gemm_tile.wgsl`). A tile with
//! `slices > 1` splits K inside the workgroup: slice `s` of the invocations accumulates the `s`-th
//! contiguous run of K steps, and slice 0 adds the other slices' partial sums in ascending slice
//! order before the epilogue (a fixed order, no atomics: results are deterministic). That cuts the
//! serial K loop of each workgroup by `slices` for products with few output tiles and a long K
//! (the MoE router, `256 × 128 × 2816`; the soft embedding, K = vocabulary).
//! Global loads coalesce for row-major (`cs = 1`) and transposed (`rs = 1`) operands alike: the
//! thread → element mapping follows whichever stride is 1 (a uniform choice per dispatch).
//!
//! Every constant-trip loop of the WGSL is marked `// @unroll` and expanded when rendering, so
//! the K loop is the only loop left: register arrays are only indexed by constants, and lavapipe,
//! which silently ends a shader after 65535 loop iterations in total (its `LP_MAX_TGSI_LOOP_
//! ITERATIONS` limiter), computes any K up to `65535 · bk · slices` (at least 524 280 for every
//! tile; the vocabulary, 262 144, fits all).

use bytemuck::{Pod, Zeroable};

use crate::format::with_operand;
use crate::{Access, KernelSource, WeightFormat, with_prelude};

/// `epilogue`: none.
pub const EPILOGUE_NONE: u32 = 0;
/// `epilogue`: softcap `cap · tanh(x / cap)` of the final value (after alpha and accumulate).
pub const EPILOGUE_SOFTCAP: u32 = 1;

/// Most invocations a tile's workgroup may have (the WebGPU default limit).
pub const MAX_INVOCATIONS: u32 = 256;
/// Most workgroup memory a tile may use, in bytes: the WebGPU default, portable everywhere
/// (lavapipe allows 32 KiB, an H200 48 KiB).
pub const MAX_SHARED_BYTES: u32 = 16 * 1024;
/// Most workgroups per dispatch dimension (the WebGPU default limit); larger grids are folded.
pub const MAX_GROUPS_PER_DIM: u32 = 65535;

/// Uniform parameters of `gemm.wgsl` (see the module docs for the formula) and of the tensor-core
/// GEMM ([`crate::coop_gemm`], which alone reads the split-K fields). 96 bytes, a multiple of 16.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable, PartialEq)]
pub struct GemmParams {
    pub m: u32,
    pub n: u32,
    pub k: u32,
    pub batch: u32,
    pub a_offset: u32,
    pub a_rs: u32,
    pub a_cs: u32,
    pub a_batch: u32,
    pub b_offset: u32,
    pub b_rs: u32,
    pub b_cs: u32,
    pub b_batch: u32,
    /// Batch `b` reads B batch `b / b_batch_div` (GQA: query head h uses KV head h / group).
    /// Must be at least 1 (0 is read as 1).
    pub b_batch_div: u32,
    pub c_offset: u32,
    pub c_rs: u32,
    pub c_batch: u32,
    pub alpha: f32,
    /// Non-zero: add to the previous contents of C.
    pub accumulate: u32,
    /// [`EPILOGUE_NONE`] or [`EPILOGUE_SOFTCAP`].
    pub epilogue: u32,
    /// Softcap value (used by [`EPILOGUE_SOFTCAP`] only).
    pub cap: f32,
    /// Split K ([`crate::coop_gemm`] only; 0 everywhere else): workgroup `z` runs the K steps
    /// `z·split_steps ..` (at most `split_steps` of them) and stores its plain product at
    /// `c_offset + z·split_stride` (alpha 1, no accumulate, no epilogue: [`crate::split_k`] adds
    /// the partials and applies them). 0: the whole K, one workgroup per tile.
    pub split_steps: u32,
    /// Elements of C between two splits' partial products.
    pub split_stride: u32,
    /// Non-zero: only `C[i, j]` with `j < i + causal_n` are needed ([`crate::coop_gemm`] may leave
    /// the others unwritten: a causal mask's scores, whose softmax never reads them; the portable
    /// kernel computes them all). 0: every column.
    pub causal_n: u32,
    /// Non-zero: `A[i, q]` is zero for `q ≥ i + causal_k` ([`crate::coop_gemm`] may stop row
    /// `i`'s sums there, adding no other terms: a causal mask's probabilities times the values,
    /// whose masked products are exact zeros over finite values; the portable kernel adds them
    /// all). 0: every term.
    pub causal_k: u32,
}

impl GemmParams {
    /// One contiguous row-major product `C[m,n] = A[m,k]·B[k,n]`: batch 1, alpha 1, no offsets,
    /// no accumulate, no epilogue. Adjust fields from here (`GemmParams { b_rs: 1, .. }`).
    pub fn new(m: u32, n: u32, k: u32) -> Self {
        GemmParams {
            m,
            n,
            k,
            batch: 1,
            a_offset: 0,
            a_rs: k,
            a_cs: 1,
            a_batch: m * k,
            b_offset: 0,
            b_rs: n,
            b_cs: 1,
            b_batch: k * n,
            b_batch_div: 1,
            c_offset: 0,
            c_rs: n,
            c_batch: m * n,
            alpha: 1.0,
            accumulate: 0,
            epilogue: EPILOGUE_NONE,
            cap: 0.0,
            split_steps: 0,
            split_stride: 0,
            causal_n: 0,
            causal_k: 0,
        }
    }

    /// A linear layer `C[m,n] = X[m,k]·Wᵀ` with `W: [n, k]` row-major (PyTorch `[out, in]`).
    pub fn linear(tokens: u32, out: u32, inp: u32) -> Self {
        GemmParams { b_rs: 1, b_cs: inp, b_batch: out * inp, ..GemmParams::new(tokens, out, inp) }
    }
}

/// One tile variant: a `bm × bn` output tile per workgroup, K in steps of `bk`, a `tm × tn`
/// register block per invocation; `(bm/tm)·(bn/tn)` invocations per K slice and `slices` slices
/// that split K inside the workgroup (1: no split).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GemmTile {
    pub bm: u32,
    pub bn: u32,
    pub bk: u32,
    pub tm: u32,
    pub tn: u32,
    pub slices: u32,
}

/// Padded row length of a staged `bk × len` shared tile: rounded up to 16 words plus `32 / bk`,
/// so that 32 lanes staging `bk` consecutive k values of `32 / bk` rows (the transposed-operand
/// pattern) hit 32 distinct banks (`kk · stride mod 32` is `kk · (32/bk)` times an odd number for
/// `4 ≤ bk ≤ 32`); row-major staging and the multiply's reads touch consecutive words of one row
/// and are conflict-free for any padding.
pub const fn shared_stride(bk: u32, len: u32) -> u32 {
    let pad = if bk >= 32 { 1 } else { 32 / bk };
    len.next_multiple_of(16) + pad
}

impl GemmTile {
    /// Invocations of one K slice (`(bm/tm)·(bn/tn)`).
    pub const fn slice_invocations(self) -> u32 {
        (self.bm / self.tm) * (self.bn / self.tn)
    }

    /// Invocations per workgroup (all slices).
    pub const fn invocations(self) -> u32 {
        self.slice_invocations() * self.slices
    }

    /// Padded row length of a staged `bk × len` shared tile (see [`shared_stride`]).
    pub const fn shared_stride(self, len: u32) -> u32 {
        shared_stride(self.bk, len)
    }

    /// Shared words of one slice's two staged tiles.
    const fn slice_words(self) -> u32 {
        self.bk * (self.shared_stride(self.bm) + self.shared_stride(self.bn))
    }

    /// Shared words: every slice's staged tiles, or the partial sums of slices `1..slices` during
    /// the final reduction (the same memory), whichever is larger.
    const fn shared_words(self) -> u32 {
        let staged = self.slices * self.slice_words();
        let partials = (self.slices - 1) * self.bm * self.bn;
        if staged > partials { staged } else { partials }
    }

    /// Workgroup memory, in bytes.
    pub const fn shared_bytes(self) -> u32 {
        4 * self.shared_words()
    }

    /// The invariants the kernel relies on: register blocks divide the tile, every invocation
    /// stages the same number of A and B elements, `bk` divides 32 and is at least 4
    /// (bank-conflict-free staging), a slice is whole warps of 32 and the workgroup fits the
    /// portable limits.
    pub const fn is_valid(self) -> bool {
        let positive = self.bm > 0 && self.bn > 0 && self.bk > 0 && self.tm > 0 && self.tn > 0 && self.slices > 0;
        positive
            && self.bm.is_multiple_of(self.tm)
            && self.bn.is_multiple_of(self.tn)
            && (self.bm * self.bk).is_multiple_of(self.slice_invocations())
            && (self.bk * self.bn).is_multiple_of(self.slice_invocations())
            && 32u32.is_multiple_of(self.bk)
            && self.bk >= 4
            && (self.slices == 1 || self.slice_invocations().is_multiple_of(32))
            && self.invocations() <= MAX_INVOCATIONS
            && self.shared_bytes() <= MAX_SHARED_BYTES
    }

    /// `"{bm}x{bn}x{bk}_{tm}x{tn}"`, with `"_s{slices}"` appended when K is split.
    pub fn label(self) -> String {
        let split = if self.slices > 1 { format!("_s{}", self.slices) } else { String::new() };
        format!("{}x{}x{}_{}x{}{split}", self.bm, self.bn, self.bk, self.tm, self.tn)
    }

    /// The const prelude of the WGSL renderings (names as documented in `wgsl/gemm_tile.wgsl`).
    pub(crate) fn prelude(self) -> Vec<(&'static str, u32)> {
        let (wm, wn) = (self.bm / self.tm, self.bn / self.tn);
        let wg = wm * wn;
        vec![
            ("BM", self.bm),
            ("BN", self.bn),
            ("BK", self.bk),
            ("TM", self.tm),
            ("TN", self.tn),
            ("WM", wm),
            ("WN", wn),
            ("WG", wg),
            ("NS", self.slices),
            ("NS1", self.slices - 1),
            ("WT", wg * self.slices),
            ("LA", self.bm * self.bk / wg),
            ("LB", self.bk * self.bn / wg),
            ("AP", self.shared_stride(self.bm)),
            ("BP", self.shared_stride(self.bn)),
            ("SA", self.slice_words()),
            ("SMEM", self.shared_words()),
        ]
    }

    /// The full WGSL of a kernel built on the tiling core: prelude, core, `kernel`, with every
    /// `// @unroll` loop expanded.
    pub(crate) fn render(self, kernel: &str) -> String {
        let consts = self.prelude();
        with_prelude(&consts, &unroll(&format!("{TILE_CORE}\n{kernel}"), &consts))
    }
}

/// 128×128 output tile, 8×8 per invocation (256 invocations, 8.3 KiB shared): the most reuse
/// per load, for products with many tiles (m and n of a few hundred and up).
pub const TILE_128: GemmTile = GemmTile { bm: 128, bn: 128, bk: 8, tm: 8, tn: 8, slices: 1 };
/// 64×64, 4×4 per invocation (256 invocations, 8.3 KiB): the general workhorse.
pub const TILE_64: GemmTile = GemmTile { bm: 64, bn: 64, bk: 16, tm: 4, tn: 4, slices: 1 };
/// 32×32, 4×4 per invocation (64 invocations, 4.3 KiB): small products, more workgroups.
pub const TILE_32: GemmTile = GemmTile { bm: 32, bn: 32, bk: 16, tm: 4, tn: 4, slices: 1 };
/// 16×64, 2×2 per invocation (256 invocations, 5.1 KiB): skinny products, m ≤ 16 (few tokens).
pub const TILE_SKINNY: GemmTile = GemmTile { bm: 16, bn: 64, bk: 16, tm: 2, tn: 2, slices: 1 };
/// 32×32, 4×4 per invocation, K split 4 ways inside the workgroup (256 invocations, 12 KiB):
/// products with a long K and too few 64×64 tiles to fill a large GPU (k/v/o projections and the
/// dense MLP's down projection at 256 tokens, the soft embedding).
pub const TILE_32_SPLIT: GemmTile = GemmTile { bm: 32, bn: 32, bk: 8, tm: 4, tn: 4, slices: 4 };
/// 16×16, 2×2 per invocation, K split 4 ways (256 invocations, 9 KiB): a long K over very few
/// outputs (the MoE router, `256 × 128 × 2816`: 128 workgroups of 44 K steps each instead of 32
/// workgroups of 176).
pub const TILE_16_SPLIT: GemmTile = GemmTile { bm: 16, bn: 16, bk: 16, tm: 2, tn: 2, slices: 4 };

/// Every tile variant (each one is compiled only when used).
pub const TILES: &[GemmTile] = &[TILE_128, TILE_64, TILE_32, TILE_SKINNY, TILE_32_SPLIT, TILE_16_SPLIT];

const _: () = {
    let mut i = 0;
    while i < TILES.len() {
        assert!(TILES[i].is_valid(), "a gemm tile breaks its invariants (see GemmTile::is_valid)");
        i += 1;
    }
};

/// The WGSL of the shared tiling core, prepended to gemm.
const TILE_CORE: &str = include_str!("wgsl/gemm_tile.wgsl");

/// The kernel for `tile` with an f32 B, named `gemm_{label}`: [`source_for`] with
/// [`WeightFormat::F32`]. Bindings: `a` (read), `b` (read), `c` (read-write).
pub fn source(tile: GemmTile) -> KernelSource {
    source_for(tile, WeightFormat::F32)
}

/// The kernel for `tile` with B stored as `b` (the weights; A and C stay f32), named
/// `gemm_{label}` plus the format's suffix (`_bf16`, `_f16`). A bf16 or f16 B is bound as
/// `array<u32>` and read through `load_b(i)` (see [`crate::bf16`]); offsets and strides stay in
/// elements, and the f32 rendering is exactly the plain kernel's.
pub fn source_for(tile: GemmTile, b: WeightFormat) -> KernelSource {
    KernelSource {
        name: format!("gemm_{}{}", tile.label(), b.suffix()),
        wgsl: with_operand(&tile.render(&with_params(include_str!("wgsl/gemm.wgsl"))), "b", b),
        entry: "main",
        buffers: vec![Access::Read, Access::Read, Access::ReadWrite],
        params_size: size_of::<GemmParams>() as u64,
    }
}

/// `template` with its `//@PARAMS` line replaced by the WGSL of [`GemmParams`]
/// (`wgsl/gemm_params.wgsl`, shared by the f32 and the tensor-core GEMM).
pub(crate) fn with_params(template: &str) -> String {
    assert!(template.contains("//@PARAMS\n"), "a GEMM template without //@PARAMS");
    template.replace("//@PARAMS\n", include_str!("wgsl/gemm_params.wgsl"))
}

/// Folds `total` workgroups into a grid with at most [`MAX_GROUPS_PER_DIM`] per dimension
/// (x first, then y, then z). The kernels recover the linear index `x + y·nx + z·nx·ny` and skip
/// indices `≥ total` (the padding of a folded grid). At least one workgroup.
pub fn fold(total: u64) -> [u32; 3] {
    let max = u64::from(MAX_GROUPS_PER_DIM);
    let x = total.clamp(1, max);
    let rest = total.div_ceil(x).max(1);
    let y = rest.min(max);
    let z = rest.div_ceil(y);
    assert!(z <= max, "gemm grid of {total} workgroups is too large");
    [x as u32, y as u32, z as u32]
}

/// The dispatch for an `m × n` product over `batch` batches with `tile`: one workgroup per
/// (m tile, n tile, batch), as a linear index decoded m tile fastest (workgroups sharing a B tile
/// run together), folded by [`fold`] when over the per-dimension limit.
pub fn workgroups(tile: GemmTile, m: u32, n: u32, batch: u32) -> [u32; 3] {
    let total = u64::from(m.div_ceil(tile.bm)) * u64::from(n.div_ceil(tile.bn)) * u64::from(batch);
    assert!(total <= u64::from(u32::MAX), "gemm of {m}x{n} over {batch} batches: too many workgroups");
    fold(total)
}

/// Expands every loop marked by a `// @unroll` line, which must be followed by
/// `for (var x = 0u; x < N; x++) {` with N a prelude constant or a literal, a body without
/// `break` or `continue`, and the closing `}` on a line of its own. Iteration i becomes the block
/// `{ const x = iu; body }`; nested marked loops expand too. Panics on a malformed marker (every
/// rendering runs in the tests).
pub(crate) fn unroll(src: &str, consts: &[(&str, u32)]) -> String {
    let lines: Vec<&str> = src.lines().collect();
    let mut out = String::with_capacity(src.len() * 4);
    expand(&lines, consts, &mut out);
    out
}

fn expand(lines: &[&str], consts: &[(&str, u32)], out: &mut String) {
    let mut i = 0;
    while i < lines.len() {
        if lines[i].trim() != "// @unroll" {
            out.push_str(lines[i]);
            out.push('\n');
            i += 1;
            continue;
        }
        let header = lines.get(i + 1).copied().unwrap_or_default();
        let (var, count) = parse_for(header.trim(), consts)
            .unwrap_or_else(|| panic!("`// @unroll` must precede `for (var x = 0u; x < N; x++) {{`, found `{header}`"));
        // The body runs to the `}` that closes the header's `{` (comments may hold no braces).
        let mut depth = 1i32;
        let mut end = i + 2;
        loop {
            let line = lines.get(end).unwrap_or_else(|| panic!("unclosed @unroll loop `{header}`"));
            let code = line.split("//").next().unwrap_or_default();
            depth += code.matches('{').count() as i32 - code.matches('}').count() as i32;
            if depth == 0 {
                assert_eq!(line.trim(), "}", "an @unroll loop must end with `}}` on its own line");
                break;
            }
            end += 1;
        }
        let body = &lines[i + 2..end];
        assert!(
            !body.iter().any(|l| {
                let code = l.split("//").next().unwrap_or_default();
                code.split(|ch: char| !ch.is_alphanumeric() && ch != '_').any(|w| w == "break" || w == "continue")
            }),
            "an @unroll loop body may not break or continue: `{header}`"
        );
        let mut inner = String::new();
        expand(body, consts, &mut inner);
        let indent = &header[..header.len() - header.trim_start().len()];
        for n in 0..count {
            out.push_str(&format!("{indent}{{\n{indent}    const {var} = {n}u;\n{inner}{indent}}}\n"));
        }
        i = end + 1;
    }
}

/// `(x, N)` of `for (var x = 0u; x < N; x++) {`.
fn parse_for(header: &str, consts: &[(&str, u32)]) -> Option<(String, u32)> {
    let rest = header.strip_prefix("for (var ")?;
    let (var, rest) = rest.split_once(" = 0u; ")?;
    let rest = rest.strip_prefix(var)?.strip_prefix(" < ")?;
    let (bound, rest) = rest.split_once("; ")?;
    if rest != format!("{var}++) {{") {
        return None;
    }
    let count = match consts.iter().find(|(name, _)| *name == bound) {
        Some(&(_, v)) => v,
        None => bound.trim_end_matches('u').parse().ok()?,
    };
    Some((var.to_string(), count))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_are_a_multiple_of_16_bytes() {
        assert_eq!(size_of::<GemmParams>() % 16, 0);
        assert_eq!(size_of::<GemmParams>(), 96);
    }

    #[test]
    fn tiles_are_valid_and_named_uniquely() {
        let mut names: Vec<String> = TILES.iter().map(|t| t.label()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), TILES.len());
        assert!(TILES.iter().all(|t| t.is_valid()));
        assert!(!GemmTile { bm: 128, bn: 128, bk: 16, tm: 8, tn: 8, slices: 1 }.is_valid(), "17 KiB of shared memory");
        assert!(!GemmTile { bm: 64, bn: 64, bk: 16, tm: 2, tn: 2, slices: 1 }.is_valid(), "1024 invocations");
        assert!(!GemmTile { bm: 64, bn: 60, bk: 16, tm: 4, tn: 8, slices: 1 }.is_valid(), "tn does not divide bn");
        assert!(!GemmTile { bm: 32, bn: 32, bk: 16, tm: 4, tn: 4, slices: 4 }.is_valid(), "17 KiB of staged tiles");
        assert!(!GemmTile { bm: 64, bn: 64, bk: 8, tm: 8, tn: 8, slices: 3 }.is_valid(), "32 KiB of partial sums");
        assert!(!GemmTile { bm: 16, bn: 16, bk: 16, tm: 4, tn: 4, slices: 2 }.is_valid(), "a slice of 16 invocations");
        assert_eq!(TILE_32_SPLIT.invocations(), 256);
        assert_eq!(TILE_16_SPLIT.invocations(), 256);
        assert_eq!(TILE_32_SPLIT.label(), "32x32x8_4x4_s4");
    }

    #[test]
    fn shared_strides_keep_transposed_staging_conflict_free() {
        // 32 lanes stage bk consecutive k values of 32/bk consecutive rows: all 32 banks distinct.
        for bk in [4u32, 8, 16, 32] {
            for len in [1u32, 16, 17, 32, 48, 64, 128, 256] {
                let stride = shared_stride(bk, len);
                let mut banks: Vec<u32> = (0..32).map(|lane| ((lane % bk) * stride + lane / bk) % 32).collect();
                banks.sort();
                banks.dedup();
                assert_eq!(banks.len(), 32, "bk {bk} len {len} stride {stride}");
            }
        }
    }

    #[test]
    fn folding_respects_the_limit_and_covers_every_workgroup() {
        assert_eq!(fold(0), [1, 1, 1]);
        assert_eq!(fold(7), [7, 1, 1]);
        assert_eq!(fold(65_535), [65_535, 1, 1]);
        assert_eq!(fold(65_536), [65_535, 2, 1]);
        let big = 65_535u64 * 65_535 + 3;
        let [x, y, z] = fold(big);
        assert!(x <= MAX_GROUPS_PER_DIM && y <= MAX_GROUPS_PER_DIM && z <= MAX_GROUPS_PER_DIM);
        assert!(u64::from(x) * u64::from(y) * u64::from(z) >= big);
        // The tied head: 256 x 262144 with 64-wide tiles.
        assert_eq!(workgroups(TILE_64, 256, 262_144, 1), [16_384, 1, 1]);
        assert_eq!(workgroups(TILE_SKINNY, 1, 1, 70_000), [65_535, 2, 1]);
        assert_eq!(workgroups(TILE_16_SPLIT, 256, 128, 1), [128, 1, 1]);
    }

    #[test]
    fn unroll_expands_marked_loops_only() {
        let src = "fn f() {\n    // @unroll\n    for (var i = 0u; i < N; i++) {\n        // @unroll\n        for (var j = 0u; j < 2u; j++) {\n            x[i * 2u + j] = 1.0;\n        }\n    }\n    for (var q = 0u; q < N; q++) {\n    }\n}\n";
        let out = unroll(src, &[("N", 3)]);
        assert_eq!(out.matches("const i = ").count(), 3);
        assert_eq!(out.matches("const j = ").count(), 6);
        assert!(out.contains("const i = 2u;") && out.contains("const j = 1u;"));
        assert!(out.contains("for (var q = 0u; q < N; q++) {"), "unmarked loops stay");
        assert!(!out.contains("@unroll"));
        assert_eq!(out.matches('{').count(), out.matches('}').count());
    }

    #[test]
    #[should_panic(expected = "may not break")]
    fn unroll_rejects_break() {
        unroll("// @unroll\nfor (var i = 0u; i < 2u; i++) {\n    break;\n}\n", &[]);
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
                assert_eq!(packed.name, format!("gemm_{}{}", t.label(), format.suffix()));
                assert_eq!(
                    (packed.buffers.clone(), packed.params_size, packed.entry),
                    (f32_src.buffers.clone(), f32_src.params_size, f32_src.entry)
                );
                assert_eq!(packed.wgsl.strip_prefix(&format.operand("b")), Some(body), "{} {format:?}", t.label());
            }
        }
    }

    #[test]
    fn renderings_keep_no_loop_but_k_in_the_hot_path() {
        for &t in TILES {
            let wgsl = source(t).wgsl;
            assert!(!wgsl.lines().any(|l| l.trim() == "// @unroll"));
            // The K loop is the only `for` left in the tiling core and the kernel.
            assert_eq!(wgsl.lines().filter(|l| l.trim_start().starts_with("for (")).count(), 1, "{}", t.label());
        }
    }
}

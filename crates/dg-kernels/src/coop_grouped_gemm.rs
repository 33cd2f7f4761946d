//! Tensor-core grouped GEMM of the MoE experts (the products of `DiffusionGemmaMoE`'s experts,
//! `gate_up_proj` and `down_proj`): [`crate::grouped_gemm`]'s contract with f16 weights, run on the
//! matrix units through cooperative matrices like [`crate::coop_gemm`].
//!
//! ```text
//! C[s, j] = Σ_p f16(A[row(s), p]) · W[e, j, p]     for every slot s of expert e
//! row(s) = gather ? rows[s] : s
//! A[r, p] = a[r·a_rs + p]      W[e, j, p] = w[e·b_group_stride + j·k + p]      C[s, j] = c[s·c_rs + j]
//! ```
//!
//! Bindings, after the uniform [`GroupedGemmParams`] (the same parameters as the f32 kernel):
//! `a` (read, f32, rounded to f16 when staged), `w` (read, f16 in K panels: `[groups, k / PANEL,
//! n, PANEL]`, as [`pack_f16_panels`] writes each group; or a quantized format's ggml blocks in
//! panels one block wide, in planes (`format/planes.rs`), dequantized into the f16 tiles as they
//! are staged: [`source_for`]), `offsets` (read, `groups + 1` u32), `rows` (read, one u32 per
//! slot; read only when `gather != 0`), `c` (read-write, f32 `[slots, n]`; rows of other slots
//! untouched).
//!
//! Requirements beyond [`crate::coop_gemm`]'s (cooperative matrices, f16, 32-wide subgroups, the
//! adapter's workgroup memory): `n` a multiple of the tile's `bn`, `k` of its `bk`, and `k`,
//! `a_rs`, `b_group_stride` multiples of 4 ([`fits`]).
//!
//! The grid: where [`crate::moe_dispatch`] wrote a tile table after the offsets (`p.tiles`
//! entries, one per m tile of `p.tile_rows` rows that holds slots, [`tile_table`]), one workgroup
//! per entry and n tile; else it covers `max_rows` rows for every group, like the f32 kernel,
//! and a workgroup whose m tile starts past its group's slot count exits at once. In the decoder
//! (`max_rows` 256, 32-row tiles) that grid is 8 times the tiles with work; on an H200 its idle
//! workgroups cost the experts' two products 23 µs of 670 a layer. With 2048 slots over 128 experts (the
//! decoder's 256 tokens × top-8), a 32-row tile holds most experts whole, so each expert's
//! weights are read about once: its floor is the weight bytes (1.5 GB a layer at the real
//! geometry), not the tensor cores' work. (On an H200 it runs at about half the weights'
//! streaming rate, bound by what a K step costs a multiprocessor: bench/HISTORY.md.) The K-panel layout makes the `bn × PANEL` block of W one
//! K step stages one contiguous run (8 KiB for a 128-wide tile) instead of `bn` runs of 64 bytes
//! a row apart, which DRAM serves at a fraction of its bandwidth. See
//! `wgsl/coop_grouped_gemm.wgsl`.

pub use crate::coop_gemm::WPath;
use crate::coop_gemm::{AFormat, CoopTile, FRAGMENT, MAX_SHARED_BYTES};
use crate::gemm::fold;
use crate::grouped_gemm::GroupedGemmParams;
use crate::{Access, KernelSource, WeightFormat};

/// Columns of K per panel of the weight layout: every tile's `bk` (the dense kernel's
/// [`crate::coop_gemm::BLayout::NkPanels`] uses the same panels).
pub use crate::coop_gemm::PANEL;

/// One group's `[n, k]` row-major weights (PyTorch `[out, in]`), f16-packed in K panels:
/// `[k / panel, n, panel]`, two halves a word as [`crate::pack_f16`] packs them. The kernel reads
/// panels of its tile's `bk` ([`PANEL`] for every tile of [`TILES`]). Panics unless `k` is a
/// multiple of `panel` and `w` holds `n · k` values.
pub fn pack_f16_panels(w: &[f32], n: usize, k: usize, panel: usize) -> Vec<u32> {
    assert!(k.is_multiple_of(panel) && w.len() == n * k, "pack_f16_panels: {} values for [{n}, {k}] in panels of {panel}", w.len());
    let mut ordered = Vec::with_capacity(w.len());
    for p0 in (0..k).step_by(panel) {
        for row in w.chunks_exact(k) {
            ordered.extend_from_slice(&row[p0..p0 + panel]);
        }
    }
    crate::pack_f16(&ordered)
}

/// 32 rows × 128 columns, 32×32 per subgroup (4 subgroups), K steps of 32: the decoder's ~16 slots
/// per expert in one m tile.
pub const TILE_32X128: CoopTile = CoopTile::vec4(32, 128, 32, 32, 32);
/// 32 × 64, 16×32 per subgroup (4 subgroups): for `n` not a multiple of 128.
pub const TILE_32X64: CoopTile = CoopTile::vec4(32, 64, 32, 16, 32);
/// 64 × 128, 32×64 per subgroup (4 subgroups): single-staged, the tile of long groups
/// ([`LONG_GROUP_TILE`]: a 1024-token chunk's ~64 slots per expert); staged, the encoder's tile
/// until [`EXPERT_TILE`] measured faster there.
pub const TILE_64X128: CoopTile = CoopTile::vec4(64, 128, 32, 32, 64);

/// 32 × 64 in 2 subgroups of 32×32 (64 invocations): [`TILE_32X128`]'s subgroups two to a
/// workgroup (four workgroups a multiprocessor), each W run staged by one invocation as in
/// [`TILE_32X128`]; [`QUANTIZED_EXPERT_TILE`].
pub const TILE_32X64_W2: CoopTile = CoopTile::vec4(32, 64, 32, 32, 32);

/// Every tile a rule of the planner (`dg_gpu::planner::experts`) can pick: [`EXPERT_TILE`]'s, [`QUANTIZED_EXPERT_TILE`]'s,
/// [`LONG_GROUP_TILE`]'s, [`GATHERED_EXPERT_TILE`]'s, and [`TILE_32X64`] where N is no multiple of
/// 128. The tiles no rule picks are dg-lab's.
pub const TILES: &[CoopTile] = &[TILE_32X128, TILE_32X64, TILE_64X128, TILE_32X64_W2, TILE_32X128_W2];

/// 32 × 128 in 2 subgroups of 32×64 (64 invocations): [`TILE_32X128`]'s tile with more products
/// per fragment a subgroup loads (6 fragments for 8 products a 16-deep substep, where 32×32 loads
/// 4 for 4) and half the subgroups to stage and synchronise; single-staged (15 KiB with the
/// scratch), four workgroups share a multiprocessor's workgroup memory. On an H100 in the real
/// 6-layer F16 forward (µs for gate/up / down, against [`EXPERT_TILE`]'s 381–384 / 211–214 in the
/// same call): 368–369 / 214–216 at depth 2, 393 / 225–227 at depth 1, 693 / 386 at depth 3 and 997 /
/// 534 at depth 4 (the batched ring of 128 bytes of W an invocation a step outgrows the
/// registers); `q4_k_m` at depth 2 Q4_K 360 / Q5_0 216 against [`QUANTIZED_EXPERT_TILE`]'s 337 /
/// 192. So only F16's gate/up takes it ([`GATHERED_EXPERT_TILE`]).
pub const TILE_32X128_W2: CoopTile = CoopTile::vec4(32, 128, 32, 32, 64);

/// The decoder's tile for F16 experts' gate/up (the product that gathers its rows, K the hidden
/// size): [`TILE_32X128_W2`] two steps ahead; the down projection keeps [`EXPERT_TILE`]. Both
/// have 32 rows, so they share the dispatch's tile table. On an H100 (the real 6-layer F16
/// forward's profile, seven runs over two sessions, each beside [`EXPERT_TILE`] in the same call)
/// gate/up took 361–369 µs (one layer 383) against 378–385 (the down projection in this tile lost 1–3%),
/// the experts' 6 layers 3.49 against 3.56–3.57 ms, the profile 1.056 against 1.068–1.075 ms a
/// layer. The 30 layers' wall time moved less: 30.84 / 30.72 ms against 30.85 / 30.83, and in a
/// later call 30.69 / 30.66 against 30.80 / 30.74 (bench/HISTORY.md, "The experts' gate/up in
/// subgroups of 32 × 64" and the section after it). Not yet measured on an H200.
pub const GATHERED_EXPERT_TILE: CoopTile = TILE_32X128_W2.with_depth(2);

/// Whether the kernel runs `tile` by `path`: its workgroup memory within [`MAX_SHARED_BYTES`],
/// and direct W fragments only one panel a step (they step through W a panel at a time).
pub const fn runs(tile: CoopTile, path: WPath) -> bool {
    shared_bytes_with(tile, path) <= MAX_SHARED_BYTES && (!matches!(path, WPath::Direct) || tile.bk == PANEL)
}

/// Workgroup memory of `tile` in this kernel: the staging of [`CoopTile::shared_bytes`] plus one
/// 16×16 f32 fragment of scratch per subgroup.
pub const fn shared_bytes(tile: CoopTile) -> u32 {
    tile.shared_bytes() + tile.subgroups() * FRAGMENT * FRAGMENT * 4
}

/// Workgroup memory of `tile` with W reaching the tensor cores by `path` ([`WPath::Direct`]
/// stages only A).
pub const fn shared_bytes_with(tile: CoopTile, path: WPath) -> u32 {
    match path {
        WPath::Staged => shared_bytes(tile),
        WPath::Single => shared_bytes(tile) / 2 + tile.subgroups() * FRAGMENT * FRAGMENT * 2,
        WPath::Direct => 2 * 2 * tile.bm * tile.row_halves() + tile.subgroups() * FRAGMENT * FRAGMENT * 4,
    }
}

/// The fewest rows of any tile's m tiles: a tile table of m tiles this small is the longest
/// ([`table_len`]).
pub const MIN_TILE_ROWS: u32 = 16;

const _: () = {
    let mut i = 0;
    while i < TILES.len() {
        assert!(TILES[i].is_valid() && shared_bytes(TILES[i]) <= MAX_SHARED_BYTES, "a coop grouped tile breaks its invariants");
        assert!(TILES[i].bm >= MIN_TILE_ROWS, "a coop grouped tile has fewer rows than MIN_TILE_ROWS");
        i += 1;
    }
};

/// How many K steps ahead the decoder's expert tiles load (`coop_kloop`). On an H200 in the real
/// 6-layer forward (µs for gate/up and down with f32 activations for gate/up, the layer's mean):
/// depth 2 (with 1 for down, the earlier choice) 370 / 214 (1.066 ms), 3 359 / 203 (1.041), 4
/// 343–345 / 193–195 (1.017–1.018), 5 390 / 199 (1.070), 6 475 / 212 (1.169), 8 801 / 338
/// (1.586): past 4 the ring's registers cost more than its loads in flight gain. With f16
/// activations for gate/up (the forward's since): 3 352 / 204 (1.027), 4 337–338 / 195–196
/// (1.002).
pub const EXPERT_DEPTH: u32 = 4;

/// The decoder's expert tile, for F16 and quantized experts alike: 32 × 128, single-staged,
/// loaded [`EXPERT_DEPTH`] steps ahead. Quantized experts stage whole 32-value runs per invocation
/// (`format::CoopW`, [`crate::format::RUN_VALUES`]), whose ring holds 7 to 13 registers a set
/// where F16's holds 16, so they take the F16 depth. On an H200 in the real 6-layer forward (ms a
/// layer, depth 2 / 4; F16 1.010): q8_0 1.151 / 1.110, q4_k_m 1.171 / 1.103. Before the runs,
/// with a vec4 per invocation (4 to 7 registers each, 8 of them a set), depth 2 was best: q8_0
/// 1.258, q4_k_m 1.482 (1.809 at depth 4).
pub const EXPERT_TILE: CoopTile = TILE_32X128.with_depth(EXPERT_DEPTH);

/// The decoder's expert tile for quantized experts: [`TILE_32X64_W2`] at [`EXPERT_DEPTH`], the
/// same subgroups and runs as [`EXPERT_TILE`] two to a workgroup. On an H200 in the real 6-layer
/// forward (µs for layer 0's gate/up / down, one call, against [`EXPERT_TILE`]): `q4_k_m` (Q4_K /
/// Q5_0) 342.4 / 197.2 against 340.8 / 224.8, `q8_0` 329.9 / 196.3 against 334.6 / 202.2; F16
/// (another call) 317.8 / 195.7 against 315.6 / 190.2, so F16 keeps [`EXPERT_TILE`]. Why two
/// subgroups a workgroup gain where the quantized runs are staged and not where F16's are is not
/// known; the barriers alone are not it (one subgroup a workgroup was slower for every format).
pub const QUANTIZED_EXPERT_TILE: CoopTile = TILE_32X64_W2.with_depth(EXPERT_DEPTH);

/// The experts' tile where their groups are long (at least `dg_gpu::planner::experts::LONG_GROUP_MEAN_SLOTS` slots per
/// expert on average: with the real model's 128 experts, top-8, an encoder chunk of 768 tokens or
/// more), F16 experts: [`TILE_64X128`]
/// single-staged, 3 steps ahead, each W tile read by half as many workgroups as in
/// [`EXPERT_TILE`]. On an H200 in a 1024-token prefill (`--profile-encoder`, 6 layers, µs for
/// layer 0's gate/up / down): 695 / 423 in [`EXPERT_TILE`], 607 / 401 at depth 2, **559 / 375**
/// at depth 3, 646 / 414 at depth 1; the 6 layers' kernels 11.05 → 10.10 ms (bench/HISTORY.md,
/// "The step in four parts, and the prefill's experts in 64-row tiles").
pub const LONG_GROUP_TILE: CoopTile = TILE_64X128.with_depth(3);

/// [`LONG_GROUP_TILE`] for quantized experts: the same tile at [`EXPERT_DEPTH`]. In the same
/// prefill: `q8_0` 745 / 432 → 640 / 409 µs (6 layers' kernels 11.47 → 10.86 ms; 10.95 at depth
/// 3), `q4_k_m` (Q4_K / Q5_0) 768 / 444 → 643 / 437 (11.64 → 11.05 ms; 11.12 at depth 3, 11.50 at
/// depth 2).
pub const QUANTIZED_LONG_GROUP_TILE: CoopTile = TILE_64X128.with_depth(EXPERT_DEPTH);

/// Whether the kernel computes the grouped product `p` with `tile`.
pub fn fits(tile: CoopTile, p: &GroupedGemmParams) -> bool {
    tile.bk.is_multiple_of(PANEL)
        && p.n > 0
        && p.k > 0
        && p.n.is_multiple_of(tile.bn)
        && p.k.is_multiple_of(tile.bk)
        && p.a_rs.is_multiple_of(4)
        && p.b_group_stride.is_multiple_of(4)
}

/// Whether some tile runs `[groups, n, k]` experts stored as `w` in K panels ([`panel`]),
/// given activations whose rows are K-aligned (`a_rs` a multiple of 4): the shapes whose weights
/// are worth uploading in K panels.
pub fn panels_fit(w: WeightFormat, n: u32, k: u32) -> bool {
    let Some(panel) = panel(w) else { return false };
    n > 0 && k > 0 && k.is_multiple_of(PANEL) && k.is_multiple_of(panel) && TILES.iter().any(|t| n.is_multiple_of(t.bn))
}

/// The columns of one K panel of experts stored as `w`: [`PANEL`] for F16, one block for a
/// quantized format (the upload puts block p of every row together: `dg_gpu::pack`); `None` for
/// the formats this kernel does not read.
pub fn panel(w: WeightFormat) -> Option<u32> {
    match w {
        WeightFormat::F16 => Some(PANEL),
        WeightFormat::Quantized(q) => Some(q.block_len() as u32),
        WeightFormat::F32 | WeightFormat::Bf16 => None,
    }
}

/// The tile's stores: a fragment whose rows are all the group's straight to C, one with some
/// through the subgroup's scratch fragment (its rows below the count copied out), one with none
/// not at all. Where every subgroup spans the tile's rows (`wm = bm`) this is decided per row of
/// fragments (a 32-row tile of a group of 16 stores one row of fragments straight and skips the
/// other); else for the whole tile, whose subgroups then reach their barriers together.
fn stores(tile: CoopTile) -> String {
    let (fm, fn_) = tile.fragments();
    let ((v, f), row, column) = ((tile.lane_span().0, tile.fragment), tile.lane_row(), tile.lane_column());
    let full = |i: u32| -> String {
        (0..fn_)
            .map(|j| {
                let (di, dj) = (i * f, j * f);
                format!("        {{\n            let ic = (first + m0 + sm + {di}u) * p.c_rs + n0 + sn + {dj}u;\n            coopStoreT(acc_{i}_{j}, &c[ic], stride_c);\n        }}\n")
            })
            .collect()
    };
    let partial = |i: u32| -> String {
        (0..fn_)
            .map(|j| {
                let (di, dj) = (i * f, j * f);
                let (trip, src) = tile.scratch_trip(i, j, "            ");
                format!(
                    "        {{\n{trip}\
                     \x20           let r = m0 + sm + {di}u + {row};\n            if (r < count) {{\n\
                     \x20               let src = {src};\n\
                     \x20               let dst = (first + r) * p.c_rs + n0 + sn + {dj}u + {column};\n\
                     \x20               for (var q = 0u; q < {v}u; q++) {{\n                    c[dst + q] = scratch[src + q];\n                }}\n\
                     \x20           }}\n            workgroupBarrier();\n        }}\n"
                )
            })
            .collect()
    };
    if tile.wm == tile.bm {
        (0..fm)
            .map(|i| {
                let di = i * f;
                format!("    if (m0 + {}u <= count) {{\n{}    }} else if (m0 + {di}u < count) {{\n{}    }}\n", di + f, full(i), partial(i))
            })
            .collect()
    } else {
        let all = |f: &dyn Fn(u32) -> String| (0..fm).map(f).collect::<String>();
        format!("    if (m0 + BM <= count) {{\n{}    }} else {{\n{}    }}\n", all(&full), all(&partial))
    }
}

/// The kernel for `tile` with W [`WPath::Staged`], named `coop_grouped_gemm_{label}`. Bindings:
/// `a`, `w`, `offsets`, `rows` (read), `c` (read-write).
pub fn source(tile: CoopTile) -> KernelSource {
    source_with(tile, WPath::Staged)
}

/// The kernel for `tile` with W reaching the tensor cores by `path`.
pub fn source_with(tile: CoopTile, path: WPath) -> KernelSource {
    source_with_a(tile, path, AFormat::F32)
}

/// [`source_with`] with A stored as `a_format`.
pub fn source_with_a(tile: CoopTile, path: WPath, a_format: AFormat) -> KernelSource {
    source_for(tile, path, WeightFormat::F16, a_format)
}

/// Whether the kernel reads experts stored as `w` by `path`: F16 by any path, a quantized format
/// (in panels of its blocks) staged or single-staged.
pub fn reads(w: WeightFormat, path: WPath) -> bool {
    // Direct W fragments load f16 straight from the buffer: F16 only.
    panel(w).is_some() && (w == WeightFormat::F16 || path != WPath::Direct)
}

/// The kernel for `tile`, experts stored as `w` in K panels ([`panel`]: F16, or a quantized
/// format's blocks a panel apiece), W reaching the tensor cores by `path` ([`reads`]), A stored as
/// `a_format`.
///
/// A panel of `P` columns holds the `P4 = P / 4` vec4s of each row's columns `p·P ..` after one
/// another, row after row: vec4 `e` of a step (row `n0 + e / BK4`, column vec4 `e % BK4`) is at
/// `(e / BK4)·P4 + e % BK4` from the tile's first row in the panel, and step `s` is `s / (P / BK)`
/// panels (`N·P4` vec4s each) and `s % (P / BK)` column steps of `BK4` further. For F16 (and the
/// 32-value blocks) `P = BK`: one panel a step, W's block of a step one contiguous run. A step of
/// several panels (`BK = c·P`) takes vec4 `e`'s column `e % BK4` from panel `(e % BK4) / P4` of
/// the step, `N·P4` vec4s apart.
///
/// # Panics
/// Where the kernel does not read `w` by `path` or does not run `tile` by `path` ([`runs`]), or
/// neither of `tile.bk` and the panel divides the other.
pub fn source_for(tile: CoopTile, path: WPath, w: WeightFormat, a_format: AFormat) -> KernelSource {
    assert!(reads(w, path), "no tensor-core grouped kernel reads {w:?} experts by {path:?}");
    assert!(runs(tile, path), "the tensor-core grouped kernel does not run tile {} by {path:?}", tile.label());
    let p = panel(w).expect("a panelled format");
    assert!(p.is_multiple_of(tile.bk) || tile.bk.is_multiple_of(p), "panels of {p} columns for K steps of {}", tile.bk);
    let (w_first, w_at, w_step, offset) = match p / tile.bk {
        0 => {
            let (p4, e) = (p / 4, "(WU * (lt + l * WT))");
            (
                format!("g * (p.b_group_stride / 4u) + n0 * {p4}u"),
                format!("(w_first + (({e} % BK4) / {p4}u) * (p.n * {p4}u) + ({e} / BK4) * {p4}u + ({e} % BK4) % {p4}u)"),
                "p.n * BK4".to_string(),
                crate::coop_kloop::LINEAR_W_OFFSET.to_string(),
            )
        }
        1 => (
            "g * (p.b_group_stride / 4u) + n0 * BK4".to_string(),
            "(w_first + WU * (lt + l * WT))".to_string(),
            "p.n * BK4".to_string(),
            crate::coop_kloop::LINEAR_W_OFFSET.to_string(),
        ),
        steps => (
            format!("g * (p.b_group_stride / 4u) + n0 * {}u", p / 4),
            format!("(w_first + ((WU * (lt + l * WT)) / BK4) * {}u + (WU * (lt + l * WT)) % BK4)", p / 4),
            format!("p.n * {}u", p / 4),
            format!("((STEP) / {steps}u) * w_step + ((STEP) % {steps}u) * BK4"),
        ),
    };
    let template = include_str!("wgsl/coop_grouped_gemm.wgsl").replace("W_FIRST", &w_first).replace("W_STEP", &w_step);
    let stores = [("//@STORE\n", stores(tile))];
    let wgsl = tile.expand_path(
        &template,
        &w_at,
        path,
        w,
        crate::coop_gemm::BLayout::NkPanels,
        crate::coop_kloop::Ring::for_experts(w),
        stores.to_vec(),
    );
    let wgsl = crate::coop_kloop::w_offsets(&wgsl, &offset);
    let format = if w == WeightFormat::F16 { "" } else { w.suffix() };
    KernelSource {
        name: format!("coop_grouped_gemm_{}{}{format}{}", tile.label(), path.suffix(), a_format.suffix()),
        wgsl: wgsl.replace("A_ELEM", a_format.elem()).replace("PIN_A", a_format.pin()),
        entry: "main",
        buffers: vec![Access::Read, Access::Read, Access::Read, Access::Read, Access::ReadWrite],
        params_size: size_of::<GroupedGemmParams>() as u64,
    }
}

/// Tile table entry past the last m tile that holds slots.
pub const NO_TILE: u32 = u32::MAX;

/// Entries of the tile table of `slots` slots over `groups` groups in m tiles of `tile_rows`:
/// `Σ ⌈count_g / tile_rows⌉` is at most `⌊(slots + groups · (tile_rows − 1)) / tile_rows⌋`, whatever
/// the counts (`moe_dispatch.wgsl` computes the same bound).
pub fn table_len(slots: u32, groups: u32, tile_rows: u32) -> u32 {
    (slots + groups * (tile_rows - 1)) / tile_rows
}

/// The tile table of groups with `counts` slots, as `moe_dispatch` writes it after the offsets
/// for `entries` routing entries (valid or not: at least the counts' sum): `g | (m << 16)` for
/// each m tile `m` of each group `g` in order, then [`NO_TILE`] up to [`table_len`] of `entries`.
pub fn tile_table(counts: &[u32], entries: u32, tile_rows: u32) -> Vec<u32> {
    let mut table: Vec<u32> =
        counts.iter().enumerate().flat_map(|(g, &c)| (0..c.div_ceil(tile_rows)).map(move |m| g as u32 | (m << 16))).collect();
    table.resize(table_len(entries, counts.len() as u32, tile_rows) as usize, NO_TILE);
    table
}

/// `p` as the kernel with `tile` runs it: [`params_for_rows`] of its rows.
pub fn params_for(tile: CoopTile, p: &GroupedGemmParams) -> GroupedGemmParams {
    params_for_rows(tile.bm, p)
}

/// `p` as a grouped kernel with m tiles of `rows` slots runs it: with the tile table only where
/// its m tiles are that many rows (else over the `max_rows` grid). The native kernel
/// ([`crate::native_grouped_gemm`]) shares it.
pub fn params_for_rows(rows: u32, p: &GroupedGemmParams) -> GroupedGemmParams {
    match p.tiles != 0 && p.tile_rows != rows {
        true => GroupedGemmParams { tiles: 0, ..*p },
        false => *p,
    }
}

/// The dispatch for `p` as [`params_for`] gives it: [`workgroups_for`] of the tile's rows and
/// columns.
pub fn workgroups(tile: CoopTile, p: &GroupedGemmParams) -> [u32; 3] {
    workgroups_for(tile.bm, tile.bn, p)
}

/// The dispatch of a grouped kernel with tiles of `rows` slots × `cols` columns for `p` as
/// [`params_for_rows`] gives it: `tiles · (n / cols)` workgroups with a tile table, else
/// `ceil(max_rows / rows) · (n / cols) · groups`; folded as [`crate::gemm::fold`] folds them.
pub fn workgroups_for(rows: u32, cols: u32, p: &GroupedGemmParams) -> [u32; 3] {
    let m_tiles = match p.tiles {
        0 => u64::from(p.max_rows.div_ceil(rows)) * u64::from(p.groups),
        tiles => u64::from(tiles),
    };
    fold(m_tiles * u64::from(p.n / cols))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tile_tables_list_each_groups_m_tiles_within_their_bound() {
        let table = tile_table(&[3, 0, 40, 32, 1], 76, 32);
        assert_eq!(table_len(76, 5, 32), 7);
        assert_eq!(table, vec![0, 2, 2 | 1 << 16, 3, 4, NO_TILE, NO_TILE]);
        // The bound is reached when every group's count leaves one row over a whole tile.
        let worst = [33u32; 4];
        assert_eq!(tile_table(&worst, 4 * 33, 32).iter().filter(|&&e| e != NO_TILE).count() as u32, table_len(4 * 33, 4, 32));
        let p = GroupedGemmParams { tiles: 6, tile_rows: 32, ..bytemuck::Zeroable::zeroed() };
        assert_eq!(params_for(TILE_32X128, &p).tiles, 6);
        assert_eq!(params_for(TILE_64X128, &p).tiles, 0);
        assert_eq!(workgroups(TILE_32X128, &GroupedGemmParams { n: 256, ..p }), [12, 1, 1]);
    }

    #[test]
    fn panels_hold_each_k_block_of_all_rows_contiguously() {
        let (n, k) = (3, 64);
        let w: Vec<f32> = (0..n * k).map(|i| i as f32).collect();
        let packed = pack_f16_panels(&w, n, k, 32);
        let halves = crate::unpack_f16(&packed, n * k);
        for (at, &v) in halves.iter().enumerate() {
            let (panel, j, q) = (at / (n * 32), at / 32 % n, at % 32);
            assert_eq!(v, w[j * k + panel * 32 + q], "element {at}");
        }
    }

    #[test]
    fn quantized_experts_stage_whole_runs_where_every_invocation_takes_whole_runs() {
        use crate::format::QuantFormat;
        let units = |tile: CoopTile, q: QuantFormat| {
            let wgsl = source_for(tile, WPath::Single, WeightFormat::Quantized(q), AFormat::F16).wgsl;
            let lw = |name: &str| wgsl.lines().find(|l| l.starts_with(&format!("const {name}: u32 = "))).map(str::to_string);
            let unit = ["QR", "QH"].into_iter().find(|u| wgsl.contains(&format!("fn put_w(at: u32, e: u32, x: {u})")));
            (lw("WU"), lw("LW"), unit)
        };
        // 128 rows a step over 128 invocations: a 32-value run (8 vec4s) each.
        for q in [QuantFormat::Q8_0, QuantFormat::Q5_0, QuantFormat::Q4_K] {
            let (wu, lw, unit) = units(EXPERT_TILE, q);
            assert_eq!(
                (wu.as_deref(), lw.as_deref(), unit),
                (Some("const WU: u32 = 8u;"), Some("const LW: u32 = 1u;"), Some("QR")),
                "{q:?}"
            );
            // 64 rows over 128 invocations: half a run each (blocks in planes).
            let (wu, lw, unit) = units(TILE_32X64, q);
            assert_eq!(
                (wu.as_deref(), lw.as_deref(), unit),
                (Some("const WU: u32 = 4u;"), Some("const LW: u32 = 1u;"), Some("QH")),
                "{q:?}"
            );
        }
        // K steps of 64: two runs of a row each (one from each panel of the step).
        let (wu, lw, unit) = units(CoopTile { bk: 64, ..TILE_32X128 }, QuantFormat::Q8_0);
        assert_eq!((wu.as_deref(), lw.as_deref(), unit), (Some("const WU: u32 = 8u;"), Some("const LW: u32 = 2u;"), Some("QR")));
        // Q6_K has neither: vec4 by vec4.
        let (wu, _, unit) = units(EXPERT_TILE, QuantFormat::Q6_K);
        assert_eq!((wu.as_deref(), unit), (Some("const WU: u32 = 1u;"), None));
    }

    #[test]
    fn f16_experts_issue_each_pass_of_loads_before_its_first_barrier() {
        use crate::coop_gemm::BLayout;
        use crate::coop_kloop::Ring;
        use crate::format::QuantFormat;
        // The W loads (`fetch_w`) between the K loop's head and its first barrier or product.
        let loads_at_pass_head = |wgsl: String| {
            let body = &wgsl[wgsl.find("for (var s0 = 0u;").expect("the K loop")..];
            let first = ["workgroupBarrier()", "coopMultiplyAdd("].iter().filter_map(|m| body.find(m)).min().expect("a barrier");
            body[..first].matches("fetch_w(").count()
        };
        let experts =
            |tile: CoopTile, path: WPath, format: WeightFormat| loads_at_pass_head(source_for(tile, path, format, AFormat::F16).wgsl);
        assert_eq!(Ring::for_experts(WeightFormat::F16), Ring::Batched);
        // Batched: the pass's `depth` steps at once, each an invocation's 8 vec4s of W
        // (128 × 32 halves over 128 invocations), in the decoder's single-staged tile and the
        // encoder's staged one.
        assert_eq!(experts(EXPERT_TILE, WPath::Single, WeightFormat::F16), EXPERT_TILE.depth as usize * 8);
        assert_eq!(experts(TILE_64X128, WPath::Staged, WeightFormat::F16), TILE_64X128.depth as usize * 8);
        // Staggered: a step's loads come after its first barrier and stores (single) or after
        // its product (staged); so for quantized experts and for the dense kernel.
        assert_eq!(experts(EXPERT_TILE, WPath::Single, WeightFormat::Quantized(QuantFormat::Q4_K)), 0);
        let dense = crate::coop_gemm::source_for(crate::coop_gemm::TILE_128X128, WPath::Staged, WeightFormat::F16, BLayout::NkPanels);
        assert_eq!(loads_at_pass_head(dense.wgsl), 0);
    }

    #[test]
    fn the_real_experts_fit_the_tiles() {
        let (gate_up, down) = GroupedGemmParams::real_experts();
        for tile in [EXPERT_TILE, GATHERED_EXPERT_TILE, QUANTIZED_EXPERT_TILE, LONG_GROUP_TILE, QUANTIZED_LONG_GROUP_TILE] {
            assert!(fits(tile, &gate_up) && fits(tile, &down), "{}", tile.label());
        }
        let tiny = GroupedGemmParams { n: 64, k: 32, b_group_stride: 64 * 32, a_rs: 32, ..down };
        assert!(fits(TILE_32X64, &tiny));
        assert!(!fits(TILE_32X64, &GroupedGemmParams { n: 48, ..tiny }));
        assert!(!fits(TILE_32X64, &GroupedGemmParams { k: 40, ..tiny }));
        // A K-64 tile (dg-lab's) fits the real shapes, single-staged only.
        let k64 = CoopTile { bk: 64, ..TILE_32X128 };
        assert!(fits(k64, &gate_up) && fits(k64, &down));
        assert!(runs(k64, WPath::Single) && !runs(k64, WPath::Staged) && !runs(k64, WPath::Direct));
        assert!(TILES.iter().all(|&t| [WPath::Staged, WPath::Direct, WPath::Single].into_iter().all(|path| runs(t, path))));
    }
}

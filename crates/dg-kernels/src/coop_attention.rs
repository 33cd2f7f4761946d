//! The decoder's attention as one tensor-core kernel (`wgsl/coop_attention.wgsl`): HF's
//! `eager_attention_forward` for the Gemma 4 attention of a canvas (softmax(q · kᵀ · scaling) · v,
//! scaling 1, bidirectional over the cache's keys with the dead columns masked), where the
//! forward otherwise runs the scores product, the row softmax and the values product
//! (`coop_gemm`, `softmax`) and writes the scores to memory in between. The forward takes it
//! only with `DG_FUSED_ATTENTION=1` (`dg_gpu::Planner::fused_attention`): faster alone, it did not
//! make the forward faster (bench/HISTORY.md, "The decoder's attention as one kernel").
//!
//! A workgroup takes [`QUERY_ROWS`] queries of one query head and runs the key tiles twice: once
//! for each row's maximum, once for `exp(s − max)` (rounded to f16, as the values product rounds
//! the probabilities) times V and each row's sum; it divides by the sums as it stores. The
//! scores stay in workgroup memory. K and V tiles reach the tensor cores through one stage of
//! workgroup memory, each loaded into registers a phase ahead: loaded straight from the cache as
//! fragments, the same kernel took 290 µs for the real sliding layer's attention on an H100,
//! and 62 µs with its fragments from workgroup memory.

use bytemuck::{Pod, Zeroable};

use crate::{Access, KernelSource, with_prelude};

/// Queries (rows of one head) a workgroup takes; the last block of a group may be partial.
pub const QUERY_ROWS: u32 = 32;
/// Keys a step of the key loop may take, the planner's first choice first ([`key_tile_for`]): the
/// largest whose workgroup memory fits. A tile of 32 keys splits the head's dims between two
/// subgroups for each block of scores, one of 64 gives each block to one subgroup.
pub const KEY_TILES: [u32; 2] = [64, 32];
/// Invocations per workgroup: 8 subgroups of 32.
pub const WORKGROUP: u32 = 256;
/// Head sizes the kernel is rendered for (each a multiple of 64: a subgroup's quarter of O's
/// columns is whole fragments).
pub const HEAD_DIMS: [u32; 4] = [64, 128, 256, 512];
/// The largest head size the planner runs fused (`dg_gpu::Planner::fused_attention`, where the
/// tuning asks for it). On an H100
/// (`cargo xtask probe fused_attention_probe`, the real canvas of 256 queries, 16 heads), µs
/// against the scores product, softmax and values product: sliding layers (head 256, 8 K/V heads)
/// 91 against 106 over 1280 keys, 260 against 339 over 4352, 896 against 1054 over 16640; full
/// layers (head 512, 2 K/V heads, key tiles of 32) 174–181 against 127–129 over 1280 keys and
/// 2040 against 1230 over 16640. A workgroup holds 32 queries of one head and reads the head's
/// whole K (twice) and V, so the 512-wide heads read four times the bytes per query of the
/// products' 128 × 128 tiles for the same work.
pub const MAX_HEAD_DIM: u32 = 256;

/// Uniform parameters of `coop_attention.wgsl` (offsets and strides in elements).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable, PartialEq, Eq)]
pub struct AttentionParams {
    /// q's first row, and its rows' stride (query head `h` at column `h · head_dim`).
    pub q_offset: u32,
    pub q_rs: u32,
    /// Key 0's row in the cache (head `g` at column `g · head_dim` of it), and the cache rows'
    /// stride (`kv_heads · head_dim`); K and V alike.
    pub kv_offset: u32,
    pub kv_rs: u32,
    /// Query heads per K/V head.
    pub group: u32,
    /// Keys `0..keys`.
    pub keys: u32,
    /// Keys `gap_start..gap_end` are masked (equal: none).
    pub gap_start: u32,
    pub gap_end: u32,
    /// O's first row and its rows' stride (query head `h` at column `h · head_dim`).
    pub o_offset: u32,
    pub o_rs: u32,
    /// Queries (at least 1).
    pub queries: u32,
    pub _pad: u32,
}

/// The workgroups: one per block of [`QUERY_ROWS`] queries and query head.
pub fn workgroups(p: &AttentionParams, heads: u32) -> [u32; 3] {
    [p.queries.div_ceil(QUERY_ROWS), heads, 1]
}

/// Bytes of workgroup memory the kernel for `head_dim` in key tiles of `key_tile` takes.
pub const fn shared_bytes(head_dim: u32, key_tile: u32) -> u32 {
    let stage = key_tile * (head_dim + 8) * 2;
    let probabilities = QUERY_ROWS * (key_tile + 8) * 2;
    stage + scores_len(key_tile) * 4 + probabilities + WORKGROUP * 4 + QUERY_ROWS * 4
}

/// Parts of the head a block of scores is summed over (one subgroup each).
const fn split(key_tile: u32) -> u32 {
    64 / key_tile
}

/// f32s of the scores' scratch: a key tile's partial scores (rows of `key_tile + 4`), or a
/// fragment of O a subgroup.
const fn scores_len(key_tile: u32) -> u32 {
    let tile = split(key_tile) * QUERY_ROWS * (key_tile + 4);
    let fragments = (WORKGROUP / 32) * 256;
    if tile > fragments { tile } else { fragments }
}

/// The key tile the kernel for `head_dim` takes on a device with `max_shared` bytes of workgroup
/// memory (at most [`crate::coop_gemm::MAX_SHARED_BYTES`], which every key is rendered within):
/// the first of [`KEY_TILES`] that fits, if any.
pub fn key_tile_for(head_dim: u32, max_shared: u32) -> Option<u32> {
    key_tiles(head_dim).find(|&t| shared_bytes(head_dim, t) <= max_shared)
}

/// The key tiles the kernel for `head_dim` is rendered in (those of [`KEY_TILES`] within
/// [`crate::coop_gemm::MAX_SHARED_BYTES`]; none for a head size outside [`HEAD_DIMS`]).
pub fn key_tiles(head_dim: u32) -> impl Iterator<Item = u32> {
    let rendered = HEAD_DIMS.contains(&head_dim);
    KEY_TILES.into_iter().filter(move |&t| rendered && shared_bytes(head_dim, t) <= crate::coop_gemm::MAX_SHARED_BYTES)
}

/// Whether the kernel takes a group of `queries` queries over `keys` keys at `head_dim`, on a
/// device with `max_shared` bytes of workgroup memory.
pub fn takes(head_dim: u32, queries: u32, keys: u32, max_shared: u32) -> bool {
    key_tile_for(head_dim, max_shared).is_some() && queries > 0 && keys > 0
}

/// The kernel for `head_dim` in key tiles of `key_tile` and fragments of side `fragment` (16 or
/// 8). Bindings: q (f32), the cache's K and V (f16), O (f32, read-write).
///
/// # Panics
/// On a head size outside [`HEAD_DIMS`], a key tile outside [`KEY_TILES`] or another fragment side.
pub fn source(head_dim: u32, key_tile: u32, fragment: u32) -> KernelSource {
    assert!(HEAD_DIMS.contains(&head_dim), "no fused attention for head size {head_dim}");
    assert!(KEY_TILES.contains(&key_tile), "no fused attention in key tiles of {key_tile}");
    assert!(matches!(fragment, 8 | 16), "fragments of side 8 or 16, not {fragment}");
    let (d, kt, f) = (head_dim, key_tile, fragment);
    let parts = split(kt);
    let frag = |elem: &str, role: &str| format!("coop_mat{f}x{f}<{elem}, {role}>");
    let n = 16 / f; // fragments along each side of a subgroup's 16 × 16 score block
    let nj = d / 4 / f; // O's column fragments a subgroup owns
    let slices = d / parts / f; // k slices of a subgroup's part of the head
    let blocks = |ni: u32, nj: u32| (0..ni).flat_map(move |i| (0..nj).map(move |j| (i, j)));

    // Each subgroup's q fragments (its 16 rows, its half of the head), from the staged queries.
    let mut qfrags = String::new();
    for (i, u) in blocks(n, slices) {
        let at = format!("(sr + {}u) * KP4 + (sd + {}u) / 4u", i * f, u * f);
        qfrags += &fragment_load("    ", &format!("qa_{i}_{u}"), &at, ("coopLoadT", &frag("f16", "A")), ("kv", "stride_kv"));
    }

    // The subgroup's (partial) S over its part of the head, from the staged K tile, into ss.
    let mut scores = String::from("        {\n");
    for (i, j) in blocks(n, n) {
        scores += &format!("            var s_{i}_{j} = {}();\n", frag("f32", "C"));
    }
    for u in 0..slices {
        for j in 0..n {
            let at = format!("(sc + {}u) * KP4 + (sd + {}u) / 4u", j * f, u * f);
            scores += &fragment_load("            ", &format!("fb_{u}_{j}"), &at, ("coopLoad", &frag("f16", "B")), ("kv", "stride_kv"));
        }
        for (i, j) in blocks(n, n) {
            scores += &format!("            s_{i}_{j} = coopMultiplyAdd(qa_{i}_{u}, fb_{u}_{j}, s_{i}_{j});\n");
        }
    }
    for (i, j) in blocks(n, n) {
        scores += &format!(
            "            let is_{i}_{j} = part * SSH + (sr + {}u) * SP + sc + {}u;\n            coopStoreT(s_{i}_{j}, &ss[is_{i}_{j}], stride_s);\n",
            i * f,
            j * f
        );
    }
    scores += "        }\n";

    // O += E · V from the staged V tile.
    let mut values = String::from("        {\n");
    for kk in 0..kt / f {
        for i in 0..n {
            let at = format!("(orow + {}u) * PP4 + {}u", i * f, kk * f / 4);
            values += &fragment_load("            ", &format!("fp_{kk}_{i}"), &at, ("coopLoadT", &frag("f16", "A")), ("sp", "stride_p"));
        }
        for j in 0..nj {
            let at = format!("{}u * KP4 + (oc + {}u) / 4u", kk * f, j * f);
            values += &fragment_load("            ", &format!("fv_{kk}_{j}"), &at, ("coopLoadT", &frag("f16", "B")), ("kv", "stride_kv"));
        }
        for (i, j) in blocks(n, nj) {
            values += &format!("            o_{i}_{j} = coopMultiplyAdd(fp_{kk}_{i}, fv_{kk}_{j}, o_{i}_{j});\n");
        }
    }
    values += "        }\n";

    let acc: String = blocks(n, nj).map(|(i, j)| format!("    var o_{i}_{j} = {}();\n", frag("f32", "C"))).collect();

    // Each O fragment through the subgroup's scratch: lane l divides and stores `per` values.
    let per = f * f / 32;
    let mut store = String::new();
    for (i, j) in blocks(n, nj) {
        store += &format!(
            "    {{\n        coopStoreT(o_{i}_{j}, &ss[scratch], stride_f);\n        workgroupBarrier();\n\
             \x20       // @unroll\n        for (var v = 0u; v < {per}u; v++) {{\n\
             \x20           let e = lane * {per}u + v;\n\
             \x20           let r = orow + {}u + e / {f}u;\n\
             \x20           let total = rowsum[r];\n\
             \x20           let at = p.o_offset + (q0 + r) * stride_o + h * D + oc + {}u + e % {f}u;\n\
             \x20           if (q0 + r < p.queries) {{\n\
             \x20               o[at] = select(0.0, ss[scratch + e] / total, total > 0.0);\n\
             \x20           }}\n\
             \x20       }}\n        workgroupBarrier();\n    }}\n",
            i * f,
            j * f
        );
    }

    let template = crate::softmax::with_online(include_str!("wgsl/coop_attention.wgsl"));
    let body = template
        .replace("//@QFRAGS\n", &qfrags)
        .replace("//@SCORES\n", &scores)
        .replace("//@VALUES\n", &values)
        .replace("//@ACC\n", &acc)
        .replace("//@STORE\n", &store)
        .replace("SCORE_AT", &(0..parts).map(|q| format!("ss[{q}u * SSH + row * SP + c0 + j]")).collect::<Vec<_>>().join(" + "));
    let body = with_tile_moves(&body);
    let consts = [
        ("D", d),
        ("FRAGMENT_SIDE", f),
        ("QM", QUERY_ROWS),
        ("BKEY", kt),
        ("KB", kt / 16),
        ("SPLIT", parts),
        ("DP", d / parts),
        ("CPI", kt / 8),
        ("CQ", kt / 32),
        ("WT", WORKGROUP),
        ("KP4", (d + 8) / 4),
        ("SP", kt + 4),
        ("SSH", QUERY_ROWS * (kt + 4)),
        ("PP4", (kt + 8) / 4),
        ("SSL", scores_len(kt)),
        ("LKV", kt * d / 4 / WORKGROUP),
    ];
    KernelSource {
        name: format!("coop_attention_d{d}_k{kt}_f{f}"),
        wgsl: format!("enable f16;\nenable wgpu_cooperative_matrix;\n{}", with_prelude(&consts, &crate::gemm::unroll(&body, &consts))),
        entry: "main",
        buffers: vec![Access::Read, Access::Read, Access::Read, Access::ReadWrite],
        params_size: size_of::<AttentionParams>() as u64,
    }
}

/// The WGSL lines that load fragment `name` of type `ty` by `op` (`coopLoad`: column-major,
/// `coopLoadT`: row-major) from `array` at index `at` with `stride`, the index a `let` of its own.
fn fragment_load(indent: &str, name: &str, at: &str, (op, ty): (&str, &str), (array, stride): (&str, &str)) -> String {
    format!("{indent}let i_{name} = {at};\n{indent}let {name} = {op}<{ty}>(&{array}[i_{name}], {stride});\n")
}

/// `body` with each `//@LOAD reg src tile` line replaced by the loads of the invocation's share of
/// key tile `tile` from `src` (`kc` or `vc`) into the registers `reg`, and each `//@PUT reg` line by
/// their stores into the stage.
fn with_tile_moves(body: &str) -> String {
    let mut out = String::with_capacity(body.len() * 2);
    for line in body.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["//@LOAD", reg, src, tile @ ..] => {
                let tile = tile.join(" ");
                out += &format!(
                    "    // @unroll\n    for (var l = 0u; l < LKV; l++) {{\n        {reg}[l] = {src}[kv_src(kv_base, rs4, lt, l, {tile})];\n    }}\n"
                );
            }
            ["//@PUT", reg] => {
                out += &format!("    // @unroll\n    for (var l = 0u; l < LKV; l++) {{\n        kv[kv_dst(lt, l)] = {reg}[l];\n    }}\n");
            }
            _ => {
                assert!(!line.trim_start().starts_with("//@LOAD") && !line.trim_start().starts_with("//@PUT"), "malformed `{line}`");
                out += line;
                out.push('\n');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_tile_is_the_largest_that_fits() {
        assert_eq!(key_tile_for(256, 48 * 1024), Some(64), "{}", shared_bytes(256, 64));
        assert_eq!(key_tile_for(512, 48 * 1024), Some(32), "{}", shared_bytes(512, 32));
        assert_eq!(key_tile_for(256, 32 * 1024), Some(32), "lavapipe: {}", shared_bytes(256, 32));
        assert_eq!(key_tile_for(128, 32 * 1024), Some(64), "lavapipe: {}", shared_bytes(128, 64));
        assert_eq!(key_tile_for(512, 32 * 1024), None);
        assert_eq!(key_tile_for(512, 64 * 1024), Some(32), "rendered within 48 KiB");
        assert!(takes(256, 48, 1288, 48 * 1024), "a partial block of queries, keys ending inside a tile");
        assert!(!takes(256, 0, 1280, 48 * 1024), "no queries");
        assert!(!takes(96, 256, 1280, 48 * 1024), "a head size not rendered");
    }
}

//! The decoder's attention as one tensor-core kernel (`wgsl/coop_attention.wgsl`): HF's
//! `eager_attention_forward` for the Gemma 4 attention of a canvas (softmax(q · kᵀ · scaling) · v,
//! scaling 1, bidirectional over the cache's keys with the dead columns masked), where the
//! forward otherwise runs the scores product, the row softmax and the values product
//! (`coop_gemm`, `softmax`) and writes the scores to memory in between.
//!
//! A workgroup takes [`QUERY_ROWS`] queries of one query head and runs the key tiles twice: once
//! for each row's maximum, once for `exp(s − max)` (rounded to f16, as the values product rounds
//! the probabilities) times V and each row's sum; it divides by the sums as it stores. The
//! scores stay in workgroup memory. K and V fragments load straight from the f16 cache.

use bytemuck::{Pod, Zeroable};

use crate::{Access, KernelSource, with_prelude};

/// Queries (rows of one head) a workgroup takes; the last block of a group may be partial.
pub const QUERY_ROWS: u32 = 32;
/// Keys a step of the key loop takes.
pub const KEY_TILE: u32 = 64;
/// Invocations per workgroup: 8 subgroups of 32.
pub const WORKGROUP: u32 = 256;
/// Head sizes the kernel is rendered for (each a multiple of 64: a subgroup's quarter of O's
/// columns is whole fragments).
pub const HEAD_DIMS: [u32; 4] = [64, 128, 256, 512];
/// Keys past which the planner leaves attention to the products (`dg_gpu::Planner::fused_attention`):
/// each workgroup reads its head's whole K and V (twice K), so at long contexts the 128 workgroups
/// of a canvas read the cache 128 times where the products' tiles read it a few times.
pub const MAX_KEYS: u32 = 4096 + 256 + 32;
/// K fragments of the scores product loaded together before their products.
const K_UNROLL: u32 = 4;

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
    /// Keys `0..keys` (a multiple of 16).
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

/// Bytes of workgroup memory the kernel for `head_dim` takes.
pub const fn shared_bytes(head_dim: u32) -> u32 {
    let (sq, ss, sp) = (QUERY_ROWS * (head_dim + 8) * 2, scores_len() * 4, QUERY_ROWS * (KEY_TILE + 8) * 2);
    sq + ss + sp + WORKGROUP * 4 + QUERY_ROWS * 4
}

/// f32s of the scores' scratch: a key tile's scores, or a fragment of O per subgroup.
const fn scores_len() -> u32 {
    let tile = QUERY_ROWS * (KEY_TILE + 4);
    let fragments = (WORKGROUP / 32) * 256;
    if tile > fragments { tile } else { fragments }
}

/// Whether the kernel takes a group of `queries` queries over `keys` keys at `head_dim`, on a
/// device with `max_shared` bytes of workgroup memory.
pub fn takes(head_dim: u32, queries: u32, keys: u32, max_shared: u32) -> bool {
    HEAD_DIMS.contains(&head_dim) && queries > 0 && keys > 0 && keys.is_multiple_of(16) && shared_bytes(head_dim) <= max_shared
}

/// The kernel for `head_dim` in fragments of side `fragment` (16 or 8). Bindings: q (f32), the
/// cache's K and V (f16), O (f32, read-write).
///
/// # Panics
/// On a head size outside [`HEAD_DIMS`] or another fragment side.
pub fn source(head_dim: u32, fragment: u32) -> KernelSource {
    assert!(HEAD_DIMS.contains(&head_dim), "no fused attention for head size {head_dim}");
    assert!(matches!(fragment, 8 | 16), "fragments of side 8 or 16, not {fragment}");
    let (d, f) = (head_dim, fragment);
    let frag = |elem: &str, role: &str| format!("coop_mat{f}x{f}<{elem}, {role}>");
    let n = 16 / f; // fragments along each side of a subgroup's 16 × 16 score block
    let nj = d / 4 / f; // O's column fragments a subgroup owns
    let blocks = |ni: u32, nj: u32| (0..ni).flat_map(move |i| (0..nj).map(move |j| (i, j)));

    // S = q · Kᵀ for the subgroup's block of key tile t, into ss.
    let mut scores = format!("        {{\n            let key0 = t * BKEY + sc;\n");
    for (i, j) in blocks(n, n) {
        scores += &format!("            var s_{i}_{j} = {}();\n", frag("f32", "C"));
    }
    scores += &format!("            for (var kk = 0u; kk < D; kk += {}u) {{\n", K_UNROLL * f);
    for u in 0..K_UNROLL {
        for i in 0..n {
            scores += &format!(
                "                let ia_{u}_{i} = (sr + {}u) * QP4 + (kk + {}u) / 4u;\n                let fa_{u}_{i} = coopLoadT<{}>(&sq[ia_{u}_{i}], stride_q);\n",
                i * f,
                u * f,
                frag("f16", "A")
            );
        }
        for j in 0..n {
            scores += &format!(
                "                let ib_{u}_{j} = kv_base + min(key0 + {}u, last_key) * rs4 + (kk + {}u) / 4u;\n                let fb_{u}_{j} = coopLoad<{}>(&kc[ib_{u}_{j}], rs4);\n",
                j * f,
                u * f,
                frag("f16", "B")
            );
        }
    }
    for u in 0..K_UNROLL {
        for (i, j) in blocks(n, n) {
            scores += &format!("                s_{i}_{j} = coopMultiplyAdd(fa_{u}_{i}, fb_{u}_{j}, s_{i}_{j});\n");
        }
    }
    scores += "            }\n";
    for (i, j) in blocks(n, n) {
        scores += &format!(
            "            let is_{i}_{j} = (sr + {}u) * SP + sc + {}u;\n            coopStoreT(s_{i}_{j}, &ss[is_{i}_{j}], stride_s);\n",
            i * f,
            j * f
        );
    }
    scores += "        }\n";

    // O += E · V over key tile t.
    let mut values = String::from("        {\n");
    for kk in 0..KEY_TILE / f {
        values += &format!("            let key_{kk} = min(t * BKEY + {}u, last_key);\n", kk * f);
        for i in 0..n {
            values += &format!(
                "            let ip_{kk}_{i} = (sr + {}u) * PP4 + {}u;\n            let fp_{kk}_{i} = coopLoadT<{}>(&sp[ip_{kk}_{i}], stride_p);\n",
                i * f,
                kk * f / 4,
                frag("f16", "A")
            );
        }
        for j in 0..nj {
            values += &format!(
                "            let iv_{kk}_{j} = kv_base + key_{kk} * rs4 + (oc + {}u) / 4u;\n            let fv_{kk}_{j} = coopLoadT<{}>(&vc[iv_{kk}_{j}], rs4);\n",
                j * f,
                frag("f16", "B")
            );
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
             \x20           let r = sr + {}u + e / {f}u;\n\
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
    let body =
        template.replace("//@SCORES\n", &scores).replace("//@VALUES\n", &values).replace("//@ACC\n", &acc).replace("//@STORE\n", &store);
    let consts = [
        ("D", d),
        ("FRAGMENT_SIDE", f),
        ("QM", QUERY_ROWS),
        ("BKEY", KEY_TILE),
        ("WT", WORKGROUP),
        ("QP4", (d + 8) / 4),
        ("SP", KEY_TILE + 4),
        ("PP4", (KEY_TILE + 8) / 4),
        ("SSL", scores_len()),
    ];
    KernelSource {
        name: format!("coop_attention_d{d}_f{f}"),
        wgsl: format!("enable f16;\nenable wgpu_cooperative_matrix;\n{}", with_prelude(&consts, &crate::gemm::unroll(&body, &consts))),
        entry: "main",
        buffers: vec![Access::Read, Access::Read, Access::Read, Access::ReadWrite],
        params_size: size_of::<AttentionParams>() as u64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_real_head_sizes_fit_an_h200_and_the_sliding_one_lavapipe() {
        assert!(shared_bytes(512) <= 48 * 1024, "{}", shared_bytes(512));
        assert!(shared_bytes(256) <= 32 * 1024, "{}", shared_bytes(256));
        assert!(takes(256, 256, 1280, 32 * 1024));
        assert!(!takes(512, 256, 1280, 32 * 1024));
        assert!(takes(256, 48, 1280, 48 * 1024), "a partial block of queries");
        assert!(!takes(256, 0, 1280, 48 * 1024), "no queries");
        assert!(!takes(256, 256, 1288, 48 * 1024), "keys not whole fragments");
        assert!(!takes(96, 256, 1280, 48 * 1024), "a head size not rendered");
    }
}

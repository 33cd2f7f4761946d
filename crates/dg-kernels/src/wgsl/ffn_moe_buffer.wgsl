// The plain variant's source of moe (ffn_residual_norms.wgsl, //@MOE_SOURCE): the buffer as the
// MoE combine wrote it; no entries to rank.

fn rank_entries(t: u32, live: bool, k: u32) {}

fn moe_first(base: u32, i: u32) -> V {
    return moe[base + i];
}

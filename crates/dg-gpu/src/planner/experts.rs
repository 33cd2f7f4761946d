//! Which kernel runs the experts' grouped product on the tensor cores: the Vulkan-native one
//! (`dg_kernels::native_grouped_gemm`) for short groups where the device runs it ([`native`]),
//! else WGSL's (`dg_kernels::coop_grouped_gemm`): its tile and W path, and how its loops name their
//! stages. The kernels say which tiles take a product (`coop_grouped_gemm::fits`, `runs`,
//! `native_grouped_gemm::fits`); this is the rule among them.

use dg_kernels::WeightFormat;
use dg_kernels::coop_gemm::{CoopTile, Stages, WPath};
use dg_kernels::coop_grouped_gemm::{
    EXPERT_TILE, GATHERED_EXPERT_TILE, LONG_GROUP_TILE, QUANTIZED_EXPERT_TILE, QUANTIZED_LONG_GROUP_TILE, TILE_32X64, fits,
};
use dg_kernels::grouped_gemm::GroupedGemmParams;
use dg_kernels::native_grouped_gemm::{self, NativeShape, NativeShapes};
use dg_kernels::native_int8_gemm::{self, Int8Shape, Int8Shapes};

/// The mean slots per expert from which [`choose`] takes the long groups' tiles. On an H200 the
/// 64-row tile lost at 16 (a commit: 6 layers' kernels 4.63 ms in [`EXPERT_TILE`] against 5.30),
/// tied at 32 (a 512-token prefill: 6.46 against 6.52) and won at 64 (11.05 against 10.10).
pub const LONG_GROUP_MEAN_SLOTS: u32 = 48;

/// The tile and W path for `p` over `slots` slots (any W format, either A format), the first of
/// the preferred list that fits: [`EXPERT_TILE`] for F16 experts ([`GATHERED_EXPERT_TILE`] for
/// their gate/up, whose rows are gathered), [`QUANTIZED_EXPERT_TILE`] for
/// quantized ones, or where the groups are long (`slots` at least [`LONG_GROUP_MEAN_SLOTS`] a
/// group) [`LONG_GROUP_TILE`] and [`QUANTIZED_LONG_GROUP_TILE`]; else 32 × 64, A and W staged
/// through a single stage of workgroup memory, loaded [`EXPERT_DEPTH`] steps ahead. The choice
/// depends on the slots and not on the format's other traits, so a layer's gate/up and down
/// (which may differ in format) take tiles of the same rows and share the dispatch's tile table.
/// On an H200 in the real 6-layer forward, since the K loop's loads are pinned
/// (`coop_kloop.rs`): down 216 µs single-staged at depth 1 against 224 with W fragments straight
/// from the buffer (which the driver loads two bytes at a time) and 238 direct at depth 2. In a
/// 1024-token prefill (`--profile-encoder`, layer 0's gate/up / down) the F16 experts took 683.6 /
/// 415.9 µs against 756.7 / 497.2 in [`TILE_64X128`] staged (the encoder's tile until the rings
/// were batched), and the prefill's wall time over 30 layers 76.8 against 81.3 ms (bench/HISTORY.md,
/// "The encoder's experts in the decoder's tile").
pub fn choose(p: &GroupedGemmParams, format: WeightFormat, slots: u32) -> Option<(CoopTile, WPath)> {
    let long = long_groups(p, slots);
    let expert_tile = match (format, long) {
        (WeightFormat::Quantized(_), false) => QUANTIZED_EXPERT_TILE,
        (WeightFormat::Quantized(_), true) => QUANTIZED_LONG_GROUP_TILE,
        (WeightFormat::F16 | WeightFormat::F32 | WeightFormat::Bf16, false) if p.gather != 0 => GATHERED_EXPERT_TILE,
        (WeightFormat::F16 | WeightFormat::F32 | WeightFormat::Bf16, false) => EXPERT_TILE,
        (WeightFormat::F16 | WeightFormat::F32 | WeightFormat::Bf16, true) => LONG_GROUP_TILE,
    };
    let preferred: &[(CoopTile, WPath)] = &[(expert_tile, WPath::Single), (TILE_32X64, WPath::Single)];
    preferred.iter().copied().find(|&(t, _)| fits(t, p))
}

/// Whether `slots` slots over `p`'s groups are long groups: at least [`LONG_GROUP_MEAN_SLOTS`] a
/// group on average.
fn long_groups(p: &GroupedGemmParams, slots: u32) -> bool {
    u64::from(slots) >= u64::from(LONG_GROUP_MEAN_SLOTS) * u64::from(p.groups.max(1))
}

/// The native kernel's fragment shape for `p` over `slots` slots on experts stored as `format`,
/// where the device runs native kernels of `shapes`: short groups only (not [`long_groups`]: a
/// canvas's ~4 slots an expert at 64 tokens, ~16 at 256), a format the kernel reads, and the first
/// shape of `NativeShape::ALL` (slots on the narrow side first) the device runs that fits. Its m
/// tiles have [`native_grouped_gemm::SLOTS`] rows, the WGSL expert tiles' 32, so a layer's gate/up
/// and down share the dispatch's tile table whichever kernel each takes. Chosen for what the kernel
/// is built to do (weights streamed once, no workgroup barrier in the K loop), not yet timed against
/// [`choose`]'s tiles on an H100 or H200: `DG_NATIVE=0` runs those for the comparison.
pub fn native(shapes: NativeShapes, p: &GroupedGemmParams, format: WeightFormat, slots: u32) -> Option<NativeShape> {
    if long_groups(p, slots) {
        return None;
    }
    NativeShape::ALL.into_iter().filter(|&s| shapes.contains(s)).find(|&s| native_grouped_gemm::fits(s, format, p))
}

/// The int8 mode's fragment shape for `p` over `slots` slots on experts stored as `format`, where
/// the device runs the mode in `shapes` (none unless `Tuning::int8` asked for it): the native
/// kernel's short groups ([`native`]'s rule), a format the mode reads (Q8_0, Q4_K), and the first shape
/// of `Int8Shape::ALL` the device runs that fits. Its m tiles are the native kernel's.
pub fn int8(shapes: Int8Shapes, p: &GroupedGemmParams, format: WeightFormat, slots: u32) -> Option<Int8Shape> {
    if long_groups(p, slots) {
        return None;
    }
    Int8Shape::ALL.into_iter().filter(|&s| shapes.contains(s)).find(|&s| native_int8_gemm::fits(s, format, p))
}

/// How the experts' two-stage loops (the staged path: `TILE_64X128` by the lab's overrides) name their
/// stages for W stored as `format` (`coop_kloop::Stages`): constants for F16 (on an H200 a
/// 1024-token prefill's F16 experts took 6.33 ms over 6 layers against 7.35 with alternating
/// stages, the same bits), alternating for the quantized formats (not measured apart: the runs of
/// their prefill in that session had every kernel 1.4–3× slower than usual).
pub fn stages(format: WeightFormat) -> Stages {
    match format {
        WeightFormat::F16 => Stages::Constant,
        _ => Stages::Alternating,
    }
}

#[cfg(test)]
mod tests {
    use dg_kernels::format::QuantFormat;

    use super::*;

    #[test]
    fn the_real_experts_pick_their_measured_tiles() {
        let (gate_up, down) = GroupedGemmParams::real_experts();
        let f16 = WeightFormat::F16;
        // A canvas (256 tokens, top-8: 16 slots an expert) and a 1024-token chunk (64).
        let (canvas, chunk) = (256 * 8, 1024 * 8);
        assert_eq!(choose(&gate_up, f16, canvas), Some((GATHERED_EXPERT_TILE, WPath::Single)));
        assert_eq!(choose(&down, f16, canvas), Some((EXPERT_TILE, WPath::Single)));
        assert_eq!(choose(&gate_up, f16, chunk), Some((LONG_GROUP_TILE, WPath::Single)));
        assert_eq!(choose(&down, f16, chunk), Some((LONG_GROUP_TILE, WPath::Single)));
        let (q4, q5) = (WeightFormat::Quantized(QuantFormat::Q4_K), WeightFormat::Quantized(QuantFormat::Q5_0));
        assert_eq!(choose(&down, q5, canvas), Some((QUANTIZED_EXPERT_TILE, WPath::Single)));
        assert_eq!(choose(&down, q5, chunk), Some((QUANTIZED_LONG_GROUP_TILE, WPath::Single)));
        // Gate/up and down of one layer take tiles of the same rows (they share a tile table).
        for slots in [1, canvas, 48 * 128 - 1, 48 * 128, chunk, 4 * chunk] {
            let rows = |w, p| choose(p, w, slots).unwrap().0.bm;
            assert_eq!(rows(q4, &gate_up), rows(q5, &down), "{slots} slots");
            assert_eq!(rows(f16, &gate_up), rows(q5, &down), "{slots} slots");
            assert_eq!(rows(f16, &gate_up), rows(f16, &down), "{slots} slots");
        }
        let tiny = GroupedGemmParams { n: 64, k: 32, b_group_stride: 64 * 32, a_rs: 32, ..down };
        assert_eq!(choose(&tiny, f16, canvas), Some((TILE_32X64, WPath::Single)));
        assert_eq!(choose(&GroupedGemmParams { n: 48, ..tiny }, f16, canvas), None);
    }
}

//! The planner's choices for every matrix product of the real model (bench/configs/real-30layer.json:
//! hidden 2816, 16 q heads of 256 (sliding, 8 KV heads) or 512 (full, 2 KV heads), 128 experts
//! top-8 of width 704, dense MLP 2112, vocabulary 262144; canvas 256, context 1024, encoder chunks
//! of 1024 tokens) on an H200-like device and on a lavapipe-like one, held as golden values: a
//! change of any kernel, tile, path, split or grid shows here. Every kernel chosen is one of the
//! keys `KernelKey::all` enumerates (and naga validates), or of the native ones
//! `KernelKey::all_native` lists (SPIR-V that glslang validates). No device needed.

use dg_gpu::MatrixLayout;
use dg_gpu::Overrides;
use dg_gpu::ops::{attention_scores_params, attention_values_params};
use dg_gpu::parts::Parts;
use dg_gpu::planner::{ASSUMED_MULTIPROCESSORS, BSource, Capabilities, Dense, Grouped, Planner};
use dg_gpu::tuning::{KvCacheChoice, Tuning};

/// The default tuning with the lab's `overrides`.
fn lab(overrides: Overrides) -> Tuning {
    Tuning { overrides, ..Tuning::default() }
}
use std::collections::HashSet;
use std::sync::OnceLock;

use dg_kernels::coop_gemm::{self, AFormat, WPath};
use dg_kernels::coop_grouped_gemm;
use dg_kernels::format::QuantFormat;
use dg_kernels::gemm::{self, GemmParams};
use dg_kernels::grouped_gemm::{self, GroupedGemmParams};
use dg_kernels::native_grouped_gemm::{self, NativeShape, NativeShapes};
use dg_kernels::native_int8_gemm::{Int8Shape, Int8Shapes};
use dg_kernels::{KernelKey, WeightFormat};

/// An H200 as wgpu reports it: cooperative matrices (16×8×16 and 16×16×16 fragments, subgroups of
/// 32, SPIR-V passthrough: the native kernels), 48 KiB of workgroup memory, 4 GiB bindings; its
/// 132 multiprocessors.
const H200: Capabilities = Capabilities::H200;
/// Lavapipe: no cooperative matrices, 32 KiB of workgroup memory, 128 MiB bindings (the
/// multiprocessors as `Capabilities::of` assumes them).
const LAVAPIPE: Capabilities = Capabilities {
    coop_matrix: false,
    coop_fragment: dg_kernels::coop_gemm::FRAGMENT,
    native: NativeShapes::NONE,
    int8: Int8Shapes::NONE,
    shader_f16: true,
    max_workgroup_storage: 32 * 1024,
    max_binding: 128 << 20,
    multiprocessors: ASSUMED_MULTIPROCESSORS,
};

const H: u32 = 2816;
const HEADS: u32 = 16;
const EXPERTS: u32 = 128;
const TOP_K: u32 = 8;
const EXPERT_WIDTH: u32 = 704;
const INTER: u32 = 2112;
const VOCAB: u32 = 262144;
const CANVAS: u32 = 256;
const CONTEXT: u32 = 1024;
const CHUNK: u32 = 1024;
/// The arena's split-K scratch in f32 elements: `SPLIT_PARTIALS · C · max(H, q width, 2·kv width,
/// 2·I)` with q's width 16·512 (`arena.rs`).
const SPLIT_SCRATCH: u64 = 8 * CANVAS as u64 * 8192;

/// One attention geometry: head dim, KV heads, whether V has its own projection.
struct Attention {
    name: &'static str,
    d: u32,
    kv: u32,
    has_v: bool,
}

const SLIDING: Attention = Attention { name: "sliding", d: 256, kv: 8, has_v: true };
const FULL: Attention = Attention { name: "full", d: 512, kv: 2, has_v: false };

thread_local! {
    /// Every key [`known`] saw on this thread since [`planned_keys`] last cleared it.
    static PLANNED: std::cell::RefCell<HashSet<KernelKey>> = std::cell::RefCell::new(HashSet::new());
}

/// `key`, after checking that it is one of [`KernelKey::all`] or [`KernelKey::all_native`];
/// remembered for [`planned_keys`].
fn known(key: KernelKey) -> KernelKey {
    static ALL: OnceLock<HashSet<KernelKey>> = OnceLock::new();
    let all = ALL.get_or_init(|| KernelKey::all().into_iter().chain(KernelKey::all_native()).collect());
    assert!(all.contains(&key), "the planner chose {key:?}, which is not a key");
    PLANNED.with(|keys| keys.borrow_mut().insert(key));
    key
}

/// The golden plan of `caps` (its lines) and every kernel key in it.
fn planned_keys(caps: Capabilities) -> (Vec<String>, HashSet<KernelKey>) {
    PLANNED.with(|keys| keys.borrow_mut().clear());
    let lines = choices(caps);
    (lines, PLANNED.with(|keys| keys.take()))
}

fn describe_dense(
    planner: &Planner<'_>,
    format: WeightFormat,
    layout: impl Into<BSource> + Copy,
    p: &GemmParams,
    tensor_cores: bool,
    scratch: Option<u64>,
) -> String {
    match planner.dense(format, layout, p, tensor_cores, scratch) {
        Err(e) => format!("error: {e}"),
        Ok(Dense::TensorCores(plan)) => {
            let k = plan.kernel;
            known(KernelKey::CoopGemm(k));
            let splits = plan.split.map_or(1, |s| s.splits);
            let grid = coop_gemm::workgroups_split(k.tile, p.m, p.n, p.batch, splits);
            let split = plan.split.map_or("whole".to_string(), |s| format!("split {}x{}", s.splits, s.steps));
            format!("coop_gemm {} {:?} {:?} {format:?} {split} grid {grid:?}", k.tile.label(), k.layout, k.path)
        }
        Ok(Dense::BodyAndTail { n_body }) => {
            let body = GemmParams { n: n_body, ..*p };
            let tail = GemmParams { n: p.n - n_body, ..*p };
            format!(
                "body [{}] + tail [{}]",
                describe_dense(planner, format, layout, &body, true, scratch),
                describe_dense(planner, format, layout, &tail, false, scratch)
            )
        }
        Ok(Dense::Portable { tile }) => {
            known(KernelKey::Gemm { tile, w: format });
            format!("gemm {} {format:?} grid {:?}", tile.label(), gemm::workgroups(tile, p.m, p.n, p.batch))
        }
    }
}

fn describe_grouped(planner: &Planner<'_>, format: WeightFormat, layout: MatrixLayout, p: &GroupedGemmParams, slots: u32) -> String {
    match planner.grouped(format, layout, p, slots) {
        Err(e) => format!("error: {e}"),
        Ok(Grouped::TensorCores { tile, path }) => {
            for a in [AFormat::F32, AFormat::F16] {
                known(KernelKey::CoopGroupedGemm { tile, path, w: format, a });
            }
            let q = coop_grouped_gemm::params_for(tile, p);
            format!("coop_grouped_gemm {} {path:?} grid {:?}", tile.label(), coop_grouped_gemm::workgroups(tile, &q))
        }
        Ok(Grouped::Native { shape }) => {
            for a in [AFormat::F32, AFormat::F16] {
                known(KernelKey::NativeGroupedGemm { shape, w: format, a });
            }
            let q = native_grouped_gemm::params_for(p);
            format!("native_grouped_gemm {} grid {:?}", shape.label(), native_grouped_gemm::workgroups(shape, &q))
        }
        Ok(Grouped::NativeInt8 { shape }) => {
            for a in [AFormat::F32, AFormat::F16] {
                known(KernelKey::NativeInt8GroupedGemm { shape, w: format, a });
            }
            let q = native_grouped_gemm::params_for(p);
            format!("native_int8_gemm {} grid {:?}", shape.label(), dg_kernels::native_int8_gemm::workgroups(shape, &q))
        }
        Ok(Grouped::Portable { tile }) => {
            for w in [WeightFormat::F32, WeightFormat::Bf16, WeightFormat::F16] {
                known(KernelKey::GroupedGemm { tile, w });
            }
            format!("grouped_gemm {} grid {:?}", tile.label(), grouped_gemm::workgroups(tile, p.n, p.max_rows, p.groups))
        }
    }
}

/// Every product of one pass of `rows` rows over `s` keys starting at cache row `key_start`.
fn layer_products(
    planner: &Planner<'_>,
    format: WeightFormat,
    att: &Attention,
    rows: u32,
    (s, key_start): (u32, u32),
    out: &mut Vec<String>,
) {
    let f16 = format == WeightFormat::F16;
    let scratch = Some(SPLIT_SCRATCH);
    // The cache attention reads, as the arena stores it in this mode on this device.
    let real =
        dg_model::ModelConfig::from_file(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/configs/real-30layer.json"))
            .unwrap();
    let cache = dg_gpu::cache_format_for(planner.attention_on_tensor_cores(&real, f16), planner.caps.shader_f16, KvCacheChoice::Auto);
    let (d, kv) = (att.d, att.kv);
    let group = HEADS / kv;
    let row = kv * d;
    let halves = if att.has_v { 2 } else { 1 };
    let qkv_layout = planner.projection_layout(format, row as usize, H as usize, f16);
    let blocks = |count: u32, first: u32| GemmParams {
        batch: count,
        a_batch: 0,
        b_offset: first * row * H,
        b_batch: row * H,
        c_batch: rows * row,
        ..GemmParams::linear(rows, row, H)
    };
    let name = |what: &str| format!("{} rows {rows} {}: {what}", att.name, format!("{format:?}").to_lowercase());
    let merged = planner.merge_qkv(format, qkv_layout, &blocks(group, 0), &blocks(halves, group), scratch);
    out.push(format!("{} = {merged} ({qkv_layout:?})", name("merge qkv")));
    for (what, p) in [("qkv merged", blocks(group + halves, 0)), ("q", blocks(group, 0)), ("kv", blocks(halves, group))] {
        out.push(format!("{} -> {}", name(what), describe_dense(planner, format, qkv_layout, &p, f16, scratch)));
    }
    let scores = GemmParams {
        b_offset: key_start * row,
        ..attention_scores_params(rows as usize, s as usize, d as usize, HEADS as usize, kv as usize)
    };
    out.push(format!("{} -> {}", name("scores"), describe_dense(planner, cache, BSource::KvCache, &scores, f16, scratch)));
    let values = GemmParams {
        b_offset: key_start * row,
        ..attention_values_params(rows as usize, s as usize, d as usize, HEADS as usize, kv as usize)
    };
    out.push(format!("{} -> {}", name("values"), describe_dense(planner, cache, BSource::KvCache, &values, f16, scratch)));
    let linear = |what: &str, n: u32, k: u32, a_offset: u32| {
        let layout = planner.projection_layout(format, n as usize, k as usize, f16);
        let p = GemmParams { a_offset, ..GemmParams::linear(rows, n, k) };
        format!("{} -> {}", name(what), describe_dense(planner, format, layout, &p, f16, scratch))
    };
    out.push(linear("o", H, HEADS * d, 0));
    out.push(linear("router", EXPERTS, H, rows * H));
    out.push(linear("mlp gate/up", 2 * INTER, H, 0));
    out.push(linear("mlp down", H, INTER, 0));
    let slots = rows * TOP_K;
    let gate_up_layout = planner.experts_layout(format, (2 * EXPERT_WIDTH) as usize, H as usize, f16);
    let down_layout = planner.experts_layout(format, H as usize, EXPERT_WIDTH as usize, f16);
    let grouped = |n: u32, k: u32, gather: bool, tile_rows: u32| GroupedGemmParams {
        n,
        k,
        groups: EXPERTS,
        max_rows: rows,
        a_rs: k,
        b_group_stride: n * k,
        c_rs: n,
        gather: u32::from(gather),
        tiles: if tile_rows == 0 { 0 } else { coop_grouped_gemm::table_len(slots, EXPERTS, tile_rows) },
        tile_rows,
        first_group: 0,
        _pad: 0,
    };
    let tile_rows = planner.expert_tile_rows(format, gate_up_layout, slots, &grouped(2 * EXPERT_WIDTH, H, true, 0));
    let halves_in = planner.half_expert_activations(gate_up_layout);
    out.push(format!("{} = {tile_rows}, f16 activations {halves_in}", name("expert tile rows")));
    out.push(format!(
        "{} -> {}",
        name("experts gate/up"),
        describe_grouped(planner, format, gate_up_layout, &grouped(2 * EXPERT_WIDTH, H, true, tile_rows), slots)
    ));
    out.push(format!(
        "{} -> {}",
        name("experts down"),
        describe_grouped(planner, format, down_layout, &grouped(H, EXPERT_WIDTH, false, tile_rows), slots)
    ));
    // Quantized experts (the q8_0 and q4_k_m modes keep the F16 mode's other choices).
    if f16 {
        for q in [QuantFormat::Q8_0, QuantFormat::Q5_0, QuantFormat::Q4_K] {
            let w = WeightFormat::Quantized(q);
            let tile_rows = planner.expert_tile_rows(w, gate_up_layout, slots, &grouped(2 * EXPERT_WIDTH, H, true, 0));
            let gate_up = describe_grouped(planner, w, gate_up_layout, &grouped(2 * EXPERT_WIDTH, H, true, tile_rows), slots);
            let down = describe_grouped(planner, w, down_layout, &grouped(H, EXPERT_WIDTH, false, tile_rows), slots);
            out.push(format!("{} {q:?} -> {gate_up}; down -> {down}", name("experts gate/up")));
        }
    }
}

/// The products outside the layers: the tied head's chunks and self-conditioning's.
fn shared_products(planner: &Planner<'_>, format: WeightFormat, out: &mut Vec<String>) {
    let f16 = format == WeightFormat::F16;
    let embed_format = if f16 { WeightFormat::Bf16 } else { format };
    let row_bytes = (embed_format.bytes() * H as usize) as u64;
    let parts =
        Parts::rows("embed", VOCAB as usize, row_bytes, VOCAB as usize, planner.caps.coop_matrix, planner.caps.max_binding).unwrap();
    let tag = format!("{format:?}").to_lowercase();
    for range in parts.ranges() {
        let (start, rows) = (range.start as u32, range.len() as u32);
        let head = GemmParams { c_offset: start, c_rs: VOCAB, epilogue: 1, cap: 30.0, ..GemmParams::linear(CANVAS, rows, H) };
        let tc = f16 && embed_format != WeightFormat::F32;
        out.push(format!(
            "head {tag} chunk {start}+{rows} -> {}",
            describe_dense(planner, embed_format, MatrixLayout::RowMajor, &head, tc, None)
        ));
        let soft = GemmParams {
            a_offset: start,
            a_rs: VOCAB,
            b_rs: H,
            b_cs: 1,
            accumulate: u32::from(start > 0),
            ..GemmParams::linear(CANVAS, H, rows)
        };
        out.push(format!(
            "soft embedding {tag} chunk {start}+{rows} -> {}",
            describe_dense(planner, embed_format, MatrixLayout::RowMajor, &soft, f16, Some(SPLIT_SCRATCH))
        ));
    }
}

fn choices(caps: Capabilities) -> Vec<String> {
    let tuning = Tuning::default();
    let planner = Planner::new(caps, &tuning);
    let mut out = Vec::new();
    for format in [WeightFormat::F16, WeightFormat::Bf16, WeightFormat::F32] {
        for att in [&SLIDING, &FULL] {
            // Decoder: the canvas over the visible context, padded to `KEY_PAD` as the forward
            // pads it, and itself (a sliding layer sees 1023 cached keys); encoder: a chunk of
            // 1024 tokens from the start.
            let visible = if att.has_v { CONTEXT - 1 } else { CONTEXT };
            let keys = visible.next_multiple_of(dg_gpu::shapes::KEY_PAD as u32) + CANVAS;
            layer_products(&planner, format, att, CANVAS, (keys, 0), &mut out);
            layer_products(&planner, format, att, CHUNK, (CHUNK, 0), &mut out);
        }
        shared_products(&planner, format, &mut out);
    }
    out
}

fn check(name: &str, caps: Capabilities, golden: &str) {
    let actual = choices(caps).join("\n");
    if actual.trim() != golden.trim() {
        let (a, g): (Vec<&str>, Vec<&str>) = (actual.lines().collect(), golden.trim().lines().collect());
        let first = a.iter().zip(&g).position(|(x, y)| x != y).unwrap_or(a.len().min(g.len()));
        panic!(
            "{name}: the planner's choices changed at line {first}:\n  now:    {:?}\n  golden: {:?}\nall of them now:\n{actual}",
            a.get(first),
            g.get(first)
        );
    }
}

#[test]
fn h200_choices_are_unchanged() {
    check("H200", H200, H200_GOLDEN);
}

#[test]
fn lavapipe_choices_are_unchanged() {
    check("lavapipe", LAVAPIPE, LAVAPIPE_GOLDEN);
}

#[test]
fn every_adapter_class_plans_as_its_golden_plan_says() {
    for class in ADAPTER_CLASSES {
        check(class.name, class.caps, class.golden);
    }
}

/// The shapes `dg-parity`'s `tests/tensor_cores.rs` runs through the Recorder take these tiles on
/// the H200 (the kernel tests check that the Recorder runs the device's planner's choice, on any
/// device; these are that choice on the H200): q_proj, K/V and a 1000-row chunk on 128 × 128 at
/// depth 3, a 77-row chunk on 64 × 64, every one of them and the router's shape in split K.
#[test]
fn kernel_tests_shapes_take_the_h200s_tiles() {
    let tuning = Tuning::default();
    let planner = Planner::new(H200, &tuning);
    let kv =
        |m: u32, n: u32, k: u32| GemmParams { batch: 2, a_batch: 0, b_batch: n * k, c_batch: m * n + 8, ..GemmParams::linear(m, n, k) };
    let scratch = (16 << 20) / 4;
    for (p, tile, splits) in [
        (GemmParams::linear(256, 4096, 2816), "128x128x32_32x64_v4_d3", true),
        (kv(256, 256, 512), "128x128x32_32x64_v4_d3", true),
        (GemmParams::linear(256, 128, 2816), "", true),
        (GemmParams::linear(77, 256, 512), "64x64x32_32x32_v4", true),
        (kv(1000, 128, 256), "128x128x32_32x64_v4_d3", true),
    ] {
        match planner.dense(WeightFormat::F16, MatrixLayout::KPanels, &p, true, Some(scratch)) {
            Ok(Dense::TensorCores(plan)) => {
                let label = plan.kernel.tile.label();
                assert!(label.starts_with(tile), "m {} n {} k {}: tile {label}, not {tile}", p.m, p.n, p.k);
                assert_eq!(plan.split.is_some(), splits, "m {} n {} k {}: split {:?}", p.m, p.n, p.k, plan.split);
            }
            other => panic!("m {} n {} k {}: {other:?}", p.m, p.n, p.k),
        }
    }
    // BF16 rows (the head's and the soft embedding's embedding), with 64 MiB of scratch.
    let head = GemmParams { c_rs: 32768 + 64, c_offset: 32, ..GemmParams::linear(256, 32768, 64) };
    let soft = GemmParams { a_offset: 32, a_rs: 16384 + 64, b_rs: 256, b_cs: 1, ..GemmParams::new(128, 256, 16384) };
    for (p, tile, splits) in [(head, "128x128x32_32x64_v4_d3", false), (soft, "", true)] {
        match planner.dense(WeightFormat::Bf16, MatrixLayout::RowMajor, &p, true, Some((64 << 20) / 4)) {
            Ok(Dense::TensorCores(plan)) => {
                let label = plan.kernel.tile.label();
                assert!(label.starts_with(tile), "m {} n {} k {}: tile {label}, not {tile}", p.m, p.n, p.k);
                assert_eq!(plan.split.is_some(), splits, "m {} n {} k {}: split {:?}", p.m, p.n, p.k, plan.split);
            }
            other => panic!("m {} n {} k {}: {other:?}", p.m, p.n, p.k),
        }
    }
}

/// A device whose cooperative matrices are 8×8×8 (lavapipe's) gets the H200's choices with every
/// tensor-core tile in fragments of 8: the fragment changes how a subgroup multiplies, never which
/// tile, path or split runs a product; every such kernel is a key (`known`, in `choices`).
#[test]
fn small_fragments_change_nothing_but_the_fragment() {
    let sixteen = choices(H200);
    let eight = choices(Capabilities { coop_fragment: 8, ..H200 });
    let mut relabelled = 0;
    let in_eights = |line: &String| {
        let mut words: Vec<String> = line.split(' ').map(str::to_string).collect();
        for i in 1..words.len() {
            if words[i - 1].ends_with("coop_gemm") || words[i - 1].ends_with("coop_grouped_gemm") {
                words[i] += "_f8";
                relabelled += 1;
            }
        }
        words.join(" ")
    };
    let want: Vec<String> = sixteen.iter().map(in_eights).collect();
    assert!(relabelled >= 50, "only {relabelled} tensor-core choices");
    for (got, want) in eight.iter().zip(&want) {
        assert_eq!(got, want);
    }
    assert_eq!(eight.len(), want.len());
}

/// Attention's rules (a tensor-core body and a portable tail on ragged columns, its own tile where
/// the large one would split) are the cache's, f32 or f16, and never a weight's: an F16 weight
/// left row-major (a small model's shape no panel takes) with the same ragged product stays
/// whole on the portable GEMM, as before the cache could be f16.
#[test]
fn only_the_cache_takes_attentions_rules() {
    let tuning = Tuning::default();
    let h200 = Planner::new(H200, &tuning);
    let ragged = GemmParams { b_rs: 1, b_cs: 256, ..GemmParams::new(CANVAS, 1023, 256) };
    for format in [WeightFormat::F32, WeightFormat::F16] {
        let cache = h200.dense(format, BSource::KvCache, &ragged, true, Some(SPLIT_SCRATCH));
        assert!(matches!(cache, Ok(Dense::BodyAndTail { n_body: 992 })), "{format:?} cache: {cache:?}");
        let weight = h200.dense(format, MatrixLayout::RowMajor, &ragged, true, Some(SPLIT_SCRATCH));
        assert!(matches!(weight, Ok(Dense::Portable { .. })), "{format:?} row-major weight: {weight:?}");
    }
}

#[test]
fn tuning_reaches_the_choices() {
    let tuning = lab(Overrides { qkv: dg_gpu::overrides::QkvChoice::Separate, ..Overrides::default() });
    let planner = Planner::new(H200, &tuning);
    let p = GemmParams::linear(CANVAS, 2048, H);
    assert!(!planner.merge_qkv(WeightFormat::F16, MatrixLayout::KPanels, &p, &p, Some(SPLIT_SCRATCH)));
    let tuning = lab(Overrides { coop_tile: Some(coop_gemm::TILE_64X64), ..Overrides::default() });
    let planner = Planner::new(H200, &tuning);
    match planner.dense(WeightFormat::F16, MatrixLayout::KPanels, &GemmParams::linear(CANVAS, H, INTER), true, None) {
        Ok(Dense::TensorCores(plan)) => assert_eq!(plan.kernel.tile, coop_gemm::TILE_64X64),
        other => panic!("{other:?}"),
    }
    // `DG_ATTENTION_TILE` takes attention's products (B the cache) and only them.
    let tuning = lab(Overrides { attention_tile: Some(coop_gemm::TILE_128X64), ..Overrides::default() });
    let planner = Planner::new(H200, &tuning);
    let scores = dg_gpu::ops::attention_scores_params(CANVAS as usize, 1280, 256, 16, 8);
    match planner.dense(WeightFormat::F16, BSource::KvCache, &scores, true, Some(SPLIT_SCRATCH)) {
        Ok(Dense::TensorCores(plan)) => assert_eq!(plan.kernel.tile, coop_gemm::TILE_128X64),
        other => panic!("{other:?}"),
    }
    match planner.dense(WeightFormat::F16, MatrixLayout::KPanels, &GemmParams::linear(CANVAS, H, INTER), true, None) {
        Ok(Dense::TensorCores(plan)) => assert_ne!(plan.kernel.tile, coop_gemm::TILE_128X64),
        other => panic!("{other:?}"),
    }
    // `DG_COOP_STAGES` names the stages of every two-stage loop, the single stage's excepted.
    for stages in coop_gemm::Stages::ALL {
        let tuning = lab(Overrides { coop_stages: Some(stages), ..Overrides::default() });
        let planner = Planner::new(H200, &tuning);
        match planner.dense(WeightFormat::F16, MatrixLayout::KPanels, &GemmParams::linear(CANVAS, H, INTER), true, None) {
            Ok(Dense::TensorCores(plan)) => assert_eq!(plan.kernel.tile.stages, stages),
            other => panic!("{other:?}"),
        }
        let tuning = lab(Overrides { coop_stages: Some(stages), coop_path: WPath::Single, ..Overrides::default() });
        match Planner::new(H200, &tuning).dense(WeightFormat::F16, MatrixLayout::KPanels, &GemmParams::linear(CANVAS, H, INTER), true, None)
        {
            Ok(Dense::TensorCores(plan)) => assert_eq!(plan.kernel.tile.stages, coop_gemm::Stages::Alternating),
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn a_lab_tile_is_taken_only_by_the_paths_it_runs_by() {
    // The experts' gate/up in the decoder: K 2816 is whole steps of 64.
    let p = GroupedGemmParams {
        n: 2 * EXPERT_WIDTH,
        k: H,
        groups: EXPERTS,
        max_rows: CANVAS,
        a_rs: H,
        b_group_stride: 2 * EXPERT_WIDTH * H,
        c_rs: 2 * EXPERT_WIDTH,
        gather: 1,
        ..bytemuck::Zeroable::zeroed()
    };
    // A K-64 tile as the lab names it (dg-lab's `TILE_32X128_K64`).
    let k64 = dg_kernels::coop_gemm::CoopTile { bk: 64, ..coop_grouped_gemm::TILE_32X128 };
    let named = vec![k64];
    for (path, taken) in [(None, true), (Some(WPath::Single), true), (Some(WPath::Staged), false), (Some(WPath::Direct), false)] {
        let tuning = lab(Overrides { coop_grouped_tiles: named.clone(), coop_grouped_path: path, ..Overrides::default() });
        match Planner::new(H200, &tuning).grouped(WeightFormat::F16, MatrixLayout::KPanels, &p, CANVAS * TOP_K) {
            Ok(Grouped::TensorCores { tile, .. }) => assert_eq!(tile.bk == 64, taken, "{path:?}: {}", tile.label()),
            other => panic!("{path:?}: {other:?}"),
        }
    }
    // K 736 is no whole number of 64-wide steps: the tile does not fit.
    let down = GroupedGemmParams { n: H, k: 704 + 32, a_rs: 736, b_group_stride: H * 736, c_rs: H, gather: 0, ..p };
    let tuning = lab(Overrides { coop_grouped_tiles: named, ..Overrides::default() });
    match Planner::new(H200, &tuning).grouped(WeightFormat::F16, MatrixLayout::KPanels, &down, CANVAS * TOP_K) {
        Ok(Grouped::TensorCores { tile, .. }) => assert_eq!(tile.bk, 32, "{}", tile.label()),
        other => panic!("{other:?}"),
    }
}

#[test]
fn every_w_path_the_tuning_sets_gives_a_kernel_that_exists() {
    // q_proj (F16 K panels), the value product (f32 `[k][n]` cache) and a BF16 projection: the
    // paths a kernel does not take (direct from `[k][n]`, direct or single-stage BF16 / f32 W)
    // fall back to staged.
    let products = [
        (WeightFormat::F16, MatrixLayout::KPanels.into(), GemmParams::linear(CANVAS, 4096, H)),
        (WeightFormat::F32, BSource::KvCache, GemmParams { b_rs: 256, b_cs: 1, ..GemmParams::new(CANVAS, 256, CONTEXT) }),
        (WeightFormat::Bf16, MatrixLayout::RowMajor.into(), GemmParams::linear(CANVAS, 4096, H)),
    ];
    for path in [WPath::Staged, WPath::Direct, WPath::Single] {
        let tuning = lab(Overrides { coop_path: path, ..Overrides::default() });
        for (format, layout, p) in &products {
            match Planner::new(H200, &tuning).dense(*format, *layout, p, true, Some(SPLIT_SCRATCH)) {
                Ok(Dense::TensorCores(plan)) => {
                    known(KernelKey::CoopGemm(plan.kernel));
                    let kept = format == &WeightFormat::F16 || path == WPath::Staged;
                    assert_eq!(plan.kernel.path == path, kept, "{path:?} for {format:?}: {:?}", plan.kernel);
                }
                other => panic!("{path:?} {format:?}: {other:?}"),
            }
        }
    }
}

#[test]
fn the_multiprocessors_set_the_large_tiles_split() {
    // q_proj's product: 64 tiles of 128×128, split towards one workgroup per multiprocessor.
    let tuning = Tuning::default();
    let q = GemmParams::linear(CANVAS, 4096, H);
    let splits = |multiprocessors: u32| match Planner::new(Capabilities { multiprocessors, ..H200 }, &tuning).dense(
        WeightFormat::F16,
        MatrixLayout::KPanels,
        &q,
        true,
        Some(SPLIT_SCRATCH),
    ) {
        Ok(Dense::TensorCores(plan)) => plan.split.map_or(1, |s| s.splits),
        other => panic!("{other:?}"),
    };
    assert_eq!((splits(132), splits(264), splits(64)), (2, 4, 1));
}

/// Today's choices, one product a line (`tests/planner_golden/`).
const H200_GOLDEN: &str = include_str!("planner_golden/h200.txt");
const LAVAPIPE_GOLDEN: &str = include_str!("planner_golden/lavapipe.txt");

/// A shading language a backend translates WGSL into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Language {
    /// Vulkan.
    SpirV,
    /// Metal.
    Msl,
    /// DX12.
    Hlsl,
}

/// A class of adapter users have: what wgpu reports for it (the planner's [`Capabilities`]), the
/// languages its kernels are translated to, the invocations a workgroup may have, and its golden
/// plan. H200 (NVIDIA on Vulkan) and lavapipe are the adapters dg runs on; the others are what
/// wgpu 30's backends report for them (`wgpu-hal`'s adapters), checked here where we have no such
/// GPU.
struct AdapterClass {
    name: &'static str,
    caps: Capabilities,
    languages: &'static [Language],
    max_invocations: u32,
    golden: &'static str,
}

const ADAPTER_CLASSES: &[AdapterClass] = &[
    AdapterClass { name: "NVIDIA, Vulkan", caps: H200, languages: &[Language::SpirV], max_invocations: 1024, golden: H200_GOLDEN },
    AdapterClass {
        name: "AMD RDNA, Vulkan",
        // Cooperative matrices 16×16×16 are offered, but the subgroups run 32 or 64 wide
        // (`subgroup_min_size` 32, `subgroup_max_size` 64), so `GpuContext` leaves the tensor
        // cores off (dg's tiles need one fixed subgroup size dividing 32); 64 KiB of workgroup
        // memory, 4 GiB bindings.
        caps: Capabilities {
            coop_matrix: false,
            coop_fragment: dg_kernels::coop_gemm::FRAGMENT,
            native: NativeShapes::NONE,
            int8: Int8Shapes::NONE,
            shader_f16: true,
            max_workgroup_storage: 64 * 1024,
            max_binding: u32::MAX as u64,
            multiprocessors: ASSUMED_MULTIPROCESSORS,
        },
        languages: &[Language::SpirV],
        max_invocations: 1024,
        golden: include_str!("planner_golden/amd-vulkan.txt"),
    },
    AdapterClass { name: "lavapipe", caps: LAVAPIPE, languages: &[Language::SpirV], max_invocations: 256, golden: LAVAPIPE_GOLDEN },
    AdapterClass {
        name: "Apple silicon, Metal",
        // simdgroup matrices of 8×8×8 (f16 × f16 → f32) behind EXPERIMENTAL_COOPERATIVE_MATRIX,
        // SIMD groups of 32, 32 KiB of threadgroup memory, bindings up to the device's
        // maxBufferLength (4 GiB here: the real model's largest tensor fits one either way).
        caps: Capabilities {
            coop_matrix: true,
            coop_fragment: 8,
            native: NativeShapes::NONE,
            int8: Int8Shapes::NONE,
            shader_f16: true,
            max_workgroup_storage: 32 * 1024,
            max_binding: 4 << 30,
            multiprocessors: ASSUMED_MULTIPROCESSORS,
        },
        languages: &[Language::Msl],
        max_invocations: 1024,
        golden: include_str!("planner_golden/metal.txt"),
    },
    AdapterClass {
        name: "DX12",
        // No cooperative matrices on wgpu's DX12 backend; 32 KiB of groupshared memory, bindings
        // of 2 GiB − 1 (`auxil::MAX_I32_BINDING_SIZE`).
        caps: Capabilities {
            coop_matrix: false,
            coop_fragment: dg_kernels::coop_gemm::FRAGMENT,
            native: NativeShapes::NONE,
            int8: Int8Shapes::NONE,
            shader_f16: true,
            max_workgroup_storage: 32 * 1024,
            max_binding: (1 << 31) - 1,
            multiprocessors: ASSUMED_MULTIPROCESSORS,
        },
        languages: &[Language::Hlsl],
        max_invocations: 1024,
        golden: include_str!("planner_golden/dx12.txt"),
    },
    AdapterClass {
        name: "WebGPU, default limits",
        // `wgpu::Limits::default()`: 16 KiB of workgroup memory, 128 MiB bindings, 256
        // invocations a workgroup, no optional features (no f16, no cooperative matrices). A
        // browser translates WGSL to any of the three.
        caps: Capabilities {
            coop_matrix: false,
            coop_fragment: dg_kernels::coop_gemm::FRAGMENT,
            native: NativeShapes::NONE,
            int8: Int8Shapes::NONE,
            shader_f16: false,
            max_workgroup_storage: 16 * 1024,
            max_binding: 128 << 20,
            multiprocessors: ASSUMED_MULTIPROCESSORS,
        },
        languages: &[Language::SpirV, Language::Msl, Language::Hlsl],
        max_invocations: 256,
        golden: include_str!("planner_golden/webgpu.txt"),
    },
];

/// Bytes of workgroup memory `module` declares.
fn workgroup_bytes(module: &naga::Module) -> u32 {
    let mut layouter = naga::proc::Layouter::default();
    layouter.update(module.to_ctx()).unwrap();
    module.global_variables.iter().filter(|(_, g)| g.space == naga::AddressSpace::WorkGroup).map(|(_, g)| layouter[g.ty].size).sum()
}

/// `key`'s kernel in `language`, or why naga could not write it.
fn translate(key: KernelKey, language: Language) -> Result<(naga::Module, String), String> {
    let source = key.source();
    let module = naga::front::wgsl::parse_str(&source.wgsl).map_err(|e| e.emit_to_string(&source.wgsl))?;
    let info = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all())
        .validate(&module)
        .map_err(|e| format!("{e:?}"))?;
    let text = match language {
        Language::SpirV => {
            let words =
                naga::back::spv::write_vec(&module, &info, &naga::back::spv::Options::default(), None).map_err(|e| e.to_string())?;
            format!("{} SPIR-V words", words.len())
        }
        Language::Msl => {
            let pipeline = naga::back::msl::PipelineOptions::default();
            let options = naga::back::msl::Options { lang_version: (3, 0), ..Default::default() };
            naga::back::msl::write_string(&module, &info, &options, &pipeline).map_err(|e| e.to_string())?.0
        }
        Language::Hlsl => {
            let options = naga::back::hlsl::Options { shader_model: naga::back::hlsl::ShaderModel::V6_2, ..Default::default() };
            let mut text = String::new();
            naga::back::hlsl::Writer::new(&mut text, &options, &Default::default())
                .write(&module, &info, None)
                .map_err(|e| e.to_string())?;
            text
        }
    };
    Ok((module, text))
}

/// Whether a kernel key reads its weights in a format.
type KeyReads = fn(&KernelKey, WeightFormat) -> bool;

/// Every ggml type's products (the first key of each product kernel reading it) translate with
/// naga to SPIR-V, MSL and HLSL (the tensor-core ones to SPIR-V and MSL, the languages of the
/// classes that have cooperative matrices), whether or not a golden plan holds the type: the IQ
/// types' grids are module-scope constant arrays indexed at run time, which each backend must
/// write.
#[test]
fn every_quantized_type_translates_to_every_language() {
    let all = KernelKey::all();
    let mut failures = Vec::new();
    for q in QuantFormat::ALL {
        let w = WeightFormat::Quantized(q);
        let picks: [(&str, KeyReads); 4] = [
            ("gemm", |k, w| matches!(k, KernelKey::Gemm { w: x, .. } if *x == w)),
            ("grouped gemm", |k, w| matches!(k, KernelKey::GroupedGemm { w: x, .. } if *x == w)),
            ("coop gemm", |k, w| matches!(k, KernelKey::CoopGemm(c) if c.w == w)),
            ("coop grouped gemm", |k, w| matches!(k, KernelKey::CoopGroupedGemm { w: x, .. } if *x == w)),
        ];
        for (what, pick) in picks {
            let key = *all.iter().find(|k| pick(k, w)).unwrap_or_else(|| panic!("no {what} key reads {q:?}"));
            let languages: &[Language] = match key.needs_cooperative_matrices() {
                true => &[Language::SpirV, Language::Msl],
                false => &[Language::SpirV, Language::Msl, Language::Hlsl],
            };
            for &language in languages {
                if let Err(e) = translate(key, language) {
                    failures.push(format!("{q:?} {what} to {language:?}: {e}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} problems:\n{}", failures.len(), failures.join("\n"));
}

/// Every kernel of every adapter class's golden plan translates to that class's shading
/// languages with naga, fits its workgroup memory and invocation limits, and needs no feature it
/// lacks (cooperative matrices, f16): "any GPU", checked where we have no such GPU.
#[test]
fn every_planned_kernel_translates_to_its_adapter_classs_language() {
    let mut failures = Vec::new();
    for class in ADAPTER_CLASSES {
        let (_, keys) = planned_keys(class.caps);
        let mut keys: Vec<KernelKey> = keys.into_iter().collect();
        keys.sort_by_key(|k| format!("{k:?}"));
        for key in keys {
            // A native kernel is SPIR-V (validated by glslang as it is compiled, gated on a device
            // by dg-parity's native_kernels.rs): only for classes that take SPIR-V.
            if let Some(native) = key.native() {
                if !class.languages.contains(&Language::SpirV) || class.caps.native.is_empty() {
                    failures.push(format!("{}: the native {} on a class without native kernels", class.name, native.name));
                }
                continue;
            }
            let name = key.source().name;
            if key.needs_cooperative_matrices() && !class.caps.coop_matrix {
                failures.push(format!("{}: {name} needs cooperative matrices", class.name));
            }
            if !class.caps.shader_f16 && key.source().wgsl.contains("enable f16") {
                failures.push(format!("{}: {name} needs f16", class.name));
            }
            for &language in class.languages {
                match translate(key, language) {
                    Err(e) => failures.push(format!("{}: {name} to {language:?}: {e}", class.name)),
                    Ok((module, _)) => {
                        let bytes = workgroup_bytes(&module);
                        if bytes > class.caps.max_workgroup_storage {
                            failures.push(format!("{}: {name} takes {bytes} bytes of workgroup memory", class.name));
                        }
                        let size = module.entry_points[0].workgroup_size;
                        let invocations = size.iter().product::<u32>();
                        if invocations > class.max_invocations {
                            failures.push(format!("{}: {name} has {invocations} invocations a workgroup", class.name));
                        }
                    }
                }
            }
        }
    }
    failures.dedup();
    assert!(failures.is_empty(), "{} problems:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn quantized_matrices_take_the_tensor_cores_in_the_f16_mode_only() {
    use dg_kernels::format::QuantFormat;
    let tuning = Tuning::default();
    let direct = lab(Overrides { coop_grouped_path: Some(WPath::Direct), ..Overrides::default() });
    let (h200, lavapipe, h200_direct) = (Planner::new(H200, &tuning), Planner::new(LAVAPIPE, &tuning), Planner::new(H200, &direct));
    let slots = CANVAS * TOP_K;
    for q in QuantFormat::ALL {
        let w = WeightFormat::Quantized(q);
        // A projection (q_proj's shape): K panels for the 32-value blocks, else row-major; on the
        // tensor cores either way in the F16 mode.
        let p = GemmParams::linear(CANVAS, 4096, H);
        let layout = h200.projection_layout(w, 4096, H as usize, true);
        assert_eq!(layout == MatrixLayout::KPanels, q.block_len() == 32, "{q:?}");
        match h200.dense(w, layout, &p, true, Some(SPLIT_SCRATCH)) {
            Ok(Dense::TensorCores(plan)) => {
                let panels = layout == MatrixLayout::KPanels;
                assert_eq!(plan.kernel.layout, if panels { coop_gemm::BLayout::NkPanels } else { coop_gemm::BLayout::Nk }, "{q:?}");
                known(KernelKey::CoopGemm(plan.kernel));
            }
            other => panic!("{q:?} projection on the H200: {other:?}"),
        }
        for (planner, tc) in [(&h200, false), (&lavapipe, true)] {
            assert_eq!(planner.projection_layout(w, 4096, H as usize, tc), MatrixLayout::RowMajor);
            let plan = planner.dense(w, MatrixLayout::RowMajor, &p, tc, Some(SPLIT_SCRATCH));
            assert!(matches!(plan, Ok(Dense::Portable { .. })), "{q:?} projection, tensor cores {tc}: {plan:?}");
        }
        // The experts' gate/up (K = H, a multiple of 256) or down projection (K = 704), by the
        // block length: in K panels of blocks on the H200 in the F16 mode.
        let (n, k) = if q.block_len() == 256 { (2 * EXPERT_WIDTH, H) } else { (H, EXPERT_WIDTH) };
        let g = GroupedGemmParams {
            n,
            k,
            groups: EXPERTS,
            max_rows: CANVAS,
            a_rs: k,
            b_group_stride: n * k,
            c_rs: n,
            ..bytemuck::Zeroable::zeroed()
        };
        assert_eq!(h200.experts_layout(w, n as usize, k as usize, true), MatrixLayout::KPanels, "{q:?}");
        // The native kernel where it reads the format, unless the lab names a WGSL path.
        for (planner, native) in [(&h200, native_grouped_gemm::reads(w)), (&h200_direct, false)] {
            match planner.grouped(w, MatrixLayout::KPanels, &g, slots) {
                Ok(Grouped::Native { shape }) => {
                    assert!(native, "{q:?}: the native kernel where WGSL's should run");
                    assert_eq!(shape, NativeShape::F16x8x16, "{q:?}: slots on the narrow side");
                    for a in [AFormat::F32, AFormat::F16] {
                        known(KernelKey::NativeGroupedGemm { shape, w, a });
                    }
                    assert_eq!(planner.expert_tile_rows(w, MatrixLayout::KPanels, slots, &g), native_grouped_gemm::SLOTS);
                }
                Ok(Grouped::TensorCores { tile, path }) => {
                    assert!(!native, "{q:?}: WGSL where the native kernel reads it");
                    assert_ne!(path, WPath::Direct, "{q:?}: direct W fragments need F16");
                    for a in [AFormat::F32, AFormat::F16] {
                        known(KernelKey::CoopGroupedGemm { tile, path, w, a });
                    }
                    assert_eq!(planner.expert_tile_rows(w, MatrixLayout::KPanels, slots, &g), tile.bm);
                }
                other => panic!("{q:?} experts on the H200: {other:?}"),
            }
        }
        for (planner, tc) in [(&h200, false), (&lavapipe, true)] {
            assert_eq!(planner.experts_layout(w, n as usize, k as usize, tc), MatrixLayout::RowMajor, "{q:?} tensor cores {tc}");
            let plan = planner.grouped(w, MatrixLayout::RowMajor, &g, slots);
            assert!(matches!(plan, Ok(Grouped::Portable { .. })), "{q:?} experts, tensor cores {tc}: {plan:?}");
        }
    }
}

/// Attention's values on the H200 take the small tile only where the large one would split K
/// and the small one would not: a sliding layer's (head dim 256, 1280 keys) whole on 64 × 64;
/// a full layer's over 16640 keys (head dim 512), where both would split, on 128 × 128 split (on
/// the H200, 128 queries: 245 + 26 µs against 355 + 12).
#[test]
fn attentions_small_tile_only_where_it_runs_whole() {
    let tuning = Tuning::default();
    let h200 = Planner::new(H200, &tuning);
    let plan = |p: &GemmParams| match h200.dense(WeightFormat::F16, BSource::KvCache, p, true, Some(SPLIT_SCRATCH)) {
        Ok(Dense::TensorCores(plan)) => (plan.kernel.tile, plan.split.is_some()),
        other => panic!("{other:?}"),
    };
    let canvas = CANVAS as usize;
    assert_eq!(plan(&attention_values_params(canvas, 1024 + canvas, 256, 16, 8)), (coop_gemm::ATTENTION_TILE, false));
    for queries in [canvas, 128] {
        let (tile, split) = plan(&attention_values_params(queries, 16384 + 32 + canvas, 512, 16, 2));
        assert_eq!((tile, split), (coop_gemm::TILE_128X128, true), "{queries} queries over 16672 keys");
    }
}

/// Whether a golden plan shows `family`'s tile `label` (`CoopTile::label` and `GemmTile::label`
/// start with the tile's shape; depth, stages and fragment come after it).
fn in_any_golden_plan(family: &str, label: &str) -> bool {
    let word = format!(" {family} {label}");
    ADAPTER_CLASSES.iter().any(|class| class.golden.lines().any(|line| line.contains(&word)))
}

/// A product that some rule of the planner takes on a tile that the real model's golden plans do
/// not show, on the device where it does: the named fallbacks of dg-kernels' tile tables, as
/// (why, kernel family, tile label).
fn fallback_plans() -> Vec<(&'static str, &'static str, String)> {
    let tuning = Tuning::default();
    let small = Capabilities { max_workgroup_storage: 20 * 1024, ..H200 };
    let dense = |caps: Capabilities, p: GemmParams| match Planner::new(caps, &tuning).dense(
        WeightFormat::F16,
        MatrixLayout::RowMajor,
        &p,
        true,
        None,
    ) {
        Ok(Dense::TensorCores(plan)) => ("coop_gemm", plan.kernel.tile.label()),
        Ok(Dense::Portable { tile }) => ("gemm", tile.label()),
        other => panic!("{other:?}"),
    };
    let grouped = |n: u32, slots: u32| match Planner::new(LAVAPIPE, &tuning).grouped(
        WeightFormat::F32,
        MatrixLayout::RowMajor,
        &GroupedGemmParams {
            n,
            k: 64,
            groups: 8,
            max_rows: slots,
            a_rs: 64,
            b_group_stride: n * 64,
            c_rs: n,
            ..bytemuck::Zeroable::zeroed()
        },
        slots,
    ) {
        Ok(Grouped::Portable { tile }) => ("grouped_gemm", tile.label()),
        other => panic!("{other:?}"),
    };
    // The WGSL kernel's tiles: on the H200 without its native kernels.
    let coop_grouped = |n: u32| match Planner::new(Capabilities { native: NativeShapes::NONE, ..H200 }, &tuning).grouped(
        WeightFormat::F16,
        MatrixLayout::KPanels,
        &GroupedGemmParams { n, k: 64, groups: 8, max_rows: 16, a_rs: 64, b_group_stride: n * 64, c_rs: n, ..bytemuck::Zeroable::zeroed() },
        128,
    ) {
        Ok(Grouped::TensorCores { tile, .. }) => ("coop_grouped_gemm", tile.label()),
        other => panic!("{other:?}"),
    };
    let cases = [
        ("more 64x64 tiles than a dispatch takes, fewer than 128 rows", dense(H200, GemmParams::linear(64, 65537 * 64 + 64, 32))),
        ("more 64x64 tiles than a dispatch takes, N no multiple of 128", dense(H200, GemmParams::linear(128, 40001 * 64, 32))),
        ("a device whose workgroup memory holds no 64x64 tile", dense(small, GemmParams::linear(256, 256, 64))),
        ("N a multiple of 32, not of 64", dense(H200, GemmParams::linear(256, 96, 64))),
        ("16 rows or fewer, portable", dense(LAVAPIPE, GemmParams::linear(16, 256, 64))),
        ("few slots per expert, N up to 128, portable", grouped(128, 16)),
        ("few slots per expert, portable", grouped(256, 16)),
        ("experts' N no multiple of 128, tensor cores", coop_grouped(64)),
    ];
    cases.into_iter().map(|(why, (family, label))| (why, family, label)).collect()
}

/// Every tile of dg-kernels' tile tables is one that some planner rule takes: in an adapter
/// class's golden plan, or in a named fallback (a product the planner is shown to give it). A tile
/// no rule picks belongs to dg-lab (`dg_lab::tiles`).
#[test]
fn every_product_tile_is_reachable_from_a_golden_plan_or_a_named_fallback() {
    use dg_kernels::coop_gemm::CoopTile;
    let fallbacks = fallback_plans();
    let named = |family: &str, label: &str| fallbacks.iter().any(|(_, f, planned)| *f == family && planned.starts_with(label));
    let coop = |t: &CoopTile| t.with_depth(1).with_stages(dg_kernels::coop_gemm::Stages::Alternating).label();
    let mut tiles: Vec<(&str, String)> = coop_gemm::TILES.iter().map(|t| ("coop_gemm", coop(t))).collect();
    tiles.extend(coop_grouped_gemm::TILES.iter().map(|t| ("coop_grouped_gemm", coop(t))));
    tiles.extend(gemm::TILES.iter().map(|t| ("gemm", t.label())));
    tiles.extend(grouped_gemm::TILES.iter().map(|t| ("grouped_gemm", t.label())));
    let unreached: Vec<_> = tiles.iter().filter(|(family, label)| !in_any_golden_plan(family, label) && !named(family, label)).collect();
    assert!(unreached.is_empty(), "tiles no rule picks (move them to dg-lab): {unreached:?}\nfallbacks: {fallbacks:?}");
    // Each named fallback is needed: its tile is in no golden plan.
    for (why, family, planned) in &fallbacks {
        assert!(!in_any_golden_plan(family, planned), "{why}: {family} {planned} is in a golden plan already");
    }
}

/// The planner is a leaf of dg-gpu: it plans from shapes (`dg_gpu::shapes`), the tuning and the
/// device's capabilities as a value, and imports none of the modules that use it (the arena, the
/// ops and the forward, the weights' upload, the model) nor the device itself.
#[test]
fn the_planner_imports_shapes_not_the_arena_ops_or_device() {
    let sources = [
        include_str!("../src/planner.rs"),
        include_str!("../src/planner/coop_dense.rs"),
        include_str!("../src/planner/experts.rs"),
        include_str!("../src/planner/portable.rs"),
        include_str!("../src/planner/split.rs"),
    ];
    let code: String = sources.iter().flat_map(|s| s.lines()).filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n");
    for module in ["arena", "ops", "forward", "weights", "model", "context", "plan", "pack", "parts"] {
        for path in [format!("crate::{module}::"), format!("crate::{module};"), format!("crate::{{{module}")] {
            assert!(!code.contains(&path), "the planner imports {path}");
        }
    }
    assert!(code.contains("crate::shapes::"), "the planner takes its shapes from crate::shapes");
}

/// The experts' short groups (a canvas's: 64 tokens, ~4 slots an expert; 256, ~16) take the
/// native kernel where the device runs one of its shapes (the H200's 16×8×16: slots on the narrow
/// side; lavapipe with cooperative matrices and SPIR-V passthrough: 8×8×8), in the formats it reads;
/// WGSL's tensor-core kernel where it does not (lavapipe without passthrough, `DG_NATIVE=0`, the
/// formats it does not read) and for long groups (a 1024-token chunk's ~64).
#[test]
fn short_expert_groups_take_the_native_kernel_where_the_device_runs_it() {
    let tuning = Tuning::default();
    let off = Tuning { native: false, ..Tuning::default() };
    let lavapipe_coop = Capabilities { coop_matrix: true, coop_fragment: 8, ..LAVAPIPE };
    let lavapipe_native = Capabilities { native: NativeShapes::NONE.with(NativeShape::F8x8x8), ..lavapipe_coop };
    let gate_up = |rows: u32| GroupedGemmParams {
        n: 2 * EXPERT_WIDTH,
        k: H,
        groups: EXPERTS,
        max_rows: rows,
        a_rs: H,
        b_group_stride: 2 * EXPERT_WIDTH * H,
        c_rs: 2 * EXPERT_WIDTH,
        gather: 1,
        ..bytemuck::Zeroable::zeroed()
    };
    let kernel = |caps: Capabilities, tuning: &Tuning, w: WeightFormat, rows: u32| match Planner::new(caps, tuning)
        .grouped(w, MatrixLayout::KPanels, &gate_up(rows), rows * TOP_K)
        .unwrap()
    {
        Grouped::Native { shape } => format!("native {}", shape.label()),
        Grouped::NativeInt8 { shape } => format!("int8 {}", shape.label()),
        Grouped::TensorCores { .. } => "wgsl".to_string(),
        Grouped::Portable { .. } => "portable".to_string(),
    };
    let (f16, q4, q5) = (WeightFormat::F16, WeightFormat::Quantized(QuantFormat::Q4_K), WeightFormat::Quantized(QuantFormat::Q5_0));
    for rows in [64, CANVAS] {
        for w in [f16, q4, WeightFormat::Quantized(QuantFormat::Q6_K), WeightFormat::Quantized(QuantFormat::Q8_0)] {
            assert_eq!(kernel(H200, &tuning, w, rows), "native 16x8x16", "{w:?} at {rows} rows on the H200");
            assert_eq!(kernel(lavapipe_native, &tuning, w, rows), "native 8x8x8", "{w:?} at {rows} rows on lavapipe");
            assert_eq!(kernel(lavapipe_coop, &tuning, w, rows), "wgsl", "{w:?} on lavapipe without passthrough");
        }
        assert_eq!(kernel(H200, &tuning, q5, rows), "wgsl", "Q5_0: not a format the native kernel reads");
    }
    assert_eq!(kernel(H200, &tuning, f16, CHUNK), "wgsl", "long groups");
    // `DG_NATIVE=0` opens the device without them: its capabilities list no shape.
    assert_eq!(kernel(Capabilities { native: NativeShapes::NONE, ..H200 }, &off, q4, 64), "wgsl");
}

/// With the int8 mode asked for (`DG_INT8=1`, where the driver lists 8-bit fragments: the
/// device's capabilities then name them), Q8_0 and Q4_K experts' short groups take the native
/// kernel's int8 variant; every other format, long groups, and a device without them stay where
/// they were.
#[test]
fn quantized_short_groups_take_the_int8_kernel_only_where_asked_for() {
    let tuning = Tuning::default();
    let gate_up = GroupedGemmParams {
        n: 2 * EXPERT_WIDTH,
        k: H,
        groups: EXPERTS,
        max_rows: 64,
        a_rs: H,
        b_group_stride: 2 * EXPERT_WIDTH * H,
        c_rs: 2 * EXPERT_WIDTH,
        gather: 1,
        ..bytemuck::Zeroable::zeroed()
    };
    let kernel = |caps: Capabilities, w: WeightFormat, slots: u32| match Planner::new(caps, &tuning)
        .grouped(w, MatrixLayout::KPanels, &gate_up, slots)
        .unwrap()
    {
        Grouped::NativeInt8 { shape } => format!("int8 {}", shape.label()),
        Grouped::Native { shape } => format!("native {}", shape.label()),
        _ => "wgsl".to_string(),
    };
    let nvidia = Capabilities { int8: Int8Shapes::NONE.with(Int8Shape::I16x16x32).with(Int8Shape::I16x8x32), ..H200 };
    let lavapipe = Capabilities {
        coop_matrix: true,
        coop_fragment: 8,
        native: NativeShapes::NONE.with(NativeShape::F8x8x8),
        int8: Int8Shapes::NONE.with(Int8Shape::I8x8x8),
        ..LAVAPIPE
    };
    let (q8, q4) = (WeightFormat::Quantized(QuantFormat::Q8_0), WeightFormat::Quantized(QuantFormat::Q4_K));
    assert_eq!(kernel(nvidia, q8, 64 * TOP_K), "int8 16x8x32");
    assert_eq!(kernel(lavapipe, q8, 64 * TOP_K), "int8 8x8x8");
    assert_eq!(kernel(nvidia, q4, 64 * TOP_K), "int8 16x8x32");
    let q6 = WeightFormat::Quantized(QuantFormat::Q6_K);
    assert_eq!(kernel(nvidia, q6, 64 * TOP_K), "native 16x8x16", "Q6_K: not a format the int8 mode reads");
    assert_eq!(kernel(H200, q8, 64 * TOP_K), "native 16x8x16", "the mode not asked for");
    assert_eq!(kernel(nvidia, q8, CHUNK * TOP_K), "wgsl", "long groups");
    // Gate/up in the int8 kernel and down in another share the dispatch's tile table.
    let rows = |caps: Capabilities, w| Planner::new(caps, &tuning).expert_tile_rows(w, MatrixLayout::KPanels, 64 * TOP_K, &gate_up);
    assert_eq!(rows(nvidia, q8), rows(nvidia, q6));
}

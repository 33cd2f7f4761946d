//! The K loops of the tensor-core GEMMs ([`crate::coop_gemm`], [`crate::coop_grouped_gemm`]),
//! rendered for a prefetch depth: how many K steps ahead of their use the global loads are issued.
//!
//! A K step multiplies one `bm × bk` block of A by one `bn × bk` block of W. A reaches the tensor
//! cores through two stages of workgroup memory (rounded to f16 as it is staged); W either with it
//! ([`crate::coop_gemm::WPath::Staged`]) or as fragments each subgroup loads straight from the
//! buffer ([`crate::coop_gemm::WPath::Direct`]). One barrier a step (two single-staged). The loads of later steps
//! wait in registers, in a ring of sets indexed by constants: the loop is unrolled by the ring's
//! length, so that no set is ever copied (a register copy would wait for its load).
//!
//! - Staged, depth `d`: `d` sets of A and W vec4s. Step `s` multiplies its stage, writes step
//!   `s + 1` (loaded `d` steps earlier) into the other stage, then loads step `s + 1 + d` into the
//!   set just written out.
//! - Single, depth `d` ([`crate::coop_gemm::WPath::Single`]): one stage of A and W (half the
//!   workgroup memory, so more workgroups share a multiprocessor), two barriers a step, `d` sets
//!   of vec4s. Step `s` writes its set into the stage, loads step `s + d` into that set, then
//!   multiplies.
//! - Direct, depth `d`: `d + 1` sets of W fragments. Step `s` first loads step `s + d`'s
//!   fragments into the set step `s − 1` used, then multiplies with its own; A as staged, with
//!   `d + 1` sets.
//!
//! Staged and single, the ring is [`Ring::Staggered`] as above, or [`Ring::Batched`]: each pass
//! of the unrolled loop takes the `d` sets the pass before loaded and loads the next pass's `d`
//! steps at once. Staged and direct (two stages of workgroup memory), each phase computes its
//! stage from the step or knows it as a constant ([`Stages`]).
//!
//! Depth 1 is the classic double buffer (the loads of the next step in flight while this one
//! multiplies). Every depth adds the same products in the same order: results are bit-identical
//! across depths.
//!
//! Every load is unconditional: past the last step it loads the last step again (`min(·, steps −
//! 1)`), and every put happens (past the last step into the stage no one reads again). A load
//! under a condition leaves its set holding either the new or the old values where the branches
//! meet, and the NVIDIA compiler resolves that with register moves that wait for the load right
//! after issuing it: the disassembled kernels showed each step's loads waited for before the
//! step multiplied, whatever the depth. W likewise stays in its stored form in the ring (BF16
//! words, f32, a quantized format's block words: `fetch_w` of [`crate::format::CoopW`]) and is
//! converted as it is staged (`put_w`), since a conversion also waits for its load. A W set
//! holds `LW` units of `WU` vec4s each (one vec4, or a quantized format's 32-value run), unit
//! `l` of the invocation being unit `lt + l · WT` of the step's tile. Unconditional loads alone are not enough: the compiler then sinks them down to the put
//! that consumes them, so `prefetch` pins them where the ring issues them. Global loads are not
//! drained by barriers on NVIDIA (`xtask probe barrier_drain_probe`), so a deeper
//! ring keeps more bytes in flight per workgroup: depth 3 for the lone 128×128 workgroup of a
//! multiprocessor, 4 for the experts' single-staged tiles (on an H200, with the pins: gate/up 397
//! µs at depth 1, 370 at 2, 343 at 4; before them the experts gained nothing from a deeper ring;
//! see [`crate::coop_grouped_gemm::EXPERT_DEPTH`]).
//!
//! A's vec4s are `A_ELEM` (`vec4<f32>` or `vec4<f16>`, see [`crate::coop_gemm::AFormat`]), which
//! the kernel's source names. The text expects in scope: `a_src` (LA vec4 indices into `a` at step
//! 0), `steps`, `w_step` (vec4s of W between steps), `stride_s`, `sg`, `sm`, `sn`; staged, the expression `W_AT` (the
//! index into `w` of the invocation's vec4 `l` at step 0, replaced by the kernel's); direct,
//! `w_sub` (the subgroup's first W vec4 at step 0) and `stride_w` (vec4s between W rows); a staged
//! W vec4 of step `s` is at `W_AT + W_OFFSET(s)` ([`w_offsets`]: `s · w_step` unless the kernel
//! says otherwise). It
//! leaves the accumulators `acc_i_j`; the markers `//@ACC` and `//@MULTIPLY` (one per phase of
//! the unrolled loop, each in a scope with `a_st`, `b_st`) are filled in by the tile.

/// The deepest ring a tile may ask for.
pub const MAX_DEPTH: u32 = 4;

/// When a K loop issues its ring's loads.
///
/// The NVIDIA compiler tracks every global load of the K loop on one scoreboard, and a wait on
/// a scoreboard waits for all of its loads. Its register allocation also copies the ring's
/// registers at the unrolled loop's back edge, and those copies wait. With [`Ring::Staggered`]
/// (one step's loads issued each step) the back edge therefore waits for the loads its last
/// phase has just issued: every `depth` steps, one whole memory latency goes unhidden
/// (`bench/nv_sass.py` counts the barriers between a load and its wait: in the experts' 32 × 128
/// loop at depth 4, two barriers a step, a quarter of the loads each were waited after 1, 3, 5
/// and 7, where the ring's depth allows 8). With [`Ring::Batched`] every load of a pass is
/// issued as the pass starts, so the back edge's wait comes `depth` steps after it (all after
/// 8); the price is a second bank of the ring held while the pass stages the first.
///
/// Measured on an H200 (real 6-layer geometry, µs for the experts' gate/up and down, layer 0):
/// the F16 experts 343 / 197 → 317 / 191 batched (decoder, 32 × 128 single-staged) and 980 / 589
/// → 904 / 563 (encoder prefill, 64 × 128 staged). Slower batched: the dense 128 × 128 tiles
/// (232 → 248 registers; 3–10% per product) and the quantized experts, whose dequantization
/// already holds registers (Q4_K 163 → about 230: three workgroups a multiprocessor become two;
/// gate/up Q4_K 339 → 365, Q8_0 334 → 371). Hence [`Ring::for_experts`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Ring {
    /// Step `s` loads step `s + depth` into the set it has just staged.
    Staggered,
    /// Each pass of `depth` steps loads the next pass's steps at once, into a second bank.
    Batched,
}

impl Ring {
    /// The ring of the experts' grouped kernel for W in `format`: batched where W is staged as
    /// it is stored (F16), staggered where staging dequantizes or converts it. (The dense
    /// kernel's is [`Ring::Staggered`].)
    pub fn for_experts(format: crate::WeightFormat) -> Ring {
        match format {
            crate::WeightFormat::F16 => Ring::Batched,
            _ => Ring::Staggered,
        }
    }
}

/// How a two-stage loop's phases name their stage of workgroup memory.
///
/// With [`Stages::Alternating`] a pass has one phase per set of the ring, and a phase computes
/// its stage from the step (`s & 1`). The bounds checks then clamp every fragment load's and
/// every staged store's index at every step: on an H200, five uniform instructions for each of
/// the 12 fragment loads of a 128 × 128 step (`bench/nv_sass.py`). With [`Stages::Constant`] a
/// pass whose ring has an odd number of sets is doubled, so that every pass starts at an even
/// step and each phase's stage is a constant: the clamps are computed once, ahead of the loop
/// (the 128 × 128 step: about 190 → 135 instructions a subgroup). The doubled pass is longer
/// code, and fewer instructions do not always pay. Measured on an H200 (real 6-layer geometry,
/// ms over the forward, one call): the experts' 64 × 128 staged tiles in a 1024-token prefill
/// 7.35 → 6.33 (one set, two phases); the V-sized head 2.52 → 2.40 and the soft embedding
/// 2.00 → 1.88 (128 × 128 at depth 3: six phases); but the layers' own 128 × 128 products (a few
/// hundred K steps per multiprocessor) 1.47 → 1.52 and attention's 64 × 64 values 0.20 → 0.22.
/// Hence `dg_gpu::planner::coop_dense::stages` and the grouped kernel's prefill tile. The results are the
/// same bits either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stages {
    /// Each phase computes its stage from the step.
    Alternating,
    /// Each phase's stage is a constant (odd rings: the pass doubled).
    Constant,
}

impl Stages {
    /// Both, [`Stages::Alternating`] first.
    pub const ALL: [Stages; 2] = [Stages::Alternating, Stages::Constant];

    /// Phases of one pass of a staged loop whose ring has `sets` sets (see [`Stages`]).
    fn phases(self, sets: u32) -> u32 {
        match self {
            Stages::Constant if sets % 2 == 1 => 2 * sets,
            _ => sets,
        }
    }

    /// The stage (a WGSL u32 expression) of the step `step` (a WGSL expression), phase `ph` of
    /// its pass.
    fn stage(self, ph: u32, step: &str) -> String {
        match self {
            Stages::Alternating => format!("({step} & 1u)"),
            Stages::Constant => format!("{}u", ph % 2),
        }
    }

    /// The `let`s, indented by `indent`, of the stage offsets `a` (of A) and, with `b`, of W, of
    /// the step `step`, phase `ph` of its pass.
    fn offsets(self, ph: u32, step: &str, a: &str, b: Option<&str>, indent: &str) -> String {
        let stage = self.stage(ph, step);
        let mut s = format!("{indent}let {a} = {stage} * (BM * KP);\n");
        if let Some(b) = b {
            s += &format!("{indent}let {b} = {stage} * SBS;\n");
        }
        s
    }
}

/// W's offset of K step `STEP` from step 0 where a step adds `w_step` vec4s: what the rendered
/// loops' `W_OFFSET(step)` become unless a kernel lays W out otherwise ([`w_offsets`]).
pub(crate) const LINEAR_W_OFFSET: &str = "(STEP) * w_step";

/// `text` with every `W_OFFSET(step)` the loops write replaced by `pattern` with `STEP` standing
/// for the step expression (parentheses balanced).
pub(crate) fn w_offsets(text: &str, pattern: &str) -> String {
    const MARK: &str = "W_OFFSET(";
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(MARK) {
        out += &rest[..at];
        let inner = &rest[at + MARK.len()..];
        let mut depth = 1;
        let end = inner
            .char_indices()
            .find(|&(_, c)| {
                depth += match c {
                    '(' => 1,
                    ')' => -1,
                    _ => 0,
                };
                depth == 0
            })
            .map(|(i, _)| i)
            .expect("W_OFFSET( without its closing parenthesis");
        out += &pattern.replace("STEP", &inner[..end]);
        rest = &inner[end + 1..];
    }
    out + rest
}

/// Loads step `step` (a WGSL u32 expression) of A, and of W when `with_w`, into set `set`.
fn load(set: u32, step: &str, with_w: bool, indent: &str) -> String {
    let mut s = format!(
        "{indent}// @unroll\n{indent}for (var l = 0u; l < LA; l++) {{\n{indent}    ra[{set}][l] = a[a_src[l] + ({step}) * BK4];\n{indent}}}\n"
    );
    if with_w {
        s += &format!(
            "{indent}// @unroll\n{indent}for (var l = 0u; l < LW; l++) {{\n{indent}    rw[{set}][l] = fetch_w(W_AT + W_OFFSET({step}));\n{indent}}}\n"
        );
    }
    s
}

/// [`load`] for a later step, its values pinned where they are loaded: a branch no run takes
/// (`p.n` is never 0: both kernels' `fits` refuse an empty n) stores them to workgroup memory (`pin_a`, `pin_w`: into a stage or the
/// scratch, as they are, no conversion). The NVIDIA compiler otherwise sinks each load down to the
/// put that consumes it, a step later (the disassembly showed every step's loads issued right
/// before their stores, however deep the ring), so that nothing overlaps their latency; a use on
/// another path keeps the load where the ring issues it.
fn prefetch(set: u32, step: &str, with_w: bool, indent: &str) -> String {
    let mut s = load(set, step, with_w, indent);
    s += &format!(
        "{indent}if (p.n == 0u) {{\n{indent}    // @unroll\n{indent}    for (var l = 0u; l < LA; l++) {{\n{indent}        pin_a(l, ra[{set}][l]);\n{indent}    }}\n"
    );
    if with_w {
        s += &format!(
            "{indent}    // @unroll\n{indent}    for (var l = 0u; l < LW; l++) {{\n{indent}        pin_w(l, rw[{set}][l]);\n{indent}    }}\n"
        );
    }
    s + &format!("{indent}}}\n")
}

/// Step `step` clamped to the last one (a WGSL u32 expression): what an unconditional load past
/// the end loads.
fn clamped(step: &str) -> String {
    format!("min({step}, steps - 1u)")
}

/// The ring's A and W arrays, which the loads fill.
const RING: (&str, &str) = ("ra", "rw");
/// A batched pass's copy of the ring ([`batch`]), which its steps stage.
const COPY: (&str, &str) = ("ca", "cw");

/// Writes set `set` of `bank` ([`RING`] or [`COPY`]) into the stage whose A starts at `a_at`
/// (and W at `b_at` when `with_w`).
fn put(bank: (&str, &str), set: u32, a_at: &str, b_at: &str, with_w: bool, indent: &str) -> String {
    let (ra, rw) = bank;
    let mut s = format!(
        "{indent}// @unroll\n{indent}for (var l = 0u; l < LA; l++) {{\n{indent}    put_a({a_at} + dst_of(lt + l * WT), vec4<f16>({ra}[{set}][l]));\n{indent}}}\n"
    );
    if with_w {
        s += &format!(
            "{indent}// @unroll\n{indent}for (var l = 0u; l < LW; l++) {{\n{indent}    put_w({b_at}, lt + l * WT, {rw}[{set}][l]);\n{indent}}}\n"
        );
    }
    s
}

/// The ring's declarations: `sets` sets of A vec4s, and of W units when `with_w`.
fn declare(sets: u32, with_w: bool) -> String {
    let mut s = format!("    var ra: array<array<A_ELEM, LA>, {sets}>;\n");
    if with_w {
        s += &format!("    var rw: array<array<W_ELEM, LW>, {sets}>;\n");
    }
    s
}

/// The ring's declarations and prologue: step 0 staged, steps `1..=sets` loaded into their sets
/// (step `t` in set `t % sets`).
fn prologue(sets: u32, with_w: bool) -> String {
    let mut s = declare(sets, with_w);
    s += &load(0, "0u", with_w, "    ");
    s += &put(RING, 0, "0u", "0u", with_w, "    ");
    for t in 1..=sets {
        s += &prefetch(t % sets, &clamped(&format!("{t}u")), with_w, "    ");
    }
    s
}

/// After step `s` (phase `ph` of a pass, a ring of `sets`) multiplied: step `s + 1` into the
/// other stage from its set, and step `s + 1 + sets` loaded into that set.
fn advance(ph: u32, sets: u32, stages: Stages, with_w: bool) -> String {
    let next = (ph + 1) % sets;
    let i = "                    ";
    format!(
        "                {{\n{}{}{}\
         \x20               }}\n",
        stages.offsets(ph + 1, "(s + 1u)", "a_nx", Some("b_nx"), i),
        put(RING, next, "a_nx", "b_nx", with_w, i),
        prefetch(next, &clamped(&format!("s + {}u", 1 + sets)), with_w, i),
    )
}

/// The staged K loop of `depth` (A and W through workgroup memory), its stages named as
/// `stages` says; [`Ring::Batched`]: see [`staged_batched`].
pub(crate) fn staged(depth: u32, ring: Ring, stages: Stages) -> String {
    assert!((1..=MAX_DEPTH).contains(&depth), "prefetch depth {depth} outside 1..={MAX_DEPTH}");
    if ring == Ring::Batched {
        return staged_batched(depth, stages);
    }
    let mut s = prologue(depth, true);
    s += "    workgroupBarrier();\n\n//@ACC\n";
    let phases = stages.phases(depth);
    s += &format!("    for (var s0 = 0u; s0 < steps; s0 += {phases}u) {{\n");
    for ph in 0..phases {
        s += &format!(
            "        {{\n            let s = s0 + {ph}u;\n            if (s >= steps) {{\n                break;\n            }}\n\
             \x20           {{\n{}\
             //@MULTIPLY\n{}\
             \x20               workgroupBarrier();\n            }}\n        }}\n",
            stages.offsets(ph, "s", "a_st", Some("b_st"), "                "),
            advance(ph, depth, stages, true)
        );
    }
    s + "    }\n"
}

/// The single-stage K loop of `depth` (A and W through one stage of workgroup memory, half the
/// double buffer's; two barriers a step): `depth` sets of A and W vec4s. [`Ring::Staggered`]:
/// step `s + depth` loaded into the set step `s` just wrote out, before step `s` multiplies.
/// [`Ring::Batched`]: see [`single_batched`].
pub(crate) fn single(depth: u32, ring: Ring) -> String {
    assert!((1..=MAX_DEPTH).contains(&depth), "prefetch depth {depth} outside 1..={MAX_DEPTH}");
    if ring == Ring::Batched {
        return single_batched(depth);
    }
    let mut s = declare(depth, true);
    s += &load(0, "0u", true, "    ");
    for t in 1..depth {
        s += &prefetch(t, &clamped(&format!("{t}u")), true, "    ");
    }
    s += "\n//@ACC\n";
    s += &format!("    for (var s0 = 0u; s0 < steps; s0 += {depth}u) {{\n");
    for ph in 0..depth {
        s += &format!(
            "        {{\n            let s = s0 + {ph}u;\n            if (s >= steps) {{\n                break;\n            }}\n\
             \x20           {{\n                workgroupBarrier();\n{}{}\
             \x20               workgroupBarrier();\n\
             \x20               let a_st = 0u;\n                let b_st = 0u;\n\
             //@MULTIPLY\n\
             \x20           }}\n        }}\n",
            put(RING, ph, "0u", "0u", true, "                "),
            prefetch(ph, &clamped(&format!("s + {depth}u")), true, "                "),
        );
    }
    s + "    }\n"
}

/// The head of a batched pass ([`Ring::Batched`]): the ring copied into `ca` / `cw` (the
/// `depth` steps this pass stages, loaded by the pass before), then steps `first + t` loaded into
/// the ring, all at once.
fn batch(depth: u32, first: &str) -> String {
    let mut s = format!("        let {} = {};\n        let {} = {};\n", COPY.0, RING.0, COPY.1, RING.1);
    for t in 0..depth {
        s += &prefetch(t, &clamped(&format!("{first} + {t}u")), true, "        ");
    }
    s
}

/// The staged K loop of `depth` with the ring's loads issued a pass at a time: step 0 staged and
/// steps `1..=depth` loaded before the loop; each pass then takes its `depth` steps from the
/// copy [`batch`] makes (step `s + 1` staged while step `s` multiplies, as in [`staged`]).
fn staged_batched(depth: u32, stages: Stages) -> String {
    let mut s = declare(depth, true);
    s += &load(0, "0u", true, "    ");
    s += &format!("    {{\n        let {} = {};\n        let {} = {};\n", COPY.0, RING.0, COPY.1, RING.1);
    s += &put(COPY, 0, "0u", "0u", true, "        ");
    s += "    }\n";
    for t in 0..depth {
        s += &prefetch(t, &clamped(&format!("{}u", 1 + t)), true, "    ");
    }
    s += "    workgroupBarrier();\n\n//@ACC\n";
    let phases = stages.phases(depth);
    s += &format!("    for (var s0 = 0u; s0 < steps; s0 += {phases}u) {{\n");
    for first in (0..phases).step_by(depth as usize) {
        // Each batch in a scope of its own (its copy's names).
        s += "        {\n";
        s += &batch(depth, &format!("s0 + {}u", first + 1 + depth));
        for ph in first..first + depth {
            let put_next = put(COPY, ph - first, "a_nx", "b_nx", true, "                    ");
            s += &format!(
                "        {{\n            let s = s0 + {ph}u;\n            if (s >= steps) {{\n                break;\n            }}\n\
                 \x20           {{\n{}\
                 //@MULTIPLY\n\
                 \x20               {{\n{}\
                 {put_next}\
                 \x20               }}\n\
                 \x20               workgroupBarrier();\n            }}\n        }}\n",
                stages.offsets(ph, "s", "a_st", Some("b_st"), "                "),
                stages.offsets(ph + 1, "(s + 1u)", "a_nx", Some("b_nx"), "                    "),
            );
        }
        s += "        }\n";
    }
    s + "    }\n"
}

/// The single-stage K loop of `depth` with the ring's loads issued a pass at a time: steps
/// `0..depth` loaded before the loop; each pass stages and multiplies its steps from the copy
/// [`batch`] makes.
fn single_batched(depth: u32) -> String {
    let mut s = declare(depth, true);
    for t in 0..depth {
        s += &prefetch(t, &clamped(&format!("{t}u")), true, "    ");
    }
    s += "\n//@ACC\n";
    s += &format!("    for (var s0 = 0u; s0 < steps; s0 += {depth}u) {{\n");
    s += &batch(depth, &format!("s0 + {depth}u"));
    for ph in 0..depth {
        let put_copy = put(COPY, ph, "0u", "0u", true, "                ");
        s += &format!(
            "        {{\n            let s = s0 + {ph}u;\n            if (s >= steps) {{\n                break;\n            }}\n\
             \x20           {{\n                workgroupBarrier();\n{put_copy}\
             \x20               workgroupBarrier();\n\
             \x20               let a_st = 0u;\n                let b_st = 0u;\n\
             //@MULTIPLY\n\
             \x20           }}\n        }}\n"
        );
    }
    s + "    }\n"
}

/// The direct K loop of `tile` (its depth, stages and fragments), whose subgroups hold `n_frags`
/// fragments along their columns: W fragment `(kk, j)` of the current step is `fb_{kk}_{j}`.
pub(crate) fn direct(tile: crate::coop_gemm::CoopTile, n_frags: u32) -> String {
    let (depth, stages, f) = (tile.depth, tile.stages, tile.fragment);
    let (k_frags, w_type) = (tile.bk / f, tile.fragment_type("f16", "B"));
    assert!((1..=MAX_DEPTH).contains(&depth), "prefetch depth {depth} outside 1..={MAX_DEPTH}");
    let sets = depth + 1;
    let fragments = |at: &dyn Fn(u32, u32, String) -> String| -> String {
        (0..k_frags)
            .flat_map(|kk| (0..n_frags).map(move |j| (kk, j)))
            .map(|(kk, j)| at(kk, j, format!("{}u * stride_w + {}u", j * f, kk * f / 4)))
            .collect()
    };
    let mut s = prologue(sets, false);
    // W steps 0..depth in sets 0..depth (steps past the last repeat it); the last set is free.
    for set in 0..sets {
        s += &fragments(&|kk, j, at| match set < depth {
            true => {
                format!("    var fw{set}_{kk}_{j} = coopLoad<{w_type}>(&w[w_sub + min({set}u, steps - 1u) * w_step + {at}], stride_w);\n")
            }
            false => format!("    var fw{set}_{kk}_{j} = {w_type}();\n"),
        });
    }
    s += "    workgroupBarrier();\n\n//@ACC\n";
    let phases = stages.phases(sets);
    s += &format!("    for (var s0 = 0u; s0 < steps; s0 += {phases}u) {{\n");
    for ph in 0..phases {
        let ahead = (ph + depth) % sets;
        // Unconditional (cooperative loads need uniform control flow): past the last step, the
        // last step's fragments again.
        let refill = fragments(&|kk, j, at| {
            format!(
                "                fw{ahead}_{kk}_{j} = coopLoad<{w_type}>(&w[w_sub + min(s + {depth}u, steps - 1u) * w_step + {at}], stride_w);\n"
            )
        });
        let set = ph % sets;
        let current = fragments(&|kk, j, _| format!("                let fb_{kk}_{j} = fw{set}_{kk}_{j};\n"));
        s += &format!(
            "        {{\n            let s = s0 + {ph}u;\n            if (s >= steps) {{\n                break;\n            }}\n\
             \x20           {{\n{refill}\
             {current}\
             {}\
             \x20               let b_st = 0u;\n\
             //@MULTIPLY\n{}\
             \x20               workgroupBarrier();\n            }}\n        }}\n",
            stages.offsets(ph, "s", "a_st", None, "                "),
            advance(ph, sets, stages, false)
        );
    }
    s + "    }\n"
}

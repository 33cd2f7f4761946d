//! The dense tensor-core kernel's WGSL, rendered per [`CoopTile`], W path, W format and layout
//! (`wgsl/coop_gemm.wgsl` with the tile's staging, fragments and K loop filled in); the grouped
//! kernel (`crate::coop_grouped_gemm`) renders through the same [`CoopTile::expand_path`].

use super::{AFormat, BLayout, CoopTile, PANEL, ROW_PAD, Staging, WPath, panelled};
use crate::coop_kloop::Ring;
use crate::{WeightFormat, with_prelude};

impl CoopTile {
    /// The kernel's constants, W staged in units of `w_vec4s` vec4s (`WU`; `LW` of them an
    /// invocation a step: see [`Self::w_unit`]).
    fn prelude(self, w_vec4s: u32) -> Vec<(&'static str, u32)> {
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
            ("LW", self.bn * bk4 / self.invocations() / w_vec4s),
            ("WU", w_vec4s),
            ("SAL", 2 * self.bm * kp / se),
            ("BN4", self.bn / 4),
            ("NP", self.bn + ROW_PAD),
            ("NPS", (self.bn + ROW_PAD) / se),
        ]
    }

    /// Halves of one stage of W in workgroup memory: `[BN][KP]` for [`BLayout::Nk`], `[BK][NP]`
    /// for [`BLayout::Kn`] (never more than the former while `bk ≤ bn`).
    const fn w_stage_halves(self, layout: BLayout) -> u32 {
        match layout {
            BLayout::Nk | BLayout::NkPanels => self.bn * self.row_halves(),
            BLayout::Kn => self.bk * (self.bn + ROW_PAD),
        }
    }

    /// W's unit in the K loop's ring (see [`crate::format::CoopW`]): a quantized format's
    /// 32-value run where it has one and every invocation stages whole runs of each step (W staged,
    /// along K, `bk` whole runs, a whole number of runs an invocation); for blocks in planes (in K
    /// panels, [`crate::format::PLANE_GROUP`]) half a run where invocations take whole halves;
    /// else one vec4.
    pub(crate) fn w_unit(self, w_format: WeightFormat, layout: BLayout, direct: bool) -> crate::format::CoopW {
        let run = crate::format::RUN_VALUES;
        let vec4s = self.bn * self.bk / 4 / self.invocations();
        let along_k = self.bk.is_multiple_of(run) && !direct && layout != BLayout::Kn;
        let panels = layout == BLayout::NkPanels;
        let run_unit = w_format.coop_w_run(panels).filter(|_| along_k && vec4s.is_multiple_of(run / 4));
        let half_unit = || w_format.coop_w_half(panels).filter(|_| along_k && vec4s.is_multiple_of(run / 8));
        run_unit.or_else(half_unit).unwrap_or_else(|| w_format.coop_w(panels))
    }

    /// The full WGSL of the dense kernel for this variant, B stored as `w_format` (F16, or BF16
    /// or f32 when staged) and laid out as `layout`, reaching the tensor cores by `path` (direct
    /// only for F16 [`BLayout::Nk`]).
    pub fn render_with(self, path: WPath, w_format: WeightFormat, layout: BLayout) -> String {
        self.render_with_a(path, w_format, layout, AFormat::F32)
    }

    /// [`Self::render_with`] with A stored as `a_format`.
    pub fn render_with_a(self, path: WPath, w_format: WeightFormat, layout: BLayout, a_format: AFormat) -> String {
        self.render_with_ring(path, w_format, layout, a_format, Ring::Staggered)
    }

    /// [`Self::render_with_a`] with the K loop's loads issued by `ring` (the dense kernel's is
    /// [`Ring::Staggered`]; the other is for measurements).
    pub fn render_with_ring(self, path: WPath, w_format: WeightFormat, layout: BLayout, a_format: AFormat, ring: Ring) -> String {
        assert!(path != WPath::Direct || layout != BLayout::Kn, "direct W fragments need W[n][k]");
        assert!(path != WPath::Direct || ring == Ring::Staggered, "direct W fragments have no ring to batch");
        assert!(
            layout != BLayout::NkPanels || (self.bk == PANEL && panelled(w_format)),
            "K panels are F16 or blocks of PANEL values, with bk = PANEL"
        );
        let (fm, fn_) = self.fragments();
        let mut store = String::new();
        for i in 0..fm {
            for j in 0..fn_ {
                store += &format!(
                    "    {{\n        let ic = c_base + (m0 + sm + {}u) * p.c_rs + n0 + sn + {}u;\n        coopStoreT(acc_{i}_{j}, &c[ic], stride_c);\n    }}\n",
                    i * self.fragment,
                    j * self.fragment
                );
            }
        }
        // Epilogue: each fragment through the subgroup's scratch; lane l writes `v` values of row
        // l / `lanes` (8 of row l / 2 in 16 × 16 fragments: `CoopTile::lane_span`).
        let (v, f) = (self.lane_span().0, self.fragment);
        let (row, column) = (self.lane_row(), self.lane_column());
        let mut capped = String::new();
        for i in 0..fm {
            for j in 0..fn_ {
                let (di, dj) = (i * f, j * f);
                let (trip, src) = self.scratch_trip(i, j, "            ");
                capped += &format!(
                    "        {{\n{trip}\
                     \x20           let src = {src};\n\
                     \x20           let row = m0 + sm + {di}u + {row};\n\
                     \x20           let dst = c_base + row * p.c_rs + n0 + sn + {dj}u + {column};\n\
                     \x20           for (var q = 0u; q < {v}u && row < p.m; q++) {{\n\
                     \x20               var v = p.alpha * scratch[src + q];\n\
                     \x20               if (p.accumulate != 0u) {{\n                    v += c[dst + q];\n                }}\n\
                     \x20               if (p.epilogue == 1u) {{\n\
                     \x20                   // tanh(±10) is already ±1 in f32; the clamp keeps exp-based tanh lowerings finite.\n\
                     \x20                   v = p.cap * tanh(clamp(v / p.cap, -10.0, 10.0));\n\
                     \x20               }}\n\
                     \x20               c[dst + q] = v;\n\
                     \x20           }}\n            workgroupBarrier();\n        }}\n"
                );
            }
        }
        // Where an invocation's W vec4 e of step 0 is, vec4s between steps and between W rows.
        let (w_src, w_step, w_row) = match layout {
            BLayout::Nk => ("w_base + (n0 + e / BK4) * (p.b_cs / 4u) + e % BK4", "BK4", "p.b_cs / 4u"),
            BLayout::Kn => ("w_base + (e / BN4) * (p.b_rs / 4u) + n0 / 4u + e % BN4", "BK * (p.b_rs / 4u)", "p.b_cs / 4u"),
            BLayout::NkPanels => ("w_base + n0 * BK4 + e", "p.n * BK4", "BK4"),
        };
        let template = crate::gemm::with_params(include_str!("../wgsl/coop_gemm.wgsl"))
            .replace("W_SRC", w_src)
            .replace("W_STEP", w_step)
            .replace("W_ROW", w_row);
        let wgsl = self.expand_path(
            &template,
            "w_src[l]",
            path,
            w_format,
            layout,
            ring,
            vec![("//@STORE_EPILOGUE\n", capped), ("//@STORE\n", store)],
        );
        crate::coop_kloop::w_offsets(&wgsl, crate::coop_kloop::LINEAR_W_OFFSET)
            .replace("A_ELEM", a_format.elem())
            .replace("PIN_A", a_format.pin())
    }

    /// [`Self::expand`] for W reaching the tensor cores by `path`: with [`WPath::Direct`] the
    /// template's `sb` is dropped and the K loop is [`crate::coop_kloop`]'s direct one, whose W
    /// fragments start at `w_sub` (a `let` of the template), `stride_w` vec4s between W rows,
    /// `w_step` between steps; the staged and single-staged loops issue their loads by `ring`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn expand_path(
        self,
        template: &str,
        w_at: &str,
        path: WPath,
        w_format: WeightFormat,
        layout: BLayout,
        ring: Ring,
        pieces: Vec<(&str, String)>,
    ) -> String {
        match path {
            WPath::Staged => self.expand(template, w_at, w_format, layout, ring, &pieces),
            WPath::Single => {
                let one = self.expand_with(template, &crate::coop_kloop::single(self.depth, ring), w_at, w_format, layout, None, &pieces);
                // One stage of each tile: the stage arrays at half their double-buffered length.
                let stage = self.w_stage_halves(layout) / self.element_halves();
                let half_a = self.bm * self.row_halves() / self.element_halves();
                one.replacen(&format!("const SAL: u32 = {}u;", 2 * half_a), &format!("const SAL: u32 = {half_a}u;"), 1).replacen(
                    &format!("const SBL: u32 = {}u;", 2 * stage),
                    &format!("const SBL: u32 = {stage}u;"),
                    1,
                )
            }
            WPath::Direct => {
                let (_, fn_) = self.fragments();
                let template = template.replace("var<workgroup> sb: array<SElem, SBL>;\n", "");
                let fragment = |kk: u32, j: u32| format!("fb_{kk}_{j}");
                let kloop = crate::coop_kloop::direct(self, fn_);
                self.expand_with(&template, &kloop, "", w_format, layout, Some(&fragment), &pieces)
            }
        }
    }

    /// `template` with the tile's pieces filled in: the staging element and its stores
    /// (`//@PUT`), the accumulators (`//@ACC`, inside the shared K loop `//@KLOOP`, which reads
    /// W's vec4 `l` of step 0 at the expression `w_at`), the unrolled fragment products
    /// (`//@MULTIPLY`), then the kernel's own `pieces`; `enable`s and the const prelude in front,
    /// `// @unroll` loops expanded.
    pub(crate) fn expand(
        self,
        template: &str,
        w_at: &str,
        w_format: WeightFormat,
        layout: BLayout,
        ring: Ring,
        pieces: &[(&str, String)],
    ) -> String {
        self.expand_with(template, &crate::coop_kloop::staged(self.depth, ring, self.stages), w_at, w_format, layout, None, pieces)
    }

    /// [`Self::expand`] with the K loop `kloop`, and with `b_fragment(kk, j)` naming the B
    /// fragment of K slice `kk`, column block `j` when the W fragments do not come from the
    /// staged `sb` (then no `sb` or `put_b` exists).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn expand_with(
        self,
        template: &str,
        kloop: &str,
        w_at: &str,
        w_format: WeightFormat,
        layout: BLayout,
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
                acc += &format!("    var acc_{i}_{j} = {}();\n", self.fragment_type("f32", "C"));
            }
        }
        let (f, fa_type, fb_type) = (self.fragment, self.fragment_type("f16", "A"), self.fragment_type("f16", "B"));
        let mut multiply = String::new();
        for kk in 0..self.bk / f {
            multiply += "        {\n";
            for i in 0..fm {
                multiply += &format!(
                    "            let ia{i} = (a_st + (sm + {}u) * KP + {}u) / {se}u;\n            let fa{i} = coopLoadT<{fa_type}>(&sa[ia{i}], stride_s);\n",
                    i * f,
                    kk * f
                );
            }
            if b_fragment.is_none() {
                for j in 0..fn_ {
                    let (jf, kf) = (j * f, kk * f);
                    multiply += &match layout {
                        BLayout::Nk | BLayout::NkPanels => format!(
                            "            let ib{j} = (b_st + (sn + {jf}u) * KP + {kf}u) / {se}u;\n            let fb{j} = coopLoad<{fb_type}>(&sb[ib{j}], stride_s);\n"
                        ),
                        BLayout::Kn => format!(
                            "            let ib{j} = (b_st + {kf}u * NP + sn + {jf}u) / {se}u;\n            let fb{j} = coopLoadT<{fb_type}>(&sb[ib{j}], stride_n);\n"
                        ),
                    };
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
        // W's storage and its conversion to the f16 stages, as the format defines them.
        let unit = self.w_unit(w_format, layout, b_fragment.is_some());
        let crate::format::CoopW { word: w_word, elem: w_elem, vec4s, fetch, put: mut put_w, pin_w } = unit;
        if b_fragment.is_some() {
            put_w.clear(); // it would name the absent `put_b`
        }
        assert!(w_format == WeightFormat::F16 || b_fragment.is_none(), "direct W fragments need F16 weights");
        let dst_w = match layout {
            BLayout::Nk | BLayout::NkPanels => "fn dst_w(e: u32) -> u32 {\n    return dst_of(e);\n}\n",
            BLayout::Kn => "fn dst_w(e: u32) -> u32 {\n    return (e / BN4) * NP + 4u * (e % BN4);\n}\n",
        };
        // The pins of the K loop's prefetches (coop_kloop.rs, prefetch): f16 vec4s into A's
        // stage, f32 ones into the scratch, as they are (W's through the format's `pin_w`).
        let pin_h = match self.staging {
            Staging::Vec4 => "fn pin_h(l: u32, v: vec4<f16>) {\n    sa[l] = v;\n}\n",
            Staging::Scalar => {
                "fn pin_h(l: u32, v: vec4<f16>) {\n    sa[4u * l] = v.x;\n    sa[4u * l + 1u] = v.y;\n    sa[4u * l + 2u] = v.z;\n    sa[4u * l + 3u] = v.w;\n}\n"
            }
        };
        let pin_f = "fn pin_f(l: u32, v: vec4<f32>) {\n    scratch[4u * l] = v.x;\n    scratch[4u * l + 1u] = v.y;\n    scratch[4u * l + 2u] = v.z;\n    scratch[4u * l + 3u] = v.w;\n}\n";
        let pin_a = "fn pin_a(l: u32, v: A_ELEM) {\n    PIN_A(l, v);\n}\n";
        let put = format!("{put}{fetch}{put_w}{dst_w}{pin_h}{pin_f}{pin_w}{pin_a}");
        let mut body = template.replace("//@KLOOP\n", &kloop.replace("W_AT", w_at));
        // Where the invocation's vec4 number e of a step goes in a stage, in halves.
        let put = format!("{put}fn dst_of(e: u32) -> u32 {{\n    return (e / BK4) * KP + 4u * (e % BK4);\n}}\n");
        body = body.replace("SELEM_TYPE", elem).replace("//@PUT\n", &put).replace("//@ACC\n", &acc).replace("//@MULTIPLY\n", &multiply);
        body = body.replace("W_WORD", w_word).replace("W_ELEM", w_elem).replace("FRAGMENT_SIDE", &format!("{f}u"));
        for (marker, text) in pieces {
            assert!(body.contains(marker), "template lacks {marker}");
            body = body.replace(marker, text);
        }
        let mut consts = self.prelude(vec4s);
        let stage = self.w_stage_halves(layout);
        consts.extend([("SBS", stage), ("SBL", 2 * stage / se)]);
        format!("enable f16;\nenable wgpu_cooperative_matrix;\n{}", with_prelude(&consts, &crate::gemm::unroll(&body, &consts)))
    }
}

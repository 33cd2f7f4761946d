//! How the row kernels reduce across their workgroup (one workgroup per row: `rmsnorm`, the fused
//! residual norms, `norm_rope`, the attention `softmax`, the router's top-k).
//!
//! - [`RowReduce::Tree`]: a tree through workgroup memory, `log2(WG)` barriers a reduction. Runs
//!   on every adapter.
//! - [`RowReduce::Subgroup`]: each subgroup reduces its values with subgroup operations, one
//!   value per subgroup goes through workgroup memory, and every invocation combines those in
//!   subgroup order: two barriers a reduction. Needs `wgpu::Features::SUBGROUP` (naga
//!   takes the subgroup builtins without an `enable subgroups;` directive, which it does not parse
//!   yet).
//!
//! Both give every invocation the same total. Maxima and argmaxima are exact either way; sums are
//! added in a different order, so the two variants' sums differ in the last bits (each is within
//! the kernels' tolerances of the CPU's, which the tests check for every variant the adapter
//! runs). The kernels that must agree bit for bit (a fused norm and the `rmsnorm` chain it
//! replaces) use the same variant.
//!
//! A kernel's template names the functions it needs with one `//@ROW_REDUCE` line, which
//! [`RowReduce::render`] replaces by the `RowLanes` struct (the builtins the reduction reads; the
//! entry point takes it as a parameter) and the [`Part`]s asked for:
//! - `row_sum(acc: RowSum, lanes: RowLanes) -> RowSum` ([`Part::Sum`], `RowSum` f32 or a vector);
//! - `row_max(v: f32, lanes) -> f32` and `row_argmax(v: f32, i: u32, lanes) -> ArgMax` (the strict
//!   maximum, ties to the lower index; [`Part::Max`]);
//! - `row_max_sum(m: f32, s: f32, lanes) -> vec2<f32>` (online-softmax `(max, sum)` pairs merged
//!   with the template's own `merge`; [`Part::Pair`]).
//!
//! Every function is called from uniform control flow by every invocation, and returns the total
//! to all of them.

/// The reduction a row kernel is rendered with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RowReduce {
    /// A tree through workgroup memory (every adapter).
    Tree,
    /// Subgroup operations, then one value per subgroup through workgroup memory (adapters with
    /// subgroups).
    Subgroup,
}

/// What a kernel's `//@ROW_REDUCE` line asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// `row_sum` over `RowSum` = this WGSL type (`"f32"`, `"vec2<f32>"`).
    Sum(&'static str),
    /// `row_max` and `row_argmax`.
    Max,
    /// `row_max_sum` (the template defines `merge(m1, s1, m2, s2) -> vec2<f32>`).
    Pair,
}

impl RowReduce {
    /// Both variants.
    pub const ALL: [RowReduce; 2] = [RowReduce::Tree, RowReduce::Subgroup];

    /// Suffix of a kernel name rendered with this reduction: none for the tree, `_sg`.
    pub fn suffix(self) -> &'static str {
        match self {
            RowReduce::Tree => "",
            RowReduce::Subgroup => "_sg",
        }
    }

    /// `template` with its `//@ROW_REDUCE` line replaced by the `RowLanes` struct and `parts`.
    pub fn render(self, template: &str, parts: &[Part]) -> String {
        assert!(template.contains("//@ROW_REDUCE\n"), "a row kernel without the row-reduce marker");
        let (lanes, sum, max, pair) = match self {
            RowReduce::Tree => {
                (TREE_LANES, include_str!("wgsl/row_sum.wgsl"), include_str!("wgsl/row_max.wgsl"), include_str!("wgsl/row_pair.wgsl"))
            }
            RowReduce::Subgroup => (
                SUBGROUP_LANES,
                include_str!("wgsl/row_sum_subgroup.wgsl"),
                include_str!("wgsl/row_max_subgroup.wgsl"),
                include_str!("wgsl/row_pair_subgroup.wgsl"),
            ),
        };
        // Each part's workgroup memory (and types), the same for both variants, then its functions.
        let mut text = lanes.to_string();
        for part in parts {
            match part {
                Part::Sum(ty) => text += &format!("alias RowSum = {ty};\n{SUM_SHARED}{sum}"),
                Part::Max => text += &format!("{MAX_SHARED}{max}"),
                Part::Pair => text += &format!("{PAIR_SHARED}{pair}"),
            }
        }
        template.replace("//@ROW_REDUCE\n", &text)
    }
}

/// [`Part::Sum`]'s workgroup memory: one slot per invocation (the tree) or per subgroup.
const SUM_SHARED: &str = "var<workgroup> partial: array<RowSum, WG>;\n";
/// [`Part::Max`]'s workgroup memory and result type.
const MAX_SHARED: &str =
    "var<workgroup> red_v: array<f32, WG>;\nvar<workgroup> red_i: array<u32, WG>;\n\nstruct ArgMax {\n    v: f32,\n    i: u32,\n}\n";
/// [`Part::Pair`]'s workgroup memory.
const PAIR_SHARED: &str = "var<workgroup> part_max: array<f32, WG>;\nvar<workgroup> part_sum: array<f32, WG>;\n";

const TREE_LANES: &str =
    "// The invocation's index in the workgroup (row_reduce.rs).\nstruct RowLanes {\n    @builtin(local_invocation_index) lane: u32,\n}\n";

const SUBGROUP_LANES: &str = "// The invocation's subgroup and its place in it (row_reduce.rs).\nstruct RowLanes {\n    @builtin(local_invocation_index) lane: u32,\n    @builtin(subgroup_invocation_id) sg_lane: u32,\n    @builtin(subgroup_id) sg: u32,\n    @builtin(num_subgroups) sgs: u32,\n}\n";

#[cfg(test)]
mod tests {
    use super::*;

    fn validate(wgsl: &str) {
        let module = naga::front::wgsl::parse_str(wgsl).unwrap_or_else(|e| panic!("{}", e.emit_to_string(wgsl)));
        naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all())
            .validate(&module)
            .unwrap_or_else(|e| panic!("{e:?}\n{wgsl}"));
    }

    /// Every part in both variants renders into a kernel naga accepts.
    #[test]
    fn every_part_renders_and_validates() {
        let template = "const WG: u32 = 64u;\nfn merge(m1: f32, s1: f32, m2: f32, s2: f32) -> vec2<f32> { return vec2<f32>(max(m1, m2), s1 + s2); }\n//@ROW_REDUCE\n\
                        @group(0) @binding(0) var<storage, read_write> out: array<f32>;\n\
                        @compute @workgroup_size(WG)\nfn main(lanes: RowLanes) {\n\
                        \x20   let v = f32(lanes.lane);\n\
                        \x20   let a = row_sum(v, lanes);\n    let b = row_max(v, lanes);\n    let c = row_argmax(v, lanes.lane, lanes);\n    let d = row_max_sum(v, 1.0, lanes);\n\
                        \x20   out[lanes.lane] = a + b + c.v + f32(c.i) + d.x + d.y;\n}\n";
        for reduce in RowReduce::ALL {
            validate(&reduce.render(template, &[Part::Sum("f32"), Part::Max, Part::Pair]));
        }
        let vec_template = "const WG: u32 = 64u;\n//@ROW_REDUCE\n@group(0) @binding(0) var<storage, read_write> out: array<f32>;\n\
                            @compute @workgroup_size(WG)\nfn main(lanes: RowLanes) {\n    out[0] = row_sum(vec2<f32>(1.0, 2.0), lanes).y;\n}\n";
        for reduce in RowReduce::ALL {
            validate(&reduce.render(vec_template, &[Part::Sum("vec2<f32>")]));
        }
    }

    #[test]
    #[should_panic(expected = "row-reduce marker")]
    fn a_template_without_the_marker_is_refused() {
        RowReduce::Tree.render("fn main() {}\n", &[Part::Max]);
    }
}

//! Hardware probes: timed measurements of dg's kernels and of the GPU itself (dispatch cost,
//! residency, the tensor cores' ceiling), printed line by line, for deciding how a kernel should
//! be shaped. They check nothing about dg's results beyond what a timed product needs to mean
//! something; `cargo xtask probe NAME` runs one, `cargo xtask probe --list` lists them ([`PROBES`]).

pub mod attention;
pub mod dispatch;
pub mod experts;
pub mod gemm;
pub mod streaming;
pub mod tensor_cores;
pub mod vocab;

use std::sync::Arc;

use dg_gpu::{GpuContext, GpuError};
use dg_kernels::KernelSource;
use dg_kernels::coop_gemm::{CoopTile, Split};

/// Seconds a throughput probe runs a plan before timing it ([`best_time`]): on an H200 the first
/// timings of a plan on freshly created buffers ran up to 4× slow, even right after a second of
/// other work.
pub const WARM_UP_SECONDS: f64 = 0.3;

/// The best wall time of one of a plan's `replays` dispatches over 5 submissions, in seconds, after
/// running the plan for [`WARM_UP_SECONDS`] (at least twice).
pub fn best_time(ctx: &GpuContext, plan: &dg_gpu::Plan, replays: u32) -> f64 {
    let start = std::time::Instant::now();
    for run in 0.. {
        plan.run(ctx).expect("a timed plan runs");
        if run >= 1 && start.elapsed().as_secs_f64() >= WARM_UP_SECONDS {
            break;
        }
    }
    (0..5)
        .map(|_| {
            let t = std::time::Instant::now();
            plan.run(ctx).expect("a timed plan runs");
            t.elapsed().as_secs_f64() / f64::from(replays)
        })
        .fold(f64::MAX, f64::min)
}

/// Why a probe could not run.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("no probe named `{name}` (known: {known})")]
    Unknown { name: String, known: String },
    #[error("probe {probe} needs cooperative matrices, which adapter {adapter} does not offer")]
    NoCoopMatrix { probe: &'static str, adapter: String },
    #[error(transparent)]
    Gpu(#[from] GpuError),
}

/// What the probes that take parameters measure (the others ignore it).
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeOptions {
    /// `m × n × k` shapes of [`gemm::gemm_throughput`].
    pub gemm_shapes: Vec<[u32; 3]>,
    /// Tokens, experts, top-k, hidden and expert width of [`gemm::grouped_gemm_throughput`].
    pub grouped: [usize; 5],
    /// Dispatches a submit in the GEMM probes.
    pub reps: u32,
}

impl Default for ProbeOptions {
    fn default() -> Self {
        ProbeOptions { gemm_shapes: vec![[256, 1024, 1024]], grouped: [64, 32, 8, 512, 128], reps: 3 }
    }
}

/// A probe's entry point.
pub type ProbeFn = fn(&GpuContext, &ProbeOptions) -> Result<(), ProbeError>;

/// One probe: its name on the command line, a line saying what it measures, whether it needs
/// cooperative matrices, and its entry point.
#[derive(Debug, Clone, Copy)]
pub struct Probe {
    pub name: &'static str,
    pub about: &'static str,
    pub needs_coop: bool,
    run: ProbeFn,
}

impl Probe {
    /// Runs the probe on `ctx`; refuses, naming the adapter, when it needs cooperative matrices
    /// that `ctx` does not offer.
    pub fn run(&self, ctx: &GpuContext, options: &ProbeOptions) -> Result<(), ProbeError> {
        if self.needs_coop && !ctx.coop_matrix {
            return Err(ProbeError::NoCoopMatrix { probe: self.name, adapter: ctx.info.name.clone() });
        }
        (self.run)(ctx, options)
    }
}

const fn probe(name: &'static str, about: &'static str, needs_coop: bool, run: ProbeFn) -> Probe {
    Probe { name, about, needs_coop, run }
}

/// Every probe, by name.
pub const PROBES: &[Probe] = &[
    probe("gemm_throughput", "f32 GEMM, every tile, over the given shapes: ms and GFLOP/s", false, gemm::gemm_throughput),
    probe(
        "grouped_gemm_throughput",
        "f32 grouped (experts) GEMM, every tile, over a skewed routing: ms and GFLOP/s",
        false,
        gemm::grouped_gemm_throughput,
    ),
    probe(
        "dispatch_floor_probe",
        "what a dispatch costs by itself, dependent on the one before or not, by workgroups",
        false,
        dispatch::dispatch_floor_probe,
    ),
    probe(
        "dispatch_overhead_probe",
        "one dependent dispatch after another, µs each by workgroups",
        false,
        dispatch::dispatch_overhead_probe,
    ),
    probe(
        "workgroup_residency_probe",
        "workgroups a multiprocessor runs side by side, by workgroup memory",
        false,
        dispatch::workgroup_residency_probe,
    ),
    probe(
        "coop_grouped_gemm_throughput_at_the_real_expert_shapes",
        "the experts' tensor-core product at the real shapes: every candidate tile, residency, empty grid, W streamed alone, active experts",
        true,
        experts::coop_grouped_gemm_throughput_at_the_real_expert_shapes,
    ),
    probe(
        "bytes_in_flight_probe",
        "the experts' weights streamed alone, by the K steps a workgroup keeps in flight and the workgroups a multiprocessor runs",
        false,
        streaming::bytes_in_flight_probe,
    ),
    probe(
        "vocab_product_layouts_probe",
        "the head by how the embedding is stored (BF16 rows, F16 rows, F16 K panels), the soft embedding by its probabilities in f32 or f16",
        true,
        vocab::vocab_product_layouts_probe,
    ),
    probe(
        "f16_activations_throughput_at_the_real_shapes",
        "experts and dense projections with f32 against f16 activations",
        true,
        experts::f16_activations_throughput_at_the_real_shapes,
    ),
    probe(
        "dense_wide_subgroups_probe",
        "the dense projections and a quarter of the head in 4 subgroups of 64 x 64 with f16 activations, against the forward's tile",
        true,
        experts::dense_wide_subgroups_probe,
    ),
    probe(
        "experts_wave_probe",
        "the experts' products over a sweep of expert counts: the last wave of workgroups",
        true,
        experts::experts_wave_probe,
    ),
    probe(
        "dense_tensor_core_throughput_by_tile_and_split",
        "the decoder's dense products on the tensor cores by tile and K split",
        true,
        tensor_cores::dense_tensor_core_throughput_by_tile_and_split,
    ),
    probe(
        "tensor_core_step_ceiling_probe",
        "what bounds a tensor-core workgroup's K step (loads, products, staging)",
        true,
        tensor_cores::tensor_core_step_ceiling_probe,
    ),
    probe(
        "tensor_core_operand_traffic_probe",
        "what the operands' traffic costs: f16 A, W in panels, loads removed",
        true,
        tensor_cores::tensor_core_operand_traffic_probe,
    ),
    probe(
        "tensor_core_peak_probe",
        "the tensor cores' own ceiling through WGSL cooperative matrices: TFLOP/s",
        true,
        tensor_cores::tensor_core_peak_probe,
    ),
    probe(
        "attention_products_probe",
        "the decoder's attention products at the real shapes: per K step and per workgroup, by keys, head size and tile",
        true,
        attention::attention_products_probe,
    ),
    probe(
        "barrier_drain_probe",
        "whether a workgroup barrier waits for global loads still in flight",
        true,
        tensor_cores::barrier_drain_probe,
    ),
];

/// The probe named `name`.
pub fn find(name: &str) -> Result<&'static Probe, ProbeError> {
    PROBES
        .iter()
        .find(|p| p.name == name)
        .ok_or_else(|| ProbeError::Unknown { name: name.to_string(), known: PROBES.iter().map(|p| p.name).collect::<Vec<_>>().join(", ") })
}

/// [`best_time`] of `replays` dispatches of one kernel with the same parameters and buffers.
fn time_dispatch<P: bytemuck::Pod>(
    ctx: &GpuContext,
    pipeline: &Arc<dg_gpu::Pipeline>,
    params: &P,
    buffers: &[&wgpu::Buffer],
    groups: [u32; 3],
    replays: u32,
) -> Result<f64, ProbeError> {
    let mut plan = dg_gpu::PlanBuilder::new(ctx);
    for _ in 0..replays {
        plan.push(pipeline, params, buffers, groups);
    }
    Ok(best_time(ctx, &plan.finish(ctx)?, replays))
}

/// [`best_time`] of `replays` runs of the product `p` on `tile` (its partials reduced where
/// `split` cuts K), through `dg_parity::testing::push_product`.
fn time_product(
    ctx: &GpuContext,
    kernels: (&Arc<dg_gpu::Pipeline>, &Arc<dg_gpu::Pipeline>),
    tile: CoopTile,
    p: &dg_kernels::gemm::GemmParams,
    split: Split,
    buffers: [&wgpu::Buffer; 4],
) -> Result<f64, ProbeError> {
    let replays = 20;
    let mut plan = dg_gpu::PlanBuilder::new(ctx);
    for _ in 0..replays {
        dg_parity::testing::push_product(&mut plan, kernels, tile, p, split, buffers);
    }
    Ok(best_time(ctx, &plan.finish(ctx)?, replays))
}

/// The indices `0..n` in the order of `round`: ascending in even rounds, descending in odd ones
/// (a probe's variants timed twice in opposite orders, since single timings can be far off).
fn alternating(round: u32, n: usize) -> Vec<usize> {
    if round.is_multiple_of(2) { (0..n).collect() } else { (0..n).rev().collect() }
}

/// `k` on `tile` cut into `splits` ranges as even as its K steps allow (1: whole).
fn split_into(tile: CoopTile, k: u32, splits: u32) -> Split {
    let steps = k / tile.bk;
    let per = steps.div_ceil(splits);
    Split { splits: steps.div_ceil(per), steps: per }
}

/// `src` with every `(from, to)` replacement made; panics when one is not found (the probe would
/// time the unchanged kernel: a bug in the probe, not in its input).
fn replaced(src: &KernelSource, tag: &str, edits: &[(&str, &str)]) -> KernelSource {
    let mut wgsl = src.wgsl.clone();
    for (from, to) in edits {
        assert!(wgsl.contains(from), "{tag}: `{from}` not in {}", src.name);
        wgsl = wgsl.replace(from, to);
    }
    KernelSource { name: format!("{}_{tag}", src.name), wgsl, ..src.clone() }
}

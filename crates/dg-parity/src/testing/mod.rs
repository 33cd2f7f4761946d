//! Support for the GPU tests, the benches and the probes: opening the test device (with the
//! lavapipe hint or a visible SKIP; `DG_ALLOW_NO_GPU=1` skips), guard-banded outputs that catch
//! out-of-bounds writes, the committed fixtures' directories ([`fixture`]), seeded inputs, the CPU reference of a strided GEMM ([`gemm_reference`]),
//! and the recording of a tensor-core product ([`push_product`]); [`coop_experts`] and
//! [`half_activations`] hold the tensor-core products that tests (and dg-lab's probes) both run,
//! [`quant`] the quantized weights of the kernel tests.

pub mod coop_experts;
pub mod half_activations;
pub mod quant;

use dg_gpu::GpuError;
use dg_gpu::{GpuContext, GpuOptions};

/// Pushes one dense tensor-core product `p` of `a` and `b` into `c` (every one of its batches, a
/// workgroup row each): whole when `split` has one range, else its partials into `scratch` and
/// the reduction (`reduce`) into `c`.
pub fn push_product<'a>(
    plan: &mut dg_gpu::PlanBuilder<'a>,
    (kernel, reduce): (&std::sync::Arc<dg_gpu::Pipeline>, &std::sync::Arc<dg_gpu::Pipeline>),
    tile: dg_kernels::coop_gemm::CoopTile,
    p: &dg_kernels::gemm::GemmParams,
    split: dg_kernels::coop_gemm::Split,
    [a, b, scratch, c]: [&'a wgpu::Buffer; 4],
) {
    use dg_kernels::{coop_gemm, split_k};
    if split.splits > 1 {
        plan.push(kernel, &split.partial_params(p), &[a, b, scratch], coop_gemm::workgroups_split(tile, p.m, p.n, p.batch, split.splits));
        let r = split.reduce_params(p);
        plan.push(reduce, &r, &[scratch, c], dg_gpu::groups_1d(split_k::workgroups(&r), 65535));
    } else {
        plan.push(kernel, p, &[a, b, c], coop_gemm::workgroups(tile, p.m, p.n, p.batch));
    }
}

/// Value written around every output so that a stray write shows.
pub const GUARD: f32 = -7.777e17;
/// Elements of guard band after each output.
pub const GUARD_LEN: usize = 64;

/// The committed fixture `name`: under `DG_FIXTURES` where it is set (a test binary run away from
/// its checkout, as on a separate GPU machine), else in the repository's `fixtures/`.
pub fn fixture(name: &str) -> std::path::PathBuf {
    let root = std::env::var_os("DG_FIXTURES")
        .map_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures"), std::path::PathBuf::from);
    root.join(name)
}

/// The device for a test, chosen and tuned by the `DG_*` variables as `dg` would
/// (`GpuOptions::from_env`). With no adapter: `None` and a visible SKIP line when
/// `DG_ALLOW_NO_GPU=1`, otherwise a panic that says how to install lavapipe.
pub fn test_context(test: &str) -> Option<GpuContext> {
    let opts = GpuOptions::from_env().unwrap_or_else(|e| panic!("{test}: {e}"));
    match GpuContext::new(&opts) {
        Ok(ctx) => Some(ctx),
        Err(e @ GpuError::NoAdapter { .. }) => {
            if std::env::var("DG_ALLOW_NO_GPU").as_deref() == Ok("1") {
                eprintln!("SKIP {test}: {e}");
                None
            } else {
                panic!("{test}: {e} (or set DG_ALLOW_NO_GPU=1 to skip GPU tests)");
            }
        }
        Err(e) => panic!("{test}: {e}"),
    }
}

/// Set to 1, a test of the tensor-core kernels fails where the device has no cooperative matrices
/// instead of skipping (`.ci/run` sets it where it runs them on lavapipe: `tools/lavapipe-coop.sh`).
pub const REQUIRE_TENSOR_CORES: &str = "DG_REQUIRE_TENSOR_CORES";

/// The device for a test of the tensor-core kernels: [`test_context`] when it runs them
/// ([`GpuContext::coop_matrix`]), otherwise `None` and a visible SKIP line (Debian 12's lavapipe
/// has no cooperative matrices; the f32 kernels run there instead), or a failure under
/// [`REQUIRE_TENSOR_CORES`].
pub fn coop_test_context(test: &str) -> Option<GpuContext> {
    let ctx = test_context(test)?;
    if !ctx.coop_matrix {
        let why = format!("adapter {} has no cooperative matrices (the f32 kernels run instead)", ctx.info.name);
        assert!(std::env::var(REQUIRE_TENSOR_CORES).as_deref() != Ok("1"), "{test}: {why}, and {REQUIRE_TENSOR_CORES}=1");
        eprintln!("SKIP {test}: {why}");
        return None;
    }
    Some(ctx)
}

/// The device for a test of the Vulkan-native kernels: [`coop_test_context`] where it runs some
/// ([`GpuContext::native`]), otherwise `None` and a visible SKIP line, or a failure under
/// [`REQUIRE_TENSOR_CORES`] (lavapipe with cooperative matrices runs them: 8×8×8 fragments).
pub fn native_test_context(test: &str) -> Option<GpuContext> {
    let ctx = coop_test_context(test)?;
    if ctx.native.is_empty() {
        let why = format!("adapter {} runs no native kernels (not Vulkan, no SPIR-V passthrough, or no fragment they take)", ctx.info.name);
        assert!(std::env::var(REQUIRE_TENSOR_CORES).as_deref() != Ok("1"), "{test}: {why}, and {REQUIRE_TENSOR_CORES}=1");
        eprintln!("SKIP {test}: {why}");
        return None;
    }
    Some(ctx)
}

/// The device for a test of the native kernel's int8 mode: [`test_context`]'s device with the
/// native kernels and their int8 mode asked for (`Tuning::native`, `Tuning::int8`: the mode is
/// off by default and changes the numerics, so the other tests of a run never take it) where the
/// driver lists 8-bit fragments ([`GpuContext::int8`]); otherwise `None` and a visible SKIP line,
/// or a failure under [`REQUIRE_TENSOR_CORES`] (lavapipe with cooperative matrices offers 8×8×8
/// `s8` fragments).
pub fn int8_test_context(test: &str) -> Option<GpuContext> {
    let mut opts = GpuOptions::from_env().unwrap_or_else(|e| panic!("{test}: {e}"));
    opts.tuning.native = true;
    opts.tuning.int8 = true;
    let ctx = match GpuContext::new(&opts) {
        Ok(ctx) => ctx,
        Err(e @ GpuError::NoAdapter { .. }) if std::env::var("DG_ALLOW_NO_GPU").as_deref() == Ok("1") => {
            eprintln!("SKIP {test}: {e}");
            return None;
        }
        Err(e) => panic!("{test}: {e} (or set DG_ALLOW_NO_GPU=1 to skip GPU tests)"),
    };
    if ctx.int8.is_empty() {
        let why = format!("adapter {} runs no int8 native kernel (no s8 cooperative-matrix fragment it takes)", ctx.info.name);
        assert!(std::env::var(REQUIRE_TENSOR_CORES).as_deref() != Ok("1"), "{test}: {why}, and {REQUIRE_TENSOR_CORES}=1");
        eprintln!("SKIP {test}: {why}");
        return None;
    }
    Some(ctx)
}

/// `tile` in the fragments of `ctx`'s tensor cores ([`GpuContext::coop_fragment`]), as the
/// planner hands tiles out: for tests that run a tile of their own choosing.
pub fn on_device(ctx: &GpuContext, tile: dg_kernels::coop_gemm::CoopTile) -> dg_kernels::coop_gemm::CoopTile {
    tile.with_fragment(ctx.coop_fragment)
}

/// A storage buffer holding `len` values initialised to [`GUARD`], plus a guard band.
pub fn guarded_output(ctx: &GpuContext, label: &str, len: usize) -> wgpu::Buffer {
    ctx.upload(label, &vec![GUARD; len + GUARD_LEN]).expect("allocating a test output")
}

/// Reads `len` values back and asserts the guard band after them is intact.
pub fn read_guarded(ctx: &GpuContext, buffer: &wgpu::Buffer, len: usize) -> Vec<f32> {
    let all = ctx.read_f32(buffer, 0, len + GUARD_LEN).expect("readback");
    if let Some(i) = all[len..].iter().position(|&v| v != GUARD) {
        panic!("out-of-bounds write {} elements past the end of a {len}-element output", i);
    }
    all[..len].to_vec()
}

/// Deterministic pseudo-random values in [-scale, scale).
pub fn seeded(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

/// Slot counts of `groups` experts like a top-k routing of `tokens` tokens: about
/// `tokens·k/groups` each, skewed (some experts empty, a few with twice the mean).
pub fn skewed_counts(groups: usize, tokens: usize, k: usize) -> Vec<u32> {
    let weights: Vec<f32> = seeded(groups, 77, 1.0).iter().map(|v| (v + 1.0) * (v + 1.0)).collect();
    let total: f32 = weights.iter().sum();
    let mut counts: Vec<u32> = weights.iter().map(|w| (w / total * (tokens * k) as f32) as u32).collect();
    counts[3] = 0;
    counts
}

/// Max |a − b| relative to max |b|, and the index where |a − b| peaks; NaN and the index of the
/// first non-finite difference where there is one (so that no tolerance accepts it).
pub fn max_rel_err(a: &[f32], b: &[f32]) -> (f32, usize) {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-30);
    let (mut worst, mut at) = (0f32, 0);
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        let d = (x - y).abs();
        if !d.is_finite() {
            return (f32::NAN, i);
        }
        if d > worst {
            worst = d;
            at = i;
        }
    }
    (worst / scale, at)
}

/// Random cached K/V for every layer of `cfg` as the decoder sees a `context`-token prompt
/// (sliding layers: the last W−1 tokens), for benchmarks at a given geometry.
pub fn random_context(cfg: &dg_model::TextConfig, context: usize) -> Vec<(Vec<f32>, Vec<f32>)> {
    cfg.layers
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let tokens = match l.kind {
                dg_model::LayerKind::Sliding => context.min(cfg.sliding_kept()),
                dg_model::LayerKind::Full => context,
            };
            let n = tokens * l.num_kv_heads * l.head_dim;
            (seeded(n, 2 * i as u64 + 1, 1.0), seeded(n, 2 * i as u64 + 2, 1.0))
        })
        .collect()
}

/// Largest element index a strided GEMM operand touches, plus one (`offset` when it is empty).
pub fn gemm_extent(offset: u32, batches: u32, batch_stride: u32, rows: u32, rs: u32, cols: u32, cs: u32) -> usize {
    if batches == 0 || rows == 0 || cols == 0 {
        return offset as usize;
    }
    let last = offset as usize
        + (batches - 1) as usize * batch_stride as usize
        + (rows - 1) as usize * rs as usize
        + (cols - 1) as usize * cs as usize;
    last + 1
}

/// The expected contents of the whole C buffer after `dg_kernels::gemm` with `p` on `a`, `b` and C
/// initially `c0`, computed with dg-cpu's matmul (alpha, accumulate and the softcap epilogue
/// included).
pub fn gemm_reference(p: &dg_kernels::gemm::GemmParams, a: &[f32], b: &[f32], c0: &[f32]) -> Vec<f32> {
    use dg_cpu::linalg::{Threads, View, matmul};
    let (m, n, k) = (p.m as usize, p.n as usize, p.k as usize);
    let mut want = c0.to_vec();
    let mut prod = vec![0f32; m * n];
    for bi in 0..p.batch as usize {
        let g = bi / p.b_batch_div.max(1) as usize;
        let a_at = p.a_offset as usize + bi * p.a_batch as usize;
        let b_at = p.b_offset as usize + g * p.b_batch as usize;
        let av = View { data: &a[a_at.min(a.len())..], rows: m, cols: k, row_stride: p.a_rs as usize, col_stride: p.a_cs as usize };
        let bv = View { data: &b[b_at.min(b.len())..], rows: k, cols: n, row_stride: p.b_rs as usize, col_stride: p.b_cs as usize };
        matmul(&mut prod, n, av, bv, false, Threads::All);
        for i in 0..m {
            for j in 0..n {
                let at = p.c_offset as usize + bi * p.c_batch as usize + i * p.c_rs as usize + j;
                let mut v = p.alpha * prod[i * n + j];
                if p.accumulate != 0 {
                    v += c0[at];
                }
                if p.epilogue == dg_kernels::gemm::EPILOGUE_SOFTCAP {
                    v = (v / p.cap).tanh() * p.cap;
                }
                want[at] = v;
            }
        }
    }
    want
}

/// GEMM parameters of attention scores over strided heads: Q `[t, heads, d]`, K `[s, kv_heads, d]`,
/// heads / kv_heads query heads per KV head; `[heads, t, s] = Q_h·K_{h/g}ᵀ · scale`.
pub fn attention_scores_params(t: u32, s: u32, d: u32, heads: u32, kv_heads: u32, scale: f32) -> dg_kernels::gemm::GemmParams {
    let p = dg_gpu::ops::attention_scores_params(t as usize, s as usize, d as usize, heads as usize, kv_heads as usize);
    dg_kernels::gemm::GemmParams { alpha: scale, ..p }
}

/// GEMM parameters of probabilities `[heads, t, s]` · V_{h/g} `[s, kv_heads, d]` into `[t, heads, d]`.
pub fn attention_values_params(t: u32, s: u32, d: u32, heads: u32, kv_heads: u32) -> dg_kernels::gemm::GemmParams {
    dg_gpu::ops::attention_values_params(t as usize, s as usize, d as usize, heads as usize, kv_heads as usize)
}

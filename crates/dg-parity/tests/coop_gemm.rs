//! The tensor-core GEMM (`dg_kernels::coop_gemm`), every tile of `coop_gemm::TILES`, on the
//! decoder's 256-row linear shapes against the exact product, on a device with cooperative
//! matrices (elsewhere, lavapipe for one, a visible SKIP). Timings by tile, K split and W path:
//! `cargo xtask probe dense_tensor_core_throughput_by_tile_and_split`.

use dg_gpu::{Pipelines, PlanBuilder};
use dg_kernels::WeightFormat;
use dg_kernels::coop_gemm::{self, BLayout, Staging, TILES, WPath};
use dg_kernels::gemm::GemmParams;
use dg_parity::testing::{GUARD, coop_test_context, guarded_output, max_rel_err, on_device, read_guarded, seeded};

/// The decoder's 256-row linear layers the kernel is checked on, `(m, n, k)`.
const SHAPES: [(u32, u32, u32); 2] = [(256, 4096, 2816), (256, 2816, 4096)];

/// Tolerance on max |C − C_ref| / max |C_ref| against the exact (f64) product of the f16-rounded
/// inputs. Products of two f16 values are exact in f32 (11-bit significands), so the only error is
/// the f32 accumulation of k of them: about ε·√k of the largest output on random data, with the
/// tensor cores adding fragment by fragment and possibly truncating rather than rounding their
/// partial sums (ε = 2⁻²³ rather than 2⁻²⁴). 16·ε·√k (1.2e-4 at k = 4096) leaves a wide margin
/// while any indexing or staging bug gives errors of order 1.
fn tolerance(k: u32) -> f32 {
    16.0 * f32::EPSILON * (k as f32).sqrt()
}

/// Bound on the error against the f64 product of the f32 activations (not rounded) with the
/// f16-rounded weights: what rounding the activations to f16 costs, ~2⁻¹² relative per element,
/// a random walk over k (printed; the bound only catches a conversion gone badly wrong).
const ACTIVATION_ROUNDING_BOUND: f32 = 1e-2;

fn f16_round(v: &[f32]) -> Vec<f32> {
    v.iter().map(|&x| half::f16::from_f32(x).to_f32()).collect()
}

/// Exact references (f64 sums of products that f64 holds exactly), `[m, n]` row-major: the
/// product of the f16-rounded activations with W, and of the f32 activations with W.
fn references((m, n, k): (u32, u32, u32), a: &[f32], w: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let (m, n, k) = (m as usize, n as usize, k as usize);
    let a_rounded = f16_round(a);
    let mut rounded = vec![0f32; m * n];
    let mut plain = vec![0f32; m * n];
    let threads = std::thread::available_parallelism().map_or(4, |t| t.get()).min(m);
    let rows_per = m.div_ceil(threads);
    std::thread::scope(|s| {
        for ((chunk_r, chunk_p), r0) in rounded.chunks_mut(rows_per * n).zip(plain.chunks_mut(rows_per * n)).zip((0..m).step_by(rows_per)) {
            let ar = &a_rounded;
            s.spawn(move || {
                for (ri, (out_r, out_p)) in chunk_r.chunks_mut(n).zip(chunk_p.chunks_mut(n)).enumerate() {
                    let i = r0 + ri;
                    let (arow, arow_r) = (&a[i * k..(i + 1) * k], &ar[i * k..(i + 1) * k]);
                    for j in 0..n {
                        let wrow = &w[j * k..(j + 1) * k];
                        let (mut sr, mut sp) = ([0f64; 4], [0f64; 4]);
                        for p in (0..k).step_by(4) {
                            for l in 0..4 {
                                sr[l] += f64::from(arow_r[p + l]) * f64::from(wrow[p + l]);
                                sp[l] += f64::from(arow[p + l]) * f64::from(wrow[p + l]);
                            }
                        }
                        out_r[j] = (sr[0] + sr[1] + sr[2] + sr[3]) as f32;
                        out_p[j] = (sp[0] + sp[1] + sp[2] + sp[3]) as f32;
                    }
                }
            });
        }
    });
    (rounded, plain)
}

#[test]
fn coop_gemm_matches_the_exact_product_on_decoder_shapes() {
    let test = "coop_gemm_matches_the_exact_product_on_decoder_shapes";
    let Some(ctx) = coop_test_context(test) else { return };
    let mut pipelines = Pipelines::default();
    let mut failures = Vec::new();
    for shape in SHAPES {
        let (m, n, k) = shape;
        let a = seeded((m * k) as usize, 1 + u64::from(n), 1.0);
        let w = f16_round(&seeded((n * k) as usize, 2 + u64::from(k), 1.0));
        let (want, want_plain) = references(shape, &a, &w);
        let ab = ctx.upload("a", &a).unwrap();
        let wb = ctx.upload("w", &dg_kernels::pack_f16(&w)).unwrap();
        let len = (m * n) as usize;
        let tol = tolerance(k);
        // The plainest staging first: a driver that rejects a variant reports it before the others.
        let mut tiles = TILES.to_vec();
        tiles.sort_by_key(|t| t.staging != Staging::Scalar);
        for tile in tiles {
            let name = format!("{m}x{n}x{k} tile {}", tile.label());
            if !tile.fits(m, n, k) || tile.dense_shared_bytes() > ctx.limits.max_compute_workgroup_storage_size {
                eprintln!("  {name}: does not fit the shape or this device, skipped");
                continue;
            }
            let pipeline = match pipelines
                .get_source(&ctx, coop_gemm::source_for(on_device(&ctx, tile), WPath::Staged, WeightFormat::F16, BLayout::Nk))
            {
                Ok(p) => p,
                Err(e) => {
                    failures.push(format!("{name}: compile: {e}"));
                    continue;
                }
            };
            let cb = guarded_output(&ctx, "c", len);
            let mut plan = PlanBuilder::new(&ctx);
            plan.push(&pipeline, &GemmParams::linear(m, n, k), &[&ab, &wb, &cb], coop_gemm::workgroups(tile, m, n, 1));
            plan.finish(&ctx).unwrap().run(&ctx).unwrap();
            let got = read_guarded(&ctx, &cb, len);
            let unwritten = got.iter().filter(|&&v| v == GUARD).count();
            let non_finite = got.iter().filter(|v| !v.is_finite()).count();
            let (err, at) = max_rel_err(&got, &want);
            let (err_plain, _) = max_rel_err(&got, &want_plain);
            eprintln!(
                "  {name}: max rel err {err:.3e} (tolerance {tol:.3e}; at [{}, {}]: {} vs {}), vs f32 activations {err_plain:.3e}, unwritten {unwritten}, non-finite {non_finite}",
                at / n as usize,
                at % n as usize,
                got[at],
                want[at]
            );
            // (A NaN output counts as non-finite, so the error comparisons may ignore NaN.)
            if unwritten > 0 || non_finite > 0 || err > tol || err_plain > ACTIVATION_ROUNDING_BOUND {
                failures.push(format!(
                    "{name}: err {err:.3e}, vs f32 activations {err_plain:.3e}, unwritten {unwritten}, non-finite {non_finite}"
                ));
            }
        }
    }
    assert!(failures.is_empty(), "coop gemm failures:\n{}", failures.join("\n"));
}

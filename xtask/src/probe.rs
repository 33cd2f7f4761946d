//! `cargo xtask probe NAME`: runs one hardware probe of `dg_lab::probe` (timings of dg's
//! kernels and of the GPU itself, printed line by line) on the default adapter; `--list` lists
//! them with what each measures and whether it needs cooperative matrices.
//!
//! `--shapes MxNxK,...`, `--grouped tokens,experts,top_k,hidden,expert_width` and `--reps N` set
//! what the GEMM probes measure (`gemm_throughput`, `grouped_gemm_throughput`).

use anyhow::{Context, Result, bail};
use dg_gpu::GpuContext;
use dg_lab::probe::{self, PROBES, ProbeOptions};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The probe to run (`--list` names them).
    name: Option<String>,
    /// List the probes and exit.
    #[arg(long)]
    list: bool,
    /// GEMM shapes of `gemm_throughput`, `MxNxK` separated by commas.
    #[arg(long, default_value = "256x1024x1024")]
    shapes: String,
    /// Geometry of `grouped_gemm_throughput`: tokens,experts,top_k,hidden,expert_width (the real
    /// model: 256,128,8,2816,704).
    #[arg(long, default_value = "64,32,8,512,128")]
    grouped: String,
    /// Dispatches a submit in the GEMM probes (more on a fast GPU, to amortise submit and wait).
    #[arg(long, default_value_t = 3)]
    reps: u32,
}

/// `--shapes`: `MxNxK` triples separated by commas.
fn parse_shapes(text: &str) -> Result<Vec<[u32; 3]>> {
    text.split(',')
        .map(|shape| {
            let dims: Vec<u32> = shape
                .trim()
                .split('x')
                .map(|d| d.parse())
                .collect::<Result<_, _>>()
                .with_context(|| format!("--shapes: `{shape}` is not MxNxK"))?;
            match dims[..] {
                [m, n, k] if m > 0 && n > 0 && k > 0 => Ok([m, n, k]),
                _ => bail!("--shapes: `{shape}` is not MxNxK with three dimensions over 0"),
            }
        })
        .collect()
}

/// `--grouped`: five counts over 0, separated by commas.
fn parse_grouped(text: &str) -> Result<[usize; 5]> {
    let v: Vec<usize> = text
        .split(',')
        .map(|d| d.trim().parse())
        .collect::<Result<_, _>>()
        .with_context(|| format!("--grouped: `{text}` is not five numbers"))?;
    match v[..] {
        [tokens, experts, top_k, hidden, width] if v.iter().all(|&d| d > 0) && top_k <= experts && experts > 3 => {
            Ok([tokens, experts, top_k, hidden, width])
        }
        _ => bail!("--grouped: `{text}` is not tokens,experts,top_k,hidden,expert_width (all over 0, top_k ≤ experts, at least 4 experts)"),
    }
}

pub fn run(args: Args) -> Result<bool> {
    if args.list {
        for p in PROBES {
            println!("{:<56} {}{}", p.name, p.about, if p.needs_coop { " [cooperative matrices]" } else { "" });
        }
        return Ok(true);
    }
    let Some(name) = args.name else { bail!("name a probe, or --list to list them") };
    let probe = probe::find(&name)?;
    let options = ProbeOptions { gemm_shapes: parse_shapes(&args.shapes)?, grouped: parse_grouped(&args.grouped)?, reps: args.reps.max(1) };
    let ctx = GpuContext::new(&dg_lab::overrides::gpu_options_from_env()?).context("opening the GPU")?;
    println!("probe {} on {}", probe.name, ctx.info.name);
    probe.run(&ctx, &options)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_names_are_unique_and_found() {
        for (i, p) in PROBES.iter().enumerate() {
            assert!(PROBES[..i].iter().all(|q| q.name != p.name), "{} listed twice", p.name);
            assert_eq!(probe::find(p.name).unwrap().name, p.name);
        }
        let err = probe::find("gemm_thruput").unwrap_err().to_string();
        assert!(err.contains("gemm_thruput") && err.contains("gemm_throughput"), "{err}");
    }

    #[test]
    fn bad_shapes_and_geometries_are_errors_naming_them() {
        assert_eq!(parse_shapes("256x1024x1024, 1x2x3").unwrap(), vec![[256, 1024, 1024], [1, 2, 3]]);
        for bad in ["256x1024", "256x0x4", "axbxc", ""] {
            let err = parse_shapes(bad).unwrap_err().to_string();
            assert!(err.contains("--shapes"), "{bad}: {err}");
        }
        assert_eq!(parse_grouped("64,32,8,512,128").unwrap(), [64, 32, 8, 512, 128]);
        for bad in ["64,32,8,512", "64,4,8,512,128", "64,0,1,512,128", "x"] {
            let err = parse_grouped(bad).unwrap_err().to_string();
            assert!(err.contains("--grouped"), "{bad}: {err}");
        }
    }
}

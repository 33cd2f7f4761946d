//! `cargo xtask bench [--quick]`: runs the criterion benchmarks of dg-cpu, dg-sampler and dg-gpu
//! and prints one table of their results (read from criterion's `estimates.json` files).
//! `--quick` runs tiny sizes with short measurement windows: a smoke test fit for CI.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Tiny sizes and short measurements (CI smoke test).
    #[arg(long)]
    quick: bool,
    /// Only benchmarks whose name contains this.
    #[arg(long)]
    filter: Option<String>,
}

/// The criterion bench targets (named, so that libtest's own bench harnesses of the library
/// targets, which reject criterion's options, are not run).
const BENCHES: [(&str, &str); 4] =
    [("dg-cpu", "canvas_forward"), ("dg-cpu", "ops"), ("dg-sampler", "sampler_step"), ("dg-gpu", "gpu_forward")];

pub fn run(args: Args) -> Result<bool> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let criterion_dir = root.join("target/criterion");
    let _ = std::fs::remove_dir_all(&criterion_dir);
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(&root).arg("bench");
    for (package, _) in BENCHES {
        cmd.args(["-p", package]);
    }
    for (_, bench) in BENCHES {
        cmd.args(["--bench", bench]);
    }
    cmd.arg("--");
    if let Some(f) = &args.filter {
        cmd.arg(f);
    }
    if args.quick {
        cmd.env("DG_BENCH_QUICK", "1");
        cmd.args(["--warm-up-time", "0.1", "--measurement-time", "0.3", "--noplot"]);
    }
    let status = cmd.status().context("running cargo bench")?;
    if !status.success() {
        bail!("cargo bench failed ({status})");
    }
    let mut rows = Vec::new();
    collect(&criterion_dir, &mut rows)?;
    if rows.is_empty() {
        bail!("no benchmark results under {}", criterion_dir.display());
    }
    rows.sort_by(|a, b| a.0.cmp(&b.0));
    println!("\n| benchmark | mean | 95% interval |\n|---|---|---|");
    for (name, mean, lo, hi) in &rows {
        println!("| {name} | {} | {} – {} |", human(*mean), human(*lo), human(*hi));
    }
    println!("bench: {} benchmarks{}", rows.len(), if args.quick { " (quick)" } else { "" });
    Ok(true)
}

/// (group/function, mean, lower, upper) in nanoseconds from every `new/estimates.json`.
fn collect(dir: &Path, rows: &mut Vec<(String, f64, f64, f64)>) -> Result<()> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Ok(()) };
    for entry in entries.flatten() {
        let path: PathBuf = entry.path();
        let est = path.join("new/estimates.json");
        if est.exists() {
            let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&est)?)?;
            let mean = &v["mean"];
            let name = path.strip_prefix(dir.ancestors().find(|a| a.ends_with("criterion")).unwrap_or(dir))?.display().to_string();
            rows.push((
                name,
                mean["point_estimate"].as_f64().unwrap_or(f64::NAN),
                mean["confidence_interval"]["lower_bound"].as_f64().unwrap_or(f64::NAN),
                mean["confidence_interval"]["upper_bound"].as_f64().unwrap_or(f64::NAN),
            ));
        } else if path.is_dir() && path.file_name().is_some_and(|n| n != "report") {
            collect(&path, rows)?;
        }
    }
    Ok(())
}

fn human(ns: f64) -> String {
    match ns {
        n if n >= 1e9 => format!("{:.2} s", n / 1e9),
        n if n >= 1e6 => format!("{:.2} ms", n / 1e6),
        n if n >= 1e3 => format!("{:.2} µs", n / 1e3),
        n => format!("{n:.0} ns"),
    }
}

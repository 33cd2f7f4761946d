//! `cargo xtask load-memory -- CMD ARGS...`: runs a command and reports its peak anonymous
//! resident memory (`RssAnon` of /proc/PID/status, sampled every few milliseconds) and its peak
//! resident set (`VmHWM`, which also counts the pages of memory-mapped files it touched).
//!
//! Anonymous memory is what a loader allocates (copies, conversions, staging, and on a software
//! Vulkan driver the "device" buffers); a memory-mapped checkpoint's pages are file-backed and can
//! be dropped by the kernel at any time, so they are reported apart.

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Sampling period in milliseconds.
    #[arg(long, default_value_t = 5)]
    period_ms: u64,
    /// The command to run and its arguments.
    #[arg(trailing_var_arg = true, required = true)]
    command: Vec<String>,
}

/// A `/proc/PID/status` field in kB.
fn field_kb(status: &str, field: &str) -> Option<u64> {
    status.lines().find_map(|l| l.strip_prefix(field)?.trim().strip_suffix("kB")?.trim().parse().ok())
}

pub fn run(args: Args) -> Result<bool> {
    if !cfg!(target_os = "linux") {
        bail!("load-memory reads /proc and runs on Linux only");
    }
    let start = Instant::now();
    let mut child =
        Command::new(&args.command[0]).args(&args.command[1..]).spawn().with_context(|| format!("starting {}", args.command[0]))?;
    let status_path = format!("/proc/{}/status", child.id());
    let (mut peak_anon, mut peak_hwm) = (0u64, 0u64);
    let exit = loop {
        if let Ok(status) = std::fs::read_to_string(&status_path) {
            peak_anon = peak_anon.max(field_kb(&status, "RssAnon:").unwrap_or(0));
            peak_hwm = peak_hwm.max(field_kb(&status, "VmHWM:").unwrap_or(0));
        }
        if let Some(exit) = child.try_wait()? {
            break exit;
        }
        std::thread::sleep(Duration::from_millis(args.period_ms));
    };
    let gib = |kb: u64| kb as f64 / 1_048_576.0;
    println!(
        "peak anonymous RSS: {:.3} GiB ({peak_anon} kB); peak RSS with mapped files (VmHWM): {:.3} GiB; {:.1} s; {exit}",
        gib(peak_anon),
        gib(peak_hwm),
        start.elapsed().as_secs_f64()
    );
    Ok(exit.success())
}

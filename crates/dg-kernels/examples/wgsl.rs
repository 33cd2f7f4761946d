//! Prints the WGSL of dg's kernels, for reading what a planner key renders to (no HF module).
//!
//! `cargo run -p dg-kernels --example wgsl -- --list` lists every kernel's name
//! (`KernelKey::all`); `cargo run -p dg-kernels --example wgsl -- NAME` prints the source of
//! the kernel named exactly `NAME`, or of every kernel whose name contains it.

use std::process::ExitCode;

use dg_kernels::key::KernelKey;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [arg] = args.as_slice() else {
        eprintln!("usage: wgsl --list | wgsl NAME (a kernel's name, or a part of names)");
        return ExitCode::from(2);
    };
    let sources: Vec<_> = KernelKey::all().into_iter().map(KernelKey::source).collect();
    if arg == "--list" {
        for s in &sources {
            println!("{}", s.name);
        }
        return ExitCode::SUCCESS;
    }
    let exact: Vec<_> = sources.iter().filter(|s| s.name == *arg).collect();
    let chosen = if exact.is_empty() { sources.iter().filter(|s| s.name.contains(arg.as_str())).collect() } else { exact };
    if chosen.is_empty() {
        eprintln!("no kernel's name contains {arg:?} (`--list` lists them)");
        return ExitCode::FAILURE;
    }
    for s in chosen {
        println!("// ---- {} ----\n{}", s.name, s.wgsl);
    }
    ExitCode::SUCCESS
}

//! `cargo xtask`: the project's automation (matklad's cargo-xtask convention).
//!
//! `cargo xtask parity [--model DIR]... [--backend cpu|gpu|all]` checks reference directories.

mod parity;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "xtask", about = "dg project automation")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Check dg against HF transformers reference dumps (all committed fixtures by default).
    Parity(parity::Args),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Parity(args) => parity::run(args),
    };
    match result {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}

//! `dg`: generate text with DiffusionGemma (`dg generate`), describe a model and the GPU adapters
//! (`dg info`), quantize a model into a GGUF file (`dg quantize`), and serve a model over an
//! OpenAI-compatible HTTP API (`dg serve`).
//!
//! Exit status: 0 on success; 2 for usage and input errors (bad arguments, a missing or
//! incomplete model directory, no tokenizer without `--prompt-ids`, a token id outside the
//! vocabulary, a prompt too long for the model's positions, an unknown `--adapter`); 1 for
//! runtime failures (no GPU adapter for `--backend gpu`, device or model failures).

mod args;
mod backend;
mod batch_model;
mod chat;
mod display;
mod error;
mod footprint;
mod generate;
mod gguf_tokenizer;
mod images;
mod info;
mod load;
mod model_dir;
mod prompt;
mod prompts_file;
mod py_repr;
mod quantize;
mod read;
mod report;
mod schemes;
mod serve;
mod settings;
mod text;
mod timing;
mod weights;

use std::process::ExitCode;

use clap::Parser;

use crate::args::{Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Generate(args) => match args.prompts_file.clone() {
            Some(path) => prompts_file::run(&args, &path),
            None => generate::run(*args),
        },
        Command::Info(args) => info::run(args),
        Command::Quantize(args) => quantize::run(args),
        Command::Serve(args) => serve::run(*args),
        Command::Read(args) => read::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::from(error::exit_code(&err))
        }
    }
}

//! Backend choice: the f32 CPU reference, or the GPU (CPU encoder + GPU canvas forward through
//! wgpu). `auto` takes the GPU when wgpu finds an adapter and falls back to the CPU otherwise.

use anyhow::{Context, Result};
use dg_gpu::{GpuContext, GpuError, GpuOptions};

use crate::args::BackendArg;
use crate::error::{Input, input};

/// The backend to run on.
#[derive(Debug)]
pub enum Backend {
    Cpu,
    Gpu(Box<GpuContext>),
}

/// A backend and a line saying why it was chosen.
#[derive(Debug)]
pub struct Choice {
    pub backend: Backend,
    pub description: String,
}

impl Choice {
    pub fn name(&self) -> &'static str {
        match self.backend {
            Backend::Cpu => "cpu",
            Backend::Gpu(_) => "gpu",
        }
    }

    pub fn adapter(&self) -> Option<String> {
        match &self.backend {
            Backend::Cpu => None,
            Backend::Gpu(ctx) => Some(ctx.info.name.clone()),
        }
    }
}

/// Opens the backend `arg` asks for; `adapter` picks a GPU adapter by name (over `DG_ADAPTER`).
/// The GPU's options come from the `DG_*` variables (`GpuOptions::from_env`); a variable with a
/// bad value, or an unknown `DG_*` one, is an input error on any backend.
pub fn choose(arg: BackendArg, adapter: Option<&str>) -> Result<Choice> {
    let env = GpuOptions::from_env().map_err(|e| input(e.to_string()))?;
    match (arg, adapter) {
        (BackendArg::Cpu, Some(_)) => Err(input("--adapter selects a GPU adapter; it cannot be used with --backend cpu")),
        (BackendArg::Cpu, None) => Ok(Choice { backend: Backend::Cpu, description: "cpu (--backend cpu)".into() }),
        (BackendArg::Gpu, _) | (BackendArg::Auto, Some(_)) => {
            let ctx = open_gpu(adapter, env)?;
            let description = format!("gpu: {}", describe(&ctx));
            Ok(Choice { backend: Backend::Gpu(Box::new(ctx)), description })
        }
        (BackendArg::Auto, None) => match GpuContext::new(&env) {
            Ok(ctx) => {
                let description = format!("gpu: {} (default when an adapter exists; --backend cpu for the CPU)", describe(&ctx));
                Ok(Choice { backend: Backend::Gpu(Box::new(ctx)), description })
            }
            Err(GpuError::NoAdapter { .. }) => Ok(Choice { backend: Backend::Cpu, description: "cpu (no GPU adapter found)".into() }),
            Err(e) => Ok(Choice { backend: Backend::Cpu, description: format!("cpu (the GPU is unavailable: {e})") }),
        },
    }
}

fn open_gpu(adapter: Option<&str>, env: GpuOptions) -> Result<GpuContext> {
    match GpuContext::new(&GpuOptions { adapter: adapter.map(str::to_string).or(env.adapter), ..env }) {
        Ok(ctx) => Ok(ctx),
        Err(e @ GpuError::AdapterNotFound { .. }) => {
            let source = if adapter.is_some() { "--adapter" } else { "DG_ADAPTER" };
            Err(e).context(Input(source.into()))
        }
        Err(e) => Err(e).context("cannot open the GPU backend"),
    }
}

fn describe(ctx: &GpuContext) -> String {
    format!("{} ({:?}, {:?})", ctx.info.name, ctx.info.backend, ctx.info.device_type)
}

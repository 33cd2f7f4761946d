//! `dg serve`: an OpenAI-compatible HTTP server (`/v1/chat/completions`, `/v1/completions`,
//! `/v1/models`, `/health`, `/metrics`). One engine thread owns the model ([`engine`]); requests
//! reach it through a bounded queue in arrival order ([`http`]); bodies follow OpenAI's shapes
//! ([`openai`]). This module holds the options, the accept loop (header and body timeouts) and the
//! shutdown on SIGTERM/SIGINT: stop accepting, let in-flight work finish within a deadline, cancel
//! what is left, exit 0.

mod commit;
mod engine;
mod http;
mod metrics;
mod openai;
mod pool;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use crate::args::{BackendArg, WeightsArg};
use crate::error::input;
use crate::text::TextCodec;

/// The `dg serve` options.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// HF model directory or .gguf file. Default: the bundled random model (its text is noise).
    #[arg(long, value_name = "DIR|FILE.gguf")]
    pub model: Option<PathBuf>,

    /// The name clients give as `model` (default: the directory's name).
    #[arg(long, value_name = "NAME")]
    pub served_model_name: Option<String>,

    /// Address to listen on. Anything but loopback without --api-key prints a warning.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,

    /// Port to listen on (0: any free port; the address is printed on stderr).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,

    /// Require `Authorization: Bearer KEY` on every endpoint but /health.
    #[arg(long, value_name = "KEY")]
    pub api_key: Option<String>,

    /// Generation requests that may wait for the engine; one more is answered 429.
    #[arg(long, value_name = "N", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    pub queue: u32,

    /// Positions a request may use (prompt plus every canvas). Default: the model's
    /// max_position_embeddings, at most 16384 (the GPU's caches are sized for it, one per --batch
    /// slot).
    #[arg(long, value_name = "N")]
    pub context: Option<usize>,

    /// Requests generating at once. Each step runs their canvases together (on the GPU in one
    /// forward); a queued request joins at the next step when one ends. Every slot holds a KV cache
    /// of --context positions. With 1, requests run one at a time and a prompt that extends an
    /// earlier conversation continues from its KV cache (see --cache-budget); with more, every
    /// prompt is encoded from its start.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub batch: u32,

    /// With --batch 1: bytes of other conversations' KV caches kept besides the model's own (host memory on the
    /// CPU, device memory on the GPU), least recently used evicted first: digits with an optional
    /// unit B, K, M, G (KiB, MiB, GiB). 0 keeps none.
    #[arg(long, value_name = "BYTES", default_value = "2GiB", value_parser = pool::parse_bytes)]
    pub cache_budget: u64,

    /// Backend: gpu, cpu, or auto (the GPU when an adapter exists, else the CPU).
    #[arg(long, value_enum, default_value_t = BackendArg::Auto)]
    pub backend: BackendArg,

    /// GPU adapter to use: a case-insensitive substring of its name (see `dg info`).
    #[arg(long, value_name = "NAME")]
    pub adapter: Option<String>,

    /// How the GPU stores the weight matrices: auto, f32, bf16, f16, q8_0 or q4_k_m (as for `dg
    /// generate`).
    #[arg(long, value_enum, default_value_t = WeightsArg::Auto)]
    pub weights: WeightsArg,

    /// Defaults of a request that sets none of them (its `max_tokens`, `seed` and `dg` object win).
    #[command(flatten)]
    pub sampler: crate::args::SamplerArgs,

    /// Largest request body, in bytes (larger: 413).
    #[arg(long, value_name = "BYTES", default_value_t = 4 << 20)]
    pub max_body: usize,

    /// Seconds a connection may take to send a request's headers, or its body (then it is dropped,
    /// or answered 408).
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    pub request_timeout: f64,

    /// Seconds in-flight requests get to finish after SIGTERM/SIGINT before they are cancelled.
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    pub shutdown_timeout: f64,
}

/// Most positions the default `--context` takes.
pub(crate) const DEFAULT_CONTEXT_CAP: usize = 16384;
/// How long cancelled work gets to end after the shutdown deadline.
const CANCEL_GRACE: Duration = Duration::from_secs(2);

pub fn run(args: ServeArgs) -> Result<()> {
    let seconds = |v: f64, name: &str| {
        Duration::try_from_secs_f64(v)
            .ok()
            .filter(|d| !d.is_zero())
            .ok_or_else(|| input(format!("{name} must be a positive number of seconds")))
    };
    let request_timeout = seconds(args.request_timeout, "--request-timeout")?;
    let shutdown_timeout = seconds(args.shutdown_timeout, "--shutdown-timeout")?;
    let dir = crate::model_dir::resolve(args.model.as_deref())?;
    let model = crate::model_dir::open(&dir)?;
    let codec =
        TextCodec::load(&model.dir)?.ok_or_else(|| input(format!("{} has no tokenizer.json; dg serve needs one", model.dir.display())))?;
    let codec = Arc::new(codec);
    let template = crate::chat::ChatTemplate::load(&model.dir)?;
    let max_positions = model.config.text.max_position_embeddings;
    let context = args.context.unwrap_or(max_positions.min(DEFAULT_CONTEXT_CAP));
    if context == 0 || context > max_positions {
        return Err(input(format!("--context {context} must be in 1..={max_positions} (max_position_embeddings)")));
    }
    let defaults = args.sampler.overrides();
    crate::generate::resolve_settings(&model, defaults.clone())?;
    let model_name = args
        .served_model_name
        .clone()
        .unwrap_or_else(|| dir.canonicalize().unwrap_or(dir.clone()).file_name().map_or("dg".into(), |n| n.to_string_lossy().into_owned()));

    let metrics = Arc::new(metrics::Metrics::default());
    let cancel_all = Arc::new(AtomicBool::new(false));
    let (jobs_tx, jobs_rx) = mpsc::channel(args.queue as usize);
    let setup = engine::EngineSetup {
        dir: dir.clone(),
        backend: args.backend,
        adapter: args.adapter.clone(),
        weights: args.weights,
        context,
        batch: args.batch as usize,
        cache_budget: args.cache_budget,
        codec: codec.clone(),
        metrics: metrics.clone(),
        cancel_all: cancel_all.clone(),
    };
    let description = engine::spawn(setup, &model, jobs_rx)?;
    eprintln!("backend: {description}");
    let running = match args.batch {
        1 => format!("one request at a time, cache pool {} bytes", args.cache_budget),
        n => format!("batches of up to {n} requests (no cache reuse)"),
    };
    eprintln!(
        "model: {} as {model_name:?}{}; context {context} positions, queue {}, {running}",
        dir.display(),
        if crate::model_dir::is_bundled(&dir) { " (the bundled random model: its text is noise)" } else { "" },
        args.queue,
    );
    let app = Arc::new(http::App {
        model_name,
        model,
        template,
        codec,
        jobs: jobs_tx,
        metrics,
        defaults,
        default_seed: args.sampler.seed,
        context,
        api_key: args.api_key.clone(),
        max_body: args.max_body,
        body_timeout: request_timeout,
        started: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
        next_id: AtomicU64::new(1),
    });
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("cannot start the async runtime")?;
    runtime.block_on(serve(args, app, request_timeout, shutdown_timeout, cancel_all))?;
    runtime.shutdown_timeout(Duration::from_secs(1));
    Ok(())
}

async fn serve(
    args: ServeArgs,
    app: Arc<http::App>,
    request_timeout: Duration,
    shutdown_timeout: Duration,
    cancel_all: Arc<AtomicBool>,
) -> Result<()> {
    let listener = TcpListener::bind((args.host.as_str(), args.port))
        .await
        .map_err(|e| input(format!("cannot listen on {}:{}: {e}", args.host, args.port)))?;
    let addr = listener.local_addr()?;
    if !addr.ip().is_loopback() && args.api_key.is_none() {
        eprintln!(
            "warning: listening on {addr}, which is not a loopback address, without --api-key: anyone who can reach it can use the model"
        );
    }
    eprintln!("listening on http://{addr}");
    let router = http::router(app);
    // Connections watch `stop` to finish their response and close; each holds a `live` sender, so
    // `live_rx` ends when the last one is gone.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let (live_tx, mut live_rx) = mpsc::channel::<()>(1);
    let mut signal = std::pin::pin!(shutdown_signal());
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                tokio::spawn(connection(stream, router.clone(), request_timeout, stop_rx.clone(), live_tx.clone()));
            }
            () = &mut signal => break,
        }
    }
    drop(listener);
    drop(live_tx);
    let _ = stop_tx.send(true);
    eprintln!("shutting down: no new connections; in-flight requests get {:.1} s", shutdown_timeout.as_secs_f64());
    tokio::select! {
        _ = live_rx.recv() => eprintln!("shutdown: every request finished"),
        () = tokio::time::sleep(shutdown_timeout) => {
            cancel_all.store(true, Ordering::Relaxed);
            eprintln!("shutdown: deadline passed; cancelling what is left");
            let _ = tokio::time::timeout(CANCEL_GRACE, live_rx.recv()).await;
        }
    }
    Ok(())
}

/// Serves one connection: dropped when it sends no byte within `timeout`, or not its headers;
/// closed after its current response once `stop` turns true.
async fn connection(
    stream: TcpStream,
    router: axum::Router,
    timeout: Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
    _live: mpsc::Sender<()>,
) {
    let mut probe = [0u8; 1];
    if !matches!(tokio::time::timeout(timeout, stream.peek(&mut probe)).await, Ok(Ok(n)) if n > 0) {
        return;
    }
    let service = TowerToHyperService::new(router);
    // No half-close: a client's EOF while its answer is pending ends the connection and drops the
    // handler, which cancels a non-streamed generation (`http::whole`).
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .half_close(false)
        .header_read_timeout(timeout)
        .serve_connection(TokioIo::new(stream), service);
    let mut conn = std::pin::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => return,
        _ = stop.wait_for(|&s| s) => {}
    }
    conn.as_mut().graceful_shutdown();
    let _ = conn.await;
}

/// Resolves on SIGINT (Ctrl-C) or SIGTERM.
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

//! `dg serve`: an OpenAI-compatible HTTP server (`/v1/chat/completions`, `/v1/completions`,
//! `/v1/models`, `/health`, `/metrics`). One engine thread owns the model ([`engine`]); requests
//! reach it through a bounded queue in arrival order ([`http`]); bodies follow OpenAI's shapes
//! ([`openai`]). This module holds the startup (options from `crate::args::ServeArgs`), the accept
//! loop (header and body timeouts) and the shutdown on SIGTERM/SIGINT: stop accepting, let
//! in-flight work finish within a deadline, cancel what is left, exit 0.

mod commit;
mod engine;
mod http;
mod metrics;
mod openai;
mod pool;
pub(crate) mod prompt_images;
pub(crate) mod systemone;
mod thoughts;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use crate::args::ServeArgs;
use crate::error::input;
use crate::settings::{DEFAULT_CONTEXT_CAP, resolve_settings};
use crate::text::TextCodec;

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
    let model = crate::model_dir::open_with_mmproj(&dir, args.mmproj.as_deref())?;
    let codec = TextCodec::load(&model)?
        .ok_or_else(|| input(format!("{} has no tokenizer.json (nor a GGUF file's tokenizer); dg serve needs one", model.dir.display())))?;
    let codec = Arc::new(codec);
    let template = crate::chat::ChatTemplate::load(&model)?;
    let max_positions = model.config.text.max_position_embeddings;
    let context = args.context.unwrap_or(max_positions.min(DEFAULT_CONTEXT_CAP));
    if context == 0 || context > max_positions {
        return Err(input(format!("--context {context} must be in 1..={max_positions} (max_position_embeddings)")));
    }
    let defaults = args.sampler.overrides();
    resolve_settings(&model, defaults.clone())?;
    let model_name = args
        .served_model_name
        .clone()
        .unwrap_or_else(|| dir.canonicalize().unwrap_or(dir.clone()).file_name().map_or("dg".into(), |n| n.to_string_lossy().into_owned()));

    let metrics = Arc::new(metrics::Metrics::default());
    let cancel_all = Arc::new(AtomicBool::new(false));
    let (jobs_tx, jobs_rx) = mpsc::channel(args.queue as usize);
    let setup = engine::EngineSetup {
        dir: dir.clone(),
        backend: args.device.backend,
        adapter: args.device.adapter.clone(),
        weights: args.device.weights,
        context,
        batch: args.batch as usize,
        cache_budget: args.cache_budget,
        codec: codec.clone(),
        metrics: metrics.clone(),
        cancel_all: cancel_all.clone(),
    };
    let (started, gpu_reader) = engine::spawn(setup, &model, jobs_rx, args.read_queue as usize)?;
    eprintln!("backend: {}", started.description);
    let tower_device = match started.gpu {
        Some(ctx) => crate::images::TowerDevice::Gpu(Box::new(ctx), args.device.weights),
        None => crate::images::TowerDevice::Cpu,
    };
    let images = image_input(&model, args.image_tokens, tower_device)?;
    let running = match args.batch {
        1 => format!("one request at a time, cache pool {} bytes", args.cache_budget),
        n => format!("batches of up to {n} requests, cache pool {} bytes", args.cache_budget),
    };
    eprintln!(
        "model: {} as {model_name:?}{}; context {context} positions, queue {}, {running}",
        dir.display(),
        if crate::model_dir::is_bundled(&dir) { " (the bundled random model: its text is noise)" } else { "" },
        args.queue,
    );
    let settings = resolve_settings(&model, defaults.clone())?;
    let thoughts = thoughts::Thoughts {
        jobs: jobs_tx.clone(),
        settings: settings.clone(),
        canvas_length: model.config.canvas_length,
        context,
        metrics: metrics.clone(),
    };
    let extensions = systemone::Extensions { images: images.clone(), thinker: Ok(thoughts.thinker()) };
    let reader = (gpu_reader, args.read_queue as usize);
    let systemone =
        systemone::Service::start(&model, &model_name, codec.clone(), template.clone(), settings, reader, extensions)?.map(Arc::new);
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
        empty_reply_retries: args.empty_reply_retries,
        test_hooks: args.test_hooks,
        systemone,
        images,
    });
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("cannot start the async runtime")?;
    runtime.block_on(serve(args, app, request_timeout, shutdown_timeout, cancel_all))?;
    runtime.shutdown_timeout(Duration::from_secs(1));
    Ok(())
}

/// Thoughts a `dg read` request's groups may wait for at once (one per group at most).
const READ_THOUGHTS_QUEUE: usize = 256;

/// The engine `dg read` thinks on (a request with `think`): the model loaded as `dg serve` loads
/// it, one job at a time in `context` positions; the thoughts it generates with `settings`, and on
/// the GPU the reader on its model.
pub(crate) fn read_engine(
    model: &dg_model::ModelDir,
    codec: Arc<TextCodec>,
    device: &crate::args::DeviceArgs,
    settings: dg_model::GenerationConfig,
    context: usize,
) -> Result<(systemone::Thinker, Option<systemone::ReaderHandle>)> {
    let metrics = Arc::new(metrics::Metrics::default());
    let (jobs, jobs_rx) = mpsc::channel(READ_THOUGHTS_QUEUE);
    let setup = engine::EngineSetup {
        dir: model.dir.clone(),
        backend: device.backend,
        adapter: device.adapter.clone(),
        weights: device.weights,
        context,
        batch: 1,
        cache_budget: 0,
        codec,
        metrics: metrics.clone(),
        cancel_all: Arc::new(AtomicBool::new(false)),
    };
    let (_, reader) = engine::spawn(setup, model, jobs_rx, 1)?;
    let thoughts = thoughts::Thoughts { jobs, settings, canvas_length: model.config.canvas_length, context, metrics };
    Ok((thoughts.thinker(), reader))
}

/// What chat requests' image parts get: the model's tower on `device` (the engine's) and the
/// processor at `budget` soft tokens, or why images are refused.
fn image_input(
    model: &dg_model::ModelDir,
    budget: usize,
    device: crate::images::TowerDevice,
) -> Result<Result<Arc<http::ImageInput>, String>> {
    if model.config.vision.is_none() {
        return Ok(Err(format!("this model ({}) has no vision tower: it takes no images", model.dir.display())));
    }
    let tower = crate::images::VisionTower::load(model, device)?;
    let processor = tower.spec().processor(budget).context(crate::error::Input("--image-tokens".into()))?;
    eprintln!("images: the vision tower {}, up to {budget} soft tokens an image", tower.describe());
    Ok(Ok(Arc::new(http::ImageInput { tower, processor })))
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

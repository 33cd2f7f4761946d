//! The engine: one thread that owns the model (and the GPU), takes generation jobs from a bounded
//! queue in arrival order, runs the sampler on them and sends their progress back as [`Event`]s.
//!
//! Two ways to run, chosen by `dg serve --batch`:
//! - one job at a time (`--batch 1`, the default; [`Engine`]). KV caches survive between jobs:
//!   the model's own, and others parked in a [`Pool`] within a byte budget (least-recently-used
//!   out first). A job whose prompt extends the tokens a cache holds (an earlier prompt and the
//!   canvases committed after it) continues from the longest such cache and encodes only the new
//!   tokens; the model's previous cache is parked ([`caches`]).
//! - up to N jobs at once (`--batch N`; [`batched`]): continuous batching through
//!   `dg_sampler::Batch`. A job joins at the next denoising step when a slot is free (with its
//!   prompt's prefill) and leaves when it ends; on the GPU every step is one forward for all the
//!   running jobs' canvases. Every prompt is encoded from its start (no cache reuse).
//!
//! Either way each job gets exactly the text it gets alone. A job whose client has gone (its event
//! receiver dropped), whose text is final (EOS, a stop sequence, `max_tokens`), or that the
//! shutdown cancels stops at its next denoising step. A panic in a generation is caught: the jobs
//! it touched are answered with an error, the caches reset, and the engine keeps serving.

mod batched;
mod caches;

use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use dg_cpu::CpuModel;
use dg_gpu::GpuModel;
use dg_model::{GenerationConfig, ModelDir};
use dg_sampler::{Generation, Hooks, SeededRng, StepInfo, StopReason};
use tokio::sync::mpsc;

use super::commit::{Committer, Decode, Finish};
use super::metrics::Metrics;
use super::pool::Pool;
use crate::args::{BackendArg, WeightsArg};
use crate::backend::{self, Backend};
use crate::text::TextCodec;
use caches::{CacheSkip, Snapshot};

/// One generation request, ready for the model.
#[derive(Debug)]
pub struct Job {
    pub prompt: Vec<u32>,
    /// `max_new_tokens` is `max_tokens` (whole canvases are generated, the text is cut).
    pub settings: GenerationConfig,
    pub max_tokens: usize,
    pub stop: Vec<String>,
    pub seed: u64,
    pub drafts: bool,
    pub events: mpsc::UnboundedSender<Event>,
}

/// What a job reports, in order: drafts and text deltas, then `Done` or `Failed`.
#[derive(Debug)]
pub enum Event {
    /// The canvas being denoised after a step (accepted tokens and the current argmax elsewhere).
    Draft {
        block: usize,
        step: usize,
        accepted: usize,
        text: String,
    },
    /// Committed text; it only grows.
    Text(String),
    Done(Summary),
    Failed(String),
}

/// The end of a job.
#[derive(Debug, Clone)]
pub struct Summary {
    pub finish: Finish,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens found in a cache and not encoded.
    pub reused_tokens: usize,
    /// Where those tokens' cache came from.
    pub cache: CacheSource,
    pub steps_per_canvas: Vec<usize>,
    pub tokens_per_forward: f64,
    pub prefill: Duration,
    pub first_canvas: Option<Duration>,
}

/// The cache a job continued from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheSource {
    /// None: the prompt is encoded from the start.
    None,
    /// The model's own cache (the previous job's).
    Resident,
    /// A cache restored from the pool.
    Pool,
}

impl CacheSource {
    pub fn name(self) -> &'static str {
        match self {
            CacheSource::None => "none",
            CacheSource::Resident => "resident",
            CacheSource::Pool => "pool",
        }
    }
}

/// What the engine needs to load and run the model.
#[derive(Debug)]
pub struct EngineSetup {
    pub dir: PathBuf,
    pub backend: BackendArg,
    pub adapter: Option<String>,
    pub weights: WeightsArg,
    /// Positions a job may use (prompt and every canvas): the GPU's caches are sized for it.
    pub context: usize,
    /// Jobs generating at once (1: one at a time, with cache reuse).
    pub batch: usize,
    /// Bytes of parked caches the pool keeps at most (0: none; one job at a time only).
    pub cache_budget: u64,
    pub codec: Arc<TextCodec>,
    pub metrics: Arc<Metrics>,
    /// Set by the shutdown when its deadline passes: every job stops at its next step.
    pub cancel_all: Arc<AtomicBool>,
}

impl EngineSetup {
    /// The job's text from its token ids.
    fn decode(&self) -> Decode {
        let codec = self.codec.clone();
        Arc::new(move |ids: &[u32]| codec.decode(ids).unwrap_or_default())
    }
}

/// The loaded model on its backend.
enum Loaded {
    Cpu(Box<CpuModel>),
    Gpu(Box<GpuModel>),
}

impl Loaded {
    fn reset(&mut self) {
        match self {
            Loaded::Cpu(m) => m.reset(),
            Loaded::Gpu(m) => m.reset(),
        }
    }
}

/// Loads the model of `setup.dir` on the backend it asks for; returns it and a line describing it.
/// The one place the one-job-at-a-time engine reads weights.
fn load_model(setup: &EngineSetup) -> Result<(Loaded, String)> {
    let model = crate::model_dir::open(&setup.dir)?;
    let choice = backend::choose(setup.backend, setup.adapter.as_deref())?;
    let loaded = match choice.backend {
        Backend::Cpu => Loaded::Cpu(Box::new(crate::load::cpu(&model, setup.weights)?)),
        Backend::Gpu(ctx) => {
            Loaded::Gpu(Box::new(crate::load::gpu(&model, *ctx, setup.context, setup.weights, crate::load::Report::Summary)?))
        }
    };
    Ok((loaded, choice.description))
}

/// Starts the engine thread on `jobs`; returns once the model is loaded, with its description.
pub fn spawn(setup: EngineSetup, model: &ModelDir, mut jobs: mpsc::Receiver<Job>) -> Result<String> {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (canvas, vocab) = (model.config.canvas_length, model.config.text.vocab_size);
    std::thread::Builder::new().name("dg-engine".into()).spawn(move || {
        if setup.batch > 1 {
            let engine = match batched::BatchEngine::load(setup, canvas, vocab) {
                Ok((engine, description)) => {
                    let _ = ready_tx.send(Ok(description));
                    engine
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            return engine.run(jobs);
        }
        let (loaded, description) = match load_model(&setup) {
            Ok(x) => x,
            Err(e) => {
                let _ = ready_tx.send(Err(e));
                return;
            }
        };
        let _ = ready_tx.send(Ok(description));
        let mut engine = Engine::new(loaded, setup, canvas, vocab);
        while let Some(job) = jobs.blocking_recv() {
            engine.setup.metrics.queue_depth.fetch_sub(1, Ordering::Relaxed);
            engine.serve(job);
        }
    })?;
    ready_rx.recv().context("the engine thread ended while loading the model")?
}

/// Runs jobs one at a time, keeping KV caches between them.
struct Engine {
    model: Loaded,
    /// The ids the model's KV cache holds, in order.
    cached: Vec<u32>,
    /// Other conversations' caches.
    pool: Pool<Snapshot>,
    setup: EngineSetup,
    decode: Decode,
    canvas: usize,
    vocab: usize,
}

impl Engine {
    fn new(model: Loaded, setup: EngineSetup, canvas: usize, vocab: usize) -> Self {
        let pool = Pool::new(setup.cache_budget);
        setup.metrics.pool_budget_bytes.store(setup.cache_budget, Ordering::Relaxed);
        let decode = setup.decode();
        Engine { model, cached: Vec::new(), pool, setup, decode, canvas, vocab }
    }

    fn serve(&mut self, job: Job) {
        if job.events.is_closed() {
            self.setup.metrics.cancelled.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let events = job.events.clone();
        let running = &self.setup.metrics.running;
        running.store(1, Ordering::Relaxed);
        let result = std::panic::catch_unwind(AssertUnwindSafe(|| self.run(job)));
        self.setup.metrics.running.store(0, Ordering::Relaxed);
        if result.is_err() {
            self.forget();
            self.setup.metrics.engine_panics.fetch_add(1, Ordering::Relaxed);
            let _ = events.send(Event::Failed(PANICKED.into()));
        }
    }

    /// Empties the cache (after a failure its contents are unknown).
    fn forget(&mut self) {
        self.model.reset();
        self.cached.clear();
    }

    fn run(&mut self, job: Job) {
        // The first canvas's latency counts parking and restoring caches too.
        let started = Instant::now();
        let (skip, source) = self.attach(&job.prompt);
        let (mut hooks, request) = JobHooks::new(job, &self.decode, &self.setup, started);
        let mut cache = CacheSkip { skip, encoded: std::mem::take(&mut self.cached), metrics: &self.setup.metrics };
        let mut rng = SeededRng::new(request.seed);
        let (c, v) = (self.canvas, self.vocab);
        let (prompt, settings) = (&request.prompt, &request.settings);
        let generation = match &mut self.model {
            Loaded::Cpu(m) => {
                dg_sampler::generate(&mut cache.wrap(&mut **m), prompt, settings, c, v, &mut rng, &mut hooks).map_err(anyhow::Error::new)
            }
            Loaded::Gpu(m) => dg_sampler::generate_resident(&mut cache.wrap(&mut **m), prompt, settings, c, v, &mut rng, &mut hooks)
                .map_err(anyhow::Error::new),
        };
        self.cached = std::mem::take(&mut cache.encoded);
        if generation.is_err() {
            self.forget();
        }
        hooks.finish(generation, skip, source);
    }
}

/// A job's answer after a panic.
const PANICKED: &str = "internal error: the generation panicked; the server keeps serving";

/// What the sampler takes of a job (the rest stays with its [`JobHooks`]).
struct Request {
    prompt: Vec<u32>,
    settings: GenerationConfig,
    seed: u64,
}

/// A job's sampler hooks: drafts and committed text to its client, when to stop, and its summary
/// at the end. They own what they need, so a batch can hold them across steps.
struct JobHooks {
    events: mpsc::UnboundedSender<Event>,
    drafts: bool,
    prompt_tokens: usize,
    committer: Committer,
    decode: Decode,
    metrics: Arc<Metrics>,
    cancel_all: Arc<AtomicBool>,
    started: Instant,
    prefill: Duration,
    first_canvas: Option<Duration>,
}

impl JobHooks {
    /// The hooks of `job` (whose first canvas's latency counts from `started`), and what the
    /// sampler takes.
    fn new(job: Job, decode: &Decode, setup: &EngineSetup, started: Instant) -> (Self, Request) {
        let committer = Committer::new(decode.clone(), job.settings.eos_token_ids.clone(), job.stop, job.max_tokens);
        let hooks = JobHooks {
            events: job.events,
            drafts: job.drafts,
            prompt_tokens: job.prompt.len(),
            committer,
            decode: decode.clone(),
            metrics: setup.metrics.clone(),
            cancel_all: setup.cancel_all.clone(),
            started,
            prefill: Duration::ZERO,
            first_canvas: None,
        };
        (hooks, Request { prompt: job.prompt, settings: job.settings, seed: job.seed })
    }

    /// Ends the job with `generation`: the held-back text, the metrics, then `Done` or `Failed`.
    /// `reused` prompt tokens came from the cache `source`.
    fn finish(mut self, generation: Result<Generation>, reused: usize, source: CacheSource) {
        let event = match generation {
            Ok(generation) => Event::Done(self.summarize(&generation, reused, source)),
            Err(e) => Event::Failed(format!("generation failed: {e:#}")),
        };
        let _ = self.events.send(event);
    }

    fn summarize(&mut self, generation: &Generation, reused: usize, source: CacheSource) -> Summary {
        let metrics = &self.metrics;
        // Stopped by the hooks before the text was final: the client left, or the shutdown.
        if generation.stop_reason == StopReason::Cancelled && self.committer.finished().is_none() {
            metrics.cancelled.fetch_add(1, Ordering::Relaxed);
        }
        let (rest, finish) = self.committer.end();
        if !rest.is_empty() {
            let _ = self.events.send(Event::Text(rest));
        }
        let completion_tokens = self.committer.tokens.len();
        metrics.prompt_tokens.fetch_add(self.prompt_tokens as u64, Ordering::Relaxed);
        metrics.reused_prompt_tokens.fetch_add(reused as u64, Ordering::Relaxed);
        metrics.generated_tokens.fetch_add(completion_tokens as u64, Ordering::Relaxed);
        metrics.tokens_per_forward.observe(generation.tokens_per_forward);
        metrics.prefill_seconds.observe(self.prefill.as_secs_f64());
        Summary {
            finish,
            prompt_tokens: self.prompt_tokens,
            completion_tokens,
            reused_tokens: reused,
            cache: source,
            steps_per_canvas: generation.steps_per_canvas.clone(),
            tokens_per_forward: generation.tokens_per_forward,
            prefill: self.prefill,
            first_canvas: self.first_canvas,
        }
    }
}

impl Hooks for JobHooks {
    fn on_encode(&mut self, block: usize, _tokens: usize, took: Duration) {
        if block == 0 {
            self.prefill = took;
        }
    }

    fn on_step(&mut self, info: &StepInfo<'_>) {
        if info.finished {
            self.metrics.steps_per_canvas.observe((info.step + 1) as f64);
        }
        if self.drafts {
            let ids: Vec<u32> = (0..info.draft.len()).map(|i| if info.accepted[i] { info.canvas[i] } else { info.draft[i] }).collect();
            let text = (self.decode)(&ids);
            let _ = self.events.send(Event::Draft { block: info.block, step: info.step, accepted: info.num_accepted, text });
        }
    }

    fn on_canvas(&mut self, _block: usize, tokens: &[u32]) {
        if self.first_canvas.is_none() {
            let took = self.started.elapsed();
            self.first_canvas = Some(took);
            self.metrics.first_canvas_seconds.observe(took.as_secs_f64());
        }
        let delta = self.committer.push(tokens);
        if !delta.is_empty() {
            let _ = self.events.send(Event::Text(delta));
        }
    }

    fn should_stop(&mut self) -> bool {
        self.committer.finished().is_some() || self.events.is_closed() || self.cancel_all.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An engine on the bundled model's CPU backend.
    fn cpu_engine() -> (Engine, ModelDir) {
        cpu_engine_with(1 << 30)
    }

    /// An engine on the bundled model's CPU backend whose pool keeps `cache_budget` bytes.
    fn cpu_engine_with(cache_budget: u64) -> (Engine, ModelDir) {
        let dir = crate::model_dir::bundled_dir();
        let model = crate::model_dir::open(&dir).unwrap();
        let setup = EngineSetup {
            dir: dir.clone(),
            backend: BackendArg::Cpu,
            adapter: None,
            weights: WeightsArg::Auto,
            context: 4096,
            batch: 1,
            cache_budget,
            codec: Arc::new(TextCodec::load(&dir).unwrap().unwrap()),
            metrics: Arc::new(Metrics::default()),
            cancel_all: Arc::new(AtomicBool::new(false)),
        };
        let (loaded, _) = load_model(&setup).unwrap();
        let (canvas, vocab) = (model.config.canvas_length, model.config.text.vocab_size);
        (Engine::new(loaded, setup, canvas, vocab), model)
    }

    /// A job of `prompt` with seed `seed`, and the receiver of its events.
    fn job(model: &ModelDir, prompt: &[u32], max_tokens: usize, seed: u64) -> (Job, mpsc::UnboundedReceiver<Event>) {
        let over = dg_model::RawGenerationConfig { max_new_tokens: Some(max_tokens), ..Default::default() };
        let settings = crate::settings::resolve_settings(model, over).unwrap();
        let (events, rx) = mpsc::unbounded_channel();
        (Job { prompt: prompt.to_vec(), settings, max_tokens, stop: vec![], seed, drafts: false, events }, rx)
    }

    /// The text and summary of a served job's events.
    fn answer(rx: &mut mpsc::UnboundedReceiver<Event>) -> (String, Summary) {
        let mut text = String::new();
        while let Ok(event) = rx.try_recv() {
            match event {
                Event::Text(t) => text.push_str(&t),
                Event::Done(s) => return (text, s),
                Event::Failed(e) => panic!("{e}"),
                Event::Draft { .. } => {}
            }
        }
        panic!("no Done event");
    }

    /// Serves a job of `prompt`; returns its text and summary.
    fn serve(engine: &mut Engine, model: &ModelDir, prompt: &[u32], max_tokens: usize) -> (String, Summary) {
        let (job, mut rx) = job(model, prompt, max_tokens, 7);
        engine.serve(job);
        answer(&mut rx)
    }

    #[test]
    fn batched_jobs_get_the_text_they_get_alone_and_a_gone_client_frees_its_slot() {
        let (mut alone, model) = cpu_engine_with(0);
        // Different prompt lengths and lengths of answer; more jobs than slots.
        let jobs: Vec<(Vec<u32>, usize, u64)> =
            vec![((2..30).collect(), 64, 1), ((5..9).collect(), 16, 2), ((40..101).collect(), 40, 3), ((2..12).collect(), 48, 4)];
        let mut want = vec![];
        for (prompt, max_tokens, seed) in &jobs {
            let (job, mut rx) = job(&model, prompt, *max_tokens, *seed);
            alone.forget();
            alone.serve(job);
            want.push(answer(&mut rx));
        }
        let setup = EngineSetup { batch: 2, ..alone.setup };
        let metrics = setup.metrics.clone();
        let (canvas, vocab) = (model.config.canvas_length, model.config.text.vocab_size);
        let (engine, _) = batched::BatchEngine::load(setup, canvas, vocab).unwrap();
        let (tx, queue) = mpsc::channel(16);
        let mut receivers = vec![];
        for (prompt, max_tokens, seed) in &jobs {
            let (job, rx) = job(&model, prompt, *max_tokens, *seed);
            tx.try_send(job).unwrap();
            receivers.push(rx);
        }
        // A job whose client left while it waited: never run, counted as cancelled.
        let (gone, rx) = job(&model, &[3, 4, 5], 64, 9);
        drop(rx);
        tx.try_send(gone).unwrap();
        metrics.queue_depth.store(jobs.len() as i64 + 1, Ordering::Relaxed);
        drop(tx);
        engine.run(queue);
        for (i, (rx, (text, summary))) in receivers.iter_mut().zip(&want).enumerate() {
            let (got_text, got) = answer(rx);
            assert_eq!(&got_text, text, "job {i}");
            assert_eq!((got.completion_tokens, &got.steps_per_canvas), (summary.completion_tokens, &summary.steps_per_canvas), "job {i}");
            assert_eq!((got.reused_tokens, got.cache), (0, CacheSource::None));
            assert!(got.prefill > Duration::ZERO && got.first_canvas.is_some(), "job {i}: {got:?}");
        }
        assert_eq!(metrics.cancelled.load(Ordering::Relaxed), 1);
        assert_eq!((metrics.queue_depth.load(Ordering::Relaxed), metrics.running.load(Ordering::Relaxed)), (0, 0));
    }

    #[test]
    fn a_prompt_that_extends_the_cache_reuses_it_and_gives_the_same_answer() {
        let (mut warm, model) = cpu_engine();
        let first: Vec<u32> = (2..40).collect();
        let (_, s) = serve(&mut warm, &model, &first, 64);
        assert_eq!(s.reused_tokens, 0);
        assert!(warm.cached.len() >= first.len() && warm.cached.starts_with(&first), "the cache holds the first prompt");
        // The next turn: everything the cache holds, and more.
        let mut next = warm.cached.clone();
        next.extend([7, 8, 9, 10]);
        let (reused_text, reused) = serve(&mut warm, &model, &next, 40);
        assert_eq!(reused.reused_tokens, next.len() - 4);
        let (cold, _) = cpu_engine();
        let mut cold = cold;
        let (fresh_text, fresh) = serve(&mut cold, &model, &next, 40);
        assert_eq!(fresh.reused_tokens, 0);
        assert_eq!(reused_text, fresh_text);
        assert_eq!(reused.steps_per_canvas, fresh.steps_per_canvas);
        assert_eq!(reused.completion_tokens, fresh.completion_tokens);
        // A prompt that does not extend the cache starts from an empty one.
        let (_, other) = serve(&mut warm, &model, &first[..10], 32);
        assert_eq!(other.reused_tokens, 0);
    }

    #[test]
    fn interleaved_conversations_continue_from_the_pool_and_a_small_budget_evicts() {
        let (mut engine, model) = cpu_engine();
        let a: Vec<u32> = (2..40).collect();
        let b: Vec<u32> = (100..170).collect();
        serve(&mut engine, &model, &a, 16);
        let a_cached = engine.cached.clone();
        serve(&mut engine, &model, &b, 16);
        assert_eq!(engine.pool.len(), 1, "A's cache parked");
        let metrics = engine.setup.metrics.clone();
        assert_eq!(metrics.pool_bytes.load(Ordering::Relaxed), engine.pool.bytes());
        assert!(engine.pool.bytes() > 0);
        // A's next turn continues from the pool; B's cache takes its place there.
        let mut a2 = a_cached.clone();
        a2.extend([7, 8, 9]);
        let (text, s) = serve(&mut engine, &model, &a2, 16);
        assert_eq!((s.cache, s.reused_tokens), (CacheSource::Pool, a_cached.len()));
        assert_eq!(engine.pool.len(), 1, "B parked");
        assert_eq!(metrics.cache_hits_pool.load(Ordering::Relaxed), 1);
        assert_eq!(metrics.cache_misses.load(Ordering::Relaxed), 2);
        let (mut cold, _) = cpu_engine();
        let (fresh, f) = serve(&mut cold, &model, &a2, 16);
        assert_eq!((f.cache, text), (CacheSource::None, fresh), "the same text as without reuse");
        // A third turn of A continues from the model's own cache.
        let mut a3 = engine.cached.clone();
        a3.push(5);
        assert_eq!(serve(&mut engine, &model, &a3, 16).1.cache, CacheSource::Resident);

        // A budget smaller than one cache keeps none: A's next turn is encoded from the start.
        let (mut small, _) = cpu_engine_with(1);
        serve(&mut small, &model, &a, 16);
        serve(&mut small, &model, &b, 16);
        let (_, s) = serve(&mut small, &model, &a2, 16);
        assert_eq!((s.cache, s.reused_tokens), (CacheSource::None, 0));
        let m = &small.setup.metrics;
        assert_eq!((small.pool.len(), m.pool_evictions.load(Ordering::Relaxed)), (0, 2));
    }
}

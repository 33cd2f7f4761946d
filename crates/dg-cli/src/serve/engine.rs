//! The engine: one thread that owns the model (and the GPU), takes generation jobs from a bounded
//! queue in arrival order, runs the sampler on each and sends its progress back as [`Event`]s.
//!
//! A job whose client has gone (its event receiver dropped), whose text is final (EOS, a stop
//! sequence, `max_tokens`), or that the shutdown cancels stops at the next denoising step. A panic
//! in a generation is caught: the job is answered with an error, the cache reset, and the engine
//! keeps serving.
//!
//! KV caches survive between jobs: the model's own, and others parked in a [`Pool`] within a byte
//! budget (least-recently-used out first). A job whose prompt extends the tokens a cache holds (an
//! earlier prompt and the canvases committed after it) continues from the longest such cache and
//! encodes only the new tokens; the model's previous cache is parked ([`caches`]).

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
use dg_sampler::{Hooks, SeededRng, StepInfo, StopReason};
use tokio::sync::mpsc;

use super::commit::{Committer, Finish};
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
    /// Positions the GPU's cache holds (prompt and every canvas of a job).
    pub context: usize,
    /// Bytes of parked caches the pool keeps at most (0: none).
    pub cache_budget: u64,
    pub codec: Arc<TextCodec>,
    pub metrics: Arc<Metrics>,
    /// Set by the shutdown when its deadline passes: every job stops at its next step.
    pub cancel_all: Arc<AtomicBool>,
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
/// The one place the server reads weights.
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

struct Engine {
    model: Loaded,
    /// The ids the model's KV cache holds, in order.
    cached: Vec<u32>,
    /// Other conversations' caches.
    pool: Pool<Snapshot>,
    setup: EngineSetup,
    canvas: usize,
    vocab: usize,
}

impl Engine {
    fn new(model: Loaded, setup: EngineSetup, canvas: usize, vocab: usize) -> Self {
        let pool = Pool::new(setup.cache_budget);
        setup.metrics.pool_budget_bytes.store(setup.cache_budget, Ordering::Relaxed);
        Engine { model, cached: Vec::new(), pool, setup, canvas, vocab }
    }

    fn serve(&mut self, job: Job) {
        if job.events.is_closed() {
            self.setup.metrics.cancelled.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let result = std::panic::catch_unwind(AssertUnwindSafe(|| self.run(&job)));
        let event = match result {
            Ok(Ok(summary)) => Event::Done(summary),
            Ok(Err(e)) => {
                self.forget();
                Event::Failed(format!("generation failed: {e:#}"))
            }
            Err(_) => {
                self.forget();
                self.setup.metrics.engine_panics.fetch_add(1, Ordering::Relaxed);
                Event::Failed("internal error: the generation panicked; the server keeps serving".into())
            }
        };
        let _ = job.events.send(event);
    }

    /// Empties the cache (after a failure its contents are unknown).
    fn forget(&mut self) {
        self.model.reset();
        self.cached.clear();
    }

    fn run(&mut self, job: &Job) -> Result<Summary> {
        // The first canvas's latency counts parking and restoring caches too.
        let started = Instant::now();
        let (skip, source) = self.attach(&job.prompt);
        let metrics = self.setup.metrics.clone();
        let codec = self.setup.codec.clone();
        let decode = |ids: &[u32]| codec.decode(ids).unwrap_or_default();
        let mut hooks = JobHooks {
            job,
            committer: Committer::new(&decode, &job.settings.eos_token_ids, &job.stop, job.max_tokens),
            metrics: &metrics,
            cancel_all: &self.setup.cancel_all,
            started,
            first_canvas: None,
            decode: &decode,
        };
        let mut cache = CacheSkip { skip, encoded: std::mem::take(&mut self.cached), prefill: Duration::ZERO, metrics: &metrics };
        let mut rng = SeededRng::new(job.seed);
        let (c, v) = (self.canvas, self.vocab);
        let generation = match &mut self.model {
            Loaded::Cpu(m) => dg_sampler::generate(&mut cache.wrap(&mut **m), &job.prompt, &job.settings, c, v, &mut rng, &mut hooks)
                .map_err(anyhow::Error::new),
            Loaded::Gpu(m) => {
                dg_sampler::generate_resident(&mut cache.wrap(&mut **m), &job.prompt, &job.settings, c, v, &mut rng, &mut hooks)
                    .map_err(anyhow::Error::new)
            }
        };
        self.cached = std::mem::take(&mut cache.encoded);
        let generation = generation?;
        // Stopped by the hooks before the text was final: the client left, or the shutdown.
        if generation.stop_reason == StopReason::Cancelled && hooks.committer.finished().is_none() {
            metrics.cancelled.fetch_add(1, Ordering::Relaxed);
        }
        let (rest, finish) = hooks.committer.end();
        if !rest.is_empty() {
            let _ = job.events.send(Event::Text(rest));
        }
        let completion_tokens = hooks.committer.tokens.len();
        metrics.prompt_tokens.fetch_add(job.prompt.len() as u64, Ordering::Relaxed);
        metrics.reused_prompt_tokens.fetch_add(skip as u64, Ordering::Relaxed);
        metrics.generated_tokens.fetch_add(completion_tokens as u64, Ordering::Relaxed);
        metrics.tokens_per_forward.observe(generation.tokens_per_forward);
        metrics.prefill_seconds.observe(cache.prefill.as_secs_f64());
        Ok(Summary {
            finish,
            prompt_tokens: job.prompt.len(),
            completion_tokens,
            reused_tokens: skip,
            cache: source,
            steps_per_canvas: generation.steps_per_canvas,
            tokens_per_forward: generation.tokens_per_forward,
            prefill: cache.prefill,
            first_canvas: hooks.first_canvas,
        })
    }
}

/// The job's sampler hooks: drafts and committed text to the client, and when to stop.
struct JobHooks<'a> {
    job: &'a Job,
    committer: Committer<'a>,
    metrics: &'a Metrics,
    cancel_all: &'a AtomicBool,
    started: Instant,
    first_canvas: Option<Duration>,
    decode: &'a dyn Fn(&[u32]) -> String,
}

impl Hooks for JobHooks<'_> {
    fn on_step(&mut self, info: &StepInfo<'_>) {
        if info.finished {
            self.metrics.steps_per_canvas.observe((info.step + 1) as f64);
        }
        if self.job.drafts {
            let ids: Vec<u32> = (0..info.draft.len()).map(|i| if info.accepted[i] { info.canvas[i] } else { info.draft[i] }).collect();
            let text = (self.decode)(&ids);
            let _ = self.job.events.send(Event::Draft { block: info.block, step: info.step, accepted: info.num_accepted, text });
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
            let _ = self.job.events.send(Event::Text(delta));
        }
    }

    fn should_stop(&mut self) -> bool {
        self.committer.finished().is_some() || self.job.events.is_closed() || self.cancel_all.load(Ordering::Relaxed)
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
            cache_budget,
            codec: Arc::new(TextCodec::load(&dir).unwrap().unwrap()),
            metrics: Arc::new(Metrics::default()),
            cancel_all: Arc::new(AtomicBool::new(false)),
        };
        let (loaded, _) = load_model(&setup).unwrap();
        let (canvas, vocab) = (model.config.canvas_length, model.config.text.vocab_size);
        (Engine::new(loaded, setup, canvas, vocab), model)
    }

    /// Serves a job of `prompt`; returns its text and summary.
    fn serve(engine: &mut Engine, model: &ModelDir, prompt: &[u32], max_tokens: usize) -> (String, Summary) {
        let over = dg_model::RawGenerationConfig { max_new_tokens: Some(max_tokens), ..Default::default() };
        let settings = crate::generate::resolve_settings(model, over).unwrap();
        let (events, mut rx) = mpsc::unbounded_channel();
        let job = Job { prompt: prompt.to_vec(), settings, max_tokens, stop: vec![], seed: 7, drafts: false, events };
        engine.serve(job);
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

//! The engine: one thread that owns the model (and the GPU), takes generation jobs from a bounded
//! queue in arrival order, runs the sampler on them and sends their progress back as [`Event`]s.
//!
//! Up to `--batch` jobs generate together through `dg_sampler::Batch` (continuous batching; with
//! `--batch 1`, one at a time). A job joins at the next denoising step when a slot is free (with
//! its prompt's prefill) and leaves when it ends; on the GPU every step is one forward for all the
//! running jobs' canvases, on the CPU the canvases run one after another.
//!
//! KV caches survive their jobs ([`caches`]): each slot keeps the cache of the last job it ran,
//! and others wait in a [`Pool`] within a byte budget (least-recently-used out first). A job whose
//! prompt extends the tokens a cache holds (an earlier prompt and the canvases committed after it)
//! continues from the longest such cache, in its slot, another idle slot or the pool, and encodes
//! only the new tokens; the cache its slot held before is parked in the pool.
//!
//! A chat job's text keeps the markup its reply is read by ([`Extras::markup`]); an empty reply
//! may be generated again with the next seed ([`Extras::empty_retries`]); under the test hook a
//! job's canvases are replaced by given tokens ([`Extras::forced`]).
//!
//! On the GPU the model has one more slot than `--batch`, whose cache holds the prompt of
//! `/v1/systemone`'s reads: queued reads run between denoising steps on the same model (one upload
//! of the weights), each request's reads as batched read forwards after that slot's cache.
//!
//! Each job gets exactly the text it gets alone. A job whose client has gone (its event receiver
//! dropped), whose text is final (EOS, a stop sequence, `max_tokens`), or that the shutdown
//! cancels stops at its next denoising step. A panic in a generation is caught: the jobs it
//! touched are answered with an error, the slots' caches reset, and the engine keeps serving.

mod caches;

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use dg_model::{GenerationConfig, ModelDir};
use dg_sampler::{Batch, Generation, Hooks, SeededRng, SeqId, StepInfo, StopReason};
use tokio::sync::mpsc::{self, error::TryRecvError};

use super::commit::{Committer, Decode, Finish};
use super::metrics::Metrics;
use super::pool::Pool;
pub use super::prompt_images::JobImages;
use super::systemone::{ReadOn, ReadWork, Reader, ReaderHandle, ReaderState, run_work};
use crate::args::{BackendArg, WeightsArg};
use crate::batch_model::{BatchModel, ModelError, SlotCache};
use crate::text::TextCodec;
use caches::SlotCaches;

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
    pub extras: Extras,
    /// The prompt's images (a chat request's image parts), when it holds any.
    pub images: Option<Arc<JobImages>>,
    pub events: mpsc::UnboundedSender<Event>,
}

impl Job {
    /// The ids a cache of this job's prompt is keyed by: the prompt's, or with images their keys.
    fn cache_keys(&self) -> &[u32] {
        self.images.as_ref().map_or(&self.prompt, |images| &images.keys)
    }
}

/// What a job asks beyond the sampler.
#[derive(Debug, Clone, Default)]
pub struct Extras {
    /// Special tokens the text keeps (a chat reply's markup: `<|tool_call>`, `<|"|>`, ...).
    pub markup: Vec<u32>,
    /// A test hook (`dg serve --test-hooks`): per attempt, the tokens committed in place of the
    /// model's canvases, canvas by canvas, through the same decoding and parsing; the attempt
    /// ends when they run out.
    pub forced: Vec<Vec<u32>>,
    /// Times an empty reply (an EOS at the first position of the first canvas) is generated
    /// again, with the next seed.
    pub empty_retries: usize,
    /// Times this job's reply came back empty and was generated again.
    pub rerolls: usize,
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
    /// Empty replies generated again ([`Extras::empty_retries`]).
    pub rerolls: usize,
    /// The kept token ids (before the first EOS, at most `max_tokens`): what `/v1/systemone`'s
    /// thought continues its read with.
    pub tokens: Vec<u32>,
}

/// The cache a job continued from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheSource {
    /// None: the prompt is encoded from the start.
    None,
    /// A cache the model held in one of its slots (an earlier job's, not parked in the pool).
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
    /// Jobs generating at once (slots of the model, each with its KV cache).
    pub batch: usize,
    /// Bytes of parked caches the pool keeps at most, besides the slots' own (0: none).
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

/// Loads the model of `setup.dir` with `setup.batch` slots of `setup.context` positions on the
/// backend it asks for (on the GPU one more, for reads); returns the engine on it and the backend.
fn start(setup: EngineSetup, canvas: usize, vocab: usize) -> Result<(Engine, Started)> {
    let model = crate::model_dir::open(&setup.dir)?;
    let choice = crate::backend::choose(setup.backend, setup.adapter.as_deref())?;
    let gpu = match &choice.backend {
        crate::backend::Backend::Gpu(ctx) => Some(ctx.share()),
        crate::backend::Backend::Cpu => None,
    };
    let started = Started { description: choice.description.clone(), gpu };
    let report = crate::load::Report::Summary;
    let slots = match choice.backend {
        crate::backend::Backend::Gpu(_) => setup.batch + 1,
        crate::backend::Backend::Cpu => setup.batch,
    };
    let loaded = BatchModel::load(&model, choice.backend, setup.context, slots, setup.weights, report)?;
    Ok((Engine::new(loaded, setup, canvas, vocab)?, started))
}

/// The backend a started engine runs on.
#[derive(Debug)]
pub struct Started {
    /// A line saying which, and why.
    pub description: String,
    /// On the GPU, a shared handle on the model's device (what the vision tower runs on).
    pub gpu: Option<dg_gpu::GpuContext>,
}

/// Starts the engine thread on `jobs`; returns once the model is loaded, with its backend and, on
/// the GPU, the queue of the reads it runs (`reads` of them at most).
pub fn spawn(setup: EngineSetup, model: &ModelDir, jobs: mpsc::Receiver<Job>, reads: usize) -> Result<(Started, Option<ReaderHandle>)> {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (canvas, vocab) = (model.config.canvas_length, model.config.text.vocab_size);
    std::thread::Builder::new().name("dg-engine".into()).spawn(move || match start(setup, canvas, vocab) {
        Ok((mut engine, started)) => {
            let (handle, reads) = match engine.model.gpu_mut() {
                Some(gpu) => {
                    // The reads' kernels too, so that the first /v1/systemone request does not
                    // wait on the compiler (a failure leaves them to first use).
                    match gpu.warm_up_reads() {
                        Ok(w) => {
                            eprintln!("read kernels compiled ahead: {} of {} in {:.2} s", w.compiled, w.kernels, w.elapsed.as_secs_f64())
                        }
                        Err(e) => eprintln!("warning: the read kernels were not compiled ahead ({e}); the first read compiles them"),
                    }
                    let (handle, rx) = ReaderHandle::channel(reads);
                    (Some(handle), Some(rx))
                }
                None => (None, None),
            };
            let _ = ready_tx.send(Ok((started, handle)));
            engine.run(jobs, reads);
        }
        Err(e) => {
            let _ = ready_tx.send(Err(e));
        }
    })?;
    ready_rx.recv().context("the engine thread ended while loading the model")?
}

/// The model with a slot per running job, the jobs running on it, and the caches kept between
/// jobs.
struct Engine {
    model: BatchModel,
    batch: Batch<SeededRng, JobHooks, ModelError>,
    /// The slot of every admitted job that has not been answered yet.
    slot_of: Vec<(SeqId, usize)>,
    /// What each slot's cache holds.
    caches: SlotCaches,
    /// Other conversations' caches.
    pool: Pool<SlotCache>,
    setup: EngineSetup,
    decode: Decode,
    /// The prompt the read slot's cache holds (GPU).
    reader: ReaderState,
}

/// What the idle engine waited for.
enum Next {
    Job(Box<Job>),
    Read(ReadWork),
}

impl Engine {
    fn new(model: BatchModel, setup: EngineSetup, canvas: usize, vocab: usize) -> Result<Self> {
        let batch = Batch::new(canvas, vocab, setup.batch)?;
        let pool = Pool::new(setup.cache_budget);
        setup.metrics.pool_budget_bytes.store(setup.cache_budget, Ordering::Relaxed);
        let decode = setup.decode();
        let caches = SlotCaches::new(setup.batch);
        Ok(Engine { model, batch, slot_of: Vec::new(), caches, pool, setup, decode, reader: ReaderState::default() })
    }

    /// Serves `jobs` (and `reads`) until the job queue closes and the running jobs are done.
    fn run(&mut self, mut jobs: mpsc::Receiver<Job>, mut reads: Option<mpsc::Receiver<ReadWork>>) {
        // The idle engine waits for a job or a read.
        let Ok(waiter) = tokio::runtime::Builder::new_current_thread().build() else { return };
        loop {
            while let Some(work) = reads.as_mut().and_then(|r| r.try_recv().ok()) {
                self.read(work);
            }
            while self.batch.has_room() {
                // Idle: wait for a job or a read. Running: take what is queued, without waiting.
                let job = if self.batch.running() == 0 {
                    let next = waiter.block_on(async {
                        match reads.as_mut() {
                            Some(r) => tokio::select! {
                                job = jobs.recv() => job.map(|j| Next::Job(Box::new(j))),
                                Some(work) = r.recv() => Some(Next::Read(work)),
                            },
                            None => jobs.recv().await.map(|j| Next::Job(Box::new(j))),
                        }
                    });
                    match next {
                        Some(Next::Job(job)) => *job,
                        Some(Next::Read(work)) => {
                            self.read(work);
                            continue;
                        }
                        None => return,
                    }
                } else {
                    match jobs.try_recv() {
                        Ok(job) => job,
                        Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
                    }
                };
                self.setup.metrics.queue_depth.fetch_sub(1, Ordering::Relaxed);
                self.admit(job);
                self.answer_finished();
            }
            if self.batch.running() > 0 {
                self.step();
            }
            self.answer_finished();
        }
    }

    /// Runs queued reads on the GPU model after the read slot's cache (the slot after the batch's).
    fn read(&mut self, work: ReadWork) {
        let slot = self.setup.batch;
        let Some(model) = self.model.gpu_mut() else { return };
        let mut reader = Reader { model: ReadOn::Gpu(dg_gpu::SlotReader { model, slot }), state: &mut self.reader };
        if !run_work(work, &mut reader) {
            self.setup.metrics.engine_panics.fetch_add(1, Ordering::Relaxed);
            if let Some(model) = self.model.gpu_mut() {
                model.release_slot(slot);
            }
        }
    }

    /// Readies a slot's cache for `job` and adds it to the batch (it starts at the next step), or
    /// answers it when it cannot run.
    fn admit(&mut self, job: Job) {
        if job.events.is_closed() {
            self.setup.metrics.cancelled.fetch_add(1, Ordering::Relaxed);
            return;
        }
        // The first canvas's latency counts parking and restoring caches too.
        let started = Instant::now();
        let Some(slot) = self.batch.free_slot() else {
            let _ = job.events.send(Event::Failed("internal error: no free slot".into()));
            return;
        };
        let (reused, source) = self.attach(slot, job.cache_keys());
        self.caches.set_images(slot, job.images.clone());
        let (hooks, request) = JobHooks::new(job, &self.decode, &self.setup, started, reused, source);
        match self.batch.admit(&request.prompt, &request.settings, SeededRng::new(request.seed), hooks) {
            Ok(id) => self.slot_of.push((id, slot)),
            Err(rejected) => {
                rejected.hooks.finish(Err(anyhow::Error::new(rejected.reason)));
            }
        }
        self.publish();
    }

    /// One denoising step of every running job. A panic fails every running job (the model's
    /// state is unknown) and empties every slot; the engine goes on with the queue.
    fn step(&mut self) {
        let started = Instant::now();
        let (model, batch, caches) = (&mut self.model, &mut self.batch, &mut self.caches);
        let stepped = std::panic::catch_unwind(AssertUnwindSafe(|| match model {
            BatchModel::Cpu(m) => batch.step(&mut caches.reusing(&mut **m)),
            BatchModel::Gpu(m) => batch.step_resident(&mut caches.reusing(&mut **m)),
        }));
        match stepped {
            Ok(report) if report.forwarded > 0 => self.setup.metrics.step_seconds.observe(started.elapsed().as_secs_f64()),
            Ok(_) => {}
            Err(_) => {
                self.setup.metrics.engine_panics.fetch_add(1, Ordering::Relaxed);
                for (_, _, hooks) in self.batch.abandon() {
                    let _ = hooks.events.send(Event::Failed(PANICKED.into()));
                }
                self.slot_of.clear();
                for slot in 0..self.batch.capacity() {
                    self.forget(slot);
                }
            }
        }
        self.publish();
    }

    /// Answers the jobs that left the batch. A failed job's slot is emptied (its cache's contents
    /// are unknown); a finished one's keeps its cache for a later job.
    fn answer_finished(&mut self) {
        let finished: Vec<_> = self.batch.drain_finished().collect();
        for finished in finished {
            let slot = self.slot_of.iter().position(|(id, _)| *id == finished.id).map(|i| self.slot_of.swap_remove(i).1);
            if let (Err(_), Some(slot)) = (&finished.result, slot) {
                self.forget(slot);
            }
            if let Some(again) = finished.hooks.finish(finished.result.map_err(anyhow::Error::new)) {
                self.admit(again);
            }
        }
        self.publish();
    }

    fn publish(&self) {
        self.setup.metrics.running.store(self.batch.running() as i64, Ordering::Relaxed);
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
    /// The job again, with the next seed, when an empty reply is to be generated again.
    again: Option<Job>,
    /// This attempt's forced tokens ([`Extras::forced`]) not committed yet, when forced.
    forced: Option<VecDeque<u32>>,
    /// The canvas length, once a canvas is committed (the forced tokens' chunks).
    forced_canvas: Option<usize>,
    rerolls: usize,
    drafts: bool,
    prompt_tokens: usize,
    committer: Committer,
    decode: Decode,
    metrics: Arc<Metrics>,
    cancel_all: Arc<AtomicBool>,
    started: Instant,
    /// Prompt tokens found in a cache, and where that cache came from.
    reused: usize,
    source: CacheSource,
    prefill: Duration,
    first_canvas: Option<Duration>,
}

impl JobHooks {
    /// The hooks of `job` (whose first canvas's latency counts from `started`, whose first
    /// `reused` prompt tokens come from the cache `source`), and what the sampler takes.
    fn new(job: Job, decode: &Decode, setup: &EngineSetup, started: Instant, reused: usize, source: CacheSource) -> (Self, Request) {
        let decode = if job.extras.markup.is_empty() {
            decode.clone()
        } else {
            let (codec, markup) = (setup.codec.clone(), job.extras.markup.clone());
            Arc::new(move |ids: &[u32]| codec.decode_keeping(ids, &markup).unwrap_or_default()) as Decode
        };
        let committer = Committer::new(decode.clone(), job.settings.eos_token_ids.clone(), job.stop.clone(), job.max_tokens);
        let mut later = job.extras.forced.clone();
        let forced = (!later.is_empty()).then(|| later.remove(0).into());
        let again = (job.extras.empty_retries > 0).then(|| Job {
            prompt: job.prompt.clone(),
            settings: job.settings.clone(),
            max_tokens: job.max_tokens,
            stop: job.stop.clone(),
            seed: job.seed.wrapping_add(1),
            drafts: job.drafts,
            extras: Extras {
                forced: later,
                empty_retries: job.extras.empty_retries - 1,
                rerolls: job.extras.rerolls + 1,
                ..job.extras.clone()
            },
            images: job.images.clone(),
            events: job.events.clone(),
        });
        let hooks = JobHooks {
            events: job.events,
            again,
            forced,
            forced_canvas: None,
            rerolls: job.extras.rerolls,
            drafts: job.drafts,
            prompt_tokens: job.prompt.len(),
            committer,
            decode,
            metrics: setup.metrics.clone(),
            cancel_all: setup.cancel_all.clone(),
            started,
            reused,
            source,
            prefill: Duration::ZERO,
            first_canvas: None,
        };
        (hooks, Request { prompt: job.prompt, settings: job.settings, seed: job.seed })
    }

    /// Ends the job with `generation`: the held-back text, the metrics, then `Done` or `Failed`;
    /// or, when its reply is empty and may be generated again, returns the job to run again.
    fn finish(mut self, generation: Result<Generation>) -> Option<Job> {
        if generation.is_ok() {
            self.commit_forced();
            let empty = self.committer.tokens.is_empty() && self.committer.finished() == Some(Finish::Stop);
            if empty && !self.events.is_closed() && self.again.is_some() {
                eprintln!("an empty reply (EOS first): generating it again with the next seed");
                return self.again.take();
            }
        }
        let event = match generation {
            Ok(generation) => Event::Done(self.summarize(&generation)),
            Err(e) => Event::Failed(format!("generation failed: {e:#}")),
        };
        let _ = self.events.send(event);
        None
    }

    /// The next canvas of forced tokens (at most `len`), when forced.
    fn next_forced(&mut self, len: usize) -> Option<Vec<u32>> {
        let forced = self.forced.as_mut()?;
        Some(forced.drain(..len.min(forced.len())).collect())
    }

    /// Commits what is left of the forced tokens (the model's own EOS may end the sampler
    /// before they run out), in canvases of the model's length.
    fn commit_forced(&mut self) {
        let Some(len) = self.forced_canvas else { return };
        while self.forced.as_ref().is_some_and(|f| !f.is_empty()) && self.committer.finished().is_none() {
            let chunk = self.next_forced(len).unwrap_or_default();
            let delta = self.committer.push(&chunk);
            if !delta.is_empty() {
                let _ = self.events.send(Event::Text(delta));
            }
        }
    }

    fn summarize(&mut self, generation: &Generation) -> Summary {
        let (reused, source) = (self.reused, self.source);
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
            rerolls: self.rerolls,
            tokens: self.committer.tokens.clone(),
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
        self.forced_canvas = Some(tokens.len());
        let forced = self.next_forced(tokens.len());
        let delta = self.committer.push(forced.as_deref().unwrap_or(tokens));
        if !delta.is_empty() {
            let _ = self.events.send(Event::Text(delta));
        }
    }

    fn should_stop(&mut self) -> bool {
        let forced_out = self.forced.as_ref().is_some_and(VecDeque::is_empty);
        self.committer.finished().is_some() || forced_out || self.events.is_closed() || self.cancel_all.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An engine of `batch` slots on the bundled model's CPU backend whose pool keeps
    /// `cache_budget` bytes.
    fn cpu_engine(batch: usize, cache_budget: u64) -> (Engine, ModelDir) {
        engine(BackendArg::Cpu, batch, cache_budget).unwrap()
    }

    /// [`cpu_engine`] on `backend`; the loading error (no GPU adapter) as is.
    fn engine(backend: BackendArg, batch: usize, cache_budget: u64) -> Result<(Engine, ModelDir)> {
        engine_of(&crate::model_dir::bundled_dir(), backend, batch, cache_budget)
    }

    /// [`engine`] of the model in `dir`.
    fn engine_of(dir: &std::path::Path, backend: BackendArg, batch: usize, cache_budget: u64) -> Result<(Engine, ModelDir)> {
        let dir = dir.to_path_buf();
        let model = crate::model_dir::open(&dir).unwrap();
        let setup = EngineSetup {
            dir: dir.clone(),
            backend,
            adapter: None,
            weights: WeightsArg::Auto,
            context: 4096,
            batch,
            cache_budget,
            codec: Arc::new(TextCodec::from_dir(&dir).unwrap().unwrap()),
            metrics: Arc::new(Metrics::default()),
            cancel_all: Arc::new(AtomicBool::new(false)),
        };
        let (canvas, vocab) = (model.config.canvas_length, model.config.text.vocab_size);
        Ok((start(setup, canvas, vocab)?.0, model))
    }

    /// A job of `prompt` with seed `seed`, and the receiver of its events.
    fn job(model: &ModelDir, prompt: &[u32], max_tokens: usize, seed: u64) -> (Job, mpsc::UnboundedReceiver<Event>) {
        let over = dg_model::RawGenerationConfig { max_new_tokens: Some(max_tokens), ..Default::default() };
        let settings = crate::settings::resolve_settings(model, over).unwrap();
        let (events, rx) = mpsc::unbounded_channel();
        let extras = Extras::default();
        (Job { prompt: prompt.to_vec(), settings, max_tokens, stop: vec![], seed, drafts: false, extras, images: None, events }, rx)
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

    /// Queues `jobs` (prompt, max_tokens, seed) at once and serves them to the end; returns each
    /// one's text and summary.
    fn serve_all(engine: &mut Engine, model: &ModelDir, jobs: &[(Vec<u32>, usize, u64)]) -> Vec<(String, Summary)> {
        let (tx, queue) = mpsc::channel(jobs.len().max(1));
        let mut receivers = vec![];
        for (prompt, max_tokens, seed) in jobs {
            let (job, rx) = job(model, prompt, *max_tokens, *seed);
            tx.try_send(job).unwrap();
            receivers.push(rx);
        }
        drop(tx);
        engine.run(queue, None);
        receivers.iter_mut().map(answer).collect()
    }

    /// Serves a job of `prompt` alone; returns its text and summary.
    fn serve(engine: &mut Engine, model: &ModelDir, prompt: &[u32], max_tokens: usize) -> (String, Summary) {
        serve_all(engine, model, &[(prompt.to_vec(), max_tokens, 7)]).pop().unwrap()
    }

    /// Each job's text and summary served alone on a fresh CPU engine.
    fn alone(model: &ModelDir, jobs: &[(Vec<u32>, usize, u64)]) -> Vec<(String, Summary)> {
        alone_on(BackendArg::Cpu, model, jobs)
    }

    /// Each job's text and summary served alone on a fresh engine on `backend`.
    fn alone_on(backend: BackendArg, model: &ModelDir, jobs: &[(Vec<u32>, usize, u64)]) -> Vec<(String, Summary)> {
        jobs.iter()
            .map(|j| {
                let (mut engine, _) = engine(backend, 1, 0).unwrap();
                serve_all(&mut engine, model, std::slice::from_ref(j)).pop().unwrap()
            })
            .collect()
    }

    fn same(got: &(String, Summary), want: &(String, Summary), what: &str) {
        assert_eq!(got.0, want.0, "{what}");
        assert_eq!((got.1.completion_tokens, &got.1.steps_per_canvas), (want.1.completion_tokens, &want.1.steps_per_canvas), "{what}");
    }

    #[test]
    fn batched_jobs_get_the_text_they_get_alone_and_a_gone_client_frees_its_slot() {
        // Different prompt lengths and lengths of answer; more jobs than slots.
        let jobs: Vec<(Vec<u32>, usize, u64)> =
            vec![((2..30).collect(), 64, 1), ((5..9).collect(), 16, 2), ((40..101).collect(), 40, 3), ((2..12).collect(), 48, 4)];
        let (mut engine, model) = cpu_engine(2, 0);
        let want = alone(&model, &jobs);
        let metrics = engine.setup.metrics.clone();
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
        engine.run(queue, None);
        for (i, (rx, want)) in receivers.iter_mut().zip(&want).enumerate() {
            let got = answer(rx);
            same(&got, want, &format!("job {i}"));
            assert_eq!((got.1.reused_tokens, got.1.cache), (0, CacheSource::None));
            assert!(got.1.prefill > Duration::ZERO && got.1.first_canvas.is_some(), "job {i}: {:?}", got.1);
        }
        assert_eq!(metrics.cancelled.load(Ordering::Relaxed), 1);
        assert_eq!((metrics.queue_depth.load(Ordering::Relaxed), metrics.running.load(Ordering::Relaxed)), (0, 0));
    }

    #[test]
    fn a_prompt_that_extends_the_cache_reuses_it_and_gives_the_same_answer() {
        let (mut warm, model) = cpu_engine(1, 1 << 30);
        let first: Vec<u32> = (2..40).collect();
        let (_, s) = serve(&mut warm, &model, &first, 64);
        assert_eq!(s.reused_tokens, 0);
        let held = warm.caches.held[0].clone();
        assert!(held.len() >= first.len() && held.starts_with(&first), "the slot's cache holds the first prompt");
        // The next turn: everything the cache holds, and more.
        let mut next = held.clone();
        next.extend([7, 8, 9, 10]);
        let reused = serve(&mut warm, &model, &next, 40);
        assert_eq!((reused.1.reused_tokens, reused.1.cache), (next.len() - 4, CacheSource::Resident));
        let (mut cold, _) = cpu_engine(1, 1 << 30);
        let fresh = serve(&mut cold, &model, &next, 40);
        assert_eq!(fresh.1.reused_tokens, 0);
        same(&reused, &fresh, "reused and fresh");
        // A prompt that does not extend the cache starts from an empty one.
        let (_, other) = serve(&mut warm, &model, &first[..10], 32);
        assert_eq!(other.reused_tokens, 0);
    }

    fn fixture(name: &str) -> PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures").join(name)
    }

    /// A job of `prompt` (one image token per image) with `images` from the image-processor
    /// fixture, on the vision-generate fixture's tower at 70 soft tokens.
    fn image_job(model: &ModelDir, prompt: &[u32], images: &[&str]) -> (Job, mpsc::UnboundedReceiver<Event>) {
        let tower = crate::images::VisionTower::load(model, crate::images::TowerDevice::Cpu).unwrap();
        let processor = tower.spec().processor(70).unwrap();
        let files = fixture("image-processor");
        let encoded = images.iter().map(|name| tower.encode(&std::fs::read(files.join(name)).unwrap(), &processor).unwrap()).collect();
        let (ids, images) = JobImages::new(tower.spec(), prompt, encoded).unwrap();
        let (mut job, rx) = job(model, &ids, 16, 7);
        job.images = Some(Arc::new(images));
        (job, rx)
    }

    fn serve_job(engine: &mut Engine, (job, mut rx): (Job, mpsc::UnboundedReceiver<Event>)) -> (String, Summary) {
        let (tx, queue) = mpsc::channel(1);
        tx.try_send(job).unwrap();
        drop(tx);
        engine.run(queue, None);
        answer(&mut rx)
    }

    #[test]
    fn image_prompts_reuse_caches_only_where_the_images_are_the_same_bytes() {
        let dir = fixture("vision-generate");
        let image = 19;
        let (mut warm, model) = engine_of(&dir, BackendArg::Cpu, 1, 1 << 30).unwrap();
        let first = [2, 5, 309, image, 40, 41];
        let (job, rx) = image_job(&model, &first, &["wide.png"]);
        let first_ids = job.prompt.clone();
        serve_job(&mut warm, (job, rx));
        let canvases = warm.caches.held[0][first_ids.len()..].to_vec();
        // The next turn holds the first whole (its image the same bytes) and a second image.
        let mut next: Vec<u32> = first.to_vec();
        next.extend(&canvases);
        next.extend([42, image, 43]);
        let fresh = |images: &[&str]| {
            let (mut cold, _) = engine_of(&dir, BackendArg::Cpu, 1, 0).unwrap();
            serve_job(&mut cold, image_job(&model, &next, images))
        };
        let reused = serve_job(&mut warm, image_job(&model, &next, &["wide.png", "tall.png"]));
        assert_eq!((reused.1.reused_tokens, reused.1.cache), (first_ids.len() + canvases.len(), CacheSource::Resident));
        same(&reused, &fresh(&["wide.png", "tall.png"]), "the second image placed after a reused first");
        // The same text with another first image: nothing past it is reused.
        let (mut warm, _) = engine_of(&dir, BackendArg::Cpu, 1, 1 << 30).unwrap();
        serve_job(&mut warm, image_job(&model, &first, &["wide.png"]));
        let other = serve_job(&mut warm, image_job(&model, &next, &["tall.png", "tall.png"]));
        assert_eq!((other.1.reused_tokens, other.1.cache), (0, CacheSource::None));
        let want = fresh(&["tall.png", "tall.png"]);
        same(&other, &want, "another first image");
        assert_ne!(other.0, reused.0, "the first image does not change the reply");
    }

    #[test]
    fn interleaved_conversations_continue_from_the_pool_and_a_small_budget_evicts() {
        let (mut engine, model) = cpu_engine(1, 1 << 30);
        let a: Vec<u32> = (2..40).collect();
        let b: Vec<u32> = (100..170).collect();
        serve(&mut engine, &model, &a, 16);
        let a_cached = engine.caches.held[0].clone();
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
        let (mut cold, _) = cpu_engine(1, 1 << 30);
        let (fresh, f) = serve(&mut cold, &model, &a2, 16);
        assert_eq!((f.cache, text), (CacheSource::None, fresh), "the same text as without reuse");
        // A third turn of A continues from the slot's own cache.
        let mut a3 = engine.caches.held[0].clone();
        a3.push(5);
        assert_eq!(serve(&mut engine, &model, &a3, 16).1.cache, CacheSource::Resident);

        // A budget smaller than one cache keeps none: A's next turn is encoded from the start.
        let (mut small, _) = cpu_engine(1, 1);
        serve(&mut small, &model, &a, 16);
        serve(&mut small, &model, &b, 16);
        let (_, s) = serve(&mut small, &model, &a2, 16);
        assert_eq!((s.cache, s.reused_tokens), (CacheSource::None, 0));
        let m = &small.setup.metrics;
        assert_eq!((small.pool.len(), m.pool_evictions.load(Ordering::Relaxed)), (0, 2));
    }

    #[test]
    fn batched_jobs_continue_from_the_pool_and_from_other_slots_while_others_run() {
        let (mut engine, model) = cpu_engine(2, 1 << 30);
        let a: Vec<u32> = (2..40).collect();
        let b: Vec<u32> = (100..170).collect();
        let c: Vec<u32> = (200..260).collect();
        serve(&mut engine, &model, &a, 16);
        let a_cached = engine.caches.held[0].clone();
        let mut a2 = a_cached.clone();
        a2.extend([7, 8, 9]);
        // B arrives first and takes slot 0 (A's cache goes to the pool); A's next turn runs beside
        // it in slot 1, from the pool, encoding only its new tokens.
        let jobs = vec![(b.clone(), 48, 1), (a2.clone(), 32, 2)];
        let got = serve_all(&mut engine, &model, &jobs);
        assert_eq!((got[0].1.cache, got[0].1.reused_tokens), (CacheSource::None, 0));
        assert_eq!((got[1].1.cache, got[1].1.reused_tokens), (CacheSource::Pool, a_cached.len()));
        let want = alone(&model, &jobs);
        same(&got[0], &want[0], "B");
        same(&got[1], &want[1], "A's next turn");
        // A's third turn beside C: it takes slot 0 (B's cache parked), and A's cache, idle in slot 1,
        // moves there; C gets slot 1, now empty.
        let mut a3 = engine.caches.held[1].clone();
        assert!(a3.starts_with(&a2));
        a3.push(5);
        let jobs = vec![(a3.clone(), 16, 4), (c, 32, 3)];
        let got = serve_all(&mut engine, &model, &jobs);
        assert_eq!((got[0].1.cache, got[0].1.reused_tokens), (CacheSource::Resident, a3.len() - 1));
        assert_eq!((got[1].1.cache, got[1].1.reused_tokens), (CacheSource::None, 0));
        let want = alone(&model, &jobs);
        same(&got[0], &want[0], "A's third turn");
        same(&got[1], &want[1], "C");
        let metrics = &engine.setup.metrics;
        assert_eq!(metrics.reused_prompt_tokens.load(Ordering::Relaxed), (a_cached.len() + a3.len() - 1) as u64);
    }

    /// On the GPU a cache moves between slots as a device copy (`GpuModel::snapshot_slot`,
    /// `restore_slot`): a conversation continues from the pool into another slot, and from an
    /// idle slot into the one it gets, with the text it gets alone.
    #[test]
    fn gpu_caches_move_between_slots_and_give_the_text_alone() {
        let (mut engine, model) = match engine(BackendArg::Gpu, 2, 1 << 30) {
            Ok(x) => x,
            Err(e) if std::env::var("DG_ALLOW_NO_GPU").as_deref() == Ok("1") => {
                eprintln!("SKIP gpu_caches_move_between_slots_and_give_the_text_alone: {e:#}");
                return;
            }
            Err(e) => panic!("no GPU engine (install lavapipe, or set DG_ALLOW_NO_GPU=1 to skip): {e:#}"),
        };
        // Up to two canvases: A's cache holds its prompt and its first canvas unless it ended there.
        let a: Vec<u32> = (2..30).collect();
        serve(&mut engine, &model, &a, 40);
        let a_cached = engine.caches.held[0].clone();
        assert!(a_cached.starts_with(&a), "{a_cached:?}");
        let mut a2 = a_cached.clone();
        a2.extend([7, 8, 9]);
        let jobs = vec![((100..150).collect(), 16, 1), (a2.clone(), 16, 2)];
        let got = serve_all(&mut engine, &model, &jobs);
        assert_eq!((got[1].1.cache, got[1].1.reused_tokens), (CacheSource::Pool, a_cached.len()));
        let want = alone_on(BackendArg::Gpu, &model, &jobs);
        same(&got[0], &want[0], "B");
        same(&got[1], &want[1], "A's next turn, from the pool into slot 1");
        let mut a3 = engine.caches.held[1].clone();
        a3.push(5);
        let jobs = vec![(a3.clone(), 16, 3)];
        let got = serve_all(&mut engine, &model, &jobs);
        assert_eq!((got[0].1.cache, got[0].1.reused_tokens), (CacheSource::Resident, a3.len() - 1));
        same(&got[0], &alone_on(BackendArg::Gpu, &model, &jobs)[0], "A's third turn, from slot 1 into slot 0");
    }
}

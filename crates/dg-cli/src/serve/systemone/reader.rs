//! The reader: one thread that owns a CPU copy of the model and runs reads (`dg_sampler::read`)
//! for `/v1/systemone`, one request's reads after another, from a bounded queue.
//!
//! Every read of a request's group (its samples, its re-reads) runs on the cache of the group's
//! prompt, encoded once; the cache of the last prompts is kept, so a request that repeats a prompt
//! (the same state and questions) encodes nothing. The canvases are never committed: reads leave
//! the cache as the prompt left it.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use dg_cpu::{CpuModel, cache::KvCache};
use dg_model::{GenerationConfig, ModelDir};
use dg_sampler::{Read, ReadRequest, SeededRng, read};
use tokio::sync::{mpsc, oneshot};

/// Prompts whose caches the reader keeps.
const KEPT_PROMPTS: usize = 8;

/// Where a request's time went on the reader.
#[derive(Debug, Default, Clone, Copy)]
pub struct Timing {
    pub prefill: Duration,
    pub reads: Duration,
}

/// What a closure sent to the reader can do: encode a prompt (or find its cache), then read.
pub struct Reader {
    model: CpuModel,
    settings: GenerationConfig,
    /// The prompt whose cache the model holds.
    current: Option<Vec<u32>>,
    /// Caches of earlier prompts, the most recent first.
    kept: VecDeque<(Vec<u32>, KvCache)>,
    pub timing: Timing,
}

impl Reader {
    /// Makes `prompt` the model's cache: the one it holds, a kept one, else encoded (the cache it
    /// replaces is kept).
    pub fn prompt(&mut self, prompt: &[u32]) -> Result<()> {
        if self.current.as_deref() == Some(prompt) {
            return Ok(());
        }
        let started = Instant::now();
        if let Some(previous) = self.current.take() {
            self.kept.push_front((previous, self.model.take_cache()));
            self.kept.truncate(KEPT_PROMPTS);
        }
        match self.kept.iter().position(|(p, _)| p == prompt) {
            Some(i) => {
                let (_, cache) = self.kept.remove(i).expect("found above");
                self.model.put_cache(cache)?;
            }
            None => {
                self.model.reset();
                self.model.encode(prompt)?;
            }
        }
        self.current = Some(prompt.to_vec());
        self.timing.prefill += started.elapsed();
        Ok(())
    }

    /// One read on the current prompt's cache.
    pub fn read(&mut self, request: &ReadRequest<'_>, seed: u64) -> Result<Read> {
        let started = Instant::now();
        let result = read(&mut self.model, request, &self.settings, &mut SeededRng::new(seed));
        self.timing.reads += started.elapsed();
        result.map_err(anyhow::Error::new)
    }
}

/// Work for the reader: runs on its thread with the reader.
pub type Work = Box<dyn FnOnce(&mut Reader) + Send>;

/// The sending side of the reader's queue.
#[derive(Debug, Clone)]
pub struct ReaderHandle {
    work: mpsc::Sender<Work>,
}

/// Why work was not queued.
#[derive(Debug)]
pub enum Refused {
    /// The queue is full.
    Full,
    /// The reader has stopped.
    Gone,
}

impl ReaderHandle {
    /// Loads the model of `dir` on the CPU and starts the reader thread with a queue of `queue`.
    pub fn spawn(dir: &ModelDir, settings: GenerationConfig, queue: usize) -> Result<Self> {
        let weights = dir.load_weights().context("cannot load the weights for /v1/systemone's reader")?;
        let model = CpuModel::new(dir.config.clone(), weights);
        let (tx, mut rx) = mpsc::channel::<Work>(queue.max(1));
        std::thread::Builder::new().name("dg-reader".into()).spawn(move || {
            let mut reader = Reader { model, settings, current: None, kept: VecDeque::new(), timing: Timing::default() };
            while let Some(work) = rx.blocking_recv() {
                reader.timing = Timing::default();
                if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work(&mut reader))).is_err() {
                    reader.model.reset();
                    reader.current = None;
                    reader.kept.clear();
                }
            }
        })?;
        Ok(ReaderHandle { work: tx })
    }

    /// Runs `f` on the reader and waits for its result (`None`: it panicked or the reader stopped).
    pub async fn run<T: Send + 'static>(&self, f: impl FnOnce(&mut Reader) -> T + Send + 'static) -> Result<Option<(T, Timing)>, Refused> {
        let (tx, rx) = oneshot::channel();
        let work: Work = Box::new(move |reader| {
            let out = f(reader);
            let _ = tx.send((out, reader.timing));
        });
        self.work.try_send(work).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => Refused::Full,
            mpsc::error::TrySendError::Closed(_) => Refused::Gone,
        })?;
        Ok(rx.await.ok())
    }
}

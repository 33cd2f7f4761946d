//! The reader: runs reads (`dg_sampler::read_batch`) for `/v1/systemone` and `dg read`, one
//! request's reads after another, from a bounded queue: on the GPU on the model the generation
//! engine owns (the engine runs queued reads between its denoising steps, after the cache of a
//! slot kept for reads: `dg_gpu::SlotReader`), on the CPU on a thread of its own with an f32 copy
//! of the model.
//!
//! Every read of a request's group (its samples, its re-reads) runs on the cache of the group's
//! prompt, encoded once, and a group's reads run as one batched forward on the GPU. The cache of
//! the last prompt is kept (on the CPU, of the last few), so a request that repeats a prompt (the
//! same state and questions) encodes nothing; on the GPU a prompt that shares only a prefix with
//! the last one (the system text of the same questions before another state) keeps that prefix's
//! K/V and encodes the rest (the pool's `shared_prefix`, [`GpuModel::truncate_slot`]). The
//! canvases are never committed: reads leave the cache as the prompt left it.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use dg_cpu::{CpuModel, cache::KvCache};
use dg_gpu::{GpuModel, SlotReader};
use dg_model::{GenerationConfig, ModelDir};
use dg_sampler::{Read, ReadRequest, SeededRng, read, read_batch};
use tokio::sync::{mpsc, oneshot};

use crate::serve::pool::shared_prefix;
use crate::serve::prompt_images::JobImages;

/// Prompts whose caches the CPU reader keeps.
const KEPT_PROMPTS: usize = 8;

/// Where a request's time went on the reader.
#[derive(Debug, Default, Clone, Copy)]
pub struct Timing {
    pub prefill: Duration,
    pub reads: Duration,
    /// Tokens of the prompts made the model's cache, and of those the ones a cache held already.
    pub prompt_tokens: usize,
    pub reused_tokens: usize,
}

/// What the reader keeps from one request to the next.
#[derive(Default)]
pub struct ReaderState {
    /// The prompt whose cache the model holds.
    current: Option<Vec<u32>>,
    /// Caches of earlier prompts, the most recent first (CPU only).
    kept: VecDeque<(Vec<u32>, KvCache)>,
    pub timing: Timing,
}

impl ReaderState {
    /// Forgets every prompt (after a panic: the model's state is unknown).
    pub fn forget(&mut self) {
        self.current = None;
        self.kept.clear();
    }
}

/// The model reads run on.
pub enum ReadOn<'m> {
    Cpu(&'m mut CpuModel),
    Gpu(SlotReader<'m>),
}

/// What a closure sent to the reader can do: encode a prompt (or find its cache), then read.
pub struct Reader<'m> {
    pub model: ReadOn<'m>,
    pub state: &'m mut ReaderState,
}

impl Reader<'_> {
    /// Makes `prompt` the model's cache: the one it holds, a kept one (CPU), else encoded (on the
    /// CPU the cache it replaces is kept). On the GPU the prompt is encoded in parts, split at
    /// `segments` (sorted positions inside it, none inside an image's soft tokens), and the cache
    /// it replaces keeps the longest run of whole parts the two share, so a kept prefix ends where
    /// a fresh encode splits too: the encoder's products are planned by a chunk's length, and a
    /// prompt gets the same bits whether its first parts were kept or encoded now. A prompt
    /// holding `images` (its placeholders expanded) is encoded with their rows and its cache is
    /// found by their keys (each image's soft tokens standing for its bytes), so prompts that
    /// differ in an image share no cache past it.
    pub fn prompt(&mut self, prompt: &[u32], segments: &[usize], images: Option<&JobImages>) -> Result<()> {
        let state = &mut *self.state;
        state.timing.prompt_tokens += prompt.len();
        let keys = images.map_or(prompt, |images| &images.keys[..]);
        if state.current.as_deref() == Some(keys) {
            state.timing.reused_tokens += prompt.len();
            return Ok(());
        }
        let started = Instant::now();
        let previous = state.current.take();
        let reused = match &mut self.model {
            ReadOn::Cpu(model) => {
                if let Some(previous) = previous {
                    state.kept.push_front((previous, model.take_cache()));
                    state.kept.truncate(KEPT_PROMPTS);
                }
                match state.kept.iter().position(|(p, _)| p == keys) {
                    Some(i) => {
                        let (_, cache) = state.kept.remove(i).expect("found above");
                        model.put_cache(cache)?;
                        prompt.len()
                    }
                    None => {
                        model.reset();
                        match images {
                            Some(images) => model.encode_with_images(prompt, &images.embeddings)?,
                            None => model.encode(prompt)?,
                        }
                        0
                    }
                }
            }
            ReadOn::Gpu(r) => {
                // The parts the slot's cache shares with the prompt (the system text of the same
                // questions before another state) stay; the others are encoded.
                let shared = previous.as_deref().map_or(0, |p| shared_prefix(keys, p));
                let kept = segments.iter().copied().take_while(|&s| s <= shared).last().unwrap_or(0);
                let reused = r.model.truncate_slot(r.slot, kept);
                let ends = segments.iter().copied().filter(|&s| s > reused).chain([prompt.len()]);
                let mut start = reused;
                for end in ends {
                    let part = &prompt[start..end];
                    match images.filter(|i| part.contains(&i.image_token)) {
                        Some(images) => {
                            let before = prompt[..start].iter().filter(|&&id| id == images.image_token).count();
                            r.model.encode_slot_with_images(r.slot, part, images.rows(before, part))?
                        }
                        None => r.model.encode_slot(r.slot, part)?,
                    }
                    start = end;
                }
                reused
            }
        };
        state.timing.reused_tokens += reused;
        state.current = Some(keys.to_vec());
        state.timing.prefill += started.elapsed();
        Ok(())
    }

    /// Reads `requests` on the current prompt's cache, read `i` drawing from `seeds[i]`: on the
    /// GPU as batched forwards (each read what it is alone), on the CPU one after another.
    pub fn read(&mut self, requests: &[ReadRequest<'_>], seeds: &[u64], settings: &GenerationConfig) -> Result<Vec<Read>> {
        let started = Instant::now();
        let mut rngs: Vec<SeededRng> = seeds.iter().map(|&s| SeededRng::new(s)).collect();
        let reads = match &mut self.model {
            ReadOn::Cpu(model) => requests
                .iter()
                .zip(&mut rngs)
                .map(|(r, rng)| read(&mut **model, r, settings, rng).map_err(anyhow::Error::new))
                .collect::<Result<Vec<_>>>(),
            ReadOn::Gpu(r) => read_batch(r, requests, settings, &mut rngs).map_err(anyhow::Error::new),
        };
        self.state.timing.reads += started.elapsed();
        reads
    }
}

/// Work for the reader: runs with the reader where the model is.
pub type Work = Box<dyn for<'m> FnOnce(&mut Reader<'m>) + Send>;

/// Runs `work` with a fresh timing; a panic forgets the prompts (and, on the CPU, resets the model
/// through `on_panic`).
pub fn run_work(work: Work, reader: &mut Reader<'_>) -> bool {
    reader.state.timing = Timing::default();
    let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work(reader))).is_ok();
    if !ok {
        reader.state.forget();
    }
    ok
}

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
    /// A queue of `queue` whose work the receiver's owner runs (the engine, on its GPU model).
    pub fn channel(queue: usize) -> (Self, mpsc::Receiver<Work>) {
        let (tx, rx) = mpsc::channel::<Work>(queue.max(1));
        (ReaderHandle { work: tx }, rx)
    }

    /// Loads the model of `dir` on the CPU and starts the reader thread with a queue of `queue`.
    pub fn spawn_cpu(dir: &ModelDir, queue: usize) -> Result<Self> {
        let weights = dir.load_weights().context("cannot load the weights for the reader")?;
        let mut model = CpuModel::new(dir.config.clone(), weights);
        Self::spawn(queue, move |work, state| {
            if !run_work(work, &mut Reader { model: ReadOn::Cpu(&mut model), state }) {
                model.reset();
            }
        })
    }

    /// Starts the reader thread on `model` (a GPU model of its own: `dg read`), reading after
    /// slot 0's cache.
    pub fn spawn_gpu(mut model: GpuModel, queue: usize) -> Result<Self> {
        Self::spawn(queue, move |work, state| {
            run_work(work, &mut Reader { model: ReadOn::Gpu(SlotReader { model: &mut model, slot: 0 }), state });
        })
    }

    fn spawn(queue: usize, mut run: impl FnMut(Work, &mut ReaderState) + Send + 'static) -> Result<Self> {
        let (handle, mut rx) = Self::channel(queue);
        std::thread::Builder::new().name("dg-reader".into()).spawn(move || {
            let mut state = ReaderState::default();
            while let Some(work) = rx.blocking_recv() {
                run(work, &mut state);
            }
        })?;
        Ok(handle)
    }

    /// Runs `f` on the reader and waits for its result (`None`: it panicked or the reader stopped).
    pub async fn run<T: Send + 'static>(
        &self,
        f: impl for<'m> FnOnce(&mut Reader<'m>) -> T + Send + 'static,
    ) -> Result<Option<(T, Timing)>, Refused> {
        let (tx, rx) = oneshot::channel();
        let work: Work = Box::new(move |reader| {
            let out = f(reader);
            let _ = tx.send((out, reader.state.timing));
        });
        self.work.try_send(work).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => Refused::Full,
            mpsc::error::TrySendError::Closed(_) => Refused::Gone,
        })?;
        Ok(rx.await.ok())
    }
}

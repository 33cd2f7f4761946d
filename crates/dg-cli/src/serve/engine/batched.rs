//! `dg serve --batch N`: up to N jobs generating together through `dg_sampler::Batch`
//! (continuous batching). Queued jobs join whenever a slot is free, at the next denoising step,
//! with their prompt's prefill; a job leaves when it ends (EOS, a stop sequence, `max_tokens`, its
//! client gone, the shutdown) and its slot goes to the next. On the GPU a step is one forward for
//! every running job's canvas (`dg_gpu::GpuModel` with a KV cache per slot); on the CPU the
//! canvases run one after another. Each job gets the tokens it gets alone. Prompts are encoded
//! from their start: there is no cache reuse between jobs here (`--batch 1` has it).

use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;
use std::time::Instant;

use anyhow::Result;
use dg_sampler::{Batch, SeededRng};
use tokio::sync::mpsc::{self, error::TryRecvError};

use super::{CacheSource, EngineSetup, Event, Job, JobHooks, PANICKED};
use crate::batch_model::{BatchModel, ModelError};
use crate::serve::commit::Decode;

/// The model with a slot per job, and the jobs running on it.
pub(super) struct BatchEngine {
    model: BatchModel,
    batch: Batch<SeededRng, JobHooks, ModelError>,
    setup: EngineSetup,
    decode: Decode,
}

impl BatchEngine {
    /// Loads the model with `setup.batch` slots of `setup.context` positions; returns the engine
    /// and a line describing the backend.
    pub(super) fn load(setup: EngineSetup, canvas: usize, vocab: usize) -> Result<(Self, String)> {
        let model = crate::model_dir::open(&setup.dir)?;
        let choice = crate::backend::choose(setup.backend, setup.adapter.as_deref())?;
        let description = choice.description;
        let report = crate::load::Report::Summary;
        let model = BatchModel::load(&model, choice.backend, setup.context, setup.batch, setup.weights, report)?;
        let batch = Batch::new(canvas, vocab, setup.batch)?;
        let decode = setup.decode();
        Ok((BatchEngine { model, batch, setup, decode }, description))
    }

    /// Serves `jobs` until the queue closes and the running jobs are done.
    pub(super) fn run(mut self, mut jobs: mpsc::Receiver<Job>) {
        loop {
            while self.batch.has_room() {
                // Idle: wait for a job. Running: take what is queued, without waiting.
                let job = if self.batch.running() == 0 {
                    match jobs.blocking_recv() {
                        Some(job) => job,
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
            }
            if self.batch.running() > 0 {
                self.step();
            }
            self.answer_finished();
        }
    }

    /// Adds `job` to the batch (it starts at the next step), or answers it when it cannot run.
    fn admit(&mut self, job: Job) {
        if job.events.is_closed() {
            self.setup.metrics.cancelled.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let (hooks, request) = JobHooks::new(job, &self.decode, &self.setup, Instant::now());
        if let Err(rejected) = self.batch.admit(&request.prompt, &request.settings, SeededRng::new(request.seed), hooks) {
            rejected.hooks.finish(Err(anyhow::Error::new(rejected.reason)), 0, CacheSource::None);
        }
        self.publish();
    }

    /// One denoising step of every running job. A panic fails every running job (the model's
    /// state is unknown) and empties every slot; the engine goes on with the queue.
    fn step(&mut self) {
        let started = Instant::now();
        let (model, batch) = (&mut self.model, &mut self.batch);
        match std::panic::catch_unwind(AssertUnwindSafe(|| model.step(batch))) {
            Ok(report) if report.forwarded > 0 => self.setup.metrics.step_seconds.observe(started.elapsed().as_secs_f64()),
            Ok(_) => {}
            Err(_) => {
                self.setup.metrics.engine_panics.fetch_add(1, Ordering::Relaxed);
                for (_, _, hooks) in self.batch.abandon() {
                    let _ = hooks.events.send(Event::Failed(PANICKED.into()));
                }
                for slot in 0..self.batch.capacity() {
                    self.model.release(slot);
                }
            }
        }
        self.publish();
    }

    /// Answers the jobs that left the batch.
    fn answer_finished(&mut self) {
        for finished in self.batch.drain_finished() {
            finished.hooks.finish(finished.result.map_err(anyhow::Error::new), 0, CacheSource::None);
        }
    }

    fn publish(&self) {
        self.setup.metrics.running.store(self.batch.running() as i64, Ordering::Relaxed);
    }
}

//! A model wrapper that times the sampler's calls: the prompt prefill (first encode), the
//! encodes of committed canvases, and the canvas forwards (with the per-row sampler work, for a
//! resident model).

use std::time::{Duration, Instant};

use dg_sampler::{CategoricalRequest, DenoiseModel, ResidentModel, RowResult};

/// `M` with the time spent in each kind of call.
#[derive(Debug)]
pub struct Timed<M> {
    pub inner: M,
    pub prefill: Duration,
    pub commits: Duration,
    pub forwards: Duration,
    encodes: usize,
}

impl<M> Timed<M> {
    pub fn new(inner: M) -> Self {
        Timed { inner, prefill: Duration::ZERO, commits: Duration::ZERO, forwards: Duration::ZERO, encodes: 0 }
    }
}

impl<M> Timed<M> {
    fn timed_encode<E>(&mut self, encode: impl FnOnce(&mut M) -> Result<(), E>) -> Result<(), E> {
        let start = Instant::now();
        let result = encode(&mut self.inner);
        let took = start.elapsed();
        if self.encodes == 0 {
            self.prefill += took;
        } else {
            self.commits += took;
        }
        self.encodes += 1;
        result
    }
}

impl<M: DenoiseModel> DenoiseModel for Timed<M> {
    type Error = M::Error;

    fn encode(&mut self, ids: &[u32]) -> Result<(), M::Error> {
        self.timed_encode(|m| m.encode(ids))
    }

    fn canvas_forward(&mut self, canvas: &[u32], sc: Option<&[f32]>, logits: &mut [f32]) -> Result<(), M::Error> {
        let start = Instant::now();
        let result = self.inner.canvas_forward(canvas, sc, logits);
        self.forwards += start.elapsed();
        result
    }
}

impl<M: ResidentModel> ResidentModel for Timed<M> {
    type Error = M::Error;

    fn encode(&mut self, ids: &[u32]) -> Result<(), M::Error> {
        self.timed_encode(|m| m.encode(ids))
    }

    /// Timed as a forward: the canvas forward and the per-row work are one submit.
    fn denoise_rows(
        &mut self,
        canvas: &[u32],
        sc: bool,
        temperature: f32,
        draw: CategoricalRequest<'_>,
        rows: &mut [RowResult],
    ) -> Result<(), M::Error> {
        let start = Instant::now();
        let result = self.inner.denoise_rows(canvas, sc, temperature, draw, rows);
        self.forwards += start.elapsed();
        result
    }
}

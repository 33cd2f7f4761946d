//! A model wrapper that times the sampler's calls: the prompt prefill (first encode), the
//! encodes of committed canvases, and the canvas forwards.

use std::time::{Duration, Instant};

use dg_sampler::DenoiseModel;

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

impl<M: DenoiseModel> DenoiseModel for Timed<M> {
    type Error = M::Error;

    fn encode(&mut self, ids: &[u32]) -> Result<(), M::Error> {
        let start = Instant::now();
        let result = self.inner.encode(ids);
        let took = start.elapsed();
        if self.encodes == 0 {
            self.prefill += took;
        } else {
            self.commits += took;
        }
        self.encodes += 1;
        result
    }

    fn canvas_forward(&mut self, canvas: &[u32], sc: Option<&[f32]>, logits: &mut [f32]) -> Result<(), M::Error> {
        let start = Instant::now();
        let result = self.inner.canvas_forward(canvas, sc, logits);
        self.forwards += start.elapsed();
        result
    }
}

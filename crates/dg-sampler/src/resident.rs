//! The model side of a denoising step whose logits never leave the device that computes them.
//!
//! `DiffusionGemmaGenerationMixin._denoising_step` turns the [C, V] raw logits into a handful of
//! numbers per canvas row: the temperature-scaled entropy, the argmax and the categorical sample
//! (then acceptance, renoising and stopping need only those). A [`ResidentModel`] runs the canvas
//! forward and that per-row work where the logits are (dg-gpu on the GPU), keeps the scaled logits
//! there as the next step's self-conditioning input, and returns one [`RowResult`] per row: a few
//! bytes per position instead of V floats.
//!
//! The randomness still comes from the sampler's [`crate::RandomSource`]: the model receives the
//! per-row uniforms of the inverse-CDF draw (a seeded run) or the recorded ids (a replay) as a
//! [`crate::CategoricalRequest`], so seeded runs use the same random numbers on every backend and
//! replays stay exact.

use crate::rng::CategoricalRequest;

/// What a resident model reports for one canvas row of a step.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RowResult {
    /// Entropy (nats) of `softmax(raw / T)`.
    pub entropy: f32,
    /// First index of the row's maximum.
    pub argmax: u32,
    /// The categorical sample (or the given id in a replay).
    pub sampled: u32,
    /// The first non-finite scaled logit of the row, `(column, value)`; the other fields are then
    /// meaningless.
    pub non_finite: Option<(usize, f32)>,
}

/// A model that runs a step's canvas forward and per-row reductions where its logits live.
pub trait ResidentModel {
    type Error: std::error::Error + Send + Sync + 'static;

    /// Encodes `ids` causally into the KV cache at the next positions (as
    /// [`crate::DenoiseModel::encode`]).
    fn encode(&mut self, ids: &[u32]) -> Result<(), Self::Error>;

    /// One canvas forward at the C positions after the cache, then per row: `proc = raw / temperature`
    /// (kept by the model as the next call's self-conditioning input), its entropy, argmax, and the
    /// categorical sample as `draw` asks. `self_conditioning` is false on a block's first step, else
    /// the previous call's scaled logits feed the forward. Writes `rows` (C entries).
    fn denoise_rows(
        &mut self,
        canvas: &[u32],
        self_conditioning: bool,
        temperature: f32,
        draw: CategoricalRequest<'_>,
        rows: &mut [RowResult],
    ) -> Result<(), Self::Error>;
}

impl<M: ResidentModel + ?Sized> ResidentModel for &mut M {
    type Error = M::Error;
    fn encode(&mut self, ids: &[u32]) -> Result<(), Self::Error> {
        (**self).encode(ids)
    }
    fn denoise_rows(
        &mut self,
        canvas: &[u32],
        self_conditioning: bool,
        temperature: f32,
        draw: CategoricalRequest<'_>,
        rows: &mut [RowResult],
    ) -> Result<(), Self::Error> {
        (**self).denoise_rows(canvas, self_conditioning, temperature, draw, rows)
    }
}

/// Any [`crate::DenoiseModel`] as a [`ResidentModel`], with the per-row work done on the host by the
/// sampler's own row functions ([`crate::rows`]): the reference against which device
/// implementations of [`ResidentModel::denoise_rows`] are checked. Holds two C·V buffers.
#[derive(Debug)]
pub struct HostRows<M> {
    pub model: M,
    vocab_size: usize,
    logits: Vec<f32>,
    scaled: Vec<f32>,
    stats: Vec<crate::RowStat>,
}

impl<M: crate::DenoiseModel> HostRows<M> {
    pub fn new(model: M, vocab_size: usize) -> Self {
        HostRows { model, vocab_size, logits: Vec::new(), scaled: Vec::new(), stats: Vec::new() }
    }

    /// The scaled logits kept as the next self-conditioning input, taken out (a sequence's state).
    pub(crate) fn take_scaled(&mut self) -> Vec<f32> {
        std::mem::take(&mut self.scaled)
    }

    /// Puts back scaled logits taken out with [`Self::take_scaled`].
    pub(crate) fn put_scaled(&mut self, scaled: Vec<f32>) {
        self.scaled = scaled;
    }
}

/// Errors of [`HostRows`]: the model's, or a draw that does not fit the canvas.
#[derive(Debug, thiserror::Error)]
pub enum HostRowsError<E: std::error::Error + 'static> {
    #[error(transparent)]
    Model(E),
    #[error("the categorical draw has {got} rows, the canvas {expected}")]
    DrawRows { expected: usize, got: usize },
}

impl<M: crate::DenoiseModel> ResidentModel for HostRows<M> {
    type Error = HostRowsError<M::Error>;

    fn encode(&mut self, ids: &[u32]) -> Result<(), Self::Error> {
        self.model.encode(ids).map_err(HostRowsError::Model)
    }

    fn denoise_rows(
        &mut self,
        canvas: &[u32],
        self_conditioning: bool,
        temperature: f32,
        draw: CategoricalRequest<'_>,
        rows: &mut [RowResult],
    ) -> Result<(), Self::Error> {
        let (c, v) = (canvas.len(), self.vocab_size);
        let drawn = match draw {
            CategoricalRequest::Uniforms(u) => u.len(),
            CategoricalRequest::Ids(ids) => ids.len(),
        };
        if drawn != c {
            return Err(HostRowsError::DrawRows { expected: c, got: drawn });
        }
        self.logits.resize(c * v, 0.0);
        self.scaled.resize(c * v, 0.0);
        self.stats.resize(c, crate::RowStat::default());
        let sc = self_conditioning.then_some(&self.scaled[..]);
        self.model.canvas_forward(canvas, sc, &mut self.logits).map_err(HostRowsError::Model)?;
        if let Err(nf) = crate::rows::process_rows(&mut self.logits, v, temperature, &mut self.stats) {
            rows.fill(RowResult::default());
            rows[nf.row].non_finite = Some((nf.column, nf.value));
            return Ok(());
        }
        let dists = crate::RowDistributions::new(&self.logits, &self.stats, v);
        for (i, (r, stat)) in rows.iter_mut().zip(&self.stats).enumerate() {
            let sampled = match draw {
                CategoricalRequest::Uniforms(u) => dists.sample(i, u[i]),
                CategoricalRequest::Ids(ids) => ids[i],
            };
            *r = RowResult { entropy: stat.entropy, argmax: stat.argmax, sampled, non_finite: None };
        }
        std::mem::swap(&mut self.logits, &mut self.scaled);
        Ok(())
    }
}

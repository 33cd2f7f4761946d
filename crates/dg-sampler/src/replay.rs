//! Replay of the random draws recorded from a reference `generate` run (`gen_draw_{i}` in
//! `reference.safetensors`, kinds in `reference.json`).
//!
//! The reference consumes, per block, one `torch.randint` canvas (`EntropyBoundSampler.initialize_canvas`)
//! and then, per denoising step, one `torch.multinomial` sample per row followed by one `torch.randint`
//! canvas (`EntropyBoundSampler.renoise_canvas`). A [`Replay`] hands the recorded ids back in that order
//! and fails loudly as soon as the sampler asks for something the recording does not hold.

use crate::error::DrawError;
use crate::rng::{CategoricalRequest, DrawKind, RandomSource};
use crate::rows::RowDistributions;

/// A recorded sequence of draws, consumed in order.
pub struct Replay {
    draws: Vec<(DrawKind, Vec<u32>)>,
    next: usize,
}

impl std::fmt::Debug for Replay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replay").field("draws", &self.draws.len()).field("consumed", &self.next).finish()
    }
}

impl Replay {
    pub fn new(draws: Vec<(DrawKind, Vec<u32>)>) -> Self {
        Replay { draws, next: 0 }
    }

    /// Number of draws handed out so far.
    pub fn consumed(&self) -> usize {
        self.next
    }

    /// Number of draws not yet handed out.
    pub fn remaining(&self) -> usize {
        self.draws.len() - self.next
    }

    /// Kinds of the draws handed out so far, in order.
    pub fn consumed_kinds(&self) -> impl Iterator<Item = DrawKind> + '_ {
        self.draws[..self.next].iter().map(|(k, _)| *k)
    }

    /// `Ok` when every recorded draw has been consumed.
    pub fn check_consumed(&self) -> Result<(), DrawError> {
        match self.draws.get(self.next) {
            None => Ok(()),
            Some((next, _)) => Err(DrawError::Unconsumed { consumed: self.next, left: self.remaining(), next: *next }),
        }
    }

    fn take(&mut self, expected: DrawKind, vocab_size: usize, out: &mut [u32]) -> Result<(), DrawError> {
        let ids = self.take_ref(expected, vocab_size, out.len())?;
        out.copy_from_slice(ids);
        Ok(())
    }

    /// The next draw, which must be of kind `expected` with `len` ids below `vocab_size`.
    fn take_ref(&mut self, expected: DrawKind, vocab_size: usize, len: usize) -> Result<&[u32], DrawError> {
        let index = self.next;
        let (recorded, ids) = self.draws.get(index).ok_or(DrawError::Exhausted { index, expected })?;
        if *recorded != expected {
            return Err(DrawError::KindMismatch { index, expected, recorded: *recorded });
        }
        if ids.len() != len {
            return Err(DrawError::LengthMismatch { index, kind: expected, expected: len, recorded: ids.len() });
        }
        if let Some(position) = ids.iter().position(|&id| id as usize >= vocab_size) {
            return Err(DrawError::IdOutOfRange { index, kind: expected, position, id: ids[position], vocab_size });
        }
        self.next += 1;
        Ok(ids)
    }
}

impl RandomSource for Replay {
    fn uniform_tokens(&mut self, vocab_size: usize, out: &mut [u32]) -> Result<(), DrawError> {
        self.take(DrawKind::UniformTokens, vocab_size, out)
    }

    /// The distributions are not read: the recorded ids are returned as they are.
    fn categorical(&mut self, dists: &RowDistributions<'_>, out: &mut [u32]) -> Result<(), DrawError> {
        self.take(DrawKind::Categorical, dists.vocab_size(), out)
    }

    /// The recorded ids, as they are (checked against `vocab_size`).
    fn categorical_request(&mut self, rows: usize, vocab_size: usize) -> Result<CategoricalRequest<'_>, DrawError> {
        self.take_ref(DrawKind::Categorical, vocab_size, rows).map(CategoricalRequest::Ids)
    }

    fn finish(&mut self) -> Result<(), DrawError> {
        self.check_consumed()
    }
}

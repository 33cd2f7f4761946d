//! Adaptive stopping within a block: `StableAndConfidentStoppingCriteria` of the reference.
//!
//! - stable: `stability_threshold == 0`, or each of the last `stability_threshold` argmax canvases equals
//!   the current one. The reference keeps those canvases in a history initialised to −1 at the start of
//!   every block; since token ids are never −1 this is the same as "the current argmax canvas ends a run
//!   of at least `threshold + 1` identical consecutive argmax canvases", which is what is tracked here
//!   (one previous canvas and a run length, whatever the threshold).
//! - confident: the mean over the canvas of the per-position entropies of the temperature-scaled logits
//!   is below `confidence_threshold` (strictly, in f32).

use dg_model::StoppingConfig;

/// Run-length form of the reference's argmax history.
#[derive(Debug, Clone)]
pub struct StabilityTracker {
    previous: Vec<u32>,
    has_previous: bool,
    run: usize,
}

impl StabilityTracker {
    pub fn new(canvas_length: usize) -> Self {
        StabilityTracker { previous: vec![0; canvas_length], has_previous: false, run: 0 }
    }

    /// Forgets every earlier canvas (`StableAndConfidentStoppingCriteria.reset`, at each block start).
    pub fn reset(&mut self) {
        self.has_previous = false;
        self.run = 0;
    }

    /// Records `argmax` as the newest canvas and says whether it is stable for `threshold`.
    ///
    /// # Panics
    /// If `argmax` is not one canvas long.
    pub fn update(&mut self, argmax: &[u32], threshold: usize) -> bool {
        assert_eq!(argmax.len(), self.previous.len(), "StabilityTracker: canvas length");
        if self.has_previous && self.previous == argmax {
            self.run += 1;
        } else {
            self.run = 1;
            self.previous.copy_from_slice(argmax);
            self.has_previous = true;
        }
        threshold == 0 || self.run > threshold
    }
}

/// Mean of the per-position entropies (summed in f64, rounded once to f32).
pub fn mean_entropy(entropy: &[f32]) -> f32 {
    if entropy.is_empty() {
        return 0.0;
    }
    (entropy.iter().map(|&h| f64::from(h)).sum::<f64>() / entropy.len() as f64) as f32
}

/// The two halves of the stopping decision for one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StopDecision {
    pub stable: bool,
    pub confident: bool,
}

impl StopDecision {
    pub fn finished(self) -> bool {
        self.stable && self.confident
    }
}

/// Evaluates the criteria for one step (`StableAndConfidentStoppingCriteria.__call__`), updating `tracker`.
pub fn evaluate(tracker: &mut StabilityTracker, cfg: &StoppingConfig, argmax: &[u32], mean: f32) -> StopDecision {
    StopDecision { stable: tracker.update(argmax, cfg.stability_threshold), confident: mean < cfg.confidence_threshold }
}

//! Adaptive stopping (stability, confidence) and end-of-block finalisation (EOS, padding, max length).

use dg_model::{GenerationConfig, StoppingConfig};
use dg_sampler::CanvasEnd;
use dg_sampler::finalize::{finalize_canvas, tokens_per_forward, valid_tokens};
use dg_sampler::rows;
use dg_sampler::stopping::{StabilityTracker, evaluate, mean_entropy};

fn stopping(stability_threshold: usize, confidence_threshold: f32) -> StoppingConfig {
    StoppingConfig { stability_threshold, confidence_threshold }
}

#[test]
fn stability_zero_is_always_stable() {
    let mut t = StabilityTracker::new(3);
    assert!(t.update(&[1, 2, 3], 0), "even on the first step");
    assert!(t.update(&[4, 5, 6], 0));
}

#[test]
fn stability_one_needs_two_identical_argmax_canvases_in_a_row() {
    let mut t = StabilityTracker::new(3);
    assert!(!t.update(&[1, 2, 3], 1), "history starts at -1: never stable on the first step");
    assert!(t.update(&[1, 2, 3], 1));
    assert!(!t.update(&[1, 2, 4], 1));
    assert!(t.update(&[1, 2, 4], 1));
    t.reset();
    assert!(!t.update(&[1, 2, 4], 1), "a new block forgets the previous one");
}

#[test]
fn stability_two_needs_three_identical_argmax_canvases() {
    let mut t = StabilityTracker::new(2);
    assert!(!t.update(&[7, 7], 2));
    assert!(!t.update(&[7, 7], 2));
    assert!(t.update(&[7, 7], 2));
    assert!(t.update(&[7, 7], 2));
    assert!(!t.update(&[7, 8], 2));
    assert!(!t.update(&[7, 8], 2));
    // A change in between breaks the run: A A B A A is not stable at the last A.
    let mut t = StabilityTracker::new(1);
    for (c, want) in [([1u32], false), ([1], false), ([2], false), ([1], false), ([1], false), ([1], true)] {
        assert_eq!(t.update(&c, 2), want);
    }
}

#[test]
fn confidence_compares_the_mean_entropy_strictly() {
    // All-zero logits over V = 10000: every row has entropy ln 10000 = 9.2103.
    let h = rows::entropy(&vec![0.0; 10_000]);
    let entropies = vec![h; 256];
    let mean = mean_entropy(&entropies);
    assert!((mean - 9.210_34).abs() < 1e-5);
    let mut t = StabilityTracker::new(256);
    let argmax = vec![0u32; 256];
    for (threshold, stops) in [(9.20, false), (1e-2, false), (9.22, true)] {
        let d = evaluate(&mut t, &stopping(0, threshold), &argmax, mean);
        assert!(d.stable);
        assert_eq!(d.confident, stops, "threshold {threshold}");
        assert_eq!(d.finished(), stops);
    }
    // Confident but not stable (threshold 1, first step) does not finish.
    let mut t = StabilityTracker::new(256);
    let d = evaluate(&mut t, &stopping(1, 9.22), &argmax, mean);
    assert!(d.confident && !d.stable && !d.finished());
}

fn cfg(eos: &[u32], pad: Option<u32>, max_length: Option<usize>) -> GenerationConfig {
    GenerationConfig { eos_token_ids: eos.to_vec(), pad_token_id: pad, max_length, ..GenerationConfig::default() }
}

#[test]
fn no_eos_continues_untouched() {
    let mut canvas = [5, 6, 7, 8];
    assert_eq!(finalize_canvas(&mut canvas, 12, &cfg(&[1], Some(0), None)), CanvasEnd::Continue);
    assert_eq!(canvas, [5, 6, 7, 8]);
}

#[test]
fn first_eos_is_kept_and_everything_after_is_padded() {
    let mut canvas = [5, 106, 7, 1, 50, 9];
    let end = finalize_canvas(&mut canvas, 20, &cfg(&[1, 106, 50], Some(0), None));
    assert_eq!(end, CanvasEnd::Eos { position: 1 });
    assert_eq!(canvas, [5, 106, 0, 0, 0, 0], "later EOS ids become pad too");
    // One EOS id, at the end: nothing after it to pad.
    let mut canvas = [5, 6, 1];
    assert_eq!(finalize_canvas(&mut canvas, 3, &cfg(&[1], Some(0), None)), CanvasEnd::Eos { position: 2 });
    assert_eq!(canvas, [5, 6, 1]);
}

#[test]
fn eos_without_pad_id_finishes_without_padding() {
    let mut canvas = [1, 6, 1];
    assert_eq!(finalize_canvas(&mut canvas, 3, &cfg(&[1], None, None)), CanvasEnd::Eos { position: 0 });
    assert_eq!(canvas, [1, 6, 1]);
}

#[test]
fn max_length_finishes_without_padding() {
    let mut canvas = [5, 6, 7];
    assert_eq!(finalize_canvas(&mut canvas, 10, &cfg(&[1], Some(0), Some(10))), CanvasEnd::MaxLength);
    assert_eq!(canvas, [5, 6, 7]);
    assert_eq!(finalize_canvas(&mut canvas, 9, &cfg(&[1], Some(0), Some(10))), CanvasEnd::Continue);
    // EOS takes precedence in the reported reason, and pads as usual.
    let mut canvas = [1, 6, 7];
    assert_eq!(finalize_canvas(&mut canvas, 10, &cfg(&[1], Some(0), Some(10))), CanvasEnd::Eos { position: 0 });
    assert_eq!(canvas, [1, 0, 0]);
}

#[test]
fn tokens_per_forward_counts_non_pad_tokens() {
    let new = [5, 106, 0, 0, 0, 0, 0, 0];
    assert_eq!(valid_tokens(&new, Some(0)), 2);
    assert_eq!(tokens_per_forward(&new, Some(0), 4), 0.5);
    assert_eq!(tokens_per_forward(&new, None, 4), 2.0);
    assert_eq!(tokens_per_forward(&new, Some(0), 0), 0.0);
}

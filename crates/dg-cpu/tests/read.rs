//! The CPU read forward against the canvas forward it narrows: the head at some rows equals those
//! rows of the full head (and gives a row the same bits in any read that asks for it), per-row
//! self-conditioning equals the whole canvas's where every row is conditioned, and a pinned
//! multi-step read never moves its pinned rows.

use std::path::Path;

use dg_cpu::CpuModel;
use dg_model::{GenerationConfig, ModelDir};
use dg_sampler::{Conditioning, ReadRequest, SeededRng, Slot, read};

/// How far the head at a few rows may be from the same rows of the whole canvas's head: the
/// products run over fewer rows, so the blocked sums may group differently (f32 rounding).
const ROWS_TOLERANCE: f32 = 1e-5;

fn model() -> CpuModel {
    let dir = ModelDir::open(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/tiny-random")).unwrap();
    let weights = dir.load_weights().unwrap();
    let mut model = CpuModel::new(dir.config, weights);
    model.encode(&[2, 5, 40, 41, 42, 43, 6, 5, 44]).unwrap();
    model
}

fn canvas(n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| 7 + (i * 37) % 900).collect()
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

#[test]
fn the_head_at_rows_equals_those_rows_of_the_full_head() {
    let model = model();
    let (c, v) = (model.config.canvas_length, model.config.text.vocab_size);
    let ids = canvas(c);
    let mut full = vec![0f32; c * v];
    model.canvas_forward(&ids, None, &mut full).unwrap();
    let all: Vec<usize> = (0..c).collect();
    let mut every = vec![0f32; c * v];
    model.read_forward(&ids, None, &all, &mut every).unwrap();
    assert!(max_abs_diff(&every, &full) <= ROWS_TOLERANCE, "every row: {}", max_abs_diff(&every, &full));
    let rows = [3, 17, 0, 31, 17];
    let mut some = vec![0f32; rows.len() * v];
    model.read_forward(&ids, None, &rows, &mut some).unwrap();
    for (i, &r) in rows.iter().enumerate() {
        let d = max_abs_diff(&some[i * v..(i + 1) * v], &full[r * v..(r + 1) * v]);
        assert!(d <= ROWS_TOLERANCE, "row {r}: {d}");
    }
}

#[test]
fn a_row_reads_the_same_bits_however_many_rows_are_asked() {
    let model = model();
    let (c, v) = (model.config.canvas_length, model.config.text.vocab_size);
    let ids = canvas(c);
    let read = |rows: &[usize]| {
        let mut logits = vec![0f32; rows.len() * v];
        model.read_forward(&ids, None, rows, &mut logits).unwrap();
        logits
    };
    let all: Vec<usize> = (0..c).collect();
    let every = read(&all);
    for rows in [vec![17], vec![17, 3], vec![0, 17, 31, 5, 9]] {
        let some = read(&rows);
        for (i, &r) in rows.iter().enumerate() {
            assert!(some[i * v..(i + 1) * v] == every[r * v..(r + 1) * v], "row {r} of {rows:?}");
        }
    }
}

#[test]
fn conditioning_every_row_equals_the_canvas_forward_with_self_conditioning() {
    let model = model();
    let (c, v) = (model.config.canvas_length, model.config.text.vocab_size);
    let ids = canvas(c);
    let sc: Vec<f32> = (0..c * v).map(|i| ((i * 7919) % 1000) as f32 / 100.0 - 5.0).collect();
    let mut full = vec![0f32; c * v];
    model.canvas_forward(&ids, Some(&sc), &mut full).unwrap();
    let all: Vec<usize> = (0..c).collect();
    let mut read = vec![0f32; c * v];
    model.read_forward(&ids, Some(Conditioning { rows: &all, logits: &sc }), &all, &mut read).unwrap();
    assert!(max_abs_diff(&read, &full) <= ROWS_TOLERANCE, "{}", max_abs_diff(&read, &full));
    // Conditioning only some rows changes those rows' inputs, so (through attention) every row.
    let half: Vec<usize> = (0..c / 2).collect();
    let mut partial = vec![0f32; c * v];
    model.read_forward(&ids, Some(Conditioning { rows: &half, logits: &sc[..c / 2 * v] }), &all, &mut partial).unwrap();
    assert!(max_abs_diff(&partial, &full) > 1e-3);
}

#[test]
fn a_narrow_canvas_reads_and_bad_reads_are_errors() {
    let mut model = model();
    let v = model.config.text.vocab_size;
    let ids = canvas(16);
    let mut logits = vec![0f32; v];
    model.read_forward(&ids, None, &[5], &mut logits).unwrap();
    assert!(logits.iter().all(|x| x.is_finite()));
    let c = model.config.canvas_length;
    let too_wide = model.read_forward(&canvas(c + 1), None, &[0], &mut logits).unwrap_err();
    assert!(too_wide.to_string().contains("canvas_length"), "{too_wide}");
    let outside = model.read_forward(&ids, None, &[16], &mut logits).unwrap_err();
    assert!(outside.to_string().contains("head row 16"), "{outside}");
    let slots = [Slot { position: 3, labels: vec![10, 11] }];
    let request = ReadRequest { canvas: &ids, pinned: None, steps: 0, slots: &slots };
    let err = read(&mut model, &request, &GenerationConfig::default(), &mut SeededRng::new(1)).unwrap_err();
    assert!(err.to_string().contains("at least 1 step"), "{err}");
}

#[test]
fn a_pinned_multi_step_read_keeps_its_pinned_rows_and_reads_its_slots() {
    let mut model = model();
    let seed = canvas(16);
    let slots = [Slot { position: 4, labels: vec![100, 200, 300] }, Slot { position: 9, labels: vec![7, 8] }];
    let pinned: Vec<bool> = (0..16).map(|r| r % 3 != 0 && r != 4 && r != 9).collect();
    let cfg = GenerationConfig { entropy_bound: 1.0, ..Default::default() };
    for steps in [1, 2, 4, 8] {
        let request = ReadRequest { canvas: &seed, pinned: Some(&pinned), steps, slots: &slots };
        let result = read(&mut model, &request, &cfg, &mut SeededRng::new(9)).unwrap();
        for (r, (&got, &want)) in result.canvas.iter().zip(&seed).enumerate() {
            if pinned[r] || steps == 1 {
                assert_eq!(got, want, "row {r} moved in a {steps}-step read");
            }
        }
        if steps > 1 {
            assert_ne!(result.canvas, seed, "{steps} steps moved no free row");
        }
        for (slot, s) in result.slots.iter().zip(&slots) {
            assert_eq!(slot.label_logprobs.len(), s.labels.len());
            let sum: f32 = slot.probabilities.iter().sum();
            assert!((sum - 1.0).abs() < 1e-5, "probabilities sum to {sum}");
            assert!(slot.label_logprobs.iter().all(|&lp| lp < 0.0));
            assert_eq!(slot.top.len(), 20);
            assert_eq!(slot.top[0].0, slot.argmax);
            assert!(slot.top.windows(2).all(|w| w[0].1 >= w[1].1));
            assert!(slot.top_entropy > 0.0);
        }
    }
    // The cache is untouched: the same read twice gives the same answers.
    let request = ReadRequest { canvas: &seed, pinned: Some(&pinned), steps: 4, slots: &slots };
    let a = read(&mut model, &request, &cfg, &mut SeededRng::new(3)).unwrap();
    let b = read(&mut model, &request, &cfg, &mut SeededRng::new(3)).unwrap();
    assert_eq!(a, b);
    assert_eq!(model.seq_len(), 9);
}

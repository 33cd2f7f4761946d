//! Typed reads against transformers (`fixtures/reads/tensor-core-shapes.json`, made by
//! `tools/oracle/make_read_fixture.py` from the `tensor-core-shapes` checkpoint): 1-step reads of
//! seeded canvases 16 and 64 wide (one `model(input_ids=prompt, past_key_values=cache,
//! decoder_input_ids=seed_canvas)` call) and pinned reads of 2, 4 and 8 steps (the recorded draws
//! replayed). On the CPU the slot rows' logits hold the CPU forward's tolerance, the argmax at each
//! slot is the reference's, the canvas the last forward read is the reference's, and pinned rows
//! keep their seed ids.
//!
//! On the GPU (f32 matrices) the same reads hold the GPU forward's tolerance against the CPU's,
//! with the same argmax, canvas and pinned rows; the head at some rows gives the bits of those rows
//! of the full head; and several reads of the prompt in one batched forward
//! (`dg_sampler::read_batch`) give what each gives alone.

use dg_cpu::CpuModel;
use dg_gpu::{GpuModel, ModelOptions, WeightFormat};
use dg_model::{GenerationConfig, ModelDir};
use dg_parity::checks::{ARGMAX_MARGIN, CPU_LOGITS_TOLERANCE, GPU_LOGITS_TOLERANCE};
use dg_parity::compare::compare;
use dg_parity::testing::{fixture, test_context};
use dg_sampler::{DrawKind, Read, ReadModel, ReadRequest, Replay, SeededRng, Slot, read, read_batch};
use serde::Deserialize;

#[derive(Deserialize)]
struct Fixture {
    model: String,
    prompt: Vec<u32>,
    t_min: f64,
    t_max: f64,
    entropy_bound: f32,
    reads: Vec<ReadCase>,
}

#[derive(Deserialize)]
struct ReadCase {
    width: usize,
    steps: usize,
    canvas: Vec<u32>,
    pinned: Vec<bool>,
    slots: Vec<SlotCase>,
    draws: Vec<DrawCase>,
    read_canvas: Vec<u32>,
    slot_logits: Vec<Vec<f32>>,
}

#[derive(Deserialize)]
struct SlotCase {
    position: usize,
    labels: Vec<u32>,
}

#[derive(Deserialize)]
struct DrawCase {
    kind: String,
    ids: Vec<u32>,
}

fn load() -> Fixture {
    let path = fixture("reads/tensor-core-shapes.json");
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))).unwrap()
}

/// `log_softmax` of a row in f64.
fn log_softmax(row: &[f32]) -> Vec<f64> {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = max + row.iter().map(|&x| (x as f64 - max).exp()).sum::<f64>().ln();
    row.iter().map(|&x| x as f64 - lse).collect()
}

#[test]
fn cpu_reads_match_transformers() {
    let f = load();
    let dir = ModelDir::open(&fixture(&f.model)).unwrap();
    let v = dir.config.text.vocab_size;
    let mut model = CpuModel::new(dir.config.clone(), dir.load_weights().unwrap());
    model.encode(&f.prompt).unwrap();
    let cfg = GenerationConfig { temperature: Some((f.t_min, f.t_max)), entropy_bound: f.entropy_bound, ..Default::default() };
    let widths: Vec<usize> = f.reads.iter().map(|r| r.width).collect();
    assert!(widths.contains(&16) && widths.contains(&64), "the fixture reads canvases 16 and 64 wide: {widths:?}");
    let mut steps: Vec<usize> = f.reads.iter().map(|r| r.steps).collect();
    steps.dedup();
    assert_eq!(steps, [1, 2, 4, 8]);
    for case in &f.reads {
        let what = format!("W={} steps={}", case.width, case.steps);
        let slots: Vec<Slot> = case.slots.iter().map(|s| Slot { position: s.position, labels: s.labels.clone() }).collect();
        let draws = case.draws.iter().map(|d| (d.kind.parse::<DrawKind>().unwrap(), d.ids.clone())).collect();
        let mut replay = Replay::new(draws);
        let request = ReadRequest { canvas: &case.canvas, pinned: Some(&case.pinned), steps: case.steps, slots: &slots };
        let got = read(&mut model, &request, &cfg, &mut replay).unwrap_or_else(|e| panic!("{what}: {e}"));
        replay.check_consumed().unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(got.canvas, case.read_canvas, "{what}: the canvas the last forward read");
        for (r, (&id, &seed)) in got.canvas.iter().zip(&case.canvas).enumerate() {
            assert!(!case.pinned[r] || id == seed, "{what}: pinned row {r} moved");
        }
        let reference: Vec<f32> = case.slot_logits.concat();
        let c = compare(&got.logits, &reference, v, ARGMAX_MARGIN);
        assert!(c.normwise <= CPU_LOGITS_TOLERANCE, "{what}: slot logits normwise {:.2e}", c.normwise);
        assert!(c.argmax_mismatches.is_empty(), "{what}: argmax {:?}", c.argmax_mismatches);
        for ((s, row), slot) in got.slots.iter().zip(&case.slot_logits).zip(&slots) {
            let want = log_softmax(row);
            let want_argmax = (0..v).fold(0, |b, i| if row[i] > row[b] { i } else { b });
            assert_eq!(s.argmax as usize, want_argmax, "{what}: argmax at {}", slot.position);
            let ours: Vec<f32> = s.label_logprobs.clone();
            let theirs: Vec<f32> = slot.labels.iter().map(|&id| want[id as usize] as f32).collect();
            let lp = compare(&ours, &theirs, ours.len(), f32::INFINITY);
            assert!(lp.normwise <= CPU_LOGITS_TOLERANCE, "{what}: label logprobs at {} normwise {:.2e}", slot.position, lp.normwise);
        }
    }
}

impl ReadCase {
    fn slots(&self) -> Vec<Slot> {
        self.slots.iter().map(|s| Slot { position: s.position, labels: s.labels.clone() }).collect()
    }

    fn replay(&self) -> Replay {
        Replay::new(self.draws.iter().map(|d| (d.kind.parse::<DrawKind>().unwrap(), d.ids.clone())).collect())
    }
}

/// The fixture's model on the GPU (f32 matrices) with the prompt encoded; None without an adapter.
fn gpu_model(f: &Fixture, test: &str) -> Option<(GpuModel, GenerationConfig, usize)> {
    let ctx = test_context(test)?;
    let dir = ModelDir::open(&fixture(&f.model)).unwrap();
    let weights = dir.load_weights().unwrap();
    let mut model = GpuModel::load(ctx, &dir.config, &weights, ModelOptions::new(128).format(WeightFormat::F32)).unwrap();
    model.encode(&f.prompt).unwrap();
    let cfg = GenerationConfig { temperature: Some((f.t_min, f.t_max)), entropy_bound: f.entropy_bound, ..Default::default() };
    Some((model, cfg, dir.config.text.vocab_size))
}

#[test]
fn gpu_reads_match_the_cpu() {
    let f = load();
    let Some((mut gpu, cfg, v)) = gpu_model(&f, "gpu_reads_match_the_cpu") else { return };
    let dir = ModelDir::open(&fixture(&f.model)).unwrap();
    let mut cpu = CpuModel::new(dir.config.clone(), dir.load_weights().unwrap());
    cpu.encode(&f.prompt).unwrap();
    for case in &f.reads {
        let what = format!("W={} steps={}", case.width, case.steps);
        let slots = case.slots();
        let request = ReadRequest { canvas: &case.canvas, pinned: Some(&case.pinned), steps: case.steps, slots: &slots };
        let want = read(&mut cpu, &request, &cfg, &mut case.replay()).unwrap_or_else(|e| panic!("{what}: {e}"));
        let mut replay = case.replay();
        let got = read(&mut gpu, &request, &cfg, &mut replay).unwrap_or_else(|e| panic!("{what}: {e}"));
        replay.check_consumed().unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(got.canvas, want.canvas, "{what}: the canvas the last forward read");
        for (r, (&id, &seed)) in got.canvas.iter().zip(&case.canvas).enumerate() {
            assert!(!case.pinned[r] || id == seed, "{what}: pinned row {r} moved");
        }
        let c = compare(&got.logits, &want.logits, v, ARGMAX_MARGIN);
        assert!(c.normwise <= GPU_LOGITS_TOLERANCE, "{what}: slot logits normwise {:.2e} of the CPU's", c.normwise);
        for (g, w) in got.slots.iter().zip(&want.slots) {
            assert_eq!(g.argmax, w.argmax, "{what}: argmax");
            let lp = compare(&g.label_logprobs, &w.label_logprobs, g.label_logprobs.len(), f32::INFINITY);
            assert!(lp.normwise <= GPU_LOGITS_TOLERANCE, "{what}: label logprobs normwise {:.2e}", lp.normwise);
        }
    }
}

#[test]
fn gpu_head_at_rows_is_the_full_heads_rows() {
    let f = load();
    let Some((mut gpu, _, v)) = gpu_model(&f, "gpu_head_at_rows_is_the_full_heads_rows") else { return };
    let c = gpu.canvas_length();
    for case in f.reads.iter().filter(|r| r.steps == 1) {
        let w = case.width;
        let rows: Vec<usize> = case.slots.iter().map(|s| s.position).collect();
        let mut at_rows = vec![0f32; rows.len() * v];
        gpu.read_forward(&case.canvas, None, &rows, &mut at_rows).unwrap();
        let all: Vec<usize> = (0..w).collect();
        let mut full = vec![0f32; w * v];
        gpu.read_forward(&case.canvas, None, &all, &mut full).unwrap();
        for (i, &r) in rows.iter().enumerate() {
            assert_eq!(at_rows[i * v..(i + 1) * v], full[r * v..(r + 1) * v], "W={w}: row {r} of the head at rows and of the full head");
        }
        if w == c {
            // The full canvas forward (the generation's plan, its head at every row).
            let mut canvas_logits = vec![0f32; c * v];
            gpu.canvas_forward(&case.canvas, None, &mut canvas_logits).unwrap();
            assert_eq!(full, canvas_logits, "W={w}: the read's head at every row and the canvas forward's");
        }
    }
    assert!(f.reads.iter().any(|r| r.width == c), "a read as wide as the canvas ({c})");
}

#[test]
fn gpu_read_forward_refuses_bad_input() {
    let f = load();
    let Some((mut gpu, _, v)) = gpu_model(&f, "gpu_read_forward_refuses_bad_input") else { return };
    let c = gpu.canvas_length();
    let error = |gpu: &mut GpuModel, canvas: &[u32], rows: &[usize]| {
        let mut logits = vec![0f32; rows.len() * v];
        gpu.read_forward(canvas, None, rows, &mut logits).unwrap_err().to_string()
    };
    let wide = vec![0u32; c + 1];
    assert!(error(&mut gpu, &wide, &[0]).contains("canvas_length"), "{}", error(&mut gpu, &wide, &[0]));
    let canvas = vec![0u32; 16];
    assert!(error(&mut gpu, &canvas, &[16]).contains("head rows"), "a head row past the canvas");
    let bad_id = vec![v as u32; 16];
    assert!(error(&mut gpu, &bad_id, &[0]).contains("out of range"), "an id past the vocabulary");
    let too_many: Vec<_> =
        (0..gpu.max_reads(16) + 1).map(|_| dg_sampler::ReadCanvas { canvas: &canvas, conditioning: None, head_rows: &[0] }).collect();
    let mut logits = vec![0f32; too_many.len() * v];
    assert!(gpu.read_forwards(0, &too_many, &mut logits).is_err(), "more canvases than a forward holds");
    gpu.reset();
    assert!(error(&mut gpu, &canvas, &[0]).contains("no context"), "a read before any prompt");
}

#[test]
fn gpu_batched_reads_are_the_reads_alone() {
    let f = load();
    let Some((mut gpu, cfg, _)) = gpu_model(&f, "gpu_batched_reads_are_the_reads_alone") else { return };
    // Each width's reads (1 step and pinned multi-step ones, and seeded re-reads of the first
    // canvas with other draws), in one batch, against each alone.
    let cases: Vec<&ReadCase> = f.reads.iter().collect();
    let slots: Vec<Vec<Slot>> = cases.iter().map(|c| c.slots()).collect();
    let mut requests: Vec<ReadRequest<'_>> = cases
        .iter()
        .zip(&slots)
        .map(|(c, s)| ReadRequest { canvas: &c.canvas, pinned: Some(&c.pinned), steps: c.steps, slots: s })
        .collect();
    let first = requests[0];
    requests.extend([ReadRequest { steps: 3, ..first }, ReadRequest { steps: 2, pinned: None, ..first }]);
    let rngs = || (0..requests.len()).map(|i| SeededRng::new(40 + i as u64)).collect::<Vec<_>>();
    let batched = read_batch(&mut gpu, &requests, &cfg, &mut rngs()).unwrap();
    let alone: Vec<Read> = requests.iter().zip(rngs()).map(|(r, mut rng)| read(&mut gpu, r, &cfg, &mut rng).unwrap()).collect();
    for (i, (b, a)) in batched.iter().zip(&alone).enumerate() {
        assert_eq!(b, a, "read {i} (W={} steps={}) in the batch and alone", requests[i].canvas.len(), requests[i].steps);
    }
    // The batch's forwards held several canvases (a forward takes canvas_length / 16 of 16).
    let widths: Vec<usize> = requests.iter().map(|r| r.canvas.len()).collect();
    assert!(widths.iter().filter(|&&w| w == 16).count() >= 2, "several reads of one width: {widths:?}");
}

/// The fixture's reads (each with its own seeded draws) after the model's cache.
fn reads_after_the_cache(gpu: &mut GpuModel, f: &Fixture, cfg: &GenerationConfig) -> Vec<Read> {
    f.reads
        .iter()
        .enumerate()
        .map(|(i, case)| {
            let slots = case.slots();
            let request = ReadRequest { canvas: &case.canvas, pinned: Some(&case.pinned), steps: case.steps, slots: &slots };
            read(gpu, &request, cfg, &mut SeededRng::new(7 + i as u64)).unwrap()
        })
        .collect()
}

#[test]
fn gpu_reads_after_a_kept_prefix_are_those_of_a_fresh_encode() {
    let f = load();
    let test = "gpu_reads_after_a_kept_prefix_are_those_of_a_fresh_encode";
    let Some((mut gpu, cfg, _)) = gpu_model(&f, test) else { return };
    // The fixture's prompt encoded in two parts, as the reader splits a prompt (a chunk's products
    // are planned by its length, so the split is the reader's to keep).
    let shared = f.prompt.len() / 2;
    gpu.reset();
    gpu.encode(&f.prompt[..shared]).unwrap();
    gpu.encode(&f.prompt[shared..]).unwrap();
    let fresh = reads_after_the_cache(&mut gpu, &f, &cfg);
    // Another prompt with the same first part (a system text before another state), read; then
    // its cache cut back to that part and the fixture's prompt's rest encoded after it.
    let other: Vec<u32> = f.prompt[..shared].iter().copied().chain((0..40).map(|i| 3 + i * 5 % 200)).collect();
    gpu.reset();
    gpu.encode(&other).unwrap();
    let _ = reads_after_the_cache(&mut gpu, &f, &cfg);
    assert_eq!(gpu.truncate_slot(0, shared), shared, "the prefix is kept");
    assert_eq!(gpu.seq_len(), shared);
    gpu.encode(&f.prompt[shared..]).unwrap();
    let reused = reads_after_the_cache(&mut gpu, &f, &cfg);
    for (i, (r, want)) in reused.iter().zip(&fresh).enumerate() {
        assert_eq!(r, want, "read {i} (W={} steps={}) after the kept prefix and after a fresh encode", f.reads[i].width, f.reads[i].steps);
    }
    // A prefix the cache does not hold is refused: the slot is released.
    assert_eq!(gpu.truncate_slot(0, f.prompt.len() + 1), 0);
    assert_eq!(gpu.seq_len(), 0);
}

#[test]
fn gpu_a_prefix_the_sliding_window_has_passed_is_not_kept() {
    let f = load();
    let Some(ctx) = test_context("gpu_a_prefix_the_sliding_window_has_passed_is_not_kept") else { return };
    let dir = ModelDir::open(&fixture(&f.model)).unwrap();
    let weights = dir.load_weights().unwrap();
    let mut gpu = GpuModel::load(ctx, &dir.config, &weights, ModelOptions::new(2048)).unwrap();
    assert!(gpu.sliding_positions() < 2048, "the sliding caches hold a window, not every position");
    let long: Vec<u32> = (0..gpu.sliding_positions() as u32 + 200).map(|i| 3 + i * 7 % 250).collect();
    gpu.encode(&long).unwrap();
    let keep = dir.config.text.sliding_kept();
    assert_eq!(gpu.truncate_slot(0, keep), 0, "the window moved past the first positions' rows");
    assert_eq!(gpu.seq_len(), 0, "the slot is released");
    gpu.encode(&long).unwrap();
    assert_eq!(gpu.truncate_slot(0, long.len() - 1), long.len() - 1, "a prefix whose window rows are still held is kept");
}

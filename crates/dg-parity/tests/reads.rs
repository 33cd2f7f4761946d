//! Typed reads against transformers (`fixtures/reads/tensor-core-shapes.json`, made by
//! `tools/oracle/make_read_fixture.py` from the `tensor-core-shapes` checkpoint): 1-step reads of
//! seeded canvases 16 and 64 wide (one `model(input_ids=prompt, past_key_values=cache,
//! decoder_input_ids=seed_canvas)` call) and pinned reads of 2, 4 and 8 steps (the recorded draws
//! replayed). On the CPU the slot rows' logits hold the CPU forward's tolerance, the argmax at each
//! slot is the reference's, the canvas the last forward read is the reference's, and pinned rows
//! keep their seed ids.

use dg_cpu::CpuModel;
use dg_model::{GenerationConfig, ModelDir};
use dg_parity::checks::{ARGMAX_MARGIN, CPU_LOGITS_TOLERANCE};
use dg_parity::compare::compare;
use dg_parity::testing::fixture;
use dg_sampler::{DrawKind, ReadRequest, Replay, Slot, read};
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

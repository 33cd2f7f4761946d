//! A fake model and a plain, allocation-happy port of the reference's replay loop, for end-to-end tests.
#![allow(dead_code)]

use dg_model::GenerationConfig;
use dg_sampler::{DenoiseModel, DrawKind};

/// Raw logits as a deterministic function of the cache length, the canvas and the self-conditioning input.
/// Even rows are peaked (low entropy), odd rows nearly flat; `eos_row` (if any) peaks at `eos` once the
/// cache holds at least `eos_after` tokens.
#[derive(Debug, Clone)]
pub struct FakeSpec {
    pub vocab: usize,
    pub eos: Option<(usize, u32, usize)>,
    /// If false the peak ignores the canvas (so the argmax canvas repeats and stopping can trigger).
    pub peak_follows_canvas: bool,
    /// Inject a NaN at (block-independent) decoder call index, row, column.
    pub nan_at: Option<(usize, usize, usize)>,
}

impl FakeSpec {
    pub fn logits(&self, cache_len: usize, call: usize, canvas: &[u32], sc: Option<&[f32]>) -> Vec<f32> {
        let v = self.vocab;
        let mut out = vec![0.0f32; canvas.len() * v];
        for (i, &tok) in canvas.iter().enumerate() {
            let base = if self.peak_follows_canvas { tok as usize * 7 } else { 0 };
            let mut peak = (base + i * 3 + cache_len + 1) % v;
            let mut strength = if i % 2 == 0 { 14.0 } else { 0.7 };
            if let Some((row, eos, after)) = self.eos
                && i == row
                && cache_len >= after
            {
                peak = eos as usize;
                strength = 20.0;
            }
            for j in 0..v {
                let mut x = if j == peak { strength } else { 0.1 * ((j * 5 + i) % 3) as f32 };
                if let Some(sc) = sc {
                    x += 0.01 * sc[i * v + j];
                }
                out[i * v + j] = 30.0 * (x / 30.0).tanh();
            }
        }
        if let Some((c, row, col)) = self.nan_at
            && c == call
        {
            out[row * v + col] = f32::NAN;
        }
        out
    }
}

/// One decoder call: canvas, self-conditioning input, raw logits written.
pub type Call = (Vec<u32>, Option<Vec<f32>>, Vec<f32>);

/// Canvas length and vocabulary of the end-to-end tests.
pub const C: usize = 6;
pub const V: usize = 40;

pub fn spec() -> FakeSpec {
    FakeSpec { vocab: V, eos: None, peak_follows_canvas: true, nan_at: None }
}

pub fn cfg(blocks: usize, steps: usize) -> GenerationConfig {
    GenerationConfig {
        max_new_tokens: blocks * C,
        max_denoising_steps: steps,
        stopping: None,
        eos_token_ids: vec![],
        pad_token_id: Some(0),
        ..GenerationConfig::default()
    }
}

/// Records what `generate` asked of it.
#[derive(Debug)]
pub struct FakeModel {
    pub spec: FakeSpec,
    pub cache_len: usize,
    pub encoded: Vec<Vec<u32>>,
    /// (canvas, self-conditioning input, raw logits written) per decoder call.
    pub calls: Vec<Call>,
    pub fail_encode_at: Option<usize>,
}

impl FakeModel {
    pub fn new(spec: FakeSpec) -> Self {
        FakeModel { spec, cache_len: 0, encoded: vec![], calls: vec![], fail_encode_at: None }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("fake model failure")]
pub struct FakeError;

impl DenoiseModel for FakeModel {
    type Error = FakeError;
    fn encode(&mut self, ids: &[u32]) -> Result<(), FakeError> {
        if self.fail_encode_at == Some(self.encoded.len()) {
            return Err(FakeError);
        }
        self.cache_len += ids.len();
        self.encoded.push(ids.to_vec());
        Ok(())
    }
    fn canvas_forward(&mut self, canvas: &[u32], sc: Option<&[f32]>, logits: &mut [f32]) -> Result<(), FakeError> {
        let out = self.spec.logits(self.cache_len, self.calls.len(), canvas, sc);
        logits.copy_from_slice(&out);
        self.calls.push((canvas.to_vec(), sc.map(<[f32]>::to_vec), out));
        Ok(())
    }
}

/// Pseudo-random draws in the reference's order for `blocks` blocks of `steps` steps each.
pub fn draws(blocks: usize, steps: usize, c: usize, v: usize, seed: u64) -> Vec<(DrawKind, Vec<u32>)> {
    let mut s = seed;
    let mut ids = |n: usize| -> Vec<u32> {
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                ((s >> 33) % v as u64) as u32
            })
            .collect()
    };
    let mut out = vec![];
    for _ in 0..blocks {
        out.push((DrawKind::UniformTokens, ids(c)));
        for _ in 0..steps {
            out.push((DrawKind::Categorical, ids(c)));
            out.push((DrawKind::UniformTokens, ids(c)));
        }
    }
    out
}

/// Result of [`reference_generate`].
#[derive(Debug)]
pub struct Expected {
    pub sequence: Vec<u32>,
    pub steps: Vec<usize>,
    pub draws_used: usize,
}

/// The reference's replay loop (its `generate` with recorded draws), written plainly with f64 math.
pub fn reference_generate(spec: &FakeSpec, prompt: &[u32], cfg: &GenerationConfig, c: usize, draws: &[(DrawKind, Vec<u32>)]) -> Expected {
    let v = spec.vocab;
    let mut next = 0;
    let mut take = |kind: DrawKind| {
        assert_eq!(draws[next].0, kind);
        next += 1;
        draws[next - 1].1.clone()
    };
    let mut cache_len = prompt.len();
    let mut sequence = prompt.to_vec();
    let mut steps = vec![];
    let mut calls = 0;
    for _ in 0..cfg.new_canvases(prompt.len(), c) {
        let mut canvas = take(DrawKind::UniformTokens);
        let mut sc: Option<Vec<f32>> = None;
        let k = cfg.stopping.map_or(0, |s| s.stability_threshold);
        let mut history: Vec<Vec<i64>> = vec![vec![-1; c]; k];
        let mut argmax = vec![0u32; c];
        let mut n_steps = 0;
        for remaining in (1..=cfg.max_denoising_steps).rev() {
            n_steps += 1;
            let raw = spec.logits(cache_len, calls, &canvas, sc.as_deref());
            calls += 1;
            let t = cfg.temperature_at(remaining);
            let proc: Vec<f32> = raw.iter().map(|x| x / t).collect();
            let sampled = take(DrawKind::Categorical);
            let noise = take(DrawKind::UniformTokens);
            let mut h = vec![0f64; c];
            for i in 0..c {
                let row = &proc[i * v..(i + 1) * v];
                let max = row.iter().cloned().fold(f32::MIN, f32::max);
                argmax[i] = row.iter().position(|&x| x == max).unwrap() as u32;
                let lse = f64::from(max) + row.iter().map(|&x| (f64::from(x) - f64::from(max)).exp()).sum::<f64>().ln();
                h[i] = -row.iter().map(|&x| (f64::from(x) - lse).exp() * (f64::from(x) - lse)).sum::<f64>();
            }
            let mut order: Vec<usize> = (0..c).collect();
            order.sort_by(|&a, &b| h[a].partial_cmp(&h[b]).unwrap()); // stable: ties by index
            let mut cum = 0.0;
            let mut mask = vec![false; c];
            for &i in &order {
                cum += h[i];
                mask[i] = cum - h[i] <= f64::from(cfg.entropy_bound);
            }
            canvas = (0..c).map(|i| if mask[i] { sampled[i] } else { noise[i] }).collect();
            let current: Vec<i64> = argmax.iter().map(|&a| i64::from(a)).collect();
            let stable = history.iter().all(|past| *past == current);
            if k > 0 {
                history.remove(0);
                history.push(current);
            }
            let confident = cfg.stopping.is_some_and(|s| h.iter().sum::<f64>() / (c as f64) < f64::from(s.confidence_threshold));
            sc = Some(proc);
            if cfg.stopping.is_some() && stable && confident {
                break;
            }
        }
        steps.push(n_steps);
        let mut new = argmax.clone();
        let first_eos = new.iter().position(|t| cfg.eos_token_ids.contains(t));
        if let (Some(first), Some(pad)) = (first_eos, cfg.pad_token_id) {
            for t in &mut new[first + 1..] {
                *t = pad;
            }
        }
        sequence.extend_from_slice(&new);
        if first_eos.is_some() || cfg.max_length.is_some_and(|m| sequence.len() >= m) {
            break;
        }
        cache_len += c;
    }
    Expected { sequence, steps, draws_used: next }
}

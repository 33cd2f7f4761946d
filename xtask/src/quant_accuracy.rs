//! `cargo xtask quant-accuracy`: what quantization does to the model's output, measured on the
//! CPU in f32 on the dequantized weights (the CPU reference dequantizes exactly as ggml does).
//!
//! Per model (every committed fixture and random-weight configs such as
//! `bench/configs/cpu-medium.json`) and per scheme (`q8_0`, `q4_k_m`, each also with the experts'
//! activations quantized to int8 as the int8 kernels compute, `dg_cpu::int8`), beside the matrices rounded
//! to BF16 for scale: the canvas logits against the model as stored (normwise error, max |Δ|,
//! argmax agreement, with and without a self-conditioning input), each against transformers' f32
//! logits where a fixture has them, the weights' own error, a seeded generation with adaptive
//! stopping on (steps per canvas, tokens per forward, tokens that agree with the unquantized run)
//! and bytes per parameter. Prints one markdown table plus the tensors each scheme quantized; `--write FILE` puts both into that file's section
//! [`SECTION`] (replaced when present, appended otherwise).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, anyhow, bail};
use dg_cpu::CpuModel;
use dg_cpu::int8::ActivationQuant;
use dg_model::{
    GenerationConfig, ModelConfig, ModelDir, Quantized, RandomWeights, Scheme, StoredDtype, StoredTensor, TensorSource, Weights,
};
use dg_parity::checks::Backend;
use dg_parity::cpu::CpuBackend;
use dg_parity::reference::Reference;
use dg_parity::replay::AsModel;
use dg_sampler::{Generation, NoHooks, SeededRng, generate};

mod report;

/// The heading of the section `--write` fills.
pub const SECTION: &str = "## Quantization accuracy (CPU, f32 on the dequantized weights)";

#[derive(Debug, clap::Args)]
pub struct Args {
    /// A reference directory (repeatable). Default, when neither --model nor --config is given:
    /// every fixture under fixtures/ and bench/configs/cpu-medium.json.
    #[arg(long = "model")]
    models: Vec<PathBuf>,
    /// A model config (HF config.json format) run on seeded random weights (repeatable).
    #[arg(long = "config")]
    configs: Vec<PathBuf>,
    /// Canvases of each seeded generation.
    #[arg(long, default_value_t = 2)]
    canvases: usize,
    /// Prompt length of the random-weight configs (random ids).
    #[arg(long, default_value_t = 32)]
    prompt: usize,
    /// Seed of the random weights, the random ids and the generations.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Markdown file whose quantization-accuracy section gets the table (e.g. BENCHMARKS.md).
    #[arg(long)]
    write: Option<PathBuf>,
}

/// Where a model's tensors come from.
enum Source {
    Dir(Box<ModelDir>),
    Random(RandomWeights),
}

impl Source {
    fn tensors(&self) -> &dyn TensorSource {
        match self {
            Source::Dir(d) => &d.checkpoint,
            Source::Random(r) => r,
        }
    }
}

/// One model and the inputs every variant of it sees.
struct Case {
    label: String,
    config: ModelConfig,
    source: Source,
    prompt: Vec<u32>,
    canvas: Vec<u32>,
    /// The self-conditioning input (the fixture's `sc_logits`; for random weights, the stored
    /// model's own plain logits, filled in after its run).
    sc: Option<Vec<f32>>,
    /// transformers' f32 logits on the stored weights, plain and self-conditioned.
    reference: Option<(Vec<f32>, Option<Vec<f32>>)>,
    generation: GenerationConfig,
    /// Whether adaptive stopping was off in the model's generation config and turned on here.
    stopping_forced: bool,
}

/// One tensor as a variant's weights were built from it.
#[derive(Debug, Clone)]
pub struct Served {
    pub name: String,
    pub shape: Vec<usize>,
    pub dtype: StoredDtype,
    pub bytes: usize,
}

/// A source that records every tensor it serves (name, shape, type, bytes).
struct Metered<S> {
    inner: S,
    served: RefCell<Vec<Served>>,
}

impl<S: TensorSource> TensorSource for Metered<S> {
    fn stored(&self, name: &str, shape: &[usize]) -> dg_model::Result<StoredTensor<'_>> {
        let t = self.inner.stored(name, shape)?;
        self.served.borrow_mut().push(Served { name: name.to_string(), shape: shape.to_vec(), dtype: t.dtype, bytes: t.byte_len() });
        Ok(t)
    }
}

/// Which weights a run computes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// The model's tensors as stored, widened to f32.
    Stored,
    /// Every matrix rounded to the nearest BF16: the scale of a rounding every 16-bit copy makes.
    Bf16,
    /// Quantized by the scheme, dequantized as ggml does.
    Scheme(Scheme),
    /// Quantized by the scheme, and the experts' activations quantized per 32-value block to int8
    /// (`dg_cpu::int8`, `ActivationQuant::Int8`): the numerics of the int8 kernels (`DG_INT8=1`).
    Int8(Scheme),
}

impl Variant {
    const ALL: [Variant; 6] = [
        Variant::Stored,
        Variant::Bf16,
        Variant::Scheme(Scheme::Q8_0),
        Variant::Int8(Scheme::Q8_0),
        Variant::Scheme(Scheme::Q4KM),
        Variant::Int8(Scheme::Q4KM),
    ];
}

/// What one variant produced.
pub struct Run {
    pub served: Vec<Served>,
    /// Normwise error of the changed matrices (quantized, or BF16-rounded) against the stored
    /// ones, over all of them together; `None` for the stored weights.
    pub weight_error: Option<f64>,
    pub vocab: usize,
    pub plain: Vec<f32>,
    pub sc: Vec<f32>,
    pub generation: Generation,
}

/// The metrics of one table row.
pub struct Row {
    pub model: String,
    pub variant: Variant,
    pub run: Run,
    /// Against the stored weights' run: (plain, self-conditioned); `None` on the stored row.
    pub vs_stored: Option<(Diff, Diff)>,
    /// Normwise error against transformers: (plain, self-conditioned where dumped).
    pub vs_reference: Option<(f64, Option<f64>)>,
    pub tokens_agree: Option<f64>,
}

/// How far logits `a` are from `b` (both `[C, V]`).
#[derive(Debug, Clone, Copy)]
pub struct Diff {
    pub normwise: f64,
    pub max_abs: f64,
    /// Fraction of canvas rows whose argmax is the same.
    pub argmax: f64,
}

/// Normwise error ‖a − b‖ / ‖b‖, max |a − b| and argmax agreement of `[rows, v]` logits.
pub fn diff(a: &[f32], b: &[f32], v: usize) -> Diff {
    let (mut d2, mut b2, mut max_abs) = (0f64, 0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        let d = (x as f64 - y as f64).abs();
        d2 += d * d;
        b2 += y as f64 * y as f64;
        max_abs = max_abs.max(d);
    }
    let argmax = |row: &[f32]| dg_parity::compare::top2(row).0;
    let rows = a.len() / v;
    let same = a.chunks_exact(v).zip(b.chunks_exact(v)).filter(|(x, y)| argmax(x) == argmax(y)).count();
    Diff { normwise: (d2 / b2.max(f64::MIN_POSITIVE)).sqrt(), max_abs, argmax: same as f64 / rows.max(1) as f64 }
}

pub fn run(args: Args) -> Result<bool> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let (models, configs) = if args.models.is_empty() && args.configs.is_empty() {
        (committed_fixtures(&root)?, vec![root.join("bench/configs/cpu-medium.json")])
    } else {
        (args.models.clone(), args.configs.clone())
    };
    if args.canvases == 0 || args.prompt == 0 {
        bail!("--canvases and --prompt must be at least 1 (got {} and {})", args.canvases, args.prompt);
    }
    let mut rows = Vec::new();
    let mut forced = Vec::new();
    let cases = models.iter().map(|d| fixture_case(d, args.canvases)).chain(configs.iter().map(|c| random_case(c, &args)));
    for case in cases {
        let mut case = case?;
        let started = Instant::now();
        if case.stopping_forced {
            forced.push(case.label.clone());
        }
        rows.extend(measure(&mut case, args.seed).with_context(|| format!("measuring {}", case.label))?);
        eprintln!("  ({}: {:.1}s)", case.label, started.elapsed().as_secs_f64());
    }
    let text = report::section(&rows, &forced, &args_line(&args));
    println!("{text}");
    if let Some(path) = &args.write {
        report::write_section(path, &text)?;
        eprintln!("wrote the section into {}", path.display());
    }
    Ok(true)
}

/// The command line that reproduces this run, for the section's text.
fn args_line(args: &Args) -> String {
    let mut line = "cargo run --release -p xtask -- quant-accuracy".to_string();
    for m in &args.models {
        line += &format!(" --model {}", m.display());
    }
    for c in &args.configs {
        line += &format!(" --config {}", c.display());
    }
    if args.canvases != 2 {
        line += &format!(" --canvases {}", args.canvases);
    }
    if args.prompt != 32 {
        line += &format!(" --prompt {}", args.prompt);
    }
    if args.seed != 0 {
        line += &format!(" --seed {}", args.seed);
    }
    line + " --write BENCHMARKS.md"
}

/// The generation settings of a measurement: the model's own (steps, entropy bound, temperatures,
/// stopping thresholds) with `canvases` canvases and no EOS ids, so that both runs generate the
/// same number of canvases; adaptive stopping turned on where the config has it off.
fn generation_settings(mut g: GenerationConfig, canvases: usize, canvas_length: usize) -> (GenerationConfig, bool) {
    g.max_new_tokens = canvases * canvas_length;
    g.max_length = None;
    g.eos_token_ids.clear();
    let forced = g.stopping.is_none();
    if forced {
        g.stopping = GenerationConfig::default().stopping;
    }
    (g, forced)
}

fn fixture_case(dir: &Path, canvases: usize) -> Result<Case> {
    let label = dir.file_name().map_or_else(|| dir.display().to_string(), |n| n.to_string_lossy().into_owned());
    let reference = Reference::open(dir)?;
    let model = ModelDir::open(dir)?;
    for name in ["prompt_ids", "canvas_ids", "logits_plain"] {
        if !reference.has(name) {
            bail!("{}: reference.safetensors has no {name}", dir.display());
        }
    }
    let floats = |name: &str| reference.floats(name).map(|(_, v)| v);
    let sc = if reference.has("sc_logits") { Some(floats("sc_logits")?) } else { None };
    let reference_sc = if sc.is_some() && reference.has("logits_sc") { Some(floats("logits_sc")?) } else { None };
    let logits = (floats("logits_plain")?, reference_sc);
    let settings = model.generation_config().with_context(|| format!("{}: generation_config.json", dir.display()))?;
    let (generation, stopping_forced) = generation_settings(settings, canvases, model.config.canvas_length);
    Ok(Case {
        label,
        config: model.config.clone(),
        prompt: reference.ids("prompt_ids")?,
        canvas: reference.ids("canvas_ids")?,
        sc,
        reference: Some(logits),
        generation,
        stopping_forced,
        source: Source::Dir(Box::new(model)),
    })
}

fn random_case(path: &Path, args: &Args) -> Result<Case> {
    let config = ModelConfig::from_file(path).with_context(|| format!("reading {}", path.display()))?;
    let label = path.file_stem().map_or_else(|| path.display().to_string(), |n| format!("{} (random)", n.to_string_lossy()));
    let v = config.text.vocab_size as u32;
    let mut rng = SeededRng::new(args.seed);
    let prompt = (0..args.prompt).map(|_| rng.below(v)).collect();
    let canvas = (0..config.canvas_length).map(|_| rng.below(v)).collect();
    let (generation, stopping_forced) = generation_settings(GenerationConfig::default(), args.canvases, config.canvas_length);
    Ok(Case {
        label,
        source: Source::Random(RandomWeights::new(args.seed)),
        config,
        prompt,
        canvas,
        sc: None,
        reference: None,
        generation,
        stopping_forced,
    })
}

/// The stored weights' run, then each other variant's, as table rows.
fn measure(case: &mut Case, seed: u64) -> Result<Vec<Row>> {
    let v = case.config.text.vocab_size;
    let stored = run_variant(case, Variant::Stored, seed)?;
    let mut rows = Vec::new();
    let versus_reference = |r: &Run, case: &Case| {
        case.reference.as_ref().map(|(plain, sc)| (diff(&r.plain, plain, v).normwise, sc.as_ref().map(|s| diff(&r.sc, s, v).normwise)))
    };
    for variant in &Variant::ALL[1..] {
        let q = run_variant(case, *variant, seed)?;
        let (a, b) = (q.generation.new_tokens(), stored.generation.new_tokens());
        let agree = a.iter().zip(b).filter(|(x, y)| x == y).count() as f64 / a.len().max(b.len()).max(1) as f64;
        rows.push(Row {
            model: case.label.clone(),
            variant: *variant,
            vs_stored: Some((diff(&q.plain, &stored.plain, v), diff(&q.sc, &stored.sc, v))),
            vs_reference: versus_reference(&q, case),
            tokens_agree: Some(agree),
            run: q,
        });
    }
    rows.insert(
        0,
        Row {
            model: case.label.clone(),
            variant: Variant::Stored,
            vs_stored: None,
            vs_reference: versus_reference(&stored, case),
            tokens_agree: None,
            run: stored,
        },
    );
    Ok(rows)
}

/// Builds the f32 weights of `case` for `variant` and runs the logits forwards and the seeded
/// generation on them. The stored variant runs first: on random weights its plain logits become
/// every variant's self-conditioning input.
fn run_variant(case: &mut Case, variant: Variant, seed: u64) -> Result<Run> {
    let cfg = &case.config.text;
    let tensors = case.source.tensors();
    let (weights, served) = match variant {
        Variant::Stored => build(tensors, cfg)?,
        Variant::Bf16 => {
            let (mut w, served) = build(tensors, cfg)?;
            w.round_matrices_to_bf16();
            (w, served)
        }
        Variant::Scheme(scheme) | Variant::Int8(scheme) => build(Quantized { inner: tensors, scheme, config: cfg }, cfg)?,
    };
    let changed = |t: &Served| match variant {
        Variant::Stored => false,
        Variant::Bf16 => t.shape.len() >= 2,
        Variant::Scheme(_) | Variant::Int8(_) => t.dtype.block_len() > 1,
    };
    let weight_error = match variant {
        Variant::Stored => None,
        _ => Some(weight_error(tensors, &weights, served.iter().filter(|t| changed(t)))?),
    };
    let mut model = CpuModel::new(case.config.clone(), weights);
    if let Variant::Int8(_) = variant {
        model.activation_quant = ActivationQuant::Int8;
    }
    let mut backend = CpuBackend(model);
    let (c, v) = (case.config.canvas_length, cfg.vocab_size);
    if case.canvas.len() != c {
        bail!("canvas_ids holds {} ids, the canvas is {c}", case.canvas.len());
    }
    let model = &mut backend.0;
    model.encode(&case.prompt)?;
    let mut plain = vec![0f32; c * v];
    model.canvas_forward(&case.canvas, None, &mut plain)?;
    let sc_input = case.sc.get_or_insert_with(|| plain.clone());
    if sc_input.len() != c * v {
        bail!("sc_logits holds {} values, expected {} (canvas × vocab)", sc_input.len(), c * v);
    }
    let mut sc = vec![0f32; c * v];
    model.canvas_forward(&case.canvas, Some(sc_input), &mut sc)?;
    backend.reset().map_err(|e| anyhow!("{e}"))?;
    let generation = generate(&mut AsModel(&mut backend), &case.prompt, &case.generation, c, v, &mut SeededRng::new(seed), &mut NoHooks)
        .map_err(|e| anyhow!("generation: {e:#}"))?;
    Ok(Run { served, weight_error, vocab: v, plain, sc, generation })
}

/// ‖W′ − W‖ / ‖W‖ over the tensors `changed` together: `W` as `stored` serves them, `W′` as
/// `weights` holds them.
fn weight_error<'a>(stored: &dyn TensorSource, weights: &Weights, changed: impl Iterator<Item = &'a Served>) -> Result<f64> {
    let (mut d2, mut w2) = (0f64, 0f64);
    for t in changed {
        let (w, w_new) = (stored.get(&t.name, &t.shape)?, weights.get(&t.name, &t.shape)?);
        for (&a, &b) in w.iter().zip(&w_new) {
            d2 += (b as f64 - a as f64).powi(2);
            w2 += (a as f64).powi(2);
        }
    }
    Ok((d2 / w2.max(f64::MIN_POSITIVE)).sqrt())
}

/// The f32 weights built from `source`, with the tensors it served.
fn build<S: TensorSource>(source: S, cfg: &dg_model::TextConfig) -> Result<(Weights, Vec<Served>)> {
    let metered = Metered { inner: source, served: RefCell::new(Vec::new()) };
    let weights = Weights::build(&metered, cfg)?;
    Ok((weights, metered.served.into_inner()))
}

/// Every directory under `fixtures/` that holds a `reference.json`.
fn committed_fixtures(root: &Path) -> Result<Vec<PathBuf>> {
    let dir = root.join("fixtures");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("reference.json").exists())
        .collect();
    dirs.sort();
    Ok(dirs)
}

/// Tensors served, by type: (tensors, parameters).
pub fn by_dtype(served: &[Served]) -> BTreeMap<&'static str, (usize, usize)> {
    let mut out = BTreeMap::new();
    for s in served {
        let e = out.entry(s.dtype.name()).or_insert((0, 0));
        e.0 += 1;
        e.1 += s.shape.iter().product::<usize>();
    }
    out
}

/// Mean entropy in nats of the softmax of each `v`-wide row of `logits` (temperature 1).
pub fn mean_entropy(logits: &[f32], v: usize) -> f64 {
    let rows = logits.chunks_exact(v);
    let n = rows.len().max(1) as f64;
    rows.map(|row| {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let (mut z, mut s) = (0f64, 0f64);
        for &x in row {
            let d = x as f64 - max;
            let e = d.exp();
            z += e;
            s += e * d;
        }
        z.ln() - s / z
    })
    .sum::<f64>()
        / n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diff_measures_normwise_max_and_argmax_rows() {
        let b = [1.0, 0.0, 0.0, 2.0];
        let a = [1.0, 0.5, 0.0, 2.0];
        let d = diff(&a, &b, 2);
        assert!((d.normwise - 0.5 / 5f64.sqrt()).abs() < 1e-12);
        assert_eq!(d.max_abs, 0.5);
        assert_eq!(d.argmax, 1.0);
        let flipped = diff(&[0.0, 1.0, 0.0, 2.0], &b, 2);
        assert_eq!(flipped.argmax, 0.5);
    }

    #[test]
    fn entropy_is_ln_v_for_uniform_rows_and_near_zero_for_peaked_ones() {
        assert!((mean_entropy(&[3.0; 8], 4) - 4f64.ln()).abs() < 1e-12);
        assert!(mean_entropy(&[100.0, 0.0, 0.0, 0.0], 4) < 1e-40);
    }

    #[test]
    fn generation_settings_turn_stopping_on_and_drop_eos() {
        let off = GenerationConfig { stopping: None, eos_token_ids: vec![1], ..GenerationConfig::default() };
        let (g, forced) = generation_settings(off, 2, 16);
        assert!(forced);
        assert_eq!(g.stopping, GenerationConfig::default().stopping);
        assert!(g.eos_token_ids.is_empty());
        assert_eq!(g.max_new_tokens, 32);
        let (_, forced) = generation_settings(GenerationConfig::default(), 1, 16);
        assert!(!forced);
    }
}

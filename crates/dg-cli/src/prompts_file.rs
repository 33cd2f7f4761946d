//! `dg generate --prompts-file FILE`: one prompt per line, generated together, one JSON line per
//! prompt on stdout in input order.
//!
//! Line i (1-based) is the prompt `dg generate --prompt LINE` would take (with `--chat`, in the
//! chat template), generated with the seed `--seed + i - 1`: its JSON object is the one
//! `dg generate --prompt LINE --seed S --json` prints, without the timings, with `line` and
//! `prompt` added. The lines run as a batch of up to `--batch` sequences through
//! `dg_sampler::Batch` (each in its own KV cache; a finished sequence's place goes to the next
//! line): on the GPU every step is one forward for all the batch's canvases (the model loaded
//! with a cache per sequence), on the CPU the canvases run one after another.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use dg_model::{GenerationConfig, ModelDir};
use dg_sampler::{Batch, Generation, SeededRng};
use serde_json::Value;

use crate::args::GenerateArgs;
use crate::backend::{self, Backend};
use crate::batch_model::BatchModel;
use crate::display::{Mode, Progress};
use crate::error::{Input, input};
use crate::prompt::{self, Prompt};
use crate::report::{Report, Timings};
use crate::settings::{check_positions, resolve_settings};
use crate::text::TextCodec;
use crate::{load, model_dir};

/// Sequences generating at once without `--batch`.
pub const DEFAULT_BATCH: usize = 8;

/// One line of the file, ready to generate.
struct Line {
    /// 1-based.
    number: usize,
    text: String,
    prompt: Prompt,
    seed: u64,
    planned: usize,
}

/// The lines of `path`: its text split at line ends (`\n` or `\r\n`), every line non-empty.
pub fn read_lines(path: &Path) -> Result<Vec<String>> {
    let name = path.display();
    let bytes = std::fs::read(path).context(Input(format!("cannot read the prompts file {name}")))?;
    let text = String::from_utf8(bytes).map_err(|e| {
        let valid = &e.as_bytes()[..e.utf8_error().valid_up_to()];
        let line = valid.iter().filter(|&&b| b == b'\n').count() + 1;
        input(format!("{name} line {line}: not valid UTF-8 text"))
    })?;
    let lines: Vec<String> = text.lines().map(str::to_string).collect();
    if lines.is_empty() {
        return Err(input(format!("the prompts file {name} is empty: give one prompt per line")));
    }
    if let Some(i) = lines.iter().position(String::is_empty) {
        return Err(input(format!("{name} line {}: the line is empty (every line is a prompt)", i + 1)));
    }
    Ok(lines)
}

pub fn run(args: &GenerateArgs, path: &Path) -> Result<()> {
    let started = Instant::now();
    let dir = model_dir::resolve(args.model.as_deref())?;
    let model = model_dir::open(&dir)?;
    let config = &model.config;
    let codec = TextCodec::load(&model)?;
    let settings = resolve_settings(&model, args.sampler.overrides())?;
    let lines = prepare(args, path, &model, codec.as_ref(), &settings)?;
    let capacity = args.batch.map_or(DEFAULT_BATCH, |n| n as usize).min(lines.len());
    let choice = backend::choose(args.device.backend, args.device.adapter.as_deref())?;
    if !args.quiet {
        eprintln!("backend: {}", choice.description);
        eprintln!(
            "model: {}{}",
            dir.display(),
            if model_dir::is_bundled(&dir) { " (the bundled random model: its text is noise)" } else { "" }
        );
        let how = match choice.backend {
            Backend::Cpu => format!("in a batch of up to {capacity} (the canvases one after another)"),
            Backend::Gpu(_) => format!("in a batch of up to {capacity} (one forward a step for all its canvases)"),
        };
        eprintln!(
            "prompts: {} lines of {}, {how}; seeds {} to {}",
            lines.len(),
            path.display(),
            lines[0].seed,
            lines[lines.len() - 1].seed
        );
    }
    let out = Output { dir: &dir, backend: choice.name(), adapter: choice.adapter(), settings: &settings, codec: codec.as_ref() };
    let mut printer = InOrder::new(lines.len());
    let mut tokens = 0;
    let mut emit = |line: &Line, generation: Generation, hooks: Progress<'_>| -> Result<()> {
        tokens += generation.valid_tokens;
        if !args.quiet {
            eprintln!(
                "line {}: {} canvas(es), steps {:?}, stop {}",
                line.number,
                generation.steps_per_canvas.len(),
                generation.steps_per_canvas,
                crate::report::stop_name(generation.stop_reason)
            );
        }
        printer.put(line.number - 1, out.json(line, &generation, hooks)?);
        Ok(())
    };
    let hooks = |line: &Line| {
        Progress::new(Mode::Quiet, false, codec.as_ref(), &settings.eos_token_ids, line.planned, settings.max_denoising_steps)
    };
    let (c, v) = (config.canvas_length, config.text.vocab_size);
    let positions = lines.iter().map(|l| l.prompt.ids.len() + l.planned * c).max().unwrap_or(0);
    let report = if args.quiet { load::Report::Quiet } else { load::Report::Summary };
    let mut model = BatchModel::load(&model, choice.backend, positions, capacity, args.device.weights, report)?;
    let mut batch = Batch::new(c, v, capacity)?;
    let mut pending = lines.iter();
    let mut admitted = Vec::with_capacity(lines.len());
    loop {
        while batch.has_room() {
            let Some(line) = pending.next() else { break };
            let id = batch.admit(&line.prompt.ids, &settings, SeededRng::new(line.seed), hooks(line)).map_err(|r| r.reason)?;
            admitted.push((id, line));
        }
        if batch.running() == 0 {
            break;
        }
        model.step(&mut batch);
        for f in batch.drain_finished().collect::<Vec<_>>() {
            let line = admitted.iter().find(|(id, _)| *id == f.id).map(|(_, l)| *l).expect("every finished sequence was admitted");
            let generation = f.result.with_context(|| format!("{} line {}: generation failed", path.display(), line.number))?;
            emit(line, generation, f.hooks)?;
        }
    }
    if !args.quiet {
        let s = started.elapsed().as_secs_f64();
        eprintln!("summary: {} prompts, {tokens} tokens in {s:.2} s = {:.1} tokens/s", lines.len(), tokens as f64 / s.max(1e-9));
    }
    Ok(())
}

/// Every line tokenized, checked against the model's positions, and given its seed; an error
/// names the file and the line.
fn prepare(
    args: &GenerateArgs,
    path: &Path,
    model: &ModelDir,
    codec: Option<&TextCodec>,
    settings: &GenerationConfig,
) -> Result<Vec<Line>> {
    let config = &model.config;
    let codec = prompt::require_codec(model, codec)?;
    let c = config.canvas_length;
    read_lines(path)?
        .into_iter()
        .enumerate()
        .map(|(i, text)| {
            let at = || Input(format!("{} line {}", path.display(), i + 1));
            let prompt = prompt::from_text(&text, args.chat, model, codec, config.text.vocab_size).context(at())?;
            let planned = settings.new_canvases(prompt.ids.len(), c);
            check_positions(prompt.ids.len(), planned, c, config.text.max_position_embeddings).context(at())?;
            let seed = args
                .sampler
                .seed
                .checked_add(i as u64)
                .ok_or_else(|| input(format!("{}: --seed {} + line index {i} overflows a 64-bit seed", at(), args.sampler.seed)))?;
            Ok(Line { number: i + 1, text, prompt, seed, planned })
        })
        .collect()
}

/// What every JSON line shares.
struct Output<'a> {
    dir: &'a Path,
    backend: &'static str,
    adapter: Option<String>,
    settings: &'a GenerationConfig,
    codec: Option<&'a TextCodec>,
}

impl Output<'_> {
    /// The line's object: `dg generate --json`'s, without the timings, with `line` and `prompt`.
    fn json(&self, line: &Line, generation: &Generation, hooks: Progress<'_>) -> Result<String> {
        let none = Duration::ZERO;
        let timings = Timings { load: none, prefill: none, commits: none, forwards: none, generate: none, total: none };
        let report = Report::new(
            self.dir,
            self.backend,
            self.adapter.clone(),
            line.seed,
            &line.prompt,
            generation,
            self.settings,
            self.codec,
            hooks.canvases,
            timings,
        )?;
        let mut value = report.to_json();
        if let Value::Object(map) = &mut value {
            map.remove("timings");
            map.insert("line".into(), line.number.into());
            map.insert("prompt".into(), line.text.clone().into());
        }
        Ok(serde_json::to_string(&value)?)
    }
}

/// Prints JSON lines in input order as they become available.
struct InOrder {
    ready: Vec<Option<String>>,
    next: usize,
}

impl InOrder {
    fn new(lines: usize) -> Self {
        InOrder { ready: vec![None; lines], next: 0 }
    }

    fn put(&mut self, index: usize, json: String) {
        self.ready[index] = Some(json);
        while let Some(Some(json)) = self.ready.get_mut(self.next).map(Option::take) {
            println!("{json}");
            self.next += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(name: &str, bytes: &[u8]) -> std::path::PathBuf {
        let path = std::env::temp_dir().join(format!("dg-prompts-{}-{name}", std::process::id()));
        std::fs::write(&path, bytes).unwrap();
        path
    }

    #[test]
    fn lines_and_their_errors() {
        assert_eq!(read_lines(&file("ok", b"a\r\nb c\nd")).unwrap(), ["a", "b c", "d"]);
        assert_eq!(read_lines(&file("trailing", b"a\n")).unwrap(), ["a"]);
        let e = read_lines(&file("empty", b"")).unwrap_err().to_string();
        assert!(e.contains("is empty: give one prompt per line"), "{e}");
        let e = read_lines(&file("blank", b"a\n\nb\n")).unwrap_err().to_string();
        assert!(e.contains("line 2: the line is empty"), "{e}");
        let e = read_lines(&file("utf8", b"a\nb\n\xff\n")).unwrap_err().to_string();
        assert!(e.contains("line 3: not valid UTF-8"), "{e}");
        let missing = std::env::temp_dir().join("dg-prompts-none/missing.txt");
        let e = format!("{:#}", read_lines(&missing).unwrap_err());
        assert!(e.contains("cannot read the prompts file") && e.contains("missing.txt"), "{e}");
    }

    #[test]
    fn json_lines_come_out_in_input_order() {
        let mut p = InOrder::new(3);
        p.put(1, "b".into());
        assert_eq!(p.next, 0);
        p.put(0, "a".into());
        assert_eq!(p.next, 2);
        p.put(2, "c".into());
        assert_eq!(p.next, 3);
    }
}

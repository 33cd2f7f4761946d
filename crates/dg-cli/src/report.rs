//! The result of `dg generate`: plain text for stdout, the JSON object of `--json`, and the summary
//! line for stderr (prefill time, steps per canvas, tokens per forward, tokens per second).

use std::path::Path;
use std::time::Duration;

use anyhow::Result;
use dg_model::GenerationConfig;
use dg_sampler::{Generation, StopReason};
use serde_json::{Value, json};

use crate::display::CanvasStats;
use crate::prompt::Prompt;
use crate::text::TextCodec;

/// Wall-clock times of one run.
#[derive(Debug, Clone, Copy)]
pub struct Timings {
    /// Weights read, converted and (GPU) uploaded.
    pub load: Duration,
    /// Encoding the prompt.
    pub prefill: Duration,
    /// Encoding committed canvases.
    pub commits: Duration,
    /// All canvas forwards.
    pub forwards: Duration,
    /// The whole sampler run (prefill included).
    pub generate: Duration,
    /// From start to finish of the command.
    pub total: Duration,
}

/// Everything `dg generate` reports.
#[derive(Debug)]
pub struct Report {
    model: String,
    backend: &'static str,
    adapter: Option<String>,
    seed: u64,
    prompt_ids: Vec<u32>,
    prompt_text: Option<String>,
    output_ids: Vec<u32>,
    /// Text of the output up to its first EOS, when the model has a tokenizer.
    text: Option<String>,
    generation: Generation,
    settings: GenerationConfig,
    canvases: Vec<CanvasStats>,
    timings: Timings,
}

impl Report {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        dir: &Path,
        backend: &'static str,
        adapter: Option<String>,
        seed: u64,
        prompt: &Prompt,
        generation: &Generation,
        settings: &GenerationConfig,
        codec: Option<&TextCodec>,
        canvases: Vec<CanvasStats>,
        timings: Timings,
    ) -> Result<Self> {
        let output = generation.new_tokens();
        let end = output.iter().position(|t| settings.eos_token_ids.contains(t)).unwrap_or(output.len());
        let text = codec.map(|c| c.decode(&output[..end])).transpose()?;
        Ok(Report {
            model: dir.display().to_string(),
            backend,
            adapter,
            seed,
            prompt_ids: prompt.ids.clone(),
            prompt_text: prompt.text.clone(),
            output_ids: output.to_vec(),
            text,
            generation: generation.clone(),
            settings: settings.clone(),
            canvases,
            timings,
        })
    }

    /// What stdout gets without `--json`: the text, or the output ids without a tokenizer.
    pub fn plain_output(&self) -> String {
        match &self.text {
            Some(t) => t.clone(),
            None => self.output_ids.iter().map(u32::to_string).collect::<Vec<_>>().join(" "),
        }
    }

    fn tokens_per_second(&self) -> f64 {
        self.generation.valid_tokens as f64 / self.timings.generate.as_secs_f64().max(1e-9)
    }

    /// The end-of-run summary; `styled` adds ANSI bold to the labels.
    pub fn summary(&self, styled: bool) -> String {
        let g = &self.generation;
        let t = &self.timings;
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let (b, r) = if styled { ("\x1b[1m", "\x1b[0m") } else { ("", "") };
        format!(
            "{b}summary{r}: prefill {:.1} ms ({} tokens) · steps per canvas {:?} ({} forwards, {:.1} ms each) · \
             {:.2} tokens/forward · {} tokens in {:.2} s = {:.1} tokens/s · stop: {} · load {:.2} s",
            ms(t.prefill),
            g.prompt_len,
            g.steps_per_canvas,
            g.decoder_passes,
            ms(t.forwards) / g.decoder_passes.max(1) as f64,
            g.tokens_per_forward,
            g.valid_tokens,
            t.generate.as_secs_f64(),
            self.tokens_per_second(),
            stop_name(g.stop_reason),
            t.load.as_secs_f64(),
        )
    }

    /// The `--json` object.
    pub fn to_json(&self) -> Value {
        let g = &self.generation;
        let s = &self.settings;
        let t = &self.timings;
        let (t_min, t_max) = s.temperature.unzip();
        json!({
            "model": self.model,
            "backend": self.backend,
            "adapter": self.adapter,
            "seed": self.seed,
            "prompt_ids": self.prompt_ids,
            "prompt_text": self.prompt_text,
            "output_ids": self.output_ids,
            "text": self.text,
            "stop_reason": stop_name(g.stop_reason),
            "steps_per_canvas": g.steps_per_canvas,
            "decoder_passes": g.decoder_passes,
            "valid_tokens": g.valid_tokens,
            "tokens_per_forward": g.tokens_per_forward,
            "canvases": self.canvases,
            "generation": {
                "max_new_tokens": s.max_new_tokens,
                "max_denoising_steps": s.max_denoising_steps,
                "entropy_bound": s.entropy_bound,
                "t_min": t_min,
                "t_max": t_max,
                "stability_threshold": s.stopping.map(|x| x.stability_threshold),
                "confidence_threshold": s.stopping.map(|x| x.confidence_threshold),
                "eos_token_ids": s.eos_token_ids,
                "pad_token_id": s.pad_token_id,
            },
            "timings": {
                "load_s": t.load.as_secs_f64(),
                "prefill_s": t.prefill.as_secs_f64(),
                "commit_encode_s": t.commits.as_secs_f64(),
                "forward_s": t.forwards.as_secs_f64(),
                "generate_s": t.generate.as_secs_f64(),
                "total_s": t.total.as_secs_f64(),
                "tokens_per_second": self.tokens_per_second(),
            },
        })
    }
}

pub fn stop_name(reason: StopReason) -> &'static str {
    match reason {
        StopReason::Eos => "eos",
        StopReason::MaxLength => "max_length",
        StopReason::AllCanvases => "all_canvases",
        StopReason::Cancelled => "cancelled",
    }
}

//! Progress of a generation, as sampler hooks: per-canvas statistics for the report, and on a
//! terminal (stderr is a TTY) the canvas being denoised, redrawn in place each step (accepted
//! positions bold, drafts dim), replaced by the committed text when the canvas is done.

use std::io::Write;

use dg_sampler::{Hooks, StepInfo};
use serde::Serialize;
use unicode_width::UnicodeWidthChar;

use crate::text::TextCodec;

const BOLD: &str = "\x1b[1m";
const DIM: &str = "\x1b[2m";
const RESET: &str = "\x1b[0m";

/// What happened in one canvas.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CanvasStats {
    /// Decoder passes of this canvas.
    pub steps: usize,
    /// Positions accepted at each step.
    pub accepted: Vec<usize>,
    /// Mean entropy (nats) of the processed logits at each step.
    pub mean_entropy: Vec<f32>,
    /// The adaptive stopping criteria ended the canvas before its last step.
    pub stopped_early: bool,
}

/// How progress is shown on stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Quiet,
    /// One plain line per finished canvas.
    Lines,
    /// The live canvas view with ANSI attributes.
    Live,
}

/// The generation's hooks.
pub struct Progress<'a> {
    pub canvases: Vec<CanvasStats>,
    mode: Mode,
    /// Write the committed text of each canvas to stdout (stdout is a terminal) instead of stderr.
    stream_stdout: bool,
    codec: Option<&'a TextCodec>,
    eos: &'a [u32],
    planned: usize,
    max_steps: usize,
    /// Committed ids up to the first EOS, and the part of their text already shown.
    committed: Vec<u32>,
    shown: String,
    eos_seen: bool,
    /// Terminal lines the live area occupies now.
    drawn: usize,
}

impl std::fmt::Debug for Progress<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Progress").field("mode", &self.mode).field("canvases", &self.canvases.len()).finish()
    }
}

impl<'a> Progress<'a> {
    pub fn new(mode: Mode, stream_stdout: bool, codec: Option<&'a TextCodec>, eos: &'a [u32], planned: usize, max_steps: usize) -> Self {
        Progress {
            canvases: Vec::with_capacity(planned),
            mode,
            stream_stdout,
            codec,
            eos,
            planned,
            max_steps,
            committed: Vec::new(),
            shown: String::new(),
            eos_seen: false,
            drawn: 0,
        }
    }

    fn piece(&self, id: u32) -> String {
        match self.codec {
            Some(c) => c.piece(id),
            None => format!("{id} "),
        }
    }

    /// Erases the live area (the cursor ends at its first column).
    fn clear(&mut self, err: &mut impl Write) {
        if self.drawn > 0 {
            if self.drawn > 1 {
                let _ = write!(err, "\x1b[{}A", self.drawn - 1);
            }
            let _ = write!(err, "\r\x1b[J");
            self.drawn = 0;
        }
    }

    fn draw(&mut self, info: &StepInfo<'_>) {
        let (width, height) = terminal_size();
        let mut err = std::io::stderr().lock();
        self.clear(&mut err);
        let status = format!(
            "canvas {}/{} · step {}/{} · accepted {}/{} · mean entropy {:.3} nats · T {:.3}",
            info.block + 1,
            self.planned,
            info.step + 1,
            self.max_steps,
            info.num_accepted,
            info.draft.len(),
            info.mean_entropy,
            info.temperature
        );
        let mut lines = vec![format!("{BOLD}{}{RESET}", truncate(&status, width))];
        let pieces = (0..info.draft.len()).map(|i| {
            let accepted = info.accepted[i];
            let id = if accepted { info.canvas[i] } else { info.draft[i] };
            (self.piece(id), accepted)
        });
        lines.extend(wrap(pieces, width, height.saturating_sub(2).max(1)));
        let _ = write!(err, "{}", lines.join("\n"));
        let _ = err.flush();
        self.drawn = lines.len();
    }

    /// The text the committed ids add, or their ids without a tokenizer.
    fn new_text(&mut self, tokens: &[u32]) -> String {
        let end = tokens.iter().position(|t| self.eos.contains(t));
        let kept = &tokens[..end.unwrap_or(tokens.len())];
        self.eos_seen |= end.is_some();
        let Some(codec) = self.codec else {
            return tokens.iter().map(u32::to_string).collect::<Vec<_>>().join(" ");
        };
        self.committed.extend_from_slice(kept);
        let full = codec.decode(&self.committed).unwrap_or_default();
        let delta = full.strip_prefix(self.shown.as_str()).unwrap_or(&full).to_string();
        self.shown = full;
        delta
    }
}

impl Hooks for Progress<'_> {
    fn on_step(&mut self, info: &StepInfo<'_>) {
        if info.step == 0 {
            self.canvases.push(CanvasStats::default());
        }
        let stats = self.canvases.last_mut().expect("a canvas was started");
        stats.steps += 1;
        stats.accepted.push(info.num_accepted);
        stats.mean_entropy.push(info.mean_entropy);
        stats.stopped_early = info.finished && info.remaining > 1;
        if self.mode == Mode::Live {
            self.draw(info);
        }
    }

    fn on_canvas(&mut self, block: usize, tokens: &[u32]) {
        let delta = self.new_text(tokens);
        if self.mode == Mode::Quiet {
            return;
        }
        let s = self.canvases.last().cloned().unwrap_or_default();
        let mut line = format!(
            "canvas {}/{}: {} steps, accepted/step {:.2}, final mean entropy {:.3} nats",
            block + 1,
            self.planned,
            s.steps,
            s.accepted.iter().sum::<usize>() as f64 / s.steps.max(1) as f64,
            s.mean_entropy.last().copied().unwrap_or(0.0)
        );
        if s.stopped_early {
            line.push_str(", stopped early");
        }
        if self.eos_seen {
            line.push_str(", EOS");
        }
        let mut err = std::io::stderr().lock();
        if self.mode == Mode::Lines {
            let _ = writeln!(err, "{line}");
            return;
        }
        self.clear(&mut err);
        let _ = writeln!(err, "{DIM}{line}{RESET}");
        if self.stream_stdout {
            let _ = err.flush();
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{}", delta.trim_start_matches('\n'));
            let _ = out.flush();
        } else {
            let _ = writeln!(err, "{}", delta.trim_start_matches('\n'));
        }
        let _ = err.flush();
    }
}

/// Terminal columns and rows (80 × 24 when unknown).
fn terminal_size() -> (usize, usize) {
    terminal_size::terminal_size().map_or((80, 24), |(w, h)| (w.0 as usize, h.0 as usize))
}

/// Terminal columns of `c` (0 for combining marks).
fn columns(c: char) -> usize {
    c.width().unwrap_or(0)
}

/// The longest prefix of `s` narrower than `width` columns.
fn truncate(s: &str, width: usize) -> String {
    let mut used = 0;
    s.chars()
        .take_while(|&c| {
            used += columns(c);
            used < width.max(2)
        })
        .collect()
}

/// Lays out styled pieces in lines of fewer than `width` visible columns, at most `max_lines` lines
/// (the last ends with `…` when the canvas does not fit).
fn wrap(pieces: impl Iterator<Item = (String, bool)>, width: usize, max_lines: usize) -> Vec<String> {
    let cols = width.saturating_sub(1).max(8);
    let mut lines = vec![String::new()];
    let mut used = 0;
    for (piece, accepted) in pieces {
        let style = if accepted { BOLD } else { DIM };
        lines.last_mut().unwrap().push_str(style);
        for c in piece.chars() {
            let w = columns(c);
            if used + w > cols {
                if lines.len() == max_lines {
                    // The ellipsis takes the column kept free, so the line is at most `width` wide.
                    let last = lines.last_mut().unwrap();
                    last.push_str(RESET);
                    last.push('…');
                    return lines;
                }
                lines.last_mut().unwrap().push_str(RESET);
                lines.push(style.to_string());
                used = 0;
            }
            lines.last_mut().unwrap().push(c);
            used += w;
        }
        lines.last_mut().unwrap().push_str(RESET);
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn visible(s: &str) -> String {
        s.replace(BOLD, "").replace(DIM, "").replace(RESET, "")
    }

    #[test]
    fn wrapping_keeps_every_character_and_the_width() {
        let pieces = ["hello", " world", " again"].iter().enumerate().map(|(i, p)| (p.to_string(), i % 2 == 0));
        let lines = wrap(pieces, 9, 10);
        let text: Vec<String> = lines.iter().map(|l| visible(l)).collect();
        assert_eq!(text.concat(), "hello world again");
        assert!(text.iter().all(|l| l.chars().count() <= 8), "{text:?}");
        assert!(lines[0].starts_with(BOLD));
    }

    #[test]
    fn wrapping_stops_at_the_line_limit() {
        let pieces = std::iter::repeat_n(("abcd".to_string(), true), 20);
        let lines = wrap(pieces, 9, 2);
        assert_eq!(lines.len(), 2);
        assert!(visible(&lines[1]).ends_with('…'));
    }

    #[test]
    fn wide_characters_take_two_columns() {
        let lines = wrap(std::iter::once(("日本語のテキスト".to_string(), false)), 9, 10);
        let text: Vec<String> = lines.iter().map(|l| visible(l)).collect();
        assert_eq!(text, vec!["日本語の", "テキスト"]);
        assert_eq!(truncate("日本語", 6), "日本");
    }
}

//! The text a request has been given so far: committed canvases cut at the first EOS, at exactly
//! `max_tokens` tokens and at the first stop sequence. The streamed text only ever grows: a tail
//! that could still become a stop sequence, or that ends in an incomplete UTF-8 character, is held
//! back until the next canvas (or the end) decides it.

use std::sync::Arc;

/// Why the text ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// An EOS token or a stop sequence.
    Stop,
    /// `max_tokens`, or the canvases ran out.
    Length,
}

impl Finish {
    /// OpenAI's `finish_reason`.
    pub fn name(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
        }
    }
}

/// Token ids to text (lossy: an incomplete character decodes to U+FFFD).
pub type Decode = Arc<dyn Fn(&[u32]) -> String + Send + Sync>;

/// Turns committed canvases into text deltas.
pub struct Committer {
    decode: Decode,
    eos: Vec<u32>,
    stop: Vec<String>,
    max_tokens: usize,
    /// Kept token ids (before EOS, at most `max_tokens`).
    pub tokens: Vec<u32>,
    /// The text given out so far.
    pub text: String,
    finish: Option<Finish>,
}

impl Committer {
    pub fn new(decode: Decode, eos: Vec<u32>, stop: Vec<String>, max_tokens: usize) -> Self {
        Committer { decode, eos, stop, max_tokens, tokens: Vec::new(), text: String::new(), finish: None }
    }

    /// Set once the text is final (nothing after it will be given).
    pub fn finished(&self) -> Option<Finish> {
        self.finish
    }

    /// Takes a committed canvas; returns the text it adds (possibly empty).
    pub fn push(&mut self, canvas: &[u32]) -> String {
        if self.finish.is_some() {
            return String::new();
        }
        let eos = canvas.iter().position(|t| self.eos.contains(t));
        let room = self.max_tokens - self.tokens.len();
        let kept = eos.unwrap_or(canvas.len()).min(room);
        self.tokens.extend_from_slice(&canvas[..kept]);
        if eos.is_some_and(|e| e <= room) {
            self.finish = Some(Finish::Stop);
        } else if self.tokens.len() == self.max_tokens {
            self.finish = Some(Finish::Length);
        }
        self.advance()
    }

    /// Ends the text (the canvases ran out or generation stopped); returns what was held back.
    pub fn end(&mut self) -> (String, Finish) {
        if self.finish.is_none() {
            self.finish = Some(Finish::Length);
        }
        let rest = self.advance();
        (rest, self.finish.unwrap_or(Finish::Length))
    }

    fn advance(&mut self) -> String {
        let full = (self.decode)(&self.tokens);
        let (mut end, stopped) = match self.stop.iter().filter_map(|s| full.find(s.as_str())).min() {
            Some(at) => (at, true),
            None => (full.len(), false),
        };
        if stopped {
            self.finish = Some(Finish::Stop);
        } else if self.finish.is_none() {
            end = self.safe_end(&full);
        }
        let Some(grown) = full.get(..end).and_then(|f| f.strip_prefix(self.text.as_str())) else {
            return String::new();
        };
        let delta = grown.to_string();
        self.text.push_str(&delta);
        delta
    }

    /// The end of what may be given while more text can follow: before a trailing replacement
    /// character (a byte sequence cut by the canvas) and before the longest tail that starts a stop
    /// sequence.
    fn safe_end(&self, full: &str) -> usize {
        let end = full.trim_end_matches('\u{FFFD}').len();
        let text = &full[..end];
        let held = self
            .stop
            .iter()
            .flat_map(|s| (1..s.len()).rev().filter(|&n| s.is_char_boundary(n)).map(move |n| &s[..n]))
            .filter(|prefix| text.ends_with(prefix))
            .map(str::len)
            .max()
            .unwrap_or(0);
        end - held
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Token t decodes to the letter `a + t` (t < 26), 26 to a space.
    fn letters(ids: &[u32]) -> String {
        ids.iter().map(|&t| if t == 26 { ' ' } else { char::from(b'a' + t as u8) }).collect()
    }

    fn committer(eos: &[u32], stop: &[String], max_tokens: usize) -> Committer {
        Committer::new(Arc::new(letters), eos.to_vec(), stop.to_vec(), max_tokens)
    }

    #[test]
    fn max_tokens_cuts_inside_a_canvas() {
        let (eos, stop) = ([25], vec![]);
        let mut c = committer(&eos, &stop, 5);
        assert_eq!(c.push(&[0, 1, 2]), "abc");
        assert_eq!(c.finished(), None);
        assert_eq!(c.push(&[3, 4, 5]), "de");
        assert_eq!(c.finished(), Some(Finish::Length));
        assert_eq!(c.push(&[6]), "");
        assert_eq!(c.tokens.len(), 5);
    }

    #[test]
    fn eos_stops_and_is_not_text() {
        let (eos, stop) = ([25], vec![]);
        let mut c = committer(&eos, &stop, 10);
        assert_eq!(c.push(&[0, 25, 1]), "a");
        assert_eq!(c.end(), (String::new(), Finish::Stop));
        // EOS right after max_tokens tokens: the answer ended by itself (stop); one later, length.
        let mut c = committer(&eos, &stop, 2);
        assert_eq!(c.push(&[0, 1, 25]), "ab");
        assert_eq!(c.finished(), Some(Finish::Stop));
        let mut c = committer(&eos, &stop, 2);
        assert_eq!(c.push(&[0, 1, 2, 25]), "ab");
        assert_eq!(c.finished(), Some(Finish::Length));
    }

    #[test]
    fn stop_sequences_across_canvases_are_held_back_then_cut() {
        let (eos, stop) = ([25], vec!["cde".to_string()]);
        let mut c = committer(&eos, &stop, 100);
        assert_eq!(c.push(&[0, 1, 2]), "ab", "'c' may start the stop sequence");
        assert_eq!(c.push(&[3, 4, 5]), "");
        assert_eq!(c.finished(), Some(Finish::Stop));
        assert_eq!(c.text, "ab");
        // A held-back tail that turns out not to stop is given with the next canvas.
        let mut c = committer(&eos, &stop, 100);
        assert_eq!(c.push(&[0, 2]), "a");
        assert_eq!(c.push(&[7]), "ch");
        assert_eq!(c.push(&[2, 3]), "");
        assert_eq!(c.end(), ("cd".to_string(), Finish::Length));
    }
}

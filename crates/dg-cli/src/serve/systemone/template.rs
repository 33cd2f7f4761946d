//! The questions of a `/v1/systemone` request as the model reads them: OpenJev's schema (`q1`,
//! `q2`, … with their labels), the system text that states them, the answer template with one
//! slot per question, the split into groups that fit the canvas, and each read's seed canvas.
//!
//! Mirrors `openjev/engine.py` (`Engine.build_schema`, `system_text`, `answer_text`,
//! `resolve_template`, `groups`, `canvas_width`, `build_canvas`, `_single_token_labels`) so that
//! the same request gives the same prompt and the same canvases, noise included (Python's
//! Mersenne Twister, [`dg_sampler::PythonRandom`]). Where OpenJev names Gemma 4's ids (a vocabulary
//! of 262144, `<turn|>` = 106, pad 0) this uses the served model's.

use anyhow::Result;
use dg_sampler::{PythonRandom, Slot};

use super::pyjson::Json;
use crate::text::TextCodec;

/// The empty thought block the chat template leaves to the model: every answer starts with it.
const SCAFFOLD: &str = "<|channel>thought\n<channel|>";
/// What opens and closes a thought the model writes (OpenJev's `thought_open`, `thought_close`).
const THOUGHT_OPEN: &str = "<|channel>thought\n";
const THOUGHT_CLOSE: &str = "<channel|>";
/// At most this many labels per question (vLLM's `logprob_token_ids` cap per request).
const MAX_LABELS: usize = 128;
/// Score questions have at most this many levels.
const MAX_SCORE_LEVELS: usize = 10;
/// Up to this many questions the answer is one line per question; past it, one indexed line.
const MAX_LINES: usize = 10;

/// A request the model cannot answer as asked (OpenJev's `SchemaError`: a 400 naming why).
#[derive(Debug)]
pub struct SchemaError(pub String);

/// The three question types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Noul,
    Choice,
    Score,
}

/// One question to read.
#[derive(Debug, Clone)]
pub struct Question {
    /// The request's id of the question.
    pub key: String,
    /// What the model sees: `q1`, `q2`, … over the questions that are read.
    pub id: String,
    pub kind: Kind,
    pub instructions: String,
    /// (answer name, description) per label.
    pub choices: Vec<(String, String)>,
    pub labels: Vec<String>,
    /// A score's criteria as sent.
    pub legend: Vec<Json>,
}

/// How the answer lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `q1: yes\nq2: B`.
    Lines,
    /// `q1yes q2B`.
    Indexed,
}

impl Format {
    fn join(self) -> &'static str {
        match self {
            Format::Lines => "\n",
            Format::Indexed => " ",
        }
    }
    fn lead(self, id: &str) -> String {
        match self {
            Format::Lines => format!("{id}: "),
            Format::Indexed => id.to_string(),
        }
    }
    fn instruction(self) -> &'static str {
        match self {
            Format::Lines => "Reply with one line per question, in this order, formatted as \"id: label\".",
            Format::Indexed => "Reply on one line with each question's id immediately followed by its label, separated by single spaces.",
        }
    }
}

/// Jev's descriptions and instructions: a string (trimmed), or any JSON as `json.dumps` writes it.
pub fn text_of(value: Option<&Json>) -> String {
    match value {
        None | Some(Json::Null) => String::new(),
        Some(Json::String(s)) => s.trim().to_string(),
        Some(v) => v.dumps(false, false),
    }
}

/// The questions a request reads, the ones answered without a read (a choice of one, a score of one
/// level), and the answer format.
#[derive(Debug)]
pub struct Schema {
    pub questions: Vec<Question>,
    pub forced: Vec<(String, Json)>,
    pub format: Format,
}

/// The tokenizer side of the templates: the served model's ids OpenJev hard-codes, and the choice
/// labels that stay one token after `q1: `.
#[derive(Debug)]
pub struct Templates {
    pub codec: std::sync::Arc<TextCodec>,
    pub vocab_size: u32,
    pub turn_close: u32,
    pub pad: u32,
    /// The widest canvas a read may use, and the step canvases are rounded up to.
    pub canvas: usize,
    pub canvas_step: usize,
    pub choice_labels: Vec<String>,
    scaffold: Vec<u32>,
    /// The ids of [`THOUGHT_OPEN`] and [`THOUGHT_CLOSE`].
    pub thought_open: Vec<u32>,
    pub thought_close: Vec<u32>,
}

/// What the prompt before a group's answer template ends with, and so where the template starts
/// (OpenJev's `resolve_template` `head` and `lead`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum After {
    /// The chat prompt: the template starts with the empty thought block.
    ChatPrompt,
    /// A thought the model wrote, closed: the template is the answers alone.
    Thought,
    /// Earlier groups' answers (a sequential read's later groups): the line separator, then the
    /// answers.
    EarlierAnswers,
}

/// A group's answer template and each question's slot.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub template: Vec<u32>,
    pub slots: Vec<Slot>,
}

impl Templates {
    pub fn new(codec: std::sync::Arc<TextCodec>, vocab_size: u32, turn_close: u32, pad: u32, canvas: usize) -> Result<Self> {
        let scaffold = codec.encode(SCAFFOLD, false)?;
        let (thought_open, thought_close) = (codec.encode(THOUGHT_OPEN, false)?, codec.encode(THOUGHT_CLOSE, false)?);
        let mut t = Templates {
            codec,
            vocab_size,
            turn_close,
            pad,
            canvas,
            canvas_step: 16,
            choice_labels: Vec::new(),
            scaffold,
            thought_open,
            thought_close,
        };
        t.choice_labels = t.single_token_labels()?;
        Ok(t)
    }

    /// Where the reader encodes `prompt` in parts: after each turn's `<turn|>` (the system text's
    /// turn, then the state's), the only places a kept prefix of an earlier prompt may end
    /// ([`super::Reader::prompt`]).
    pub fn segments(&self, prompt: &[u32]) -> Vec<usize> {
        (1..prompt.len()).filter(|&i| prompt[i - 1] == self.turn_close).collect()
    }

    /// The empty thought block's ids.
    pub fn scaffold(&self) -> &[u32] {
        &self.scaffold
    }

    /// Earlier groups' answer lines as the prompt continues them.
    pub fn earlier(&self, lines: &[String], format: Format) -> Vec<u32> {
        self.enc(&lines.join(format.join()))
    }

    fn enc(&self, text: &str) -> Vec<u32> {
        self.codec.encode(text, false).unwrap_or_default()
    }

    /// Choice labels that stay one token after `q1: `, in a stable order (A–Z, a–z, AA–ZZ).
    fn single_token_labels(&self) -> Result<Vec<String>> {
        let base = self.codec.encode("q1: A", false)?;
        let upper: Vec<char> = ('A'..='Z').collect();
        let candidates = upper
            .iter()
            .map(char::to_string)
            .chain(('a'..='z').map(|c| c.to_string()))
            .chain(upper.iter().flat_map(|a| upper.iter().map(move |b| format!("{a}{b}"))));
        let (mut out, mut seen) = (Vec::new(), std::collections::HashSet::new());
        for c in candidates {
            let e = self.codec.encode(&format!("q1: {c}"), false)?;
            if e.len() == base.len() && e[..e.len() - 1] == base[..base.len() - 1] && seen.insert(e[e.len() - 1]) {
                out.push(c);
            }
            if out.len() == MAX_LABELS {
                break;
            }
        }
        Ok(out)
    }

    /// The request's questions (in order) as OpenJev numbers and labels them.
    pub fn schema(&self, questions: &[(String, Kind, Json)]) -> Result<Schema, SchemaError> {
        let (mut qs, mut forced) = (Vec::new(), Vec::new());
        for (key, kind, q) in questions {
            let criteria = q.get("criteria");
            let (choices, labels, legend): (Vec<(String, String)>, Vec<String>, Vec<Json>) = match kind {
                Kind::Noul => {
                    let side = |name| text_of(criteria.and_then(|c| c.get(name)));
                    (vec![("yes".into(), side("true")), ("no".into(), side("false"))], vec!["yes".into(), "no".into()], Vec::new())
                }
                Kind::Choice => {
                    let entries = match criteria {
                        Some(Json::Object(e)) => Json::dict(e),
                        _ => Vec::new(),
                    };
                    if entries.is_empty() {
                        return Err(SchemaError(format!("Choice question must have at least one choice: {key}")));
                    }
                    if entries.len() == 1 {
                        let only = Json::String(entries[0].0.clone());
                        let p = Json::Object(vec![(entries[0].0.clone(), one())]);
                        forced.push((key.clone(), forced_answer("choice", vec![("choice".into(), only), ("probabilities".into(), p)])));
                        continue;
                    }
                    if entries.len() > self.choice_labels.len() {
                        return Err(SchemaError(format!("Too many choices. Must have at most {} choices.", self.choice_labels.len())));
                    }
                    let labels = self.choice_labels[..entries.len()].to_vec();
                    (entries.into_iter().map(|(name, desc)| (name, text_of(Some(&desc)))).collect(), labels, Vec::new())
                }
                Kind::Score => {
                    let levels = match criteria {
                        Some(Json::Array(levels)) => levels.clone(),
                        _ => Vec::new(),
                    };
                    if levels.len() > MAX_SCORE_LEVELS {
                        return Err(SchemaError(format!("Too many score levels. Must have at most {MAX_SCORE_LEVELS} levels.")));
                    }
                    if levels.len() == 1 {
                        let legend = Json::Object(vec![("0".into(), levels[0].clone())]);
                        let p = Json::Object(vec![("0".into(), one())]);
                        let score = Json::Number(serde_json::Number::from_f64(0.0).expect("finite"));
                        forced.push((
                            key.clone(),
                            forced_answer("score", vec![("score".into(), score), ("legend".into(), legend), ("probabilities".into(), p)]),
                        ));
                        continue;
                    }
                    let choices = levels.iter().enumerate().map(|(i, c)| (i.to_string(), text_of(Some(c)))).collect();
                    (choices, (0..levels.len()).map(|i| i.to_string()).collect(), levels)
                }
            };
            qs.push(Question {
                key: key.clone(),
                id: String::new(),
                kind: *kind,
                instructions: text_of(q.get("instructions")),
                choices,
                labels,
                legend,
            });
        }
        for (i, q) in qs.iter_mut().enumerate() {
            q.id = format!("q{}", i + 1);
        }
        let format = if qs.len() <= MAX_LINES { Format::Lines } else { Format::Indexed };
        Ok(Schema { questions: qs, forced, format })
    }

    /// The system turn stating `qs`; `chunked` when the request's questions span several groups.
    pub fn system_text(&self, qs: &[Question], format: Format, chunked: bool) -> String {
        let mut s = String::from(
            "Answer a fixed set of questions about the state the user provides. Each question lists its allowed answers; reply with exactly one label per question.\n",
        );
        for q in qs {
            let instructions = if q.instructions.is_empty() { "Answer about the state." } else { &q.instructions };
            s += &format!("\nQuestion {}: {instructions}\n", q.id);
            for ((name, desc), label) in q.choices.iter().zip(&q.labels) {
                s += &match (q.kind, desc.is_empty()) {
                    (Kind::Noul, true) => format!("  {label}\n"),
                    (Kind::Noul | Kind::Score, _) => format!("  {label}: {desc}\n"),
                    (Kind::Choice, true) => format!("  {label}: {name}\n"),
                    (Kind::Choice, false) => format!("  {label}: {name} ({desc})\n"),
                };
            }
        }
        s += "\n";
        s += format.instruction();
        if chunked {
            s += " A reply may cover only some of the questions; answer every line that is present.";
        }
        s
    }

    /// The answer lines of `qs` with the labels at `labels`.
    pub fn answer_text(qs: &[Question], labels: &[usize], format: Format) -> String {
        let lines: Vec<String> = qs.iter().zip(labels).map(|(q, &l)| format.lead(&q.id) + &q.labels[l]).collect();
        lines.join(format.join())
    }

    /// The answer template (the scaffold, then every question's first label) and each question's
    /// slot: the one position where its labels differ, and their ids there. After a thought the
    /// template has no scaffold (the prompt closes the thought); after earlier answers it is the
    /// line separator and the answers.
    pub fn resolve(&self, qs: &[Question], format: Format, after: After) -> Result<Resolved, SchemaError> {
        let (head, lead): (&[u32], &str) = match after {
            After::ChatPrompt => (&self.scaffold, ""),
            After::Thought => (&[], ""),
            After::EarlierAnswers => (&[], format.join()),
        };
        let with = |labels: &[usize]| {
            let mut ids = head.to_vec();
            ids.extend(self.enc(&format!("{lead}{}", Self::answer_text(qs, labels, format))));
            ids
        };
        let first = vec![0; qs.len()];
        let base = with(&first);
        if base.len() + 1 > self.canvas {
            return Err(SchemaError(format!("answer template is {} tokens; the canvas holds {}", base.len(), self.canvas - 1)));
        }
        let mut slots = Vec::with_capacity(qs.len());
        for (qi, q) in qs.iter().enumerate() {
            let mut position = None;
            let mut ids = vec![0u32; q.labels.len()];
            for (li, id) in ids.iter_mut().enumerate().skip(1) {
                let mut labels = first.clone();
                labels[qi] = li;
                let e = with(&labels);
                let diffs: Vec<usize> = (0..e.len().min(base.len())).filter(|&i| e[i] != base[i]).collect();
                if e.len() != base.len() || diffs.len() != 1 || position.is_some_and(|p| p != diffs[0]) {
                    return Err(SchemaError(format!("question {:?}: labels do not share one template slot", q.key)));
                }
                position = Some(diffs[0]);
                *id = e[diffs[0]];
            }
            let position = position.expect("a read question has at least two labels");
            ids[0] = base[position];
            slots.push(Slot { position, labels: ids });
        }
        Ok(Resolved { template: base, slots })
    }

    /// `qs` in order, split into the fewest groups whose answer templates fit the canvas.
    pub fn groups(&self, qs: &[Question], format: Format) -> Vec<Vec<Question>> {
        let (mut out, mut group): (Vec<Vec<Question>>, Vec<Question>) = (Vec::new(), Vec::new());
        for q in qs {
            let mut trial = group.clone();
            trial.push(q.clone());
            let rows = self.scaffold.len() + self.enc(&Self::answer_text(&trial, &vec![0; trial.len()], format)).len() + 1;
            if rows > self.canvas && !group.is_empty() {
                out.push(std::mem::replace(&mut group, vec![q.clone()]));
            } else {
                group = trial;
            }
        }
        out.push(group);
        out
    }

    /// The canvas width of a template: its rows and the `<turn|>` after them, rounded up to the
    /// canvas step, at most the canvas.
    pub fn width(&self, template: &[u32]) -> usize {
        self.canvas.min((template.len() + 1).div_ceil(self.canvas_step) * self.canvas_step)
    }

    /// A read's seed canvas: the template, `<turn|>`, pad to the width, and each slot replaced by
    /// `random.Random(seed).randrange(V)`, slot by slot.
    pub fn canvas(&self, resolved: &Resolved, seed: i64) -> Vec<u32> {
        let mut rng = PythonRandom::new(seed);
        let mut canvas = resolved.template.clone();
        canvas.push(self.turn_close);
        canvas.resize(self.width(&resolved.template), self.pad);
        for s in &resolved.slots {
            canvas[s.position] = rng.randrange(self.vocab_size);
        }
        canvas
    }
}

/// The float 1.0 (written `1.0`, as Python writes it: the SDK's answer models are strict).
fn one() -> Json {
    Json::Number(serde_json::Number::from_f64(1.0).expect("finite"))
}

/// An answer given without a read: the one possible label, with confidence 1.
fn forced_answer(kind: &str, mut fields: Vec<(String, Json)>) -> Json {
    fields.insert(0, ("type".into(), Json::String(kind.into())));
    fields.push(("confidence".into(), one()));
    Json::Object(fields)
}

/// How peaked label probabilities are: `1 − H(p)/ln K`, clamped to [0, 1].
pub fn confidence(p: &[f64]) -> f64 {
    let h: f64 = -p.iter().filter(|&&x| x > 0.0).map(|&x| x * x.ln()).sum::<f64>();
    (1.0 - h / (p.len() as f64).ln()).clamp(0.0, 1.0)
}

/// Jev's answer shape of a read question with mean label probabilities `p`.
pub fn answer(q: &Question, p: &[f64]) -> Json {
    let num = |x: f64| Json::Number(serde_json::Number::from_f64(x).unwrap_or_else(|| 0.into()));
    let probabilities = |names: Vec<String>| Json::Object(names.into_iter().zip(p).map(|(n, &v)| (n, num(v))).collect());
    let ty = |t: &str| ("type".to_string(), Json::String(t.into()));
    match q.kind {
        Kind::Noul => Json::Object(vec![ty("noul"), ("noul".into(), num(p[0]))]),
        Kind::Choice => {
            let top = (0..p.len()).fold(0, |best, i| if p[i] > p[best] { i } else { best });
            Json::Object(vec![
                ty("choice"),
                ("choice".into(), Json::String(q.choices[top].0.clone())),
                ("probabilities".into(), probabilities(q.choices.iter().map(|c| c.0.clone()).collect())),
                ("confidence".into(), num(confidence(p))),
            ])
        }
        Kind::Score => Json::Object(vec![
            ty("score"),
            ("score".into(), num(p.iter().enumerate().map(|(i, v)| i as f64 * v).sum())),
            ("legend".into(), Json::Object(q.legend.iter().enumerate().map(|(i, l)| (i.to_string(), l.clone())).collect())),
            ("probabilities".into(), probabilities((0..p.len()).map(|i| i.to_string()).collect())),
            ("confidence".into(), num(confidence(p))),
        ]),
    }
}

//! `POST /v1/systemone`: typed reads, wire-compatible with OpenJev's server (razorback16/openjev,
//! `openjev/api.py` and `engine.py`), so TypeSafe's SDKs pointed at `dg serve` work unchanged.
//!
//! A request's questions (`noul`, `choice`, `score`) become one system turn, the state the user
//! turn; the answer template is written into a seeded canvas (every label position noise) and read
//! in one forward ([`dg_sampler::read`]); each question's label probabilities come from its slot's
//! logits. As OpenJev: the same request gives the same noise (the seed is a hash of the state and
//! questions), questions that do not fit one canvas are read in groups, a read whose slots are
//! unsure (the top-20 entropy of one above 0.1 nats) is read three more times and averaged,
//! `samples` reads that many canvases and averages them, `steps` runs denoising steps before the
//! read (dg pins the template rows: only the slots move), and answers carry Jev's shapes.
//!
//! `sequential` reads the groups in order under the whole question list, each after the answers
//! chosen before it. `images` go ahead of the state in the user turn ([`images`]: OpenJev's checks
//! and messages; the served model's vision tower encodes them, as chat requests' images, and the
//! seed covers their data URLs); a model without a vision tower answers them as OpenJev's upstream
//! answers for a text model (a 400, "the model rejected this request"), and images with `think` or
//! `sequential` are a 400 naming the field. `think` (up to 4096) reads after a thought: the chat
//! prompt with thinking on, the thinking channel opened, up to `think` tokens the model writes
//! there (the engine's generation, [`Thinker`], drawing from the group's seed where OpenJev's
//! upstream samples unseeded), the channel closed, and the answer template without the empty
//! thought block after it; one thought per group, or one under the whole list for a sequential
//! read. The thought's prompt is billed as input beside the read's (which holds the thought too)
//! and its tokens are `output_tokens`, as OpenJev bills them. Reads run on the GPU model the
//! generation engine owns, between its steps, or on the CPU backend on an f32 copy of the model
//! on a thread of their own ([`reader`]).

mod images;
mod pyjson;
mod reader;
mod request;
mod template;

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use dg_model::{GenerationConfig, ModelDir};
use dg_sampler::{ReadRequest, SlotRead};
use futures_util::future::BoxFuture;

use super::metrics::Metrics;
use super::prompt_images::{ImageInput, JobImages};
use crate::chat::{ChatTemplate, Conversation};
use crate::text::TextCodec;
pub use pyjson::Json;
use reader::Refused;
pub use reader::Timing;
pub(crate) use reader::{ReadOn, Reader, ReaderState, run_work};
pub use reader::{ReaderHandle, Work as ReadWork};
pub use request::{Rejection, SystemOne, parse};
use template::{After, Question, Resolved, Templates};

/// Model names a request may give besides the served one: TypeSafe's SDKs default to these.
const SDK_ALIASES: [&str; 2] = ["jev-latest", "jev-preview"];
/// At most this many questions per request.
const MAX_QUESTIONS: usize = 256;
/// A read whose most unsure slot has a top-20 entropy above this (nats) is read again.
const REREAD_ENTROPY: f64 = 0.1;
/// Reads of an unsure read, itself included, averaged.
const REREADS: usize = 4;
/// Seed offsets of a group's reads and of a request's groups (OpenJev's).
const READ_SEED_STRIDE: i64 = 7919;
const GROUP_SEED_STRIDE: i64 = 104_729;
/// The largest f32 copy of the weights the CPU backend's reader loads beside the engine (the
/// bundled model and the test fixtures are far below; a full-size checkpoint's is about 100 GB:
/// serve it on the GPU, whose reads run on the engine's model).
const READER_BYTES_CAP: u64 = 4 << 30;

/// What `/v1/systemone` needs beside the rest of the server.
pub struct Service {
    /// The `model` answers name.
    model_name: String,
    templates: Arc<Templates>,
    chat: ChatTemplate,
    reader: ReaderHandle,
    settings: Arc<GenerationConfig>,
    extensions: Extensions,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service").field("model_name", &self.model_name).finish_non_exhaustive()
    }
}

/// What OpenJev's extensions beyond Jev's contract take: `images` the served model's vision tower
/// (or why there is none), `think` a generator of thoughts (or why there is none).
pub struct Extensions {
    pub images: Result<Arc<ImageInput>, String>,
    pub thinker: Result<Thinker, String>,
}

/// A thought to generate: `prompt` continued by dg's generation (the model's thinking channel
/// open at its end) for at most `budget` tokens, ending at any of `stop`, drawing from `seed`.
#[derive(Debug, Clone)]
pub struct ThoughtRequest {
    pub prompt: Vec<u32>,
    pub budget: usize,
    pub stop: Vec<u32>,
    pub seed: u64,
}

/// Generates a thought: the token ids kept (before the first stop or EOS, at most the budget).
pub type Thinker = Arc<dyn Fn(ThoughtRequest) -> BoxFuture<'static, Result<Vec<u32>, Rejection>> + Send + Sync>;

impl Service {
    /// Readies the templates and the reader: `reader` (the GPU model's), else a CPU copy of
    /// `model` on a thread of its own with a queue of `queue` requests (past it, a 529); `None`
    /// (with the reason) when the model has no chat template or no `<turn|>` token, or a CPU copy
    /// would pass [`READER_BYTES_CAP`].
    pub fn start(
        model: &ModelDir,
        model_name: &str,
        codec: Arc<TextCodec>,
        chat: Option<ChatTemplate>,
        settings: GenerationConfig,
        (reader, queue): (Option<ReaderHandle>, usize),
        extensions: Extensions,
    ) -> Result<Option<Self>> {
        let Some(chat) = chat else {
            eprintln!("/v1/systemone is off: the model has no chat template");
            return Ok(None);
        };
        let turn_close = match codec.encode("<turn|>", false)?.as_slice() {
            &[id] => id,
            _ => {
                eprintln!("/v1/systemone is off: the tokenizer has no <turn|> token");
                return Ok(None);
            }
        };
        let cfg = &model.config;
        let f32_bytes = crate::footprint::weight_bytes(&cfg.text, &|_| dg_model::StoredDtype::F32, dg_gpu::WeightFormat::F32).total;
        if reader.is_none() && f32_bytes > READER_BYTES_CAP {
            eprintln!(
                "/v1/systemone is off: reads run on an f32 CPU copy of the weights ({} MiB here, over the {} MiB cap)",
                f32_bytes >> 20,
                READER_BYTES_CAP >> 20
            );
            return Ok(None);
        }
        let pad = cfg.text.pad_token_id.unwrap_or(0);
        let templates = Templates::new(codec, cfg.text.vocab_size as u32, turn_close, pad, cfg.canvas_length.min(64))?;
        let reader = match reader {
            Some(reader) => reader,
            None => ReaderHandle::spawn_cpu(model, queue).context("cannot start /v1/systemone's reader")?,
        };
        let settings = Arc::new(settings);
        Ok(Some(Service { model_name: model_name.to_string(), templates: Arc::new(templates), chat, reader, settings, extensions }))
    }
}

/// A group of questions ready to read: its prompt, template and slots.
struct Group {
    questions: Vec<Question>,
    prompt: Prompt,
    /// The prompt's images (placeholders expanded in `prompt`), when the request has any.
    images: Option<JobImages>,
    resolved: Resolved,
    seed: i64,
    /// The thought read before this group: its prompt's tokens (billed as input) and its own.
    thought: (u64, u64),
}

/// A group's prompt.
enum Prompt {
    Fixed(Vec<u32>),
    /// These ids (the chat prompt and the scaffold, or a thought), then the answers chosen for the
    /// groups read before (a sequential read).
    AfterEarlier(Vec<u32>),
}

/// How a request's groups are read.
#[derive(Debug, Clone, Copy)]
struct Plan {
    steps: usize,
    samples: Option<usize>,
}

/// What the route holds: the service (`None` when the model cannot serve reads), the body limit
/// and the server's counters.
struct Endpoint {
    service: Option<Arc<Service>>,
    max_body: usize,
    metrics: Arc<Metrics>,
}

/// The `/v1/systemone` route, on any router state.
pub fn router<S: Clone + Send + Sync + 'static>(service: Option<Arc<Service>>, max_body: usize, metrics: Arc<Metrics>) -> axum::Router<S> {
    axum::Router::new().route("/v1/systemone", axum::routing::post(handle)).with_state(Arc::new(Endpoint { service, max_body, metrics }))
}

async fn handle(State(endpoint): State<Arc<Endpoint>>, request: Request) -> Response {
    let started = Instant::now();
    let (response, timing) = match answer(&endpoint, request.into_body()).await {
        Ok((body, timing)) => {
            let mut r = (StatusCode::OK, body).into_response();
            r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
            (r, timing)
        }
        Err(rejection) => (rejected(rejection), Timing::default()),
    };
    endpoint.metrics.reads(timing.prompt_tokens, timing.reused_tokens);
    with_headers(response, started, timing)
}

/// An error answer.
pub fn rejected(r: Rejection) -> Response {
    let mut response = (r.status, axum::Json(r.body)).into_response();
    if let Some(s) = r.retry_after {
        response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(s));
    }
    response
}

/// OpenJev's `server-timing` (the model's time, the rest, the total; then the model's time split
/// into the prompts' prefill and the reads' forwards) and request-id headers.
fn with_headers(mut response: Response, started: Instant, t: Timing) -> Response {
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    let (total, prefill, reads) = (ms(started.elapsed()), ms(t.prefill), ms(t.reads));
    let model = prefill + reads;
    let timing = format!(
        "model;dur={model:.1}, server;dur={:.1}, total;dur={total:.1}, prefill;dur={prefill:.1}, read;dur={reads:.1}",
        (total - model).max(0.0)
    );
    let id = format!("req_{:032x}", rand_id());
    let headers = response.headers_mut();
    for (name, value) in [("server-timing", timing), ("x-typesafe-request-id", id.clone()), ("x-request-id", id)] {
        if let Ok(v) = HeaderValue::from_str(&value) {
            headers.insert(name, v);
        }
    }
    response
}

/// A request id: the clock and a counter through SplitMix64's finaliser.
fn rand_id() -> u128 {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    let mix = |mut z: u64| {
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    (u128::from(mix(nanos ^ n)) << 64) | u128::from(mix(!nanos ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15)))
}

async fn answer(endpoint: &Endpoint, body: Body) -> Result<(String, Timing), Rejection> {
    let service = endpoint.service.as_ref().ok_or_else(|| Rejection::semantic("/v1/systemone is not served for this model"))?;
    let max = endpoint.max_body;
    let body = axum::body::to_bytes(body, max).await.map_err(|_| {
        Rejection::typed(StatusCode::PAYLOAD_TOO_LARGE, "api_usage_error", format!("request body is larger than {max} bytes"))
    })?;
    let req = request::parse(&body)?;
    if req.model != service.model_name && !SDK_ALIASES.contains(&req.model.as_str()) {
        return Err(Rejection::typed(StatusCode::BAD_REQUEST, "api_usage_error", format!("Unknown model: {}", req.model)));
    }
    let answers = decide(service, &req).await?;
    Ok((answers.0.dumps(false, false), answers.1))
}

/// Answers a checked request: the response body (`{model, answers, usage}`) and where the time went.
pub async fn decide(service: &Service, req: &SystemOne) -> Result<(Json, Timing), Rejection> {
    if req.questions.len() > MAX_QUESTIONS {
        return Err(Rejection::semantic(format!("at most {MAX_QUESTIONS} questions per request")));
    }
    let images = images::parts(&req.images)?;
    let think = req.think.unwrap_or(0);
    if !images.is_empty() && (think > 0 || req.sequential == Some(true)) {
        let field = if think > 0 { "think" } else { "sequential" };
        return Err(Rejection::semantic(format!("{field} needs a text state; send images without it")));
    }
    let templates = &service.templates;
    let schema = templates.schema(&req.questions).map_err(|e| Rejection::semantic(e.0))?;
    let dumped = Json::Object(req.questions.iter().map(|(k, _, q)| (k.clone(), q.clone())).collect());
    let mut key = vec![req.state.clone(), dumped];
    if !images.is_empty() {
        key.push(Json::Array(images.iter().map(|i| Json::String(i.url.clone())).collect()));
    }
    let seed = i64::from(pyjson::seed(&key));
    let state_text = match &req.state {
        Json::String(s) => s.clone(),
        v => v.dumps(false, false),
    };
    let groups = if schema.questions.is_empty() { Vec::new() } else { templates.groups(&schema.questions, schema.format) };
    // Images go through the tower once, when something is read (as OpenJev's upstream sees them
    // only then), off the async workers.
    let encoded = if images.is_empty() || groups.is_empty() {
        Vec::new()
    } else {
        let input = service.extensions.images.clone();
        tokio::task::spawn_blocking(move || images::encode(&input, &images))
            .await
            .map_err(|e| Rejection::typed(StatusCode::INTERNAL_SERVER_ERROR, "api_error", format!("the image encoder failed: {e}")))??
    };
    let prompt = ChatPrompt { service, state: &state_text, images: encoded.len() };
    // Sequential: every group is read under the whole question list, each after the answers chosen
    // for the groups before it (OpenJev's `_sequential`).
    let sequential = req.sequential == Some(true) && groups.len() > 1;
    let chunked = groups.len() > 1;
    let thinking = think > 0 && !groups.is_empty();
    let mut ready = Vec::with_capacity(groups.len());
    if sequential {
        let system = templates.system_text(&schema.questions, schema.format, false);
        // One thought under the whole list (drawing from the request's seed), or the chat prompt.
        let (base, thought) = if thinking {
            think_before(service, prompt.ids(&system, true)?, think, seed as u64).await?
        } else {
            (prompt.ids(&system, false)?, (0, 0))
        };
        for (k, questions) in groups.into_iter().enumerate() {
            let (after, group_prompt) = match (k, thinking) {
                (0, true) => (After::Thought, Prompt::Fixed(base.clone())),
                (0, false) => (After::ChatPrompt, Prompt::Fixed(base.clone())),
                (_, true) => (After::EarlierAnswers, Prompt::AfterEarlier(base.clone())),
                (_, false) => (After::EarlierAnswers, Prompt::AfterEarlier([&base[..], templates.scaffold()].concat())),
            };
            let resolved = templates.resolve(&questions, schema.format, after).map_err(|e| Rejection::semantic(e.0))?;
            let thought = if k == 0 { thought } else { (0, 0) };
            ready.push(Group {
                questions,
                prompt: group_prompt,
                images: None,
                resolved,
                seed: seed + GROUP_SEED_STRIDE * k as i64,
                thought,
            });
        }
    } else {
        let mut pending = Vec::with_capacity(groups.len());
        for (k, questions) in groups.into_iter().enumerate() {
            let system = templates.system_text(&questions, schema.format, chunked);
            let group_seed = seed + GROUP_SEED_STRIDE * k as i64;
            pending.push((questions, prompt.ids(&system, thinking)?, group_seed));
        }
        // Each group's thought, generated together (OpenJev's `asyncio.gather`).
        let thoughts = if thinking {
            let all = pending.iter().map(|(_, ids, group_seed)| think_before(service, ids.clone(), think, *group_seed as u64));
            futures_util::future::try_join_all(all).await?
        } else {
            Vec::new()
        };
        let mut thoughts = thoughts.into_iter();
        for (questions, ids, group_seed) in pending {
            let (ids, after, thought) = match thoughts.next() {
                Some((prefix, thought)) => (prefix, After::Thought, thought),
                None => (ids, After::ChatPrompt, (0, 0)),
            };
            let resolved = templates.resolve(&questions, schema.format, after).map_err(|e| Rejection::semantic(e.0))?;
            let (ids, images) = match &service.extensions.images {
                Ok(input) if !encoded.is_empty() => {
                    let (ids, images) = images::placed(input, &ids, &encoded)?;
                    (ids, Some(images))
                }
                _ => (ids, None),
            };
            ready.push(Group { questions, prompt: Prompt::Fixed(ids), images, resolved, seed: group_seed, thought });
        }
    }
    let plan = Plan { steps: req.steps.unwrap_or(1), samples: req.samples };
    let canvases: Vec<Vec<Vec<u32>>> = ready
        .iter()
        .map(|g| {
            let reads = plan.samples.unwrap_or(REREADS) as i64;
            (0..reads).map(|k| templates.canvas(&g.resolved, g.seed + READ_SEED_STRIDE * k)).collect()
        })
        .collect();
    let (shared, settings, format) = (service.templates.clone(), service.settings.clone(), schema.format);
    let read = move |reader: &mut Reader<'_>| read_groups(reader, (&shared, &settings), format, ready, canvases, plan);
    let (results, timing) = service.reader.run(read).await.map_err(not_run)?.ok_or_else(reader_stopped)?;
    // The model refuses only what the request made (a prompt past the model's positions): a 400,
    // as OpenJev answers its upstream's 4xx.
    let results = results.map_err(|e| Rejection::semantic(format!("the model rejected this request: {e:#}")))?;
    let mut answers: Vec<(String, Json)> = schema.forced;
    let (mut billed, mut thought_tokens) = (0, 0);
    for (questions, means, group_billed, group_thought) in results {
        billed += group_billed;
        thought_tokens += group_thought;
        for (q, mean) in questions.iter().zip(means) {
            answers.push((q.key.clone(), template::answer(q, &mean)));
        }
    }
    let ordered: Vec<(String, Json)> = req.questions.iter().filter_map(|(k, _, _)| answers.iter().find(|(a, _)| a == k).cloned()).collect();
    // As OpenJev: output_tokens stays 0 (Jev's contract) unless a thought was generated.
    let usage = Json::Object(vec![
        ("input_tokens".into(), Json::Number(billed.into())),
        ("output_tokens".into(), Json::Number(thought_tokens.into())),
    ]);
    let response = Json::Object(vec![
        ("model".into(), Json::String(service.model_name.clone())),
        ("answers".into(), Json::Object(ordered)),
        ("usage".into(), usage),
    ]);
    Ok((response, timing))
}

/// A request's chat prompt: the system text, then the user turn (the images, when any, ahead of
/// the state).
struct ChatPrompt<'a> {
    service: &'a Service,
    state: &'a str,
    images: usize,
}

impl ChatPrompt<'_> {
    /// The prompt's ids after `system`, ending after the model turn's marker, with thinking on or
    /// off (OpenJev's `chat_template_kwargs` `enable_thinking`; `chat_prompt_ids`).
    fn ids(&self, system: &str, thinking: bool) -> Result<Vec<u32>, Rejection> {
        let user = match self.images {
            0 => serde_json::Value::String(self.state.to_string()),
            n => {
                let mut parts = vec![serde_json::json!({"type": "image"}); n];
                parts.push(serde_json::json!({"type": "text", "text": self.state}));
                serde_json::Value::Array(parts)
            }
        };
        let messages = [serde_json::json!({"role": "system", "content": system}), serde_json::json!({"role": "user", "content": user})];
        let kwargs = serde_json::Map::from_iter([("enable_thinking".to_string(), serde_json::Value::Bool(thinking))]);
        let conversation = Conversation { messages: &messages, tools: None, kwargs: &kwargs, add_generation_prompt: true };
        let text = self.service.chat.render_conversation(&conversation).map_err(|e| Rejection::semantic(format!("{e:#}")))?;
        self.service.templates.codec.encode(&text, false).map_err(|e| Rejection::semantic(format!("{e:#}")))
    }
}

/// OpenJev's `think`: the chat prompt with thinking on (`prompt`), the thought's open tag, up to
/// `budget` tokens the model writes there (dg's generation, drawing from `seed`), the close tag.
/// Returns that prefix, and the thought pass's prompt tokens (billed) and its own tokens.
async fn think_before(service: &Service, prompt: Vec<u32>, budget: usize, seed: u64) -> Result<(Vec<u32>, (u64, u64)), Rejection> {
    let thinker = service.extensions.thinker.as_ref().map_err(|why| Rejection::semantic(format!("think is not served here: {why}")))?;
    let templates = &service.templates;
    let prompt = [prompt, templates.thought_open.clone()].concat();
    let request = ThoughtRequest { prompt: prompt.clone(), budget, stop: templates.thought_close.clone(), seed };
    let mut thought = thinker(request).await?;
    // The close tag's first token ends the thought (OpenJev cuts there too).
    if let Some(end) = thought.iter().position(|&id| Some(&id) == templates.thought_close.first()) {
        thought.truncate(end);
    }
    let counts = (prompt.len() as u64, thought.len() as u64);
    Ok(([prompt, thought, templates.thought_close.clone()].concat(), counts))
}

/// Why the reader took no work: a full queue (529) or a stopped reader (503).
fn not_run(refused: Refused) -> Rejection {
    match refused {
        Refused::Full => {
            let mut r = Rejection::typed(
                StatusCode::from_u16(529).expect("valid"),
                "overloaded_error",
                "The server is at capacity. Retry shortly.",
            );
            r.retry_after = Some(1);
            r
        }
        Refused::Gone => reader_stopped(),
    }
}

fn reader_stopped() -> Rejection {
    let mut r = Rejection::typed(StatusCode::SERVICE_UNAVAILABLE, "api_error", "inference backend unavailable: the reader stopped");
    r.retry_after = Some(2);
    r
}

impl Service {
    /// One read of `canvas` after `prompt` on the reader, drawing (a read of more than one step)
    /// from `seed`, and where its time went: vLLM's read-only requests
    /// ([`crate::serve::openai::vllm`]; the prompt encoded in the parts `/v1/systemone`'s is, so
    /// both read the same bits). Refused as `/v1/systemone`'s reads are; a read the model refuses
    /// (a prompt past its positions) is a 400.
    pub async fn read(
        &self,
        prompt: Vec<u32>,
        canvas: Vec<u32>,
        pinned: Option<Vec<bool>>,
        steps: usize,
        slots: Vec<dg_sampler::Slot>,
        seed: u64,
    ) -> Result<(dg_sampler::Read, Timing), Rejection> {
        let (settings, segments) = (self.settings.clone(), self.templates.segments(&prompt));
        let read = move |reader: &mut Reader<'_>| -> Result<dg_sampler::Read> {
            reader.prompt(&prompt, &segments, None)?;
            let request = ReadRequest { canvas: &canvas, pinned: pinned.as_deref(), steps, slots: &slots };
            let mut reads = reader.read(&[request], &[seed], &settings)?;
            Ok(reads.remove(0))
        };
        let (result, timing) = self.reader.run(read).await.map_err(not_run)?.ok_or_else(reader_stopped)?;
        let read = result.map_err(|e| Rejection::semantic(format!("the model rejected this request: {e:#}")))?;
        Ok((read, timing))
    }
}

/// Per group: its questions, their mean label probabilities, the prompt tokens billed (its
/// thought's included), and its thought's tokens.
type GroupResult = (Vec<Question>, Vec<Vec<f64>>, u64, u64);

/// Reads every group on the reader: samples, or one read and, when unsure, the re-reads.
fn read_groups(
    reader: &mut Reader<'_>,
    (templates, settings): (&Templates, &GenerationConfig),
    format: template::Format,
    groups: Vec<Group>,
    canvases: Vec<Vec<Vec<u32>>>,
    plan: Plan,
) -> Result<Vec<GroupResult>> {
    let mut out = Vec::with_capacity(groups.len());
    let mut lines = Vec::new();
    for (g, canvases) in groups.into_iter().zip(canvases) {
        let prompt = match &g.prompt {
            Prompt::Fixed(ids) => ids.clone(),
            Prompt::AfterEarlier(ids) => [&ids[..], &templates.earlier(&lines, format)].concat(),
        };
        reader.prompt(&prompt, &templates.segments(&prompt), g.images.as_ref())?;
        let width = canvases[0].len();
        let pinned: Vec<bool> = (0..width).map(|r| !g.resolved.slots.iter().any(|s| s.position == r)).collect();
        // The reads of canvases `ks` (their seeds OpenJev's), batched on the GPU.
        let mut some = |ks: std::ops::Range<usize>| -> Result<Vec<Vec<Distribution>>> {
            let requests: Vec<ReadRequest<'_>> = canvases[ks.clone()]
                .iter()
                .map(|canvas| ReadRequest { canvas, pinned: Some(&pinned), steps: plan.steps, slots: &g.resolved.slots })
                .collect();
            let seeds: Vec<u64> = ks.map(|k| (g.seed + READ_SEED_STRIDE * k as i64) as u64).collect();
            let reads = reader.read(&requests, &seeds, settings)?;
            Ok(reads.iter().map(|r| r.slots.iter().zip(&g.resolved.slots).map(|(r, s)| distribution(r, &s.labels)).collect()).collect())
        };
        let prompt_tokens = prompt.len() as u64;
        let (reads, billed) = match plan.samples {
            Some(n) => (some(0..n)?, prompt_tokens * n as u64),
            None => {
                let mut reads = some(0..1)?;
                if reads[0].iter().map(|d| d.entropy).fold(f64::NEG_INFINITY, f64::max) > REREAD_ENTROPY {
                    reads.extend(some(1..canvases.len())?);
                }
                (reads, prompt_tokens)
            }
        };
        let means: Vec<Vec<f64>> = (0..g.questions.len())
            .map(|qi| {
                let labels = reads[0][qi].probs.len();
                (0..labels).map(|l| reads.iter().map(|r| r[qi].probs[l]).sum::<f64>() / reads.len() as f64).collect()
            })
            .collect();
        let chosen: Vec<usize> = means.iter().map(|m| (0..m.len()).fold(0, |best, i| if m[i] > m[best] { i } else { best })).collect();
        lines.push(Templates::answer_text(&g.questions, &chosen, format));
        out.push((g.questions, means, billed + g.thought.0, g.thought.1));
    }
    Ok(out)
}

/// One slot of one read as OpenJev's `slot_distribution` sees it over vLLM's logprobs (the top 20
/// and every label's): the labels' probabilities renormalised over them, and the entropy of the
/// returned tokens' probabilities.
struct Distribution {
    probs: Vec<f64>,
    entropy: f64,
}

fn distribution(s: &SlotRead, labels: &[u32]) -> Distribution {
    let lp: Vec<f64> = s.label_logprobs.iter().map(|&x| f64::from(x)).collect();
    let max = lp.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = lp.iter().map(|x| (x - max).exp()).collect();
    let z: f64 = e.iter().sum();
    let mut returned: Vec<(u32, f64)> = s.top.iter().map(|&(id, lp)| (id, f64::from(lp))).collect();
    for (&id, &lp) in labels.iter().zip(&lp) {
        if !returned.iter().any(|&(t, _)| t == id) {
            returned.push((id, lp));
        }
    }
    let entropy = -returned.iter().map(|&(_, lp)| lp.exp()).filter(|&p| p > 0.0).map(|p| p * p.ln()).sum::<f64>();
    Distribution { probs: e.iter().map(|x| x / z).collect(), entropy }
}

/// OpenJev's answer to a `/v1/systemone` request without the server's API key: 403 when none is
/// sent, 401 when it is wrong.
pub fn unauthorized(headers: &axum::http::HeaderMap) -> Response {
    let r = if headers.contains_key(header::AUTHORIZATION) {
        Rejection::typed(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "Cannot authenticate with the server. Please check your API key and try again.",
        )
    } else {
        Rejection::typed(StatusCode::FORBIDDEN, "authentication_error", "Must supply an API key! Check your request and try again.")
    };
    with_headers(rejected(r), Instant::now(), Timing::default())
}

/// TypeSafe's model list (`GET /v1/models`, `models`): the served model, when it serves reads.
pub fn models(model_name: &str, served: bool) -> serde_json::Value {
    let described =
        serde_json::json!({"name": model_name, "description": format!("{model_name} read through dg's typed reads"), "release_date": ""});
    serde_json::Value::Array(if served { vec![described] } else { Vec::new() })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The expected values are OpenJev's own (`engine.py`'s `build_schema`, `groups`,
    /// `system_text`, `resolve_template` and `build_canvas`, and `api.py`'s seed), run on this
    /// request with the bundled model's tokenizer (transformers' `PreTrainedTokenizerFast`), its
    /// vocabulary (986), `<turn|>` (6), pad (0) and canvas (32).
    #[test]
    fn seeds_prompts_templates_and_canvases_are_openjevs() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/tiny-random");
        let codec = Arc::new(TextCodec::from_dir(&root).unwrap().unwrap());
        let t = Templates::new(codec, 986, 6, 0, 32).unwrap();
        let body = r#"{"state": {"ticket": "Charged twice ✓", "n": 2.5}, "model": "m", "questions": {
            "urgency": {"type": "score", "instructions": "How urgent?", "criteria": ["low", {"level": "high"}, "now"]},
            "team": {"type": "choice", "criteria": {"pay": "money", "ship": null}},
            "only": {"type": "choice", "criteria": {"x": null}},
            "more": {"type": "score", "instructions": ["a", 1], "criteria": ["a", "b"]}}}"#;
        let req = request::parse(body.as_bytes()).unwrap();
        let dumped = Json::Object(req.questions.iter().map(|(k, _, q)| (k.clone(), q.clone())).collect());
        let seed = i64::from(pyjson::seed(&[req.state.clone(), dumped]));
        assert_eq!(seed, 4_274_620_331);
        assert_eq!((&t.choice_labels[..5], t.choice_labels.len()), (&["A", "H", "I", "M", "O"].map(String::from)[..], 27));
        let schema = t.schema(&req.questions).unwrap();
        assert_eq!(schema.forced.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(), ["only"]);
        let groups = t.groups(&schema.questions, schema.format);
        let keys: Vec<Vec<&str>> = groups.iter().map(|g| g.iter().map(|q| q.key.as_str()).collect()).collect();
        assert_eq!(keys, [vec!["urgency", "team"], vec!["more"]]);
        let head = "Answer a fixed set of questions about the state the user provides. Each question lists its allowed answers; reply with exactly one label per question.\n\n";
        let tail = "\nReply with one line per question, in this order, formatted as \"id: label\". A reply may cover only some of the questions; answer every line that is present.";
        let systems = [
            "Question q1: How urgent?\n  0: low\n  1: {\"level\": \"high\"}\n  2: now\n\nQuestion q2: Answer about the state.\n  A: pay (money)\n  H: ship\n",
            "Question q3: [\"a\", 1]\n  0: a\n  1: b\n",
        ];
        let scaffold = [36, 100, 200, 128, 86, 233, 38, 92, 80, 121, 146, 92, 7, 36, 200, 128, 86, 233, 100, 38];
        let templates: [&[u32]; 2] = [&[89, 25, 34, 103, 24, 7, 89, 26, 34, 215], &[89, 27, 34, 103, 24]];
        let slots: [Vec<(usize, Vec<u32>)>; 2] = [vec![(24, vec![24, 25, 26]), (29, vec![215, 324])], vec![(24, vec![24, 25])]];
        let canvases: [[Vec<u32>; 2]; 2] = [
            [vec![136, 7, 89, 26, 34, 752, 6, 0], vec![644, 7, 89, 26, 34, 921, 6, 0]],
            [vec![935, 6, 0, 0, 0, 0, 0, 0], vec![224, 6, 0, 0, 0, 0, 0, 0]],
        ];
        for (k, g) in groups.iter().enumerate() {
            assert_eq!(t.system_text(g, schema.format, true), format!("{head}{}{tail}", systems[k]));
            let r = t.resolve(g, schema.format, After::ChatPrompt).unwrap();
            assert_eq!(r.template, [&scaffold[..], templates[k]].concat(), "group {k}");
            let got: Vec<(usize, Vec<u32>)> = r.slots.iter().map(|s| (s.position, s.labels.clone())).collect();
            assert_eq!(got, slots[k], "group {k}");
            for (i, want) in canvases[k].iter().enumerate() {
                let canvas = t.canvas(&r, seed + GROUP_SEED_STRIDE * k as i64 + READ_SEED_STRIDE * i as i64);
                assert_eq!(canvas, [&scaffold[..], &templates[k][..4], &want[..]].concat(), "group {k} read {i}");
            }
        }
        // Sequential: the second group after the first's answers (labels 2 and H chosen).
        let sequential = "Question q1: How urgent?\n  0: low\n  1: {\"level\": \"high\"}\n  2: now\n\nQuestion q2: Answer about the state.\n  A: pay (money)\n  H: ship\n\nQuestion q3: [\"a\", 1]\n  0: a\n  1: b\n";
        let all_tail = "\nReply with one line per question, in this order, formatted as \"id: label\".";
        assert_eq!(t.system_text(&schema.questions, schema.format, false), format!("{head}{sequential}{all_tail}"));
        let lines = [Templates::answer_text(&groups[0], &[2, 1], schema.format)];
        assert_eq!(t.earlier(&lines, schema.format), [89, 25, 34, 103, 26, 7, 89, 26, 34, 324]);
        let r = t.resolve(&groups[1], schema.format, After::EarlierAnswers).unwrap();
        assert_eq!(r.template, [7, 89, 27, 34, 103, 24]);
        assert_eq!(r.slots.iter().map(|s| (s.position, s.labels.clone())).collect::<Vec<_>>(), [(5, vec![24, 25])]);
        assert_eq!(t.canvas(&r, seed + GROUP_SEED_STRIDE), [7, 89, 27, 34, 103, 935, 6, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    }
}

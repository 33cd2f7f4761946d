//! The HTTP side: routes, the API key gate, per-status request counts, reading bodies (size and
//! time limits), turning a checked request into an engine job, and answering it as one JSON object
//! or as server-sent events in OpenAI's chunk shape (with `event: draft` events on request).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use dg_model::{GenerationConfig, ModelDir, RawGenerationConfig};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::engine::{Event, Extras, Job, JobImages, Summary};
use super::metrics::Metrics;
use super::openai::images::{ImagePart, image_parts};
use super::openai::tools::{self, ChatReply, ReplySetup};
use super::openai::{self, ApiError, Endpoint, PromptInput, vllm};
pub use super::prompt_images::ImageInput;
use crate::chat::{ChatTemplate, Conversation, reply};
use crate::images::EncodeError;
use crate::text::TextCodec;

/// What every handler shares.
#[derive(Debug)]
pub struct App {
    /// The `model` name requests must give.
    pub model_name: String,
    pub model: ModelDir,
    pub template: Option<ChatTemplate>,
    pub codec: Arc<TextCodec>,
    pub jobs: mpsc::Sender<Job>,
    pub metrics: Arc<Metrics>,
    /// The sampler settings of the command line (over generation_config.json).
    pub defaults: RawGenerationConfig,
    pub default_seed: u64,
    /// Positions a job may use (prompt and every canvas).
    pub context: usize,
    pub api_key: Option<String>,
    pub max_body: usize,
    pub body_timeout: Duration,
    /// Unix time of the start, the `created` of `/v1/models`.
    pub started: u64,
    pub next_id: AtomicU64,
    /// Times an empty chat reply is generated again (`--empty-reply-retries`).
    pub empty_reply_retries: usize,
    /// Whether `dg.test_output` is accepted (`--test-hooks`, for tests).
    pub test_hooks: bool,
    /// `/v1/systemone`, where the model can serve it.
    pub systemone: Option<Arc<super::systemone::Service>>,
    /// What encodes chat requests' image parts, or why they are refused (no vision tower).
    pub images: Result<Arc<ImageInput>, String>,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, axum::Json(self.body())).into_response();
        if self.status == StatusCode::TOO_MANY_REQUESTS {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

/// The routes.
pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completion))
        .route("/v1/models", get(models))
        .merge(super::systemone::router(app.systemone.clone(), app.max_body, app.metrics.clone()))
        .route("/health", get(|| async { axum::Json(json!({"status": "ok"})) }))
        .route("/metrics", get(metrics))
        .fallback(|| async { ApiError::invalid(None, "no such endpoint").with(StatusCode::NOT_FOUND, "not_found") })
        .layer(middleware::from_fn_with_state(app.clone(), gate))
        .with_state(app)
}

/// The API key check (every path but /health) and the request count by endpoint and status.
async fn gate(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    let path = request.uri().path().to_string();
    let endpoint = match path.as_str() {
        "/v1/chat/completions" | "/v1/completions" | "/v1/models" | "/v1/systemone" | "/health" | "/metrics" => path.as_str(),
        _ => "other",
    };
    let authorized = match &app.api_key {
        None => true,
        Some(key) => {
            path == "/health"
                || request
                    .headers()
                    .get(header::AUTHORIZATION)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.strip_prefix("Bearer "))
                    .is_some_and(|given| given == key)
        }
    };
    let response = if authorized {
        next.run(request).await
    } else if path == "/v1/systemone" {
        super::systemone::unauthorized(request.headers())
    } else {
        let e = ApiError::invalid(None, "missing or wrong API key: send Authorization: Bearer KEY");
        ApiError { kind: "authentication_error", ..e }.with(StatusCode::UNAUTHORIZED, "invalid_api_key").into_response()
    };
    app.metrics.request(endpoint, response.status().as_u16());
    response
}

/// OpenAI's list (`object`, `data`) and TypeSafe's (`models`) in one body.
async fn models(State(app): State<Arc<App>>) -> Response {
    let model = json!({"id": app.model_name, "object": "model", "created": app.started, "owned_by": "dg"});
    let typed = super::systemone::models(&app.model_name, app.systemone.is_some());
    axum::Json(json!({"object": "list", "data": [model], "models": typed})).into_response()
}

async fn metrics(State(app): State<Arc<App>>) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], app.metrics.render()).into_response()
}

async fn chat(State(app): State<Arc<App>>, request: Request) -> Result<Response, ApiError> {
    generate(app, Endpoint::Chat, request).await
}

async fn completion(State(app): State<Arc<App>>, request: Request) -> Result<Response, ApiError> {
    generate(app, Endpoint::Completion, request).await
}

/// The body, within the size and time limits.
async fn read_body(app: &App, body: Body) -> Result<Bytes, ApiError> {
    match tokio::time::timeout(app.body_timeout, axum::body::to_bytes(body, app.max_body)).await {
        Err(_) => {
            Err(ApiError::invalid(None, "the request body did not arrive in time").with(StatusCode::REQUEST_TIMEOUT, "request_timeout"))
        }
        Ok(Err(_)) => Err(ApiError::invalid(None, format!("the request body is over {} bytes", app.max_body))
            .with(StatusCode::PAYLOAD_TOO_LARGE, "body_too_large")),
        Ok(Ok(bytes)) => Ok(bytes),
    }
}

async fn generate(app: Arc<App>, endpoint: Endpoint, request: Request) -> Result<Response, ApiError> {
    let body = read_body(&app, request.into_body()).await?;
    let limits = vllm::Limits { vocab_size: app.model.config.text.vocab_size, canvas_length: app.model.config.canvas_length };
    if let Some(structured) = vllm::parse(endpoint, &body, limits)? {
        return structured_read(&app, endpoint, structured).await;
    }
    let req = openai::parse(endpoint, &body)?;
    served_model(&app, &req.model)?;
    let parts = match &req.prompt {
        PromptInput::Chat(chat) => image_parts(&chat.messages)?,
        _ => Vec::new(),
    };
    let (prompt, reply) = prompt_ids(&app, &req.prompt)?;
    let (prompt, images) = match parts.first() {
        None => (prompt, None),
        Some(first) => {
            let input = app.images.clone().map_err(|why| ApiError::invalid(Some(&first.param), format!("{}: {why}", first.param)))?;
            // The tower blocks (on the CPU, or waiting on the GPU): off the async workers.
            let encoded = tokio::task::spawn_blocking(move || encode_images(&input, prompt, &parts)).await;
            let (prompt, images) = encoded.map_err(|e| server_error(format!("the image encoder failed: {e}")))??;
            (prompt, Some(Arc::new(images)))
        }
    };
    let (events_tx, events) = mpsc::unbounded_channel();
    let job = job(&app, &req, prompt, images, events_tx)?;
    app.metrics.queue_depth.fetch_add(1, Ordering::Relaxed);
    if let Err(e) = app.jobs.try_send(job) {
        app.metrics.queue_depth.fetch_sub(1, Ordering::Relaxed);
        return Err(match e {
            mpsc::error::TrySendError::Full(_) => {
                ApiError::invalid(None, "the queue is full; retry later").with(StatusCode::TOO_MANY_REQUESTS, "queue_full")
            }
            mpsc::error::TrySendError::Closed(_) => {
                ApiError::invalid(None, "the server is shutting down").with(StatusCode::SERVICE_UNAVAILABLE, "shutting_down")
            }
        });
    }
    let id = app.next_id.fetch_add(1, Ordering::Relaxed);
    let shape = Shape { endpoint, id, model: app.model_name.clone(), created: unix_now(), reply };
    if req.stream { Ok(stream(shape, events)) } else { whole(shape, events).await }
}

/// A 404 unless `model` is the served model's name.
fn served_model(app: &App, model: &str) -> Result<(), ApiError> {
    if model == app.model_name {
        return Ok(());
    }
    Err(ApiError::invalid(Some("model"), format!("model {model:?} does not exist; this server serves {:?}", app.model_name))
        .with(StatusCode::NOT_FOUND, "model_not_found"))
}

/// A read-only request of vLLM's structured mode: one read on `/v1/systemone`'s reader, answered
/// in vLLM's shape.
async fn structured_read(app: &App, endpoint: Endpoint, s: vllm::Structured) -> Result<Response, ApiError> {
    served_model(app, &s.request.model)?;
    let service = app
        .systemone
        .as_ref()
        .ok_or_else(|| ApiError::invalid(Some("vllm_xargs"), "reads are not served for this model (the server said why at startup)"))?;
    let (prompt, _) = prompt_ids(app, &s.request.prompt)?;
    let seed = s.request.seed.unwrap_or(app.default_seed);
    let (read, timing) = service.read(prompt.clone(), s.canvas.clone(), s.pinned.clone(), s.steps, s.slots(), seed).await.map_err(|r| {
        let detail = &r.body["detail"];
        let message = detail["message"].as_str().or(detail.as_str()).unwrap_or("the read failed").to_string();
        let kind = if r.status.is_server_error() { "server_error" } else { "invalid_request_error" };
        ApiError { status: r.status, message, kind, param: None, code: None }
    })?;
    app.metrics.reads(timing.prompt_tokens, timing.reused_tokens);
    let ids: Vec<u32> = read.slots.iter().map(|r| r.argmax).collect();
    let reply = app.codec.decode(&ids).map_err(|e| server_error(format!("{e:#}")))?;
    let text = |id: u32| app.codec.decode(&[id]).unwrap_or_default();
    let id = app.next_id.fetch_add(1, Ordering::Relaxed);
    Ok(axum::Json(vllm::response(endpoint, &s, &read, &text, reply, prompt.len(), id, unix_now())).into_response())
}

/// The prompt's token ids, and how to read a chat reply.
fn prompt_ids(app: &App, prompt: &PromptInput) -> Result<(Vec<u32>, Option<ReplySetup>), ApiError> {
    let failed = |param: &str, e: anyhow::Error| ApiError::invalid(Some(param), format!("{e:#}"));
    let mut reply = None;
    let ids = match prompt {
        PromptInput::Chat(chat) => {
            let template = app
                .template
                .as_ref()
                .ok_or_else(|| ApiError::invalid(Some("messages"), "this model has no chat template; use /v1/completions"))?;
            if !chat.tools.is_empty() && !template.renders_tools() {
                return Err(ApiError::invalid(Some("tools"), "this model's chat template does not render tools"));
            }
            let tools = (!chat.tools.is_empty()).then_some(chat.tools.as_slice());
            let conversation = Conversation { messages: &chat.messages, tools, kwargs: &chat.kwargs, add_generation_prompt: true };
            let text = template.render_conversation(&conversation).map_err(|e| failed("messages", e))?;
            let setup = ReplySetup::new(chat, &text);
            let ids = app.codec.encode(&(text + &setup.pinned), false).map_err(|e| failed("messages", e))?;
            reply = Some(setup);
            ids
        }
        PromptInput::Text(text) => app.codec.encode(text, true).map_err(|e| failed("prompt", e))?,
        PromptInput::Ids(ids) => {
            let vocab = app.model.config.text.vocab_size as u64;
            if let Some(id) = ids.iter().find(|&&id| id >= vocab) {
                return Err(ApiError::invalid(Some("prompt"), format!("token id {id} is outside the vocabulary (0..{vocab})")));
            }
            ids.iter().map(|&id| id as u32).collect()
        }
    };
    if ids.is_empty() {
        return Err(ApiError::invalid(None, "the prompt has no tokens"));
    }
    Ok((ids, reply))
}

/// The prompt with each image part's placeholder expanded to its soft tokens, and the images'
/// rows and cache keys; a part that does not decode or process is a 400 naming it, a tower that
/// fails on it (a device error) a 500.
fn encode_images(input: &ImageInput, prompt: Vec<u32>, parts: &[ImagePart]) -> Result<(Vec<u32>, JobImages), ApiError> {
    let tower = &input.tower;
    let encoded = parts
        .iter()
        .map(|part| {
            tower.encode(&part.bytes, &input.processor).map_err(|e| match e {
                EncodeError::Image(_) => ApiError::invalid(Some(&part.param), format!("{}: {e}", part.param)),
                EncodeError::Tower(_) => server_error(format!("{}: {e}", part.param)),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    JobImages::new(tower.spec(), &prompt, encoded)
        .map_err(|e| ApiError::invalid(Some("messages"), format!("the chat template's prompt: {e}")))
}

/// The engine job of a checked request: settings resolved and checked, positions counted.
fn job(
    app: &App,
    req: &openai::Request,
    prompt: Vec<u32>,
    images: Option<Arc<JobImages>>,
    events: mpsc::UnboundedSender<Event>,
) -> Result<Job, ApiError> {
    let config = &app.model.config;
    let ext = &req.dg;
    let over = RawGenerationConfig {
        max_new_tokens: req.max_tokens,
        max_denoising_steps: ext.steps,
        entropy_bound: ext.entropy_bound,
        t_min: ext.t_min,
        t_max: ext.t_max,
        stability_threshold: ext.stability_threshold,
        confidence_threshold: ext.confidence_threshold,
        ..Default::default()
    };
    let raw = app.defaults.clone().overridden_by(over);
    let mut settings = crate::settings::resolve_settings(&app.model, raw).map_err(|e| ApiError::invalid(Some("dg"), format!("{e:#}")))?;
    let extras = extras(app, req, &mut settings)?;
    dg_sampler::validate_config(&settings, config.text.vocab_size).map_err(|e| ApiError::invalid(Some("dg"), e.to_string()))?;
    let max_tokens = settings.max_new_tokens;
    let param = Some("max_tokens");
    if max_tokens > app.context {
        return Err(ApiError::invalid(param, format!("max_tokens {max_tokens} is over the server's context of {} positions", app.context)));
    }
    let canvases = settings.new_canvases(prompt.len(), config.canvas_length);
    crate::settings::check_positions(prompt.len(), canvases, config.canvas_length, app.context)
        .map_err(|e| ApiError::invalid(param, format!("{e:#}")).with(StatusCode::BAD_REQUEST, "context_length_exceeded"))?;
    let seed = req.seed.unwrap_or(app.default_seed);
    Ok(Job { prompt, settings, max_tokens, stop: req.stop.clone(), seed, drafts: ext.drafts, extras, images, events })
}

/// A chat job's markup tokens, its end after tool calls (added to `settings`' EOS ids) and its
/// retries of an empty reply; the forced text of the test hook.
fn extras(app: &App, req: &openai::Request, settings: &mut GenerationConfig) -> Result<Extras, ApiError> {
    let mut extras = Extras::default();
    if let PromptInput::Chat(chat) = &req.prompt {
        extras.markup = reply::MARKUP.iter().filter_map(|t| app.codec.token_id(t)).collect();
        extras.empty_retries = app.empty_reply_retries;
        if let (false, Some(end)) = (chat.tools.is_empty(), app.codec.token_id(reply::RESPONSE_OPEN)) {
            settings.eos_token_ids.push(end);
        }
    }
    if !req.dg.test_output.is_empty() {
        if !app.test_hooks {
            return Err(ApiError::invalid(Some("dg.test_output"), "dg.test_output is for tests: start the server with --test-hooks"));
        }
        let encode = |t: &String| app.codec.encode(t, false).map_err(|e| ApiError::invalid(Some("dg.test_output"), format!("{e:#}")));
        extras.forced = req.dg.test_output.iter().map(encode).collect::<Result<_, _>>()?;
    }
    Ok(extras)
}

fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// The parts every response object of one request shares.
struct Shape {
    endpoint: Endpoint,
    id: u64,
    model: String,
    created: u64,
    /// How to read the reply of a chat request.
    reply: Option<ReplySetup>,
}

impl Shape {
    fn object(&self, chunk: bool) -> Value {
        let (id, object) = match (self.endpoint, chunk) {
            (Endpoint::Chat, false) => (format!("chatcmpl-{}", self.id), "chat.completion"),
            (Endpoint::Chat, true) => (format!("chatcmpl-{}", self.id), "chat.completion.chunk"),
            (Endpoint::Completion, _) => (format!("cmpl-{}", self.id), "text_completion"),
        };
        json!({"id": id, "object": object, "created": self.created, "model": self.model, "choices": []})
    }

    /// A choice carrying `text`; `finish` on the last one.
    fn choice(&self, text: Option<&str>, finish: Option<&str>, whole: bool) -> Value {
        match (self.endpoint, whole) {
            (Endpoint::Chat, true) => json!({"index": 0, "message": {"role": "assistant", "content": text.unwrap_or("")},
                "logprobs": null, "finish_reason": finish}),
            (Endpoint::Chat, false) => {
                let delta = text.map_or(json!({}), |t| json!({"content": t}));
                json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish})
            }
            (Endpoint::Completion, _) => json!({"index": 0, "text": text.unwrap_or(""), "logprobs": null, "finish_reason": finish}),
        }
    }

    fn with_choice(&self, chunk: bool, choice: Value) -> Value {
        let mut v = self.object(chunk);
        v["choices"] = json!([choice]);
        v
    }

    /// A chunk carrying one chat delta.
    fn delta_chunk(&self, delta: Value) -> Value {
        self.with_choice(true, json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": null}))
    }

    /// The finish reason: `tool_calls` when the reply made calls.
    fn finish_reason(s: &Summary, called: bool) -> &'static str {
        if called { "tool_calls" } else { s.finish.name() }
    }

    fn finish(&self, mut v: Value, s: &Summary) -> Value {
        v["usage"] = json!({"prompt_tokens": s.prompt_tokens, "completion_tokens": s.completion_tokens,
            "total_tokens": s.prompt_tokens + s.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": s.reused_tokens}});
        v["dg"] = json!({
            "steps_per_canvas": s.steps_per_canvas,
            "tokens_per_forward": s.tokens_per_forward,
            "reused_prompt_tokens": s.reused_tokens,
            "cache": s.cache.name(),
            "prefill_ms": s.prefill.as_secs_f64() * 1e3,
            "first_canvas_ms": s.first_canvas.map(|d| d.as_secs_f64() * 1e3),
            "empty_reply_rerolls": s.rerolls,
        });
        v
    }

    /// `finish` with the warnings of a chat reply (calls that did not parse, or left out).
    fn finish_chat(&self, v: Value, s: &Summary, warnings: Vec<String>) -> Value {
        let mut v = self.finish(v, s);
        if !warnings.is_empty() {
            v["dg"]["tool_call_warnings"] = json!(warnings);
        }
        v
    }
}

fn server_error(message: String) -> ApiError {
    ApiError { kind: "server_error", ..ApiError::invalid(None, message) }.with(StatusCode::INTERNAL_SERVER_ERROR, "generation_failed")
}

/// A non-streamed answer: waits for the whole text. A client that disconnects cancels the job:
/// hyper sees the connection's end while the response is pending (HTTP/1 half-close is off, so an
/// EOF counts as gone) and drops this future with `events`, and the engine stops the job at its
/// next step when it finds the channel closed (the streamed answer's body holds `events` the same
/// way).
async fn whole(shape: Shape, mut events: mpsc::UnboundedReceiver<Event>) -> Result<Response, ApiError> {
    let mut text = String::new();
    while let Some(event) = events.recv().await {
        match event {
            Event::Draft { .. } => {}
            Event::Text(t) => text.push_str(&t),
            Event::Failed(message) => return Err(server_error(message)),
            Event::Done(summary) => {
                let Some(setup) = shape.reply.clone() else {
                    let v = shape.with_choice(false, shape.choice(Some(&text), Some(summary.finish.name()), true));
                    return Ok(axum::Json(shape.finish(v, &summary)).into_response());
                };
                let (mut reply, mut deltas) = ChatReply::new(setup, shape.id);
                deltas.extend(reply.push(&text));
                let (rest, called, warnings) = reply.finish();
                deltas.extend(rest);
                let finish = Shape::finish_reason(&summary, called);
                let choice = json!({"index": 0, "message": tools::reply_message(&deltas), "logprobs": null, "finish_reason": finish});
                return Ok(axum::Json(shape.finish_chat(shape.with_choice(false, choice), &summary, warnings)).into_response());
            }
        }
    }
    Err(server_error("the engine stopped before the generation ended".into()))
}

/// A streamed answer: one SSE frame per event, ending with `data: [DONE]`.
fn stream(shape: Shape, events: mpsc::UnboundedReceiver<Event>) -> Response {
    let data = |v: Value| format!("data: {v}\n\n");
    let first = match shape.endpoint {
        Endpoint::Chat => {
            let mut v = shape.object(true);
            v["choices"] = json!([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}]);
            Some(data(v))
        }
        Endpoint::Completion => None,
    };
    let (reply, pinned) = match shape.reply.clone() {
        Some(setup) => {
            let (reply, deltas) = ChatReply::new(setup, shape.id);
            (Some(reply), deltas.into_iter().map(|d| data(shape.delta_chunk(d))).collect())
        }
        None => (None, String::new()),
    };
    let first = first.map(|f| f + &pinned);
    let state = (shape, events, first, false, reply);
    let frames = futures_util::stream::unfold(state, move |(shape, mut events, first, done, mut reply)| async move {
        if let Some(frame) = first {
            return Some((Ok::<_, std::convert::Infallible>(Bytes::from(frame)), (shape, events, None, done, reply)));
        }
        if done {
            return None;
        }
        let (frame, done) = match events.recv().await {
            None => (data(server_error("the engine stopped before the generation ended".into()).body()) + "data: [DONE]\n\n", true),
            Some(Event::Draft { block, step, accepted, text }) => {
                let mut v = shape.object(true);
                v["dg"] = json!({"draft": {"block": block, "step": step, "accepted": accepted, "text": text}});
                (format!("event: draft\n{}", data(v)), false)
            }
            Some(Event::Text(t)) => match reply.as_mut() {
                Some(reply) => (reply.push(&t).into_iter().map(|d| data(shape.delta_chunk(d))).collect(), false),
                None => (data(shape.with_choice(true, shape.choice(Some(&t), None, false))), false),
            },
            Some(Event::Failed(message)) => (data(server_error(message).body()) + "data: [DONE]\n\n", true),
            Some(Event::Done(summary)) => match reply.take() {
                Some(reply) => {
                    let (rest, called, warnings) = reply.finish();
                    let deltas: String = rest.into_iter().map(|d| data(shape.delta_chunk(d))).collect();
                    let last = shape.with_choice(true, shape.choice(None, Some(Shape::finish_reason(&summary, called)), false));
                    (deltas + &data(shape.finish_chat(last, &summary, warnings)) + "data: [DONE]\n\n", true)
                }
                None => {
                    let last = shape.with_choice(true, shape.choice(None, Some(summary.finish.name()), false));
                    (data(shape.finish(last, &summary)) + "data: [DONE]\n\n", true)
                }
            },
        };
        Some((Ok(Bytes::from(frame)), (shape, events, None, done, reply)))
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(frames))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

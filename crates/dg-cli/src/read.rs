//! `dg read`: typed questions about a state answered from the command line, as `dg serve`'s
//! `POST /v1/systemone` answers them (OpenJev's typed reads: the same prompt, canvases and answer
//! shapes). Prints the response body (`{model, answers, usage}`) as JSON.

use std::io::Read as _;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};

use crate::args::ReadArgs;
use crate::error::input;
use crate::serve::systemone::{self, Json, ReaderHandle, Service};
use crate::settings::resolve_settings;
use crate::text::TextCodec;

pub fn run(args: ReadArgs) -> Result<()> {
    let dir = crate::model_dir::resolve(args.model.as_deref())?;
    let model = crate::model_dir::open(&dir)?;
    let name = dir.canonicalize().unwrap_or(dir.clone()).file_name().map_or("dg".into(), |n| n.to_string_lossy().into_owned());
    // Kept in the order written: the answers come in the order the questions were asked.
    let parse = |text: &str, what: &str| serde_json::from_str::<Json>(text).map_err(|e| input(format!("{what}: not JSON: {e}")));
    let body = match (&args.state, &args.questions) {
        (Some(state), Some(questions)) => {
            let text = read_input(state)?;
            let state = serde_json::from_str::<Json>(&text).unwrap_or(Json::String(text));
            let questions = parse(&read_input(questions)?, &questions.display().to_string())?;
            Json::Object(vec![("state".into(), state), ("questions".into(), questions)])
        }
        _ => parse(&read_input(Path::new("-"))?, "stdin")?,
    };
    let Json::Object(mut fields) = body else { return Err(input("the request body must be a JSON object")) };
    fields.push(("model".into(), Json::String(name.clone())));
    for (field, value) in [("steps", args.steps), ("samples", args.samples)] {
        if let Some(v) = value {
            fields.push((field.into(), Json::Number(v.into())));
        }
    }
    let body = Json::Object(fields).dumps(false, false);
    let req = systemone::parse(body.as_bytes()).map_err(|r| input(format!("bad request ({}): {}", r.status, r.body)))?;
    let codec = TextCodec::load(&model)?.ok_or_else(|| input(format!("{} has no tokenizer; dg read needs one", dir.display())))?;
    let template = crate::chat::ChatTemplate::load(&model)?;
    let settings = resolve_settings(&model, Default::default())?;
    // On the GPU a model of its own (one slot); on the CPU the reader's f32 copy. One request: a
    // queue of one.
    let reader = match crate::backend::choose(args.device.backend, args.device.adapter.as_deref())?.backend {
        crate::backend::Backend::Gpu(ctx) => {
            let context = model.config.text.max_position_embeddings.min(crate::settings::DEFAULT_CONTEXT_CAP);
            let gpu = crate::load::gpu(&model, *ctx, context, args.device.weights, crate::load::Report::Quiet)?;
            Some(ReaderHandle::spawn_gpu(gpu, 1)?)
        }
        crate::backend::Backend::Cpu => None,
    };
    let service = Service::start(&model, &name, Arc::new(codec), template, settings, (reader, 1))?
        .ok_or_else(|| input(format!("{} cannot answer typed reads (see above)", dir.display())))?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().context("cannot start the async runtime")?;
    let (response, _) =
        runtime.block_on(systemone::decide(&service, &req)).map_err(|r| input(format!("cannot answer ({}): {}", r.status, r.body)))?;
    println!("{}", response.dumps(false, false));
    Ok(())
}

/// A file's text, or stdin's for `-`.
fn read_input(path: &Path) -> Result<String> {
    if path == Path::new("-") {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text).context("cannot read stdin")?;
        return Ok(text);
    }
    std::fs::read_to_string(path).map_err(|e| input(format!("cannot read {}: {e}", path.display())))
}

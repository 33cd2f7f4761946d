//! The prompt: text from `--prompt`, `--prompt-file` or stdin (optionally wrapped in the chat
//! template), or ids from `--prompt-ids`; turned into ids and checked against the vocabulary.

use std::io::{IsTerminal, Read};
use std::path::Path;

use anyhow::{Context, Result};
use dg_model::ModelDir;

use crate::args::GenerateArgs;
use crate::chat;
use crate::error::{Input, input};
use crate::images::ImageSpec;
use crate::text::TextCodec;

/// The prompt as the model sees it.
#[derive(Debug)]
pub struct Prompt {
    pub ids: Vec<u32>,
    /// The text given to the tokenizer (after the chat template), when the prompt was text.
    pub text: Option<String>,
}

/// Reads and tokenizes the prompt of `args` for `model` (with `vocab_size` ids); with `images`
/// (`--image`: the model's image spec and each image's soft tokens), their placeholders are
/// placed ([`with_images`]).
pub fn build(
    args: &GenerateArgs,
    model: &ModelDir,
    codec: Option<&TextCodec>,
    vocab_size: usize,
    images: Option<(&ImageSpec, &[usize])>,
) -> Result<Prompt> {
    let prompt = match &args.prompt_ids {
        Some(list) => Prompt { ids: parse_ids(list)?, text: None },
        None => {
            let codec = require_codec(model, codec)?;
            let raw = read_text(args)?;
            return match images {
                Some((spec, soft_tokens)) => with_images(&raw, args.chat, model, codec, vocab_size, spec, soft_tokens),
                None => from_text(&raw, args.chat, model, codec, vocab_size),
            };
        }
    };
    if prompt.ids.is_empty() {
        return Err(input("the prompt is empty: generation needs at least one prompt token"));
    }
    check_range(&prompt.ids, vocab_size)?;
    Ok(prompt)
}

/// The tokenizer of `model`, or the error a text prompt gets without one.
pub fn require_codec<'a>(model: &ModelDir, codec: Option<&'a TextCodec>) -> Result<&'a TextCodec> {
    codec.ok_or_else(|| {
        let gguf = if model.checkpoint.gguf().is_some() { " and the GGUF file carries no tokenizer" } else { "" };
        input(format!(
            "{} has no tokenizer.json{gguf}, so a text prompt cannot be tokenized: pass the prompt \
             as token ids with --prompt-ids (e.g. --prompt-ids 2,17,42)",
            model.dir.display()
        ))
    })
}

/// A text prompt (of `--prompt`, a prompt file, stdin, or a line of `--prompts-file`) as the model
/// sees it: wrapped in the chat template of `model` with `chat`, tokenized, checked.
pub fn from_text(raw: &str, chat: bool, model: &ModelDir, codec: &TextCodec, vocab_size: usize) -> Result<Prompt> {
    let (text, ids) = render(raw, chat, model, codec, 0)?;
    checked(text, ids, vocab_size)
}

/// A text prompt with images, as transformers' processor makes it: with `chat`, a user turn of the
/// images' parts (`{"type": "image"}`, in order) followed by the text, rendered by the chat
/// template; without, the text must hold the image token once per image itself. Each image token
/// then becomes boi, the image's `soft_tokens` and eoi ([`ImageSpec::expand`]).
pub fn with_images(
    raw: &str,
    chat: bool,
    model: &ModelDir,
    codec: &TextCodec,
    vocab_size: usize,
    spec: &ImageSpec,
    soft_tokens: &[usize],
) -> Result<Prompt> {
    let (text, ids) = render(raw, chat, model, codec, soft_tokens.len())?;
    let ids = spec.expand(&ids, soft_tokens).map_err(|e| {
        let piece = codec.piece(spec.image_token());
        let hint =
            if chat { String::new() } else { format!(": give --chat to place them by the chat template, or write {piece} once per image") };
        input(format!("{e}{hint}"))
    })?;
    checked(text, ids, vocab_size)
}

/// The text given to the tokenizer and its ids: `raw` in the chat template (a user turn of `images`
/// image parts and the text) with `chat`, else as it is with the tokenizer's special tokens.
fn render(raw: &str, chat: bool, model: &ModelDir, codec: &TextCodec, images: usize) -> Result<(String, Vec<u32>)> {
    if raw.is_empty() {
        return Err(input("the prompt is empty"));
    }
    Ok(if chat {
        let text = chat::require(model)?.render_user_with_images(raw, images)?;
        let ids = codec.encode(&text, false)?;
        (text, ids)
    } else {
        (raw.to_string(), codec.encode(raw, true)?)
    })
}

fn checked(text: String, ids: Vec<u32>, vocab_size: usize) -> Result<Prompt> {
    if ids.is_empty() {
        return Err(input("the prompt is empty: generation needs at least one prompt token"));
    }
    check_range(&ids, vocab_size)?;
    Ok(Prompt { ids, text: Some(text) })
}

/// The prompt text of `--prompt`, `--prompt-file` (`-` for stdin) or stdin, without trailing newlines.
fn read_text(args: &GenerateArgs) -> Result<String> {
    let text = if let Some(p) = &args.prompt {
        p.clone()
    } else if let Some(path) = args.prompt_file.as_deref().filter(|p| *p != Path::new("-")) {
        std::fs::read_to_string(path).context(Input(format!("cannot read the prompt file {}", path.display())))?
    } else {
        let stdin = std::io::stdin();
        if args.prompt_file.is_none() && stdin.is_terminal() {
            return Err(input("no prompt: give --prompt TEXT, --prompt-file FILE, --prompt-ids IDS, or pipe the text on stdin"));
        }
        let mut text = String::new();
        stdin.lock().read_to_string(&mut text).context(Input("cannot read the prompt from stdin".into()))?;
        text
    };
    Ok(text.trim_end_matches(['\n', '\r']).to_string())
}

/// Ids separated by commas and/or whitespace, optionally in brackets: `2,17,42`, `[2, 17, 42]`.
pub fn parse_ids(list: &str) -> Result<Vec<u32>> {
    let inner = list.trim().trim_start_matches('[').trim_end_matches(']');
    inner
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<u32>().map_err(|_| input(format!("--prompt-ids: {s:?} is not a token id (a number from 0 to 4294967295)"))))
        .collect()
}

/// Every id must be below `vocab_size`.
fn check_range(ids: &[u32], vocab_size: usize) -> Result<()> {
    match ids.iter().enumerate().find(|&(_, &id)| id as usize >= vocab_size) {
        Some((i, id)) => Err(input(format!(
            "prompt token id {id} at position {i} is out of range: the model's vocabulary has {vocab_size} ids (0..{})",
            vocab_size - 1
        ))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_lists() {
        assert_eq!(parse_ids("2,17, 42").unwrap(), vec![2, 17, 42]);
        assert_eq!(parse_ids("[2 17\n42]").unwrap(), vec![2, 17, 42]);
        assert!(parse_ids("2,x").is_err());
        assert!(parse_ids("-1").is_err());
        assert!(check_range(&[1, 9], 10).is_ok());
        let e = check_range(&[1, 10], 10).unwrap_err().to_string();
        assert!(e.contains("token id 10 at position 1 is out of range"), "{e}");
    }
}

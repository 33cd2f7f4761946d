//! The model's tokenizer (`tokenizer.json`, read with the `tokenizers` crate, or the vocabulary a
//! GGUF file carries, built by [`crate::gguf_tokenizer`]): prompt text to ids, generated ids to
//! text, and one short printable piece per token for the live canvas view.

use std::path::Path;

use anyhow::{Context, Result};
use dg_model::ModelDir;
use tokenizers::Tokenizer;

use crate::error::Input;

/// A loaded tokenizer.
pub struct TextCodec {
    tokenizer: Tokenizer,
}

impl std::fmt::Debug for TextCodec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextCodec").field("vocab", &self.tokenizer.get_vocab_size(true)).finish()
    }
}

impl TextCodec {
    /// The model's tokenizer: `tokenizer.json` in its directory, else (a GGUF model) the vocabulary
    /// the file carries; `None` when there is neither.
    pub fn load(model: &ModelDir) -> Result<Option<Self>> {
        if let Some(codec) = Self::from_dir(&model.dir)? {
            return Ok(Some(codec));
        }
        let Some(file) = model.checkpoint.gguf() else { return Ok(None) };
        let shown = file.path().display();
        let Some(vocab) = file.vocab().context(Input(format!("cannot read the tokenizer of {shown}")))? else { return Ok(None) };
        let vocab_size = model.config.text.vocab_size;
        if vocab.tokens.len() > vocab_size {
            return Err(crate::error::input(format!(
                "{shown}: the tokenizer has {} tokens, more than the model's vocabulary of {vocab_size}",
                vocab.tokens.len()
            )));
        }
        let tokenizer = crate::gguf_tokenizer::build(&vocab).context(Input(format!("cannot build the tokenizer of {shown}")))?;
        Ok(Some(TextCodec { tokenizer }))
    }

    /// `dir/tokenizer.json`, or `None` when the directory has none.
    pub fn from_dir(dir: &Path) -> Result<Option<Self>> {
        let path = dir.join("tokenizer.json");
        if !path.is_file() {
            return Ok(None);
        }
        let tokenizer =
            Tokenizer::from_file(&path).map_err(anyhow::Error::from_boxed).context(Input(format!("cannot load {}", path.display())))?;
        Ok(Some(TextCodec { tokenizer }))
    }

    /// Token ids of `text`; `add_special_tokens` applies the tokenizer's post-processor (e.g. `<bos>`).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let enc = self
            .tokenizer
            .encode(text, add_special_tokens)
            .map_err(anyhow::Error::from_boxed)
            .context(Input("cannot tokenize the prompt".into()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Text of `ids`, special tokens left out.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.tokenizer.decode(ids, true).map_err(anyhow::Error::from_boxed).context("cannot decode the generated ids")
    }

    /// Text of `ids`, special tokens left out but those of `kept`, written as their text: a chat
    /// reply keeps the markup it is read by (`<|tool_call>`, `<|"|>`, ...), which the tokenizer marks
    /// special. The runs between kept tokens decode as [`Self::decode`] decodes them.
    pub fn decode_keeping(&self, ids: &[u32], kept: &[u32]) -> Result<String> {
        let mut text = String::new();
        for run in ids.split_inclusive(|id| kept.contains(id)) {
            let (last, head) = run.split_last().expect("split_inclusive gives non-empty runs");
            if kept.contains(last) {
                text.push_str(&self.decode(head)?);
                text.push_str(&self.tokenizer.id_to_token(*last).unwrap_or_default());
            } else {
                text.push_str(&self.decode(run)?);
            }
        }
        Ok(text)
    }

    /// The id of the token whose text is `token`, if the vocabulary has one.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.tokenizer.token_to_id(token)
    }

    /// One token as printable text: word-boundary markers become spaces and control characters
    /// visible symbols, so a piece never moves the cursor.
    pub fn piece(&self, id: u32) -> String {
        match self.tokenizer.id_to_token(id) {
            Some(tok) => printable(&tok.replace(['\u{2581}', '\u{120}'], " ").replace('\u{10a}', "\n")),
            None => format!("[{id}]"),
        }
    }
}

/// `s` with control characters replaced: newline by `↵`, tab by `→`, others by `·`.
pub fn printable(s: &str) -> String {
    s.chars()
        .map(|c| match c {
            '\n' => '↵',
            '\t' => '→',
            c if c.is_control() => '·',
            c => c,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GGUF model's tokenizer comes from the file, unless a `tokenizer.json` lies beside it.
    #[test]
    fn a_tokenizer_json_beside_a_gguf_wins() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let dir = tempfile::TempDir::new().unwrap();
        let gguf = dir.path().join("model.gguf");
        std::fs::copy(root.join("fixtures/converter-gemma4-vocab/model.gguf"), &gguf).unwrap();
        let from_file = TextCodec::load(&ModelDir::open(&gguf).unwrap()).unwrap().expect("the file carries a tokenizer");
        // "<|turn>" (5), then "hello" as the fixture's BPE spells it.
        let hello = from_file.encode("<|turn>hello", true).unwrap();
        assert_eq!(hello[..2], [2, 5]);
        std::fs::copy(root.join("models/tiny-random/tokenizer.json"), dir.path().join("tokenizer.json")).unwrap();
        let beside = TextCodec::load(&ModelDir::open(&gguf).unwrap()).unwrap().unwrap();
        let bundled = TextCodec::from_dir(&root.join("models/tiny-random")).unwrap().unwrap();
        assert_eq!(beside.encode("<|turn>hello", true).unwrap(), bundled.encode("<|turn>hello", true).unwrap());
        assert_ne!(beside.encode("<|turn>hello", true).unwrap(), hello);
    }

    /// A chat reply's markup survives decoding (in the HF tokenizer and the GGUF file's alike);
    /// the plain decode drops it with the other special tokens.
    #[test]
    fn decode_keeping_keeps_the_markup() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/converter-gemma4-vocab");
        let hf = TextCodec::from_dir(&root.join("hf")).unwrap().unwrap();
        let gguf = TextCodec::load(&ModelDir::open(&root.join("model.gguf")).unwrap()).unwrap().unwrap();
        let text = "<|channel>thought\nhm<channel|>ok <|tool_call>call:f{a:<|\"|>x y<|\"|>}<tool_call|>";
        for codec in [hf, gguf] {
            let kept: Vec<u32> = crate::chat::reply::MARKUP.iter().map(|t| codec.token_id(t).unwrap()).collect();
            let ids = codec.encode(&format!("<bos>{text}<turn|>"), false).unwrap();
            assert_eq!(codec.decode_keeping(&ids, &kept).unwrap(), text);
            assert_eq!(codec.decode(&ids).unwrap(), "thought\nhmok call:f{a:x y}");
        }
    }

    #[test]
    fn printable_hides_control_characters() {
        assert_eq!(printable("a\nb\tc\u{1b}[1m"), "a↵b→c·[1m");
    }
}

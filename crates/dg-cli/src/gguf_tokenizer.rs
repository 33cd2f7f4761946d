//! A GGUF file's vocabulary ([`dg_model::gguf::Vocab`]) as a `tokenizers::Tokenizer`, built from
//! the `tokenizers` crate's own parts so that it encodes and decodes as the HF `tokenizer.json` the
//! file was converted from.
//!
//! For `tokenizer.ggml.model = "gemma4"` these are the parts of transformers' `GemmaTokenizer`
//! (`models/gemma/tokenization_gemma.py`, the layout of Gemma 4's `tokenizer.json`): a BPE model
//! with byte fallback and `fuse_unk`, the normalizer `Replace(" ", "▁")`, the pre-tokenizer
//! `Split(" ", merged_with_previous)`, the decoder `Replace("▁", " ")`, `ByteFallback`, `Fuse`, and
//! a `<bos> $A` post-processor (`add_bos_token`; `$A <eos>` with `add_eos_token`). The control and
//! user-defined tokens (the HF special tokens; llama.cpp's converter marks a few of them
//! user-defined only so that llama.cpp renders them) are added tokens, matched whole, not
//! normalized, and left out when decoding skips special tokens.

use anyhow::{Context, Result, anyhow};
use dg_model::gguf::{GEMMA4, Vocab};
use tokenizers::decoders::DecoderWrapper;
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence;
use tokenizers::models::bpe::BPE;
use tokenizers::normalizers::replace::Replace;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, SplitDelimiterBehavior, Tokenizer};

/// SentencePiece's visible space.
const SPACE: &str = "\u{2581}";

/// The tokenizer `vocab` describes (only [`GEMMA4`] vocabularies are read into a [`Vocab`]).
pub fn build(vocab: &Vocab) -> Result<Tokenizer> {
    if vocab.model != GEMMA4 {
        return Err(anyhow!("tokenizer model {:?} is not supported (dg reads {GEMMA4:?})", vocab.model));
    }
    let ids = vocab.tokens.iter().enumerate().map(|(id, t)| (t.clone(), id as u32)).collect::<tokenizers::models::bpe::Vocab>();
    let mut bpe = BPE::builder().vocab_and_merges(ids, vocab.merges.clone()).byte_fallback(true).fuse_unk(true);
    if let Some(unk) = vocab.special.unk {
        bpe = bpe.unk_token(vocab.tokens[unk as usize].clone());
    }
    let bpe = bpe.build().map_err(|e| anyhow!("{e}")).context("the BPE model")?;
    let mut tokenizer = Tokenizer::new(bpe);
    tokenizer.with_normalizer(Some(Replace::new(" ", SPACE).map_err(anyhow::Error::from_boxed)?)).map_err(anyhow::Error::from_boxed)?;
    tokenizer.with_pre_tokenizer(Some(
        Split::new(SplitPattern::String(" ".into()), SplitDelimiterBehavior::MergedWithPrevious, false)
            .map_err(anyhow::Error::from_boxed)?,
    ));
    tokenizer.with_decoder(Some(Sequence::new(vec![
        DecoderWrapper::Replace(Replace::new(SPACE, " ").map_err(anyhow::Error::from_boxed)?),
        DecoderWrapper::ByteFallback(ByteFallback::new()),
        DecoderWrapper::Fuse(Fuse::new()),
    ])));
    let specials: Vec<AddedToken> = vocab
        .tokens
        .iter()
        .zip(&vocab.types)
        .filter(|(_, ty)| ty.is_special())
        .map(|(t, _)| AddedToken::from(t.clone(), true).normalized(false))
        .collect();
    tokenizer.add_special_tokens(specials).map_err(anyhow::Error::from_boxed)?;
    tokenizer.with_post_processor(Some(post_processor(vocab)?));
    Ok(tokenizer)
}

/// `<bos> $A` (and `$A <eos>` where the vocabulary adds it), as the HF post-processor.
fn post_processor(vocab: &Vocab) -> Result<TemplateProcessing> {
    let named = |id: Option<u32>, what: &str| {
        id.map(|id| (vocab.tokens[id as usize].clone(), id)).ok_or_else(|| anyhow!("the vocabulary adds {what} but names no {what} id"))
    };
    let mut specials = Vec::new();
    let (mut single, mut pair) = (vec!["$A".to_string()], vec!["$A".to_string(), "$B".to_string()]);
    if vocab.add_bos {
        let (bos, id) = named(vocab.special.bos, "<bos>")?;
        single.insert(0, bos.clone());
        pair.insert(0, bos.clone());
        specials.push((bos, id));
    }
    if vocab.add_eos {
        let (eos, id) = named(vocab.special.eos, "<eos>")?;
        single.push(eos.clone());
        pair.push(eos.clone());
        specials.push((eos, id));
    }
    TemplateProcessing::builder()
        .try_single(single.join(" "))
        .map_err(|e| anyhow!("{e}"))?
        .try_pair(pair.join(" "))
        .map_err(|e| anyhow!("{e}"))?
        .special_tokens(specials)
        .build()
        .map_err(|e| anyhow!("{e}"))
}

#[cfg(test)]
mod tests {
    //! The converter fixture's tokenizer against the HF one it was converted from, on the committed
    //! corpus and the ids, texts and chat prompts HF computes on it
    //! (`tools/oracle/make_tokenizer_corpus.py`).

    use std::path::{Path, PathBuf};

    use dg_model::gguf::GgufFile;
    use serde_json::Value;

    use super::*;

    /// Fewer lines would not cover the mix the corpus is drawn from.
    const MIN_LINES: usize = 2000;

    fn fixture() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/converter-gemma4-vocab")
    }

    fn jsonl(name: &str) -> Vec<Value> {
        let text = std::fs::read_to_string(fixture().join(name)).unwrap();
        text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    }

    fn from_gguf() -> (Vocab, Tokenizer) {
        let vocab = GgufFile::open(&fixture().join("model.gguf")).unwrap().vocab().unwrap().unwrap();
        let tokenizer = build(&vocab).unwrap();
        (vocab, tokenizer)
    }

    #[test]
    fn encodes_and_decodes_the_corpus_as_hf() {
        let (vocab, ours) = from_gguf();
        let corpus = jsonl("corpus.jsonl");
        let expected = jsonl("hf_tokens.jsonl");
        assert!(corpus.len() >= MIN_LINES && corpus.len() == expected.len(), "{} lines, {} expected", corpus.len(), expected.len());
        let all_text: String = corpus.iter().map(|t| t.as_str().unwrap()).collect();
        for (t, ty) in vocab.tokens.iter().zip(&vocab.types) {
            assert!(!ty.is_special() || all_text.contains(t.as_str()), "the corpus lacks the special token {t:?}");
        }
        let mut bad = Vec::new();
        for (line, (text, want)) in corpus.iter().zip(&expected).enumerate() {
            let text = text.as_str().unwrap();
            let ids: Vec<u32> = want["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
            let got = ours.encode(text, true).unwrap().get_ids().to_vec();
            let plain = ours.encode(text, false).unwrap().get_ids().to_vec();
            let decoded = ours.decode(&ids, true).unwrap();
            let decoded_all = ours.decode(&ids, false).unwrap();
            if got != ids || plain != ids[1..] || decoded != want["decoded"] || decoded_all != want["decoded_all"] {
                bad.push(format!(
                    "line {}: {text:?}\n  ids  {got:?}\n  hf   {ids:?}\n  decoded {decoded:?} vs {}",
                    line + 1,
                    want["decoded"]
                ));
            }
        }
        assert!(
            bad.is_empty(),
            "{} of {} lines differ from HF; the first:\n{}",
            bad.len(),
            corpus.len(),
            bad[..bad.len().min(5)].join("\n")
        );
    }

    #[test]
    fn an_unsupported_model_is_refused() {
        let (mut vocab, _) = from_gguf();
        vocab.model = "llama".into();
        let e = build(&vocab).unwrap_err().to_string();
        assert!(e.contains("\"llama\"") && e.contains("gemma4"), "{e}");
    }
}

//! Fuzzes the tokenizer metadata of a GGUF file: arbitrary bytes are parsed as a GGUF file
//! (`GgufFile::from_vec`), then its tokenizer is read (`GgufFile::vocab`). Errors are fine; panics
//! are not. A vocabulary that reads must be consistent: one type per token, scores for every token
//! or none, special ids in range, every merge's parts and their concatenation tokens of the
//! vocabulary, and its metadata must read back as the same vocabulary (scores, which may be NaN, by
//! their bits).

#![no_main]

use std::collections::HashSet;
use std::path::Path;

use dg_model::gguf::{GgufFile, GgufWriter};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(file) = GgufFile::from_vec(data.to_vec(), Path::new("fuzz.gguf")) else { return };
    let Ok(Some(vocab)) = file.vocab() else { return };
    let n = vocab.tokens.len();
    assert!(n > 0);
    assert_eq!(vocab.types.len(), n);
    assert!(vocab.scores.is_empty() || vocab.scores.len() == n);
    let s = &vocab.special;
    for id in [s.bos, s.eos, s.eot, s.unk, s.pad, s.mask].into_iter().flatten() {
        assert!((id as usize) < n);
    }
    let tokens: HashSet<&str> = vocab.tokens.iter().map(String::as_str).collect();
    assert_eq!(tokens.len(), n, "tokens are distinct");
    for (a, b) in &vocab.merges {
        assert!(tokens.contains(a.as_str()) && tokens.contains(b.as_str()) && tokens.contains(format!("{a}{b}").as_str()));
    }
    let dir = tempfile::TempDir::new().expect("a temp dir");
    let path = dir.path().join("vocab.gguf");
    GgufWriter::create(&path, &vocab.metadata(), &[]).expect("the metadata writes").finish().expect("the file closes");
    let mut back = GgufFile::open(&path).expect("dg's file opens").vocab().expect("dg's vocabulary reads").expect("a vocabulary");
    // Scores may be NaN (no score is compared by value): their bits round trip.
    let bits = |s: &[f32]| s.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&back.scores), bits(&vocab.scores));
    back.scores.clone_from(&vocab.scores);
    let mut vocab = vocab;
    vocab.scores.clear();
    back.scores.clear();
    assert_eq!(back, vocab);
});

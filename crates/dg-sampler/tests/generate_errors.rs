//! `generate` errors: wrong draw kinds, bad inputs, non-finite logits, model failures.

mod common;

use common::{C, FakeModel, FakeSpec, V, cfg, draws, spec};
use dg_model::GenerationConfig;
use dg_sampler::{DrawError, DrawKind, InputError, ModelCall, NoHooks, Replay, SamplerError, SeededRng, generate};

#[test]
fn wrong_draw_kind_is_reported_with_its_index() {
    let mut recorded = draws(1, 2, C, V, 7);
    recorded.swap(1, 2); // uniform where the categorical draw of step 0 should be
    let e = generate(&mut FakeModel::new(spec()), &[1], &cfg(1, 2), C, V, &mut Replay::new(recorded), &mut NoHooks).unwrap_err();
    assert!(matches!(
        e,
        SamplerError::Draw(DrawError::KindMismatch { index: 1, expected: DrawKind::Categorical, recorded: DrawKind::UniformTokens })
    ));
}

#[test]
fn input_errors_are_clear() {
    let mut rng = SeededRng::new(0);
    let mut run = |prompt: &[u32], cfg: &GenerationConfig, model: &mut FakeModel| {
        generate(model, prompt, cfg, C, V, &mut rng, &mut NoHooks).unwrap_err()
    };
    let e = run(&[], &cfg(1, 2), &mut FakeModel::new(spec()));
    assert!(matches!(e, SamplerError::Input(InputError::EmptyPrompt)));
    let e = run(&[1, 40], &cfg(1, 2), &mut FakeModel::new(spec()));
    assert!(matches!(e, SamplerError::Input(InputError::TokenOutOfRange { what: "prompt", position: 1, id: 40, .. })));
    let mut bad = cfg(1, 2);
    bad.pad_token_id = Some(99);
    assert!(run(&[1], &bad, &mut FakeModel::new(spec())).to_string().contains("pad token id 99"));
    bad = GenerationConfig { max_denoising_steps: 0, ..cfg(1, 2) };
    assert!(run(&[1], &bad, &mut FakeModel::new(spec())).to_string().contains("max_denoising_steps"));
    // A NaN in the second decoder call (block 0, step 1), row 4, column 17.
    let nan = FakeSpec { nan_at: Some((1, 4, 17)), ..spec() };
    let e = run(&[1], &cfg(1, 3), &mut FakeModel::new(nan));
    assert!(matches!(e, SamplerError::Input(InputError::NonFiniteLogit { block: 0, step: 1, row: 4, column: 17, .. })));
    assert!(e.to_string().contains("block 0, step 1, row 4, column 17"), "{e}");
    // Model failures carry the block and the call.
    let mut failing = FakeModel::new(spec());
    failing.fail_encode_at = Some(1);
    let e = run(&[1], &cfg(2, 2), &mut failing);
    assert!(matches!(e, SamplerError::Model { block: 1, call: ModelCall::Encode, .. }), "{e}");
    assert!(std::error::Error::source(&e).is_some());
    // Bad shapes.
    let e = generate(&mut FakeModel::new(spec()), &[1], &cfg(1, 1), 0, V, &mut SeededRng::new(0), &mut NoHooks);
    assert!(matches!(e, Err(SamplerError::Input(InputError::Shape(_)))));
}

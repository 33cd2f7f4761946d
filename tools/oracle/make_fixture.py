#!/usr/bin/env python3
"""Write a DiffusionGemma reference fixture (docs: reference-format.md) from a small random model.

Usage:
    python tools/oracle/make_fixture.py --list-presets
    python tools/oracle/make_fixture.py --preset sliding-long-prompt --out fixtures/sliding-long-prompt
    python tools/oracle/make_fixture.py --preset custom --seed 7 --search 20 --out my-fixture \\
        --overrides '{"text_config": {"num_hidden_layers": 5, "layer_types": "random"}}'

A checkpoint that exists already (an HF directory, and a GGUF file made from it by another tool):
    python tools/oracle/make_fixture.py --checkpoint fixtures/converter-gemma4-vocab/hf \\
        --gguf fixtures/converter-gemma4-vocab/model.gguf --out fixtures/converter-gemma4-vocab

Without ``--seed`` the preset's own seed is used, which reproduces the committed fixture. The same
preset, overrides and seed give the same bytes (single-threaded CPU run, same machine). ``--search N``
tries seeds ``seed .. seed+N-1`` and writes the first one whose fixture is robust to rounding (see
``robustness_problems``); it prints the seed it chose, so the fixture can be regenerated without the
search.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import transformers
from safetensors import safe_open
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))

import forward_paths as fp  # noqa: E402
import generation as gn  # noqa: E402
import model_builder as mb  # noqa: E402
import presets  # noqa: E402
import robustness  # noqa: E402

GENERATION_KEYS = (
    "max_new_tokens",
    "max_denoising_steps",
    "t_min",
    "t_max",
    "entropy_bound",
    "stability_threshold",
    "confidence_threshold",
    "eos_token_id",
    "pad_token_id",
)
FIXTURE_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "reference.safetensors",
    "reference.json",
)
MAX_FIXTURE_BYTES = 5 * 1024 * 1024

# Robustness requirements (see robustness_problems). An engine's f32 logits differ from the reference
# by rounding; the parity check allows 1e-5 normwise, so the reference's own rounding error (measured
# against a float64 rerun) must stay well below that, and the replayed generation must not hinge on
# decisions that such a difference could flip.
MAX_F64_NORMWISE = 3e-6
MIN_DECISION_MARGIN = 2e-4


class ExpectationError(AssertionError):
    """The generated run lacks a behaviour its preset asks for (early stop, EOS stop, several blocks)."""


@dataclass
class Oracle:
    """Everything computed for one fixture, before anything is written."""

    spec: dict[str, Any]
    seed: int
    model: torch.nn.Module
    description: str
    gen: dict[str, Any]
    ref: fp.ForwardReference
    record: gn.GenerateRecord
    replay: gn.ReplayResult
    checks: list[str]


def seeds(seed: int) -> dict[str, int]:
    """Independent seeds for the weights, the input ids and the recorded generate run."""
    return {"weights": seed, "inputs": seed + 1_000_003, "generate": seed + 2_000_003}


def make_inputs(spec: dict[str, Any], vocab: int, seed: int) -> dict[str, torch.Tensor]:
    """Prompt (starting with BOS=2), canvas, block2 and canvas2 ids, uniform in [0, V)."""
    generator = torch.Generator().manual_seed(seed)
    prompt_len, canvas_len = spec["prompt_length"], spec["canvas_length"]

    def draw(n: int) -> torch.Tensor:
        return torch.randint(0, vocab, (n,), generator=generator, dtype=torch.int64)

    prompt = draw(prompt_len)
    prompt[0] = 2
    return {
        "prompt_ids": prompt,
        "canvas_ids": draw(canvas_len),
        "block2_ids": draw(canvas_len),
        "canvas2_ids": draw(canvas_len),
    }


def choose_eos_ids(
    probe: torch.Tensor, prompt_len: int, canvas_len: int, vocab: int, pad: int | None, block: int, extra: int
) -> list[int]:
    """Pick EOS ids from a probe run without EOS so that the real run stops mid-canvas in ``block``.

    The first id is a token of that block whose first occurrence is closest to the middle of the canvas
    (not at either end) and that no earlier block contains; the ``extra`` further ids are the smallest
    ids absent from the probe output up to that block, so the list form is exercised.
    """
    new = probe[prompt_len:]
    if new.numel() < (block + 1) * canvas_len:
        raise ExpectationError(f"the probe run has no block {block}; raise max_new_tokens")
    earlier = set(new[: block * canvas_len].tolist())
    target = new[block * canvas_len : (block + 1) * canvas_len].tolist()
    first_seen: dict[int, int] = {}
    for pos, tok in enumerate(target):
        first_seen.setdefault(tok, pos)
    candidates = [
        (abs(pos - canvas_len / 2), tok, pos)
        for tok, pos in first_seen.items()
        if 1 <= pos <= canvas_len - 2 and tok not in earlier and tok != pad
    ]
    if not candidates:
        raise ExpectationError(f"no token of block {block} can serve as a mid-canvas EOS")
    _, primary, _ = min(candidates)
    used = earlier | set(target) | ({pad} if pad is not None else set())
    extras = [t for t in range(vocab) if t not in used][:extra]
    return [primary, *extras]


def resolve_generation(
    model: torch.nn.Module, spec: dict[str, Any], prompt: torch.Tensor, generate_seed: int
) -> dict[str, Any]:
    """The generation parameters, with ``eos_token_id == "auto"`` resolved by a probe run."""
    gen = {key: spec["generation"][key] for key in GENERATION_KEYS}
    if gen["eos_token_id"] != "auto":
        return gen
    probe = gn.run_generate(model, prompt, dict(gen, eos_token_id=None), generate_seed)
    auto = spec["eos_auto"]
    gen["eos_token_id"] = choose_eos_ids(
        probe.sequences,
        prompt.numel(),
        spec["canvas_length"],
        model.config.text_config.vocab_size,
        gen["pad_token_id"],
        auto["block"],
        auto["extra_ids"],
    )
    return gen


def describe_config(spec: dict[str, Any], model: torch.nn.Module) -> str:
    """One line summarising the model geometry, for reference.json and the log."""
    tc = model.config.text_config
    types = "".join("F" if t == presets.FULL else "S" for t in tc.layer_types)
    full = tc.per_layer_config[tc.layer_types.index(presets.FULL)]
    if presets.SLIDING in tc.layer_types:
        slide = tc.per_layer_config[tc.layer_types.index(presets.SLIDING)]
        sliding = f"S {slide.num_key_value_heads}kv x {slide.head_dim}"
    else:
        sliding = "no sliding layers"
    return (
        f"layers {tc.num_hidden_layers} [{types}], hidden {tc.hidden_size}, {tc.num_attention_heads} q heads, "
        f"{sliding}, F {full.num_key_value_heads}kv x {full.head_dim}, "
        f"experts {tc.num_experts} top-{tc.top_k_experts}, "
        f"V {tc.vocab_size}, C {spec['canvas_length']}, W {tc.sliding_window}, P {spec['prompt_length']}, "
        f"{spec['checkpoint_dtype']}"
    )


def check_expectations(spec: dict[str, Any], replay: gn.ReplayResult, gen: dict[str, Any]) -> None:
    """Raise ExpectationError when a preset's ``expect`` section is not met."""
    expect = spec.get("expect", {})
    canvas_len = spec["canvas_length"]
    blocks = replay.blocks
    if expect.get("multi_block") and len(blocks) < 2:
        raise ExpectationError(
            f"generation produced a single canvas (EOS at {blocks[0].eos_position}); block commit is not exercised"
        )
    if expect.get("early_stop") and not any(b.early_stop for b in blocks):
        raise ExpectationError("no block stopped early")
    if expect.get("eos_stop"):
        planned = math.ceil(gen["max_new_tokens"] / canvas_len)
        last = blocks[-1].eos_position
        if last is None or len(blocks) == planned or not 0 < last < canvas_len - 1:
            raise ExpectationError("generation did not stop on a mid-canvas EOS before max_new_tokens")


def run_oracle(spec: dict[str, Any], seed: int, prepare: Any = None, checkpoint: Path | None = None) -> Oracle:
    """Build the random model of ``spec`` and compute every reference tensor (nothing is written).

    ``prepare`` (e.g. ``gguf_fixture.GgufQuantizer``) may replace the weights before anything is computed.
    With ``checkpoint`` (an HF model directory) the model is that checkpoint instead of a random one;
    the seed then draws only the inputs and the generate run.
    """
    seed_of = seeds(seed)
    if checkpoint is None:
        config = mb.build_config(spec, seed_of["weights"])
        model = mb.construct_model(config)
        mb.randomize_weights(model, mb.InitScales.from_spec(spec["init"]), seed_of["weights"])
        if spec["checkpoint_dtype"] == "bfloat16":
            mb.round_to_bfloat16(model)
    else:
        model = mb.load_model(str(checkpoint))
        config = model.config
    if prepare is not None:
        prepare(model)
    description = f"{spec['description']} ({describe_config(spec, model)})"

    inputs = make_inputs(spec, config.text_config.vocab_size, seed_of["inputs"])
    prompt = inputs["prompt_ids"]
    gen = resolve_generation(model, spec, prompt, seed_of["generate"])
    record = gn.run_generate(model, prompt, gen, seed_of["generate"])
    replay = gn.replay_generate(model, prompt, gen, record.draws)
    gn.check_record(record, replay)
    checks = ["replay from draws reproduces generate"]
    checks += gn.check_against_generate(model, prompt, gen, record)
    check_expectations(spec, replay, gen)

    ref = fp.compute_forward_reference(
        model,
        prompt,
        inputs["canvas_ids"],
        inputs["block2_ids"],
        inputs["canvas2_ids"],
        gen["t_min"],
        gen["t_max"],
        gen["max_denoising_steps"],
    )
    return Oracle(spec, seed, model, description, gen, ref, record, replay, checks)


def checkpoint_spec(spec: dict[str, Any], checkpoint: Path, name: str, description: str) -> dict[str, Any]:
    """``spec`` with what an existing HF checkpoint fixes: its canvas length, dtype and sampler
    settings (its generation_config.json; the preset's values where a key is absent)."""
    config = json.loads((checkpoint / "config.json").read_text())
    saved = json.loads((checkpoint / "generation_config.json").read_text())
    sampler = saved.get("sampler_config") or {}
    gen = {key: saved.get(key, spec["generation"][key]) for key in GENERATION_KEYS if key != "entropy_bound"}
    gen["entropy_bound"] = sampler.get("entropy_bound", spec["generation"]["entropy_bound"])
    dtype = config.get("text_config", {}).get("dtype", config.get("dtype", "float32"))
    return dict(
        spec,
        name=name,
        description=description,
        canvas_length=config["canvas_length"],
        checkpoint_dtype=dtype,
        generation={key: gen[key] for key in GENERATION_KEYS},
    )


def save_checkpoint(oracle: Oracle, out: Path) -> None:
    """``save_pretrained`` config.json, generation_config.json and model.safetensors (F32 or BF16)."""
    spec = oracle.spec
    to_save = copy.deepcopy(oracle.model)
    mode = spec["generation_config_json"]
    if mode == "same":
        to_save.generation_config = gn.make_generation_config(oracle.gen)
    elif mode == "defaults":
        to_save.generation_config = gn.make_generation_config(presets.REAL_GENERATION_DEFAULTS)
    elif mode != "empty":
        raise ValueError(f"unknown generation_config_json mode {mode!r}")
    if spec["checkpoint_dtype"] == "bfloat16":
        to_save = to_save.to(torch.bfloat16)
        for sub_config in (to_save.config.text_config, to_save.config.vision_config):
            if sub_config is not None:  # .to() only updates the top-level dtype
                sub_config.dtype = torch.bfloat16
    elif spec["checkpoint_dtype"] != "float32":
        raise ValueError(f"unsupported checkpoint_dtype {spec['checkpoint_dtype']!r}")
    to_save.save_pretrained(out)


def write_reference(oracle: Oracle, out: Path) -> None:
    """Write reference.safetensors and reference.json."""
    ref, record, spec = oracle.ref, oracle.record, oracle.spec
    tensors = {
        "prompt_ids": ref.prompt_ids,
        "canvas_ids": ref.canvas_ids,
        "logits_plain": ref.logits_plain,
        "sc_logits": ref.sc_logits,
        "logits_sc": ref.logits_sc,
        "block2_ids": ref.block2_ids,
        "canvas2_ids": ref.canvas2_ids,
        "logits_block2": ref.logits_block2,
        "gen_sequences": record.sequences,
    }
    for i, draw in enumerate(record.draws):
        tensors[f"gen_draw_{i}"] = draw.ids
    tensors = {name: t.detach().contiguous().clone() for name, t in tensors.items()}
    for name, t in tensors.items():
        assert t.dtype in (torch.int64, torch.float32), f"{name} has dtype {t.dtype}"
    save_file(tensors, str(out / "reference.safetensors"))

    meta = {
        "config": f"{spec['name']}: {oracle.description}",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "checkpoint_dtype": spec["checkpoint_dtype"],
        "canvas_length": spec["canvas_length"],
        "block2_position_start": spec["prompt_length"],
        "generation": oracle.gen,
        "draws": [d.kind for d in record.draws],
    }
    (out / "reference.json").write_text(json.dumps(meta, indent=2) + "\n")


def verify_checkpoint(oracle: Oracle, out: Path) -> str:
    """Check the saved tensor names, and that reloading the directory reproduces the logits bit for bit."""
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        keys = list(f.keys())
        dtypes = sorted({str(f.get_slice(k).get_dtype()) for k in keys})
    assert not any(k.startswith("lm_head") for k in keys), "lm_head must not be saved"
    encoder_keys = [k for k in keys if k.startswith("model.encoder.language_model.")]
    assert all(k.endswith("layer_scalar") for k in encoder_keys), "only encoder layer scalars may be saved"
    n_layers = oracle.model.config.text_config.num_hidden_layers
    assert len(encoder_keys) == n_layers
    assert sum(k.startswith("model.decoder.layers.") and k.endswith("layer_scalar") for k in keys) == n_layers
    vision = [k for k in keys if not k.startswith(("model.decoder.", "model.encoder.language_model."))]
    assert all(k.startswith(("model.encoder.vision_tower.", "model.encoder.embed_vision.")) for k in vision)
    assert dtypes == (["BF16"] if oracle.spec["checkpoint_dtype"] == "bfloat16" else ["F32"]), dtypes

    assert_reproduces(mb.load_model(str(out)), oracle.ref)
    return f"saved {len(keys)} tensors ({', '.join(dtypes)}, {len(vision)} vision); reload reproduces logits_plain"


def assert_reproduces(model: torch.nn.Module, ref: fp.ForwardReference) -> None:
    """Assert that ``model`` computes ``logits_plain`` bit for bit."""
    cache = fp.new_cache(model)
    fp.encode(model, ref.prompt_ids, 0, cache)
    logits = fp.decode(model, ref.canvas_ids, ref.prompt_ids.numel(), cache)
    assert torch.equal(logits, ref.logits_plain), "reloading the saved checkpoint changes the logits"


def write_fixture(oracle: Oracle, out: Path, quantizer: Any = None) -> None:
    """Write the fixture directory (replacing its fixture files) and verify the checkpoint.

    With a ``gguf_fixture.GgufQuantizer`` the weights are its GGUF file instead of model.safetensors.
    """
    out.mkdir(parents=True, exist_ok=True)
    for name in (*FIXTURE_FILES, "model.gguf"):
        (out / name).unlink(missing_ok=True)
    save_checkpoint(oracle, out)
    write_reference(oracle, out)
    if quantizer is None:
        oracle.checks.append(verify_checkpoint(oracle, out))
    else:  # the safetensors file only carried config.json; the dequantized values need not be BF16
        oracle.checks.append(quantizer.finish_fixture(out, oracle.model, lambda m: assert_reproduces(m, oracle.ref)))


def _round(value: float) -> float | None:
    """Round a margin for display (None when no such decision was taken)."""
    return None if math.isinf(value) else float(f"{value:.3g}")


def mean_entropy(logits: torch.Tensor, temperature: float) -> float:
    """Mean per-row entropy (nats) of softmax(logits / T)."""
    return round(float(torch.distributions.Categorical(logits=logits / temperature).entropy().mean()), 4)


def diagnostics(oracle: Oracle) -> dict[str, Any]:
    """Generation statistics, decision margins and the rounding-robustness rerun of a fixture."""
    blocks, ref, gen = oracle.replay.blocks, oracle.ref, oracle.gen
    accepted = [n for b in blocks for n in b.accepted_per_step]
    return {
        "seed": oracle.seed,
        "generation": gen,
        "gen_length": oracle.replay.sequences.numel(),
        "steps_per_block": [b.steps for b in blocks],
        "accepted_min_mean_max": [min(accepted), round(sum(accepted) / len(accepted), 2), max(accepted)],
        "accepted_per_step": [b.accepted_per_step for b in blocks],
        "early_stop_per_block": [b.early_stop for b in blocks],
        "eos_position_per_block": [b.eos_position for b in blocks],
        "final_top2_gap_per_block": [_round(b.final_top2_gap) for b in blocks],
        "min_top2_gap_per_block": [_round(b.min_top2_gap) for b in blocks],
        "min_accept_margin_per_block": [_round(b.min_accept_margin) for b in blocks],
        "min_confidence_margin_per_block": [_round(b.min_confidence_margin) for b in blocks],
        "acceptance_boundary_ties": sum(b.boundary_ties for b in blocks),
        "logits_plain_std": round(float(ref.logits_plain.std()), 3),
        "sc_effect_normwise": float(f"{robustness.normwise_error(ref.logits_sc, ref.logits_plain):.3g}"),
        "mean_entropy_at_t_max_min": [
            mean_entropy(ref.logits_plain, gen["t_max"]),
            mean_entropy(ref.logits_plain, gen["t_min"]),
        ],
        "cache_len_after_prompt": fp.sliding_cache_lengths(oracle.model, ref.prompt_ids),
        "rounding_rerun": robustness.check_robustness(oracle.model, ref, gen, oracle.record),
        "checks": oracle.checks,
    }


def robustness_problems(diag: dict[str, Any]) -> list[str]:
    """Why an engine with a different (correct) rounding might fail this fixture; empty when none."""
    problems = []
    rerun = diag["rounding_rerun"]
    worst = max(rerun["normwise"].values())
    if worst > MAX_F64_NORMWISE:
        problems.append(f"logits move by {worst:.2e} normwise under another rounding")
    if rerun["argmax_flips"]:
        problems.append(f"{rerun['argmax_flips']} argmax rows flip under another rounding")
    for key in ("replay_f64", "replay_grouped_mm"):
        if rerun[key] != "same tokens":
            problems.append(f"{key}: {rerun[key]}")
    for key in ("final_top2_gap_per_block", "min_accept_margin_per_block", "min_confidence_margin_per_block"):
        small = [m for m in diag[key] if m is not None and m < MIN_DECISION_MARGIN]
        if small:
            problems.append(f"{key} below {MIN_DECISION_MARGIN}: {small}")
    if diag["acceptance_boundary_ties"]:
        problems.append("an entropy tie straddles an acceptance boundary")
    return problems


def print_diagnostics(name: str, description: str, diag: dict[str, Any], problems: list[str]) -> None:
    """Print the diagnostics, one key per line."""
    print(f"[{name}] {description}")
    for key, value in diag.items():
        print(f"  {key}: {json.dumps(value)}")
    for problem in problems:
        print(f"  WARNING: {problem}")


def search_seed(
    spec: dict[str, Any], first: int, count: int, prepare: Any = None, checkpoint: Path | None = None
) -> tuple[Oracle, dict[str, Any]]:
    """Return the oracle of the first seed in ``first .. first+count-1`` without robustness problems."""
    for seed in range(first, first + count):
        try:
            oracle = run_oracle(spec, seed, prepare, checkpoint)
        except ExpectationError as err:
            print(f"  seed {seed}: {err}")
            continue
        diag = diagnostics(oracle)
        problems = robustness_problems(diag)
        if not problems:
            print(f"  seed {seed}: ok")
            return oracle, diag
        print(f"  seed {seed}: {'; '.join(problems)}")
    raise SystemExit(f"no robust seed in {first}..{first + count - 1}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command line of the fixture maker."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="custom", help="preset name (see --list-presets)")
    parser.add_argument("--out", help="output directory (created; existing fixture files are replaced)")
    parser.add_argument("--seed", type=int, help="seed of weights, inputs and generate draws (default: the preset's)")
    parser.add_argument(
        "--search", type=int, default=0, metavar="N", help="try N seeds from --seed, keep the first robust one"
    )
    parser.add_argument(
        "--overrides",
        help="JSON object (inline, or the path of a JSON file) deep-merged into the preset, e.g. "
        '\'{"text_config": {"hidden_size": 64}, "generation": {"max_new_tokens": 48}}\'',
    )
    parser.add_argument(
        "--checkpoint",
        help="an existing HF model directory to run instead of a random model (its config.json and "
        "generation_config.json fix the canvas and the sampler); only the reference files are written",
    )
    parser.add_argument(
        "--gguf",
        help="with --checkpoint: a GGUF file made from it; the reference runs on gguf-py's values of its "
        "tensors (checked against the checkpoint's), and the file stays the fixture's weights",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 keeps runs reproducible)")
    parser.add_argument("--list-presets", action="store_true", help="print the presets and exit")
    parser.add_argument("--show-spec", action="store_true", help="print the resolved spec and exit")
    args = parser.parse_args(argv)
    if not (args.list_presets or args.show_spec) and not args.out:
        parser.error("--out is required")
    if args.gguf and not args.checkpoint:
        parser.error("--gguf needs --checkpoint")
    return args


def main(argv: list[str] | None = None) -> int:
    """Entry point: resolve the preset, run the oracle, write the fixture, print diagnostics."""
    args = parse_args(argv)
    if args.list_presets:
        for name in presets.preset_names():
            print(f"{name}: {presets.resolve_preset(name)['description']}")
        return 0
    spec = presets.resolve_preset(args.preset, presets.load_overrides(args.overrides))
    if args.show_spec:
        print(json.dumps(spec, indent=2))
        return 0
    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()

    seed = spec["seed"] if args.seed is None else args.seed
    checkpoint = Path(args.checkpoint) if args.checkpoint else None
    if checkpoint is not None:
        weights = f"the values of {args.gguf} (gguf-py)" if args.gguf else "its weights"
        spec = checkpoint_spec(spec, checkpoint, Path(args.out).name, f"HF checkpoint {args.checkpoint}, {weights}")
    quantizer = None
    if args.gguf:
        import gguf_fixture  # needs the gguf package

        quantizer = gguf_fixture.GgufValues(Path(args.gguf))
    elif spec["gguf_scheme"] is not None:
        import gguf_fixture  # needs the gguf package and a cargo toolchain

        defaults = gn.make_generation_config(spec["generation"])
        quantizer = gguf_fixture.GgufQuantizer(
            spec["gguf_scheme"], spec["checkpoint_dtype"] == "bfloat16", defaults, spec["gguf_tensors"]
        )
    if args.search:
        oracle, diag = search_seed(spec, seed, args.search, quantizer, checkpoint)
    else:
        oracle = run_oracle(spec, seed, quantizer, checkpoint)
        diag = diagnostics(oracle)
    out = Path(args.out)
    if checkpoint is None:
        write_fixture(oracle, out, quantizer)
    else:  # the checkpoint's own files are the fixture's model; only the oracle's outputs are new
        out.mkdir(parents=True, exist_ok=True)
        write_reference(oracle, out)
    diag["size_bytes"] = sum((out / name).stat().st_size for name in (*FIXTURE_FILES, "model.gguf") if (out / name).exists())
    problems = robustness_problems(diag)
    if diag["size_bytes"] > MAX_FIXTURE_BYTES:
        problems.append(f"fixture is {diag['size_bytes']} bytes (> {MAX_FIXTURE_BYTES})")
    print_diagnostics(spec["name"], oracle.description, diag, problems)
    return 0


if __name__ == "__main__":
    sys.exit(main())

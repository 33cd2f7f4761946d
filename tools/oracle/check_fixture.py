#!/usr/bin/env python3
"""Check that a directory follows the reference format, and optionally re-run it against its checkpoint.

Usage:
    python tools/oracle/check_fixture.py fixtures/*                 format only (no model run)
    python tools/oracle/check_fixture.py --recompute fixtures/early-stop-eos

A ``model.gguf`` with no config.json beside it (a converter's file, which carries its own metadata) is
checked against the HF directory it was made from, ``hf/`` beside it (``config_dir``).

The format check reads reference.json and reference.safetensors and checks names, dtypes, shapes and
the draw structure. ``--recompute`` loads the checkpoint with transformers (f32, eager; a ``model.gguf``
dequantized by gguf-py), recomputes the
three logits with the parity rule (normwise error <= 1e-5, argmax agreement where the top-2 gap exceeds
1e-3) and replays ``generate`` from the recorded draws, which must give ``gen_sequences`` exactly.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

import torch
import transformers
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parent))

import forward_paths as fp  # noqa: E402
import generation as gn  # noqa: E402
import model_builder as mb  # noqa: E402
import robustness  # noqa: E402

GENERATION_KEYS = {
    "max_new_tokens", "max_denoising_steps", "t_min", "t_max", "entropy_bound",
    "stability_threshold", "confidence_threshold", "eos_token_id", "pad_token_id",
}
NORMWISE_TOLERANCE = 1e-5
# Where a GGUF fixture with nothing beside it keeps the HF directory it was converted from.
SOURCE_DIR = "hf"


def config_dir(directory: Path) -> Path:
    """The directory of the fixture's config.json and generation_config.json: the fixture itself, or
    for a lone ``model.gguf`` the HF directory it was converted from (``SOURCE_DIR``)."""
    if not (directory / "config.json").is_file() and (directory / "model.gguf").is_file():
        return directory / SOURCE_DIR
    return directory


def check_format(directory: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """Assert the reference files of ``directory`` follow reference-format.md; return them."""
    configs = config_dir(directory)
    for path in (configs / "config.json", configs / "generation_config.json"):
        assert path.is_file(), f"missing {path}"
    for name in ("reference.json", "reference.safetensors"):
        assert (directory / name).is_file(), f"missing {name}"
    assert any((directory / n).is_file() for n in ("model.safetensors", "model.safetensors.index.json", "model.gguf"))
    meta = json.loads((directory / "reference.json").read_text())
    tensors = load_file(str(directory / "reference.safetensors"))
    config = json.loads((configs / "config.json").read_text())
    vocab = config["text_config"]["vocab_size"]

    canvas_len, prompt_len = meta["canvas_length"], meta["block2_position_start"]
    assert canvas_len == config["canvas_length"]
    assert meta["checkpoint_dtype"] in ("float32", "bfloat16")
    assert set(meta["generation"]) == GENERATION_KEYS, sorted(meta["generation"])
    shapes = {
        "prompt_ids": (torch.int64, [prompt_len]),
        "canvas_ids": (torch.int64, [canvas_len]),
        "block2_ids": (torch.int64, [canvas_len]),
        "canvas2_ids": (torch.int64, [canvas_len]),
        "logits_plain": (torch.float32, [canvas_len, vocab]),
        "sc_logits": (torch.float32, [canvas_len, vocab]),
        "logits_sc": (torch.float32, [canvas_len, vocab]),
        "logits_block2": (torch.float32, [canvas_len, vocab]),
    }
    for name, (dtype, shape) in shapes.items():
        got = (tensors[name].dtype, list(tensors[name].shape))
        assert got == (dtype, shape), f"{name}: {got}"

    sequences = tensors["gen_sequences"]
    assert sequences.dtype == torch.int64 and sequences.dim() == 1
    n_blocks, rest = divmod(sequences.numel() - prompt_len, canvas_len)
    assert rest == 0 and 1 <= n_blocks <= math.ceil(meta["generation"]["max_new_tokens"] / canvas_len)
    assert torch.equal(sequences[:prompt_len], tensors["prompt_ids"])

    draws = meta["draws"]
    names = {name for name in tensors if name.startswith("gen_draw_")}
    assert names == {f"gen_draw_{i}" for i in range(len(draws))}, "gen_draw_* do not match reference.json draws"
    for i in range(len(draws)):
        draw = tensors[f"gen_draw_{i}"]
        assert draw.dtype == torch.int64 and list(draw.shape) == [canvas_len]
        assert int(draw.min()) >= 0 and int(draw.max()) < vocab
    kinds = "".join({gn.UNIFORM: "U", gn.CATEGORICAL: "C"}[kind] for kind in draws)
    assert re.fullmatch(r"(U(?:CU)*)+", kinds), "draws must be, per block, U then (C U) per step"
    assert len(re.findall(r"U(?:CU)*", kinds)) == n_blocks, "number of draw blocks != generated canvases"
    return meta, tensors


def recompute(directory: Path, meta: dict, tensors: dict[str, torch.Tensor]) -> list[str]:
    """Re-run the forward paths and the replay on the checkpoint; return failure messages."""
    if (directory / "model.gguf").is_file():
        import gguf_fixture  # needs the gguf package

        model = gguf_fixture.load_model(directory, config_dir(directory))
    else:
        model = mb.load_model(str(directory))
    prompt = tensors["prompt_ids"]
    prompt_len, canvas_len = prompt.numel(), meta["canvas_length"]
    cache = fp.new_cache(model)
    fp.encode(model, prompt, 0, cache)
    ours = {
        "logits_plain": fp.decode(model, tensors["canvas_ids"], prompt_len, cache),
        "logits_sc": fp.decode(model, tensors["canvas_ids"], prompt_len, cache, tensors["sc_logits"]),
    }
    cache2 = fp.new_cache(model)
    fp.encode(model, prompt, 0, cache2)
    fp.encode(model, tensors["block2_ids"], prompt_len, cache2)
    ours["logits_block2"] = fp.decode(model, tensors["canvas2_ids"], prompt_len + canvas_len, cache2)

    failures = []
    for name, logits in ours.items():
        error = robustness.normwise_error(logits, tensors[name])
        flips = robustness.argmax_disagreements(logits, tensors[name])
        print(f"  {name}: normwise {error:.2e}, argmax flips {flips}")
        if error > NORMWISE_TOLERANCE or flips:
            failures.append(name)
    draws = [gn.Draw(kind, tensors[f"gen_draw_{i}"]) for i, kind in enumerate(meta["draws"])]
    try:
        replay = gn.replay_generate(model, prompt, meta["generation"], draws)
        same = torch.equal(replay.sequences, tensors["gen_sequences"])
    except gn.ReplayDiverged as err:
        print(f"  replay diverged: {err}")
        same = False
    print(f"  generate replay: {'same tokens' if same else 'DIFFERENT tokens'}")
    if not same:
        failures.append("generate")
    return failures


def main(argv: list[str] | None = None) -> int:
    """Check every directory given; exit 1 if any fails."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dirs", nargs="+", type=Path)
    parser.add_argument("--recompute", action="store_true", help="also re-run the checkpoint (needs transformers)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    status = 0
    for directory in args.dirs:
        print(f"{directory}")
        try:
            meta, tensors = check_format(directory)
            print(f"  format ok: {len(meta['draws'])} draws, {tensors['gen_sequences'].numel()} generated ids")
            failures = recompute(directory, meta, tensors) if args.recompute else []
        except AssertionError as err:
            failures = [f"format: {err}"]
        if failures:
            print(f"  FAILED: {', '.join(failures)}")
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())

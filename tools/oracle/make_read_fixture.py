#!/usr/bin/env python3
"""Reference reads of a seeded canvas (typed reads, vLLM's structured mode) from transformers.

A read is a forward of a seed canvas of width W after the prompt's cache, the answers taken from
the logits at the slot rows:

- a 1-step read is one call, ``model(input_ids=prompt, past_key_values=cache,
  decoder_input_ids=seed_canvas).logits`` (W = 16 and W = 64 here);
- a pinned read of S > 1 steps first runs S - 1 denoising steps on the free (unpinned) rows with
  transformers' own sampler pieces (``LinearTemperatureScheduleLogitsProcessor`` over S steps,
  ``torch.multinomial``, ``EntropyBoundSampler.accept_canvas`` / ``renoise_canvas`` over the free
  rows), the pinned rows keeping their seed ids and getting no self-conditioning (their soft
  embedding zeroed, as ``self_conditioning_mask`` zeroes an example's); the draws are recorded.

The model is an existing fixture's checkpoint (``--model``); the output is one JSON file of the
reference tensors (small: only the slot rows' logits).

Usage:
    python tools/oracle/make_read_fixture.py --model fixtures/tensor-core-shapes --out fixtures/reads/tensor-core-shapes.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import transformers
from transformers.models.diffusion_gemma.generation_diffusion_gemma import (
    EntropyBoundSampler,
    EntropyBoundSamplerConfig,
    LinearTemperatureScheduleLogitsProcessor,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))

import forward_paths as fp  # noqa: E402
import generation as gn  # noqa: E402
import model_builder as mb  # noqa: E402

SEED = 59
# The sampler settings of the multi-step reads (the fixture's generation_config.json is not used:
# these are the read's own).
T_MIN, T_MAX, ENTROPY_BOUND = 0.4, 0.8, 1.0


def one_step(model, prompt: torch.Tensor, canvas: torch.Tensor) -> torch.Tensor:
    """Raw logits [W, V] of a 1-step read: the issue's one call."""
    with torch.no_grad():
        out = model(input_ids=prompt.unsqueeze(0), past_key_values=fp.new_cache(model), decoder_input_ids=canvas.unsqueeze(0))
    return out.logits[0].float()


def zero_rows_hook(model, pinned: torch.Tensor):
    """Zeroes the self-conditioning soft embedding of the pinned rows (s = 0 there)."""

    def pre_hook(module, args):
        inputs_embeds, signal = args
        return inputs_embeds, signal * (~pinned).to(signal.dtype)[None, :, None]

    return model.model.decoder.self_conditioning.register_forward_pre_hook(pre_hook)


def pinned_read(model, prompt: torch.Tensor, canvas: torch.Tensor, pinned: torch.Tensor, steps: int):
    """(raw logits [W, V] of the last forward, the canvas it read, the recorded draws)."""
    cache = fp.new_cache(model)
    fp.encode(model, prompt, 0, cache)
    start = prompt.numel()
    free = (~pinned).nonzero().squeeze(-1)
    vocab = model.config.text_config.vocab_size
    processor = LinearTemperatureScheduleLogitsProcessor(T_MIN, T_MAX, steps)
    sampler = EntropyBoundSampler(EntropyBoundSamplerConfig(entropy_bound=ENTROPY_BOUND), free.numel(), vocab, steps)
    canvas = canvas.clone()
    sc = None
    hook = zero_rows_hook(model, pinned)
    try:
        with gn.record_draws() as draws:
            for step in range(steps - 1):
                remaining = steps - step
                raw = fp.decode(model, canvas, start, cache, sc)
                proc = processor(None, raw[free].unsqueeze(0), cur_step=remaining)
                probs = torch.softmax(proc, dim=-1, dtype=torch.float32)
                sampled = torch.multinomial(probs.view(-1, vocab), num_samples=1).view(1, -1)
                accepted = sampler.accept_canvas(canvas[free].unsqueeze(0), sampled, proc, remaining)
                canvas[free] = sampler.renoise_canvas(accepted, remaining)[0]
                sc = torch.zeros(canvas.numel(), vocab)
                sc[free] = proc[0]
            raw = fp.decode(model, canvas, start, cache, sc)
    finally:
        hook.remove()
    return raw.float(), canvas, [{"kind": d.kind, "ids": d.ids.tolist()} for d in draws]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    model = mb.load_model(str(args.model))
    vocab = model.config.text_config.vocab_size
    gen = torch.Generator().manual_seed(SEED)
    prompt = torch.randint(3, vocab, (23,), generator=gen)
    reads = []

    def slots_of(width: int, count: int):
        positions = sorted(torch.randperm(width, generator=gen)[:count].tolist())
        return [{"position": p, "labels": torch.randperm(vocab, generator=gen)[: 2 + i].tolist()} for i, p in enumerate(positions)]

    for width, steps in [(16, 1), (64, 1), (16, 2), (16, 4), (16, 8)]:
        canvas = torch.randint(0, vocab, (width,), generator=gen)
        slots = slots_of(width, 3)
        rows = [s["position"] for s in slots]
        if steps == 1:
            raw, read_canvas, draws, pinned = one_step(model, prompt, canvas), canvas, [], torch.zeros(width, dtype=torch.bool)
        else:
            pinned = torch.rand(width, generator=gen) < 0.5
            pinned[rows] = False
            torch.manual_seed(SEED + steps)
            raw, read_canvas, draws = pinned_read(model, prompt, canvas, pinned, steps)
        reads.append({
            "width": width,
            "steps": steps,
            "canvas": canvas.tolist(),
            "pinned": pinned.tolist(),
            "slots": slots,
            "draws": draws,
            "read_canvas": read_canvas.tolist(),
            "slot_logits": raw[rows].tolist(),
        })
        print(f"W={width} steps={steps}: {len(draws)} draws, argmax {raw[rows].argmax(-1).tolist()}")
    meta = {
        "model": args.model.name,
        "prompt": prompt.tolist(),
        "t_min": T_MIN,
        "t_max": T_MAX,
        "entropy_bound": ENTROPY_BOUND,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "reads": reads,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(meta) + "\n")
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

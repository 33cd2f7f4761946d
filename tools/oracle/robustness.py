"""How robust is a fixture to rounding? Re-run it with a differently rounded model.

An engine computes the same function in f32 with its own summation order, so its logits differ from
the reference by rounding, and its replayed generation takes the same decisions only where the
reference's decisions (argmax, entropy acceptance, stopping) are not knife-edge. This module runs the
fixture again on a float64 copy of the model (norms, softmaxes and the logits head still round to
f32 inside transformers, so this is a different rounding path rather than an exact one) and reports
how far the logits move; it then replays the recorded draws on that copy and on an f32 copy whose
experts use the grouped GEMM (another summation order) and says whether the tokens stay the same.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from transformers import DiffusionGemmaForBlockDiffusion

import forward_paths as fp
import generation as gn


def normwise_error(ours: torch.Tensor, ref: torch.Tensor) -> float:
    """||ours - ref||_2 / ||ref||_2 in float64."""
    ours, ref = ours.double(), ref.double()
    return float((ours - ref).norm() / ref.norm())


def argmax_disagreements(ours: torch.Tensor, ref: torch.Tensor, min_gap: float = 1e-3) -> int:
    """Rows whose argmax differs where the reference's top-2 gap exceeds ``min_gap`` (the parity rule)."""
    top2 = ref.topk(2, dim=-1).values
    decided = (top2[:, 0] - top2[:, 1]) > min_gap
    return int(((ours.argmax(-1) != ref.argmax(-1)) & decided).sum())


@torch.no_grad()
def check_robustness(
    model: DiffusionGemmaForBlockDiffusion,
    ref: fp.ForwardReference,
    gen: dict[str, Any],
    record: gn.GenerateRecord,
) -> dict[str, Any]:
    """Logit deviations and replay outcome of a float64 copy of ``model``."""
    wide = copy.deepcopy(model).to(torch.float64)
    prompt_len, canvas_len = ref.prompt_ids.numel(), ref.canvas_ids.numel()

    cache = fp.new_cache(wide)
    fp.encode(wide, ref.prompt_ids, 0, cache)
    plain = fp.decode(wide, ref.canvas_ids, prompt_len, cache)
    with_sc = fp.decode(wide, ref.canvas_ids, prompt_len, cache, ref.sc_logits)
    cache2 = fp.new_cache(wide)
    fp.encode(wide, ref.prompt_ids, 0, cache2)
    fp.encode(wide, ref.block2_ids, prompt_len, cache2)
    block2 = fp.decode(wide, ref.canvas2_ids, prompt_len + canvas_len, cache2)

    pairs = {"logits_plain": (plain, ref.logits_plain), "logits_sc": (with_sc, ref.logits_sc),
             "logits_block2": (block2, ref.logits_block2)}
    result: dict[str, Any] = {
        "normwise": {name: float(f"{normwise_error(a, b):.2e}") for name, (a, b) in pairs.items()},
        "argmax_flips": sum(argmax_disagreements(a, b) for a, b in pairs.values()),
    }
    regrouped = copy.deepcopy(model)
    regrouped.set_experts_implementation("grouped_mm")
    result["replay_f64"] = _replay_outcome(wide, ref, gen, record)
    result["replay_grouped_mm"] = _replay_outcome(regrouped, ref, gen, record)
    return result


def _replay_outcome(model: DiffusionGemmaForBlockDiffusion, ref: fp.ForwardReference, gen: dict[str, Any],
                    record: gn.GenerateRecord) -> str:
    """Replay the recorded draws on ``model`` and say whether the tokens match the recorded run."""
    try:
        replay = gn.replay_generate(model, ref.prompt_ids, gen, record.draws)
    except gn.ReplayDiverged as err:
        return f"diverged ({err})"
    return "same tokens" if torch.equal(replay.sequences, record.sequences) else "different tokens"

"""Run ``generate`` with every random draw recorded, and check that the draws suffice to replay it.

``generate`` draws its randomness with two calls of the torch module functions:
``torch.randint`` (a whole uniform canvas: the initial canvas of a block and the renoise candidates of
every step) and ``torch.multinomial`` (one categorical sample per canvas row). ``record_draws``
wraps both, calls the originals and keeps their outputs in call order.

``replay_generate`` then re-runs the sampler from the recorded draws with the forward paths of
``forward_paths`` (no random number generator involved) and must reproduce the sequences exactly;
this is what an engine does with the fixture, and it yields the per-step diagnostics.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch
from transformers import DiffusionGemmaForBlockDiffusion
from transformers.models.diffusion_gemma.generation_diffusion_gemma import (
    DiffusionGemmaGenerationConfig,
    EntropyBoundSamplerConfig,
)

import forward_paths as fp

UNIFORM = "uniform_tokens"
CATEGORICAL = "categorical"


def eos_list(eos_token_id: int | list[int] | None) -> list[int]:
    """EOS ids as a list (empty when there is none)."""
    if eos_token_id is None:
        return []
    return [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)


def make_generation_config(gen: dict[str, Any]) -> DiffusionGemmaGenerationConfig:
    """A DiffusionGemmaGenerationConfig holding exactly the parameters of a preset's ``generation``."""
    return DiffusionGemmaGenerationConfig(
        max_new_tokens=gen["max_new_tokens"],
        max_denoising_steps=gen["max_denoising_steps"],
        sampler_config=EntropyBoundSamplerConfig(entropy_bound=float(gen["entropy_bound"])),
        t_min=gen["t_min"],
        t_max=gen["t_max"],
        stability_threshold=gen["stability_threshold"],
        confidence_threshold=float(gen["confidence_threshold"]),
        eos_token_id=gen["eos_token_id"],
        pad_token_id=gen["pad_token_id"],
    )


@dataclass
class Draw:
    """One recorded random draw: its kind and its C ids."""

    kind: str
    ids: torch.Tensor


@contextlib.contextmanager
def record_draws() -> Iterator[list[Draw]]:
    """Wrap ``torch.randint`` / ``torch.multinomial`` and collect their outputs in call order."""
    draws: list[Draw] = []
    original_randint, original_multinomial = torch.randint, torch.multinomial

    def randint(*args, **kwargs):
        out = original_randint(*args, **kwargs)
        assert out.dim() == 2 and out.shape[0] == 1, f"unexpected randint shape {tuple(out.shape)}"
        draws.append(Draw(UNIFORM, out.reshape(-1).to(torch.int64).clone()))
        return out

    def multinomial(probs, num_samples, *args, **kwargs):
        out = original_multinomial(probs, num_samples, *args, **kwargs)
        assert num_samples == 1 and out.dim() == 2, f"unexpected multinomial shape {tuple(out.shape)}"
        draws.append(Draw(CATEGORICAL, out.reshape(-1).to(torch.int64).clone()))
        return out

    torch.randint, torch.multinomial = randint, multinomial
    try:
        yield draws
    finally:
        torch.randint, torch.multinomial = original_randint, original_multinomial


@dataclass
class DecoderCall:
    """Inputs and output of one decoder forward made by ``generate``."""

    canvas: torch.Tensor
    sc_logits: torch.Tensor | None
    start: int
    logits: torch.Tensor


@contextlib.contextmanager
def record_decoder_calls(model: DiffusionGemmaForBlockDiffusion) -> Iterator[list[DecoderCall]]:
    """Record every denoising forward that ``generate`` makes (it calls ``self.forward``)."""
    calls: list[DecoderCall] = []
    original_forward = model.forward

    def forward(*args, **kwargs):
        out = original_forward(*args, **kwargs)
        sc = kwargs.get("self_conditioning_logits")
        calls.append(
            DecoderCall(
                canvas=kwargs["decoder_input_ids"][0].clone(),
                sc_logits=None if sc is None else sc[0].clone(),
                start=int(kwargs["decoder_position_ids"][0, 0]),
                logits=out.logits[0].clone(),
            )
        )
        return out

    model.forward = forward
    try:
        yield calls
    finally:
        del model.forward


@dataclass
class GenerateRecord:
    """What one recorded ``generate`` run produced."""

    sequences: torch.Tensor
    draws: list[Draw]
    calls: list[DecoderCall]


@torch.no_grad()
def run_generate(
    model: DiffusionGemmaForBlockDiffusion,
    prompt_ids: torch.Tensor,
    gen: dict[str, Any],
    seed: int,
    **model_kwargs: Any,
) -> GenerateRecord:
    """Run ``model.generate`` on a seeded global RNG, recording draws and decoder calls.
    ``model_kwargs`` go to ``generate`` as given (an image prompt's ``pixel_values``,
    ``image_position_ids`` and ``mm_token_type_ids``)."""
    config = make_generation_config(gen)
    torch.manual_seed(seed)
    with record_draws() as draws, record_decoder_calls(model) as calls:
        output = model.generate(prompt_ids.unsqueeze(0), generation_config=config, **model_kwargs)
    return GenerateRecord(sequences=output.sequences[0].clone(), draws=draws, calls=calls)


@dataclass
class BlockStats:
    """Per-block diagnostics of a replayed generation.

    The gaps and margins say how close the reference's decisions were to flipping: top-2 gaps of the
    temperature-scaled logits (any step / the step whose argmax becomes the block's output), the
    acceptance margin (see ``_accept_mask``) and, on steps whose argmax was stable, the distance of
    the mean entropy to the confidence threshold.
    """

    accepted_per_step: list[int] = field(default_factory=list)
    early_stop: bool = False
    eos_position: int | None = None
    min_top2_gap: float = math.inf
    final_top2_gap: float = math.inf
    min_accept_margin: float = math.inf
    min_confidence_margin: float = math.inf
    boundary_ties: int = 0

    @property
    def steps(self) -> int:
        return len(self.accepted_per_step)


@dataclass
class ReplayResult:
    """Outcome of ``replay_generate``."""

    sequences: torch.Tensor
    kinds: list[str]
    blocks: list[BlockStats]
    canvases: list[torch.Tensor]


class ReplayDiverged(AssertionError):
    """The replay needed a different number or kind of draws than were recorded."""


def _accept_mask(entropy: torch.Tensor, bound: float) -> tuple[torch.Tensor, float, bool]:
    """EntropyBound acceptance, as the reference computes it.

    Returns the mask, the margin of the decision (the smallest of: the distance of the exclusive prefix
    sums on either side of the boundary to the bound, and the entropy gap between the last accepted and
    the first rejected position; i.e. how much rounding it takes to change the accepted set) and
    whether a tie of entropies straddles the boundary (then the accepted set depends on sort order).
    """
    sorted_entropy, order = torch.sort(entropy, dim=-1, descending=False)
    cumulative = torch.cumsum(sorted_entropy, dim=-1)
    exclusive = cumulative - sorted_entropy
    accepted_sorted = exclusive <= bound
    mask = torch.zeros_like(accepted_sorted).scatter(-1, order, accepted_sorted)
    k = int(accepted_sorted.sum())
    margin = bound - float(exclusive[k - 1]) if k > 1 else math.inf
    tie = False
    if k < entropy.numel():
        margin = min(margin, float(exclusive[k]) - bound, float(sorted_entropy[k] - sorted_entropy[k - 1]))
        tie = bool(sorted_entropy[k - 1] == sorted_entropy[k])
    return mask, margin, tie


def _finalize_block(new: torch.Tensor, eos: list[int], pad: int | None) -> tuple[torch.Tensor, int | None]:
    """EOS handling of a finished canvas: keep the first EOS, pad everything after it."""
    if not eos:
        return new, None
    is_eos = torch.isin(new, torch.tensor(eos))
    if not bool(is_eos.any()):
        return new, None
    first = int(torch.nonzero(is_eos)[0, 0])
    if pad is not None:
        new = new.clone()
        new[first + 1 :] = pad
    return new, first


@torch.no_grad()
def replay_generate(
    model: DiffusionGemmaForBlockDiffusion, prompt_ids: torch.Tensor, gen: dict[str, Any], draws: list[Draw]
) -> ReplayResult:
    """Re-run the block-diffusion sampler consuming ``draws`` instead of a random generator."""
    canvas_len = model.config.canvas_length
    steps = gen["max_denoising_steps"]
    eos = eos_list(gen["eos_token_id"])
    stability = gen["stability_threshold"]
    queue = list(draws)
    kinds: list[str] = []

    def take(kind: str) -> torch.Tensor:
        if not queue or queue[0].kind != kind:
            found = queue[0].kind if queue else "nothing"
            raise ReplayDiverged(f"draw {len(kinds)}: expected {kind}, found {found}")
        kinds.append(kind)
        return queue.pop(0).ids

    cache = fp.new_cache(model)
    fp.encode(model, prompt_ids, 0, cache)
    sequence, start = prompt_ids.clone(), prompt_ids.numel()
    blocks: list[BlockStats] = []
    canvases: list[torch.Tensor] = []
    for block in range(math.ceil(gen["max_new_tokens"] / canvas_len)):
        stats = BlockStats()
        canvas = take(UNIFORM)
        sc_logits = None
        history = [torch.full((canvas_len,), -1)] * stability
        argmax = canvas
        for remaining in range(steps, 0, -1):
            canvases.append(canvas)
            raw = fp.decode(model, canvas, start, cache, sc_logits)
            processed = fp.temperature_scaled(raw, gen["t_min"], gen["t_max"], steps, remaining)
            sampled, noise = take(CATEGORICAL), take(UNIFORM)
            argmax = processed.argmax(dim=-1)
            top2 = processed.topk(2, dim=-1).values
            stats.final_top2_gap = float((top2[:, 0] - top2[:, 1]).min())
            stats.min_top2_gap = min(stats.min_top2_gap, stats.final_top2_gap)
            entropy = torch.distributions.Categorical(logits=processed).entropy()
            mask, margin, tie = _accept_mask(entropy, gen["entropy_bound"])
            stats.min_accept_margin = min(stats.min_accept_margin, margin)
            stats.boundary_ties += int(tie)
            stats.accepted_per_step.append(int(mask.sum()))
            canvas = torch.where(mask, sampled, noise)
            stable = all(bool(torch.equal(h, argmax)) for h in history)
            history = history[1:] + [argmax] if stability else history
            confident = bool(entropy.mean() < gen["confidence_threshold"])  # an f32 comparison, as in the reference
            if stable:
                margin = abs(float(entropy.mean()) - gen["confidence_threshold"])
                stats.min_confidence_margin = min(stats.min_confidence_margin, margin)
            sc_logits = processed
            if stable and confident:
                stats.early_stop = remaining > 1
                break
        new, stats.eos_position = _finalize_block(argmax, eos, gen["pad_token_id"])
        sequence = torch.cat([sequence, new])
        blocks.append(stats)
        if stats.eos_position is not None:
            break
        fp.encode(model, new, start, cache)
        start += canvas_len
    if queue:
        raise ReplayDiverged(f"{len(queue)} draws left unconsumed")
    return ReplayResult(sequences=sequence, kinds=kinds, blocks=blocks, canvases=canvases)


def expected_kinds(blocks: list[BlockStats]) -> list[str]:
    """The draw kinds implied by the block structure: 1 uniform, then (categorical, uniform) per step."""
    kinds: list[str] = []
    for stats in blocks:
        kinds.append(UNIFORM)
        kinds.extend([CATEGORICAL, UNIFORM] * stats.steps)
    return kinds


def check_record(record: GenerateRecord, replay: ReplayResult) -> None:
    """Assert the replay reproduced ``generate``: same tokens, same draw structure, same canvases."""
    assert torch.equal(replay.sequences, record.sequences), (
        f"replay differs from generate:\n{replay.sequences.tolist()}\n{record.sequences.tolist()}"
    )
    kinds = [d.kind for d in record.draws]
    assert kinds == replay.kinds == expected_kinds(replay.blocks), "draw kinds do not follow the block structure"
    assert len(record.calls) == len(replay.canvases) == sum(b.steps for b in replay.blocks)
    for call, canvas in zip(record.calls, replay.canvases):
        assert torch.equal(call.canvas, canvas), "a replayed canvas differs from the one generate decoded"


def _assert_same(name: str, ours: torch.Tensor, theirs: torch.Tensor) -> None:
    """Bitwise equality, with a readable message when it fails."""
    if not torch.equal(ours, theirs):
        diff = (ours - theirs).abs().max().item()
        raise AssertionError(f"{name}: manual path differs from generate (max |diff| {diff:.3e})")


@torch.no_grad()
def check_against_generate(
    model: DiffusionGemmaForBlockDiffusion, prompt_ids: torch.Tensor, gen: dict[str, Any], record: GenerateRecord
) -> list[str]:
    """Check that the manual encode/decode paths give generate's logits bit for bit.

    Covers the first step of block 0 (plain), its second step (self-conditioning on the
    temperature-scaled logits), and the first step of block 1 (prompt + committed block in the cache).
    Returns the names of the checks that ran.
    """
    prompt_len = prompt_ids.numel()
    canvas_len = model.config.canvas_length
    steps = gen["max_denoising_steps"]
    done: list[str] = []

    cache = fp.new_cache(model)
    fp.encode(model, prompt_ids, 0, cache)
    first = record.calls[0]
    assert first.sc_logits is None and first.start == prompt_len
    _assert_same("block 0 step 0", fp.decode(model, first.canvas, prompt_len, cache), first.logits)
    done.append("block0/step0 plain")

    if len(record.calls) > 1 and record.calls[1].start == prompt_len:
        second = record.calls[1]
        expected_sc = fp.temperature_scaled(first.logits, gen["t_min"], gen["t_max"], steps, remaining=steps)
        _assert_same("self-conditioning input", expected_sc, second.sc_logits)
        logits = fp.decode(model, second.canvas, prompt_len, cache, second.sc_logits)
        _assert_same("block 0 step 1", logits, second.logits)
        done.append("block0/step1 self-conditioned")

    block1 = next((c for c in record.calls if c.start == prompt_len + canvas_len), None)
    if block1 is not None:
        assert block1.sc_logits is None
        cache2 = fp.new_cache(model)
        fp.encode(model, prompt_ids, 0, cache2)
        fp.encode(model, record.sequences[prompt_len : prompt_len + canvas_len], prompt_len, cache2)
        _assert_same("block 1 step 0", fp.decode(model, block1.canvas, block1.start, cache2), block1.logits)
        done.append("block1/step0 after commit")
    return done

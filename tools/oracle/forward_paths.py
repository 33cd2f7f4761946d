"""The single-forward oracle paths: encode into a KV cache, then decode one canvas.

These calls reproduce what ``generate`` does internally (checked by ``check_against_generate``):
- the encoder appends K/V to a ``DynamicCache(config=text_config)``; sliding layers keep the last W-1
  tokens, full layers keep everything;
- the decoder reads that cache without writing it, bidirectionally over [cache | canvas];
- logits are softcapped f32; the self-conditioning input is the temperature-scaled logits of the
  previous step.
All tensors here are unbatched (1-D ids, [C, V] logits); batch dimension 1 is added internally.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DiffusionGemmaForBlockDiffusion
from transformers.cache_utils import DynamicCache
from transformers.models.diffusion_gemma.generation_diffusion_gemma import (
    LinearTemperatureScheduleLogitsProcessor,
)


def new_cache(model: DiffusionGemmaForBlockDiffusion) -> DynamicCache:
    """An empty cache of the kind ``generate`` uses by default."""
    return DynamicCache(config=model.config.get_text_config(decoder=True))


def positions(start: int, length: int) -> torch.Tensor:
    """Position ids ``start..start+length`` as ``generate`` builds them ([1, length], int32)."""
    return torch.arange(start, start + length, dtype=torch.int32).unsqueeze(0)


@torch.no_grad()
def encode(model: DiffusionGemmaForBlockDiffusion, ids: torch.Tensor, start: int, cache: DynamicCache) -> None:
    """Run the encoder on ``ids`` at positions ``start..``, appending their K/V to ``cache``."""
    model.model.encoder(input_ids=ids.unsqueeze(0), position_ids=positions(start, ids.numel()), past_key_values=cache)


@torch.no_grad()
def decode(
    model: DiffusionGemmaForBlockDiffusion,
    canvas: torch.Tensor,
    start: int,
    cache: DynamicCache,
    sc_logits: torch.Tensor | None = None,
) -> torch.Tensor:
    """Softcapped f32 logits [C, V] of one denoising forward of ``canvas`` at positions ``start..``."""
    output = model(
        decoder_input_ids=canvas.unsqueeze(0),
        past_key_values=cache,
        self_conditioning_logits=None if sc_logits is None else sc_logits.unsqueeze(0),
        decoder_position_ids=positions(start, canvas.numel()),
    )
    return output.logits[0]


def temperature_scaled(
    logits: torch.Tensor, t_min: float, t_max: float, max_steps: int, remaining: int
) -> torch.Tensor:
    """The logits as ``generate`` feeds them back (``raw / T`` at ``remaining`` steps left), [C, V]."""
    processor = LinearTemperatureScheduleLogitsProcessor(t_min=t_min, t_max=t_max, max_denoising_steps=max_steps)
    step = torch.tensor(remaining, dtype=torch.int32)
    return processor(None, logits.unsqueeze(0), cur_step=step)[0]


@dataclass
class ForwardReference:
    """The single-forward tensors of reference.safetensors."""

    prompt_ids: torch.Tensor
    canvas_ids: torch.Tensor
    logits_plain: torch.Tensor
    sc_logits: torch.Tensor
    logits_sc: torch.Tensor
    block2_ids: torch.Tensor
    canvas2_ids: torch.Tensor
    logits_block2: torch.Tensor


def compute_forward_reference(
    model: DiffusionGemmaForBlockDiffusion,
    prompt_ids: torch.Tensor,
    canvas_ids: torch.Tensor,
    block2_ids: torch.Tensor,
    canvas2_ids: torch.Tensor,
    t_min: float,
    t_max: float,
    max_steps: int,
) -> ForwardReference:
    """Compute logits_plain / sc_logits / logits_sc (one cache) and logits_block2 (a second cache).

    ``sc_logits`` are ``logits_plain`` scaled by the first step's temperature (t_max), exactly what the
    second denoising step of a block receives.
    """
    prompt_len = prompt_ids.numel()
    canvas_len = canvas_ids.numel()

    cache = new_cache(model)
    encode(model, prompt_ids, 0, cache)
    logits_plain = decode(model, canvas_ids, prompt_len, cache)
    sc_logits = temperature_scaled(logits_plain, t_min, t_max, max_steps, remaining=max_steps)
    logits_sc = decode(model, canvas_ids, prompt_len, cache, sc_logits)

    cache2 = new_cache(model)
    encode(model, prompt_ids, 0, cache2)
    encode(model, block2_ids, prompt_len, cache2)
    logits_block2 = decode(model, canvas2_ids, prompt_len + canvas_len, cache2)

    return ForwardReference(
        prompt_ids=prompt_ids,
        canvas_ids=canvas_ids,
        logits_plain=logits_plain,
        sc_logits=sc_logits,
        logits_sc=logits_sc,
        block2_ids=block2_ids,
        canvas2_ids=canvas2_ids,
        logits_block2=logits_block2,
    )


def sliding_cache_lengths(model: DiffusionGemmaForBlockDiffusion, prompt_ids: torch.Tensor) -> dict[str, int]:
    """Cached lengths per layer type after encoding the prompt (sliding layers should hold W-1)."""
    cache = new_cache(model)
    encode(model, prompt_ids, 0, cache)
    layer_types = model.config.text_config.layer_types
    return {kind: cache.layers[layer_types.index(kind)].keys.shape[-2] for kind in sorted(set(layer_types))}

"""Build a small random DiffusionGemmaForBlockDiffusion for the oracle.

The model is float32, eager attention and eager experts, on CPU. Every weight and buffer that the
engine reads gets a seeded random value that is clearly not the identity (random norm weights, distinct
encoder and decoder layer scalars, router scales not 1), so that a loader that swaps, ignores or
mis-names a tensor produces visibly different logits. Two scales (``attn_score_std``, ``sc_gain``) are
tamed so that rounding differences between correct implementations stay small; see ``InitScales``.
"""

from __future__ import annotations

import contextlib
import random
from dataclasses import dataclass, fields
from typing import Any, Iterator

import torch
from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion
from transformers.models.diffusion_gemma import modeling_diffusion_gemma

from presets import FULL, SLIDING


@dataclass
class InitScales:
    """Scales of the random initialisation (the ``init`` section of a preset).

    embed_std: std of the token embedding (also the tied lm_head).
    linear_gain: linear weights are N(0, (linear_gain / sqrt(fan_in))^2).
    norm_spread: RMSNorm weights are uniform in [1 - spread, 1 + spread].
    logit_scale: extra factor on the final norm weight; it sets how peaked the logits are.
    router_std: std of the router projection (its input has RMS about 1/sqrt(hidden)).
    scale_spread: router.scale and router.per_expert_scale are uniform in [1 - spread, 1 + spread].
    scalar_low, scalar_high: range of the encoder and decoder layer_scalar buffers.
    attn_score_std: None keeps q_norm/k_norm weights around 1, so attention scores (scaling 1.0) have a
        std of about sqrt(head_dim). A number rescales both weights by
        sqrt(attn_score_std / sqrt(head_dim)) so the scores have about that std: sharp attention (e.g.
        over head_dim 512) amplifies rounding differences between implementations beyond the parity
        tolerance.
    sc_gain: extra factor on self_conditioning.down_proj, i.e. on the strength of the self-conditioning
        signal; the step-to-step feedback through it decides how fast rounding differences grow over the
        denoising steps of a replayed generation.
    ffn_gain: extra factor on the decoder layers' gate/up projections (the dense MLP's ``gate_proj``
        and ``up_proj``, the experts' ``gate_up_proj``): gelu(gate)·up then grows with its square, and
        the post-feedforward norms take the scale back out, so the rest of the model is as with 1. A
        gain of ~200 puts the down projections' inputs past 65504, f16's largest value.
    """

    embed_std: float = 1.0
    linear_gain: float = 1.0
    norm_spread: float = 0.5
    logit_scale: float = 1.0
    router_std: float = 1.5
    scale_spread: float = 0.5
    scalar_low: float = 0.5
    scalar_high: float = 1.5
    attn_score_std: float | None = 2.0
    sc_gain: float = 0.3
    ffn_gain: float = 1.0

    @classmethod
    def from_spec(cls, init: dict[str, Any]) -> "InitScales":
        """Build from a preset's ``init`` dict, rejecting unknown keys."""
        known = {f.name for f in fields(cls)}
        unknown = set(init) - known
        if unknown:
            raise ValueError(f"unknown init keys {sorted(unknown)}; known: {sorted(known)}")
        return cls(**init)


@contextlib.contextmanager
def _text_only_construction() -> Iterator[None]:
    """Allow ``vision_config=None``.

    The configuration documents ``vision_config=None`` as "no vision tower", but the encoder module
    calls ``AutoModel.from_config(None)``. While this context is active the vision tower and the
    vision embedder are simply left out (``None``); nothing on the text path uses them.
    """
    original_auto = modeling_diffusion_gemma.AutoModel
    original_embedder = modeling_diffusion_gemma.DiffusionGemmaMultimodalEmbedder

    class _AutoModelOrNone:
        @staticmethod
        def from_config(config, *args, **kwargs):
            return None if config is None else original_auto.from_config(config, *args, **kwargs)

    def _embedder_or_none(vision_config, text_config):
        return None if vision_config is None else original_embedder(vision_config, text_config)

    modeling_diffusion_gemma.AutoModel = _AutoModelOrNone
    modeling_diffusion_gemma.DiffusionGemmaMultimodalEmbedder = _embedder_or_none
    try:
        yield
    finally:
        modeling_diffusion_gemma.AutoModel = original_auto
        modeling_diffusion_gemma.DiffusionGemmaMultimodalEmbedder = original_embedder


def resolve_layer_types(text_kwargs: dict[str, Any], seed: int) -> dict[str, Any]:
    """Replace ``layer_types == "random"`` by a seeded random pattern (last layer full attention).

    ``None`` is dropped from the kwargs so that the configuration applies its own default pattern.
    """
    kwargs = dict(text_kwargs)
    layer_types = kwargs.get("layer_types")
    if layer_types is None:
        kwargs.pop("layer_types", None)
    elif layer_types == "random":
        rng = random.Random(seed)
        n = kwargs["num_hidden_layers"]
        kwargs["layer_types"] = [rng.choice([SLIDING, FULL]) for _ in range(n - 1)] + [FULL]
    return kwargs


def build_config(spec: dict[str, Any], seed: int) -> DiffusionGemmaConfig:
    """Create the DiffusionGemmaConfig of a preset spec."""
    text_kwargs = resolve_layer_types(spec["text_config"], seed)
    vision = spec.get("vision_config")
    if vision is not None:
        vision = {"model_type": "gemma4_vision", **vision}
    return DiffusionGemmaConfig(
        text_config=text_kwargs,
        vision_config=vision,
        canvas_length=spec["canvas_length"],
    )


def construct_model(config: DiffusionGemmaConfig) -> DiffusionGemmaForBlockDiffusion:
    """Instantiate the model in float32, on CPU, in eval mode.

    Attention and experts both use the plain ("eager") implementations: the expert loop runs in
    ascending expert order and does not depend on the thread count, unlike the grouped GEMM path.
    """
    with _text_only_construction():
        model = DiffusionGemmaForBlockDiffusion._from_config(
            config, attn_implementation="eager", experts_implementation="eager", dtype=torch.float32
        )
    return model.eval()


def load_model(directory: str) -> DiffusionGemmaForBlockDiffusion:
    """Load a saved fixture checkpoint as float32 (BF16 is upcast), eager attention and experts.

    The loaded tensors are copied into freshly allocated memory: CPU matmul kernels may round
    differently on the unaligned views of a memory-mapped file, and the reload check compares bits.
    """
    with _text_only_construction():
        model = DiffusionGemmaForBlockDiffusion.from_pretrained(
            directory, attn_implementation="eager", experts_implementation="eager", dtype=torch.float32
        )
    with torch.no_grad():
        for tensor in list(model.parameters()) + list(model.buffers()):
            tensor.data = tensor.data.clone()
    return model.eval()


def _uniform(generator: torch.Generator, shape: torch.Size, low: float, high: float) -> torch.Tensor:
    return low + (high - low) * torch.rand(shape, generator=generator)


def _normal(generator: torch.Generator, shape: torch.Size, std: float) -> torch.Tensor:
    return std * torch.randn(shape, generator=generator)


def _init_value(name: str, shape: torch.Size, scales: InitScales, generator: torch.Generator) -> torch.Tensor:
    """Random value of one parameter, chosen by its (decoder-side) name."""
    leaf = name.rsplit(".", 1)[-1]
    if name.endswith("embed_tokens.weight"):
        return _normal(generator, shape, scales.embed_std)
    if name.endswith("router.proj.weight"):
        return _normal(generator, shape, scales.router_std)
    if name.endswith("router.scale") or name.endswith("router.per_expert_scale"):
        return _uniform(generator, shape, 1 - scales.scale_spread, 1 + scales.scale_spread)
    if leaf in ("gate_up_proj", "down_proj") and len(shape) == 3:
        fan_in = shape[-1]  # experts: [E, out, in]
        gain = scales.linear_gain * (scales.ffn_gain if leaf == "gate_up_proj" else 1.0)
        return _normal(generator, shape, gain / fan_in**0.5)
    if len(shape) == 1:  # every remaining 1-D parameter is an RMSNorm weight
        weight = _uniform(generator, shape, 1 - scales.norm_spread, 1 + scales.norm_spread)
        if name in ("model.decoder.norm.weight", "model.encoder.language_model.norm.weight"):
            weight = weight * scales.logit_scale
        if leaf == "weight" and name.rsplit(".", 2)[-2] in ("q_norm", "k_norm") and scales.attn_score_std:
            weight = weight * (scales.attn_score_std / shape[0] ** 0.5) ** 0.5
        return weight
    if len(shape) == 2:  # nn.Linear [out, in]
        gain = scales.linear_gain * (scales.sc_gain if name.endswith("self_conditioning.down_proj.weight") else 1.0)
        if ".layers." in name and name.endswith(("mlp.gate_proj.weight", "mlp.up_proj.weight")):
            gain *= scales.ffn_gain
        return _normal(generator, shape, gain / shape[1] ** 0.5)
    return _normal(generator, shape, 0.1)


def randomize_weights(model: DiffusionGemmaForBlockDiffusion, scales: InitScales, seed: int) -> None:
    """Overwrite every parameter and the layer_scalar buffers with seeded random values.

    Tied parameters (encoder text weights, lm_head) are the same tensors as the decoder's, so they are
    visited once. Encoder and decoder layer scalars are separate buffers and get independent values.
    """
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():  # deduplicated: tied tensors appear once
            param.copy_(_init_value(name, param.shape, scales, generator))
        for name, buffer in model.named_buffers():
            if name.endswith("layer_scalar"):
                buffer.copy_(_uniform(generator, buffer.shape, scales.scalar_low, scales.scalar_high))
        _check_ties(model)


def randomize_vision_buffers(model: DiffusionGemmaForBlockDiffusion, seed: int) -> None:
    """Seeded values for the vision tower's buffers that `randomize_weights` leaves at their init
    (the standardisation bias and scale, the position-embedding table)."""
    generator = torch.Generator().manual_seed(seed)
    tower = model.model.encoder.vision_tower
    with torch.no_grad():
        tower.std_bias.copy_(0.1 * torch.randn(tower.std_bias.shape, generator=generator))
        tower.std_scale.copy_(1 + 0.2 * (torch.rand(tower.std_scale.shape, generator=generator) - 0.5))
        table = tower.patch_embedder.position_embedding_table
        table.copy_(0.5 * torch.randn(table.shape, generator=generator))


def _check_ties(model: DiffusionGemmaForBlockDiffusion) -> None:
    """Assert that the encoder text weights and lm_head are the decoder's tensors."""
    decoder = model.model.decoder
    encoder = model.model.encoder.language_model
    assert model.lm_head.weight is decoder.embed_tokens.weight
    assert encoder.embed_tokens.weight is decoder.embed_tokens.weight
    assert encoder.norm.weight is decoder.norm.weight
    for enc_layer, dec_layer in zip(encoder.layers, decoder.layers):
        for (enc_name, enc_param), (_, dec_param) in zip(
            enc_layer.named_parameters(), dec_layer.named_parameters()
        ):
            assert enc_param is dec_param, f"encoder {enc_name} is not tied to the decoder"
        assert not torch.equal(enc_layer.layer_scalar, dec_layer.layer_scalar)


def round_to_bfloat16(model: DiffusionGemmaForBlockDiffusion) -> None:
    """Round every saved tensor (parameters and persistent buffers) to bf16 values, kept in f32.

    The non-persistent buffers (embed_scale, RoPE inverse frequencies) stay as computed in f32, which
    is what loading the bf16 checkpoint with ``dtype=float32`` produces.
    """
    with torch.no_grad():
        for tensor in model.state_dict().values():
            if tensor.is_floating_point():
                tensor.copy_(tensor.to(torch.bfloat16).to(torch.float32))

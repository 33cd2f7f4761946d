"""Named fixture presets for the DiffusionGemma oracle.

A preset is a plain dict with these keys (every key of ``BASE`` may be overridden with ``--overrides``):

``description``
    One line saying what the preset covers; written to reference.json ``config``.
``seed``
    The seed the committed fixture was made with (``--seed`` replaces it).
``text_config``
    Keyword arguments for ``DiffusionGemmaTextConfig``. ``global_head_dim`` and
    ``num_global_key_value_heads`` are accepted (transformers turns them into ``per_layer_config``).
    ``layer_types`` may be a list, ``None`` (the class default: 5 sliding : 1 full, last full) or the
    string ``"random"`` (drawn from the seed, last layer forced to full attention).
``canvas_length``, ``prompt_length``
    C and P.
``checkpoint_dtype``
    ``"float32"`` or ``"bfloat16"``. With bfloat16 every saved tensor is rounded to bf16 first and the
    oracle runs in f32 on exactly those values.
``vision_config``
    ``None`` for a text-only model, or keyword arguments of a (tiny) ``Gemma4VisionConfig`` so that the
    checkpoint carries a vision tower that a text-only loader has to skip.
``init``
    Scales of the random weights, see ``model_builder.InitScales``.
``generation``
    The sampler parameters given to ``generate`` and written to reference.json ``generation``.
    ``eos_token_id`` may be an id, a list of ids, or ``"auto"`` (see ``eos_auto``).
``eos_auto``
    Only read when ``generation.eos_token_id == "auto"``: ``{"block": b, "extra_ids": k}``. A probe
    generation without EOS picks, from block ``b`` of its output, a token whose first occurrence sits
    mid-canvas and that no earlier block contains; that token (plus ``k`` further ids absent from the
    probe output up to that block) becomes the EOS list, so the real run stops in block ``b``.
``generation_config_json``
    What ``generation_config.json`` holds: ``"same"`` (the ``generation`` values), ``"empty"`` (all
    nulls, as a model directory without sampler settings) or ``"defaults"`` (the real checkpoint's
    values, which reference.json then overrides).
``gguf_scheme``
    ``None`` for a safetensors fixture, or one of dg's quantization schemes (``"q8_0"``,
    ``"q4_k_m"``): the fixture's weights are then ``model.gguf``, quantized by dg and dequantized
    by gguf-py, and the reference is transformers' run on the dequantized values (``gguf_fixture``).
``gguf_tensors``
    With ``gguf_scheme``: single tensors (names under ``model.decoder``) written in other ggml types,
    ``{"layers.0.experts.gate_up_proj": "IQ2_XXS"}``: quantized by dg or gguf-py where one of them
    quantizes the type, else drawn as valid random blocks (``gguf_fixture.tensor_blocks``).
``expect``
    Behaviours the generated run must show, else the fixture is rejected: ``multi_block`` (at least
    two canvases, so a block commit happens), ``early_stop`` (some block stops before
    max_denoising_steps), ``eos_stop`` (the last block has an EOS strictly inside the canvas and
    generation ends before max_new_tokens).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

SLIDING = "sliding_attention"
FULL = "full_attention"

#: Generic small model; ``--preset custom`` starts from here.
BASE: dict[str, Any] = {
    "description": "generic small text-only model",
    "seed": 0,
    "canvas_length": 16,
    "prompt_length": 12,
    "checkpoint_dtype": "float32",
    "vision_config": None,
    "text_config": {
        "vocab_size": 256,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_global_key_value_heads": 1,
        "head_dim": 16,
        "global_head_dim": 32,
        "sliding_window": 8,
        "layer_types": [SLIDING, SLIDING, SLIDING, FULL],
        "num_experts": 4,
        "top_k_experts": 2,
        "moe_intermediate_size": 16,
        "use_bidirectional_attention": "vision",
    },
    "init": {"logit_scale": 1.5},
    "generation": {
        "max_new_tokens": 32,
        "max_denoising_steps": 12,
        "t_min": 0.4,
        "t_max": 0.8,
        "entropy_bound": 0.3,
        "stability_threshold": 1,
        "confidence_threshold": 0.005,
        "eos_token_id": [1],
        "pad_token_id": 0,
    },
    "eos_auto": {"block": 1, "extra_ids": 1},
    "generation_config_json": "same",
    "gguf_scheme": None,
    "gguf_tensors": {},
    "expect": {"multi_block": True},
}

#: The generation_config.json values of the released checkpoint (model-spec section 1.4).
REAL_GENERATION_DEFAULTS: dict[str, Any] = {
    "max_new_tokens": 256,
    "max_denoising_steps": 48,
    "t_min": 0.4,
    "t_max": 0.8,
    "entropy_bound": 0.1,
    "stability_threshold": 1,
    "confidence_threshold": 0.005,
    "eos_token_id": [1, 106, 50],
    "pad_token_id": 0,
}

#: Overrides applied on top of ``BASE`` for each named preset.
PRESET_OVERRIDES: dict[str, dict[str, Any]] = {
    "custom": {},
    "sliding-long-prompt": {
        "description": (
            "3 sliding + 1 full layer, W=8, 21-token prompt longer than the window (decoder sees the last "
            "W-1 cached tokens, encoder window mask), GQA 4q/2kv sliding and 4q/1kv global, q/k norm "
            "weights around 1, 3 canvases from max_new_tokens 40 (not a multiple of C), "
            "generation_config.json all nulls"
        ),
        "seed": 3,
        "canvas_length": 16,
        "prompt_length": 21,
        "text_config": {
            "vocab_size": 320,
            "hidden_size": 64,
            "intermediate_size": 96,
            "num_hidden_layers": 4,
            "layer_types": [SLIDING, SLIDING, SLIDING, FULL],
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "num_global_key_value_heads": 1,
            "head_dim": 16,
            "global_head_dim": 32,
            "sliding_window": 8,
            "num_experts": 4,
            "top_k_experts": 2,
            "moe_intermediate_size": 32,
        },
        "init": {"attn_score_std": None},
        "generation": {"max_new_tokens": 40, "max_denoising_steps": 12, "entropy_bound": 0.3, "eos_token_id": [1]},
        "generation_config_json": "empty",
    },
    "default-pattern-8experts": {
        "description": (
            "layer_types omitted (class default 5 sliding : 1 full, 6 layers), 8 experts top-3, "
            "num_global_key_value_heads == num_key_value_heads, W=24 < prompt+canvas so block 2 sees a "
            "truncated sliding cache, stability_threshold 2, eos list [1, 2], generation_config.json holds "
            "the real checkpoint's defaults (reference.json overrides them)"
        ),
        "seed": 1,
        "canvas_length": 32,
        "prompt_length": 10,
        "text_config": {
            "vocab_size": 512,
            "hidden_size": 48,
            "intermediate_size": 64,
            "num_hidden_layers": 6,
            "layer_types": None,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "num_global_key_value_heads": 2,
            "head_dim": 16,
            "global_head_dim": 32,
            "sliding_window": 24,
            "num_experts": 8,
            "top_k_experts": 3,
            "moe_intermediate_size": 16,
        },
        "generation": {
            "max_new_tokens": 64,
            "max_denoising_steps": 16,
            "entropy_bound": 0.5,
            "stability_threshold": 2,
            "confidence_threshold": 0.01,
            "eos_token_id": [1, 2],
        },
        "generation_config_json": "defaults",
    },
    "bf16-checkpoint": {
        "description": (
            "checkpoint saved in BF16 (oracle runs in f32 on the bf16 values), interleaved S,F,S,F layers, "
            "6 q heads, 3kv sliding / 2kv global, partial_rotary_factor 0.5 on full layers, rope theta 5e5, "
            "stability_threshold 0, t 0.3..0.9, eos as a single int"
        ),
        "seed": 3,
        "checkpoint_dtype": "bfloat16",
        "canvas_length": 24,
        "prompt_length": 9,
        "text_config": {
            "vocab_size": 384,
            "hidden_size": 48,
            "intermediate_size": 80,
            "num_hidden_layers": 4,
            "layer_types": [SLIDING, FULL, SLIDING, FULL],
            "num_attention_heads": 6,
            "num_key_value_heads": 3,
            "num_global_key_value_heads": 2,
            "head_dim": 16,
            "global_head_dim": 32,
            "sliding_window": 12,
            "num_experts": 6,
            "top_k_experts": 2,
            "moe_intermediate_size": 24,
            "rope_parameters": {
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.5, "rope_theta": 500000.0},
            },
        },
        "generation": {
            "max_new_tokens": 48,
            "max_denoising_steps": 10,
            "t_min": 0.3,
            "t_max": 0.9,
            "entropy_bound": 0.2,
            "stability_threshold": 0,
            "confidence_threshold": 0.005,
            "eos_token_id": 1,
        },
    },
    "real-head-dims": {
        "description": (
            "the real head geometry at a tiny width: head_dim 256 (sliding) / 512 (full), 4 q heads, "
            "2 kv heads sliding, 1 kv head global, hidden 48, proportional RoPE 0.25 over 512 dims"
        ),
        "seed": 1,
        "canvas_length": 16,
        "prompt_length": 14,
        "text_config": {
            "vocab_size": 256,
            "hidden_size": 48,
            "intermediate_size": 64,
            "num_hidden_layers": 3,
            "layer_types": [SLIDING, SLIDING, FULL],
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "num_global_key_value_heads": 1,
            "head_dim": 256,
            "global_head_dim": 512,
            "sliding_window": 16,
            "num_experts": 4,
            "top_k_experts": 2,
            "moe_intermediate_size": 16,
        },
        "generation": {"max_new_tokens": 32, "max_denoising_steps": 12, "entropy_bound": 0.3, "eos_token_id": [1]},
    },
    "early-stop-eos": {
        "description": (
            "low temperatures (t 0.1..0.25) and confidence_threshold 0.1 so StableAndConfident stops "
            "blocks early; EOS ids chosen from a probe run so an EOS lands mid-canvas in block 2 (rest "
            "padded) and generation ends there although max_new_tokens allows 4 blocks"
        ),
        "seed": 5,
        "canvas_length": 16,
        "prompt_length": 8,
        "text_config": {"sliding_window": 16},
        "generation": {
            "max_new_tokens": 64,
            "max_denoising_steps": 24,
            "t_min": 0.1,
            "t_max": 0.25,
            "entropy_bound": 0.5,
            "stability_threshold": 1,
            "confidence_threshold": 0.1,
            "eos_token_id": "auto",
            "pad_token_id": 0,
        },
        "eos_auto": {"block": 1, "extra_ids": 1},
        "expect": {"multi_block": True, "early_stop": True, "eos_stop": True},
    },
    "vision-tower-skip": {
        "description": (
            "text fixture whose checkpoint also holds a tiny Gemma-4 vision tower and embed_vision "
            "(a text-only loader must skip them); the real checkpoint's sampler settings (48 steps, bound "
            "0.1, t 0.4..0.8, eos [1, 106, 50])"
        ),
        "seed": 7,
        "canvas_length": 16,
        "prompt_length": 6,
        "init": {"logit_scale": 1.0},
        "vision_config": {
            "hidden_size": 16,
            "intermediate_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "head_dim": 8,
            "position_embedding_size": 64,
            "patch_size": 4,
        },
        "text_config": {"vocab_size": 128, "hidden_size": 32, "num_hidden_layers": 2, "layer_types": [SLIDING, FULL]},
        "generation": {
            "max_new_tokens": 32,
            "max_denoising_steps": 48,
            "entropy_bound": 0.1,
            "eos_token_id": [1, 106, 50],
        },
    },
    "gguf-q8_0": {
        "description": (
            "GGUF weights, dg's q8_0 scheme: every attention, dense-MLP and expert matrix Q8_0 (ggml blocks "
            "of 32), embedding, router, self-conditioning MLP, norms and scalars kept F32; the reference "
            "runs on gguf-py's dequantization of the file"
        ),
        "seed": 0,
        "canvas_length": 16,
        "prompt_length": 12,
        "text_config": {
            "vocab_size": 320,
            "hidden_size": 64,
            "intermediate_size": 96,
            "num_hidden_layers": 4,
            "layer_types": [SLIDING, SLIDING, SLIDING, FULL],
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "num_global_key_value_heads": 1,
            "head_dim": 16,
            "global_head_dim": 32,
            "sliding_window": 8,
            "num_experts": 4,
            "top_k_experts": 2,
            "moe_intermediate_size": 32,
        },
        "gguf_scheme": "q8_0",
    },
    "gguf-q4_k_m": {
        "description": (
            "GGUF weights, dg's q4_k_m scheme at hidden 256: experts gate/up Q4_K (super-blocks of 256), "
            "experts down Q5_0 (layers 0, 1) and Q8_0 (layer 2, llama.cpp's use_more_bits; K = 32 is not "
            "a whole super-block), attention and dense MLP Q8_0, the rest kept BF16; the reference runs "
            "on gguf-py's dequantization of the file"
        ),
        "seed": 0,
        "checkpoint_dtype": "bfloat16",
        "canvas_length": 16,
        "prompt_length": 10,
        "text_config": {
            "vocab_size": 256,
            "hidden_size": 256,
            "intermediate_size": 64,
            "num_hidden_layers": 3,
            "layer_types": [SLIDING, SLIDING, FULL],
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "num_global_key_value_heads": 1,
            "head_dim": 32,
            "global_head_dim": 64,
            "sliding_window": 8,
            "num_experts": 4,
            "top_k_experts": 2,
            "moe_intermediate_size": 32,
        },
        # lower temperatures than BASE so that steps accept several tokens (at t 0.4..0.8 one or two)
        "generation": {"entropy_bound": 0.5, "t_min": 0.2, "t_max": 0.4},
        "gguf_scheme": "q4_k_m",
    },
    "gguf-q4_k_m-k256": {
        "description": (
            "GGUF weights, dg's q4_k_m scheme with expert rows of 256 (I_e 256): experts gate/up and "
            "layer 0's down Q4_K, layer 1's down Q6_K (llama.cpp's use_more_bits), attention and dense "
            "MLP Q8_0, the rest kept BF16; the reference runs on gguf-py's dequantization of the file"
        ),
        "seed": 0,
        "checkpoint_dtype": "bfloat16",
        "canvas_length": 16,
        "prompt_length": 9,
        "text_config": {
            "vocab_size": 256,
            "hidden_size": 256,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "layer_types": [SLIDING, FULL],
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "num_global_key_value_heads": 1,
            "head_dim": 32,
            "global_head_dim": 64,
            "sliding_window": 8,
            "num_experts": 2,
            "top_k_experts": 1,
            "moe_intermediate_size": 256,
        },
        "generation": {"entropy_bound": 0.5, "t_min": 0.2, "t_max": 0.4},
        "gguf_scheme": "q4_k_m",
    },
    "gguf-q2_k": {
        "description": (
            "GGUF weights, the K-quants: dg's q2_k scheme with expert rows of 256 (I_e 256), experts gate/up "
            "Q2_K and layer 1's down Q3_K, layer 0's down Q5_K (written by dg's quantizer), attention and dense "
            "MLP Q8_0, the rest kept BF16; the reference runs on gguf-py's dequantization of the file"
        ),
        "seed": 0,
        "checkpoint_dtype": "bfloat16",
        "canvas_length": 16,
        "prompt_length": 9,
        "text_config": {
            "vocab_size": 256,
            "hidden_size": 256,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "layer_types": [SLIDING, FULL],
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "num_global_key_value_heads": 1,
            "head_dim": 32,
            "global_head_dim": 64,
            "sliding_window": 8,
            "num_experts": 2,
            "top_k_experts": 1,
            "moe_intermediate_size": 256,
        },
        "generation": {"entropy_bound": 0.5, "t_min": 0.2, "t_max": 0.4},
        "gguf_scheme": "q2_k",
        "gguf_tensors": {"layers.0.experts.down_proj": "Q5_K"},
    },
    "gguf-legacy": {
        "description": (
            "GGUF weights, the legacy types: dg's q2_k scheme at hidden 64, whose expert rows (64, 32) fall "
            "back to Q4_0 (llama.cpp's fallback), layer 1's experts Q4_1 (gguf-py's quantizer) and layer 2's "
            "Q5_1 (dg's), attention and dense MLP Q8_0, the rest F32; the reference runs on gguf-py's "
            "dequantization of the file"
        ),
        "seed": 0,
        "canvas_length": 16,
        "prompt_length": 12,
        "text_config": {
            "vocab_size": 320,
            "hidden_size": 64,
            "intermediate_size": 96,
            "num_hidden_layers": 4,
            "layer_types": [SLIDING, SLIDING, SLIDING, FULL],
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "num_global_key_value_heads": 1,
            "head_dim": 16,
            "global_head_dim": 32,
            "sliding_window": 8,
            "num_experts": 4,
            "top_k_experts": 2,
            "moe_intermediate_size": 32,
        },
        "gguf_scheme": "q2_k",
        "gguf_tensors": {
            "layers.1.experts.gate_up_proj": "Q4_1",
            "layers.1.experts.down_proj": "Q4_1",
            "layers.2.experts.gate_up_proj": "Q5_1",
            "layers.2.experts.down_proj": "Q5_1",
        },
    },
    "gguf-iq": {
        "description": (
            "GGUF weights, the IQ types: dg's iq4_xs scheme at hidden 256 (experts gate/up IQ4_XS, down IQ4_NL: "
            "K = 32 falls back), and the grid types dg and gguf-py cannot quantize (llama.cpp needs an "
            "importance matrix) as drawn blocks, valid random blocks scaled to each tensor's RMS: experts "
            "gate/up IQ2_XXS, IQ2_XS, IQ2_S in layers 0-2, dense MLP gate and up IQ3_XXS, IQ3_S, IQ1_S, IQ1_M "
            "in layers 0-3; attention Q8_0, the rest BF16; the reference runs on gguf-py's dequantization"
        ),
        "seed": 0,
        "checkpoint_dtype": "bfloat16",
        "canvas_length": 16,
        "prompt_length": 10,
        "text_config": {
            "vocab_size": 256,
            "hidden_size": 256,
            "intermediate_size": 64,
            "num_hidden_layers": 4,
            "layer_types": [SLIDING, SLIDING, SLIDING, FULL],
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "num_global_key_value_heads": 1,
            "head_dim": 32,
            "global_head_dim": 64,
            "sliding_window": 8,
            "num_experts": 4,
            "top_k_experts": 2,
            "moe_intermediate_size": 32,
        },
        "generation": {"entropy_bound": 0.5, "t_min": 0.2, "t_max": 0.4},
        "gguf_scheme": "iq4_xs",
        "gguf_tensors": {
            "layers.0.experts.gate_up_proj": "IQ2_XXS",
            "layers.1.experts.gate_up_proj": "IQ2_XS",
            "layers.2.experts.gate_up_proj": "IQ2_S",
            "layers.0.mlp.gate_proj.weight": "IQ3_XXS",
            "layers.0.mlp.up_proj.weight": "IQ3_XXS",
            "layers.1.mlp.gate_proj.weight": "IQ3_S",
            "layers.1.mlp.up_proj.weight": "IQ3_S",
            "layers.2.mlp.gate_proj.weight": "IQ1_S",
            "layers.2.mlp.up_proj.weight": "IQ1_S",
            "layers.3.mlp.gate_proj.weight": "IQ1_M",
            "layers.3.mlp.up_proj.weight": "IQ1_M",
        },
    },
    "gguf-fp4": {
        "description": (
            "GGUF weights, the FP4 types: dg's q8_0 scheme at hidden 64 with the experts in FP4: every "
            "experts down and layers 0 and 2's gate/up MXFP4 (gguf-py's quantizer), layers 1 and 3's gate/up "
            "NVFP4 (blocks of 64; gguf-py has no quantizer: drawn blocks, valid random blocks with UE4M3 "
            "scales set to the tensor's RMS), attention and dense MLP Q8_0, the rest F32; the reference "
            "runs on gguf-py's dequantization of the file"
        ),
        "seed": 0,
        "canvas_length": 16,
        "prompt_length": 12,
        "text_config": {
            "vocab_size": 320,
            "hidden_size": 64,
            "intermediate_size": 96,
            "num_hidden_layers": 4,
            "layer_types": [SLIDING, SLIDING, SLIDING, FULL],
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "num_global_key_value_heads": 1,
            "head_dim": 16,
            "global_head_dim": 32,
            "sliding_window": 8,
            "num_experts": 4,
            "top_k_experts": 2,
            "moe_intermediate_size": 32,
        },
        "gguf_scheme": "q8_0",
        "gguf_tensors": {
            **{f"layers.{i}.experts.down_proj": "MXFP4" for i in range(4)},
            "layers.0.experts.gate_up_proj": "MXFP4",
            "layers.1.experts.gate_up_proj": "NVFP4",
            "layers.2.experts.gate_up_proj": "MXFP4",
            "layers.3.experts.gate_up_proj": "NVFP4",
        },
    },
    "f16-overflow": {
        "description": (
            "down projections' inputs past f16's range: gate/up weights 200x (init ffn_gain), so "
            "gelu(gate)*up reaches about 2.8e5 (dense MLP) and 3.9e5 (experts) in f32 while the "
            "post-feedforward norms keep the rest of the model as usual; shapes the tensor cores take "
            "(hidden 64, MLP 64, experts 8 x 32); a forward that rounds those activations to f16 "
            "without scaling them gets inf"
        ),
        "seed": 101,
        "canvas_length": 32,
        "text_config": {
            "hidden_size": 64,
            "intermediate_size": 64,
            "moe_intermediate_size": 32,
            "num_experts": 8,
            "top_k_experts": 2,
            "head_dim": 16,
            "global_head_dim": 32,
        },
        "generation": {"max_new_tokens": 64},
        "init": {"ffn_gain": 200.0},
    },
    "odd-shapes": {
        "description": (
            "awkward shapes: 5 experts top-2 (an odd expert count), vocab 383 (odd), hidden 72 (not a "
            "multiple of 64), MLP 88, experts 5 x 24, canvas 20 (not a power of two), window 7, prompt 13, "
            "max_new_tokens 50 (3 canvases, the last truncated)"
        ),
        "seed": 5,
        "canvas_length": 20,
        "prompt_length": 13,
        "text_config": {
            "vocab_size": 383,
            "hidden_size": 72,
            "intermediate_size": 88,
            "num_experts": 5,
            "top_k_experts": 2,
            "moe_intermediate_size": 24,
            "head_dim": 16,
            "global_head_dim": 32,
            "sliding_window": 7,
        },
        "generation": {"max_new_tokens": 50, "max_denoising_steps": 12, "entropy_bound": 0.3},
    },
}


def deep_merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Return a copy of ``base`` with ``overrides`` merged in; nested dicts merge, anything else replaces.

    A few dict-valued fields are replaced whole rather than merged (``rope_parameters``,
    ``vision_config``), since a partial merge of those would silently keep stale sub-keys.
    """
    merged = copy.deepcopy(base)
    for key, value in overrides.items():
        replace_whole = key in ("rope_parameters", "vision_config")
        if isinstance(value, dict) and isinstance(merged.get(key), dict) and not replace_whole:
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def preset_names() -> list[str]:
    """Names accepted by ``--preset``."""
    return list(PRESET_OVERRIDES)


def resolve_preset(name: str, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Return the full spec of preset ``name`` (BASE + its overrides + the user's overrides)."""
    if name not in PRESET_OVERRIDES:
        raise KeyError(f"unknown preset {name!r}; choose one of {', '.join(preset_names())}")
    spec = deep_merge(BASE, PRESET_OVERRIDES[name])
    if overrides:
        spec = deep_merge(spec, overrides)
    spec["name"] = name
    return spec


def load_overrides(text_or_path: str | None) -> dict[str, Any] | None:
    """Parse ``--overrides``: either inline JSON or the path of a JSON file."""
    if not text_or_path:
        return None
    if not text_or_path.lstrip().startswith("{"):
        text_or_path = Path(text_or_path).read_text()
    overrides = json.loads(text_or_path)
    if not isinstance(overrides, dict):
        raise ValueError("--overrides must be a JSON object")
    return overrides

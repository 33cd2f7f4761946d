#!/usr/bin/env python3
"""Writes the committed fuzz seeds next to this script (stdlib only; rerun after editing)."""

import json
import struct
from pathlib import Path

HERE = Path(__file__).resolve().parent

TINY_CONFIG = {
    "model_type": "diffusion_gemma", "canvas_length": 8, "eos_token_id": [1, 6],
    "text_config": {
        "model_type": "diffusion_gemma_text", "vocab_size": 32, "hidden_size": 12, "intermediate_size": 10,
        "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
        "num_global_key_value_heads": 1, "head_dim": 4, "global_head_dim": 8, "sliding_window": 4,
        "num_experts": 4, "top_k_experts": 2, "moe_intermediate_size": 6,
        "layer_types": ["sliding_attention", "full_attention"],
    },
}

# Spec §1.1-1.2: the real 26B-A4B config.json (text part; vision_config trimmed).
REAL_CONFIG = {
    "architectures": ["DiffusionGemmaForBlockDiffusion"], "model_type": "diffusion_gemma",
    "canvas_length": 256, "tie_word_embeddings": True, "boi_token_id": 255999, "eoi_token_id": 258882,
    "image_token_id": 258880, "eos_token_id": [1, 106], "vision_soft_tokens_per_image": 280,
    "text_config": {
        "model_type": "diffusion_gemma_text", "vocab_size": 262144, "hidden_size": 2816,
        "intermediate_size": 2112, "num_hidden_layers": 30, "num_attention_heads": 16,
        "num_key_value_heads": 8, "num_global_key_value_heads": 2, "head_dim": 256, "global_head_dim": 512,
        "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 262144, "rms_norm_eps": 1e-06,
        "pad_token_id": 0, "tie_word_embeddings": True,
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "proportional", "rope_theta": 1000000.0,
                               "partial_rotary_factor": 0.25},
        },
        "attention_bias": False, "sliding_window": 1024,
        "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 5,
        "final_logit_softcapping": 30.0, "use_bidirectional_attention": "vision",
        "num_experts": 128, "top_k_experts": 8, "moe_intermediate_size": 704,
        "per_layer_config": {"5": {"head_dim": 512, "num_key_value_heads": 2}},
    },
    "vision_config": {"model_type": "gemma4_vision", "hidden_size": 1152, "num_hidden_layers": 27},
}

# Spec §1.4.
REAL_GENERATION = {
    "max_new_tokens": 256, "max_denoising_steps": 48,
    "sampler_config": {"_cls_name": "EntropyBoundSamplerConfig", "entropy_bound": 0.1},
    "t_min": 0.4, "t_max": 0.8, "stability_threshold": 1, "confidence_threshold": 0.005,
    "eos_token_id": [1, 106, 50], "pad_token_id": 0, "transformers_version": "5.8.0.dev0",
}

FORMATS = {"F32": "<f", "F16": "<e", "I64": "<q", "I32": "<i", "F64": "<d"}


def safetensors(tensors):
    """tensors: list of (name, dtype, shape, values); BF16 values are given as raw u16 bit patterns."""
    header, data = {}, b""
    for name, dtype, shape, values in tensors:
        fmt = "<H" if dtype == "BF16" else FORMATS[dtype]
        blob = b"".join(struct.pack(fmt, v) for v in values)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(blob)]}
        data += blob
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<Q", len(text)) + text + data


def tiny_model():
    """Every tensor of the safetensors_header target's TINY_CONFIG (one full layer, H=2), in BF16."""
    d, layer = "model.decoder", "model.decoder.layers.0"
    shapes = {
        f"{d}.embed_tokens.weight": [4, 2], f"{d}.norm.weight": [2],
        f"{d}.self_conditioning.pre_norm.weight": [2], f"{d}.self_conditioning.gate_proj.weight": [2, 2],
        f"{d}.self_conditioning.up_proj.weight": [2, 2], f"{d}.self_conditioning.down_proj.weight": [2, 2],
        f"{layer}.self_attn.q_proj.weight": [2, 2], f"{layer}.self_attn.k_proj.weight": [2, 2],
        f"{layer}.self_attn.o_proj.weight": [2, 2], f"{layer}.self_attn.q_norm.weight": [2],
        f"{layer}.self_attn.k_norm.weight": [2], f"{layer}.mlp.gate_proj.weight": [2, 2],
        f"{layer}.mlp.up_proj.weight": [2, 2], f"{layer}.mlp.down_proj.weight": [2, 2],
        f"{layer}.router.proj.weight": [1, 2], f"{layer}.router.scale": [2],
        f"{layer}.router.per_expert_scale": [1], f"{layer}.experts.gate_up_proj": [1, 2, 2],
        f"{layer}.experts.down_proj": [1, 2, 1], f"{layer}.layer_scalar": [1],
        "model.encoder.language_model.layers.0.layer_scalar": [1],
    }
    for norm in ["input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                 "post_feedforward_layernorm_1", "pre_feedforward_layernorm_2", "post_feedforward_layernorm_2",
                 "post_feedforward_layernorm"]:
        shapes[f"{layer}.{norm}.weight"] = [2]
    tensors = []
    for name, shape in sorted(shapes.items()):
        count = 1
        for dim in shape:
            count *= dim
        tensors.append((name, "BF16", shape, [0x3F80] * count))  # bf16 1.0
    return safetensors(tensors)


def gguf_kv(key, type_id, payload):
    """One GGUF metadata entry: key, value type, value bytes."""
    return gguf_str(key) + struct.pack("<I", type_id) + payload


def gguf_str(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def gguf_array(elem_type, payloads):
    return struct.pack("<IQ", elem_type, len(payloads)) + b"".join(payloads)


def gguf_vocab():
    """A GGUF v3 file with no tensors whose metadata is a tiny "gemma4" tokenizer, laid out as
    llama.cpp's converter writes one (types: 3 control, 4 user-defined, 6 byte, 1 normal)."""
    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<|turn>", "<turn|>", '<|"|>']
    tokens = specials + [f"<0x{b:02X}>" for b in range(16)] + ["\u2581", "a", "b", "\u2581a", "ab", "\u2581ab"]
    types = [3] * 6 + [4] + [6] * 16 + [1] * 6
    merges = ["\u2581 a", "a b", "\u2581a b"]
    STR, ARR, U32, I32, F32, BOOL = 8, 9, 4, 5, 6, 7
    kvs = [
        gguf_kv("tokenizer.ggml.model", STR, gguf_str("gemma4")),
        gguf_kv("tokenizer.ggml.tokens", ARR, gguf_array(STR, [gguf_str(t) for t in tokens])),
        gguf_kv("tokenizer.ggml.scores", ARR, gguf_array(F32, [struct.pack("<f", -1000.0)] * len(tokens))),
        gguf_kv("tokenizer.ggml.token_type", ARR, gguf_array(I32, [struct.pack("<i", t) for t in types])),
        gguf_kv("tokenizer.ggml.merges", ARR, gguf_array(STR, [gguf_str(m) for m in merges])),
    ]
    kvs += [gguf_kv(f"tokenizer.ggml.{k}_token_id", U32, struct.pack("<I", v))
            for k, v in [("bos", 2), ("eos", 1), ("unknown", 3), ("padding", 0)]]
    kvs += [gguf_kv(f"tokenizer.ggml.{k}", BOOL, bytes([v]))
            for k, v in [("add_bos_token", 1), ("add_eos_token", 0), ("add_space_prefix", 0)]]
    kvs.append(gguf_kv("tokenizer.chat_template", STR, gguf_str("{{ bos_token }}{% for m in messages %}<|turn>{{ m.role }}\n{{ m.content }}<turn|>\n{% endfor %}")))
    return b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs)) + b"".join(kvs)


def write(target, name, content):
    path = HERE / target / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content if isinstance(content, bytes) else content.encode())


def main():
    for name, value in [("tiny_config.json", TINY_CONFIG), ("real_config.json", REAL_CONFIG),
                        ("real_generation_config.json", REAL_GENERATION)]:
        write("config_json", name, json.dumps(value, indent=1))
    # config.json, 0xFF, generation_config.json: the target parses both halves.
    write("config_json", "config_and_generation",
          json.dumps(TINY_CONFIG).encode() + b"\xff" + json.dumps(REAL_GENERATION).encode())

    # Regressions: these used to abort (10^11-entry layer tables) or overflow in num_parameters.
    moe = {"num_experts": 1, "top_k_experts": 1, "moe_intermediate_size": 1}
    for name, fields in [
        ("regression_layers.json", {"num_hidden_layers": 100_000_000_000}),
        ("regression_heads.json", {"num_hidden_layers": 1, "num_attention_heads": 2**32, "num_key_value_heads": 1,
                                   "head_dim": 2**32, "global_head_dim": 2**32}),
        ("regression_vocab.json", {"vocab_size": 2**32 - 1, "hidden_size": 2**40}),
    ]:
        write("config_json", name, json.dumps({"model_type": "diffusion_gemma", "text_config": {**moe, **fields}}))

    write("safetensors_header", "mixed_dtypes.safetensors", safetensors([
        ("model.decoder.norm.weight", "F32", [2], [1.0, -0.5]),
        ("model.decoder.embed_tokens.weight", "BF16", [4, 2], [0x3F80, 0xBF80, 0x4000, 0, 0x3E80, 1, 0x7F80, 0xFFC0]),
        ("model.decoder.layers.0.self_attn.q_norm.weight", "F16", [2], [0.25, 65504.0]),
        ("model.decoder.layers.0.layer_scalar", "F64", [1], [0.75]),
        ("input_ids", "I64", [1, 3], [2, 105, -1]),
        ("position_ids", "I32", [3], [0, 1, 2]),
        ("empty", "F32", [0, 4], []),
    ]))
    write("safetensors_header", "tiny_model.safetensors", tiny_model())
    write("safetensors_header", "scalar.safetensors", safetensors([("x", "F32", [], [3.5])]))
    write("gguf_vocab", "tiny_vocab.gguf", gguf_vocab())


if __name__ == "__main__":
    main()

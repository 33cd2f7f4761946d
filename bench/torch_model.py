"""Shared by the transformers-side benchmarks: the model of a config JSON with seeded random
weights, the prompt they all encode, and a timing helper that synchronises CUDA."""

import json
import statistics
import time

import torch
from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion


TINY_VISION = {
    "model_type": "gemma4_vision",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 16,
}


def build(config_path: str, device: str, dtype: torch.dtype) -> DiffusionGemmaForBlockDiffusion:
    """The model of `config_path` with eager attention and seeded random weights."""
    with open(config_path) as f:
        raw = json.load(f)
    # The encoder module always builds a vision tower; a minimal one keeps it out of the way
    # (the text path never touches it). Configs may also spell its absence as null.
    if raw.get("vision_config") is None:
        raw["vision_config"] = TINY_VISION
    config = DiffusionGemmaConfig(**raw)
    config.text_config._attn_implementation = "eager"
    torch.manual_seed(0)
    # Built in the target dtype on the target device: a 30-layer model built in f32 and then cast
    # would hold 101 GB of f32 weights first, more than an H200 has.
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = DiffusionGemmaForBlockDiffusion(config).eval()
    finally:
        torch.set_default_dtype(previous)
    return model


def prompt_ids(length: int, vocab: int, device) -> torch.Tensor:
    """The benchmark prompt: `[1, length]` ids spread over the vocabulary."""
    return (torch.arange(length, device=device) * 7919 % vocab).unsqueeze(0)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def median_seconds(fn, runs: int, device: torch.device) -> tuple[float, float]:
    """(median, min) wall seconds of `fn()` over `runs` calls, the device synchronised around each."""
    times = []
    for _ in range(runs):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), min(times)


def where(device: torch.device, threads: int) -> str:
    """The device in words, for the result lines."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu threads={threads}"

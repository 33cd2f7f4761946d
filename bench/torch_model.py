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
    # Built in the target dtype (a 30-layer model built in f32 and then cast would hold 101 GB of
    # f32 weights first) and on the meta device, then given memory once per distinct tensor: the
    # encoder's text weights are tied to the decoder's, and building on the GPU would allocate
    # both copies before tying them (78 GB at 30 layers in bf16, more than an H100 holds).
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device("meta"):
            model = DiffusionGemmaForBlockDiffusion(config)
    finally:
        torch.set_default_dtype(previous)
    materialize(model, device)
    torch.manual_seed(0)
    model.init_weights()
    return model.eval()


def materialize(model: torch.nn.Module, device: str) -> None:
    """Give every parameter and buffer of a model built on the meta device uninitialised memory on
    `device`, one allocation per distinct tensor, so that tied tensors stay one."""
    made = {}
    for module in model.modules():
        for table in (module._parameters, module._buffers):
            for name, t in list(table.items()):
                if t is None:
                    continue
                if id(t) not in made:
                    empty = torch.empty_like(t, device=device)
                    made[id(t)] = torch.nn.Parameter(empty, requires_grad=t.requires_grad) if isinstance(t, torch.nn.Parameter) else empty
                table[name] = made[id(t)]


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

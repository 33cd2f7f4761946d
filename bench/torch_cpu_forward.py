"""transformers side of the CPU canvas-forward benchmark (f32, eager attention, CPU).

Builds DiffusionGemmaForBlockDiffusion from a config JSON with random weights, encodes a prompt
of 256 tokens into a DynamicCache, then times one decoder forward of a full canvas with
self-conditioning logits, exactly the work `cargo bench -p dg-cpu --bench canvas_forward` times.

    python bench/torch_cpu_forward.py --config bench/configs/cpu-medium.json --threads 2
"""

import argparse
import json
import statistics
import time

import torch
from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion
from transformers.cache_utils import DynamicCache


TINY_VISION = {
    "model_type": "gemma4_vision",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 16,
}


def build(config_path: str) -> DiffusionGemmaForBlockDiffusion:
    """The model of `config_path` in f32 with eager attention and seeded random weights."""
    with open(config_path) as f:
        raw = json.load(f)
    # The encoder module always builds a vision tower; a minimal one keeps it out of the way
    # (the text path never touches it).
    raw.setdefault("vision_config", TINY_VISION)
    config = DiffusionGemmaConfig(**raw)
    config.text_config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = DiffusionGemmaForBlockDiffusion(config).float().eval()
    return model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    model = build(args.config)
    text = model.config.text_config
    c, v = model.config.canvas_length, text.vocab_size
    prompt = (torch.arange(args.prompt_len) * 7919 % v).unsqueeze(0)
    canvas = ((torch.arange(c) * 104729 + 13) % v).unsqueeze(0)
    sc = torch.randn(1, c, v) * 3.0
    with torch.no_grad():
        cache = DynamicCache(config=text)
        model.model.encoder(input_ids=prompt, past_key_values=cache)
        positions = torch.arange(args.prompt_len, args.prompt_len + c).unsqueeze(0)

        def forward(self_conditioning):
            return model(
                decoder_input_ids=canvas,
                past_key_values=cache,
                self_conditioning_logits=self_conditioning,
                decoder_position_ids=positions,
            ).logits

        for name, s in (("canvas_forward_sc", sc), ("canvas_forward_plain", None)):
            forward(s)  # warm-up
            times = []
            for _ in range(args.runs):
                t0 = time.perf_counter()
                forward(s)
                times.append(time.perf_counter() - t0)
            print(
                f"torch {torch.__version__} threads={args.threads} {name}: "
                f"median {statistics.median(times) * 1e3:.1f} ms, min {min(times) * 1e3:.1f} ms over {args.runs}"
            )


if __name__ == "__main__":
    main()

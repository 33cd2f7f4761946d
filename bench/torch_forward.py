"""transformers side of the canvas-forward benchmarks (eager attention, CPU or CUDA, f32 or bf16).

Builds DiffusionGemmaForBlockDiffusion from a config JSON with random weights, encodes a prompt
into a DynamicCache, then times one decoder forward of a full canvas with and without
self-conditioning logits: the work `cargo bench -p dg-cpu --bench canvas_forward` (CPU) and
`cargo xtask bench-gpu` (GPU) time on the dg side.

    python bench/torch_forward.py --config bench/configs/cpu-medium.json --threads 2 --prompt-len 256
    python bench/torch_forward.py --config bench/configs/real-6layer.json --device cuda --dtype float32 --prompt-len 1024
    python bench/torch_forward.py --config bench/configs/real-6layer.json --device cuda --dtype bfloat16 --prompt-len 1024
"""

import argparse
import json
import statistics
import time

import torch
import transformers
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


def build(config_path: str, device: str, dtype: torch.dtype) -> DiffusionGemmaForBlockDiffusion:
    """The model of `config_path` with eager attention and seeded random weights."""
    with open(config_path) as f:
        raw = json.load(f)
    # The encoder module always builds a vision tower; a minimal one keeps it out of the way
    # (the text path never touches it).
    raw.setdefault("vision_config", TINY_VISION)
    config = DiffusionGemmaConfig(**raw)
    config.text_config._attn_implementation = "eager"
    torch.manual_seed(0)
    with torch.device(device):
        model = DiffusionGemmaForBlockDiffusion(config).to(dtype).eval()
    return model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    # f32 means f32: no TF32 tensor-core shortcuts in matmuls.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dtype = getattr(torch, args.dtype)
    dev = torch.device(args.device)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    model = build(args.config, args.device, dtype)
    text = model.config.text_config
    c, v = model.config.canvas_length, text.vocab_size
    prompt = (torch.arange(args.prompt_len, device=dev) * 7919 % v).unsqueeze(0)
    canvas = ((torch.arange(c, device=dev) * 104729 + 13) % v).unsqueeze(0)
    sc = (torch.randn(1, c, v, device=dev) * 3.0).to(dtype)
    with torch.no_grad():
        cache = DynamicCache(config=text)
        model.model.encoder(input_ids=prompt, past_key_values=cache)
        positions = torch.arange(args.prompt_len, args.prompt_len + c, device=dev).unsqueeze(0)

        def forward(self_conditioning):
            return model(
                decoder_input_ids=canvas,
                past_key_values=cache,
                self_conditioning_logits=self_conditioning,
                decoder_position_ids=positions,
            ).logits

        def layer_times(layer_idx):
            """Median seconds of one decoder layer on a canvas-shaped hidden state."""
            decoder = model.model.decoder
            layer = decoder.layers[layer_idx]
            kind = text.layer_types[layer_idx]
            hidden = torch.randn(1, c, text.hidden_size, device=dev).to(dtype)
            pos_emb = decoder.rotary_emb(hidden, positions, kind)
            run = lambda: layer(hidden, position_embeddings=pos_emb, attention_mask=None, past_key_values=cache)
            run()
            sync()
            times = []
            for _ in range(args.runs):
                t0 = time.perf_counter()
                run()
                sync()
                times.append(time.perf_counter() - t0)
            return statistics.median(times), kind

        for i in sorted({0, len(text.layer_types) - 1}):
            t, kind = layer_times(i)
            print(f"  decoder layer {i} ({kind}): median {t * 1e3:.2f} ms")

        for name, s in (("canvas_forward_sc", sc), ("canvas_forward_plain", None)):
            forward(s)  # warm-up
            sync()
            times = []
            for _ in range(args.runs):
                t0 = time.perf_counter()
                forward(s)
                sync()
                times.append(time.perf_counter() - t0)
            where = torch.cuda.get_device_name() if dev.type == "cuda" else f"cpu threads={args.threads}"
            print(
                f"torch {torch.__version__} transformers {transformers.__version__} {where} {args.dtype} {name}: "
                f"median {statistics.median(times) * 1e3:.2f} ms, min {min(times) * 1e3:.2f} ms over {args.runs}"
            )


if __name__ == "__main__":
    main()

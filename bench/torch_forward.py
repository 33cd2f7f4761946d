"""transformers side of the canvas-forward benchmarks (eager attention, CPU or CUDA, f32 or bf16).

Builds DiffusionGemmaForBlockDiffusion from a config JSON with random weights, times the prefill
(the encoder over a prompt of `--prompt-len` tokens into a fresh DynamicCache), then times one
decoder forward of a full canvas against that cache with and without self-conditioning logits:
the work `cargo bench -p dg-cpu --bench canvas_forward` (CPU) and `cargo xtask bench-gpu` (GPU)
time on the dg side. `--compile` adds the same canvas forwards through `torch.compile` of the
model's forward (default mode): the first call, compilation included, is reported on its own and
only warm calls are timed.

    python bench/torch_forward.py --config bench/configs/cpu-medium.json --threads 2 --prompt-len 256
    python bench/torch_forward.py --config bench/configs/real-6layer.json --device cuda --dtype float32 --prompt-len 1024
    python bench/torch_forward.py --config bench/configs/real-6layer.json --device cuda --dtype bfloat16 --prompt-len 1024
    python bench/torch_forward.py --config bench/configs/real-6layer.json --device cuda --dtype bfloat16 --prompt-len 1024 --compile
"""

import argparse
import time

import torch
import transformers
from transformers.cache_utils import DynamicCache

from torch_model import TINY_VISION, build, median_seconds, prompt_ids, sync, where  # noqa: F401 (re-exported)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--compile", action="store_true", help="also time the canvas forward through torch.compile")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    # f32 means f32: no TF32 tensor-core shortcuts in matmuls.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dtype = getattr(torch, args.dtype)
    dev = torch.device(args.device)
    label = f"torch {torch.__version__} transformers {transformers.__version__} {where(dev, args.threads)} {args.dtype}"

    def report(name, median, least):
        print(f"{label} {name}: median {median * 1e3:.2f} ms, min {least * 1e3:.2f} ms over {args.runs}")

    model = build(args.config, args.device, dtype)
    text = model.config.text_config
    c, v = model.config.canvas_length, text.vocab_size
    prompt = prompt_ids(args.prompt_len, v, dev)
    canvas = ((torch.arange(c, device=dev) * 104729 + 13) % v).unsqueeze(0)
    sc = (torch.randn(1, c, v, device=dev) * 3.0).to(dtype)
    with torch.no_grad():
        # Prefill: the encoder over the prompt into a fresh cache (each run starts empty); the
        # last run's cache is the context of the canvas forwards below.
        last = [None]

        def prefill():
            last[0] = DynamicCache(config=text)
            model.model.encoder(input_ids=prompt, past_key_values=last[0])

        prefill()  # warm-up
        prefill_times = median_seconds(prefill, args.runs, dev)
        cache = last[0]
        positions = torch.arange(args.prompt_len, args.prompt_len + c, device=dev).unsqueeze(0)

        def forward(self_conditioning, fn=model):
            return fn(
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
            return median_seconds(run, args.runs, dev)[0], kind

        for i in sorted({0, len(text.layer_types) - 1}):
            t, kind = layer_times(i)
            print(f"  decoder layer {i} ({kind}): median {t * 1e3:.2f} ms")

        report(f"prefill_{args.prompt_len}tok", *prefill_times)
        for name, s in (("canvas_forward_sc", sc), ("canvas_forward_plain", None)):
            forward(s)  # warm-up
            report(name, *median_seconds(lambda: forward(s), args.runs, dev))

        if args.compile:
            compiled = torch.compile(model.forward)
            for name, s in (("canvas_forward_sc", sc), ("canvas_forward_plain", None)):
                # The first call compiles (a graph per self-conditioning variant); the second
                # catches any recompilation; only the calls after them are timed.
                sync(dev)
                t0 = time.perf_counter()
                forward(s, compiled)
                sync(dev)
                first = time.perf_counter() - t0
                forward(s, compiled)
                print(f"{label} {name}_compiled: compile + first call {first:.1f} s")
                report(f"{name}_compiled", *median_seconds(lambda: forward(s, compiled), args.runs, dev))


if __name__ == "__main__":
    main()

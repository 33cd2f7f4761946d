"""transformers side of the generate benchmark: HF `generate()` of DiffusionGemmaForBlockDiffusion
on seeded random weights for a config (eager attention, CPU or CUDA, f32 or bf16).

Every block runs all `--steps` denoising steps and EOS cannot end generation early, so each run
does the same work: one prefill (the encoder over the `--prompt-len`-token prompt), then per
canvas `--steps` decoder passes plus sampling, and an encoder pass that commits each canvas but
the last.

Prints, as medians over `--runs` after one warm-up run:
- prefill ms: the first encoder call of generate (the prompt), timed by hooks that synchronise
  the device around each encoder call;
- ms per denoising step: (total − all encoder calls) / decoder passes; a step is the decoder
  forward and the sampler's work on its logits (temperature, softmax, multinomial, entropy,
  acceptance, renoise);
- total generate ms and generated tokens per second (new tokens / total generate seconds).

    python bench/torch_generate.py --config bench/configs/real-6layer.json --device cuda --dtype f32
    python bench/torch_generate.py --config bench/configs/real-6layer.json --device cuda --dtype bf16
    python bench/torch_generate.py --config fixtures/sliding-long-prompt/config.json --prompt-len 16 --steps 3 --runs 1
"""

import argparse
import statistics
import time

import torch
import transformers

from torch_model import build, prompt_ids, sync, where


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="f32", choices=["f32", "bf16"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt-len", type=int, default=1024)
    parser.add_argument("--canvases", type=int, default=2)
    parser.add_argument("--steps", type=int, default=48)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    # f32 means f32: no TF32 tensor-core shortcuts in matmuls.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    dev = torch.device(args.device)

    model = build(args.config, args.device, dtype)
    c, v = model.config.canvas_length, model.config.text_config.vocab_size
    prompt = prompt_ids(args.prompt_len, v, dev)
    new_tokens = args.canvases * c
    gen_kwargs = dict(
        max_new_tokens=new_tokens,  # ceil(max_new_tokens / C) canvases, nothing truncated
        max_denoising_steps=args.steps,
        # Adaptive stopping off: with stability_threshold or confidence_threshold None,
        # `_prepare_diffusion_stopping_criteria` builds no StableAndConfidentStoppingCriteria, so
        # every block runs all max_denoising_steps (kwargs override the built-in defaults 1 and
        # 0.005, which are applied only to unset fields).
        stability_threshold=None,
        confidence_threshold=None,
        # EOS cannot fire: the only EOS id is V, outside [0, V) where the canvas init, the renoise
        # draws, multinomial and argmax all fall. The EOS check itself still runs on each canvas.
        eos_token_id=[v],
        return_dict_in_generate=True,
    )

    # Hooks: time every encoder call (device synchronised around it) and count decoder passes.
    # generate calls the encoder module (prefill, then one commit per canvas but the last) and
    # the decoder module once per denoising step.
    encoder_times, decoder_passes, started = [], [0], [0.0]

    def before_encoder(module, inputs):
        sync(dev)
        started[0] = time.perf_counter()

    def after_encoder(module, inputs, output):
        sync(dev)
        encoder_times.append(time.perf_counter() - started[0])

    def count_decoder(module, inputs, output):
        decoder_passes[0] += 1

    model.model.encoder.register_forward_pre_hook(before_encoder)
    model.model.encoder.register_forward_hook(after_encoder)
    model.model.decoder.register_forward_hook(count_decoder)

    def run(seed):
        encoder_times.clear()
        decoder_passes[0] = 0
        torch.manual_seed(seed)
        sync(dev)
        t0 = time.perf_counter()
        out = model.generate(input_ids=prompt, **gen_kwargs)
        sync(dev)
        total = time.perf_counter() - t0
        generated = out.sequences.shape[1] - args.prompt_len
        passes = decoder_passes[0]
        expected = args.canvases * args.steps
        assert generated == new_tokens, f"generated {generated} tokens, expected {new_tokens}"
        assert passes == expected, f"{passes} decoder passes, expected {expected}: a block stopped early"
        assert len(encoder_times) == args.canvases, f"{len(encoder_times)} encoder calls, expected {args.canvases}"
        return {
            "prefill": encoder_times[0],
            "commit": sum(encoder_times[1:]),
            "step": (total - sum(encoder_times)) / passes,
            "total": total,
            "tok_s": generated / total,
        }

    with torch.no_grad():
        run(0)  # warm-up
        results = [run(1 + i) for i in range(args.runs)]
    med = {k: statistics.median(r[k] for r in results) for k in results[0]}
    commits = args.canvases - 1
    print(
        f"torch {torch.__version__} transformers {transformers.__version__} {where(dev, args.threads)} {args.dtype} "
        f"generate: prompt {args.prompt_len}, {args.canvases} canvases of {c} ({new_tokens} new tokens), "
        f"{args.steps} steps per canvas, adaptive stopping and EOS off, median of {args.runs}"
    )
    print(f"  prefill (encoder over {args.prompt_len} prompt tokens): {med['prefill'] * 1e3:.2f} ms")
    if commits:
        print(f"  canvas commits (encoder over {c} tokens, {commits} of them): {med['commit'] * 1e3 / commits:.2f} ms each")
    print(
        f"  denoising step (decoder forward + sampler, {args.canvases * args.steps} passes): "
        f"{med['step'] * 1e3:.2f} ms per step"
    )
    print(f"  total generate: {med['total'] * 1e3:.1f} ms")
    print(f"  generated tokens per second: {med['tok_s']:.1f} ({new_tokens} tokens / total generate seconds)")


if __name__ == "__main__":
    main()

"""transformers side of the vision-tower benchmark: Gemma 4's vision tower (`Gemma4VisionModel`)
and its projection into the text model (`Gemma4MultimodalEmbedder`, what
`get_image_features` runs) on one image, at the real geometry (google/diffusiongemma-26B-A4B-it's
`vision_config`: 27 layers, hidden 1152, MLP 4304, 16 heads of 72, patch 16, 3x3 pooling, 2-D RoPE
with theta 100, position table 10240, standardized; projection into 2816) with random weights.

Each image is a grid of whole pooling blocks, no padding patches (the processor pads a batch up
to its budget; one image at its budget has none): 280 soft tokens are 20x14 (2520 patches), 1120
are 40x28 (10080 patches). Times are the median and min of `--runs` calls after `--warmup`, CUDA
synchronised around each.

    python bench/torch_tower.py --device cuda --dtype bfloat16                 # an H100: the real geometry
    python bench/torch_tower.py --device cpu --dtype float32 --tiny --tokens 6 # a check of the script on a CPU
"""

import argparse
import types

import torch
import transformers
from transformers.models.gemma4.configuration_gemma4 import Gemma4VisionConfig
from transformers.models.gemma4.modeling_gemma4 import Gemma4MultimodalEmbedder, Gemma4VisionModel

from torch_model import median_seconds, where

# google/diffusiongemma-26B-A4B-it's vision_config (docs of the model spec) and its text width.
REAL = {
    "hidden_size": 1152,
    "intermediate_size": 4304,
    "num_hidden_layers": 27,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "head_dim": 72,
    "patch_size": 16,
    "pooling_kernel_size": 3,
    "position_embedding_size": 10240,
    "standardize": True,
}
REAL_TEXT_HIDDEN = 2816
# A few-layer tower of the same kind, for checking the script where there is no GPU.
TINY = {**REAL, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 4, "head_dim": 16, "patch_size": 4, "position_embedding_size": 256}
TINY_TEXT_HIDDEN = 96
# Soft-token grids (width x height in soft tokens) of the budgets timed by default.
GRIDS = {6: (3, 2), 70: (10, 7), 280: (20, 14), 560: (28, 20), 1120: (40, 28)}


def build(spec: dict, text_hidden: int, device: torch.device, dtype: torch.dtype, attn: str):
    config = Gemma4VisionConfig(**spec)
    config._attn_implementation = attn
    torch.manual_seed(0)
    tower = Gemma4VisionModel._from_config(config, dtype=dtype).to(device).eval()
    # The standardization's buffers are left uninitialised by the constructor.
    with torch.no_grad():
        tower.std_bias.copy_(torch.randn_like(tower.std_bias) * 0.1)
        tower.std_scale.copy_(1.0 + torch.randn_like(tower.std_scale) * 0.1)
    embed = Gemma4MultimodalEmbedder(config, types.SimpleNamespace(hidden_size=text_hidden)).to(device=device, dtype=dtype).eval()
    torch.nn.init.normal_(embed.embedding_projection.weight, std=0.02)
    return tower, embed


def image(spec: dict, tokens: int, device: torch.device, dtype: torch.dtype):
    """`[1, P, 3*patch^2]` pixel values in [0, 1] and `[1, P, 2]` (x, y) patch positions of an image of
    `tokens` soft tokens (row-major over the patch grid, as the processor orders them)."""
    k, patch = spec["pooling_kernel_size"], spec["patch_size"]
    tw, th = GRIDS[tokens]
    w, h = tw * k, th * k
    ys, xs = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    positions = torch.stack([xs.flatten(), ys.flatten()], dim=-1).unsqueeze(0).to(device)
    g = torch.Generator().manual_seed(tokens)
    pixels = torch.rand(1, w * h, 3 * patch * patch, generator=g).to(device=device, dtype=dtype)
    return pixels, positions


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"], help="the tower's attention implementation")
    parser.add_argument("--tokens", type=int, nargs="+", default=[280, 1120], choices=sorted(GRIDS))
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tiny", action="store_true", help="a 2-layer tower of width 64 (checking the script)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev, dtype = torch.device(args.device), getattr(torch, args.dtype)
    spec, text_hidden = (TINY, TINY_TEXT_HIDDEN) if args.tiny else (REAL, REAL_TEXT_HIDDEN)
    tower, embed = build(spec, text_hidden, dev, dtype, args.attn)
    params = sum(p.numel() for p in tower.parameters()) + sum(p.numel() for p in embed.parameters())
    label = f"torch {torch.__version__} transformers {transformers.__version__} {where(dev, args.threads)} {args.dtype} {args.attn}"
    print(f"{label}: vision tower {'tiny' if args.tiny else 'real'} geometry, {params / 1e6:.1f} M parameters")
    for tokens in args.tokens:
        pixels, positions = image(spec, tokens, dev, dtype)

        @torch.no_grad()
        def run():
            soft = tower(pixel_values=pixels, pixel_position_ids=positions).last_hidden_state
            return embed(soft.to(dtype))

        out = run()
        assert out.shape[-2:] == (tokens, text_hidden), f"{tokens} soft tokens gave {tuple(out.shape)}"
        assert torch.isfinite(out).all(), f"{tokens} soft tokens: non-finite output"
        median_seconds(run, args.warmup, dev)
        median, least = median_seconds(run, args.runs, dev)
        patches = positions.shape[1]
        print(f"{label} tower {tokens} soft tokens ({patches} patches): median {median * 1e3:.2f} ms, min {least * 1e3:.2f} ms over {args.runs}")


if __name__ == "__main__":
    main()

"""The vision oracle fixture: a small random DiffusionGemma with a Gemma 4 vision tower, two test
images through transformers' processor and tower, and the logits of a canvas forward after a
prompt that holds both images.

Writes fixtures/vision-encoder/:
  config.json  model.safetensors          the random checkpoint (save_pretrained, F32)
  vision.safetensors                       per image i: image{i}_soft_tokens ([n, vision hidden],
                                           Gemma4VisionModel's output), image{i}_embeddings ([n, text
                                           hidden], after embed_vision); prompt_ids, canvas_ids and
                                           logits_image_prompt ([C, V]) of one canvas forward after
                                           encoding the image prompt
  vision.json                              versions, the images, budgets and prompt layout, and each
                                           tensor's f32-vs-f64 normwise gap (the oracle's own noise)

(Named vision.* so that the tools that walk every model fixture's reference.json pass it by.)
The images are the processor fixture's (fixtures/image-processor), resized by
`Gemma4ImageProcessorPil` with this tower's patch size. The reference is transformers in f32 (as
for the text fixtures); a float64 copy of the model measures how far f32 rounding alone moves it.

    python tools/oracle/make_vision_fixture.py [--out fixtures/vision-encoder]
"""

import argparse
import copy
import json
from pathlib import Path

import torch
import transformers
from safetensors.torch import save_file
from transformers.image_utils import load_image
from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

import forward_paths as fp
import model_builder as mb

SEED = 61
IMAGES = ("wide.png", "tall.png")
BUDGET = 70
IMAGE_TOKEN, BOI, EOI = 120, 121, 122
SPEC = {
    "canvas_length": 8,
    "text_config": {
        "vocab_size": 128,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "layer_types": [mb.SLIDING, mb.FULL],
        "sliding_window": 64,
        "num_experts": 4,
        "top_k_experts": 2,
        "moe_intermediate_size": 8,
        "intermediate_size": 48,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "global_head_dim": 16,
        "use_bidirectional_attention": "vision",
    },
    "vision_config": {
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "position_embedding_size": 64,
        "patch_size": 4,
        "pooling_kernel_size": 3,
        "standardize": True,
    },
}


def normwise(ours: torch.Tensor, ref: torch.Tensor) -> float:
    ours, ref = ours.double(), ref.double()
    return float((ours - ref).norm() / ref.norm())


def build_model():
    config = mb.build_config(SPEC, SEED)
    config.image_token_id, config.boi_token_id, config.eoi_token_id = IMAGE_TOKEN, BOI, EOI
    model = mb.construct_model(config)
    mb.randomize_weights(model, mb.InitScales.from_spec({"logit_scale": 1.0}), SEED)
    mb.randomize_vision_buffers(model, SEED + 1)
    return model


@torch.no_grad()
def tower_outputs(model, processed):
    encoder = model.model.encoder
    features = encoder.get_image_features(processed["pixel_values"], processed["image_position_ids"], return_dict=True)
    return features.last_hidden_state, features.pooler_output


def prompt_layout(counts):
    """Text, then per image <boi> n×<image> <eoi> and text after it."""
    ids = [5, 17, 33]
    for n in counts:
        ids += [BOI] + [IMAGE_TOKEN] * n + [EOI, 40, 41]
    return torch.tensor(ids, dtype=torch.int64)


@torch.no_grad()
def image_prompt_logits(model, prompt_ids, processed, canvas_ids, vision_mask=True):
    """Encode the image prompt, then one canvas forward. With `vision_mask`, the encoder's masks are
    built as `generate` builds them (`_prepare_encoder_inputs`: `create_masks_for_generate` with the
    image groups of `mm_token_type_ids`); the plain encoder forward computes that mapping and drops
    it (5.17), leaving the images causal, which `vision_mask=False` reproduces."""
    cache = fp.new_cache(model)
    ids = prompt_ids.unsqueeze(0)
    mm_token_type_ids = (ids == IMAGE_TOKEN).long()
    mask = None
    if vision_mask:
        mask = model.model.encoder.create_masks_for_generate(
            config=model.config,
            inputs_embeds=torch.empty((1, ids.shape[1], 0), dtype=model.dtype),
            attention_mask=torch.ones_like(ids),
            past_key_values=cache,
            position_ids=fp.positions(0, ids.shape[1]),
            mm_token_type_ids=mm_token_type_ids,
        )
    model.model.encoder(
        input_ids=ids,
        attention_mask=mask,
        pixel_values=processed["pixel_values"],
        image_position_ids=processed["image_position_ids"],
        mm_token_type_ids=mm_token_type_ids,
        position_ids=fp.positions(0, prompt_ids.numel()),
        past_key_values=cache,
    )
    return fp.decode(model, canvas_ids, prompt_ids.numel(), cache)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="fixtures/vision-encoder")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(SEED)
    images_dir = Path(__file__).resolve().parents[2] / "fixtures" / "image-processor"

    model = build_model()
    vision = SPEC["vision_config"]
    proc = Gemma4ImageProcessorPil(patch_size=vision["patch_size"], pooling_kernel_size=vision["pooling_kernel_size"], max_soft_tokens=BUDGET)
    processed = proc(images=[load_image(str(images_dir / name)) for name in IMAGES], return_tensors="pt")
    counts = [int(n) for n in processed["num_soft_tokens_per_image"]]

    model64 = copy.deepcopy(model).double()
    processed64 = {**processed, "pixel_values": processed["pixel_values"].double()}

    tensors, gaps = {}, {}
    soft, embedded = tower_outputs(model, processed)
    soft64, embedded64 = tower_outputs(model64, processed64)
    start = 0
    for i, n in enumerate(counts):
        for name, t32, t64 in (("soft_tokens", soft, soft64), ("embeddings", embedded, embedded64)):
            key = f"image{i}_{name}"
            tensors[key] = t32[start : start + n].contiguous()
            gaps[key] = normwise(tensors[key], t64[start : start + n])
        start += n

    prompt_ids = prompt_layout(counts)
    canvas_ids = torch.tensor([3, 9, 27, 81 % 128, 0, 1, 2, 100], dtype=torch.int64)
    logits = image_prompt_logits(model, prompt_ids, processed, canvas_ids)
    logits64 = image_prompt_logits(model64, prompt_ids, processed64, canvas_ids)
    tensors.update(prompt_ids=prompt_ids, canvas_ids=canvas_ids, logits_image_prompt=logits.float().contiguous())
    gaps["logits_image_prompt"] = normwise(logits, logits64)
    # The image spans' mask must matter: causal attention inside the images moves the logits.
    causal = image_prompt_logits(model, prompt_ids, processed, canvas_ids, vision_mask=False)
    gaps["logits_image_prompt_if_causal_within_images"] = normwise(causal, logits)

    model.save_pretrained(out)
    save_file(tensors, str(out / "vision.safetensors"))
    meta = {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "seed": SEED,
        "images": list(IMAGES),
        "max_soft_tokens": BUDGET,
        "soft_tokens_per_image": counts,
        "f32_vs_f64_normwise": gaps,
    }
    (out / "vision.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(json.dumps(meta, indent=2))


if __name__ == "__main__":
    main()

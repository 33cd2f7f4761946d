"""The image-prompt generate fixture: a small random DiffusionGemma with a Gemma 4 vision tower, a
Gemma-4-style tokenizer and DiffusionGemma's chat template (those of fixtures/converter-gemma4-vocab),
and transformers' `generate` on a chat prompt holding one image, every random draw recorded.

The prompt is what transformers' own pipeline makes: `Gemma4Processor.apply_chat_template` on
`[{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": ...}]}]` (the template
writes `<|image|>` where the image part is; the processor expands it to `<|image>`, one `<|image|>`
per soft token and `<image|>`), its `pixel_values`, `image_position_ids` and `mm_token_type_ids`
passed to `generate` as the processor returns them.

Writes fixtures/vision-generate/:
  config.json  generation_config.json  model.safetensors    the random checkpoint (BF16)
  tokenizer.json  tokenizer_config.json  chat_template.jinja a model directory dg runs as it is
  generate.safetensors                                       prompt_ids, gen_sequences, gen_draw_{i}
  generate.json                                              versions, image, budget, prompt text,
                                                             generation settings, draw kinds

(Named generate.* so that the tools that walk every model fixture's reference.json pass it by: the
replay needs the image.) A float64 copy of the model run with the same seed must give the same
sequence: the run's decisions are not within f32 rounding of flipping.

    python tools/oracle/make_vision_generate_fixture.py [--out fixtures/vision-generate]
"""

import argparse
import copy
import json
import shutil
import sys
import types
from pathlib import Path

import torch
import transformers
from PIL import Image
from safetensors.torch import save_file
from transformers import AutoTokenizer
from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil


def _without_torchvision():
    """processing_gemma4 imports the torchvision image processor's module for two names; the Pillow
    processor used here needs nothing of torchvision, so an empty stand-in lets it import."""
    try:
        import torchvision  # noqa: F401
    except ImportError:
        for name in ("torchvision", "torchvision.transforms", "torchvision.transforms.v2"):
            sys.modules[name] = types.ModuleType(name)
        functional = types.ModuleType("functional")
        functional.InterpolationMode = object  # only an annotation of the torchvision processor
        sys.modules["torchvision.transforms.v2"].functional = functional


_without_torchvision()
from transformers.models.gemma4.processing_gemma4 import Gemma4Processor  # noqa: E402


class ImageTextProcessor(Gemma4Processor):
    """Gemma4Processor with no audio feature extractor and no video processor (this prompt has
    neither; the video processor needs torchvision): everything else is transformers' own."""

    def check_argument_for_proper_class(self, argument_name, argument):
        if argument is None and argument_name in ("feature_extractor", "video_processor"):
            return None
        return super().check_argument_for_proper_class(argument_name, argument)

import generation as gn
import model_builder as mb

SEED = 62
IMAGE = "wide.png"
BUDGET = 70
PROMPT = "What is in this image?"
ROOT = Path(__file__).resolve().parents[2]
TOKENIZER_DIR = ROOT / "fixtures" / "converter-gemma4-vocab" / "hf"
GENERATION = {
    "max_new_tokens": 16,
    "max_denoising_steps": 8,
    "entropy_bound": 1.0,
    "t_min": 0.4,
    "t_max": 0.8,
    "stability_threshold": 1,
    "confidence_threshold": 0.005,
    "pad_token_id": 0,
}
SPEC = {
    "canvas_length": 8,
    "text_config": {
        "hidden_size": 16,
        "num_hidden_layers": 2,
        "layer_types": [mb.SLIDING, mb.FULL],
        "sliding_window": 64,
        "num_experts": 4,
        "top_k_experts": 2,
        "moe_intermediate_size": 8,
        "intermediate_size": 32,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 8,
        "global_head_dim": 8,
        "use_bidirectional_attention": "vision",
    },
    "vision_config": {
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "position_embedding_size": 128,
        "patch_size": 4,
        "pooling_kernel_size": 3,
        "standardize": True,
    },
}


def tokenizer_with_image_tokens():
    """The converter fixture's tokenizer, with the image tokens named as Gemma 4's tokenizer names them."""
    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER_DIR)
    tokenizer.image_token, tokenizer.boi_token, tokenizer.eoi_token = "<|image|>", "<|image>", "<image|>"
    tokenizer.image_token_id = tokenizer.convert_tokens_to_ids("<|image|>")
    tokenizer.audio_token, tokenizer.boa_token, tokenizer.eoa_token = "<|audio|>", "<|audio>", "<audio|>"
    tokenizer.audio_token_id = tokenizer.convert_tokens_to_ids("<|audio|>")
    return tokenizer


def build_model(tokenizer):
    spec = copy.deepcopy(SPEC)
    spec["text_config"]["vocab_size"] = len(tokenizer)
    config = mb.build_config(spec, SEED)
    ids = tokenizer.convert_tokens_to_ids
    config.image_token_id, config.boi_token_id, config.eoi_token_id = ids("<|image|>"), ids("<|image>"), ids("<image|>")
    model = mb.construct_model(config)
    mb.randomize_weights(model, mb.InitScales.from_spec({"logit_scale": 1.0}), SEED)
    mb.randomize_vision_buffers(model, SEED + 1)
    mb.round_to_bfloat16(model)  # a BF16 checkpoint (half the bytes); the oracle runs f32 on its values
    return model


def save_bfloat16(model, out):
    to_save = copy.deepcopy(model).to(torch.bfloat16)
    for sub_config in (to_save.config.text_config, to_save.config.vision_config):
        sub_config.dtype = torch.bfloat16  # .to() only updates the top-level dtype
    to_save.save_pretrained(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="fixtures/vision-generate")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(SEED)

    tokenizer = tokenizer_with_image_tokens()
    model = build_model(tokenizer)
    vision = SPEC["vision_config"]
    template = (TOKENIZER_DIR / "chat_template.jinja").read_text()
    image_processor = Gemma4ImageProcessorPil(
        patch_size=vision["patch_size"], pooling_kernel_size=vision["pooling_kernel_size"], max_soft_tokens=BUDGET
    )
    processor = ImageTextProcessor(
        feature_extractor=None, image_processor=image_processor, tokenizer=tokenizer, video_processor=None, chat_template=template
    )
    image = Image.open(ROOT / "fixtures" / "image-processor" / IMAGE)
    messages = [{"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": PROMPT}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    inputs = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt")
    prompt_ids = inputs["input_ids"][0]
    image_inputs = {k: inputs[k] for k in ("pixel_values", "image_position_ids", "mm_token_type_ids")}
    turn_end = tokenizer.convert_tokens_to_ids("<turn|>")
    gen = {**GENERATION, "eos_token_id": [tokenizer.eos_token_id, turn_end]}

    record = gn.run_generate(model, prompt_ids, gen, SEED, **image_inputs)
    model64 = copy.deepcopy(model).double()
    image64 = {**image_inputs, "pixel_values": image_inputs["pixel_values"].double()}
    record64 = gn.run_generate(model64, prompt_ids, gen, SEED, **image64)
    assert torch.equal(record.sequences, record64.sequences), "f64 generate differs: the run is within rounding of a flip"
    # Without the image (its soft tokens looked up as pad) the run differs: the image reaches the output.
    blind = gn.run_generate(model, prompt_ids, gen, SEED)
    assert not torch.equal(record.sequences, blind.sequences), "the image does not change the output"

    save_bfloat16(model, out)
    tokenizer.save_pretrained(out)
    for stale in ("chat_template.jinja", "special_tokens_map.json"):
        (out / stale).unlink(missing_ok=True)
    shutil.copy(TOKENIZER_DIR / "tokenizer_config.json", out / "tokenizer_config.json")
    shutil.copy(TOKENIZER_DIR / "tokenizer.json", out / "tokenizer.json")
    shutil.copy(TOKENIZER_DIR / "chat_template.jinja", out / "chat_template.jinja")
    (out / "generation_config.json").write_text(json.dumps({**gen, "transformers_version": transformers.__version__}, indent=2) + "\n")

    tensors = {"prompt_ids": prompt_ids, "gen_sequences": record.sequences}
    for i, draw in enumerate(record.draws):
        tensors[f"gen_draw_{i}"] = draw.ids
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "generate.safetensors"))
    new = record.sequences[prompt_ids.numel() :]
    meta = {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "seed": SEED,
        "image": IMAGE,
        "max_soft_tokens": BUDGET,
        "soft_tokens": int(inputs["mm_token_type_ids"].sum()),
        "prompt": PROMPT,
        "prompt_text": text,
        "canvas_length": SPEC["canvas_length"],
        "generation": gen,
        "draws": [d.kind for d in record.draws],
        "new_tokens": new.tolist(),
        "new_tokens_without_the_image": blind.sequences[prompt_ids.numel() :].tolist(),
    }
    (out / "generate.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(json.dumps({k: v for k, v in meta.items() if k != "draws"}, indent=2))


if __name__ == "__main__":
    main()

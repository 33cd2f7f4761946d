#!/usr/bin/env python3
"""Build a small random DiffusionGemma with a *Gemma-4-style* tokenizer, the input of the
``fixtures/gguf-gemma4-vocab`` fixture (whose GGUF llama.cpp's converter writes from it).

Usage:
    python tools/oracle/make_gemma4_vocab_model.py --out DIR [--chat-template FILE]

The directory is a complete HF model directory:

- ``config.json``, ``generation_config.json``, ``model.safetensors``: a 2-layer DiffusionGemma
  (one sliding, one full layer) with seeded random weights (``model_builder``), BF16.
- ``tokenizer.json``: Gemma 4's tokenizer layout (transformers' ``GemmaTokenizer``): BPE with
  ``byte_fallback``, the 256 ``<0xXX>`` byte tokens, a normalizer replacing spaces by ``▁``, the
  ``Split(" ", merged_with_previous)`` pre-tokenizer, the ``Replace("▁", " ")``, ``ByteFallback``,
  ``Fuse`` decoder, no prefix space, and a ``<bos>`` post-processor. Its merges are trained by the
  ``tokenizers`` package on the English and multi-script text in ``CORPUS`` below, written for
  this purpose; the alphabet is limited so that rarer characters fall back to bytes.
- The special tokens of Gemma 4 at its low ids (0 ``<pad>``, 1 ``<eos>``, 2 ``<bos>``, 3 ``<unk>``,
  4 ``<mask>``), then the turn, channel, tool, string-quote, thinking and media markers, then the
  byte tokens; every one is an added special token and is listed in ``tokenizer_config.json`` so
  that it is among transformers' ``all_special_ids`` (the converter types them by that).
- ``tokenizer_config.json`` and ``chat_template.jinja``: the template given with
  ``--chat-template`` (DiffusionGemma's own, which the ``trl`` package ships as
  ``trl/chat_templates/diffusion_gemma.jinja``), else the one found in the installed ``trl``.

The same script and package versions give the same bytes (single-threaded CPU run).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

sys.path.insert(0, str(Path(__file__).resolve().parent))

import generation as gn  # noqa: E402
import model_builder as mb  # noqa: E402
from presets import FULL, SLIDING  # noqa: E402

SEED = 24
VOCAB_TARGET = 1024
# Characters seen fewer times than this are left out of the training text, so that they take
# byte-fallback tokens (the trainer's own `limit_alphabet` breaks ties between equal counts at random).
RARE_BELOW = 3

SPECIALS = [
    "<pad>", "<eos>", "<bos>", "<unk>", "<mask>",
    "<|turn>", "<turn|>", "<|channel>", "<channel|>", "<|tool>", "<tool|>",
    "<|tool_call>", "<tool_call|>", "<|tool_response>", "<tool_response|>", '<|"|>', "<|think|>",
    "<|image>", "<image|>", "<|image|>", "<|audio>", "<audio|>", "<|audio|>", "<|video|>",
]
BYTES = [f"<0x{b:02X}>" for b in range(256)]
PAD, EOS, BOS = 0, 1, 2
TURN_END = SPECIALS.index("<turn|>")

SPEC = {
    "canvas_length": 16,
    "vision_config": None,
    "checkpoint_dtype": "bfloat16",
    "text_config": {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "layer_types": [SLIDING, FULL],
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "num_global_key_value_heads": 1,
        "head_dim": 16,
        "global_head_dim": 32,
        "sliding_window": 32,
        "max_position_embeddings": 2048,
        "num_experts": 4,
        "top_k_experts": 2,
        "moe_intermediate_size": 16,
        "use_bidirectional_attention": "vision",
    },
    "init": {"logit_scale": 1.5},
    "generation": {
        "max_new_tokens": 32,
        "max_denoising_steps": 4,
        "t_min": 0.4,
        "t_max": 0.8,
        "entropy_bound": 1.0,
        "stability_threshold": 1,
        "confidence_threshold": 0.005,
        "eos_token_id": [EOS, TURN_END],
        "pad_token_id": PAD,
    },
}

# Written for this tokenizer (no third-party text), dedicated to the public domain.
CORPUS = """
The morning was cold and clear, and the river ran quietly past the old stone bridge.
Hello, how are you today? I am well, thank you. The weather is nice and the sky is blue.
Why is the sky blue? Sunlight is scattered by the air, and blue light is scattered more than red light.
Please write a short story about a cat who lives in a lighthouse and watches the ships at night.
The function returns a list of numbers: def add(a, b): return a + b  # 1, 2, 3, 10, 42, 2026
    indented code keeps its spaces, and	tabs	separate	columns.
Spring brings green leaves, summer brings long days, autumn brings red leaves and winter brings snow.
Questions and answers, problems and solutions, beginnings and endings: stories are made of these.
Καλημέρα, ο ήλιος λάμπει πάνω από τη θάλασσα και τα πλοία φεύγουν από το λιμάνι.
Доброе утро, река течёт тихо мимо старого каменного моста, и дети идут в школу.
こんにちは、今日はいい天気ですね。川のそばで猫が寝ています。
你好，今天天气很好。我们在河边散步，看见一只小猫。
مرحبا، كيف حالك اليوم؟ الطقس جميل والسماء زرقاء.
नमस्ते, आज मौसम अच्छा है और आसमान नीला है।
Ünïcödé wörds: café, naïve, façade, Ångström, Zürich, São Paulo, Kraków, Dvořák.
Emoji: 🙂 🚀 🌍 ❤️ 👍🏽 and symbols ∑ ∞ ≠ → € £ ¥ © ®.
{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}
Line one
Line two

Line four after an empty line, then    four spaces and a trailing space 
"""


def train_tokenizer() -> Tokenizer:
    """The Gemma-4-style BPE tokenizer described in the module doc."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    # Train on words (spaces as a leading "▁"), as SentencePiece does; encode as Gemma 4 does.
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="never", split=True)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_TARGET,
        min_frequency=1,
        special_tokens=SPECIALS + BYTES,
        initial_alphabet=["\u2581", "\n", "\t"],
        show_progress=False,
    )
    counts = Counter(CORPUS * 3)
    lines = ["".join(c for c in line if counts[c] >= RARE_BELOW * 3) for line in CORPUS.strip("\n").split("\n")]
    tok.train_from_iterator(lines * 3 + ["\n".join(lines)], trainer=trainer)
    for i, name in enumerate(SPECIALS + BYTES):
        assert tok.token_to_id(name) == i, f"{name} is not at id {i}"
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous", invert=False)
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", BOS)])
    return tok


def write_tokenizer_files(tok: Tokenizer, template: str, out: Path) -> None:
    """tokenizer.json (byte tokens are vocabulary, not added tokens), tokenizer_config.json and
    chat_template.jinja."""
    data = json.loads(tok.to_str())
    data["added_tokens"] = [t for t in data["added_tokens"] if t["content"] in SPECIALS]
    (out / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False, indent=2) + "\n")
    config = {
        "tokenizer_class": "GemmaTokenizer",
        "bos_token": "<bos>",
        "eos_token": "<eos>",
        "pad_token": "<pad>",
        "unk_token": "<unk>",
        "mask_token": "<mask>",
        "extra_special_tokens": SPECIALS[5:],
        "add_bos_token": True,
        "add_eos_token": False,
        "model_max_length": SPEC["text_config"]["max_position_embeddings"],
        "padding_side": "left",
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False, indent=2) + "\n")
    (out / "chat_template.jinja").write_text(template)


def write_model(vocab_size: int, out: Path) -> None:
    """config.json, generation_config.json and model.safetensors (BF16)."""
    spec = json.loads(json.dumps(SPEC))
    spec["text_config"]["vocab_size"] = vocab_size
    config = mb.build_config(spec, SEED)
    config.eos_token_id = spec["generation"]["eos_token_id"]
    model = mb.construct_model(config)
    mb.randomize_weights(model, mb.InitScales.from_spec(spec["init"]), SEED)
    model.generation_config = gn.make_generation_config(spec["generation"])
    model = model.to(torch.bfloat16)
    model.config.text_config.dtype = torch.bfloat16
    model.save_pretrained(out)
    # The converter reads Gemma 4's `global_head_dim` / `num_global_key_value_heads` (transformers
    # up to 5.14 keeps them; later versions write `per_layer_config`, which 5.14 refuses).
    path = out / "config.json"
    saved = json.loads(path.read_text())
    text = saved["text_config"]
    del text["per_layer_config"]
    text["global_head_dim"] = spec["text_config"]["global_head_dim"]
    text["num_global_key_value_heads"] = spec["text_config"]["num_global_key_value_heads"]
    path.write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n")


def check(out: Path) -> None:
    """transformers' tokenizer of the directory encodes as the raw tokenizer.json and sees every
    special token as special; its chat template renders."""
    raw = Tokenizer.from_file(str(out / "tokenizer.json"))
    hf = transformers.AutoTokenizer.from_pretrained(str(out))
    sample = "Hello <|turn>user\nwörld 🙂\t  x<|\"|>"
    assert hf(sample)["input_ids"] == raw.encode(sample).ids, (hf(sample)["input_ids"], raw.encode(sample).ids)
    missing = [s for s in SPECIALS if raw.token_to_id(s) not in hf.all_special_ids]
    assert not missing, f"not among all_special_ids: {missing}"
    text = hf.apply_chat_template([{"role": "user", "content": "hello"}], add_generation_prompt=True, tokenize=False)
    print(f"chat template: {text!r} -> {raw.encode(text, add_special_tokens=False).ids}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="output directory (created; its files are replaced)")
    parser.add_argument("--chat-template", help="the chat template (default: trl's diffusion_gemma.jinja)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    if args.chat_template:
        template = Path(args.chat_template).read_text()
    else:
        import trl

        template = (Path(trl.__file__).parent / "chat_templates" / "diffusion_gemma.jinja").read_text()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer()
    vocab_size = tok.get_vocab_size(with_added_tokens=True)
    write_tokenizer_files(tok, template, out)
    write_model(vocab_size, out)
    size = sum(p.stat().st_size for p in out.iterdir() if p.is_file())
    print(f"wrote {out}: vocab {vocab_size}, {size} bytes")
    example = tok.encode("Hello, how are you? Καλημέρα 🙂")
    print(f"example -> {example.ids} {example.tokens}")
    check(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

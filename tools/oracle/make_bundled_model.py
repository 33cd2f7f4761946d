#!/usr/bin/env python3
"""Build ``models/tiny-random``: the small random DiffusionGemma that ``dg`` runs when no model is given.

Usage:
    python tools/oracle/make_bundled_model.py --out models/tiny-random

The directory is a complete HF model directory:

- ``config.json``, ``generation_config.json``, ``model.safetensors``: a 4-layer DiffusionGemma with seeded
  random weights (``model_builder``), saved in BF16 by ``save_pretrained``. Its text is noise.
- ``tokenizer.json``, ``tokenizer_config.json``: a byte-pair tokenizer (``tokenizers``) trained on the short
  English text in ``CORPUS`` below, written for this purpose, in Gemma 4's layout (transformers'
  ``GemmaTokenizer``: spaces become ``▁`` in the normalizer, no prefix space, the ``Split(" ")``
  pre-tokenizer, the ``Replace``/``ByteFallback``/``Fuse`` decoder, byte fallback on; the vocabulary
  has no ``<0xXX>`` tokens, so a character it lacks is ``<unk>``), which a GGUF file carries as
  llama.cpp's ``"gemma4"`` tokenizer. Special tokens sit at Gemma's ids:
  0 ``<pad>``, 1 ``<eos>``, 2 ``<bos>``, 3 ``<unk>``, 4 ``<mask>``; the turn markers ``<|turn>`` and ``<turn|>``
  follow at 5 and 6. The model's vocabulary is exactly the tokenizer's.
- ``chat_template.jinja``: Gemma's turn format, ``<bos><|turn>user\\n{content}<turn|>\\n<|turn>model\\n``.

The same script and package versions give the same bytes (single-threaded CPU run).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

sys.path.insert(0, str(Path(__file__).resolve().parent))

import generation as gn  # noqa: E402
import model_builder as mb  # noqa: E402
from presets import FULL, SLIDING  # noqa: E402

SEED = 20
VOCAB_TARGET = 1024
MAX_BYTES = 5 * 1024 * 1024

SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<|turn>", "<turn|>"]
PAD, EOS, BOS, TURN_END = 0, 1, 2, 6

# Rendered as transformers does (trim_blocks and lstrip_blocks on): a newline right after a block tag is
# dropped, so the only newlines in the output are the ones inside the turns.
CHAT_TEMPLATE = """{{ bos_token }}{% for message in messages %}
{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}
<|turn>{{ role }}
{{ message['content'] | trim }}<turn|>
{% endfor %}
{% if add_generation_prompt %}
<|turn>model
{% endif %}
"""
EXPECTED_CHAT = "<bos><|turn>user\nhello<turn|>\n<|turn>model\n"

SPEC = {
    "canvas_length": 32,
    "vision_config": None,
    "checkpoint_dtype": "bfloat16",
    "text_config": {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 4,
        "layer_types": [SLIDING, SLIDING, SLIDING, FULL],
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_global_key_value_heads": 1,
        "head_dim": 16,
        "global_head_dim": 32,
        "sliding_window": 64,
        "max_position_embeddings": 4096,
        "num_experts": 4,
        "top_k_experts": 2,
        "moe_intermediate_size": 32,
        "use_bidirectional_attention": "vision",
    },
    "init": {"logit_scale": 1.5},
    "generation": {
        "max_new_tokens": 64,
        "max_denoising_steps": 8,
        "t_min": 0.4,
        "t_max": 0.8,
        "entropy_bound": 1.0,
        "stability_threshold": 1,
        "confidence_threshold": 0.005,
        "eos_token_id": [EOS, TURN_END],
        "pad_token_id": PAD,
    },
}

# Plain English written for this tokenizer (no third-party text), dedicated to the public domain.
CORPUS = """
The morning was cold and clear, and the river ran quietly past the old stone bridge.
A small boat waited by the shore while the fisherman counted his nets, one, two, three, four, five.
Children walked to school along the narrow road, talking about the weather, their friends and their games.
The baker opened his shop before the sun was up, and the smell of fresh bread filled the whole street.
In the garden behind the house there were roses, beans, tomatoes, apples and a tall pear tree.
My grandmother kept a notebook where she wrote down every bird she saw: sparrows, crows, robins and owls.
The train left the station at seven o'clock and arrived in the city just after noon.
People in the market sold fish, cheese, honey, onions, carrots, potatoes, flowers and warm coffee.
When the wind changed, the clouds came in from the sea and it began to rain softly on the roofs.
The library was quiet. A student read a long book about history, mountains, islands and distant countries.
Light travels faster than sound, which is why we see lightning before we hear the thunder.
Water freezes at zero degrees and boils at one hundred degrees at the level of the sea.
The teacher asked a simple question: what is the difference between a number and a word?
One answer was that numbers count things, while words tell us what the things are and what they do.
Every evening the family sat together at the table, shared their food and told stories about the day.
The old clock on the wall stopped at midnight, and nobody in the house knew how to fix it.
A good letter begins with a greeting, explains one idea at a time and ends with kind words.
Hello, how are you today? I am well, thank you. The weather is nice and the sky is blue.
Please write a short story about a cat who lives in a lighthouse and watches the ships at night.
Why is the sky blue? Sunlight is scattered by the air, and blue light is scattered more than red light.
The machine reads the words of a question, thinks about them for a moment and writes an answer.
Small models can learn simple patterns, but they need much more text to write good sentences.
Spring brings green leaves, summer brings long days, autumn brings red leaves and winter brings snow.
The map showed roads, rivers, forests, villages, hills and a lake shaped like a long silver spoon.
She opened the window, listened to the birds and decided that it was a perfect day for a walk.
He carried a heavy bag of books up the stairs, sat down at his desk and began to work.
Questions and answers, problems and solutions, beginnings and endings: stories are made of these.
The doctor said that good sleep, clean water, fresh food and daily walks keep the body strong.
At the harbour the sailors mended their sails, painted their boats and waited for the tide.
Mathematics studies numbers, shapes, patterns and change; music studies sound, rhythm and time.
Our neighbour builds chairs and tables from wood; his workshop smells of pine and polish.
If you want to learn a language, read a little every day, speak with friends and never be afraid of mistakes.
The moon rose over the hills, and the village slept under a sky full of bright and silent stars.
"""


def train_tokenizer() -> Tokenizer:
    """A BPE tokenizer in Gemma 4's layout with Gemma's low special ids and a ``<bos>`` post-processor.

    The merges are learned word by word (Metaspace), then the tokenizer takes Gemma 4's parts; since
    no merge spans a ``▁``, it splits text into the same words."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
    alphabet = [chr(c) for c in range(32, 127)] + ["\n", "\u2581"]
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_TARGET,
        min_frequency=1,
        special_tokens=SPECIALS,
        initial_alphabet=alphabet,
        show_progress=False,
    )
    lines = [line for line in CORPUS.strip().split("\n") if line]
    tok.train_from_iterator(lines, trainer=trainer)
    for i, name in enumerate(SPECIALS):
        assert tok.token_to_id(name) == i, f"{name} is not at id {i}"
    tok.model.byte_fallback = True
    tok.model.fuse_unk = True
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous", invert=False)
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", BOS)]
    )
    return tok


def write_tokenizer_files(tok: Tokenizer, out: Path) -> None:
    """tokenizer.json, tokenizer_config.json and chat_template.jinja."""
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<bos>",
        "eos_token": "<eos>",
        "pad_token": "<pad>",
        "unk_token": "<unk>",
        "mask_token": "<mask>",
        "model_max_length": SPEC["text_config"]["max_position_embeddings"],
        "padding_side": "left",
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)


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


def check_chat_template(out: Path) -> None:
    """transformers' own rendering of the template must give Gemma's turn format."""
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(out))
    text = hf_tok.apply_chat_template(
        [{"role": "user", "content": "hello"}], add_generation_prompt=True, tokenize=False
    )
    assert text == EXPECTED_CHAT, repr(text)
    print(f"chat template: {text!r} -> {hf_tok(text, add_special_tokens=False)['input_ids']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="output directory (created; its files are replaced)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer()
    vocab_size = tok.get_vocab_size(with_added_tokens=True)
    write_tokenizer_files(tok, out)
    write_model(vocab_size, out)
    size = sum(p.stat().st_size for p in out.iterdir() if p.is_file())
    print(f"wrote {out}: vocab {vocab_size}, {size} bytes")
    example = tok.encode("Hello, how are you?")
    print(f"'Hello, how are you?' -> {example.ids} {example.tokens}")
    check_chat_template(out)
    if size > MAX_BYTES:
        raise SystemExit(f"{out} is {size} bytes (> {MAX_BYTES})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

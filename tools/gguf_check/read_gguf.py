#!/usr/bin/env python3
"""Reads a GGUF file with gguf-py (ggml's own `gguf` package, `gguf.GGUFReader`) and checks it.

Prints the architecture, the metadata keys and one line per tensor (name, type, shape in ggml
order, bytes). Checks what a reader of dg's files relies on: the magic and version gguf-py accepts,
`general.architecture` is `diffusion-gemma`, every tensor's type is one dg reads, its byte count
matches its type and shape, and its data lies at a multiple of the alignment.

With `--dg-info FILE` (the output of `dg info --json --model FILE.gguf`), also checks that gguf-py
sees exactly the tensors, types and shapes dg reports: the two readers agree.

With `--tokenizer DIR` (the HF model directory the file was written from), also checks the
tokenizer the file carries is the one llama.cpp's converter writes from DIR (`Gemma4Model.set_vocab`):
`tokenizer.ggml.model` "gemma4", the tokens of DIR's `tokenizer.json` by id, score -1000 each, their
types (byte for `<0xXX>`, control for the special tokens, user-defined for the converter's rendered
ones, normal otherwise), and the merges, special ids, `add_bos_token` / `add_eos_token` and chat
template that gguf-py's own `SpecialVocab` reads from DIR; `add_space_prefix` false.

    python3 tools/gguf_check/read_gguf.py model.gguf [--dg-info info.json] [--tokenizer DIR]
"""

import argparse
import json
import sys

import re
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGMLQuantizationType, SpecialVocab, TokenType
from gguf.constants import GGML_QUANT_SIZES

# The ggml types dg reads (dg_model::StoredDtype).
DG_TYPES = {"F32", "F16", "BF16", "Q8_0", "Q5_0", "Q4_K", "Q6_K"}


def field_value(reader, key):
    field = reader.get_field(key)
    if field is None:
        return None
    return field.contents()


# The special tokens llama.cpp's converter marks user-defined (`Gemma4Model.set_vocab`).
RENDERED = {"<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", "<|tool_response>", "<tool_response|>", '<|"|>'}


def check_tokenizer(reader, directory: Path) -> list[str]:
    """The file's tokenizer against what the converter writes from `directory`."""
    errors = []
    tok = json.loads((directory / "tokenizer.json").read_text(encoding="utf-8"))
    by_id = {i: t for t, i in tok["model"]["vocab"].items()}
    special = set()
    for a in tok.get("added_tokens", []):
        by_id[a["id"]] = a["content"]
        if a.get("special"):
            special.add(a["content"])
    tokens = [by_id[i] for i in range(len(by_id))]

    def token_type(t):
        if t in RENDERED:
            return TokenType.USER_DEFINED
        if t in special:
            return TokenType.CONTROL
        if re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", t):
            return TokenType.BYTE
        return TokenType.NORMAL

    sv = SpecialVocab(directory, load_merges=True)
    want = {
        "tokenizer.ggml.model": "gemma4",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": [-1000.0] * len(tokens),
        "tokenizer.ggml.token_type": [int(token_type(t)) for t in tokens],
        "tokenizer.ggml.merges": sv.merges,
        "tokenizer.ggml.add_bos_token": sv.add_special_token.get("bos", True),
        "tokenizer.ggml.add_eos_token": sv.add_special_token.get("eos", False),
        "tokenizer.ggml.add_space_prefix": False,
        "tokenizer.chat_template": sv.chat_template,
    }
    names = {"bos": "bos", "eos": "eos", "unk": "unknown", "pad": "padding", "mask": "mask", "sep": "seperator", "cls": "cls"}
    for typ, tid in sv.special_token_ids.items():
        want[f"tokenizer.ggml.{names[typ]}_token_id"] = tid
    for key, value in want.items():
        got = field_value(reader, key)
        if got != value:
            shown = (lambda v: f"{len(v)} entries, first {v[:4]}" if isinstance(v, list) else repr(v)[:80])
            errors.append(f"{key}: the file has {shown(got)}, the converter writes {shown(value)}")
    print(f"tokenizer: {len(tokens)} tokens, {len(sv.merges)} merges, special ids {sv.special_token_ids}"
          + (" as the converter writes them" if not errors else ""))
    return errors


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("file")
    parser.add_argument("--dg-info", help="`dg info --json` output for the same file, to compare with")
    parser.add_argument("--tokenizer", help="the HF model directory the file was written from, to compare its tokenizer with")
    args = parser.parse_args()

    reader = GGUFReader(args.file)
    errors = []
    arch = field_value(reader, "general.architecture")
    alignment = field_value(reader, "general.alignment") or 32
    print(f"{args.file}: architecture {arch}, {len(reader.fields)} metadata keys, {len(reader.tensors)} tensors, alignment {alignment}")
    if arch != "diffusion-gemma":
        errors.append(f"general.architecture is {arch!r}, not 'diffusion-gemma'")
    for name in reader.fields:
        if not name.startswith("GGUF."):
            print(f"  meta {name} = {field_value(reader, name)!r}"[:160])

    seen = {}
    for t in reader.tensors:
        type_name = GGMLQuantizationType(t.tensor_type).name
        dims = [int(d) for d in t.shape]  # ggml order: dims[0] varies fastest
        block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(t.tensor_type)]
        elements = int(np.prod(dims))
        want_bytes = elements // block * block_bytes
        print(f"  {t.name:<44} {type_name:<5} {str(dims):<18} {int(t.n_bytes)} bytes")
        if type_name not in DG_TYPES:
            errors.append(f"{t.name}: type {type_name} is not one dg reads")
        if dims[0] % block != 0 or int(t.n_bytes) != want_bytes:
            errors.append(f"{t.name}: {t.n_bytes} bytes for {type_name} {dims}, expected {want_bytes}")
        if t.data_offset % alignment != 0:
            errors.append(f"{t.name}: data at {t.data_offset}, not a multiple of {alignment}")
        if type_name in ("F32", "F16") and tuple(t.data.shape) != tuple(reversed(dims)):
            errors.append(f"{t.name}: gguf-py's array has shape {t.data.shape}, the dims reversed are {tuple(reversed(dims))}")
        if type_name in ("F32", "F16") and not np.all(np.isfinite(t.data)):
            errors.append(f"{t.name}: values that are not finite")
        seen[t.name] = (type_name, list(reversed(dims)))

    if args.dg_info:
        with open(args.dg_info, encoding="utf-8") as f:
            info = json.load(f)
        dg = {t["gguf_name"]: (t["dtype"], t["shape"]) for t in info["checkpoint"]["tensors"]}
        for name, (dtype, shape) in dg.items():
            if name not in seen:
                errors.append(f"dg reads {name}, gguf-py does not see it")
            elif seen[name] != (dtype, shape):
                errors.append(f"{name}: dg says {dtype} {shape}, gguf-py {seen[name][0]} {seen[name][1]}")
        extra = sorted(set(seen) - set(dg) - {"rope_freqs.weight"})
        if extra:
            errors.append(f"gguf-py sees tensors dg does not read: {extra}")
        print(f"dg and gguf-py agree on {len(dg)} tensors" if not errors else "dg and gguf-py disagree")

    if args.tokenizer:
        errors += check_tokenizer(reader, Path(args.tokenizer))

    for e in errors:
        print(f"ERROR {e}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())

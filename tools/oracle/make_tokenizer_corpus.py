#!/usr/bin/env python3
"""The tokenizer corpus of ``fixtures/converter-gemma4-vocab`` and what HF computes on it.

Usage:
    python tools/oracle/make_tokenizer_corpus.py [--fixture fixtures/converter-gemma4-vocab] [--verify]

Writes, beside the fixture's ``hf/`` directory:

- ``corpus.jsonl``: one JSON string a line (the texts hold newlines): at least 2,000 texts drawn
  from a seeded mix of English, Greek, Cyrillic, CJK, Korean, Arabic, Hebrew, Devanagari and Thai
  words, emoji (skin tones, ZWJ sequences, flags), combining marks, characters the vocabulary lacks
  (byte fallback: control characters, zero-width and private-use characters, astral-plane
  letters), runs of spaces, tabs and newlines, every special token and near-misses of them; plus
  every special token alone, every ASCII character alone, and chat prompts rendered by the
  fixture's chat template (``chat.jsonl``).
- ``hf_tokens.jsonl``: for each corpus line, what the python ``tokenizers`` package computes from
  ``hf/tokenizer.json``: ``ids`` (``encode(text)``, with the ``<bos>`` post-processor; without it
  the same ids but the first), ``decoded`` (``decode(ids)``, special tokens skipped) and
  ``decoded_all`` (``skip_special_tokens=False``).
- ``chat.jsonl``: conversations (``messages``: role and content) and the prompt transformers'
  ``apply_chat_template`` renders for each with ``add_generation_prompt=True``.

``--verify`` recomputes everything and fails when a committed file differs. Only ``tokenizers`` and
``transformers`` (for the chat template, with jinja2) are needed; the output is deterministic.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

from tokenizers import Tokenizer

SEED = 7
LINES = 2000

WORDS = {
    "en": "the quick brown fox jumps over a lazy dog while river light morning cold clear bridge weather "
    "question answer number story garden library station market teacher doctor harbour music".split(),
    "el": "καλημέρα ήλιος θάλασσα πλοία λιμάνι νερό φως βιβλίο δάσκαλος ερώτηση".split(),
    "ru": "доброе утро река тихо мимо старого каменного моста дети школу".split(),
    "ja": "こんにちは 今日 天気 川 猫 寝ています 東京 ありがとう".split(),
    "zh": "你好 今天 天气 很好 我们 河边 散步 小猫 中文 字符".split(),
    "ko": "안녕하세요 오늘 날씨 좋아요 고양이 강".split(),
    "ar": "مرحبا كيف حالك اليوم الطقس جميل السماء زرقاء".split(),
    "he": "שלום מה שלומך היום מזג האוויר".split(),
    "hi": "नमस्ते आज मौसम अच्छा है आसमान नीला".split(),
    "th": "สวัสดี วันนี้ อากาศ ดี มาก".split(),
    "mixed": "café naïve façade Ångström Zürich São Kraków Dvořák Ünïcödé crème".split(),
    "code": ["def", "add(a,", "b):", "return", "a", "+", "b", "{}", "[1,", "2]", "x==y", "i++", "//", "#", "0x1F", "3.14", "2026", "-42"],
}
EMOJI = ["🙂", "🚀", "🌍", "❤️", "👍🏽", "👩‍💻", "👨‍👩‍👧", "🇫🇷", "🇯🇵", "🤖", "✅", "🎉", "😀😀", "∑", "∞", "≠", "→", "€", "£", "¥", "©", "®"]
RARE = ["\x00", "\x01", "\x07", "\x1b", "\x7f", "\u200b", "\u200d", "\u00ad", "\ufeff", "\ue000", "\ufffd",
        "𝔘", "𐍈", "𓀀", "ǅ", "ﬁ", "e\u0301", "a\u0308\u0323", "Ⅻ", "½", "²", "\u2028", "\u00a0", "\u3000"]
SPACES = [" ", " ", " ", "  ", "   ", "    ", "\t", "\t\t", "\n", "\n\n", "\r\n", " \n", "\n ", " \t ", "\u2581", "▁▁"]


def specials(tok: Tokenizer) -> list[str]:
    """The added tokens of the tokenizer, in id order."""
    added = tok.get_added_tokens_decoder()
    return [added[i].content for i in sorted(added)]


def near_misses(names: list[str]) -> list[str]:
    """Strings that look like special tokens but are not one."""
    out = []
    for s in names:
        out += [s[:-1], s[1:], s.upper(), " " + s, s + " ", s.replace("|", "||"), s[0] + " " + s[1:]]
    return out


def random_text(rng: random.Random, names: list[str]) -> str:
    pools = list(WORDS.values())
    parts = []
    for _ in range(rng.randint(1, 12)):
        r = rng.random()
        if r < 0.55:
            parts.append(rng.choice(rng.choice(pools)))
        elif r < 0.65:
            parts.append(rng.choice(EMOJI))
        elif r < 0.75:
            parts.append(rng.choice(RARE))
        elif r < 0.85:
            parts.append(rng.choice(names))
        elif r < 0.9:
            parts.append(rng.choice(near_misses(names)))
        else:
            parts.append(rng.choice(WORDS["en"]).capitalize() + rng.choice([".", ",", "?", "!", ":", ";", "'s", "..."]))
        parts.append(rng.choice(SPACES) if rng.random() < 0.8 else "")
    text = "".join(parts)
    if rng.random() < 0.2:
        text = rng.choice(SPACES) + text
    if rng.random() < 0.2:
        text = text.rstrip() if rng.random() < 0.5 else text
    return text


def conversations(rng: random.Random) -> list[list[dict[str, str]]]:
    """Conversations of system, user and assistant turns (what `dg` renders)."""
    out: list[list[dict[str, str]]] = [
        [{"role": "user", "content": "hello"}],
        [{"role": "user", "content": "  Why is the sky blue?  "}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Καλημέρα 🙂"}],
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello! How can I help?"}, {"role": "user", "content": "Tell me a story.\n\nMake it short."}],
    ]
    pools = list(WORDS.values())
    for _ in range(46):
        turns = []
        if rng.random() < 0.3:
            turns.append({"role": "system", "content": " ".join(rng.choice(rng.choice(pools)) for _ in range(rng.randint(1, 6)))})
        for i in range(rng.randint(1, 3) * 2 - 1):
            role = "user" if i % 2 == 0 else "assistant"
            words = [rng.choice(rng.choice(pools)) for _ in range(rng.randint(1, 10))]
            if rng.random() < 0.2:
                words.append(rng.choice(EMOJI))
            turns.append({"role": role, "content": rng.choice([" ", "\n", "  "]).join(words)})
        out.append(turns)
    return out


def render(hf_dir: Path, convs: list[list[dict[str, str]]]) -> list[dict]:
    import transformers

    transformers.logging.set_verbosity_error()
    hf = transformers.AutoTokenizer.from_pretrained(str(hf_dir))
    return [
        {"messages": c, "text": hf.apply_chat_template(c, add_generation_prompt=True, tokenize=False)}
        for c in convs
    ]


def build(fixture: Path) -> dict[str, list[str]]:
    tok = Tokenizer.from_file(str(fixture / "hf" / "tokenizer.json"))
    names = specials(tok)
    rng = random.Random(SEED)
    chat = render(fixture / "hf", conversations(rng))
    corpus = [""] + names + [chr(c) for c in range(1, 128)] + [" ".join(names), "".join(names)]
    corpus += [c["text"] for c in chat]
    corpus += ["<|turn>user\n" + random_text(rng, names) + "<turn|>\n<|turn>model\n" for _ in range(50)]
    while len(corpus) < LINES + 400:
        corpus.append(random_text(rng, names))
    expected = []
    for text in corpus:
        ids = tok.encode(text).ids
        assert tok.encode(text, add_special_tokens=False).ids == ids[1:]
        expected.append({
            "ids": ids,
            "decoded": tok.decode(ids, skip_special_tokens=True),
            "decoded_all": tok.decode(ids, skip_special_tokens=False),
        })
    dumps = lambda v: json.dumps(v, ensure_ascii=False, separators=(",", ":"))  # noqa: E731
    return {
        "corpus.jsonl": [dumps(t) for t in corpus],
        "hf_tokens.jsonl": [dumps(e) for e in expected],
        "chat.jsonl": [dumps(c) for c in chat],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fixture", default="fixtures/converter-gemma4-vocab")
    parser.add_argument("--verify", action="store_true", help="compare with the committed files instead of writing")
    args = parser.parse_args(argv)
    fixture = Path(args.fixture)
    files = build(fixture)
    bad = []
    for name, lines in files.items():
        text = "\n".join(lines) + "\n"
        path = fixture / name
        if args.verify:
            if not path.is_file() or path.read_text(encoding="utf-8") != text:
                bad.append(name)
        else:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path}: {len(lines)} lines")
    if bad:
        print(f"differ from what the script computes: {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

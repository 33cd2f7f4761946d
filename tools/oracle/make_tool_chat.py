"""Conversations with tools, tool calls, tool responses and the reasoning channel, and the prompt
transformers' ``apply_chat_template`` renders for each with DiffusionGemma's chat template.

Usage::

    python tools/oracle/make_tool_chat.py [--out fixtures/chat-tools/conversations.jsonl] [--verify]

The template is the one ``fixtures/converter-gemma4-vocab/hf`` carries (``chat_template.jinja``,
byte-identical to ``trl/chat_templates/diffusion_gemma.jinja`` of the ``trl`` package 1.16.0); the
tokenizer of that directory gives ``bos_token``. Each line of the output is one case:
``messages``, ``tools`` (or null), ``kwargs`` (template variables such as ``enable_thinking``),
``add_generation_prompt`` and ``text``, what transformers renders. Tool-call arguments are objects,
as the template requires (an OpenAI client sends a JSON string; ``dg serve`` decodes it first, as
vLLM does).

Needs only ``transformers`` (5.17.0) and ``jinja2``: rendering with ``tokenize=False`` runs no
model. ``--verify`` re-renders and fails when the committed file differs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

TEMPLATE_DIR = Path("fixtures/converter-gemma4-vocab/hf")

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city's name."},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "description": "How many days ahead.", "nullable": True},
            },
            "required": ["city"],
        },
    },
}

SEARCH = {
    "type": "function",
    "function": {
        "name": "search_files",
        "description": "Find files whose text matches a pattern.",
        "parameters": {
            "type": "object",
            "properties": {
                "pattern": {"type": "string"},
                "paths": {"type": "array", "items": {"type": "string"}, "description": "Where to look."},
                "options": {
                    "type": "object",
                    "properties": {
                        "case_sensitive": {"type": "boolean"},
                        "max_results": {"type": "number", "description": "At most this many."},
                    },
                    "required": ["case_sensitive"],
                },
                "filters": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {"glob": {"type": "string"}, "exclude": {"type": "boolean"}},
                        "required": ["glob"],
                    },
                },
            },
            "required": ["pattern"],
        },
    },
}

NO_PARAMS = {"type": "function", "function": {"name": "current_time", "description": "The time now, in UTC."}}
NO_DESCRIPTION = {
    "type": "function",
    "function": {"name": "echo", "parameters": {"type": "object", "properties": {"text": {"type": "string"}}}},
}

ASK = {"role": "user", "content": "What is the weather in Paris?"}


def call(id_: str, name: str, arguments: dict | None) -> dict:
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": arguments}}


def calls(*items: dict, content: str | None = None, **extra) -> dict:
    return {"role": "assistant", "content": content, "tool_calls": list(items), **extra}


def tool(id_: str, content, **extra) -> dict:
    return {"role": "tool", "tool_call_id": id_, "content": content, **extra}


NESTED_ARGS = {
    "pattern": 'say "hi" <|"|> or \\n',
    "paths": ["src/", "docs/é", ""],
    "options": {"case_sensitive": False, "max_results": 10, "ratio": 2.5, "none": None},
    "filters": [{"glob": "*.rs", "exclude": True}, {"glob": "日本語/*", "exclude": False}],
    "empty": {},
    "list": [],
    "neg": -3,
}


def cases() -> list[dict]:
    """(name, messages, tools, kwargs, add_generation_prompt) of every case."""
    weather_call = call("call_1", "get_weather", {"city": "Paris", "unit": "celsius"})
    answer = {"role": "assistant", "content": "It is 18 degrees and sunny in Paris."}
    out = [
        ("plain", [ASK], None, {}, True),
        ("plain thinking", [ASK], None, {"enable_thinking": True}, True),
        ("system", [{"role": "system", "content": " Be brief. "}, ASK], None, {}, True),
        ("developer thinking", [{"role": "developer", "content": "Be brief."}, ASK], None, {"enable_thinking": True}, True),
        ("tools", [ASK], [WEATHER], {}, True),
        ("tools thinking", [ASK], [WEATHER, SEARCH], {"enable_thinking": True}, True),
        ("tools system", [{"role": "system", "content": "You call tools."}, ASK], [WEATHER, NO_PARAMS, NO_DESCRIPTION], {}, True),
        ("tools nested schema", [{"role": "user", "content": "Find TODOs."}], [SEARCH], {}, True),
        ("call then response", [ASK, calls(weather_call), tool("call_1", "18 C, sunny")], [WEATHER], {}, True),
        (
            "call then response thinking",
            [ASK, calls(weather_call), tool("call_1", "18 C, sunny")],
            [WEATHER],
            {"enable_thinking": True},
            True,
        ),
        ("call without generation prompt", [ASK, calls(weather_call)], [WEATHER], {}, False),
        (
            "call response answer",
            [ASK, calls(weather_call), tool("call_1", "18 C, sunny"), answer],
            [WEATHER],
            {},
            True,
        ),
        (
            "multi-turn",
            [
                ASK,
                calls(weather_call),
                tool("call_1", "18 C, sunny"),
                answer,
                {"role": "user", "content": "And in Tokyo, in fahrenheit?"},
                calls(call("call_2", "get_weather", {"city": "Tokyo", "unit": "fahrenheit"})),
                tool("call_2", '{"temperature": 64, "sky": "rain"}'),
            ],
            [WEATHER],
            {},
            True,
        ),
        (
            "parallel calls",
            [
                {"role": "user", "content": "Weather in Paris and Rome?"},
                calls(weather_call, call("call_9", "get_weather", {"city": "Rome"})),
                tool("call_1", "18 C"),
                tool("call_9", "25 C"),
            ],
            [WEATHER],
            {},
            True,
        ),
        (
            "nested arguments",
            [{"role": "user", "content": "Find TODOs."}, calls(call("c", "search_files", NESTED_ARGS)), tool("c", "3 matches")],
            [SEARCH],
            {},
            True,
        ),
        (
            "empty and null arguments",
            [
                {"role": "user", "content": "Time?"},
                calls(call("a", "current_time", {}), call("b", "current_time", None)),
                tool("a", "12:00"),
                tool("b", "12:00"),
            ],
            [NO_PARAMS],
            {},
            True,
        ),
        (
            "float arguments",
            [
                {"role": "user", "content": "Scale it."},
                calls(call("f", "search_files", {"tiny": 1e-07, "huge": 1e20, "tenth": 0.1, "neg": -2.5e-05, "whole": 3.0, "int": 12345678901234})),
                tool("f", "done"),
            ],
            [SEARCH],
            {},
            True,
        ),
        (
            "call with reasoning after the last user",
            [ASK, calls(weather_call, reasoning_content="The user wants Paris."), tool("call_1", "18 C")],
            [WEATHER],
            {"enable_thinking": True},
            True,
        ),
        (
            "reasoning before the last user is dropped",
            [
                ASK,
                {"role": "assistant", "content": "Sunny.", "reasoning_content": "Easy."},
                {"role": "user", "content": "Thanks!"},
            ],
            None,
            {"enable_thinking": True},
            True,
        ),
        (
            "thinking stripped from content",
            [ASK, {"role": "assistant", "content": "<|channel>thought\nhmm<channel|>Sunny."}, {"role": "user", "content": "ok"}],
            None,
            {},
            True,
        ),
        (
            "content before a call",
            [ASK, calls(weather_call, content="Let me check."), tool("call_1", "18 C")],
            [WEATHER],
            {},
            True,
        ),
        (
            "tool content parts",
            [ASK, calls(weather_call), tool("call_1", [{"type": "text", "text": "18 C, "}, {"type": "text", "text": "sunny"}])],
            [WEATHER],
            {},
            True,
        ),
        (
            "tool response named, unknown id",
            [ASK, calls(weather_call), tool("call_x", "18 C", name="get_weather")],
            [WEATHER],
            {},
            True,
        ),
        (
            "unicode",
            [{"role": "system", "content": "Réponds en français 🙂"}, {"role": "user", "content": "Météo à Zürich — «vite» ?"}],
            None,
            {},
            True,
        ),
        (
            "unicode call",
            [
                {"role": "user", "content": "東京の天気は?"},
                calls(call("u", "get_weather", {"city": "東京", "unit": "celsius"})),
                tool("u", "晴れ 🌞"),
            ],
            [WEATHER],
            {"enable_thinking": True},
            True,
        ),
        (
            "user content parts",
            [{"role": "user", "content": [{"type": "text", "text": "Hello "}, {"type": "text", "text": "there"}]}],
            None,
            {},
            True,
        ),
        (
            "preserve thinking",
            [
                ASK,
                calls(weather_call, reasoning_content="Need the tool."),
                tool("call_1", "18 C"),
                {"role": "assistant", "content": "Sunny.", "reasoning_content": "Done."},
                {"role": "user", "content": "Thanks"},
            ],
            [WEATHER],
            {"enable_thinking": True, "preserve_thinking": True},
            True,
        ),
        (
            "thinking off, after tools",
            [
                ASK,
                calls(weather_call),
                tool("call_1", "18 C"),
                answer,
                {"role": "user", "content": "Thanks"},
            ],
            [WEATHER],
            {"enable_thinking": False},
            True,
        ),
    ]
    return [
        {"name": n, "messages": m, "tools": t, "kwargs": k, "add_generation_prompt": g}
        for n, m, t, k, g in out
    ]


def render(template_dir: Path) -> list[dict]:
    import transformers

    transformers.logging.set_verbosity_error()
    tok = transformers.AutoTokenizer.from_pretrained(str(template_dir))
    out = []
    for case in cases():
        text = tok.apply_chat_template(
            case["messages"],
            tools=case["tools"],
            add_generation_prompt=case["add_generation_prompt"],
            tokenize=False,
            **case["kwargs"],
        )
        out.append({**case, "text": text})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--template-dir", default=str(TEMPLATE_DIR))
    parser.add_argument("--out", default="fixtures/chat-tools/conversations.jsonl")
    parser.add_argument("--verify", action="store_true", help="compare with the committed file instead of writing")
    args = parser.parse_args(argv)
    lines = [json.dumps(c, ensure_ascii=False, separators=(",", ":")) for c in render(Path(args.template_dir))]
    text = "\n".join(lines) + "\n"
    out = Path(args.out)
    if args.verify:
        if not out.is_file() or out.read_text(encoding="utf-8") != text:
            print(f"{out} differs from what the script computes", file=sys.stderr)
            return 1
        return 0
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    print(f"wrote {out}: {len(lines)} cases")
    return 0


if __name__ == "__main__":
    sys.exit(main())

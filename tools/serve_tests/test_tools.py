#!/usr/bin/env python3
"""`dg serve` with tools, tool calls and the reasoning channel, end to end: the official `openai`
client (a multi-turn tool conversation, streamed and whole) and LangChain's OpenAI chat model
(`langchain-openai`: a tool round trip).

The model is the small random Gemma-4-vocabulary fixture (fixtures/converter-gemma4-vocab/hf, with
DiffusionGemma's real chat template and a tokenizer that has the tool and channel tokens): its own
text is noise, so each reply is forced through the test hook (`dg serve --test-hooks`,
`dg.test_output`): the given text is tokenized to the real token ids and committed in place of the
model's canvases, then decoded and parsed as any reply.

    python3 tools/serve_tests/test_tools.py --binary target/release/dg
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_serve import Server, check  # noqa: E402

MODEL = "hf"
FIXTURE = "fixtures/converter-gemma4-vocab/hf"
Q = '<|"|>'
ARGS = ["--model", FIXTURE, "--served-model-name", MODEL, "--api-key", "test-key", "--test-hooks"]
MAX_TOKENS = 256

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"],
        },
    },
}


def forced(*texts):
    return {"dg": {"test_output": list(texts)}}


def call_text(name, body):
    """A call as the model writes it, and the end of its turn."""
    return f"<|tool_call>call:{name}{{{body}}}<tool_call|><|tool_response>"


def create(c, messages, output, **kw):
    return c.chat.completions.create(model=MODEL, messages=messages, max_tokens=MAX_TOKENS, extra_body=forced(output) | kw.pop("extra", {}), **kw)


def streamed(c, messages, output, **kw):
    """A streamed reply accumulated as clients do: (content, reasoning, calls by index, finish_reason)."""
    content, reasoning, calls, finish = "", "", {}, None
    for chunk in create(c, messages, output, stream=True, **kw):
        choice = chunk.choices[0]
        delta = choice.delta
        content += delta.content or ""
        reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
        for tc in delta.tool_calls or []:
            slot = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
            slot["id"] = tc.id or slot["id"]
            slot["name"] += tc.function.name or ""
            slot["arguments"] += tc.function.arguments or ""
        finish = choice.finish_reason or finish
    return content, reasoning, calls, finish


def test_openai_conversation(s):
    c = s.client()
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    # Turn 1: a call.
    r = create(c, messages, call_text("get_weather", f"city:{Q}Paris{Q},unit:{Q}celsius{Q}"), tools=[WEATHER])
    m = r.choices[0].message
    check(r.choices[0].finish_reason == "tool_calls", f"finish_reason {r.choices[0].finish_reason}")
    check(m.content is None, f"content {m.content!r}")
    check(len(m.tool_calls) == 1 and m.tool_calls[0].function.name == "get_weather", f"{m.tool_calls}")
    check(json.loads(m.tool_calls[0].function.arguments) == {"city": "Paris", "unit": "celsius"}, m.tool_calls[0].function.arguments)
    # The same reply streamed.
    content, reasoning, calls, finish = streamed(c, messages, call_text("get_weather", f"city:{Q}Paris{Q},unit:{Q}celsius{Q}"), tools=[WEATHER])
    check(finish == "tool_calls" and content == "" and reasoning == "", f"{finish} {content!r} {reasoning!r}")
    check([(v["name"], json.loads(v["arguments"])) for v in calls.values()] == [("get_weather", {"city": "Paris", "unit": "celsius"})], f"{calls}")
    check(calls[0]["id"].startswith("call_") and calls[0]["id"] != m.tool_calls[0].id, f"ids unique per request: {calls[0]['id']}")
    # Turn 2: the tool's result, then the answer.
    messages += [m.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": m.tool_calls[0].id, "content": "18 C, sunny"}]
    r = create(c, messages, "It is 18 C and sunny in Paris.<turn|>", tools=[WEATHER])
    check(r.choices[0].finish_reason == "stop", f"finish_reason {r.choices[0].finish_reason}")
    check(r.choices[0].message.content == "It is 18 C and sunny in Paris." and not r.choices[0].message.tool_calls, f"{r.choices[0].message}")
    # Turn 3, thinking on: reasoning, then two calls (parallel), nested arguments with unicode,
    # quotes and the string delimiter inside strings.
    messages += [r.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "Rome and Zürich?"}]
    nested = f'city:{Q}Zürich «ZH» "q" {Q}x{Q} end{Q},extra:{{days:[1,2.5,-3],flags:{{a:true,b:null}}}}'
    output = "<|channel>thought\nTwo cities: two calls.<channel|>Checking." + call_text("get_weather", f"city:{Q}Rome{Q}")[:-len("<|tool_response>")] + call_text("get_weather", nested)
    thinking = {"extra": {"chat_template_kwargs": {"enable_thinking": True}}}
    for stream in (False, True):
        if stream:
            content, reasoning, calls, finish = streamed(c, messages, output, tools=[WEATHER], **thinking)
            got = [(v["name"], json.loads(v["arguments"])) for _, v in sorted(calls.items())]
        else:
            r = create(c, messages, output, tools=[WEATHER], **thinking)
            m = r.choices[0].message
            content, reasoning, finish = m.content, m.model_extra.get("reasoning_content"), r.choices[0].finish_reason
            got = [(tc.function.name, json.loads(tc.function.arguments)) for tc in m.tool_calls]
        want = [("get_weather", {"city": "Rome"}),
                ("get_weather", {"city": f'Zürich «ZH» "q" {Q}x{Q} end', "extra": {"days": [1, 2.5, -3], "flags": {"a": True, "b": None}}})]
        check(finish == "tool_calls", f"stream={stream}: finish_reason {finish}")
        check(reasoning == "Two cities: two calls." and content == "Checking.", f"stream={stream}: {reasoning!r} {content!r}")
        check(got == want, f"stream={stream}: {got}")


def test_choice_malformed_and_hooks(s):
    c = s.client()
    messages = [{"role": "user", "content": "Weather in Oslo?"}]
    # A named tool_choice pins `<|tool_call>call:get_weather{` after the generation prompt: the reply continues it.
    r = create(c, messages, f"city:{Q}Oslo{Q}}}<tool_call|><|tool_response>", tools=[WEATHER],
               tool_choice={"type": "function", "function": {"name": "get_weather"}})
    tc = r.choices[0].message.tool_calls
    check(r.choices[0].finish_reason == "tool_calls" and json.loads(tc[0].function.arguments) == {"city": "Oslo"}, f"{r.choices[0]}")
    auto = create(c, messages, "x<turn|>", tools=[WEATHER])
    check(r.usage.prompt_tokens > auto.usage.prompt_tokens, "the pinned call is part of the prompt")
    # A call that does not parse: its text as content, a standard finish_reason, a warning.
    bad = f"<|tool_call>call:get_weather{{city:}}<tool_call|>"
    r = create(c, messages, bad + "<|tool_response>", tools=[WEATHER])
    check(r.choices[0].finish_reason == "stop" and r.choices[0].message.content == bad, f"{r.choices[0]}")
    check("does not parse" in r.model_extra["dg"]["tool_call_warnings"][0], f"{r.model_extra['dg']}")
    deadline = time.time() + 10  # the server's stderr is read by a thread
    while not any("does not parse" in line for line in s.log) and time.time() < deadline:
        time.sleep(0.05)
    check(any("does not parse" in line for line in s.log), "the server logs the malformed call")
    # tool_choice none: the call's text is content.
    r = create(c, messages, call_text("get_weather", f"city:{Q}Oslo{Q}"), tools=[WEATHER], tool_choice="none")
    check(r.choices[0].finish_reason == "stop" and "call:get_weather" in r.choices[0].message.content, f"{r.choices[0]}")


def test_empty_reply_reroll(s):
    c = s.client()
    messages = [{"role": "user", "content": "hi"}]
    r = c.chat.completions.create(model=MODEL, messages=messages, max_tokens=MAX_TOKENS, extra_body=forced("<turn|>", "Hello.<turn|>"))
    check(r.choices[0].message.content == "Hello." and r.model_extra["dg"]["empty_reply_rerolls"] == 1, f"{r}")
    # One retry only: a second empty reply is the answer.
    r = c.chat.completions.create(model=MODEL, messages=messages, max_tokens=MAX_TOKENS, extra_body=forced("<turn|>", "<turn|>", "Late."))
    check(r.choices[0].message.content == "" and r.model_extra["dg"]["empty_reply_rerolls"] == 1, f"{r}")


def test_langchain(s):
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_weather(city: str) -> str:
        """Current weather of a city."""
        return f"18 C in {city}"

    def llm(output):
        return ChatOpenAI(model=MODEL, base_url=f"http://{s.host}:{s.port}/v1", api_key="test-key", max_tokens=MAX_TOKENS,
                          max_retries=0, extra_body=forced(output)).bind_tools([get_weather])

    messages = [HumanMessage("Weather in Lisbon?")]
    ai = llm(call_text("get_weather", f"city:{Q}Lisbon{Q}")).invoke(messages)
    check([(t["name"], t["args"]) for t in ai.tool_calls] == [("get_weather", {"city": "Lisbon"})], f"{ai.tool_calls}")
    messages += [ai] + [ToolMessage(get_weather.invoke(t["args"]), tool_call_id=t["id"]) for t in ai.tool_calls]
    final = llm("Lisbon: 18 C.<turn|>").invoke(messages)
    check(final.content == "Lisbon: 18 C." and not final.tool_calls, f"{final}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--binary", default="target/release/dg")
    parser.add_argument("--backend", default="cpu")
    args = parser.parse_args()
    s = Server(args.binary, args.backend, *ARGS)
    try:
        for test in (test_openai_conversation, test_choice_malformed_and_hooks, test_langchain):
            test(s)
            print(f"ok {test.__name__}")
    finally:
        check(s.stop() == 0, "clean exit")
    s = Server(args.binary, args.backend, *ARGS, "--empty-reply-retries", "1")
    try:
        test_empty_reply_reroll(s)
        print("ok test_empty_reply_reroll")
    finally:
        check(s.stop() == 0, "clean exit")
    return 0


if __name__ == "__main__":
    sys.exit(main())

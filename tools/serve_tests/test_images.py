#!/usr/bin/env python3
"""`dg serve` with images in chat messages, end to end with the official `openai` client: OpenAI's
`image_url` content parts with data: URLs, streamed and whole; every bad image (an http URL,
bad base64, a MIME type that is not an image dg reads, a truncated PNG, one over the pixel limit)
a 400 naming the part, the server healthy after each; a plain request still answers. The tower
runs on the server's backend (on the GPU beside the engine): image requests encoded on request
threads at once, while the engine generates, get the replies they get alone.

The model is fixtures/vision-generate (a small random DiffusionGemma with a Gemma 4 vision tower,
DiffusionGemma's chat template): at 70 soft tokens per image the prompt of a user turn holding
the fixture's image and question is the one transformers' processor made for it (90 tokens).

    python3 tools/serve_tests/test_images.py --binary target/release/dg [--backend gpu]
"""

import argparse
import base64
import concurrent.futures
import os
import struct
import sys
import zlib

import openai

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_serve import Server, check, expect_error, healthy  # noqa: E402

MODEL = "vision"
FIXTURE = "fixtures/vision-generate"
IMAGES = "fixtures/image-processor"
ARGS = ["--model", FIXTURE, "--served-model-name", MODEL, "--api-key", "test-key", "--image-tokens", "70"]
QUESTION = "What is in this image?"
# The prompt transformers' Gemma4Processor made of the image and the question (generate.json).
PROMPT_TOKENS = 90


def data_url(data, mime="image/png"):
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def image_file(name):
    with open(os.path.join(IMAGES, name), "rb") as f:
        return f.read()


def turn(url, text=QUESTION):
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": text}]}]


def png_header(width, height):
    """A PNG whose header says width x height, its pixel data an empty zlib stream."""

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")


def test_openai_client(s):
    c = s.client()
    wide = data_url(image_file("wide.png"))
    whole = c.chat.completions.create(model=MODEL, messages=turn(wide), max_tokens=16, seed=3)
    check(whole.usage.prompt_tokens == PROMPT_TOKENS, f"prompt tokens {whole.usage.prompt_tokens}, want {PROMPT_TOKENS}")
    check(whole.choices[0].finish_reason in ("stop", "length"), f"{whole}")
    text, finish, usage = "", None, None
    for chunk in c.chat.completions.create(model=MODEL, messages=turn(wide), max_tokens=16, seed=3, stream=True,
                                           stream_options={"include_usage": True}):
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
        usage = chunk.usage or usage
    check(text == whole.choices[0].message.content, f"streamed {text!r} != whole {whole.choices[0].message.content!r}")
    check(finish == whole.choices[0].finish_reason and usage.prompt_tokens == PROMPT_TOKENS, f"{finish} {usage}")
    # Another image, the same text and seed: another reply (no cache of the first image is reused).
    tall = c.chat.completions.create(model=MODEL, messages=turn(data_url(image_file("tall.png"))), max_tokens=16, seed=3)
    check(tall.choices[0].message.content != whole.choices[0].message.content, "two images, one reply")
    again = c.chat.completions.create(model=MODEL, messages=turn(wide), max_tokens=16, seed=3)
    check(again.choices[0].message.content == whole.choices[0].message.content, "the same image and seed, another reply")


def test_bad_images(s):
    part = "messages[0].content[0]"
    png = image_file("wide.png")
    for url, what in [
        ("https://example.com/cat.png", "an http URL"),
        ("data:image/png;base64,not base64!", "bad base64"),
        (data_url(png, "text/plain"), "a text MIME type"),
        (data_url(png, "image/gif"), "a GIF MIME type"),
        (data_url(png[: len(png) // 3]), "a truncated PNG"),
        (data_url(b"GIF89a" + bytes(40)), "a GIF's bytes"),
        (data_url(png_header(20000, 20000)), "a PNG over the pixel limit"),
    ]:
        try:
            expect_error(s, 400, {"model": MODEL, "messages": turn(url)}, param=part)
        except AssertionError as e:
            raise AssertionError(f"{what}: {e}") from e
    c = s.client()
    try:
        c.chat.completions.create(model=MODEL, messages=turn("http://example.com/cat.png"), max_tokens=8)
        raise AssertionError("an http image URL was answered")
    except openai.BadRequestError as e:
        check("not fetched" in str(e), f"{e}")
    healthy(s)
    plain = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=8)
    check(plain.choices[0].finish_reason in ("stop", "length"), f"{plain}")


def test_tower_runs_on_the_backend(s, backend):
    device = {"cpu": "on the CPU (f32)", "gpu": "on the GPU ("}[backend]
    check(any(f"images: the vision tower {device}" in line for line in s.log), f"no tower line {device!r}: {''.join(s.log)}")


def test_concurrent_images(s):
    """Image requests whose towers run at once, beside a plain request the engine generates."""
    c = s.client()
    urls = [data_url(image_file(name)) for name in ("wide.png", "tall.png")]
    alone = [c.chat.completions.create(model=MODEL, messages=turn(u), max_tokens=16, seed=5).choices[0].message.content for u in urls]

    def ask(i):
        if i == 0:
            return c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=32)
        return c.chat.completions.create(model=MODEL, messages=turn(urls[i % 2]), max_tokens=16, seed=5)

    with concurrent.futures.ThreadPoolExecutor(max_workers=5) as pool:
        replies = list(pool.map(ask, range(5)))
    for i, r in enumerate(replies[1:], start=1):
        got = r.choices[0].message.content
        check(got == alone[i % 2], f"request {i}: {got!r} at once, {alone[i % 2]!r} alone")
    healthy(s)


def test_no_tower(binary):
    """The bundled model has no vision tower: an image part is a 400 saying so."""
    s = Server(binary, "cpu", "--served-model-name", "tiny-random", "--api-key", "test-key")
    try:
        body = {"model": "tiny-random", "messages": turn(data_url(image_file("wide.png")))}
        expect_error(s, 400, body, param="messages[0].content[0]")
    finally:
        check(s.stop() == 0, "clean exit")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--binary", default="target/release/dg")
    parser.add_argument("--backend", default="cpu", choices=["cpu", "gpu"])
    args = parser.parse_args()
    s = Server(args.binary, args.backend, *ARGS)
    try:
        test_tower_runs_on_the_backend(s, args.backend)
        print("ok test_tower_runs_on_the_backend")
        for test in (test_openai_client, test_bad_images, test_concurrent_images):
            test(s)
            print(f"ok {test.__name__}")
    finally:
        check(s.stop() == 0, "clean exit")
    test_no_tower(args.binary)
    print("ok test_no_tower")
    return 0


if __name__ == "__main__":
    sys.exit(main())

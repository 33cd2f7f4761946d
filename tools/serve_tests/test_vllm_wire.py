#!/usr/bin/env python3
"""End-to-end test of vLLM's structured reads on `dg serve` (`vllm_xargs` of vLLM PR #57250 on
/v1/chat/completions and /v1/completions), with the official `openai` client's `extra_body`, as
OpenJev's `engine.py` sends them, on the bundled model.

Checked: a read-only chat read answers one row per `max_tokens` with `token_id:ID` tokens, each
row's `top_logprobs` the 20 most likely tokens (most likely first, the row's token among them) then
the `logprob_token_ids` not among them, every logprob of a requested id the one the top list gives
it; the same request the same bits; text tokens without `return_tokens_as_token_ids`; completions'
shape (a dict of `token_id:ID` per row, prompt token ids as given); `diffusion_max_steps` with every
row pinned equal to one step, without pins not; and vLLM's validation messages as 400s in OpenAI's
error shape, /health OK after each.

    python3 tools/serve_tests/test_vllm_wire.py --binary target/release/dg
"""

import argparse
import math
import os
import sys
import time

import openai

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_serve import KEY, MODEL, Server, check, healthy  # noqa: E402

WIDTH = 16
LABELS = [24, 25, 26, 215, 324]
MESSAGES = [{"role": "system", "content": "Answer with one label."}, {"role": "user", "content": "Is the sky blue?"}]
TOP = 20


def seed_canvas():
    return [(7 + 37 * i) % 900 for i in range(WIDTH)]


def xargs(**over):
    return {"diffusion_seed_canvas": seed_canvas(), "diffusion_canvas_length": WIDTH, "diffusion_max_steps": 1,
            "diffusion_read_only": True, **over}


def chat(client, max_tokens=WIDTH, as_ids=True, top=TOP, **over):
    return client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=max_tokens, logprobs=True, top_logprobs=top,
        extra_body={"logprob_token_ids": LABELS, "return_tokens_as_token_ids": as_ids,
                    "chat_template_kwargs": {"enable_thinking": False}, "vllm_xargs": xargs(**over)})


def token_id(token):
    check(token.startswith("token_id:"), f"token {token!r} is not token_id:ID")
    return int(token.split(":")[1])


def rows_of(r):
    return [(token_id(row.token), row.logprob, [(token_id(t.token), t.logprob) for t in row.top_logprobs])
            for row in r.choices[0].logprobs.content]


def read(client):
    r = chat(client, max_tokens=9)
    rows = rows_of(r)
    check(len(rows) == 9 and r.choices[0].finish_reason == "length", f"{len(rows)} rows")
    check(r.usage.completion_tokens == 9 and r.usage.prompt_tokens > 0, str(r.usage))
    for token, logprob, listed in rows:
        top, rest = listed[:TOP], listed[TOP:]
        check((token, logprob) == top[0], f"the row's token {token} is not its most likely {top[0]}")
        check(all(a[1] >= b[1] for a, b in zip(top, top[1:])), "top_logprobs not most likely first")
        check(all(lp <= 0 for _, lp in listed) and sum(math.exp(lp) for _, lp in top) <= 1 + 1e-6, "not log-probabilities")
        ids = [t for t, _ in listed]
        check(len(set(ids)) == len(ids), "a token listed twice")
        check([t for t, _ in rest] == [t for t in LABELS if t not in ids[:TOP]], f"requested ids after the top: {rest}")
        check(all(lp <= top[-1][1] for _, lp in rest), "a requested id outside the top is more likely than the top")
    check(rows_of(chat(client, max_tokens=9)) == rows, "the same read gave other bits")
    # A read-only request ends with its canvas: max_tokens past it gives the canvas.
    check(len(rows_of(chat(client, max_tokens=64))) == WIDTH, "max_tokens past the canvas")
    # Only the requested ids with top_logprobs 0; text tokens without return_tokens_as_token_ids.
    only = chat(client, max_tokens=2, top=0).choices[0].logprobs.content
    check([token_id(t.token) for t in only[0].top_logprobs] == LABELS, "top_logprobs 0: the requested ids only")
    text = chat(client, max_tokens=2, as_ids=False).choices[0].logprobs.content
    check(not text[0].token.startswith("token_id:") and text[0].logprob == rows[0][1], "text tokens")

    # Steps: with every row pinned nothing moves, so four steps read as one; without pins they do.
    pinned = rows_of(chat(client, max_tokens=9, diffusion_max_steps=4, diffusion_pinned=list(range(WIDTH))))
    check(pinned == rows, "a fully pinned 4-step read differs from a 1-step read")
    check(rows_of(chat(client, max_tokens=9, diffusion_max_steps=4)) != rows, "4 free steps read as one")

    # Completions: the prompt as token ids, `logprobs` the count, a dict per row.
    c = client.completions.create(model=MODEL, prompt=[2, 5, 40, 41, 42], max_tokens=4, logprobs=TOP,
                                  extra_body={"logprob_token_ids": LABELS, "return_tokens_as_token_ids": True,
                                              "vllm_xargs": xargs()})
    lp = c.choices[0].logprobs
    check(len(lp.tokens) == 4 and len(lp.top_logprobs) == 4 and c.usage.prompt_tokens == 5, str(c.usage))
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        check(top[token] == logprob == max(top.values()), "the row's token is its most likely")
        check(all(f"token_id:{t}" in top for t in LABELS) and len(top) >= TOP, "top_logprobs: the top 20 and the requested ids")


def errors(server, client):
    def refused(message, **body):
        try:
            client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4, extra_body=body)
        except openai.BadRequestError as e:
            check(e.status_code == 400 and e.body["message"] == message, f"{body}: {e.body}")
        else:
            raise AssertionError(f"accepted: {body}")
        healthy(server)

    vocab = 986
    refused("diffusion_canvas_length must be a positive integer no larger than the served canvas.", vllm_xargs=xargs(diffusion_canvas_length=33))
    refused("diffusion_seed_canvas must be a list of token ids.", vllm_xargs=xargs(diffusion_seed_canvas=[1, 2.5]))
    refused(f"diffusion_seed_canvas ids must be in [0, {vocab}).", vllm_xargs=xargs(diffusion_seed_canvas=[vocab] * WIDTH))
    refused(f"diffusion_seed_canvas must hold exactly {WIDTH} ids, got 3.", vllm_xargs=xargs(diffusion_seed_canvas=[1, 2, 3]))
    refused("diffusion_pinned must be a list of canvas positions.", vllm_xargs=xargs(diffusion_pinned="0,1"))
    refused("diffusion_pinned positions must lie inside the canvas.", vllm_xargs=xargs(diffusion_pinned=[WIDTH]))
    refused("diffusion_pinned needs a diffusion_seed_canvas to hold.", vllm_xargs={"diffusion_read_only": True, "diffusion_pinned": [0]})
    refused("diffusion_max_steps must be a positive integer.", vllm_xargs=xargs(diffusion_max_steps=0))
    refused("diffusion_read_only must be a boolean (or 0/1).", vllm_xargs=xargs(diffusion_read_only=2))
    refused("diffusion_constrained needs logprob_token_ids: they are the allowed set.", vllm_xargs=xargs(diffusion_constrained=True))
    refused("when using `top_logprobs`, `logprobs` must be set to true.", top_logprobs=5, vllm_xargs=xargs())
    refused("Requested sample logprobs of 21, which is greater than max allowed: 20", logprobs=True, top_logprobs=21, vllm_xargs=xargs())
    refused("Requested logprob_token_ids of length 129, which is greater than max allowed: 128", logprob_token_ids=[1] * 129, vllm_xargs=xargs())
    refused(f"token_id(s) [{vocab}] in logprob_token_ids contain out-of-vocab token ids. Vocabulary size: {vocab}",
            logprob_token_ids=[1, vocab], vllm_xargs=xargs())
    # What dg does not serve is named: a generated (not read-only) canvas, constrained reads.
    refused("diffusion_read_only: this server serves vllm_xargs and logprob_token_ids on read-only requests only",
            vllm_xargs=xargs(diffusion_read_only=False))
    refused("diffusion_constrained: not supported by this server", logprob_token_ids=LABELS, vllm_xargs=xargs(diffusion_constrained=1))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--binary", required=True)
    args = parser.parse_args()
    started = time.time()
    server = Server(args.binary, "cpu", "--api-key", KEY)
    try:
        client = server.client()
        read(client)
        errors(server, client)
    finally:
        server.proc.terminate()
        server.proc.wait(timeout=30)
    print(f"vllm wire: all checks passed in {time.time() - started:.1f} s")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Time to the first committed canvas with and without KV-cache reuse, through `dg serve`.

A long prompt is answered once (its tokens stay in the cache); the same prompt plus a few tokens is
then asked twice: right after (the cache is reused) and after an unrelated prompt (it is not).

    python3 tools/serve_tests/reuse_latency.py --binary target/release/dg --backend cpu --prompt-len 2000
"""

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import test_serve as t  # noqa: E402


def first_canvas(s, prompt):
    resp, data = s.request("POST", "/v1/completions", {"model": t.MODEL, "prompt": prompt, "max_tokens": 8})
    body = t.json.loads(data)
    return body["dg"]["first_canvas_ms"], body["dg"]["reused_prompt_tokens"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default="target/release/dg")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--prompt-len", type=int, default=2000)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    s = t.Server(args.binary, args.backend, "--api-key", t.KEY)
    warm, cold = [], []
    for run in range(args.runs):
        prompt = [3 + (i * 7 + run) % 900 for i in range(args.prompt_len)]
        first_canvas(s, prompt)
        ms, reused = first_canvas(s, prompt + [5, 6, 7])
        t.check(reused == len(prompt), f"reused {reused}")
        warm.append(ms)
        first_canvas(s, [2, 3])
        ms, reused = first_canvas(s, prompt + [5, 6, 7])
        t.check(reused == 0, f"reused {reused}")
        cold.append(ms)
    s.stop()
    print(f"{args.backend}, prompt {args.prompt_len} + 3 tokens, median of {args.runs}: first canvas "
          f"{statistics.median(cold):.1f} ms without reuse, {statistics.median(warm):.1f} ms with reuse")


if __name__ == "__main__":
    main()

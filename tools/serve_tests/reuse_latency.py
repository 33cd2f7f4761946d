#!/usr/bin/env python3
"""Time to the first committed canvas with and without KV-cache reuse, through `dg serve`.

A long prompt P is answered once; then P plus a few tokens is asked right after (it continues from
the model's own cache), and, once an unrelated prompt has run in between, P plus a few more (it
continues from the cache pool: the unrelated one is parked, P's restored). Without reuse: a prompt
of the same length that extends no kept cache. The time is the server's, from the engine taking
the request to the first committed canvas (parking and restoring caches included).

    python3 tools/serve_tests/reuse_latency.py --binary target/release/dg --backend cpu --prompt-len 2000
"""

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import test_serve as t  # noqa: E402


def first_canvas(s, prompt, cache):
    resp, data = s.request("POST", "/v1/completions", {"model": t.MODEL, "prompt": prompt, "max_tokens": 8}, timeout=600)
    body = t.json.loads(data)
    t.check(body["dg"]["cache"] == cache, f"cache {body['dg']['cache']}, expected {cache}")
    return body["dg"]["first_canvas_ms"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default="target/release/dg")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--prompt-len", type=int, default=2000)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    s = t.Server(args.binary, args.backend, "--api-key", t.KEY)
    times = {"none": [], "resident": [], "pool": []}
    for run in range(args.runs):
        prompt = t.prompt_of(args.prompt_len, run)
        first_canvas(s, prompt, "none")
        times["resident"].append(first_canvas(s, prompt + [5, 6, 7], "resident"))
        first_canvas(s, [2, 3, run + 4], "none")
        times["pool"].append(first_canvas(s, prompt + [5, 6, 7, 8], "pool"))
        times["none"].append(first_canvas(s, t.prompt_of(args.prompt_len, run + 100) + [5, 6, 7], "none"))
    s.stop()
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{args.backend}, prompt {args.prompt_len} + 3 or 4 tokens, median of {args.runs}: first canvas "
          f"{med['none']:.1f} ms without reuse, {med['resident']:.1f} ms from the model's own cache, "
          f"{med['pool']:.1f} ms from the pool")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Single-stream generation speed through `dg serve`, in the settings of `xtask bench-generate`.

Starts `dg serve` on a model directory, then sends one non-streamed `/v1/completions` request at a
time: a prompt of random token ids, `max_tokens` a whole number of canvases, `dg.steps` steps per
canvas and adaptive stopping that never fires (`dg.confidence_threshold` 1e-30; the model
directory's generation_config.json should list no EOS ids, as `bench/serve_h200.sh` writes it),
so every canvas runs every step, as `bench-generate` does. Each request's prompt differs from the
others' (no cache reuse). Reports, as the median of the timed runs after a warm-up, the wall time
of a request on the client and the generated tokens per second, with the server's own prefill and
first-canvas times; `--compare FILE` reads `bench-generate`'s output and prints the ratio.

With `--clients 1,4` (and `dg serve --batch N` through `--batch N`) it measures concurrent
streaming clients instead: for each count K, rounds in which K clients each send one streamed
request at once (different prompts and seeds); the aggregate generated tokens per second of a
round is its tokens over its wall time, reported as the median over `--runs` rounds after a
warm-up round, with each count's ratio to the first.

Only the standard library: it runs where the openai package is not installed.

    python3 tools/serve_tests/throughput.py --binary target/release/dg --model DIR --weights f16 \\
        --prompt 1024 --canvases 2 --steps 48 --runs 3 [--compare bench-generate.log]
    python3 tools/serve_tests/throughput.py --binary target/release/dg --model DIR --weights f16 \\
        --prompt 1024 --canvases 2 --steps 48 --runs 2 --batch 4 --clients 1,4
"""

import argparse
import http.client
import json
import random
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path


class Server:
    """A `dg serve` process on a free loopback port."""

    def __init__(self, cmd, start_timeout):
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
        self.log = []
        deadline = time.time() + start_timeout
        while True:
            line = self.proc.stderr.readline()
            if not line:
                self.proc.wait()
                sys.exit("dg serve exited before listening:\n" + "".join(self.log))
            self.log.append(line)
            m = re.search(r"listening on http://([\d.]+):(\d+)", line)
            if m:
                self.host, self.port = m.group(1), int(m.group(2))
                break
            if time.time() > deadline:
                self.proc.kill()
                sys.exit("dg serve did not start listening in time:\n" + "".join(self.log))
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self):
        for line in self.proc.stderr:
            self.log.append(line)

    def post(self, path, body, timeout):
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        conn.request("POST", path, body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        conn.close()
        if resp.status != 200:
            sys.exit(f"{path}: HTTP {resp.status}: {data[:500]!r}")
        return json.loads(data)

    def stream(self, path, body, timeout):
        """A streamed request: its completion tokens and steps per canvas, from the final chunk."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        conn.request("POST", path, body=json.dumps(body | {"stream": True}).encode(),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read().decode()
        conn.close()
        if resp.status != 200:
            raise RuntimeError(f"{path}: HTTP {resp.status}: {data[:500]!r}")
        chunks = [json.loads(line[6:]) for line in data.split("\n") if line.startswith("data: {")]
        last = chunks[-1]
        return last["usage"]["completion_tokens"], last["dg"]["steps_per_canvas"]

    def stop(self):
        self.proc.send_signal(2)
        return self.proc.wait(timeout=60)


def bench_generate_tokens_per_second(path):
    text = Path(path).read_text()
    m = re.search(r"^generated tokens per second: ([0-9.]+)", text, re.M)
    if not m:
        sys.exit(f"{path}: no 'generated tokens per second' line (is it xtask bench-generate's output?)")
    return float(m.group(1))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default="target/release/dg")
    ap.add_argument("--model", required=True, help="model directory (or GGUF file) to serve")
    ap.add_argument("--backend", default="gpu")
    ap.add_argument("--weights", default="auto")
    ap.add_argument("--prompt", type=int, default=1024, help="prompt tokens (random ids)")
    ap.add_argument("--canvases", type=int, default=2)
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--runs", type=int, default=3, help="timed requests after one warm-up")
    ap.add_argument("--start-timeout", type=float, default=900, help="seconds to wait for the model to load")
    ap.add_argument("--compare", help="xtask bench-generate's output, for the ratio")
    ap.add_argument("--batch", type=int, default=1, help="dg serve --batch")
    ap.add_argument("--clients", help="concurrent streaming clients per round, e.g. 1,4 (default: one whole request at a time)")
    args = ap.parse_args()

    config = json.loads((Path(args.model) / "config.json").read_text()) if Path(args.model).is_dir() else {}
    vocab = config.get("text_config", {}).get("vocab_size", 262144)
    canvas = config.get("canvas_length", 256)
    max_tokens = args.canvases * canvas
    context = args.prompt + max_tokens + canvas
    cmd = [args.binary, "serve", "--model", args.model, "--backend", args.backend, "--weights", args.weights,
           "--host", "127.0.0.1", "--port", "0", "--context", str(context), "--steps", str(args.steps),
           "--batch", str(args.batch)]
    print("server:", " ".join(cmd), flush=True)
    start = time.time()
    s = Server(cmd, args.start_timeout)
    print(f"listening after {time.time() - start:.1f} s", flush=True)
    try:
        measure(s, args, vocab, max_tokens)
    finally:
        if s.proc.poll() is None:
            s.proc.kill()


def measure(s, args, vocab, max_tokens):
    served = json.loads(http_get(s, "/v1/models"))["data"][0]["id"]

    rng = random.Random(1)
    if args.clients:
        concurrent(s, args, served, vocab, max_tokens, rng)
        s.stop()
        return
    rows = []
    for run in range(args.runs + 1):
        prompt = [rng.randrange(3, vocab) for _ in range(args.prompt)]
        body = {"model": served, "prompt": prompt, "max_tokens": max_tokens, "seed": run,
                "dg": {"steps": args.steps, "confidence_threshold": 1e-30}}
        t0 = time.perf_counter()
        answer = s.post("/v1/completions", body, 3600)
        wall = time.perf_counter() - t0
        tokens = answer["usage"]["completion_tokens"]
        dg = answer["dg"]
        steps = dg["steps_per_canvas"]
        if tokens != max_tokens or steps != [args.steps] * args.canvases:
            sys.exit(f"run {run}: {tokens} tokens, steps per canvas {steps}: stopping or EOS fired "
                     "(the model's generation_config.json must list no EOS ids)")
        label = "warm-up" if run == 0 else f"run {run}"
        print(f"{label}: {wall * 1e3:.1f} ms, {tokens / wall:.1f} tokens/s, prefill {dg['prefill_ms']:.1f} ms, "
              f"first canvas {dg['first_canvas_ms']:.1f} ms", flush=True)
        if run > 0:
            rows.append((wall, tokens / wall, dg["prefill_ms"], dg["first_canvas_ms"]))
    s.stop()
    med = [statistics.median(r[i] for r in rows) for i in range(4)]
    print(f"through dg serve ({args.weights}, prompt {args.prompt}, {args.canvases} canvases x {args.steps} steps, "
          f"median of {args.runs}): request {med[0] * 1e3:.1f} ms, generated tokens per second {med[1]:.1f}, "
          f"prefill {med[2]:.1f} ms, first canvas {med[3]:.1f} ms")
    if args.compare:
        direct = bench_generate_tokens_per_second(args.compare)
        print(f"xtask bench-generate: {direct:.1f} tokens/s; through the server: {med[1]:.1f} tokens/s "
              f"= {100 * med[1] / direct:.1f}% of it")


def concurrent(s, args, served, vocab, max_tokens, rng):
    """Rounds of K clients each streaming one request at once; aggregate tokens per second."""
    counts = [int(k) for k in args.clients.split(",")]
    seed = 0
    results = []
    for k in counts:
        rates = []
        for run in range(args.runs + 1):
            bodies = []
            for _ in range(k):
                seed += 1
                prompt = [rng.randrange(3, vocab) for _ in range(args.prompt)]
                bodies.append({"model": served, "prompt": prompt, "max_tokens": max_tokens, "seed": seed,
                               "dg": {"steps": args.steps, "confidence_threshold": 1e-30}})
            answers, failures = [None] * k, []

            def client(i):
                try:
                    answers[i] = s.stream("/v1/completions", bodies[i], 3600)
                except Exception as e:  # noqa: BLE001 - reported below
                    failures.append(f"client {i}: {e!r}")

            threads = [threading.Thread(target=client, args=(i,)) for i in range(k)]
            t0 = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            wall = time.perf_counter() - t0
            if failures:
                sys.exit(f"{k} clients, round {run}: {failures}")
            for tokens, steps in answers:
                if tokens != max_tokens or steps != [args.steps] * args.canvases:
                    sys.exit(f"{k} clients, round {run}: {tokens} tokens, steps per canvas {steps}: stopping or EOS "
                             "fired (the model's generation_config.json must list no EOS ids)")
            tokens = sum(a[0] for a in answers)
            label = "warm-up" if run == 0 else f"round {run}"
            print(f"{k} clients, {label}: {wall * 1e3:.1f} ms, {tokens} tokens, {tokens / wall:.1f} tokens/s", flush=True)
            if run > 0:
                rates.append(tokens / wall)
        results.append((k, statistics.median(rates)))
    base = results[0][1]
    for k, rate in results:
        print(f"through dg serve --batch {args.batch} ({args.weights}, prompt {args.prompt}, {args.canvases} canvases x "
              f"{args.steps} steps, median of {args.runs}): {k} concurrent streaming clients, aggregate generated "
              f"tokens per second {rate:.1f} = {rate / base:.2f}x of {results[0][0]}")


def http_get(s, path):
    conn = http.client.HTTPConnection(s.host, s.port, timeout=60)
    conn.request("GET", path)
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return data


if __name__ == "__main__":
    main()

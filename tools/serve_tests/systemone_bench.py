#!/usr/bin/env python3
"""Latency and throughput of `dg serve`'s `POST /v1/systemone` (BENCHMARKS.md, typed reads).

Starts the server on a model, then: p50/p95 of a 1-question and a 3-question read one at a time
(with the stages of `server-timing`: the prompt's prefill and the read's forwards), and requests/s
at 1, 16 and 64 concurrent clients (each request a new state, so every prompt is prefilled).

    python3 tools/serve_tests/systemone_bench.py --binary target/release/dg [--model DIR] [--requests 200]
"""

import argparse
import http.client
import json
import re
import statistics
import subprocess
import threading
import time

ONE = {"urgency": {"type": "score", "instructions": "How urgent is it?", "criteria": ["low", "high"]}}
THREE = {
    "urgency": {"type": "score", "instructions": "How urgent is it?", "criteria": ["low", "high"]},
    "size": {"type": "score", "instructions": "How big is it?", "criteria": ["small", "big"]},
    "risk": {"type": "score", "instructions": "How risky is it?", "criteria": ["low", "high"]},
}


def start(binary, model):
    cmd = [binary, "serve", "--backend", "cpu", "--host", "127.0.0.1", "--port", "0"] + (["--model", model] if model else [])
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:
        m = re.search(r"listening on http://([\d.]+):(\d+)", line)
        if m:
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
            return proc, m.group(1), int(m.group(2))
    raise SystemExit("dg serve did not start")


def post(host, port, questions, i, samples=None):
    body = {"state": f"Ticket {i}: the order arrived broken.", "model": "jev-latest", "questions": questions}
    if samples:
        body["samples"] = samples
    conn = http.client.HTTPConnection(host, port, timeout=120)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/systemone", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    resp.read()
    took = time.perf_counter() - t0
    stages = dict(re.findall(r"(\w+);dur=([\d.]+)", resp.getheader("server-timing") or ""))
    conn.close()
    assert resp.status == 200, resp.status
    return took, {k: float(v) for k, v in stages.items()}


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--binary", required=True)
    parser.add_argument("--model")
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args()
    proc, host, port = start(args.binary, args.model)
    try:
        for name, qs in [("1 question", ONE), ("3 questions", THREE)]:
            runs = [post(host, port, qs, i, samples=1) for i in range(args.requests)]
            lat = [r[0] * 1e3 for r in runs]
            stage = {k: statistics.median(r[1][k] for r in runs) for k in ("prefill", "read", "server")}
            print(f"{name}: p50 {pct(lat, 50):.2f} ms, p95 {pct(lat, 95):.2f} ms; median stages: prefill {stage['prefill']:.2f} ms, "
                  f"read {stage['read']:.2f} ms, server {stage['server']:.2f} ms")
        for clients in (1, 16, 64):
            per = max(1, args.requests // clients)
            done = []

            def worker(c):
                for j in range(per):
                    done.append(post(host, port, THREE, 100000 + c * per + j, samples=1))

            t0 = time.perf_counter()
            threads = [threading.Thread(target=worker, args=(c,)) for c in range(clients)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            wall = time.perf_counter() - t0
            lat = [d[0] * 1e3 for d in done]
            print(f"concurrency {clients}: {len(done) / wall:.1f} requests/s (3 questions), p50 {pct(lat, 50):.1f} ms, p95 {pct(lat, 95):.1f} ms")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    main()

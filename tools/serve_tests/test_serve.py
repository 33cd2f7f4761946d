#!/usr/bin/env python3
"""End-to-end test of `dg serve` on the bundled model: the official `openai` client and raw HTTP.

Starts the built binary on a free loopback port and checks chat and text completions (stream and
whole, drafts on and off), max_tokens, stop sequences, seeds, multi-turn cache reuse (the model's
own cache, the pool of caches for interleaved conversations, least-recently-used eviction under a
small --cache-budget), continuous batching (--batch: concurrent streams get the text they get
alone, and a prompt that extends an earlier one reuses its cache beside them; a client that leaves
frees its slot), the API key, every bad input (each a 4xx in OpenAI's error shape, /health
OK after each), idle and partial connections, a full queue (429), clients that disconnect
(streamed and whole), a bounded load test, and SIGTERM.

    python3 tools/serve_tests/test_serve.py --binary target/release/dg --backend cpu
"""

import argparse
import http.client
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import threading
import time

import openai

KEY = "test-key"
MODEL = "tiny-random"
# Small generations keep the run short: one or two canvases of the bundled model, few steps.
BASE_ARGS = ["--steps", "4", "--max-new-tokens", "16", "--request-timeout", "2", "--shutdown-timeout", "20"]


class StartFailed(Exception):
    """`dg serve` exited before listening (its stderr is the message)."""


class Server:
    """A `dg serve` process and the address it listens on."""

    def __init__(self, binary, backend, *extra):
        cmd = [binary, "serve", "--backend", backend, "--host", "127.0.0.1", "--port", "0", *BASE_ARGS, *extra]
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
        self.log = []
        deadline = time.time() + 120
        while time.time() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                self.proc.wait()
                raise StartFailed("".join(self.log))
            self.log.append(line)
            m = re.search(r"listening on http://([\d.]+):(\d+)", line)
            if m:
                self.host, self.port = m.group(1), int(m.group(2))
                self.url = f"http://{self.host}:{self.port}"
                break
        else:
            raise SystemExit("dg serve did not start listening")
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self):
        for line in self.proc.stderr:
            self.log.append(line)

    def request(self, method, path, body=None, headers=None, key=KEY, timeout=60):
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        h = {"Content-Type": "application/json"}
        if key:
            h["Authorization"] = f"Bearer {key}"
        h.update(headers or {})
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
        conn.request(method, path, body=body, headers=h)
        resp = conn.getresponse()
        data = resp.read()
        conn.close()
        return resp, data

    def client(self, key=KEY):
        return openai.OpenAI(base_url=f"http://{self.host}:{self.port}/v1", api_key=key, max_retries=0)

    def stop(self):
        self.proc.send_signal(2)
        return self.proc.wait(timeout=30)


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def healthy(s):
    resp, data = s.request("GET", "/health", key=None)
    check(resp.status == 200 and json.loads(data)["status"] == "ok", f"/health: {resp.status} {data!r}")


def sse(s, path, body, key=KEY):
    """A streamed request read as raw SSE: (events as (event, data) pairs, saw [DONE])."""
    resp, data = s.request("POST", path, body | {"stream": True}, key=key)
    check(resp.status == 200, f"{path} stream: {resp.status} {data[:300]!r}")
    check(resp.getheader("Content-Type", "").startswith("text/event-stream"), "SSE content type")
    events, done = [], False
    for frame in data.decode().split("\n\n"):
        if not frame.strip():
            continue
        event, payload = None, None
        for line in frame.split("\n"):
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                payload = line[6:]
        check(not done, "nothing after [DONE]")
        if payload == "[DONE]":
            done = True
            continue
        events.append((event, json.loads(payload)))
    return events, done


def check_stream(events, done, chat, max_tokens):
    """A complete, well-formed stream: chunks, one final chunk with finish_reason and usage."""
    check(done, "the stream ends with data: [DONE]")
    chunks = [d for e, d in events if e is None]
    last = chunks[-1]
    check(last["choices"][0]["finish_reason"] in ("stop", "length"), f"finish_reason {last}")
    check(all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1]), "only the last chunk finishes")
    usage = last["usage"]
    check(1 <= usage["completion_tokens"] <= max_tokens or last["choices"][0]["finish_reason"] == "stop", f"usage {usage}")
    check(usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"], "usage adds up")
    key = "delta" if chat else None
    text = "".join((c["choices"][0]["delta"].get("content") or "") if key else c["choices"][0]["text"] for c in chunks)
    return text, last


def test_openai_client(s):
    c = s.client()
    models = c.models.list()
    check([m.id for m in models.data] == [MODEL], f"models {models}")
    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Why is the sky blue?"}]
    r = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=12, seed=3)
    check(isinstance(r.choices[0].message.content, str) and r.choices[0].finish_reason in ("stop", "length"), f"{r}")
    check(r.usage.completion_tokens <= 12, f"max_tokens: {r.usage}")
    if r.choices[0].finish_reason == "length":
        check(r.usage.completion_tokens == 12, f"max_tokens is exact: {r.usage}")
    # Stream: the same text as the whole answer with the same seed.
    text, finish, usage = "", None, None
    for chunk in c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=12, seed=3, stream=True):
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
        usage = chunk.usage or usage
    check(text == r.choices[0].message.content, f"stream {text!r} != whole {r.choices[0].message.content!r}")
    check(finish == r.choices[0].finish_reason and usage.completion_tokens == r.usage.completion_tokens, "stream end")
    # Drafts: a plain client sees them as chunks without choices, and the text is unchanged.
    drafts, text = 0, ""
    stream = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=12, seed=3, stream=True,
                                       extra_body={"dg": {"drafts": True}})
    for chunk in stream:
        if not chunk.choices:
            drafts += 1 if getattr(chunk, "dg", None) or (chunk.model_extra or {}).get("dg") else 0
        else:
            text += chunk.choices[0].delta.content or ""
    check(drafts >= 1 and text == r.choices[0].message.content, f"drafts {drafts}, text {text!r}")
    # Completions, whole and streamed.
    r = c.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=20, seed=1)
    check(isinstance(r.choices[0].text, str) and r.usage.completion_tokens <= 20, f"{r}")
    text = "".join(ch.choices[0].text for ch in c.completions.create(model=MODEL, prompt="Once upon a time",
                                                                        max_tokens=20, seed=1, stream=True) if ch.choices)
    check(text == r.choices[0].text, f"completion stream {text!r} != {r.choices[0].text!r}")
    # Seeds: the same seed, the same text.
    again = c.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=20, seed=1)
    check(again.choices[0].text == r.choices[0].text, "the same seed gives the same text")
    # Stop sequences: cut at the first occurrence, finish_reason stop.
    long = c.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=40, seed=5)
    base = long.choices[0].text
    if len(base) > 12:
        stop = base[8:11]
        cut = c.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=40, seed=5, stop=[stop])
        check(cut.choices[0].text == base[: base.index(stop)] and cut.choices[0].finish_reason == "stop",
              f"stop {stop!r}: {cut.choices[0].text!r} vs {base!r}")
    # The diffusion settings through the extension object.
    r = c.completions.create(model=MODEL, prompt="abc", max_tokens=8,
                             extra_body={"dg": {"steps": 2, "entropy_bound": 0.5, "t_min": 0.2, "t_max": 0.9,
                                                "stability_threshold": 1, "confidence_threshold": 0.01}})
    check(max(r.model_extra["dg"]["steps_per_canvas"]) <= 2, f"dg.steps: {r.model_extra}")
    # A wrong key is an authentication error.
    try:
        s.client(key="wrong").models.list()
        check(False, "a wrong key is refused")
    except openai.AuthenticationError:
        pass
    print("openai client: ok")


def test_multi_turn_reuse(s):
    c = s.client()
    turns = [{"role": "user", "content": "Tell me about the sea."}]
    first = c.chat.completions.create(model=MODEL, messages=turns, max_tokens=16, seed=2)
    turns += [{"role": "assistant", "content": first.choices[0].message.content},
              {"role": "user", "content": "And the sky?"}]
    second = c.chat.completions.create(model=MODEL, messages=turns, max_tokens=16, seed=2)
    reused = second.model_extra["dg"]["reused_prompt_tokens"]
    check(reused >= first.usage.prompt_tokens, f"the second turn reuses the first prompt's cache: {second.model_extra}")
    print(f"multi-turn: second turn reused {reused} of {second.usage.prompt_tokens} prompt tokens; "
          f"first canvas {second.model_extra['dg']['first_canvas_ms']:.2f} ms "
          f"(first turn {first.model_extra['dg']['first_canvas_ms']:.2f} ms)")


def pool_counters(s):
    """(pool hits, misses, evictions, entries, bytes) from /metrics."""
    _, data = s.request("GET", "/metrics")
    text = data.decode()
    hits = float(re.search(r'^dg_cache_hits_total\{cache="pool"\} (\S+)$', text, re.M).group(1))
    return (hits, *(float(re.search(rf"^{name} (\S+)$", text, re.M).group(1)) for name in
                     ["dg_cache_misses_total", "dg_cache_pool_evictions_total", "dg_cache_pool_entries",
                      "dg_cache_pool_bytes"]))


def test_interleaved_conversations(s):
    """Conversations A, B, then A's next turn: A's cache waited in the pool while B ran."""
    c = s.client()
    a = [{"role": "user", "content": "Tell me about rivers."}]
    b = [{"role": "user", "content": "List three colours, please, in any order you like."}]
    a1 = c.chat.completions.create(model=MODEL, messages=a, max_tokens=16, seed=4)
    c.chat.completions.create(model=MODEL, messages=b, max_tokens=16, seed=4)
    hits, misses, _, entries, _ = pool_counters(s)
    check(entries >= 1, f"A's cache is parked while B runs: {entries} entries")
    a += [{"role": "assistant", "content": a1.choices[0].message.content}, {"role": "user", "content": "And lakes?"}]
    a2 = c.chat.completions.create(model=MODEL, messages=a, max_tokens=16, seed=4)
    dg, cached = a2.model_extra["dg"], a2.usage.prompt_tokens_details.cached_tokens
    check(dg["cache"] == "pool" and cached == dg["reused_prompt_tokens"] >= a1.usage.prompt_tokens,
          f"A's second turn continues from the pool: {dg}, cached_tokens {cached}, A's first prompt {a1.usage.prompt_tokens}")
    hits2, misses2, *_ = pool_counters(s)
    check((hits2, misses2) == (hits + 1, misses), f"/metrics: pool hits {hits} -> {hits2}, misses {misses} -> {misses2}")
    print(f"interleaved conversations: A's second turn continued from the pool ({cached} of "
          f"{a2.usage.prompt_tokens} prompt tokens cached; prefill {dg['prefill_ms']:.2f} ms)")


def completion(s, prompt, **extra):
    resp, data = s.request("POST", "/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 4,
                                                       "dg": {"steps": 1}} | extra)
    check(resp.status == 200, f"completion: {resp.status} {data[:300]!r}")
    return json.loads(data)


def prompt_of(n, salt):
    return [3 + (i * 7 + salt) % 900 for i in range(n)]


def pooled_entry_bytes(s):
    """The pool's bytes for one cache of a 20-token prompt (answered in one canvas: the prompt alone)."""
    completion(s, prompt_of(20, 501))
    before = pool_counters(s)[4]
    completion(s, prompt_of(20, 502))
    return pool_counters(s)[4] - before


def test_eviction(binary, backend, entry_bytes):
    """A budget of two and a half caches: the least recently parked one goes first."""
    budget = int(2.5 * entry_bytes)
    s = Server(binary, backend, "--api-key", KEY, "--cache-budget", str(budget))
    try:
        p = [prompt_of(20, salt) for salt in range(4)]
        for prompt in p:
            completion(s, prompt)
        _, _, evictions, entries, pool_bytes = pool_counters(s)
        check((evictions, entries) == (1, 2) and pool_bytes <= budget,
              f"P1 evicted when P3 was parked: {evictions} evictions, {entries} entries, {pool_bytes} of {budget} bytes")
        check(completion(s, p[0] + [5])["dg"]["cache"] == "none", "P1's cache was evicted")
        # Parking P4 evicted P2, the least recently parked; P3 is still there.
        check(completion(s, p[2] + [5])["dg"]["cache"] == "pool", "P3's cache is kept")
        check(completion(s, p[1] + [5])["dg"]["cache"] == "none", "P2's cache was evicted")
        check(pool_counters(s)[4] <= budget, "the pool stays within its budget")
        healthy(s)
        check(s.stop() == 0, "exit 0")
    except BaseException:
        sys.stderr.write("".join(s.log[-40:]))
        s.proc.kill()
        raise
    print(f"eviction: --cache-budget {budget} (2.5 caches of {entry_bytes:.0f} bytes) keeps the two most recently parked")


def test_raw_http(s):
    for path, body, chat in [("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, True),
                             ("/v1/completions", {"prompt": [2, 17, 42]}, False)]:
        body = body | {"model": MODEL, "max_tokens": 10}
        resp, data = s.request("POST", path, body)
        check(resp.status == 200, f"{path}: {resp.status} {data!r}")
        whole = json.loads(data)
        check(whole["usage"]["completion_tokens"] <= 10 and whole["choices"][0]["finish_reason"], f"{whole}")
        for drafts in (False, True):
            events, done = sse(s, path, body | {"dg": {"drafts": drafts}})
            _, last = check_stream(events, done, chat, 10)
            draft_events = [d for e, d in events if e == "draft"]
            check(bool(draft_events) == drafts, f"drafts {drafts}: {len(draft_events)} draft events")
            for d in draft_events:
                check(d["choices"] == [] and isinstance(d["dg"]["draft"]["text"], str), f"draft shape {d}")
    resp, data = s.request("GET", "/metrics")
    text = data.decode()
    for name in ["dg_requests_total", "dg_queue_depth", "dg_prompt_tokens_total", "dg_generated_tokens_total",
                 "dg_steps_per_canvas_bucket", "dg_tokens_per_forward_bucket", "dg_prefill_seconds_bucket",
                 "dg_step_seconds_bucket", "dg_cache_pool_bytes", "dg_cache_pool_entries", "dg_cache_pool_budget_bytes",
                 "dg_cache_hits_total", "dg_cache_misses_total", "dg_cache_pool_evictions_total"]:
        check(name in text, f"/metrics has {name}")
    print("raw http: ok")


def test_api_key(s):
    for method, path in [("GET", "/v1/models"), ("GET", "/metrics"), ("POST", "/v1/completions")]:
        resp, data = s.request(method, path, {"model": MODEL, "prompt": "x"}, key=None)
        err = json.loads(data)["error"]
        check(resp.status == 401 and err["code"] == "invalid_api_key", f"{path} without a key: {resp.status} {data!r}")
    healthy(s)
    print("api key: ok")


def expect_error(s, status, body, param=None, path="/v1/chat/completions", headers=None, code=None):
    resp, data = s.request("POST", path, body, headers=headers)
    check(resp.status == status, f"{body!r:.120}: want {status}, got {resp.status} {data[:300]!r}")
    err = json.loads(data)["error"]
    check(set(err) == {"message", "type", "param", "code"} and err["message"], f"error shape {err}")
    if param:
        check(err["param"] == param, f"param {err['param']} != {param}")
    if code:
        check(err["code"] == code, f"code {err['code']} != {code}")
    healthy(s)


def test_bad_input(s):
    ok = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    expect_error(s, 400, b'{"model": "tiny-random", "messages": [')
    expect_error(s, 400, b"[1, 2]")
    expect_error(s, 400, b'{"model": "tiny-random", "messages": [{"role": "user", "content": "\xff\xfe"}]}')
    expect_error(s, 400, ok | {"max_tokens": "5"}, "max_tokens")
    expect_error(s, 400, ok | {"messages": "hi"}, "messages")
    expect_error(s, 400, ok | {"messages": []}, "messages")
    expect_error(s, 400, ok | {"messages": [{"role": "user"}]}, "messages[0]")
    expect_error(s, 404, ok | {"model": "gpt-4"}, "model")
    expect_error(s, 400, ok | {"max_tokens": 0}, "max_tokens")
    expect_error(s, 400, ok | {"max_tokens": -3}, "max_tokens")
    expect_error(s, 400, ok | {"max_tokens": 10**12}, "max_tokens")
    expect_error(s, 400, ok | {"n": 2}, "n")
    expect_error(s, 400, ok | {"logprobs": True}, "logprobs")
    expect_error(s, 400, ok | {"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools")
    expect_error(s, 400, ok | {"stream": "yes"}, "stream")
    expect_error(s, 400, ok | {"dg": {"steps": 0}}, "dg")
    expect_error(s, 400, ok | {"dg": {"stepz": 3}}, "dg.stepz")
    expect_error(s, 400, ok | {"dg": {"test_output": "x"}}, "dg.test_output")
    over = [2 + i % 900 for i in range(4100)]
    expect_error(s, 400, {"model": MODEL, "prompt": over}, path="/v1/completions", code="context_length_exceeded")
    expect_error(s, 400, {"model": MODEL, "prompt": [2, 99999]}, "prompt", path="/v1/completions")
    expect_error(s, 400, {"model": MODEL, "prompt": ""}, "prompt", path="/v1/completions")
    expect_error(s, 413, ok | {"pad": "x" * (5 << 20)})
    resp, data = s.request("GET", "/v1/nothing")
    check(resp.status == 404 and "error" in json.loads(data), f"unknown path {resp.status}")
    # A connection that sends nothing, or only part of a request, is dropped after the timeout.
    for partial in [b"", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"]:
        sock = socket.create_connection((s.host, s.port))
        sock.settimeout(10)
        sock.sendall(partial)
        start = time.time()
        got = sock.recv(65536)
        waited = time.time() - start
        sock.close()
        check(waited < 8 and (got == b"" or b" 408 " in got.split(b"\r\n")[0]), f"partial {partial!r}: {got!r:.100} after {waited:.1f} s")
    # A body shorter than its Content-Length: 408 after the timeout.
    sock = socket.create_connection((s.host, s.port))
    sock.settimeout(10)
    sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
                 "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"model\"".encode())
    got = sock.recv(65536)
    sock.close()
    check(got == b"" or b" 408 " in got.split(b"\r\n")[0], f"short body: {got!r:.100}")
    healthy(s)
    print("bad input: ok (each a 4xx in OpenAI's error shape, /health OK after each)")


def test_disconnect_cancels(s):
    """Requests whose client leaves, streamed (5) and whole (2): each generation is cancelled at its
    next step, not run to its 3000 tokens."""
    before, generated = metric(s, "dg_cancelled_total"), metric(s, "dg_generated_tokens_total")
    body = {"model": MODEL, "prompt": [2, 17, 42], "max_tokens": 3000,
            "dg": {"drafts": True, "steps": 48, "stability_threshold": 1000}}
    sent = 0
    for stream, seeds in [(True, range(5)), (False, range(2))]:
        for seed in seeds:
            payload = json.dumps(body | {"seed": seed, "stream": stream}).encode()
            sock = socket.create_connection((s.host, s.port))
            sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
                         f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
            if stream:
                sock.recv(4096)
            else:
                # A whole answer sends nothing until the end: leave while the engine works on its
                # first canvas (48 steps: it cannot have ended on an EOS yet).
                wait_for(lambda: metric(s, "dg_queue_depth") == 0, "the request reaches the engine")
                time.sleep(0.05)
            sock.close()
            sent += 1
            wait_for(lambda: metric(s, "dg_cancelled_total") >= before + sent, f"request {sent} (stream {stream}) cancelled")
    check(metric(s, "dg_generated_tokens_total") - generated < 3000, "no generation ran to its end")
    check(metric(s, "dg_queue_depth") == 0, "the queue drains")
    healthy(s)
    r = completion(s, [2, 17, 42])
    check(r["choices"][0]["finish_reason"] in ("stop", "length"), f"a request after the disconnects is answered: {r}")
    print("disconnect: streamed and whole requests cancelled")


def wait_for(cond, what, timeout=60):
    deadline = time.time() + timeout
    while not cond():
        check(time.time() < deadline, f"timed out: {what}")
        time.sleep(0.05)


def metric(s, name):
    _, data = s.request("GET", "/metrics")
    m = re.search(rf"^{name} (\S+)$", data.decode(), re.M)
    return float(m.group(1))


def load_test(s, clients, per_client, steps):
    """`clients` threads, each `per_client` streamed chat requests; every stream must be complete."""
    latencies, failures = [], []
    lock = threading.Lock()

    def worker(i):
        for j in range(per_client):
            body = {"model": MODEL, "messages": [{"role": "user", "content": f"client {i} request {j}"}],
                    "max_tokens": 16, "seed": i * 100 + j, "dg": {"steps": steps}}
            start = time.time()
            try:
                events, done = sse(s, "/v1/chat/completions", body)
                check_stream(events, done, True, 16)
                with lock:
                    latencies.append(time.time() - start)
            except Exception as e:  # noqa: BLE001 - every failure is reported below
                with lock:
                    failures.append(f"client {i} request {j}: {e!r}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    start = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    wall = time.time() - start
    check(not failures, f"load test failures: {failures[:5]}")
    check(len(latencies) == clients * per_client, f"{len(latencies)} of {clients * per_client} requests done")
    healthy(s)
    lat = sorted(latencies)
    p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))]
    print(f"load test: {clients} concurrent streaming clients x {per_client} requests ({steps} steps) = {len(lat)} requests, "
          f"all complete; {len(lat) / wall:.1f} requests/s, p50 {statistics.median(lat) * 1e3:.0f} ms, "
          f"p99 {p99 * 1e3:.0f} ms")


def batch_bodies():
    """Text completions of different prompt lengths, seeds and answer lengths (one to two canvases)."""
    return [{"model": MODEL, "prompt": prompt_of(n, salt), "max_tokens": max_tokens, "seed": seed, "dg": {"steps": 4}}
            for n, salt, max_tokens, seed in [(5, 11, 16, 1), (40, 12, 40, 2), (12, 13, 64, 3), (21, 14, 8, 4)]]


def reuse_bodies():
    """A text completion answered in one canvas, then one whose prompt extends it (its cache holds
    the first prompt alone)."""
    first = prompt_of(30, 21)
    return [{"model": MODEL, "prompt": p, "max_tokens": 4, "seed": 6, "dg": {"steps": 4}} for p in [first, first + [5, 6]]]


def batch_expected(s):
    """Each batch body's text, then each reuse body's, from the one-request-at-a-time server."""
    texts = []
    for body in batch_bodies() + reuse_bodies():
        resp, data = s.request("POST", "/v1/completions", body)
        check(resp.status == 200, f"completion: {resp.status} {data[:300]!r}")
        texts.append(json.loads(data)["choices"][0]["text"])
    return texts


def test_batched(binary, backend, expected):
    """`--batch 3`: concurrent streams share the batch beside a long request whose client then
    leaves; each gets the text it gets alone, and the leaving one frees its slot."""
    s = Server(binary, backend, "--api-key", KEY, "--batch", "3")
    try:
        long_body = {"model": MODEL, "prompt": [2, 17, 42], "max_tokens": 3000, "seed": 5, "stream": True,
                     "dg": {"steps": 48, "stability_threshold": 1000}}
        payload = json.dumps(long_body).encode()
        sock = socket.create_connection((s.host, s.port))
        sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
                     f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
        sock.recv(4096)
        wait_for(lambda: metric(s, "dg_running") == 1, "the long request runs")
        bodies, got, failures = batch_bodies(), {}, []

        def one(i):
            try:
                events, done = sse(s, "/v1/completions", bodies[i])
                got[i] = check_stream(events, done, False, bodies[i]["max_tokens"])[0]
            except Exception as e:  # noqa: BLE001 - reported below
                failures.append(f"request {i}: {e!r}")

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(bodies))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=600)
        check(not failures, f"batched requests failed: {failures}")
        for i, want in enumerate(expected[:len(bodies)]):
            check(got.get(i) == want, f"request {i} in the batch: {got.get(i)!r}, alone: {want!r}")
        # Beside the long request, a prompt that extends an earlier one continues from its cache.
        first, second = reuse_bodies()
        answers = []
        for body in [first, second]:
            resp, data = s.request("POST", "/v1/completions", body)
            check(resp.status == 200, f"completion: {resp.status} {data[:300]!r}")
            answers.append(json.loads(data))
        dg = answers[1]["dg"]
        check(dg["cache"] in ("resident", "pool") and dg["reused_prompt_tokens"] == len(first["prompt"]),
              f"the second prompt continues from the first's cache beside the long request: {dg}")
        for answer, want in zip(answers, expected[len(bodies):]):
            check(answer["choices"][0]["text"] == want, f"reused: {answer['choices'][0]['text']!r}, alone: {want!r}")
        check(metric(s, "dg_running") == 1, "the long request still runs")
        cancelled = metric(s, "dg_cancelled_total")
        sock.close()
        wait_for(lambda: metric(s, "dg_cancelled_total") == cancelled + 1, "the long request is cancelled")
        wait_for(lambda: metric(s, "dg_running") == 0, "its slot is free")
        healthy(s)
        check(s.stop() == 0, "exit 0 on SIGINT")
    except BaseException:
        sys.stderr.write("".join(s.log[-40:]))
        s.proc.kill()
        raise
    print(f"batch: {len(bodies)} concurrent streams beside a long request each got their text alone; a prompt "
          f"extending an earlier one reused its cache ({dg['cache']}) beside it; the long one's client left and its slot freed")


def test_full_queue(binary, backend):
    s = Server(binary, backend, "--queue", "1", "--api-key", KEY)
    statuses, retry = [], []
    lock = threading.Lock()

    def one():
        resp, _ = s.request("POST", "/v1/completions", {"model": MODEL, "prompt": [2, 3], "max_tokens": 64})
        with lock:
            statuses.append(resp.status)
            if resp.status == 429:
                retry.append(resp.getheader("Retry-After"))

    threads = [threading.Thread(target=one) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check(429 in statuses and 200 in statuses and set(statuses) <= {200, 429}, f"statuses {statuses}")
    check(all(r == "1" for r in retry), f"Retry-After {retry}")
    healthy(s)
    check(s.stop() == 0, "exit 0 on SIGINT")
    print(f"full queue: {statuses.count(429)} of 12 answered 429 with Retry-After")


def test_sigterm_finishes_in_flight(s, max_tokens):
    result = {}

    def slow():
        result["events"] = sse(s, "/v1/completions", {"model": MODEL, "prompt": [2, 3], "max_tokens": max_tokens,
                                                         "dg": {"steps": 8}})

    t = threading.Thread(target=slow)
    t.start()
    time.sleep(0.3)
    s.proc.send_signal(15)
    code = s.proc.wait(timeout=40)
    t.join(timeout=10)
    check(code == 0, f"exit status {code} after SIGTERM")
    check("events" in result, "the in-flight request was answered")
    check_stream(*result["events"], False, max_tokens)
    print("SIGTERM: in-flight request finished, exit 0")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default="target/release/dg")
    ap.add_argument("--backend", default="cpu", choices=["cpu", "gpu"])
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--requests", type=int, default=4, help="requests per load-test client")
    ap.add_argument("--load-steps", type=int, default=4, help="denoising steps of each load-test request")
    args = ap.parse_args()
    start = time.time()
    try:
        s = Server(args.binary, args.backend, "--api-key", KEY)
    except StartFailed as e:
        if args.backend == "gpu" and os.environ.get("DG_ALLOW_NO_GPU") == "1" and "adapter" in str(e).lower():
            print(f"SKIP dg serve (gpu): no GPU adapter (DG_ALLOW_NO_GPU=1): {e.args[0].strip()}")
            return
        raise SystemExit(f"dg serve did not start: {e}")
    try:
        test_openai_client(s)
        test_multi_turn_reuse(s)
        test_interleaved_conversations(s)
        entry_bytes = pooled_entry_bytes(s)
        batch_texts = batch_expected(s)
        test_raw_http(s)
        test_api_key(s)
        test_bad_input(s)
        test_disconnect_cancels(s)
        load_test(s, args.clients, args.requests, args.load_steps)
        # Long enough to be in flight when the signal comes (lavapipe's steps are ~100x the CPU's).
        test_sigterm_finishes_in_flight(s, 2048 if args.backend == "cpu" else 32)
    except BaseException:
        sys.stderr.write("".join(s.log[-40:]))
        s.proc.kill()
        raise
    test_full_queue(args.binary, args.backend)
    test_batched(args.binary, args.backend, batch_texts)
    test_eviction(args.binary, args.backend, entry_bytes)
    print(f"dg serve ({args.backend}): all checks passed in {time.time() - start:.1f} s")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""End-to-end test of `dg serve`'s `POST /v1/systemone` with TypeSafe's own Python SDK
(`typesafe-sdk`) and raw HTTP, on the bundled model.

The bundled tokenizer writes "yes" in two tokens, so no noul question could have one answer slot;
the test serves a copy of the model whose tokenizer has "▁yes" as one token (in place of "~"),
everything else unchanged. Checked: every question type and the answers given
without a read, the same request giving the same answers, `samples` (billed per read), `steps`, `sequential`,
the re-read rule (an unsure read is averaged with three more: the same probabilities as
`samples: 4`), a state read after another with the same questions answering bit for bit as when
read first (on the GPU encoding only what follows the shared system text: `/metrics`' read
counters), `dg read` answering as the server does (and with `think`), `GET /v1/models` in both shapes, the headers, and every error of OpenJev's table
(403/401, 400 unknown model, 400 unknown question type, 422 field errors, 400 unanswerable
requests, 400 for a state past the model's positions, 413, 529 when the reader's queue is full),
`/health` OK after each.

OpenJev's extensions: `think` (a thought the engine generates before the read: answers, the
thought's tokens as `output_tokens`, its prompt billed beside the read's, the same request the same
thought) and `images` (on a text model OpenJev's 400 for a text upstream; every bad image value
OpenJev's 400 or 422; with `think` or `sequential` a 400 naming the field). Then a server on
fixtures/vision-generate (a model with a vision tower) reads states with the committed test images:
the image's soft tokens billed, the same image the same answers (a data URL or a
`{content_type, base64}` object), another image other answers, and a read after another image's
answering bit for bit as when read first (no cache holds one image for another).

    python3 tools/serve_tests/test_systemone.py --binary target/release/dg [--backend gpu]

On the GPU backend the reads run on the engine's model (batched read forwards); `dg read` runs on
the same backend.
"""

import argparse
import base64
import json
import math
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_serve import KEY, Server, healthy  # noqa: E402
from typesafe_sdk import (  # noqa: E402
    Choice,
    Noul,
    RetryPolicy,
    Score,
    TypeSafeAuthenticationError,
    TypeSafeBadRequestError,
    TypeSafeClient,
    TypeSafeInternalServerError,
    TypeSafeUnprocessableEntityError,
)

MODEL = "tiny-random"
STATE = {"ticket": "I was charged twice for one order. Please fix this.", "priority": 2}


def model_copy(root: Path, out: Path) -> Path:
    """The bundled model with "▁yes" one token: the id of "~" (a byte no merge uses) renamed, and
    "▁yes" an added token (matched before the byte-pair merges) of that id."""
    shutil.copytree(root / "models" / "tiny-random", out)
    path = out / "tokenizer.json"
    tok = json.loads(path.read_text())
    vocab = tok["model"]["vocab"]
    assert not any("~" in (a + b) for a, b in tok["model"]["merges"])
    yes = vocab.pop("~")
    vocab["\u2581yes"] = yes
    tok["added_tokens"].append({"id": yes, "content": "\u2581yes", "single_word": False, "lstrip": False,
                                "rstrip": False, "normalized": True, "special": False})
    path.write_text(json.dumps(tok, ensure_ascii=False))
    return out


def questions():
    return {
        "billing": Noul(instructions="Is the ticket about billing?"),
        "team": Choice(instructions="Which team handles it?", criteria={"payments": "money", "shipping": None, "support": "other"}),
        "urgency": Score(instructions="How urgent is it?", criteria=["not urgent", "soon", "now"]),
        "only": Choice(criteria={"refund": None}),
        "level": Score(criteria=["the one level"]),
    }


def check_answers(r):
    a = r.answers
    assert list(a) == ["billing", "team", "urgency", "only", "level"], list(a)
    assert a["billing"].type == "noul" and 0.0 <= a["billing"].noul <= 1.0
    team = a["team"]
    assert team.type == "choice" and team.choice in ("payments", "shipping", "support")
    assert math.isclose(sum(team.probabilities.values()), 1.0, rel_tol=1e-9)
    assert team.probabilities[team.choice] == max(team.probabilities.values())
    assert 0.0 <= team.confidence <= 1.0
    urgency = a["urgency"]
    assert urgency.type == "score" and 0.0 <= urgency.score <= 2.0
    assert math.isclose(urgency.score, sum(k * p for k, p in urgency.probabilities.items()), rel_tol=1e-9)
    assert urgency.legend == {0: "not urgent", 1: "soon", 2: "now"}
    assert a["only"].choice == "refund" and a["only"].probabilities == {"refund": 1.0} and a["only"].confidence == 1.0
    assert a["level"].score == 0.0 and a["level"].probabilities == {0: 1.0}
    assert r.usage.input_tokens > 0 and r.usage.output_tokens == 0


def probabilities(r):
    a = r.answers
    return [a["billing"].noul, a["team"].probabilities, a["urgency"].probabilities]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--binary", required=True)
    parser.add_argument("--backend", default="cpu", choices=["cpu", "gpu"])
    args = parser.parse_args()
    root = Path(__file__).resolve().parents[2]
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        model = model_copy(root, Path(tmp) / MODEL)
        server = Server(args.binary, args.backend, "--model", str(model), "--api-key", KEY)
        try:
            run(server, args.backend)
            cli_matches(server, args.binary, model, args.backend)
        finally:
            server.proc.terminate()
            server.proc.wait(timeout=30)
        overload(args.binary, model, args.backend)
    vision(args.binary, root, args.backend)
    print(f"systemone ({args.backend}): all checks passed in {time.time() - started:.1f} s")


def read_tokens(server):
    """The server's counters of typed reads' prompt tokens: (all, found in the read cache)."""
    resp, data = server.request("GET", "/metrics")
    assert resp.status == 200, data
    value = lambda name: int(re.search(rf"^{name} (\d+)$", data.decode(), re.M).group(1))
    return value("dg_read_prompt_tokens_total"), value("dg_read_reused_prompt_tokens_total")


def prefix_reuse(server, client, backend):
    """A state read after another state with the same questions (one group) gives the answers it
    gives first, bit for bit; on the GPU it encodes only what follows the prefix the two prompts
    share (the system text), on the CPU it finds its whole cache kept. The server's first reads."""
    other = {"ticket": "Where is my parcel? It was due on Monday.", "priority": 1}
    asked = {"billing": Noul(instructions="Is the ticket about billing?"),
             "urgency": Score(instructions="How urgent is it?", criteria=["not urgent", "soon", "now"])}
    assert read_tokens(server) == (0, 0), "the first reads of the server"
    alone = client.system_one(state=other, questions=asked, extra_body={"samples": 1})
    assert read_tokens(server) == (alone.usage.input_tokens, 0), (read_tokens(server), alone.usage.input_tokens)
    client.system_one(state=STATE, questions=asked, extra_body={"samples": 1})
    before = read_tokens(server)
    after_another = client.system_one(state=other, questions=asked, extra_body={"samples": 1})
    total, reused = (a - b for a, b in zip(read_tokens(server), before))
    assert total == after_another.usage.input_tokens
    if backend == "gpu":
        assert 0 < reused < total, f"the system text's tokens are kept, the state's encoded: {reused} of {total} reused"
    else:
        assert reused == total, f"the CPU reader keeps the whole prompt's cache: {reused} of {total} reused"
    got, want = after_another.answers, alone.answers
    assert (got["billing"].noul, got["urgency"].probabilities) == (want["billing"].noul, want["urgency"].probabilities), \
        ("reads after a kept prefix differ from a fresh encode's", got, want, total, reused)
    print(f"prefix reuse ({backend}): {reused} of {total} prompt tokens reused, answers bit-identical")


def run(server, backend):
    client = TypeSafeClient(api_key=KEY, base_url=server.url, model=MODEL, retry=RetryPolicy(max_retries=0))
    prefix_reuse(server, client, backend)

    # Every question type, and the answers given without a read; the same request, the same answers.
    first = client.system_one(state=STATE, questions=questions())
    check_answers(first)
    again = client.system_one(state=STATE, questions=questions())
    assert probabilities(again) == probabilities(first), "the same request read different noise"
    assert client.system_one(state=STATE, questions=questions(), model="jev-latest").answers == first.answers

    # samples: that many reads, averaged and billed; the re-read rule: the random model is unsure
    # (top-20 entropy far above 0.1 nats), so a plain request is read 4 times (the canvases of
    # samples 0..3) and billed once.
    one = client.system_one(state=STATE, questions=questions(), extra_body={"samples": 1})
    four = client.system_one(state=STATE, questions=questions(), extra_body={"samples": 4})
    assert four.usage.input_tokens == 4 * one.usage.input_tokens == 4 * first.usage.input_tokens
    assert probabilities(first) == probabilities(four), "an unsure read is the mean of four reads"
    assert probabilities(first) != probabilities(one), "an unsure read was not read again"
    check_answers(four)

    # steps: denoising steps before the read move the free rows, so the answers change.
    stepped = client.system_one(state=STATE, questions=questions(), extra_body={"steps": 4})
    check_answers(stepped)
    assert probabilities(stepped) != probabilities(first)

    # sequential: 5 score questions are 3 groups on the bundled model's canvas; each group's prompt
    # continues the whole question list after the answers chosen before (longer prompts: more billed).
    many = {f"s{i}": {"type": "score", "instructions": f"Level {i}?", "criteria": ["low", "high"]} for i in range(5)}
    plain = client.system_one(state=STATE, questions=many)
    chained = client.system_one(state=STATE, questions=many, extra_body={"sequential": True})
    assert list(chained.answers) == list(many) and chained.usage.input_tokens > plain.usage.input_tokens
    assert [a.probabilities for a in chained.answers.values()] != [a.probabilities for a in plain.answers.values()]

    # Both model lists in one body.
    listed = client.models.list()
    assert [m.name for m in listed.models] == [MODEL], listed
    resp, data = server.request("GET", "/v1/models")
    assert json.loads(data)["data"][0]["id"] == MODEL

    # Headers.
    resp, data = server.request("POST", "/v1/systemone", {"state": "x", "model": MODEL, "questions": {"q": {"type": "noul"}}})
    assert resp.status == 200, data
    assert re.fullmatch(r"model;dur=[\d.]+, server;dur=[\d.]+, total;dur=[\d.]+, prefill;dur=[\d.]+, read;dur=[\d.]+", resp.getheader("server-timing")), resp.getheader("server-timing")
    assert re.fullmatch(r"req_[0-9a-f]{32}", resp.getheader("x-typesafe-request-id"))

    thoughts(server, client)
    errors(server, client)


def thoughts(server, client):
    """`think`: a thought of at most `think` tokens before each group's read. Its tokens are
    `output_tokens`; the input billed is the thought's prompt (the chat prompt with thinking on and
    the open tag) and the read's, which holds that prompt, the thought and the close tag: more
    than twice a plain read's. The same request thinks and answers the same; `think: 0` is a plain
    read."""
    asked = {"billing": Noul(instructions="Is the ticket about billing?"),
             "urgency": Score(instructions="How urgent is it?", criteria=["not urgent", "soon", "now"])}
    plain = client.system_one(state=STATE, questions=asked, extra_body={"samples": 1})
    budget = 8
    thought = client.system_one(state=STATE, questions=asked, extra_body={"samples": 1, "think": budget})
    assert list(thought.answers) == ["billing", "urgency"] and 0.0 <= thought.answers["billing"].noul <= 1.0, thought
    assert 0 <= thought.usage.output_tokens <= budget, thought.usage
    assert thought.usage.input_tokens > 2 * plain.usage.input_tokens + thought.usage.output_tokens, (thought.usage, plain.usage)
    again = client.system_one(state=STATE, questions=asked, extra_body={"samples": 1, "think": budget})
    assert (again.answers, again.usage) == (thought.answers, thought.usage), "the same request thought otherwise"
    assert thought.answers["urgency"].probabilities != plain.answers["urgency"].probabilities
    zero = client.system_one(state=STATE, questions=asked, extra_body={"samples": 1, "think": 0})
    assert (zero.answers, zero.usage) == (plain.answers, plain.usage)
    # Two samples: the same thought read twice, its prompt billed once. The second read's prompt
    # is the thought's prompt, the thought and the close tag.
    two = client.system_one(state=STATE, questions=asked, extra_body={"samples": 2, "think": budget})
    assert two.usage.output_tokens == thought.usage.output_tokens, (two.usage, thought.usage)
    read_prompt = two.usage.input_tokens - thought.usage.input_tokens
    think_prompt = thought.usage.input_tokens - read_prompt
    assert read_prompt > think_prompt + thought.usage.output_tokens > 0, (read_prompt, think_prompt, thought.usage)
    # Sequential: one thought under the whole list (5 score questions are 3 groups), billed once.
    many = {f"s{i}": {"type": "score", "instructions": f"Level {i}?", "criteria": ["low", "high"]} for i in range(5)}
    chained = client.system_one(state=STATE, questions=many, extra_body={"sequential": True, "think": budget})
    assert list(chained.answers) == list(many) and 0 <= chained.usage.output_tokens <= budget, chained.usage
    # Not sequential: each of the 3 groups thinks its own thought.
    grouped = client.system_one(state=STATE, questions=many, extra_body={"think": budget})
    assert list(grouped.answers) == list(many) and 0 <= grouped.usage.output_tokens <= 3 * budget, grouped.usage
    print(f"think: {thought.usage.output_tokens} thought tokens, {thought.usage.input_tokens} input tokens "
          f"(a plain read {plain.usage.input_tokens})")


def vision_copy(root: Path, out: Path) -> Path:
    """fixtures/vision-generate with a canvas of 32: its own (8) holds no answer template, and a
    canvas's length is no weight's shape."""
    shutil.copytree(root / "fixtures" / "vision-generate", out)
    path = out / "config.json"
    config = json.loads(path.read_text())
    config["canvas_length"] = 32
    path.write_text(json.dumps(config))
    return out


def vision(binary, root, backend):
    """Images on a model with a vision tower (fixtures/vision-generate at 70 soft tokens an image):
    a read of a state with an image bills the image's soft tokens (and its two markers) beside the
    text's; the same image (as a data URL or a `{content_type, base64}` object) gives the same
    answers, another image others; a read after another image's gives, bit for bit, what it gives
    first (no cache of one image serves another); an image the tower cannot read is a 400."""
    tmp = tempfile.TemporaryDirectory()
    fixture = vision_copy(root, Path(tmp.name) / "vision")
    server = Server(binary, backend, "--model", str(fixture), "--served-model-name", "vision", "--api-key", KEY,
                    "--image-tokens", "70")
    try:
        def image(name):
            return base64.b64encode((root / "fixtures" / "image-processor" / name).read_bytes()).decode()

        def read(images, **extra):
            body = {"state": "What is in the picture?", "model": "vision", "samples": 1,
                    "questions": {"shape": {"type": "choice", "instructions": "Which shape?",
                                            "criteria": {"wide": None, "tall": None, "square": None}},
                                  "size": {"type": "score", "criteria": ["small", "large"]}},
                    **({"images": images} if images is not None else {}), **extra}
            resp, data = server.request("POST", "/v1/systemone", body)
            assert resp.status == 200, data[:500]
            return json.loads(data)

        wide, tall = image("wide.png"), image("tall.png")
        text = read(None)
        first = read([f"data:image/png;base64,{wide}"])
        # The placeholder becomes the image's markers and soft tokens (at most 70).
        grown = first["usage"]["input_tokens"] - text["usage"]["input_tokens"]
        assert 2 < grown <= 70 + 2, (first["usage"], text["usage"])
        assert first["usage"]["output_tokens"] == 0 and list(first["answers"]) == ["shape", "size"], first
        assert first["answers"] != text["answers"]
        other = read([f"data:image/png;base64,{tall}"])
        assert other["answers"] != first["answers"], "two images, one answer"
        again = read([{"content_type": "image/png", "base64": wide}])
        assert again == first, ("the same image read otherwise after another", again, first)
        two = read([f"data:image/png;base64,{wide}", f"data:image/png;base64,{tall}"])
        tall_grown = other["usage"]["input_tokens"] - text["usage"]["input_tokens"]
        assert two["usage"]["input_tokens"] == text["usage"]["input_tokens"] + grown + tall_grown, (two["usage"], grown, tall_grown)
        jpeg = read([f"data:image/jpeg;base64,{image('rotated.jpg')}"])
        assert jpeg["answers"] != first["answers"]
        truncated = base64.b64encode(base64.b64decode(wide)[:100]).decode()
        resp, data = server.request("POST", "/v1/systemone", {"state": "x", "model": "vision", "images": [f"data:image/png;base64,{truncated}"],
                                                             "questions": {"s": {"type": "score", "criteria": ["a", "b"]}}})
        assert resp.status == 400 and json.loads(data)["detail"].startswith("the model rejected this request: image 0:"), data
        healthy(server)
        print(f"vision ({backend}): an image read bills {first['usage']['input_tokens']} tokens "
              f"(the text {text['usage']['input_tokens']}); same image same answers, another image others")
    finally:
        server.proc.terminate()
        server.proc.wait(timeout=30)
        tmp.cleanup()


def overload(binary, model, backend):
    """OpenJev's overload answer: with a reader queue of one (`--read-queue 1`), a burst of
    concurrent requests gets 529s (`overloaded_error`, `Retry-After: 1`) beside 200s, the server
    stays healthy, the SDK without retries raises the 529, and with its retry policy (which honours
    Retry-After) every request of a burst is answered."""
    server = Server(binary, backend, "--model", str(model), "--api-key", KEY, "--read-queue", "1")
    try:
        many = {f"s{i}": {"type": "score", "instructions": f"Level {i}?", "criteria": ["low", "high"]} for i in range(5)}
        body = {"state": STATE, "model": MODEL, "samples": 4, "steps": 2, "questions": many}
        with ThreadPoolExecutor(16) as pool:
            results = list(pool.map(lambda _: server.request("POST", "/v1/systemone", body), range(16)))
        statuses = [resp.status for resp, _ in results]
        assert 529 in statuses and 200 in statuses and set(statuses) <= {200, 529}, statuses
        for resp, data in results:
            if resp.status == 529:
                assert json.loads(data) == {"detail": {"error_type": "overloaded_error", "message": "The server is at capacity. Retry shortly."}}, data
                assert resp.getheader("retry-after") == "1"
        healthy(server)

        def ask(retries, extra):
            client = TypeSafeClient(api_key=KEY, base_url=server.url, model=MODEL, retry=RetryPolicy(max_retries=retries))
            try:
                return client.system_one(state=STATE, questions=questions(), extra_body=extra)
            except TypeSafeInternalServerError as e:
                return e

        with ThreadPoolExecutor(8) as pool:
            bare = list(pool.map(lambda _: ask(0, {"samples": 4, "steps": 2}), range(8)))
        refused = [e for e in bare if isinstance(e, TypeSafeInternalServerError)]
        assert refused and all(e.status == 529 for e in refused), bare
        # One read each, retried a second after each 529 until answered.
        with ThreadPoolExecutor(6) as pool:
            retried = list(pool.map(lambda _: ask(60, {"samples": 1}), range(6)))
        assert not any(isinstance(r, Exception) for r in retried), retried
        for r in retried:
            check_answers(r)
        print(f"overload ({backend}): {statuses.count(529)} of 16 raw requests and {len(refused)} of 8 SDK requests answered 529; "
              "with the SDK's retries all 6 answered")
    finally:
        server.proc.terminate()
        server.proc.wait(timeout=30)


def cli_matches(server, binary, model, backend):
    """`dg read` answers a request as the server does."""
    request = {"state": STATE, "questions": {"team": {"type": "choice", "criteria": {"payments": None, "shipping": "boxes"}},
                                             "billing": {"type": "noul", "instructions": "Billing?"}}}
    resp, data = server.request("POST", "/v1/systemone", {**request, "model": MODEL, "samples": 2})
    assert resp.status == 200, data
    cli = subprocess.run([binary, "read", "--model", str(model), "--samples", "2", "--backend", backend], input=json.dumps(request),
                         capture_output=True, text=True, check=True)
    assert json.loads(cli.stdout) == json.loads(data), (cli.stdout, data)
    assert list(json.loads(cli.stdout)["answers"]) == ["team", "billing"]
    # With `think` dg read generates the thought on the engine dg serve runs.
    thinking = subprocess.run([binary, "read", "--model", str(model), "--backend", backend], input=json.dumps({**request, "think": 6}),
                              capture_output=True, text=True, check=True)
    answered = json.loads(thinking.stdout)
    assert list(answered["answers"]) == ["team", "billing"] and 0 <= answered["usage"]["output_tokens"] <= 6, answered


def errors(server, client):
    def expect(status, body, key=KEY, detail=None):
        resp, data = server.request("POST", "/v1/systemone", body, key=key)
        assert resp.status == status, (status, resp.status, data[:500])
        got = json.loads(data).get("detail") if status != 200 else json.loads(data)
        if detail is not None:
            assert got == detail, (got, detail)
        healthy(server)
        return got

    ok = {"state": "x", "model": MODEL, "questions": {"q": {"type": "noul"}}}
    expect(403, ok, key=None, detail={"error_type": "authentication_error", "message": "Must supply an API key! Check your request and try again."})
    try:
        TypeSafeClient(api_key="wrong", base_url=server.url, retry=RetryPolicy(max_retries=0)).system_one(state="x", questions={"q": Noul(instructions="Is it x?")}, model=MODEL)
        raise AssertionError("a wrong key was accepted")
    except TypeSafeAuthenticationError as e:
        assert e.status == 401
    try:
        client.system_one(state="x", questions={"q": Noul(instructions="Is it x?")}, model="nope")
        raise AssertionError("an unknown model was accepted")
    except TypeSafeBadRequestError as e:
        assert "Unknown model: nope" in str(e)
    expect(400, {**ok, "questions": {"q": {"type": "box"}}}, detail={"error_type": "api_usage_error", "message": "Invalid request."})
    for bad, field in [
        ({"model": MODEL, "questions": ok["questions"]}, "state"),
        ({"state": "x", "questions": ok["questions"]}, "model"),
        ({**ok, "questions": {}}, "questions"),
        ({**ok, "questions": {"q": {"instructions": "no type"}}}, "questions"),
        ({**ok, "questions": {"q": {"type": "choice"}}}, "questions"),
        ({**ok, "questions": {"q": {"type": "score", "criteria": []}}}, "questions"),
        ({**ok, "state": 5}, "state"),
        ({**ok, "steps": 9}, "steps"),
        ({**ok, "samples": 0}, "samples"),
        ({**ok, "think": -1}, "think"),
        ({**ok, "sequential": "sometimes"}, "sequential"),
    ]:
        detail = expect(422, bad)
        assert any(e["loc"][:2] == ["body", field] for e in detail), (field, detail)
    try:
        client.system_one(state="x", questions={"q": Noul(instructions="Is it x?")}, extra_body={"steps": 0})
        raise AssertionError("steps 0 was accepted")
    except TypeSafeUnprocessableEntityError as e:
        assert e.status == 422
    resp, data = server.request("POST", "/v1/systemone", b"{not json")
    assert resp.status == 422 and json.loads(data)["detail"][0]["type"] == "json_invalid", data
    expect(400, {**ok, "questions": {"q": {"type": "choice", "criteria": {}}}}, detail="Choice question must have at least one choice: q")
    expect(400, {**ok, "questions": {"q": {"type": "score", "criteria": [str(i) for i in range(11)]}}},
           detail="Too many score levels. Must have at most 10 levels.")
    expect(400, {**ok, "questions": {f"q{i}": {"type": "noul"} for i in range(257)}}, detail="at most 256 questions per request")
    # images: OpenJev's checks first (400s with its messages, 422s from its request model), then
    # what its upstream answers for a text model. (An image over 5 MiB needs a body over the
    # server's 4 MiB `--max-body`: the unit tests check its message.)
    png = "data:image/png;base64,AAAA"
    expect(400, {**ok, "images": [png]}, detail="the model rejected this request: this model reads text only; send the state without images")
    expect(400, {**ok, "images": [png] * 9}, detail="at most 8 images per request")
    shape = "an image is a data:image/...;base64 string or a {content_type, base64} object"
    for bad, detail in [
        ("https://example.com/cat.png", shape),
        ("data:image/png,AAAA", shape),
        ("data:image/bmp;base64,AAAA", "image type 'image/bmp' is not supported; use JPEG, PNG, WebP or GIF"),
        ({"content_type": "text/plain", "base64": "AAAA"}, "image type 'text/plain' is not supported; use JPEG, PNG, WebP or GIF"),
        ("data:image/png;base64,AAA", "image data is not valid base64"),
        ("data:image/png;base64,not base64!", "image data is not valid base64"),
    ]:
        expect(400, {**ok, "images": [bad]}, detail=detail)
    for bad in ["one", [5], [{"content_type": "image/png"}], [{"base64": "AAAA", "content_type": 3}]]:
        detail = expect(422, {**ok, "images": bad})
        assert all(e["loc"][:2] == ["body", "images"] for e in detail), detail
    expect(400, {**ok, "images": [png], "think": 4}, detail="think needs a text state; send images without it")
    expect(400, {**ok, "images": [png], "sequential": True}, detail="sequential needs a text state; send images without it")
    # Every question answered without a read: no image reaches the model.
    assert expect(200, {**ok, "questions": {"q": {"type": "choice", "criteria": {"x": None}}}, "images": [png]})
    for bad in [4097, "many", 1.5]:
        detail = expect(422, {**ok, "think": bad})
        assert detail[0]["loc"] == ["body", "think"], detail
    detail = expect(400, {**ok, "state": "many words " * 3000})
    assert detail.startswith("the model rejected this request:") and "max_position_embeddings" in detail, detail
    expect(413, {**ok, "state": "x" * (5 << 20)})
    healthy(server)


if __name__ == "__main__":
    sys.exit(main())

"""``sglang-specvocab check-lossless`` against fake SGLang servers (OpenAI routes and /generate, streamed
or not, /abort_request): greedy parity against the target and the EAGLE3 control, the sampling check
(a faithful and a biased server), the load check; and its tiny-checkpoint server set against SGLang's
own argument parser."""

import json
import os
import random
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from fake_http import FakeServer, JsonHandler

from sglang_specvocab.errors import SpecVocabError
from sglang_specvocab.tools.bench.loadtest import LoadSettings, load_plan
from sglang_specvocab.tools.bench.lossless import TINY_SET, controls, tiny_configs
from sglang_specvocab.tools.bench.sampling import homogeneity
from sglang_specvocab.tools.bench.server import ServerConfig, SpecBenchError
from sglang_specvocab.tools.cli import main
from sglang_specvocab.tools.prompts import round_robin_prompts

ROOT = Path(__file__).resolve().parents[1]
CATEGORIES = ["writing", "translation", "qa", "math_reasoning"]  # 'writing' folds into mt_bench
QUESTIONS = [
    {"question_id": 100 * (c + 1) + i, "category": cat, "turns": [f"{cat} question {i}: say something"]}
    for c, cat in enumerate(CATEGORIES)
    for i in range(4)
]
TOKENS = list(range(1000, 1006))  # the fake target's sampled tokens
WEIGHTS = [0.35, 0.25, 0.15, 0.12, 0.08, 0.05]


def _main():
    return lambda args: main(["check-lossless", *args])


def model_text(prompt: str, n: int) -> str:
    """The fake target's greedy continuation: the prompt's words backwards, n of them."""
    words = prompt.split()[::-1] * 8
    return " ".join(words[:n])


def distribution(prompt: str, j: int) -> list[int]:
    """The fake target's tokens at position j of a sample, most likely first (probabilities WEIGHTS)."""
    return random.Random(f"{prompt}|{j}").sample(TOKENS, len(TOKENS))


class Fake(FakeServer):
    """A server answering greedily with ``model_text``, except where ``wrong(route, prompt)`` is true.

    Sampled /generate batches (temperature > 0, a list of texts) draw position j's token from
    ``distribution(prompt, j)``; ``bias`` is the share of samples whose position-1 token is replaced by
    the most likely one. ``context``: prompts longer (in characters) are refused as SGLang refuses them.
    ``broken(n)``: the n-th request gets HTTP 500. Streams are SSE (OpenAI deltas, /generate's whole
    text so far); /abort_request aborts a waiting /generate with that rid. It records every request and
    the most requests it had in flight at once."""

    def __init__(
        self,
        name="default",
        flat=False,
        wrong=None,
        accept=None,
        telemetry=False,
        delay=0.01,
        bias=0.0,
        seed=0,
        context=None,
        broken=None,
    ):
        self.name, self.accept, self.telemetry, self.bias, self.context = name, accept, telemetry, bias, context
        self.flat = flat  # sampled tokens uniform over 100,000 ids: no token gets a bin of its own
        self.wrong = wrong or (lambda route, prompt: False)
        self.broken = broken
        self.requests, self.lock = [], threading.Lock()
        self.in_flight = self.max_in_flight = self.posts = 0
        self.delay = delay
        self.rng = random.Random(seed)
        self.aborted, self.disconnects = set(), 0
        fake = self

        class Handler(JsonHandler):
            def do_GET(self):
                if self.path == "/health":
                    self._send(200)
                elif self.path == "/v1/models":
                    self._send(200, {"object": "list", "data": [{"id": fake.name, "object": "model"}]})
                else:
                    self._send(404, {"detail": "Not Found"})

            def do_POST(self):
                payload = self._payload()
                if self.path == "/abort_request":
                    with fake.lock:
                        fake.aborted.add(payload["rid"])
                    return self._send(200)
                with fake.lock:
                    fake.posts += 1
                    n = fake.posts
                    fake.in_flight += 1
                    fake.max_in_flight = max(fake.max_in_flight, fake.in_flight)
                time.sleep(fake.delay)
                try:
                    if fake.broken and fake.broken(n):
                        return self._send(500, {"error": {"message": "the scheduler died"}})
                    code, body = fake.reply(self.path, payload)
                    if code == 200 and payload.get("stream"):
                        return self._stream(body)
                    if code == 200 and payload.get("rid"):
                        code, body = fake.wait_for_abort(payload["rid"], body)
                    self._send(code, body)
                finally:
                    with fake.lock:
                        fake.in_flight -= 1

            def _stream(self, events):
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                try:
                    for e in [*events, "[DONE]"]:
                        data = e if isinstance(e, str) else json.dumps(e)
                        self.wfile.write(f"data: {data}\n\n".encode())
                        self.wfile.flush()
                        time.sleep(0.005)
                except (BrokenPipeError, ConnectionResetError):
                    with fake.lock:
                        fake.disconnects += 1

        self._listen(Handler)

    def reply(self, path, payload):
        if path == "/generate" and isinstance(payload["text"], list):
            return 200, self.samples(payload)
        if path == "/v1/chat/completions":
            route, prompt, n = "chat", payload["messages"][0]["content"], payload["max_tokens"]
        elif path == "/v1/completions":
            route, prompt, n = "completions", payload["prompt"], payload["max_tokens"]
        elif path == "/generate":
            route, prompt = "generate", payload["text"]
            n = payload["sampling_params"]["max_new_tokens"]
        else:
            return 404, {"detail": "Not Found"}
        if route != "generate" and payload["model"] != self.name:
            return 400, {"error": {"message": f"model {payload['model']!r} is not served"}}
        if self.context is not None and len(prompt) > self.context:
            return 400, {
                "object": "error",
                "message": f"The input ({len(prompt)} tokens) is longer than the "
                f"model's context length ({self.context} tokens).",
                "code": 400,
            }
        temperature = payload["sampling_params"]["temperature"] if route == "generate" else payload["temperature"]
        text = model_text(prompt, n)
        if temperature > 0:
            with self.lock:
                text = " ".join(self.rng.sample(text.split(), len(text.split())))
        elif self.wrong(route, prompt):
            text = text[:7] + "X" + text[8:]
        with self.lock:
            self.requests.append((route, prompt, n))
        ids = [ord(ch) for ch in text]
        usage = {"completion_tokens": n, "prompt_tokens": len(prompt)}
        if payload.get("stream"):
            words = text.split(" ")
            pieces = [w + (" " if i < len(words) - 1 else "") for i, w in enumerate(words)]
            if route == "chat":
                events = [{"choices": [{"delta": {"content": p}, "finish_reason": None}]} for p in pieces]
                events.append({"choices": [{"delta": {}, "finish_reason": "length"}]})
            elif route == "completions":
                events = [{"choices": [{"text": p, "finish_reason": None}]} for p in pieces]
                events[-1]["choices"][0]["finish_reason"] = "length"
            else:
                events = [
                    {"text": "".join(pieces[: i + 1]), "output_ids": ids, "meta_info": {}}
                    for i in range(len(pieces) - 1)
                ]
                events.append({"text": text, "output_ids": ids, "meta_info": self.meta(n, prompt)})
            return 200, events
        if route == "chat":
            return 200, {
                "choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": "length"}],
                "usage": usage,
            }
        if route == "completions":
            return 200, {"choices": [{"text": text, "finish_reason": "length"}], "usage": usage}
        meta = self.meta(n, prompt)
        if self.telemetry:
            meta["dynvocab_set_size"] = [100.0, 120.0]
            meta["dynvocab_coverage"] = 0.75
        return 200, {"text": text, "output_ids": ids, "meta_info": meta}

    def meta(self, n, prompt):
        meta = {"completion_tokens": n, "prompt_tokens": len(prompt), "finish_reason": {"type": "length", "length": n}}
        if self.accept:
            meta["spec_verify_ct"] = -(-n // self.accept)
        return meta

    def samples(self, payload):
        params = payload["sampling_params"]
        assert params["temperature"] > 0 and params["ignore_eos"] is True
        out = []
        for prompt in payload["text"]:
            with self.lock:
                ids = [self.rng.choices(distribution(prompt, j), WEIGHTS)[0] for j in range(params["max_new_tokens"])]
                if self.flat:
                    ids = [self.rng.randrange(100_000) for _ in ids]
                if len(ids) > 1 and self.rng.random() < self.bias:
                    ids[1] = distribution(prompt, 1)[0]
                self.requests.append(("sample", prompt, len(ids)))
            meta = self.meta(len(ids), prompt)
            if self.telemetry:
                meta["dynvocab_set_size"] = [100.0]
            out.append({"text": "".join(chr(i) for i in ids), "output_ids": ids, "meta_info": meta})
        return out

    def wait_for_abort(self, rid, body):
        """A /generate with a rid runs for 0.6 s unless /abort_request names it: then an abort (finish
        reason abort, or an HTTP error when the rid ends in an odd digit, both as SGLang may answer)."""
        deadline = time.monotonic() + 0.6
        while time.monotonic() < deadline:
            with self.lock:
                if rid in self.aborted:
                    if int(rid[-1]) % 2:
                        return 400, {"error": {"message": "Abort in waiting queue"}}
                    return 200, {**body, "meta_info": {**body["meta_info"], "finish_reason": {"type": "abort"}}}
            time.sleep(0.01)
        return 200, body


def serve_from_argv(argv) -> None:
    """A launched fake: ``... --serve --model-path M [--pid-file F] [--delay S] --host H --port P`` (any
    other ``--flag value`` pairs ignored)."""
    opt = {argv[i]: argv[i + 1] for i in range(0, len(argv) - 1, 2)}
    fake = Fake(delay=float(opt.get("--delay", 0.01)))
    if "--pid-file" in opt:
        Path(opt["--pid-file"]).write_text(str(os.getpid()))
    fake.serve_forever_at(opt["--host"], opt["--port"])


@pytest.fixture
def questions(tmp_path):
    path = tmp_path / "question.jsonl"
    path.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    return path


def test_prompts_round_robin_over_categories(questions):
    got = round_robin_prompts(questions, 6)
    assert [p.category for p in got] == ["mt_bench", "translation", "qa", "math_reasoning", "mt_bench", "translation"]
    assert [p.pid for p in got] == ["100", "200", "300", "400", "101", "201"]
    assert got[0].text == "writing question 0: say something"
    assert round_robin_prompts(questions, 6) == got
    with pytest.raises(SpecVocabError, match="has 16 questions; 17 prompts"):
        round_robin_prompts(questions, 17)


def _args(questions, out, *configs, prompts=6, extra=()):
    args = [
        "--out",
        str(out),
        "--questions",
        str(questions),
        "--prompts",
        str(prompts),
        "--max-new-tokens",
        "5",
        "--no-progress",
    ]
    for c in configs:
        args += ["--config", c]
    return args + list(extra)


# --- greedy -----------------------------------------------------------------------------------------


def test_greedy_compares_with_the_target_and_the_control(questions, tmp_path, capsys):
    """DYNVOCAB equal to the target passes, whatever its control does; the control's differences are the engine's."""
    bad = lambda route, prompt: route == "chat" and "translation question 0" in prompt
    with Fake("ref") as ref, Fake("dyn", accept=2, telemetry=True) as dyn, Fake("eg", wrong=bad, accept=3) as eg:
        rc = _main()(
            _args(
                questions,
                tmp_path,
                f"name=target,algorithm=none,url={ref.url}",
                f"name=dyn,algorithm=DYNVOCAB,url={dyn.url},control=eagle",
                f"name=eagle,algorithm=EAGLE3,url={eg.url}",
            )
        )
        out = capsys.readouterr().out
    assert rc == 0
    result = json.loads((tmp_path / "lossless.json").read_text())
    assert result["lossless"] is True and result["reference"] == "target" and result["checks"] == ["greedy"]
    assert {c["name"]: c["control"] for c in result["configs"]} == {"target": None, "dyn": "eagle", "eagle": None}
    g = result["greedy"]
    assert g["routes"] == ["chat", "completions", "generate"] and g["concurrencies"] == [1, 8] and g["passed"]
    for fake in (ref, dyn, eg):  # one warmup + 6 prompts x 3 routes x 2 concurrencies
        assert len(fake.requests) == 1 + 36
        # staggered lengths (5 - i % 4 * 5 // 8): requests in flight together end at different steps
        assert {(r, n) for r, _, n in fake.requests[1:]} == {
            (r, n) for r in ("chat", "completions", "generate") for n in (5, 4)
        }
    per_prompt = [{(r, p): n for r, p, n in fake.requests[1:]} for fake in (ref, dyn, eg)]
    assert per_prompt[0] == per_prompt[1] == per_prompt[2]  # every server gets the same length per prompt
    assert ref.max_in_flight > 1  # concurrency 8 really overlaps requests
    rows = {(r["config"], r["route"], r["concurrency"]): r for r in g["rows"]}
    assert len(rows) == 12 and all(
        r["compared"] == 6 and r["missing"] == 0 and r["skipped"] == 0 for r in rows.values()
    )
    assert all(r["equal"] == 6 and r["ours"] == 0 and r["control"] == "eagle" for k, r in rows.items() if k[0] == "dyn")
    for c in (1, 8):
        row = rows[("eagle", "chat", c)]
        assert (row["equal"], row["engine"], row["ours"]) == (5, 1, 0) and len(row["mismatches"]) == 1
        m = row["mismatches"][0]
        assert (m["prompt"], m["category"], m["char"], m["token"], m["kind"]) == (
            "200",
            "translation",
            7,
            None,
            "engine",
        )
        assert m["expected"][7] != m["got"][7]
        assert rows[("eagle", "completions", c)]["equal"] == 6
    gen = rows[("dyn", "generate", 1)]
    # lengths 5, 5, 4, 4, 5, 5 (staggered): 28 tokens over 4 x ceil(5 / 2) + 2 x ceil(4 / 2) verify steps
    assert gen["accept_length"] == pytest.approx(28 / 16)
    assert gen["dynvocab_set_size"] == pytest.approx(110.0) and gen["dynvocab_coverage"] == pytest.approx(0.75)
    assert rows[("dyn", "chat", 1)]["accept_length"] is None  # the OpenAI routes carry no verify count
    assert g["reference_batch_invariance"] == [
        {"route": r, "concurrency": 8, "against": 1, "compared": 6, "equal": 6}
        for r in ("chat", "completions", "generate")
    ]
    md = (tmp_path / "lossless.md").read_text()
    assert "verdict: lossless" in md and "| eagle | EAGLE3 | - | chat | 8 | 5 | 1 | 0 | 0 | 0 |" in md
    assert "engine: `eagle` chat c8 prompt 200 (translation) against the target, char 7" in md and md in out


def test_engine_numerics_pass_and_a_difference_of_ours_fails(questions, tmp_path):
    """DYNVOCAB differing from the target like its control: engine (exit 0). Differing from both: ours (exit 1)."""
    engine = lambda route, prompt: route == "generate" and "qa question 0" in prompt
    ours = lambda route, prompt: engine(route, prompt) or (route == "completions" and "qa question 1" in prompt)
    with Fake() as ref, Fake(wrong=engine) as eg, Fake(wrong=engine) as dyn, Fake(wrong=ours) as dyn2:
        specs = (
            f"name=t,algorithm=none,url={ref.url}",
            f"name=e,algorithm=EAGLE3,url={eg.url}",
            f"name=d,algorithm=DYNVOCAB,url={dyn.url},control=e",
        )
        assert _main()(_args(questions, tmp_path / "a", *specs, prompts=8)) == 0
        result = json.loads((tmp_path / "a" / "lossless.json").read_text())
        gen = [r for r in result["greedy"]["rows"] if r["config"] == "d" and r["route"] == "generate"]
        assert [(r["equal"], r["engine"], r["ours"]) for r in gen] == [(7, 1, 0)] * 2
        rc = _main()(
            _args(
                questions, tmp_path / "b", *specs[:2], f"name=d,algorithm=DYNVOCAB,url={dyn2.url},control=e", prompts=8
            )
        )
    assert rc == 1
    result = json.loads((tmp_path / "b" / "lossless.json").read_text())
    assert result["lossless"] is False and result["greedy"]["passed"] is False
    comp = [r for r in result["greedy"]["rows"] if r["config"] == "d" and r["route"] == "completions"]
    assert [(r["equal"], r["engine"], r["ours"]) for r in comp] == [(7, 0, 1)] * 2
    assert [(m["prompt"], m["kind"], m["char"]) for m in comp[0]["mismatches"]] == [("301", "ours", 7)]
    md = (tmp_path / "b" / "lossless.md").read_text()
    assert "NOT lossless" in md and "- ours: `d` completions c1 prompt 301 (qa) against the target, char 7" in md


def test_without_a_control_every_difference_is_ours(questions, tmp_path):
    bad = lambda route, prompt: route == "generate" and "qa question 1" in prompt
    with Fake() as ref, Fake(wrong=bad) as dyn:
        rc = _main()(
            _args(
                questions,
                tmp_path,
                f"name=t,algorithm=none,url={ref.url}",
                f"name=d,algorithm=DYNVOCAB,url={dyn.url}",
                prompts=8,
                extra=["--concurrency", "8"],
            )
        )
    assert rc == 1
    result = json.loads((tmp_path / "lossless.json").read_text())
    assert result["lossless"] is False and result["greedy"]["concurrencies"] == [8]
    row = next(r for r in result["greedy"]["rows"] if r["route"] == "generate")
    assert row["control"] is None and row["equal"] == 7
    assert [(m["prompt"], m["char"], m["token"], m["kind"]) for m in row["mismatches"]] == [("301", 7, 7, "ours")]
    assert "controls: `d` against `the target only`" in (tmp_path / "lossless.md").read_text()


def test_a_prompt_longer_than_the_context_is_skipped_and_counted(questions, tmp_path, capsys):
    """Prompts past the served context (here 30 characters) are refused with SGLang's HTTP 400: skipped,
    counted, cached (not sent again), never fatal."""
    specs = lambda ref, dyn: (f"name=t,algorithm=none,url={ref.url}", f"name=d,algorithm=DYNVOCAB,url={dyn.url}")
    long = [q for q in QUESTIONS[::4] if len(q["turns"][0]) > 30]  # the first question of each category
    assert len(long) == 3  # 'writing question 0: say something' is 33, 'qa question 0: ...' 28
    with Fake(context=30) as ref, Fake(context=30) as dyn:
        extra = ["--routes", "chat,generate", "--concurrency", "1"]
        assert _main()(_args(questions, tmp_path, *specs(ref, dyn), prompts=4, extra=extra)) == 0
        sent = len(dyn.requests)
        assert _main()(_args(questions, tmp_path, *specs(ref, dyn), prompts=4, extra=extra)) == 0
        assert len(dyn.requests) == sent  # everything cached, the skipped prompts too
    rows = json.loads((tmp_path / "lossless.json").read_text())["greedy"]["rows"]
    assert [(r["route"], r["compared"], r["skipped"], r["missing"]) for r in rows] == [
        ("chat", 1, 3, 0),
        ("generate", 1, 3, 0),
    ]
    assert "| d | DYNVOCAB | - | chat | 1 | 1 | 0 | 0 | 3 | 0 |" in (tmp_path / "lossless.md").read_text()


def test_resume_sends_only_missing_requests_and_settings_change_reruns(questions, tmp_path, capsys):
    with Fake() as ref, Fake() as dyn:
        specs = (f"name=t,algorithm=none,url={ref.url}", f"name=d,algorithm=DYNVOCAB,url={dyn.url}")
        assert _main()(_args(questions, tmp_path, *specs, extra=["--routes", "chat", "--concurrency", "1"])) == 0
        assert len(dyn.requests) == 1 + 6
        cache = tmp_path / "lossless-cache.jsonl"
        lines = cache.read_text().splitlines()
        cache.write_text("\n".join(lines[:-2]) + "\n{half a line")  # a run killed mid-write: two requests lost
        assert _main()(_args(questions, tmp_path, *specs, extra=["--routes", "chat", "--concurrency", "1"])) == 0
        assert len(dyn.requests) + len(ref.requests) == 2 * 7 + 2 + 1  # only the 2 lost ones, one warmup
        assert "ignored 1 unreadable line" in capsys.readouterr().err
        n = len(dyn.requests)
        assert (
            _main()(
                _args(
                    questions,
                    tmp_path,
                    *specs,
                    extra=["--routes", "chat", "--concurrency", "1", "--max-new-tokens", "6"],
                )
            )
            == 0
        )
        assert len(dyn.requests) == n + 1 + 6  # another budget: everything again


def test_a_check_that_fails_on_one_server_is_reported_and_the_others_still_run(questions, tmp_path, capsys):
    """A server that starts failing (HTTP 500 from its 5th request): its check is recorded as failed (exit 1),
    the other configurations run, and a resumed run does not send it again."""
    with Fake() as ref, Fake(broken=lambda n: n >= 5) as bad, Fake() as dyn:
        specs = (
            f"name=t,algorithm=none,url={ref.url}",
            f"name=bad,algorithm=DYNVOCAB,url={bad.url}",
            f"name=d,algorithm=DYNVOCAB,url={dyn.url}",
        )
        extra = ["--routes", "chat", "--concurrency", "1"]
        assert _main()(_args(questions, tmp_path, *specs, extra=extra)) == 1
        assert "[bad] greedy could not finish" in capsys.readouterr().err
        sent = bad.posts
        assert _main()(_args(questions, tmp_path, *specs, extra=extra)) == 1
        assert bad.posts == sent  # not retried
    result = json.loads((tmp_path / "lossless.json").read_text())
    (failure,) = result["failures"]
    assert failure["check"] == "greedy" and failure["config"] == "bad" and "HTTP 500" in failure["error"]
    rows = {r["config"]: r for r in result["greedy"]["rows"]}
    assert rows["d"]["equal"] == 6 and rows["bad"]["missing"] == 3  # the warmup and 3 requests got through
    md = (tmp_path / "lossless.md").read_text()
    assert "## Checks that could not finish" in md and "- greedy on `bad`: config 'bad', chat" in md


def test_controls_pair_by_arguments():
    base = ["--model-path", "T", "--speculative-draft-model-path", "D", "--speculative-eagle-topk", "4"]
    e = ServerConfig("e", "EAGLE3", [*base, "--speculative-algorithm", "EAGLE3"])
    e1 = ServerConfig("e1", "EAGLE3", ["--speculative-algorithm=EAGLE3", *base[:4], "--speculative-eagle-topk", "1"])
    d = ServerConfig(
        "d", "DYNVOCAB", ["--speculative-algorithm", "DYNVOCAB", *base, "--speculative-dynvocab-config", "c.yaml"]
    )
    d1 = ServerConfig(
        "d1", "DYNVOCAB", ["--speculative-algorithm=DYNVOCAB", *base[:4], "--speculative-eagle-topk", "1"]
    )
    other = ServerConfig("x", "DYNVOCAB", ["--model-path", "T", "--speculative-draft-model-path", "D2"])
    assert controls([ServerConfig("t", "none", ["--model-path", "T"]), e, e1, d, d1, other]) == {
        "d": "e",
        "d1": "e1",
        "x": None,
    }
    with pytest.raises(SpecBenchError, match="several EAGLE3 configurations have its arguments"):
        controls([e, ServerConfig("e2", "EAGLE3", list(e.args)), d])
    with pytest.raises(SpecBenchError, match="control 'd1' is not an EAGLE3 configuration of this run"):
        controls([e, ServerConfig("d", "DYNVOCAB", [], url="http://x", control="d1"), d1])


def test_errors_are_clear(questions, tmp_path, capsys):
    check = _main()
    with Fake() as ref:
        rc = check(_args(questions, tmp_path, f"name=t,algorithm=none,url={ref.url}", extra=["--routes", "chat"]))
        assert rc == 2 and "at least two configurations" in capsys.readouterr().err
        two = (f"name=t,algorithm=none,url={ref.url}", f"name=u,algorithm=none,url={ref.url}")
        rc = check(_args(questions, tmp_path, *two, extra=["--routes", "chat,stream"]))
        assert rc == 2 and "unknown route(s) stream" in capsys.readouterr().err
        rc = check(
            _args(questions, tmp_path, *two, f"name=d,algorithm=DYNVOCAB,url={ref.url}", extra=["--checks", "load"])
        )
        assert rc == 2 and "load: DYNVOCAB configuration(s) d have no EAGLE3 control" in capsys.readouterr().err
    rc = check(
        _args(
            questions,
            tmp_path,
            "name=t,algorithm=none,url=http://127.0.0.1:9",
            "name=u,args=--x",
            extra=["--server-timeout", "0.5", "--routes", "chat"],
        )
    )
    assert rc == 2 and "no healthy SGLang server at http://127.0.0.1:9" in capsys.readouterr().err
    for bad, why in (
        (["--only", "target"], "go with --tiny"),
        (["--dtype", "float32"], "go with --tiny"),
        (["--concurrency", "1,x"], "must be integers"),
        (["--concurrency", "0"], "must be positive"),
        (["--checks", "greedy,fuzz"], "fuzz: choose from greedy, sampling, load"),
    ):
        rc = check(["--out", str(tmp_path), "--config", "name=t,args=--x", *bad])
        err = capsys.readouterr().err
        assert rc == 2 and why in err and len(err.strip().splitlines()) == 1
    rc = check(
        ["--out", str(tmp_path), "--tiny", str(tmp_path / "tiny"), "--only", "nope", "--questions", str(questions)]
    )
    assert rc == 2 and "unknown tiny config(s) nope" in capsys.readouterr().err
    assert not (tmp_path / "tiny").exists()  # refused before making any checkpoint


def test_sigterm_stops_the_launched_servers_and_keeps_the_cache(questions, tmp_path):
    """``timeout`` (SIGTERM) during a run: exit 130, the launched server is stopped, the cache holds
    nothing half-written."""
    pid_file = tmp_path / "server.pid"
    launcher = shlex.join([sys.executable, str(Path(__file__)), "--serve"])
    cmd = [
        sys.executable,
        "-m",
        "sglang_specvocab",
        "check-lossless",
        *_args(
            questions,
            tmp_path / "out",
            f"name=t,args='--model-path m --pid-file {pid_file} --delay 0.3'",
            f"name=d,algorithm=DYNVOCAB,args='--model-path m --pid-file {pid_file} --delay 0.3'",
            extra=["--launcher", launcher, "--server-timeout", "60"],
        ),
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    cache = tmp_path / "out" / "lossless-cache.jsonl"
    deadline = time.monotonic() + 60
    while not (cache.is_file() and cache.read_text().count("\n") >= 2) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()
    server_pid = int(pid_file.read_text())
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "rerun the same command to resume" in err, (out, err)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(server_pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"the launched server {server_pid} still runs")
    records = [json.loads(line) for line in cache.read_text().splitlines()]
    assert 2 <= len(records) < 36 and all(r["config"] == "t" for r in records)
    assert (tmp_path / "out" / "logs" / "t.log").is_file()


# --- sampling ---------------------------------------------------------------------------------------


def test_homogeneity_statistic():
    same = Counter({1: 30, 2: 20, 3: 10})
    t = homogeneity(same, Counter(same))
    assert (t["chi2"], t["df"], t["p"], t["tv"]) == (0.0, 2, 1.0, 0.0)
    # a 2x2 table by hand: [[30, 10], [20, 20]]; pooled 50/30 of 80, expected 25/15 in both rows
    t = homogeneity(Counter({1: 30, 2: 10}), Counter({1: 20, 2: 20}))
    assert t["chi2"] == pytest.approx(2 * (25 / 25 + 25 / 15)) and t["df"] == 1
    assert t["p"] == pytest.approx(0.02092, abs=1e-5)  # chi-square(1) tail at 5.333: 2 (1 - Phi(2.3094))
    assert t["tv"] == pytest.approx(0.25)
    # rare tokens (fewer than 10 in both) share one bin; too few for a bin of their own join the smallest
    t = homogeneity(Counter({1: 40, 2: 30, 7: 3, 8: 2}), Counter({1: 40, 2: 30, 9: 4}))
    assert t["df"] == 1 and t["p"] < 1.0
    t = homogeneity(Counter({5: 4}), Counter({6: 4}))  # all rare: one bin of them, nothing to test
    assert (t["df"], t["p"], t["tv"]) == (0, 1.0, 1.0)
    with pytest.raises(SpecBenchError, match="non-empty"):
        homogeneity(Counter(), Counter({1: 3}))


def _sampling_args(questions, out, *configs):
    return _args(
        questions,
        out,
        *configs,
        extra=[
            "--checks",
            "sampling",
            "--sampling-prompts",
            "4",
            "--samples",
            "240",
            "--sample-tokens",
            "3",
            "--warmup",
            "0",
        ],
    )


def test_sampling_a_faithful_server_passes_and_a_biased_one_is_caught(questions, tmp_path, capsys):
    fast = {"delay": 0.0}
    with (
        Fake(seed=1, **fast) as ref,
        Fake(seed=2, **fast) as eg,
        Fake(seed=3, telemetry=True, **fast) as dyn,
        Fake(seed=4, bias=0.5, **fast) as bad,
    ):
        specs = [
            f"name=t,algorithm=none,url={ref.url}",
            f"name=e,algorithm=EAGLE3,url={eg.url}",
            f"name=d,algorithm=DYNVOCAB,url={dyn.url},control=e",
            f"name=b,algorithm=DYNVOCAB,url={bad.url},control=e",
        ]
        rc = _main()(_sampling_args(questions, tmp_path / "a", *specs[:3]))
        assert rc == 0
        assert [r for r in ref.requests if r[0] == "sample"] == [
            ("sample", p.text, 3) for p in round_robin_prompts(questions, 4) for _ in range(240)
        ]
        rc = _main()(_sampling_args(questions, tmp_path / "b", *specs))
    assert rc == 1
    s = json.loads((tmp_path / "b" / "lossless.json").read_text())["sampling"]
    assert s["tests_that_can_fail"] == 2 * 4 * 3 and s["threshold"] == pytest.approx(0.01 / 24)
    rows = {(r["config"], r["against"]): r for r in s["rows"]}
    assert set(rows) == {("d", "t"), ("d", "e"), ("b", "t"), ("b", "e"), ("e", "t")}
    assert all(r["tests"] == 12 for r in rows.values())
    for ok in (("d", "t"), ("d", "e"), ("e", "t")):
        assert rows[ok]["rejected"] == 0 and rows[ok]["min_p"] > s["threshold"]
    for caught in (("b", "t"), ("b", "e")):  # the bias sits at position 1 of every prompt
        assert rows[caught]["rejected"] >= 3 and rows[caught]["worst"]["position"] == 1
        assert rows[caught]["max_tv"] > 0.15
    assert {v["config"]: v["verdict"] for v in s["verdicts"]} == {"d": "equal", "b": "ours"}
    md = (tmp_path / "b" / "lossless.md").read_text()
    assert "## Sampling" in md and "| b | e | ours |" in md and "p < alpha / m = 0.01 / 24" in md


def test_sampling_differences_the_control_shares_are_the_engines(questions, tmp_path):
    with (
        Fake(seed=1, delay=0.0) as ref,
        Fake(seed=2, bias=0.5, delay=0.0) as eg,
        Fake(seed=3, bias=0.5, delay=0.0) as dyn,
    ):
        rc = _main()(
            _sampling_args(
                questions,
                tmp_path,
                f"name=t,algorithm=none,url={ref.url}",
                f"name=e,algorithm=EAGLE3,url={eg.url}",
                f"name=d,algorithm=DYNVOCAB,url={dyn.url},control=e",
            )
        )
    assert rc == 0
    s = json.loads((tmp_path / "lossless.json").read_text())["sampling"]
    assert s["verdicts"] == [{"config": "d", "control": "e", "verdict": "engine"}] and s["passed"]


def test_sampling_from_a_flat_distribution_is_inconclusive_not_passed(questions, tmp_path):
    with Fake(delay=0.0, flat=True) as ref, Fake(delay=0.0, flat=True) as dyn:
        rc = _main()(
            _sampling_args(
                questions, tmp_path, f"name=t,algorithm=none,url={ref.url}", f"name=d,algorithm=DYNVOCAB,url={dyn.url}"
            )
        )
    assert rc == 1
    s = json.loads((tmp_path / "lossless.json").read_text())["sampling"]
    assert s["verdicts"] == [{"config": "d", "control": None, "verdict": "inconclusive"}]
    assert s["rows"][0]["tests"] == 12 and s["rows"][0]["informative"] == 0


# --- load -------------------------------------------------------------------------------------------


def test_the_load_plan_is_a_seeded_mix():
    texts = [q["turns"][0] for q in QUESTIONS]
    plan = load_plan(LoadSettings(), texts)
    assert plan == load_plan(LoadSettings(), texts) and plan != load_plan(LoadSettings(seed=1), texts)
    assert len(plan) == 1000 and [r["i"] for r in plan] == list(range(1000))
    lengths = [len(r["prompt"]) for r in plan]
    assert min(lengths) >= 1 and max(lengths) <= 4096 and sum(x > 1024 for x in lengths) > 100
    assert sum(x < 64 for x in lengths) > 300  # log-uniform: short prompts are common, long ones present
    mix = Counter((r["route"], r["stream"], r["temperature"] > 0) for r in plan)
    assert len(mix) == 12  # every route, streamed or not, greedy or sampled
    aborts = Counter(r["abort"] for r in plan)
    assert 25 < aborts["disconnect"] < 80 and 25 < aborts["abort_request"] < 80
    assert all(r["stream"] and 1 <= r["after"] <= 3 for r in plan if r["abort"] == "disconnect")
    assert all(r["route"] == "generate" and not r["stream"] for r in plan if r["abort"] == "abort_request")
    assert all(8 <= r["max_new_tokens"] <= 64 for r in plan)


def _load_args(questions, out, *configs, extra=()):
    return _args(questions, out, *configs, extra=["--checks", "load", "--warmup", "0", *extra])


def test_load_of_a_thousand_requests_passes_on_faithful_servers(questions, tmp_path):
    with Fake("e", delay=0.002) as eg, Fake("d", delay=0.05, telemetry=True) as dyn:
        rc = _main()(
            _load_args(
                questions,
                tmp_path,
                f"name=t,algorithm=none,url={eg.url}",
                f"name=e,algorithm=EAGLE3,url={eg.url}",
                f"name=d,algorithm=DYNVOCAB,url={dyn.url},control=e",
            )
        )
    assert rc == 0
    s = json.loads((tmp_path / "lossless.json").read_text())["load"]
    assert s["requests"] == 1000 and s["concurrency"] == 1000 and s["passed"]
    assert dyn.max_in_flight > 30  # really concurrent (the fake accepts connections one at a time)
    (row,) = s["rows"]
    d = row["dynvocab"]
    assert d["alive"] is True and d["errors"] == 0 and d["missing"] == 0
    assert d["aborted_disconnect"] == s["mix"]["disconnect"] and dyn.disconnects >= 1
    # an /abort_request may come after its request finished (then it counts as finished, as on SGLang)
    assert 0 < d["aborted_abort_request"] <= len(dyn.aborted) <= s["mix"]["abort_request"]
    assert d["finished"] == 1000 - s["mix"]["disconnect"] - d["aborted_abort_request"]
    assert row["greedy_compared"] == row["greedy_equal"] > 500
    assert row["telemetry_present"] == row["telemetry_expected"] > 100
    assert d["prompt_tokens"][0] >= 1 and d["prompt_tokens"][1] > 3000


def test_load_catches_a_difference_missing_telemetry_and_a_dying_server(questions, tmp_path):
    wrong = lambda route, prompt: len(prompt) % 7 == 0
    small = ["--load-requests", "150", "--load-max-prompt", "400"]
    with (
        Fake("e", delay=0.002) as eg,
        Fake("d", delay=0.002, telemetry=True, wrong=wrong) as d1,
        Fake("d", delay=0.002) as d2,
        Fake("d", delay=0.002, telemetry=True, broken=lambda n: n > 100) as d3,
    ):
        specs = [f"name=t,algorithm=none,url={eg.url}", f"name=e,algorithm=EAGLE3,url={eg.url}"]
        rc = _main()(
            _load_args(
                questions,
                tmp_path,
                *specs,
                f"name=d1,algorithm=DYNVOCAB,url={d1.url},control=e",
                f"name=d2,algorithm=DYNVOCAB,url={d2.url},control=e",
                f"name=d3,algorithm=DYNVOCAB,url={d3.url},control=e",
                extra=small,
            )
        )
    assert rc == 1
    rows = {r["config"]: r for r in json.loads((tmp_path / "lossless.json").read_text())["load"]["rows"]}
    assert not any(r["passed"] for r in rows.values())
    r1 = rows["d1"]
    assert 0 < r1["greedy_equal"] < r1["greedy_compared"] and r1["differences"][0]["char"] == 7
    assert r1["telemetry_present"] == r1["telemetry_expected"] and r1["dynvocab"]["errors"] == 0
    r2 = rows["d2"]
    assert r2["greedy_equal"] == r2["greedy_compared"] and r2["telemetry_present"] == 0 < r2["telemetry_expected"]
    r3 = rows["d3"]["dynvocab"]
    assert r3["errors"] > 0 and "HTTP 500" in r3["first_errors"][0]["error"]
    md = (tmp_path / "lossless.md").read_text()
    assert "## Under load" in md and "differs from `e` at char 7" in md and "the scheduler died" in md


# --- the tiny server set ------------------------------------------------------------------------------


def _tiny_run(questions, tmp_path, out, refuse):
    """check-lossless --tiny on launched fakes (checkpoint folders with a config.json are all it looks for)."""
    for dtype in ("float32", "bfloat16"):
        for sub in ("target", "draft-d2t", "draft-full"):
            (tmp_path / "tiny" / dtype / sub).mkdir(parents=True, exist_ok=True)
            (tmp_path / "tiny" / dtype / sub / "config.json").write_text("{}")
    # ``--refuse ALGO:DTYPE``: that server exits at start, as one that cannot serve the dtype would (before
    # this module's imports: 2 s a launch)
    refusing = (
        "import runpy, sys; a = sys.argv[1:]; o = dict(zip(a[::2], a[1::2])); "
        "sys.exit(f'{o[\"--dtype\"]} is not supported here') "
        "if o['--refuse'] == o.get('--speculative-algorithm', 'none') + ':' + o['--dtype'] else None; "
        f"sys.path.insert(0, {str(Path(__file__).parent)!r}); sys.argv = [{str(Path(__file__))!r}, '--serve', *a]; "
        "runpy.run_path(sys.argv[0], run_name='__main__')"
    )
    rc = _main()(
        _args(
            questions,
            tmp_path / out,
            prompts=2,
            extra=["--tiny", str(tmp_path / "tiny"), "--only", "dynvocab-d2t", "--server-args", f"--refuse {refuse}"]
            + ["--launcher", shlex.join([sys.executable, "-c", refusing]), "--routes", "generate"]
            + ["--concurrency", "1", "--server-timeout", "60"],
        )
    )
    return rc, json.loads((tmp_path / out / "lossless.json").read_text())


def test_tiny_serves_float32_and_falls_back_to_bfloat16_only_where_the_engine_cannot(questions, tmp_path, capsys):
    """--dtype auto: a target that does not start in fp32 makes the run bf16, with the reason kept
    (a resumed run goes straight to bf16) and reported; a DYNVOCAB server that does not start in fp32
    where its control did is ours: recorded, exit 1, no fallback."""
    unserved = tmp_path / "tiny" / "float32.unserved"
    rc, result = _tiny_run(questions, tmp_path, "dyn", "DYNVOCAB:float32")
    assert rc == 1 and not unserved.exists()
    assert result["tiny"] == {"dtype": "float32", "float32_unserved": None}
    (failure,) = result["failures"]
    assert failure["config"] == "dynvocab-d2t" and "the server did not start" in failure["error"]
    assert "float32 is not supported here" in failure["error"]  # the server log's tail
    rows = {r["config"]: r for r in result["greedy"]["rows"]}
    assert rows["eagle3-d2t"]["equal"] == 2 and rows["dynvocab-d2t"]["missing"] == 2
    capsys.readouterr()

    rc, result = _tiny_run(questions, tmp_path, "target", "none:float32")
    err = capsys.readouterr().err
    assert rc == 0 and result["lossless"] and not result["failures"], result["failures"]
    assert "float32 is not served (server 'target' exited with code 1 before it became healthy" in err
    assert "float32 is not supported here" in unserved.read_text()
    assert result["tiny"]["dtype"] == "bfloat16" and "'target' exited" in result["tiny"]["float32_unserved"]
    assert all("bfloat16" in c["args"] and "float32" not in c["args"] for c in result["configs"])
    assert {r["config"]: r["equal"] for r in result["greedy"]["rows"]} == {"eagle3-d2t": 2, "dynvocab-d2t": 2}
    assert (
        "- tiny checkpoints: bfloat16 (float32 was not served: server 'target' exited"
        in (tmp_path / "target" / "lossless.md").read_text()
    )
    rc, _ = _tiny_run(questions, tmp_path, "target", "none:float32")  # resumed: bf16 at once, all cached
    out = capsys.readouterr().out
    assert rc == 0 and "launching" not in out and out.count("everything is cached") == 3


def test_tiny_configs_need_the_checkpoints(tmp_path):
    with pytest.raises(SpecBenchError, match="sglang-specvocab tiny-checkpoints --out"):
        tiny_configs(tmp_path)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, torchvision_standin):
    import torch  # not at the top: the launched fakes import this module

    from sglang_specvocab.integration.plugin import register
    from sglang_specvocab.tools.testing.tiny import make_tiny_checkpoints

    register()
    root = tmp_path_factory.mktemp("tiny")
    return make_tiny_checkpoints(root, vocab_size=4096, draft_vocab_size=1024, dtype=torch.float32)


@pytest.mark.sglang
def test_tiny_set_is_accepted_by_sglang(tiny):
    """Every server of the set parses with SGLang's own argument handling (DYNVOCAB through our plug-in),
    and every DYNVOCAB configuration has its EAGLE3 control; the checkpoints are fp32 as served."""
    for sub in ("target", "draft-d2t", "draft-full"):
        cfg = json.loads((tiny.root / sub / "config.json").read_text())
        assert cfg.get("dtype", cfg.get("torch_dtype")) == "float32", sub
    from sglang.srt.server_args import prepare_server_args

    configs = tiny_configs(tiny.root, ["--device", "cpu"], dynvocab_config=str(ROOT / "configs" / "microspec.yaml"))
    assert [c.name for c in configs] == [t[0] for t in TINY_SET]
    assert configs[0].algorithm == "none" and "--speculative-algorithm" not in configs[0].args
    assert controls(configs) == {f"dynvocab-{k}": f"eagle3-{k}" for k in ("d2t", "d2t-tree", "full", "full-tree")}
    for c, (_, algorithm, draft, topk, steps, nd) in zip(configs, TINY_SET, strict=True):
        sa = prepare_server_args(c.args)
        assert "--disable-cuda-graph" not in c.args and not sa.disable_cuda_graph
        assert sa.dtype == "float32"
        if algorithm == "none":
            assert sa.speculative_algorithm is None
            continue
        assert sa.speculative_algorithm == algorithm
        assert sa.speculative_draft_model_path == str(tiny.root / draft)
        assert (sa.speculative_eagle_topk, sa.speculative_num_steps, sa.speculative_num_draft_tokens) == (
            topk,
            steps,
            nd,
        )
    only = tiny_configs(tiny.root, names=["dynvocab-full-tree"], dtype="bfloat16")
    assert [c.name for c in only] == ["target", "eagle3-full-tree", "dynvocab-full-tree"]
    assert "bfloat16" in only[0].args
    with pytest.raises(SpecBenchError, match="unknown tiny config"):
        tiny_configs(tiny.root, names=["nope"])


if __name__ == "__main__" and sys.argv[1:2] == ["--serve"]:
    serve_from_argv(sys.argv[2:])

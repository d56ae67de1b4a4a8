"""``sglang-specvocab check-lossless`` against fake SGLang servers (OpenAI routes and /generate), and its
tiny-checkpoint server set against SGLang's own argument parser."""

import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers import FakeServer, JsonHandler

from sglang_specvocab.bench.lossless import TINY_SET, tiny_configs
from sglang_specvocab.bench.server import SpecBenchError
from sglang_specvocab.cli import main
from sglang_specvocab.errors import SpecVocabError
from sglang_specvocab.prompts import round_robin_prompts

ROOT = Path(__file__).resolve().parents[1]
CATEGORIES = ["writing", "translation", "qa", "math_reasoning"]  # 'writing' folds into mt_bench
QUESTIONS = [{"question_id": 100 * (c + 1) + i, "category": cat, "turns": [f"{cat} question {i}: say something"]}
             for c, cat in enumerate(CATEGORIES) for i in range(4)]


def _main():
    return lambda args: main(["check-lossless", *args])


def model_text(prompt: str, n: int) -> str:
    """The fake target's greedy continuation: the prompt's words backwards, n of them."""
    words = prompt.split()[::-1] * 8
    return " ".join(words[:n])


class Fake(FakeServer):
    """A server answering greedily with ``model_text``, except where ``wrong(route, prompt)`` is true.

    It records every request and the most requests it had in flight at once (a handler sleeps a little,
    so a client with 8 requests in flight is seen with more than one)."""

    def __init__(self, name="default", wrong=None, accept=None, telemetry=False, delay=0.01):
        self.name, self.accept, self.telemetry = name, accept, telemetry
        self.wrong = wrong or (lambda route, prompt: False)
        self.requests, self.lock = [], threading.Lock()
        self.in_flight = self.max_in_flight = 0
        self.delay = delay
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
                with fake.lock:
                    fake.in_flight += 1
                    fake.max_in_flight = max(fake.max_in_flight, fake.in_flight)
                time.sleep(fake.delay)
                try:
                    code, body = fake.reply(self.path, payload)
                finally:
                    with fake.lock:
                        fake.in_flight -= 1
                self._send(code, body)

        self._listen(Handler)

    def reply(self, path, payload):
        if path == "/v1/chat/completions":
            route, prompt, n = "chat", payload["messages"][0]["content"], payload["max_tokens"]
            if payload["model"] != self.name or payload["temperature"] != 0:
                return 400, {"error": {"message": "bad model or temperature"}}
        elif path == "/v1/completions":
            route, prompt, n = "completions", payload["prompt"], payload["max_tokens"]
            if payload["model"] != self.name or payload["temperature"] != 0:
                return 400, {"error": {"message": "bad model or temperature"}}
        elif path == "/generate":
            route, prompt = "generate", payload["text"]
            n = payload["sampling_params"]["max_new_tokens"]
            assert payload["sampling_params"]["temperature"] == 0
        else:
            return 404, {"detail": "Not Found"}
        text = model_text(prompt, n)
        if self.wrong(route, prompt):
            text = text[:7] + "X" + text[8:]
        with self.lock:
            self.requests.append((route, prompt, n))
        if route == "chat":
            return 200, {"choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": "length"}],
                         "usage": {"completion_tokens": n}}
        if route == "completions":
            return 200, {"choices": [{"text": text, "finish_reason": "length"}], "usage": {"completion_tokens": n}}
        meta = {"completion_tokens": n, "finish_reason": {"type": "length", "length": n}}
        if self.accept:
            meta["spec_verify_ct"] = -(-n // self.accept)
        if self.telemetry:
            meta["dynvocab_set_size"] = [100.0, 120.0]
            meta["dynvocab_coverage"] = 0.75
        return 200, {"text": text, "output_ids": [ord(ch) for ch in text], "meta_info": meta}



def serve_from_argv(argv) -> None:
    """A launched fake: ``... --serve --model-path M --pid-file F --delay S --host H --port P``."""
    opt = {argv[i]: argv[i + 1] for i in range(0, len(argv) - 1, 2)}
    fake = Fake(delay=float(opt.get("--delay", 0.01)))
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
    args = ["--out", str(out), "--questions", str(questions), "--prompts", str(prompts), "--max-new-tokens", "5",
            "--no-progress"]
    for c in configs:
        args += ["--config", c]
    return args + list(extra)


def test_lossless_dynvocab_and_a_control_that_differs(questions, tmp_path, capsys):
    bad = lambda route, prompt: route == "chat" and "translation question 0" in prompt  # noqa: E731
    with Fake("ref") as ref, Fake("dyn", accept=2, telemetry=True) as dyn, Fake("eg", wrong=bad, accept=3) as eg:
        rc = _main()(_args(questions, tmp_path, f"name=target,algorithm=none,url={ref.url}",
                           f"name=dyn,algorithm=DYNVOCAB,url={dyn.url}", f"name=eagle,algorithm=EAGLE3,url={eg.url}"))
        out = capsys.readouterr().out
    assert rc == 0  # the control's difference does not fail DYNVOCAB's verdict
    result = json.loads((tmp_path / "lossless.json").read_text())
    assert result["lossless"] is True and result["reference"] == "target"
    assert result["routes"] == ["chat", "completions", "generate"] and result["concurrencies"] == [1, 8]
    for fake in (ref, dyn, eg):  # one warmup + 6 prompts x 3 routes x 2 concurrencies
        assert len(fake.requests) == 1 + 36
        assert {(r, n) for r, _, n in fake.requests[1:]} == {(r, 5) for r in ("chat", "completions", "generate")}
    assert ref.max_in_flight > 1  # concurrency 8 really overlaps requests
    rows = {(r["config"], r["route"], r["concurrency"]): r for r in result["rows"]}
    assert len(rows) == 12 and all(r["compared"] == 6 and r["missing"] == 0 for r in rows.values())
    assert all(r["equal"] == 6 for k, r in rows.items() if k[0] == "dyn")
    for c in (1, 8):
        row = rows[("eagle", "chat", c)]
        assert row["equal"] == 5 and len(row["mismatches"]) == 1
        m = row["mismatches"][0]
        assert (m["prompt"], m["category"], m["char"], m["token"]) == ("200", "translation", 7, None)
        assert m["reference"][7] != m["got"][7]
        assert rows[("eagle", "completions", c)]["equal"] == 6
    g = rows[("dyn", "generate", 1)]
    assert g["accept_length"] == pytest.approx(30 / 18)  # 6 x 5 tokens over 6 x ceil(5 / 2) verify steps
    assert g["dynvocab_set_size"] == pytest.approx(110.0) and g["dynvocab_coverage"] == pytest.approx(0.75)
    assert rows[("dyn", "chat", 1)]["accept_length"] is None  # the OpenAI routes carry no verify count
    assert result["reference_batch_invariance"] == [
        {"route": r, "concurrency": 8, "against": 1, "compared": 6, "equal": 6} for r in ("chat", "completions",
                                                                                            "generate")]
    md = (tmp_path / "lossless.md").read_text()
    assert "every DYNVOCAB output equals the reference" in md and "| eagle | EAGLE3 | chat | 8 | 5 / 6 |" in md
    assert "prompt 200 (translation), char 7" in md and md in out


def test_a_dynvocab_difference_fails_with_where_it_differs(questions, tmp_path, capsys):
    bad = lambda route, prompt: route == "generate" and "qa question 1" in prompt  # noqa: E731
    with Fake() as ref, Fake(wrong=bad) as dyn:
        rc = _main()(_args(questions, tmp_path, f"name=t,algorithm=none,url={ref.url}",
                           f"name=d,algorithm=DYNVOCAB,url={dyn.url}", prompts=8, extra=["--concurrency", "8"]))
    assert rc == 1
    result = json.loads((tmp_path / "lossless.json").read_text())
    assert result["lossless"] is False and result["concurrencies"] == [8]
    row = next(r for r in result["rows"] if r["route"] == "generate")
    assert row["equal"] == 7 and [(m["prompt"], m["char"], m["token"]) for m in row["mismatches"]] == [("301", 7, 7)]
    assert "NOT lossless" in (tmp_path / "lossless.md").read_text()


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
        assert _main()(_args(questions, tmp_path, *specs,
                             extra=["--routes", "chat", "--concurrency", "1", "--max-new-tokens", "6"])) == 0
        assert len(dyn.requests) == n + 1 + 6  # another budget: everything again


def test_errors_are_clear(questions, tmp_path, capsys):
    check = _main()
    with Fake() as ref:
        rc = check(_args(questions, tmp_path, f"name=t,algorithm=none,url={ref.url}", extra=["--routes", "chat"]))
        assert rc == 2 and "at least two configurations" in capsys.readouterr().err
        two = (f"name=t,algorithm=none,url={ref.url}", f"name=u,algorithm=none,url={ref.url}")
        rc = check(_args(questions, tmp_path, *two, extra=["--routes", "chat,stream"]))
        assert rc == 2 and "unknown route(s) stream" in capsys.readouterr().err
    rc = check(_args(questions, tmp_path, "name=t,algorithm=none,url=http://127.0.0.1:9", "name=u,args=--x",
                    extra=["--server-timeout", "0.5", "--routes", "chat"]))
    assert rc == 2 and "no healthy SGLang server at http://127.0.0.1:9" in capsys.readouterr().err
    for bad, why in ((["--only", "target"], "go with --tiny"), (["--concurrency", "1,x"], "must be integers"),
                     (["--concurrency", "0"], "must be positive integers")):
        rc = check(["--out", str(tmp_path), "--config", "name=t,args=--x", *bad])
        err = capsys.readouterr().err
        assert rc == 2 and why in err and len(err.strip().splitlines()) == 1
    rc = check(["--out", str(tmp_path), "--tiny", str(tmp_path / "tiny"), "--only", "nope",
               "--questions", str(questions)])
    assert rc == 2 and "unknown tiny config(s) nope" in capsys.readouterr().err
    assert not (tmp_path / "tiny").exists()  # refused before making any checkpoint


def test_sigterm_stops_the_launched_servers_and_keeps_the_cache(questions, tmp_path):
    """``timeout`` (SIGTERM) during a run: exit 130, the launched server is stopped, the cache holds
    nothing half-written."""
    pid_file = tmp_path / "server.pid"
    launcher = shlex.join([sys.executable, str(Path(__file__)), "--serve"])
    cmd = [sys.executable, "-m", "sglang_specvocab", "check-lossless", *_args(questions, tmp_path / "out",
           f"name=t,args='--model-path m --pid-file {pid_file} --delay 0.3'",
           f"name=d,algorithm=DYNVOCAB,args='--model-path m --pid-file {pid_file} --delay 0.3'",
           extra=["--launcher", launcher, "--server-timeout", "60"])]
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


# --- the tiny server set ------------------------------------------------------------------------------


def test_tiny_configs_need_the_checkpoints(tmp_path):
    with pytest.raises(SpecBenchError, match="sglang-specvocab tiny-checkpoints --out"):
        tiny_configs(tmp_path)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, torchvision_standin):
    from sglang_specvocab.integration.plugin import register
    from sglang_specvocab.testing.tiny import make_tiny_checkpoints

    register()
    return make_tiny_checkpoints(tmp_path_factory.mktemp("tiny"), vocab_size=4096, draft_vocab_size=1024)


@pytest.mark.sglang
def test_tiny_set_is_accepted_by_sglang(tiny):
    """Every server of the set parses with SGLang's own argument handling (DYNVOCAB through our plug-in)."""
    from sglang.srt.server_args import prepare_server_args

    configs = tiny_configs(tiny.root, ["--device", "cpu"], dynvocab_config=str(ROOT / "configs" / "microspec.yaml"))
    assert [c.name for c in configs] == [t[0] for t in TINY_SET]
    assert configs[0].algorithm == "none" and "--speculative-algorithm" not in configs[0].args
    for c, (_, algorithm, draft, topk, steps, nd) in zip(configs, TINY_SET, strict=True):
        sa = prepare_server_args(c.args)
        assert "--disable-cuda-graph" not in c.args and not sa.disable_cuda_graph
        if algorithm == "none":
            assert sa.speculative_algorithm is None
            continue
        assert sa.speculative_algorithm == algorithm
        assert sa.speculative_draft_model_path == str(tiny.root / draft)
        assert (sa.speculative_eagle_topk, sa.speculative_num_steps, sa.speculative_num_draft_tokens) == (
            topk, steps, nd)
    only = tiny_configs(tiny.root, names=["dynvocab-full-tree"])
    assert [c.name for c in only] == ["target", "dynvocab-full-tree"]
    with pytest.raises(SpecBenchError, match="unknown tiny config"):
        tiny_configs(tiny.root, names=["nope"])


if __name__ == "__main__" and sys.argv[1:2] == ["--serve"]:
    serve_from_argv(sys.argv[2:])

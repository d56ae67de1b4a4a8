"""``bench specbench`` runs that may not finish: the checkout recorded without a ``.git``, reports written as
the run goes (partial, with what is missing and why), servers that fail, a time budget, and the verdicts
against the targets. Against the fake servers of ``test_specbench`` (no GPU)."""

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from test_specbench import QUESTIONS, ROOT, FakeSGLang, _args, _run, _spec, make_tokenizer

from sglang_specvocab.tools.bench.server import git_revision, make_config, versions
from sglang_specvocab.tools.bench.specbench_report import markdown, parity
from sglang_specvocab.tools.bench.specbench_targets import targets


def test_the_checkout_is_git_describe_else_sv_git_else_unknown(tmp_path, monkeypatch):
    monkeypatch.setenv("SV_GIT", "b3abc6d-dirty")
    assert git_revision(tmp_path) == "b3abc6d-dirty"  # no .git: the staged checkout's describe
    monkeypatch.delenv("SV_GIT")
    assert git_revision(tmp_path) == "unknown"
    run = {"cwd": tmp_path, "check": True, "capture_output": True}
    subprocess.run(["git", "init", "-q"], **run)
    (tmp_path / "f").write_text("x")
    subprocess.run(["git", "add", "f"], **run)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "f"], **run)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], text=True, **run).stdout.strip()
    monkeypatch.setenv("SV_GIT", "ignored")
    assert git_revision(tmp_path) == head  # a .git wins over SV_GIT
    (tmp_path / "f").write_text("y")
    assert git_revision(tmp_path) == head + "-dirty"
    assert versions()["git"] not in ("", None)


@pytest.fixture(scope="module")
def tokdir(tmp_path_factory):
    return make_tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.fixture
def questions(tmp_path):
    path = tmp_path / "question.jsonl"
    path.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    return path


# --- greedy parity names the first differing token ------------------------------------------------


def _turn(qid, text, ids, category="qa", turn=0):
    return {"question_id": qid, "category": category, "turn": turn, "text": text, "output_ids": ids}


def test_a_differing_greedy_output_names_its_first_differing_token():
    from sglang_specvocab.tools.prompts import Question

    configs = [
        make_config({"name": "eagle3-full", "algorithm": "EAGLE3", "url": "http://x:1"}, "t"),
        make_config({"name": "dyn", "algorithm": "DYNVOCAB", "url": "http://x:2", "control": "eagle3-full"}, "t"),
    ]
    questions = [Question("1", "qa", ("a",)), Question("2", "qa", ("b",)), Question("3", "qa", ("c",))]
    words = {10: " The", 11: " dog", 12: " cat", 13: " sleeps", 14: "."}
    records = {
        "eagle3-full": [
            _turn("1", " The dog sleeps.", [10, 11, 13, 14]),
            _turn("2", " The dog", [10, 11]),
            _turn("3", " The dog sleeps", [10, 11, 13]),
        ],
        "dyn": [
            _turn("1", " The cat sleeps.", [10, 12, 13, 14]),  # differs at token 1
            _turn("2", " The dog sleeps", [10, 11, 13]),  # runs on past the control's end, at token 2
            _turn("3", " The dog sleeps", [10, 11, 13]),  # identical
        ],
    }
    section = parity(configs, questions, records, 0.0, decode=words.get)
    [row] = section["configs"]
    diffs = {d["question_id"]: d for d in row["against_control"]["differences"]}
    assert sorted(diffs) == ["1", "2"] and section["parity_ok"] is False
    assert diffs["1"]["token"] == {
        "index": 1,
        "expected_id": 11,
        "got_id": 12,
        "expected_text": " dog",
        "got_text": " cat",
    }
    assert diffs["2"]["token"] == {
        "index": 2,
        "expected_id": None,  # the control's output ended there
        "got_id": 13,
        "expected_text": None,
        "got_text": " sleeps",
    }
    md = markdown({**_result_shell(), "parity": section})
    assert (
        "char 5: eagle3-full ' The dog sleeps.' / dyn ' The cat sleeps.'; token 1: eagle3-full 11 ' dog' / dyn 12 ' cat'"
        in md
    )
    assert "token 2: eagle3-full (ended) / dyn 13 ' sleeps'" in md

    # without a tokenizer: the ids alone; without recorded ids: said so; the same ids: said so
    section = parity(configs, questions, records, 0.0)
    assert next(iter(section["configs"][0]["against_control"]["differences"]))["token"]["got_text"] is None
    old = {k: [{**r, "output_ids": None} for r in rs] for k, rs in records.items()}
    section = parity(configs, questions, old, 0.0)
    assert all(d["token"] is None for d in section["configs"][0]["against_control"]["differences"])
    assert "; token ids not recorded" in markdown({**_result_shell(), "parity": section})
    same = {"eagle3-full": [_turn("1", "a b", [1, 2])], "dyn": [_turn("1", "a  b", [1, 2])]}
    section = parity(configs, questions[:1], same, 0.0)
    assert "; the same token ids" in markdown({**_result_shell(), "parity": section})


def _result_shell(concurrency=1):
    return {
        "runs": [],
        "parity": None,
        "device": "cpu",
        "versions": {},
        "command": "c",
        "concurrency": concurrency,
        "temperature": 0.0,
    }


class TokenSGLang(FakeSGLang):
    """FakeSGLang whose ``output_ids`` are the tokens of its text; the answer to a prompt containing ``marker``
    ends in ``ending`` instead of `` words``."""

    def __init__(self, tokenizer_path, marker=None, ending=" phrases", **kw):
        from transformers import AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(tokenizer_path)
        self.marker, self.ending = marker, ending
        super().__init__(tokenizer_path, **kw)

    def reply(self, payload):
        reply = super().reply(payload)
        if self.marker and self.marker in self.tok.decode(payload["input_ids"]):
            reply["text"] = reply["text"].removesuffix(" words") + self.ending
        reply["output_ids"] = self.tok(reply["text"], add_special_tokens=False).input_ids
        return reply


def test_the_turns_record_their_tokens_and_the_report_decodes_the_first_that_differs(
    tokdir, questions, tmp_path, capsys
):
    out = tmp_path / "out"
    with TokenSGLang(tokdir, accept=2.0) as eagle3, TokenSGLang(tokdir, "Hamlet", accept=2.0) as dyn:
        rc, cap = _run(
            [
                *_spec("eagle3-full", "EAGLE3", eagle3),
                *_spec("dyn", "DYNVOCAB", dyn, control="eagle3-full"),
                "--questions",
                str(questions),
                "--categories",
                "qa",
                "--out",
                str(out),
                "--warmup",
                "0",
                "--no-progress",
            ],
            capsys,
        )
    assert rc == 1, cap.err
    records = [json.loads(line) for line in (out / "specbench-cache.jsonl").read_text().splitlines()]
    assert all(r["output_ids"] == eagle3.tok(r["text"], add_special_tokens=False).input_ids for r in records)
    assert {r["tokenizer"] for r in records} == {str(tokdir)}
    want, got = (next(r for r in records if r["config"] == c) for c in ("eagle3-full", "dyn"))
    at = next(i for i, (a, b) in enumerate(zip(want["output_ids"], got["output_ids"])) if a != b)
    result = json.loads((out / "specbench.json").read_text())
    [diff] = result["parity"]["configs"][0]["against_control"]["differences"]
    assert diff["token"] == {
        "index": at,
        "expected_id": want["output_ids"][at],
        "got_id": got["output_ids"][at],
        "expected_text": eagle3.tok.decode([want["output_ids"][at]]),
        "got_text": eagle3.tok.decode([got["output_ids"][at]]),
    }
    assert diff["token"]["expected_text"] != diff["token"]["got_text"]
    assert f"; token {at}: eagle3-full {want['output_ids'][at]} " in (out / "specbench.md").read_text()


# --- verdicts against the targets -----------------------------------------------------------------


def _timed_turn(qid, category, tokens, seconds, text="same", ids=None, turn=0):
    return {
        "question_id": qid,
        "category": category,
        "turn": turn,
        "completion_tokens": tokens,
        "time_s": seconds,
        "text": text,
        "output_ids": ids,
    }


def _target_setup():
    from sglang_specvocab.tools.prompts import Question

    configs = [
        make_config({"name": "eagle3-full", "algorithm": "EAGLE3", "url": "http://x:1"}, "t"),
        make_config({"name": "dyn", "algorithm": "DYNVOCAB", "url": "http://x:2", "control": "eagle3-full"}, "t"),
        make_config({"name": "target", "algorithm": "none", "url": "http://x:3"}, "t"),
    ]
    questions = [Question("1", "qa", ("a",)), Question("2", "qa", ("b",)), Question("3", "math_reasoning", ("c",))]
    return configs, questions


def _verdicts(dyn_seconds, concurrency=1, dyn_changes=None, temperature=0.0, eagle3=True):
    """eagle3-full: 100 tokens in 1 s per question; dyn: 100 tokens in ``dyn_seconds[qid]``."""
    configs, questions = _target_setup()
    records = {
        "eagle3-full": [_timed_turn(q.qid, q.category, 100, 1.0, ids=[1, 2, 3]) for q in questions] if eagle3 else [],
        "dyn": [
            _timed_turn(q.qid, q.category, 100, dyn_seconds[q.qid], ids=[1, 2, 3])
            for q in questions
            if q.qid in dyn_seconds
        ],
    }
    for qid, (text, ids) in (dyn_changes or {}).items():
        record = next(r for r in records["dyn"] if r["question_id"] == qid)
        record.update(text=text, output_ids=ids)
    pairs = {"dyn": "eagle3-full"}
    section = parity(configs, questions, records, temperature, pairs, decode={1: "a", 2: "b", 3: "c", 9: "z"}.get)
    found = targets(configs, questions, records, concurrency, pairs, section)
    assert [(t["target"], t["config"], t["control"]) for t in found] == [
        ("speed", "dyn", "eagle3-full"),
        ("greedy parity", "dyn", "eagle3-full"),
    ]
    md = markdown({**_result_shell(concurrency), "parity": section, "targets": found})
    return found[0], found[1], md


def test_the_speed_target_is_1_15x_at_concurrency_1_and_names_its_worst_category():
    met, parity_ok, md = _verdicts({"1": 0.8, "2": 0.8, "3": 0.9})  # 125, 125, 111 tokens/s against 100
    assert met["met"] is True and met["threshold"] == 1.15 and met["questions"] == 3
    assert met["value"] == pytest.approx((125 + 125 + 100 / 0.9) / 300)
    assert met["worst"] == {"category": "math_reasoning", "ratio": pytest.approx(1 / 0.9), "questions": 1}
    assert parity_ok["met"] is True and parity_ok["worst"] is None and parity_ok["gap_note"] == "gap not measured"
    assert (
        "## Targets" in md
        and "| speed | dyn | eagle3-full | >= 1.15x | 1.204x (3 questions) | yes | math_reasoning 1.111x (1 question) |"
        in md
    )
    assert "| greedy parity | dyn | eagle3-full | every output equal | 3 of 3 turns identical | yes | - |" in md

    missed, _, md = _verdicts({"1": 0.9, "2": 0.88, "3": 0.85})  # 1.14x
    assert missed["met"] is False and missed["value"] == pytest.approx((100 / 0.9 + 100 / 0.88 + 100 / 0.85) / 300)
    assert "| 1.141x (3 questions) | **NO** | qa 1.124x (2 questions) |" in md

    at_eight, _, _ = _verdicts({"1": 0.9, "2": 0.9, "3": 0.9}, concurrency=8)  # the same 1.11x: 1.0x is enough
    assert at_eight["met"] is True and at_eight["threshold"] == 1.0
    slower, _, _ = _verdicts({"1": 1.1, "2": 1.0, "3": 1.0}, concurrency=8)
    assert slower["met"] is False and slower["worst"]["category"] == "qa"
    elsewhere, _, md = _verdicts({"1": 0.5, "2": 0.5, "3": 0.5}, concurrency=4)
    assert elsewhere["met"] is None and elsewhere["value"] == pytest.approx(2.0)
    assert "no target at this concurrency" in md


def test_the_speed_target_is_judged_on_the_questions_both_finished_and_none_when_not_measured():
    some, _, _ = _verdicts({"1": 0.5})  # dyn finished question 1 only: 2x on it
    assert some["met"] is True and some["questions"] == 1 and some["value"] == pytest.approx(2.0)
    none, parity_none, md = _verdicts({"1": 0.5, "2": 0.5, "3": 0.5}, eagle3=False)
    assert none["met"] is None and none["why"] == "eagle3-full has no finished question at concurrency 1"
    assert parity_none["met"] is None and parity_none["why"] == "no turn of both at concurrency 1"
    assert "not measured: eagle3-full has no finished question at concurrency 1" in md
    sampled, parity_sampled, _ = _verdicts({"1": 0.5, "2": 0.5, "3": 0.5}, temperature=0.7)
    assert sampled["met"] is True and parity_sampled["met"] is None and "sampled" in parity_sampled["why"]

    configs, questions = _target_setup()
    alone = targets(configs, questions, {}, 1, {"dyn": None}, None)
    assert [(t["met"], t["why"]) for t in alone] == [
        (None, "no EAGLE3 control"),
        (None, "sampled (temperature > 0): nothing compared"),
    ]


def test_the_parity_target_names_the_earliest_differing_token():
    _, differs, md = _verdicts(
        {"1": 0.5, "2": 0.5, "3": 0.5},
        dyn_changes={"2": ("different late", [1, 2, 9]), "3": ("different early", [1, 9, 3])},
    )
    assert differs["met"] is False
    assert differs["value"] == {"compared": 3, "identical": 1, "differing": 2, "not_comparable": 0, "missing": 0}
    worst = differs["worst"]
    assert (worst["question_id"], worst["turn"]) == ("3", 1)  # parts at token 1, question 2 at token 2
    assert worst["token"] == {"index": 1, "expected_id": 2, "got_id": 9, "expected_text": "b", "got_text": "z"}
    assert differs["gap"] is None and differs["gap_note"] == "gap not measured"
    assert (
        "| 1 of 3 turns identical | **NO** | question 3 (math_reasoning) turn 1: "
        "token 1: eagle3-full 2 'b' / dyn 9 'z' (gap not measured) |" in md
    )


# --- reports as the run goes ----------------------------------------------------------------------


def _reports(out: Path, levels=(1, 8)) -> dict[int, dict]:
    return {c: json.loads((out / f"specbench-c{c}.json").read_text()) for c in levels}


def _missing(result: dict) -> list[tuple[str, str]]:
    return [(m["config"], m["why"]) for m in result["missing"]]


class SnapshotSGLang(FakeSGLang):
    """FakeSGLang that, on its first /generate, copies what the reports say then (``seen``: concurrency ->
    report), and may send ``signal`` to process ``pid`` then (answering ``delay`` seconds late)."""

    def __init__(self, tokenizer_path, out: Path, pid=None, sig=None, delay=0.0, **kw):
        self.out, self.pid, self.sig, self.delay = out, pid, sig, delay
        self.seen: dict[int, dict] | None = None
        super().__init__(tokenizer_path, **kw)

    def reply(self, payload):
        with self.lock:
            first = self.seen is None
            if first:
                self.seen = {}
                for c in (1, 8):
                    path = self.out / f"specbench-c{c}.json"
                    if path.is_file():
                        self.seen[c] = json.loads(path.read_text())
        if first and self.sig is not None:
            os.kill(self.pid, self.sig)
        if first:
            time.sleep(self.delay)
        return super().reply(payload)


def test_the_reports_are_written_after_each_server_with_what_is_missing(tokdir, questions, tmp_path, capsys):
    out = tmp_path / "out"
    with (
        FakeSGLang(tokdir, accept=2.0) as eagle3,
        SnapshotSGLang(tokdir, out, accept=2.0) as dyn,
        SnapshotSGLang(tokdir, out) as target,
    ):
        rc, cap = _run(
            _args(
                out,
                questions,
                *_spec("eagle3-full", "EAGLE3", eagle3),
                *_spec("dynvocab-hybrid", "DYNVOCAB", dyn, control="eagle3-full"),
                *_spec("target", "none", target),
            ),
            capsys,
        )
    assert rc == 0, cap.err
    # when dynvocab-hybrid was first asked: eagle3-full's results at both concurrencies, the rest not reached
    assert sorted(dyn.seen) == [1, 8]
    for c, report in dyn.seen.items():
        assert report["partial"] is True and report["concurrency"] == c
        assert _missing(report) == [("dynvocab-hybrid", "not reached"), ("target", "not reached")]
        assert report["missing"][0] == {
            "config": "dynvocab-hybrid",
            "concurrency": c,
            "why": "not reached",
            "turns_missing": 3,
            "turns": 3,
        }
        assert {r["config"] for r in report["runs"]} == {"eagle3-full"}
        assert [(t["target"], t["met"]) for t in report["targets"]] == [("speed", None), ("greedy parity", None)]
    assert [_missing(r) for r in target.seen.values()] == [[("target", "not reached")]] * 2
    assert {r["config"] for r in target.seen[8]["runs"]} == {"eagle3-full", "dynvocab-hybrid"}
    final = _reports(out)
    assert all(r["partial"] is False and r["missing"] == [] for r in final.values())
    assert not (out / "specbench-c1.md").read_text().startswith("**PARTIAL**")
    assert [t["met"] for t in final[1]["targets"]] == [False, True]  # the fakes are equally fast; identical
    assert cap.out.count("reports so far in") == 3 * 2 + 3  # each concurrency, each server
    assert not list(out.glob(".*.tmp"))


@pytest.mark.parametrize("sig, rc", [(signal.SIGTERM, 130), (signal.SIGKILL, -signal.SIGKILL)])
def test_a_run_cut_off_leaves_valid_partial_reports(tokdir, questions, tmp_path, sig, rc):
    """The command in its own process, cut off when the second server is first asked: by SIGTERM (a timeout:
    the reports are rewritten, what was in progress 'interrupted'), or by SIGKILL (the lease's end: the
    reports written after the first server stay)."""
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    with FakeSGLang(tokdir, accept=2.0) as eagle3, SnapshotSGLang(tokdir, out, sig=sig, delay=3.0) as target:
        args = _args(out, questions, *_spec("eagle3-full", "EAGLE3", eagle3), *_spec("target", "none", target))
        proc = subprocess.Popen(
            [sys.executable, "-m", "sglang_specvocab", "bench", "specbench", *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        target.pid = proc.pid
        _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == rc, stderr
    reports = _reports(out)
    assert all(r["partial"] is True for r in reports.values())
    assert {r["config"] for r in reports[1]["runs"]} == {"eagle3-full"}
    assert {r["config"] for r in reports[8]["runs"]} == {"eagle3-full"}
    why = "interrupted" if sig == signal.SIGTERM else "not reached"
    assert _missing(reports[1]) == [("target", why)] and _missing(reports[8]) == [("target", "not reached")]
    for c in (1, 8):
        md = (out / f"specbench-c{c}.md").read_text()
        assert (
            md.splitlines()[0]
            == f"**PARTIAL** at concurrency {c}: missing target ({'interrupted' if c == 1 and sig == signal.SIGTERM else 'not reached'}; 3 of 3 turns missing)"
        )
    if sig == signal.SIGTERM:
        assert "interrupted; finished turns are cached" in stderr
    assert not list(out.glob(".*.tmp"))


def _failing_launcher() -> str:
    return shlex.join(
        [sys.executable, "-c", "import sys; print('torch.OutOfMemoryError: CUDA out of memory'); sys.exit(3)"]
    )


def test_a_server_that_fails_is_recorded_and_the_others_still_run(tokdir, questions, tmp_path, capsys):
    out = tmp_path / "out"
    configs = tmp_path / "configs.yaml"
    with (
        FakeSGLang(tokdir, accept=2.0) as eagle3,
        FakeSGLang(tokdir, fail="The input is longer than the model's context length") as broken,
        FakeSGLang(tokdir) as target,
    ):
        configs.write_text(
            f"- {{name: eagle3-full, algorithm: EAGLE3, url: '{eagle3.url}'}}\n"
            f"- {{name: dynvocab-hybrid, algorithm: DYNVOCAB, args: --model-path x, control: eagle3-full, "
            f"launcher: {json.dumps(_failing_launcher())}}}\n"
            f"- {{name: dynvocab-microspec, algorithm: DYNVOCAB, url: '{broken.url}', control: eagle3-full}}\n"
            f"- {{name: target, algorithm: none, url: '{target.url}'}}\n"
        )
        rc, cap = _run(_args(out, questions, "--configs", str(configs)), capsys)
    assert rc == 2
    assert "[dynvocab-hybrid] server failed: server 'dynvocab-hybrid' exited with code 3" in cap.err
    assert "CUDA out of memory" in cap.err and "[dynvocab-microspec] server failed: " in cap.err
    assert cap.err.strip().splitlines()[-1].startswith("error: server(s) failed (the reports are partial): ")
    assert len(target.timed()) == 6  # the last server ran at both concurrencies
    hybrid = (
        "server failed: server 'dynvocab-hybrid' exited with code 3 before it became healthy "
        f"({out / 'logs' / 'dynvocab-hybrid.log'}: torch.OutOfMemoryError: CUDA out of memory)"
    )
    for c, report in _reports(out).items():
        assert report["partial"] is True
        [(name, why), (name2, why2)] = _missing(report)
        assert (name, why) == ("dynvocab-hybrid", hybrid)
        assert name2 == "dynvocab-microspec" and why2.startswith(f"server failed: {broken.url}/generate: HTTP 400")
        assert "longer than the model's context length" in why2
        assert {r["config"] for r in report["runs"]} == {"eagle3-full", "target"}
        md = (out / f"specbench-c{c}.md").read_text()
        assert md.startswith(f"**PARTIAL** at concurrency {c}: missing dynvocab-hybrid (server failed: ")
        assert [(t["config"], t["met"]) for t in report["targets"]] == [
            ("dynvocab-hybrid", None),
            ("dynvocab-hybrid", None),
            ("dynvocab-microspec", None),
            ("dynvocab-microspec", None),
        ]


# --- the time budget ------------------------------------------------------------------------------


class VirtualClock:
    """Seconds that pass only when a fake server says so (a start, a turn): the budget's decisions are exact."""

    def __init__(self):
        self.now = 1000.0
        self.lock = threading.Lock()

    def __call__(self) -> float:
        with self.lock:
            return self.now

    def advance(self, seconds: float) -> None:
        with self.lock:
            self.now += seconds


class ClockedSGLang(FakeSGLang):
    """FakeSGLang whose first /health takes ``start_s`` and each /generate ``turn_s`` on ``clock``."""

    def __init__(self, tokenizer_path, clock: VirtualClock, start_s=30.0, turn_s=10.0, **kw):
        super().__init__(tokenizer_path, **kw)
        self.clock, self.turn_s, self.started = clock, turn_s, False
        fake = self

        class Handler(self.httpd.RequestHandlerClass):
            def do_GET(self):
                if self.path == "/health" and not fake.started:
                    fake.started = True
                    clock.advance(start_s)
                super().do_GET()

        self.httpd.RequestHandlerClass = Handler

    def reply(self, payload):
        self.clock.advance(self.turn_s)
        return super().reply(payload)


def _budget_run(tokdir, questions, tmp_path, capsys, monkeypatch, budget, names=("a", "b", "c"), levels="1,8"):
    from sglang_specvocab.tools.bench import specbench

    clock = VirtualClock()
    monkeypatch.setattr(specbench, "clock", clock)
    out = tmp_path / "out"
    with contextlib.ExitStack() as stack:
        fakes = {n: stack.enter_context(ClockedSGLang(tokdir, clock)) for n in names}
        specs = [x for n, f in fakes.items() for x in _spec(n, "none", f)]
        args = _args(out, questions, *specs, extra=["--max-new-tokens", "64", "--time-budget-s", str(budget)])
        args[args.index("--concurrency") + 1] = levels
        rc, cap = _run(args, capsys)
    assert rc == 0, cap.err
    lines = [line for line in cap.out.splitlines() if line.startswith("[budget] ")]
    return out, fakes, lines, cap


def test_the_budget_skips_a_later_concurrency_that_would_leave_no_time_for_the_other_servers(
    tokdir, questions, tmp_path, capsys, monkeypatch
):
    # each server: a 30 s start, 3 turns of 10 s at each concurrency; before any measurement a server reached
    # by url is 10 s to start, a turn 2 + 64 / 25 = 4.56 s and a stop 20 s
    out, fakes, lines, _ = _budget_run(tokdir, questions, tmp_path, capsys, monkeypatch, 250)
    assert lines[0] == (
        "[budget] 250 s from the command's start; before any measurement a start takes 120 s (10 s by url), "
        "a turn 4.6 s, a stop 20 s"
    )
    assert re.fullmatch(
        r"\[budget\] a: start: 2\d\d s left >= start 10 s \+ concurrency 1: 3 turns x 4.6 s \+ stop 20 s = 44 s; "
        r"defaults",
        lines[1],
    )
    # after a's concurrency 1 (60 s): 190 s left - 30 s - its stop 20 s = 140 s < b's and c's 30 + 30 + 20 s
    assert re.fullmatch(
        r"\[budget\] a concurrency 8: skipped \(time budget\): 1\d\d s left - 3 turns x 10 s - stop 20 s = "
        r"1\d\d s < 160 s for the first concurrency of the remaining servers \(b, c\)",
        lines[2],
    )
    assert [line.split(":")[0] + ":" + line.split(":")[1] for line in lines[3:]] == [
        "[budget] b: start",
        "[budget] b concurrency 8: asked",
        "[budget] c: start",
        "[budget] c concurrency 8: asked",
    ]
    assert [len(f.timed()) for f in fakes.values()] == [3, 6, 6]
    one, eight = _reports(out).values()
    assert one["partial"] is False and _missing(eight) == [("a", "time budget")]
    assert eight["budget"]["decisions"] == lines[1:] and eight["budget"]["time_budget_s"] == 250
    assert eight["budget"]["measured"]["url_start_s"] == [pytest.approx(30.0)] * 3
    assert eight["budget"]["measured"]["turn_s"] == {"1": [pytest.approx(10.0)] * 3, "8": [pytest.approx(10.0)] * 2}
    md = (out / "specbench-c8.md").read_text()
    assert md.startswith("**PARTIAL** at concurrency 8: missing a (time budget; 3 of 3 turns missing)")
    assert "## Time budget (250 s)\n\n- [budget] a: start: " in md


def test_the_budget_starts_no_server_it_cannot_cover(tokdir, questions, tmp_path, capsys, monkeypatch):
    out, fakes, lines, cap = _budget_run(tokdir, questions, tmp_path, capsys, monkeypatch, 150)
    assert [line.split(":")[0] + ":" + line.split(":")[1] for line in lines[1:]] == [
        "[budget] a: start",
        "[budget] a concurrency 8: skipped (time budget)",
        "[budget] b: start",
        "[budget] b concurrency 8: skipped (time budget)",
        "[budget] c: not started (time budget)",
    ]
    # c: 150 - 120 s used = 30 s left < its start 30 s (measured) + 3 turns x 10 s + a stop (measured: 0)
    assert re.fullmatch(
        r"\[budget\] c: not started \(time budget\): (29|30) s left < start 30 s \+ concurrency 1: 3 turns x 10 s "
        r"\+ stop 0.0 s = 60 s",
        lines[-1],
    )
    assert "[c] launching" not in cap.out and fakes["c"].requests == [] and not fakes["c"].started
    one, eight = _reports(out).values()
    assert _missing(one) == [("c", "time budget")]
    assert _missing(eight) == [("a", "time budget"), ("b", "time budget"), ("c", "time budget")]


def test_the_budget_stops_asking_when_it_runs_out_mid_concurrency(tokdir, questions, tmp_path, capsys, monkeypatch):
    # 65 s: a starts (44 s by the defaults) at 30 s; a turn at 30 and at 40 s; at 50 s 15 s are left, less than
    # a stop (20 s by default): no third turn
    out, fakes, lines, _ = _budget_run(tokdir, questions, tmp_path, capsys, monkeypatch, 65, names=("a",), levels="1")
    assert lines[-1].startswith("[budget] a concurrency 1: the budget ran out after 2 of 3 turns (1")
    assert len(fakes["a"].timed()) == 2
    report = json.loads((out / "specbench.json").read_text())
    assert report["partial"] is True and report["missing"] == [
        {"config": "a", "concurrency": 1, "why": "time budget", "turns_missing": 1, "turns": 3}
    ]


def test_budget_estimates_are_the_latest_start_the_slowest_turn_and_stop_else_the_defaults():
    from sglang_specvocab.tools.bench.specbench_budget import Budget

    clock = VirtualClock()
    said: list[str] = []
    b = Budget(600, clock(), max_new_tokens=128, clock=clock, say=said.append)
    assert b.default_turn_s == pytest.approx(2 + 128 / 25)
    assert (b.start_s(True), b.start_s(False), b.turn_s(1), b.stop_s()) == (
        (120.0, False),
        (10.0, False),
        (pytest.approx(7.12), False),
        (20.0, False),
    )
    assert b.may_start("x", True, 1, 14)  # 120 + 14 x 7.12 + 20 = 240 s <= 600 s
    clock.advance(500)
    assert not b.may_start("y", True, 1, 14) and said[-1].startswith("[budget] y: not started (time budget): 100 s")
    b.started(True, 90.0)  # the first start pays the compiles
    b.started(True, 55.0)  # the latest is the estimate
    b.asked(1, 14, 14.0)
    b.asked(1, 10, 20.0)
    b.asked(8, 0, 5.0)  # nothing asked: nothing learnt
    b.stopped(4.0)
    assert b.start_s(True) == (55.0, True) and b.start_s(False) == (10.0, False)
    assert b.turn_s(1) == (2.0, True) and b.turn_s(8) == (2.0, True)  # a concurrency not timed: the slowest
    assert b.stop_s() == (4.0, True)
    # 100 s left: asking 14 turns at 8 (28 s) and stopping (4 s) leaves 68 s; one more server needs 55 + 28 + 4
    assert not b.may_ask("x", 8, 14, [("y", True, 1, 14)])
    assert b.may_ask("x", 8, 14, [("y", False, 1, 14)])  # by url: 10 s to start
    assert not b.out_of_time()
    clock.advance(97)
    assert b.out_of_time()  # 3 s left, a stop takes 4 s
    assert b.summary()["decisions"] == said and len(said) == 4

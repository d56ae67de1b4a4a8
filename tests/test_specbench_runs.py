"""``bench specbench`` runs that may not finish: the checkout recorded without a ``.git``, reports written as
the run goes (partial, with what is missing and why), servers that fail, a time budget, and the verdicts
against the targets. Against the fake servers of ``test_specbench`` (no GPU)."""

import json
import subprocess
import threading

import pytest
from test_specbench import QUESTIONS, FakeSGLang, _run, make_tokenizer

from sglang_specvocab.bench.server import git_revision, make_config, versions
from sglang_specvocab.bench.specbench_report import markdown, parity
from sglang_specvocab.bench.specbench_targets import targets


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
    from sglang_specvocab.prompts import Question

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


def _spec(name, algorithm, fake, **extra):
    return [
        "--config",
        ",".join(
            [f"name={name}", f"algorithm={algorithm}", f"url={fake.url}"] + [f"{k}={v}" for k, v in extra.items()]
        ),
    ]


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
    from sglang_specvocab.prompts import Question

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


def test_budget_estimates_are_the_slowest_measured_else_the_defaults():
    from sglang_specvocab.bench.specbench_budget import Budget

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
    b.started(True, 40.0)
    b.started(True, 55.0)
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

"""``bench specbench`` runs that may not finish: the checkout recorded without a ``.git``, reports written as
the run goes (partial, with what is missing and why), servers that fail, a time budget, and the verdicts
against the targets. Against the fake servers of ``test_specbench`` (no GPU)."""

import json
import subprocess

import pytest
from test_specbench import QUESTIONS, FakeSGLang, _run, make_tokenizer

from sglang_specvocab.bench.server import git_revision, make_config, versions
from sglang_specvocab.bench.specbench_report import markdown, parity


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

"""``sglang-specvocab bench specbench`` end to end against fake SGLang servers (no GPU, seconds)."""

import json
import math
import os
import re
import shlex
import signal
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from fake_http import FakeServer, JsonHandler

from sglang_specvocab.tools.bench.server import SpecBenchError, make_config, parse_config_spec
from sglang_specvocab.tools.bench.specbench_report import markdown, parity, parity_failures, summarize
from sglang_specvocab.tools.cli import main

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
EXPECTED_KEYS = {
    "partial",
    "missing",
    "runs",
    "parity",
    "targets",
    "device",
    "versions",
    "command",
    "concurrency",
    "temperature",
    "budget",
}
RUN_KEYS = {"config", "algorithm", "category", "tokens_per_s", "accept_length", "speedup", "n"}
QUESTIONS = [
    {"question_id": 81, "category": "writing", "turns": ["Write a haiku about rain.", "Now make it rhyme."]},
    {"question_id": 91, "category": "coding", "turns": ["Reverse a list in Python.", "Now in C."]},
    {"question_id": 201, "category": "translation", "turns": ["Translate: Der Hund schlaeft."]},
    {"question_id": 202, "category": "translation", "turns": ["Translate: Die Katze spielt im Garten."]},
    {"question_id": 301, "category": "qa", "turns": ["Who wrote Hamlet?"]},
]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ '<start_of_turn>' + m['role'] + '\\n' + m['content'] + "
    "'<end_of_turn>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
)


def make_tokenizer(path: Path, chat_template: bool = True) -> Path:
    """A small byte-level BPE that round-trips any text, adds BOS itself, and has a Gemma-like template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = [t for q in QUESTIONS for t in q["turns"]] * 2 + ["answer words and more words"]
    tok.train_from_iterator(
        corpus,
        trainers.BpeTrainer(
            vocab_size=320, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A <bos> $B", special_tokens=[("<bos>", tok.token_to_id("<bos>"))]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>"
    )
    if chat_template:
        fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(path)
    return path


class FakeSGLang(FakeServer):
    """Speaks the parts of SGLang's HTTP API the runner uses, with deterministic answers and timings.

    A request with prompt ids P gets n = 3 + sum(P) % 9 tokens (at most max_new_tokens), reported as
    e2e_latency = overhead + n / speed; with ``accept`` set it also reports spec_verify_ct =
    ceil(n / accept) and the other spec fields, as SGLang does only for speculative servers.
    """

    def __init__(self, tokenizer_path, speed=100.0, accept=None, overhead=0.02, telemetry=False, fail=None):
        self.tokenizer_path, self.speed, self.accept, self.overhead = str(tokenizer_path), speed, accept, overhead
        self.telemetry, self.fail = telemetry, fail
        self.requests: list[dict] = []  # (payload, reply) of every /generate
        self.lock = threading.Lock()
        fake = self

        class Handler(JsonHandler):
            def do_GET(self):
                if self.path == "/health":
                    self._send(200)
                elif self.path in ("/model_info", "/get_model_info"):
                    self._send(
                        200,
                        {
                            "model_path": fake.tokenizer_path,
                            "tokenizer_path": fake.tokenizer_path,
                            "is_generation": True,
                            "model_type": "gemma3_text",
                            "architectures": ["Gemma3ForCausalLM"],
                        },
                    )
                else:
                    self._send(404, {"detail": "Not Found"})

            def do_POST(self):
                if self.path != "/generate":
                    return self._send(404, {"detail": "Not Found"})
                payload = self._payload()
                if fake.fail:
                    return self._send(400, {"error": {"message": fake.fail}})
                self._send(200, fake.reply(payload))

        self._listen(Handler)

    def reply(self, payload):
        ids = payload["input_ids"]
        params = payload["sampling_params"]
        n = min(params["max_new_tokens"], 3 + sum(ids) % 9)
        text = f" answer-{sum(ids) % 1000}-{n} words"
        meta = {
            "id": uuid.uuid4().hex,
            "finish_reason": {"type": "length", "length": n},
            "prompt_tokens": len(ids),
            "weight_version": "default",
            "num_retractions": 0,
            "reasoning_tokens": 0,
            "completion_tokens": n,
            "cached_tokens": 0,
            "e2e_latency": self.overhead + n / self.speed,
        }
        if self.accept:
            verify = math.ceil(n / self.accept)
            meta.update(
                spec_accept_rate=0.5,
                spec_accept_length=n / verify,
                spec_num_correct_drafts=n - verify,
                spec_num_proposed_drafts=3 * verify,
                spec_verify_ct=verify,
            )
        if self.telemetry:
            meta["dynvocab_set_size"] = [2000 + n, 2100 + n]  # accumulated per output batch, as customized_info is
            meta["dynvocab_coverage"] = 0.9
        reply = {"text": text, "output_ids": list(range(n)), "meta_info": meta}
        with self.lock:
            self.requests.append({"payload": payload, "reply": reply})
        return reply

    def timed(self):
        """(payload, reply) of the recorded requests: those of full length (not warmup)."""
        return [r for r in self.requests if r["payload"]["sampling_params"]["max_new_tokens"] > 32]


def serve_from_argv() -> None:
    """Entry point for a launched fake server: ``... --model-path TOK [--accept A] --host H --port P``."""
    argv = sys.argv[1:]
    opt = {argv[i]: argv[i + 1] for i in range(0, len(argv) - 1, 2)}
    fake = FakeSGLang(opt["--model-path"], accept=float(opt["--accept"]) if "--accept" in opt else None)
    print("fake server up", flush=True)
    fake.serve_forever_at(opt["--host"], opt["--port"])


@pytest.fixture(scope="module")
def tokdir(tmp_path_factory):
    return make_tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.fixture
def questions(tmp_path):
    path = tmp_path / "question.jsonl"
    path.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    return path


def _spec(name, algorithm, fake, **extra):
    """One ``--config`` of a fake server: its name, algorithm, url and ``extra`` keys (``control=...``)."""
    return [
        "--config",
        ",".join(
            [f"name={name}", f"algorithm={algorithm}", f"url={fake.url}"] + [f"{k}={v}" for k, v in extra.items()]
        ),
    ]


def _parity_specs(target, eagle3, dyn):
    """The parity trio: the target alone, EAGLE3, and DYNVOCAB with EAGLE3 as its control."""
    return [*_spec("target", "none", target), *_spec("eagle3-full", "EAGLE3", eagle3),
            *_spec("dynvocab-hybrid", "DYNVOCAB", dyn, control="eagle3-full")]  # fmt: skip


def _args(out, questions, *configs, extra=(), concurrency="1,8"):
    """The Spec-Bench command line of the fake-server runs: ``configs``, two categories, ``concurrency`` (None: the
    command's default)."""
    return [
        *configs,
        "--questions",
        str(questions),
        "--categories",
        "translation,qa",
        "--out",
        str(out),
        "--warmup",
        "0",
        "--no-progress",
        *(["--concurrency", concurrency] if concurrency else []),
        *extra,
    ]


def _run(args, capsys=None):
    rc = main(["bench", "specbench", *args])
    captured = capsys.readouterr() if capsys is not None else None
    return rc, captured


def _spec_bench_expected(fake):
    """Per-category speeds computed literally from what the fake server answered (Spec-Bench's speed.py)."""
    by_q: dict = {}
    for r in fake.timed():
        meta = r["reply"]["meta_info"]
        qid = r["qid"]
        tokens, seconds, verify = by_q.get(qid, (0, 0.0, 0))
        by_q[qid] = (
            tokens + meta["completion_tokens"],
            seconds + meta["e2e_latency"],
            verify + meta.get("spec_verify_ct", 0),
        )
    return by_q


def _tag_questions(fake, tokenizer):
    """Attach the question id to each recorded request (from the prompt text)."""
    for r in fake.requests:
        text = tokenizer.decode(r["payload"]["input_ids"])
        r["text"] = text
        r["qid"] = next((str(q["question_id"]) for q in QUESTIONS if q["turns"][0] in text), None)


def test_end_to_end_two_configs(tokdir, questions, tmp_path, capsys):
    from transformers import AutoTokenizer

    out = tmp_path / "out"
    with FakeSGLang(tokdir, speed=100.0) as base, FakeSGLang(tokdir, speed=260.0, accept=2.5, telemetry=True) as fast:
        rc, cap = _run(
            [
                "--config",
                f"name=base,algorithm=none,url={base.url}",
                "--config",
                f"name=fast,algorithm=DYNVOCAB,url={fast.url}",
                "--questions",
                str(questions),
                "--out",
                str(out),
                "--warmup",
                "1",
                "--no-progress",
                "--max-new-tokens",
                "64",
            ],
            capsys,
        )
    assert rc == 0, cap.err
    assert "| fast | DYNVOCAB | overall |" in cap.out and f"wrote {out / 'specbench.json'}" in cap.out
    result = json.loads((out / "specbench.json").read_text())
    assert set(result) == EXPECTED_KEYS
    assert result["partial"] is False and result["missing"] == [] and result["budget"] is None
    assert result["concurrency"] == 1 and result["temperature"] == 0.0
    assert (
        result["command"].startswith("sglang-specvocab bench specbench ") and "--max-new-tokens 64" in result["command"]
    )
    assert set(result["versions"]) >= {"sglang", "torch", "sglang-specvocab"} and result["device"]
    assert (out / "specbench.md").is_file() and (out / "specbench.png").stat().st_size > 0

    tokenizer = AutoTokenizer.from_pretrained(tokdir)
    rows = {(r["config"], r["category"]): r for r in result["runs"]}
    assert [k for k in rows if k[0] == "base"] == [("base", c) for c in ("mt_bench", "translation", "qa", "overall")]
    for r in result["runs"]:
        assert RUN_KEYS <= set(r) and set(r) - RUN_KEYS <= {"dynvocab_set_size", "dynvocab_coverage"}
    members = {
        "mt_bench": {"81", "91"},
        "translation": {"201", "202"},
        "qa": {"301"},
        "overall": {"81", "91", "201", "202", "301"},
    }
    expected = {}
    for name, fake in (("base", base), ("fast", fast)):
        assert len(fake.requests) == 1 + 7  # one warmup (max 32 new tokens) + 7 turns
        _tag_questions(fake, tokenizer)
        expected[name] = _spec_bench_expected(fake)
    for category, qids in members.items():
        speed = {name: [expected[name][q][0] / expected[name][q][1] for q in sorted(qids)] for name in expected}
        for name in ("base", "fast"):
            row = rows[(name, category)]
            assert row["n"] == len(qids)
            assert row["tokens_per_s"] == pytest.approx(sum(speed[name]) / len(qids))
        # Spec-Bench: the ratio of the mean per-question speeds (not of total tokens over total time)
        want = (sum(speed["fast"]) / len(qids)) / (sum(speed["base"]) / len(qids))
        assert rows[("fast", category)]["speedup"] == pytest.approx(want)
        assert rows[("base", category)]["speedup"] == 1.0 and rows[("base", category)]["accept_length"] == 1.0
        tokens = sum(expected["fast"][q][0] for q in qids)
        verify = sum(expected["fast"][q][2] for q in qids)
        assert rows[("fast", category)]["accept_length"] == pytest.approx(tokens / verify)
        assert 1.0 < rows[("fast", category)]["accept_length"] <= 2.5
        assert "dynvocab_set_size" not in rows[("base", category)]
        assert rows[("fast", category)]["dynvocab_coverage"] == pytest.approx(0.9)
        sizes = [r["reply"]["meta_info"]["dynvocab_set_size"] for r in fast.timed() if r["qid"] in qids]
        assert rows[("fast", category)]["dynvocab_set_size"] == pytest.approx(
            sum(sum(s) / 2 for s in sizes) / len(sizes)
        )
    assert 1.5 < rows[("fast", "overall")]["speedup"] < 2.6  # 2.6x faster per token, minus a fixed overhead
    # the same answers from both servers: greedy parity holds (no control: compared with the target alone)
    [row] = result["parity"]["configs"]
    assert result["parity"]["parity_ok"] is True and row["verdict"] == "identical to the target"
    assert row["control"] is None and row["against_control"] is None
    ref = row["against_reference"]
    assert (ref["against"], ref["compared"], ref["identical"], ref["differences"]) == ("base", 7, 7, [])
    assert "- `fast`: identical to the target" in (out / "specbench.md").read_text()


def test_second_turn_carries_the_first_answer(tokdir, questions, tmp_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokdir)
    with FakeSGLang(tokdir, accept=2.0) as fake:
        rc, _ = _run(
            [
                "--config",
                f"name=x,algorithm=EAGLE3,url={fake.url}",
                "--questions",
                str(questions),
                "--out",
                str(tmp_path / "o"),
                "--warmup",
                "0",
                "--no-progress",
                "--categories",
                "mt_bench",
            ]
        )
    assert rc == 0
    assert len(fake.requests) == 4  # two questions, two turns each
    by_prompt = {}
    for r in fake.requests:
        ids = r["payload"]["input_ids"]
        assert ids[0] == tokenizer.bos_token_id and ids.count(tokenizer.bos_token_id) == 1  # the template's BOS only
        by_prompt[tokenizer.decode(ids)] = r["reply"]["text"]
    for q in QUESTIONS[:2]:
        first = next(p for p in by_prompt if q["turns"][0] in p and q["turns"][1] not in p)
        second = next(p for p in by_prompt if q["turns"][1] in p)
        assert first == f"<bos><start_of_turn>user\n{q['turns'][0]}<end_of_turn>\n<start_of_turn>model\n"
        # the second prompt is the first conversation, the model's own answer, then the new question
        assert second == (
            f"<bos><start_of_turn>user\n{q['turns'][0]}<end_of_turn>\n<start_of_turn>assistant\n"
            f"{by_prompt[first]}<end_of_turn>\n<start_of_turn>user\n{q['turns'][1]}<end_of_turn>\n"
            "<start_of_turn>model\n"
        )


def test_resume_skips_finished_turns(tokdir, questions, tmp_path, capsys):
    out = tmp_path / "out"
    args = ["--questions", str(questions), "--out", str(out), "--warmup", "1", "--no-progress"]
    with FakeSGLang(tokdir, accept=2.0) as fake:
        spec = ["--config", f"name=a,algorithm=EAGLE3,url={fake.url}"]
        assert _run(spec + args, capsys)[0] == 0
        assert len(fake.timed()) == 7
        first = json.loads((out / "specbench.json").read_text())

        rc, cap = _run(spec + args, capsys)  # everything cached: no request at all, not even warmup
        assert rc == 0 and "all 7 turns are cached" in cap.out
        assert len(fake.requests) == 8
        assert json.loads((out / "specbench.json").read_text())["runs"] == first["runs"]

        cache = out / "specbench-cache.jsonl"
        lines = cache.read_text().splitlines()
        kept = [
            line for line in lines if not (json.loads(line)["question_id"] == "81" and json.loads(line)["turn"] == 1)
        ]
        cache.write_text("\n".join(kept) + "\n" + '{"key": "half-writ')  # and a line cut by a crash
        rc, cap = _run(spec + args, capsys)
        assert rc == 0 and "1 of 7 turns to run" in cap.out and "ignored 1 unreadable line" in cap.err
        assert len(fake.timed()) == 8  # only question 81's second turn again (after one warmup)
        redone = fake.timed()[-1]["payload"]["input_ids"]
        # the same prompt as the first time: its first answer came from the cache
        assert any(r["payload"]["input_ids"] == redone for r in fake.timed()[:-1])

        rc, cap = _run(spec + args + ["--max-new-tokens", "50"], capsys)  # other settings: other cache keys
        assert rc == 0 and "7 of 7 turns to run" in cap.out


def test_launches_servers_and_stops_them(tokdir, questions, tmp_path, capsys):
    launcher = [
        sys.executable,
        "-c",
        (f"import sys; sys.path.insert(0, {str(TESTS)!r}); import test_specbench; test_specbench.serve_from_argv()"),
    ]
    configs = tmp_path / "configs.yaml"
    configs.write_text(
        "configs:\n"
        f"  - name: ar\n    args: --model-path {tokdir}\n    launcher: {json.dumps(launcher)}\n"
        f"  - name: spec\n    args: [--model-path, {tokdir}, --accept, '3', --speculative-algorithm, eagle3]\n"
        f"    launcher: {json.dumps(launcher)}\n    env: {{SPECBENCH_TEST: '1'}}\n"
    )
    out = tmp_path / "out"
    rc, cap = _run(
        [
            "--configs",
            str(configs),
            "--questions",
            str(questions),
            "--out",
            str(out),
            "--warmup",
            "0",
            "--no-progress",
            "--limit-per-category",
            "1",
            "--server-timeout",
            "120",
        ],
        capsys,
    )
    assert rc == 0, cap.err
    assert cap.out.count("launching:") == 2 and "--host 127.0.0.1 --port" in cap.out
    result = json.loads((out / "specbench.json").read_text())
    rows = {(r["config"], r["category"]): r for r in result["runs"]}
    assert rows[("spec", "overall")]["algorithm"] == "EAGLE3"  # taken from --speculative-algorithm
    assert rows[("ar", "overall")]["n"] == rows[("spec", "overall")]["n"] == 3  # one question per category
    assert 1.0 < rows[("spec", "overall")]["accept_length"] <= 3.0
    log = (out / "logs" / "spec.log").read_text()
    assert "fake server up" in log
    # both servers were stopped: their ports no longer answer
    import urllib.error
    import urllib.request

    for line in cap.out.splitlines():
        if "launching:" in line:
            port = shlex.split(line)[-1]
            with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
                urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
                    f"http://127.0.0.1:{port}/health", timeout=2
                )


def test_server_that_dies_shows_its_log(tokdir, questions, tmp_path, capsys):
    crash = shlex.join(
        [sys.executable, "-c", "import sys; print('RuntimeError: no CUDA GPUs are available'); sys.exit(3)"]
    )
    rc, cap = _run(
        [
            "--config",
            "name=broken,args=--model-path x",
            "--launcher",
            crash,
            "--questions",
            str(questions),
            "--out",
            str(tmp_path / "o"),
            "--no-progress",
        ],
        capsys,
    )
    assert rc == 2
    assert "server 'broken' exited with code 3 before it became healthy" in cap.err
    assert "no CUDA GPUs are available" in cap.err and "broken.log" in cap.err


def test_server_that_never_gets_healthy_times_out(tokdir, questions, tmp_path, capsys):
    hang = shlex.join([sys.executable, "-c", "import time; print('loading weights', flush=True); time.sleep(600)"])
    rc, cap = _run(
        [
            "--config",
            "name=slow,args=--model-path x",
            "--launcher",
            hang,
            "--questions",
            str(questions),
            "--out",
            str(tmp_path / "o"),
            "--no-progress",
            "--server-timeout",
            "2",
        ],
        capsys,
    )
    assert rc == 2
    assert "server 'slow' did not become healthy within 2 s" in cap.err and "loading weights" in cap.err


def test_server_errors_and_unreachable_urls_are_clear(tokdir, questions, tmp_path, capsys):
    with FakeSGLang(tokdir, fail="The input (9000 tokens) is longer than the model's context length") as fake:
        rc, cap = _run(
            [
                "--config",
                f"name=a,algorithm=none,url={fake.url}",
                "--questions",
                str(questions),
                "--out",
                str(tmp_path / "o"),
                "--warmup",
                "0",
                "--no-progress",
            ],
            capsys,
        )
    assert rc == 2 and "/generate: HTTP 400" in cap.err and "longer than the model's context length" in cap.err
    rc, cap = _run(
        [
            "--config",
            "name=a,algorithm=none,url=http://127.0.0.1:9",
            "--questions",
            str(questions),
            "--out",
            str(tmp_path / "o"),
            "--no-progress",
            "--server-timeout",
            "1",
        ],
        capsys,
    )
    assert rc == 2 and "no healthy SGLang server at http://127.0.0.1:9" in cap.err


def test_plain_prompts_and_missing_templates(questions, tmp_path, capsys):
    plain_tok = make_tokenizer(tmp_path / "plain-tok", chat_template=False)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(plain_tok)
    with FakeSGLang(plain_tok) as fake:
        base = [
            "--config",
            f"name=a,algorithm=none,url={fake.url}",
            "--questions",
            str(questions),
            "--out",
            str(tmp_path / "o"),
            "--warmup",
            "0",
            "--no-progress",
            "--categories",
            "qa",
        ]
        rc, cap = _run(base + ["--prompt-format", "chat"], capsys)
        assert rc == 2 and "the tokenizer has no chat template" in cap.err
        rc, cap = _run(base, capsys)  # auto: no template, so the plain transcript; the tokenizer adds BOS
        assert rc == 0, cap.err
    ids = fake.requests[-1]["payload"]["input_ids"]
    assert tokenizer.decode(ids) == "<bos>Question: Who wrote Hamlet?\nAnswer:"


def test_concurrency_gives_the_same_answers(tokdir, questions, tmp_path):
    with FakeSGLang(tokdir, accept=2.0) as fake:
        for c in ("1", "3"):
            rc, _ = _run(
                [
                    "--config",
                    f"name=a,algorithm=EAGLE3,url={fake.url}",
                    "--questions",
                    str(questions),
                    "--out",
                    str(tmp_path / c),
                    "--warmup",
                    "0",
                    "--no-progress",
                    "--concurrency",
                    c,
                ]
            )
            assert rc == 0
    one, three = (json.loads((tmp_path / c / "specbench.json").read_text()) for c in ("1", "3"))
    assert three["concurrency"] == 3
    assert [(r["category"], r["accept_length"], r["n"]) for r in one["runs"]] == [
        (r["category"], r["accept_length"], r["n"]) for r in three["runs"]
    ]


@pytest.mark.parametrize(
    "spec, message",
    [
        ("name=a,algorithm=medusa,url=http://h:1", "'algorithm' must be one of none, EAGLE, EAGLE3, DYNVOCAB"),
        ("algorithm=none,url=http://h:1", "'name' must be a non-empty string"),
        ("name=a b,url=http://h:1,algorithm=none", "'name' must be a non-empty string"),
        ("name=a,url=http://h:1", "a server reached by url needs 'algorithm'"),
        ("name=a,algorithm=none", "needs 'args' (server arguments to launch with) or 'url'"),
        ("name=a,args=--model-path m,url=http://h:1,algorithm=none", "either 'url'"),
        ("name=a,url=h:1,algorithm=none", "'url' must start with http://"),
        ("name=a,colour=red,url=http://h:1", "unknown key(s) colour"),
        ('name=a,args="--model-path m', "check the quotes"),
        ("name=a,justaword", "'justaword' is not key=value"),
        ("name=a,name=b,url=http://h:1", "'name' given twice"),
        ("name=a,env=NOEQUALS,args=--model-path m", "'env' must be 'KEY=VALUE"),
    ],
)
def test_bad_config_specs(spec, message):
    with pytest.raises(SpecBenchError) as err:
        parse_config_spec(spec)
    assert message in str(err.value)


def test_config_spec_parsing():
    c = parse_config_spec(
        'name=e3,args="--model-path /m --cuda-graph-bs 1,2,4 --speculative-algorithm=EAGLE3",env="A=1 B=\'two words\'"'
    )
    assert c.name == "e3" and c.algorithm == "EAGLE3" and c.url is None
    assert c.args == ["--model-path", "/m", "--cuda-graph-bs", "1,2,4", "--speculative-algorithm=EAGLE3"]
    assert c.env == {"A": "1", "B": "two words"}
    d = make_config({"name": "d", "algorithm": "dynvocab", "url": "http://x:1/"}, "t")
    assert d.algorithm == "DYNVOCAB" and d.url == "http://x:1"


def test_bad_inputs_give_clear_errors(tokdir, questions, tmp_path, capsys):
    url = "name=a,algorithm=none,url=http://127.0.0.1:9"
    common = ["--out", str(tmp_path / "o"), "--no-progress"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(QUESTIONS[0]) + "\n{not json\n")
    rc, cap = _run(["--config", url, "--questions", str(bad)] + common, capsys)
    assert rc == 2 and "bad.jsonl line 2: not valid JSON" in cap.err
    bad.write_text(json.dumps({"question_id": 1, "category": "qa", "turns": "not a list"}) + "\n")
    rc, cap = _run(["--config", url, "--questions", str(bad)] + common, capsys)
    assert rc == 2 and "'turns' must be a non-empty list of non-empty strings" in cap.err
    bad.write_text(json.dumps(QUESTIONS[2]) + "\n" + json.dumps(QUESTIONS[2]) + "\n")
    rc, cap = _run(["--config", url, "--questions", str(bad)] + common, capsys)
    assert rc == 2 and "question_id 201 appears twice" in cap.err
    rc, cap = _run(["--config", url, "--questions", str(tmp_path / "missing.jsonl")] + common, capsys)
    assert rc == 2 and "missing.jsonl: no such file" in cap.err
    rc, cap = _run(["--config", url, "--questions", str(questions), "--categories", "qa,poetry"] + common, capsys)
    assert rc == 2 and "unknown category poetry" in cap.err and "mt_bench, translation, qa" in cap.err
    rc, cap = _run(["--config", url, "--config", url, "--questions", str(questions)] + common, capsys)
    assert rc == 2 and "config name 'a' is used twice" in cap.err
    yaml_file = tmp_path / "c.yaml"
    yaml_file.write_text("configs: [name: a\n")
    rc, cap = _run(["--configs", str(yaml_file), "--questions", str(questions)] + common, capsys)
    assert rc == 2 and "not valid YAML" in cap.err
    yaml_file.write_text("configs:\n  - name: a\n    algorithm: none\n")
    rc, cap = _run(["--configs", str(yaml_file), "--questions", str(questions)] + common, capsys)
    assert rc == 2 and "c.yaml entry 1 (config 'a'): needs 'args'" in cap.err
    for args, message in (
        (["--concurrency", "0"], "argument --concurrency: must be positive integers separated by commas, got '0'"),
        (["--temperature", "-1"], "argument --temperature: must be at least 0.0, got -1.0"),
        ([], "no configurations: give --config and/or --configs"),
    ):
        rc, cap = _run((["--config", url] if args else []) + args + ["--questions", str(questions)] + common, capsys)
        assert rc == 2 and message in cap.err and len(cap.err.strip().splitlines()) == 1


def test_summary_skips_unfinished_questions_and_compares_common_ones():
    base, other = (
        make_config({"name": n, "algorithm": a, "url": "http://x:1"}, "t") for n, a in (("b", "none"), ("o", "EAGLE3"))
    )
    from sglang_specvocab.tools.prompts import Question

    qs = [Question("1", "qa", ("a",)), Question("2", "qa", ("b",)), Question("3", "mt_bench", ("c", "d"))]

    def rec(qid, turn, tokens, seconds, verify=None):
        return {
            "question_id": qid,
            "turn": turn,
            "completion_tokens": tokens,
            "time_s": seconds,
            "spec_verify_ct": verify,
        }

    records = {
        "b": [rec("1", 0, 10, 1.0), rec("2", 0, 10, 2.0), rec("3", 0, 5, 1.0)],  # q3 lacks turn 2: not counted
        "o": [rec("1", 0, 10, 0.5, 4), rec("3", 0, 6, 1.0, 3), rec("3", 1, 6, 1.0, 2)],  # q2 missing
    }
    rows = {(r["config"], r["category"]): r for r in summarize([base, other], qs, records)}
    assert ("b", "mt_bench") not in rows and rows[("o", "mt_bench")]["speedup"] is None  # no common question
    assert rows[("b", "qa")]["tokens_per_s"] == pytest.approx((10 / 1 + 10 / 2) / 2) and rows[("b", "qa")]["n"] == 2
    assert rows[("o", "qa")]["speedup"] == pytest.approx(20.0 / 10.0)  # over question 1, the only common one
    assert rows[("o", "overall")]["accept_length"] == pytest.approx((10 + 12) / (4 + 5))
    assert rows[("o", "overall")]["n"] == 2 and rows[("b", "overall")]["n"] == 2


# --- greedy parity ------------------------------------------------------------------------------

MODEL = ["--model-path", "/m/gemma-3-270m"]
TREE = ["--speculative-draft-model-path", "/m/draft", "--speculative-num-steps", "3"]


def _parity_setup():
    from sglang_specvocab.tools.prompts import Question

    configs = [
        make_config({"name": "target", "args": MODEL}, "t"),
        make_config({"name": "eagle3-full", "args": [*MODEL, "--speculative-algorithm", "EAGLE3", *TREE]}, "t"),
        make_config(
            {
                "name": "dynvocab-hybrid",
                "algorithm": "DYNVOCAB",
                "args": [*MODEL, "--speculative-algorithm", "EAGLE3", *TREE, "--speculative-dynvocab-config", "h.yaml"],
            },
            "t",
        ),
    ]
    questions = [
        Question("81", "mt_bench", ("Write a haiku.", "Now make it rhyme.")),
        Question("201", "translation", ("Translate: Der Hund schlaeft.",)),
        Question("301", "qa", ("Who wrote Hamlet?",)),
    ]
    texts = {
        ("81", 0): "Rain on the roof, soft and slow.",
        ("81", 1): "Rain on the roof, a tapping show.",
        ("201", 0): "The dog is sleeping.",
        ("301", 0): "Shakespeare wrote Hamlet.",
    }
    return configs, questions, texts


def _records(questions, texts, changes=None):
    changes = changes or {}
    return [
        {"question_id": q.qid, "category": q.category, "turn": t, "text": changes.get((q.qid, t), texts[(q.qid, t)])}
        for q in questions
        for t in range(len(q.turns))
    ]


def _parity_of(target=None, eagle3=None, dynvocab=None, temperature=0.0):
    configs, questions, texts = _parity_setup()
    records = {
        "target": _records(questions, texts, target),
        "eagle3-full": _records(questions, texts, eagle3),
        "dynvocab-hybrid": _records(questions, texts, dynvocab),
    }
    section = parity(configs, questions, records, temperature)
    result = {
        "runs": [],
        "parity": section,
        "device": "cpu",
        "versions": {},
        "command": "c",
        "concurrency": 1,
        "temperature": temperature,
    }
    return section, {r["config"]: r for r in section.get("configs", [])}, markdown(result)


def _counts(cmp):
    return cmp["against"], cmp["compared"], cmp["identical"], cmp["differing"], cmp["not_comparable"]


def test_parity_all_identical():
    section, rows, md = _parity_of()
    assert section["compared"] is True and section["reference"] == "target" and section["parity_ok"] is True
    assert list(rows) == ["eagle3-full", "dynvocab-hybrid"]  # the reference is not compared with itself
    dyn = rows["dynvocab-hybrid"]
    assert dyn["control"] == "eagle3-full"  # found by lossless.controls: same target, draft and tree arguments
    assert _counts(dyn["against_reference"]) == ("target", 4, 4, 0, 0)
    assert _counts(dyn["against_control"]) == ("eagle3-full", 4, 4, 0, 0)
    assert dyn["verdict"] == "identical to the target" and dyn["ours"] == 0
    assert _counts(rows["eagle3-full"]["against_reference"]) == ("target", 4, 4, 0, 0)
    assert rows["eagle3-full"]["against_control"] is None and "verdict" not in rows["eagle3-full"]
    assert "**parity ok: no DYNVOCAB turn differs from both its control and the target**" in md
    assert "- `dynvocab-hybrid`: identical to the target" in md
    assert "| dynvocab-hybrid | DYNVOCAB | eagle3-full (control) | 4 | 4 | 0 | 0 |" in md
    assert "first differing character" not in md and parity_failures(section) == []


def test_parity_equal_to_eagle3_but_not_the_target_is_the_engine():
    engine = {("301", 0): "Shakespeare wrote it, around 1600."}
    section, rows, md = _parity_of(eagle3=engine, dynvocab=engine)
    dyn = rows["dynvocab-hybrid"]
    assert section["parity_ok"] is True and dyn["ours"] == 0 and parity_failures(section) == []
    assert dyn["verdict"] == (
        "identical to EAGLE3 (its control), differs from the target on 1 turn: the engine's numerics"
    )
    assert _counts(dyn["against_reference"]) == ("target", 4, 3, 1, 0)
    assert _counts(dyn["against_control"]) == ("eagle3-full", 4, 4, 0, 0)
    assert dyn["against_reference"]["differences"] == [
        {
            "question_id": "301",
            "category": "qa",
            "turn": 1,
            "char": 18,  # "Shakespeare wrote " is the common prefix
            "expected": "Shakespeare wrote Hamlet.",
            "got": "Shakespeare wrote it, around 1600.",
            "token": None,  # these records have no output_ids
        }
    ]
    assert rows["eagle3-full"]["against_reference"]["differing"] == 1
    assert "**parity ok" in md
    assert "- `dynvocab-hybrid`: identical to EAGLE3 (its control), differs from the target on 1 turn" in md
    assert "| dynvocab-hybrid | DYNVOCAB | target (reference) | 4 | 3 | 1 | 0 |" in md
    assert (
        "- question 301 (qa) turn 1, char 18: target 'Shakespeare wrote Hamlet.' / "
        "dynvocab-hybrid 'Shakespeare wrote it, around 1600.'" in md
    )


def test_parity_differing_from_both_fails():
    section, rows, md = _parity_of(dynvocab={("201", 0): "The cat is sleeping."})
    dyn = rows["dynvocab-hybrid"]
    assert section["parity_ok"] is False
    assert dyn["ours"] == 1 and dyn["ours_turns"] == [{"question_id": "201", "category": "translation", "turn": 1}]
    assert dyn["verdict"] == "differs from its control on 1 turn"
    assert _counts(dyn["against_reference"]) == ("target", 4, 3, 1, 0)
    assert _counts(dyn["against_control"]) == ("eagle3-full", 4, 3, 1, 0)
    [d] = dyn["against_control"]["differences"]
    assert (d["question_id"], d["turn"], d["char"], d["expected"], d["got"]) == (
        "201",
        1,
        4,
        "The dog is sleeping.",
        "The cat is sleeping.",
    )
    assert parity_failures(section) == ["dynvocab-hybrid: differs from its control on 1 turn"]
    assert "**parity FAILED" in md and "- `dynvocab-hybrid`: differs from its control on 1 turn" in md
    assert (
        "- question 201 (translation) turn 1, char 4: eagle3-full 'The dog is sleeping.' / "
        "dynvocab-hybrid 'The cat is sleeping.'" in md
    )


def test_parity_turn_two_after_a_differing_turn_one_is_not_comparable():
    # DYNVOCAB's turn 1 differs from both; its turn 2 happens to read the same, but its prompt differed
    section, rows, md = _parity_of(dynvocab={("81", 0): "Rain on the roof, soft and low."})
    dyn = rows["dynvocab-hybrid"]
    assert section["parity_ok"] is False and dyn["ours"] == 1  # turn 1 only: turn 2 is not counted as ours
    assert dyn["ours_turns"] == [{"question_id": "81", "category": "mt_bench", "turn": 1}]
    assert _counts(dyn["against_reference"]) == ("target", 3, 2, 1, 1)
    assert _counts(dyn["against_control"]) == ("eagle3-full", 3, 2, 1, 1)
    assert [d["turn"] for d in dyn["against_reference"]["differences"]] == [1]
    assert "| dynvocab-hybrid | DYNVOCAB | target (reference) | 3 | 2 | 1 | 1 |" in md
    assert "not comparable (earlier turn differed) |" in md

    # EAGLE3 and DYNVOCAB differ from the target at turn 1 alike: turn 2 is compared with the control only
    engine = {("81", 0): "Rain on the roof, soft and low."}
    section, rows, _ = _parity_of(eagle3=engine, dynvocab=engine)
    dyn = rows["dynvocab-hybrid"]
    assert _counts(dyn["against_reference"]) == ("target", 3, 2, 1, 1)
    assert _counts(dyn["against_control"]) == ("eagle3-full", 4, 4, 0, 0)
    assert section["parity_ok"] is True
    assert dyn["verdict"] == (
        "identical to EAGLE3 (its control), differs from the target on 1 turn: the engine's numerics"
    )
    # ... and a turn 2 that then differs from the control is ours (the target cannot vouch for it)
    section, rows, _ = _parity_of(eagle3=engine, dynvocab={**engine, ("81", 1): "Rain on the roof, a drumming show."})
    dyn = rows["dynvocab-hybrid"]
    assert section["parity_ok"] is False and dyn["verdict"] == "differs from its control on 1 turn"
    assert dyn["ours_turns"] == [{"question_id": "81", "category": "mt_bench", "turn": 2}]
    assert _counts(dyn["against_control"]) == ("eagle3-full", 4, 3, 1, 0)


def test_parity_is_not_compared_when_sampled():
    section, rows, md = _parity_of(dynvocab={("201", 0): "The cat is sleeping."}, temperature=0.7)
    assert section == {"compared": False, "reason": "sampled", "temperature": 0.7, "parity_ok": None}
    assert rows == {} and parity_failures(section) == []
    assert "## Greedy parity\n\nnot compared: sampled (temperature 0.7)" in md


def test_parity_without_a_control_lists_every_difference_in_the_json():
    from sglang_specvocab.tools.prompts import Question

    configs = [
        make_config({"name": "target", "args": MODEL}, "t"),
        make_config({"name": "dyn", "algorithm": "DYNVOCAB", "url": "http://x:1"}, "t"),
    ]
    questions = [Question(str(i), "qa", (f"q{i}",)) for i in range(22)]
    long = "x" * 100
    records = {
        "target": [
            {"question_id": q.qid, "category": "qa", "turn": 0, "text": long + "AB" + "y" * 50} for q in questions
        ],
        "dyn": [{"question_id": q.qid, "category": "qa", "turn": 0, "text": long + "AC" + "y" * 50} for q in questions],
    }
    section = parity(configs, questions, records, 0.0)
    [row] = section["configs"]
    assert section["parity_ok"] is False and row["control"] is None
    assert row["verdict"] == "differs from the target on 22 turns (no EAGLE3 control)"
    diffs = row["against_reference"]["differences"]
    assert len(diffs) == 22 and diffs[0]["char"] == 101
    assert diffs[0]["expected"] == "x" * 19 + "AB" + "y" * 19 and diffs[0]["got"] == "x" * 19 + "AC" + "y" * 19
    md = markdown(
        {
            "runs": [],
            "parity": section,
            "device": "cpu",
            "versions": {},
            "command": "c",
            "concurrency": 1,
            "temperature": 0.0,
        }
    )
    assert md.count("- question ") == 20 and "- and 2 more (all in the JSON)" in md


class AlteredSGLang(FakeSGLang):
    """FakeSGLang whose answer to a prompt containing ``marker`` gets ``suffix`` appended (only after its
    first ``after`` requests: a server that goes wrong later, e.g. at the second concurrency)."""

    def __init__(self, tokenizer_path, marker=None, suffix=" (changed)", after=0, **kw):
        from transformers import AutoTokenizer

        self.marker, self.suffix, self.after = marker, suffix, after
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
        super().__init__(tokenizer_path, **kw)

    def reply(self, payload):
        reply = super().reply(payload)
        with self.lock:
            late = len(self.requests) > self.after
        if late and self.marker and self.marker in self.tokenizer.decode(payload["input_ids"]):
            reply["text"] += self.suffix
        return reply


@pytest.mark.parametrize(
    "eagle3_marker, dyn_marker, temperature, rc, verdict",
    [
        (None, None, "0", 0, "identical to the target"),
        (
            "Hamlet",
            "Hamlet",
            "0",
            0,
            "identical to EAGLE3 (its control), differs from the target on 1 turn: the engine's numerics",
        ),
        (None, "Hamlet", "0", 1, "differs from its control on 1 turn"),
        (None, "Hamlet", "0.5", 0, None),  # sampled: nothing compared, nothing fails
    ],
)
def test_bench_exits_1_when_greedy_parity_fails(
    tokdir, questions, tmp_path, capsys, eagle3_marker, dyn_marker, temperature, rc, verdict
):
    out = tmp_path / "out"
    with (
        FakeSGLang(tokdir) as target,
        AlteredSGLang(tokdir, eagle3_marker, accept=2.0) as eagle3,
        AlteredSGLang(tokdir, dyn_marker, accept=2.0) as dyn,
    ):
        configs = _parity_specs(target, eagle3, dyn)
        got, cap = _run(_args(out, questions, *configs, extra=["--temperature", temperature], concurrency=None), capsys)
    assert got == rc, cap.err
    section = json.loads((out / "specbench.json").read_text())["parity"]
    md = (out / "specbench.md").read_text()
    if verdict is None:
        assert section["compared"] is False and section["parity_ok"] is None
        assert "not compared: sampled (temperature 0.5)" in md and "greedy parity" not in cap.err
        return
    dyn_row = next(r for r in section["configs"] if r["config"] == "dynvocab-hybrid")
    assert dyn_row["verdict"] == verdict and f"- `dynvocab-hybrid`: {verdict}" in md and verdict in cap.out
    assert dyn_row["against_reference"]["compared"] == dyn_row["against_control"]["compared"] == 3
    assert section["parity_ok"] is (rc == 0)
    if rc == 1:
        assert "greedy parity FAILED" in cap.err and f"dynvocab-hybrid: {verdict}" in cap.err
        assert "wrote " in cap.out  # the report is written all the same
    else:
        assert "greedy parity" not in cap.err


def test_an_ambiguous_control_is_refused_before_any_server_starts(questions, tmp_path, capsys):
    e3 = '"--model-path m --speculative-algorithm EAGLE3"'
    rc, cap = _run(
        [
            "--config",
            "name=target,args=--model-path m",
            "--config",
            f"name=e3-a,args={e3}",
            "--config",
            f"name=e3-b,args={e3},env=X=1",
            "--config",
            'name=dyn,algorithm=DYNVOCAB,args="--model-path m --speculative-algorithm DYNVOCAB"',
            "--questions",
            str(questions),
            "--out",
            str(tmp_path / "o"),
            "--no-progress",
        ],
        capsys,
    )
    assert rc == 2 and "several EAGLE3 configurations have its arguments (e3-a, e3-b)" in cap.err
    assert "launching:" not in cap.out and not (tmp_path / "o" / "logs").exists()


# --- several concurrencies in one run -----------------------------------------------------------

LEVEL_LINE = re.compile(r"^\[(\S+)\] (launching|concurrency \d+):", re.MULTILINE)


def _events(out: str) -> list[str]:
    """What a run did, in order, from its output: '<config> launching', '<config> concurrency N'."""
    return [f"{name} {what}" for name, what in LEVEL_LINE.findall(out)]


def _rows(result: dict) -> list[tuple]:
    """The speed table without its timings: who, which category, how many questions, accept length."""
    return [(r["config"], r["algorithm"], r["category"], r["n"], r["accept_length"]) for r in result["runs"]]


def _counts_by_row(result: dict) -> dict:
    return {(r["config"], r["category"]): r["n"] for r in result["runs"]}


def _timed(fake) -> int:
    return len(fake.timed())


def _warmups(fake) -> int:
    return len(fake.requests) - len(fake.timed())


def _launched_configs(tmp_path: Path, tokdir: Path) -> Path:
    launcher = [
        sys.executable,
        "-c",
        (f"import sys; sys.path.insert(0, {str(TESTS)!r}); import test_specbench; test_specbench.serve_from_argv()"),
    ]
    configs = tmp_path / "configs.yaml"
    configs.write_text(
        "configs:\n"
        f"  - name: ar\n    args: --model-path {tokdir}\n    launcher: {json.dumps(launcher)}\n"
        f"  - name: spec\n    args: [--model-path, {tokdir}, --accept, '2', --speculative-algorithm, eagle3]\n"
        f"    launcher: {json.dumps(launcher)}\n"
    )
    return configs


def test_several_concurrencies_start_each_server_once(tokdir, questions, tmp_path, capsys):
    """--concurrency 1,3: each launched server starts once and is asked at 1, then 3, before the next
    starts; one result per concurrency (NAME-cN), each the table a run at that concurrency alone writes."""
    configs = _launched_configs(tmp_path, tokdir)
    common = ["--configs", str(configs), "--questions", str(questions), "--warmup", "0", "--no-progress"]
    common += ["--limit-per-category", "1", "--server-timeout", "120"]
    out = tmp_path / "out"
    rc, cap = _run([*common, "--out", str(out), "--concurrency", "1,3"], capsys)
    assert rc == 0, cap.err
    assert "x 2 configurations: ar (none), spec (EAGLE3); concurrency 1, 3\n" in cap.out
    assert _events(cap.out) == [
        "ar launching",
        "ar concurrency 1",
        "ar concurrency 3",
        "spec launching",
        "spec concurrency 1",
        "spec concurrency 3",
    ]
    assert "[ar] concurrency 3: 4 of 4 turns to run (0 cached)" in cap.out  # 3 questions, mt_bench's of 2 turns
    assert sorted(p.name for p in out.glob("specbench-c[0-9]*")) == [
        "specbench-c1.json",
        "specbench-c1.md",
        "specbench-c1.png",
        "specbench-c3.json",
        "specbench-c3.md",
        "specbench-c3.png",
    ]
    assert not (out / "specbench.json").exists()
    for c in (1, 3):
        assert f"wrote {out / f'specbench-c{c}.json'}" in cap.out
    both = {c: json.loads((out / f"specbench-c{c}.json").read_text()) for c in (1, 3)}
    assert {c: r["concurrency"] for c, r in both.items()} == {1: 1, 3: 3}
    assert "concurrency 3, temperature 0" in (out / "specbench-c3.md").read_text()
    assert "concurrency 1, temperature 0" in (out / "specbench-c1.md").read_text()

    # the same, one concurrency a run (each starting both servers again), into fresh directories
    for c in (1, 3):
        alone = tmp_path / f"alone-{c}"
        rc, cap = _run([*common, "--out", str(alone), "--concurrency", str(c)], capsys)
        assert rc == 0, cap.err
        assert _events(cap.out) == ["ar launching", f"ar concurrency {c}", "spec launching", f"spec concurrency {c}"]
        result = json.loads((alone / "specbench.json").read_text())
        assert set(result) == set(both[c]) == EXPECTED_KEYS and result["concurrency"] == c
        assert _rows(result) == _rows(both[c])
        assert _counts_by_row(result) == {
            (cfg, cat): n
            for cfg in ("ar", "spec")
            for cat, n in (("mt_bench", 1), ("translation", 1), ("qa", 1), ("overall", 3))
        }
        assert result["parity"] == both[c]["parity"] and result["parity"]["parity_ok"] is True


def test_a_turn_cached_at_one_concurrency_is_never_used_at_another(tokdir, questions, tmp_path, capsys):
    """Each concurrency has its own cache keys: after a run at 1, a run at 8,1 asks every turn again at 8
    (in the order given, warming the server up once) and takes those at 1 from the cache."""
    out = tmp_path / "out"
    with FakeSGLang(tokdir, accept=2.0) as fake:
        args = ["--config", f"name=a,algorithm=EAGLE3,url={fake.url}", "--questions", str(questions)]
        args += ["--out", str(out), "--warmup", "2", "--no-progress"]
        rc, cap = _run([*args, "--concurrency", "1"], capsys)
        assert rc == 0, cap.err
        assert (_warmups(fake), _timed(fake)) == (2, 7)
        alone = json.loads((out / "specbench.json").read_text())

        rc, cap = _run([*args, "--concurrency", "8,1"], capsys)
        assert rc == 0, cap.err
        assert _events(cap.out) == ["a concurrency 8", "a concurrency 1"]
        assert "[a] concurrency 8: 7 of 7 turns to run (0 cached)" in cap.out
        assert "[a] concurrency 1: all 7 turns are cached" in cap.out
        assert (_warmups(fake), _timed(fake)) == (2 + 2, 7 + 7)  # every turn again at 8; warmed up once
        eight, one = (json.loads((out / f"specbench-c{c}.json").read_text()) for c in (8, 1))
        assert (eight["concurrency"], one["concurrency"]) == (8, 1)
        assert one["runs"] == alone["runs"] and one["parity"] == alone["parity"]  # the same cached turns
        assert _rows(eight) == _rows(alone)  # the fake answers alike at any concurrency

        records = [json.loads(line) for line in (out / "specbench-cache.jsonl").read_text().splitlines()]
        assert len(records) == len({r["key"] for r in records}) == 14
        by_fp: dict = {}
        for r in records:
            by_fp.setdefault(r["fingerprint"], set()).add((r["question_id"], r["turn"]))
        assert len(by_fp) == 2 and all(len(turns) == 7 for turns in by_fp.values())

        rc, cap = _run([*args, "--concurrency", "1,8"], capsys)  # all cached at both: no request
        assert rc == 0 and "[a] all 7 turns are cached in" in cap.out and _events(cap.out) == []
        assert len(fake.requests) == 4 + 14
        assert json.loads((out / "specbench-c8.json").read_text())["runs"] == eight["runs"]

        rc, cap = _run([*args, "--concurrency", "2,4"], capsys)  # both new: asked at each, warmed up once
        assert rc == 0 and _events(cap.out) == ["a concurrency 2", "a concurrency 4"]
        assert (_warmups(fake), _timed(fake)) == (4 + 2, 14 + 14)


class InterruptingSGLang(FakeSGLang):
    """FakeSGLang that sends this process SIGTERM (a job runner's ``timeout``) on its request number
    ``kill_at``, before answering it; that request and the 7 after it (the turns in flight at the signal)
    are answered ``delay`` seconds late, long enough for the main thread to handle the signal on a loaded
    machine (0.3 s was not, once in CI: a second turn was asked after the signal)."""

    def __init__(self, tokenizer_path, kill_at, delay=2.0, **kw):
        self.kill_at, self.delay, self.seen = kill_at, delay, 0
        super().__init__(tokenizer_path, **kw)

    def reply(self, payload):
        with self.lock:
            self.seen += 1
            n = self.seen
        if n == self.kill_at:
            os.kill(os.getpid(), signal.SIGTERM)
        if self.kill_at <= n < self.kill_at + 8:
            time.sleep(self.delay)
        return super().reply(payload)


def test_an_interrupted_run_at_several_concurrencies_resumes(tokdir, questions, tmp_path, capsys):
    """SIGTERM while the first server is asked at 8 (all its turns at 1 done): exit 130, partial results
    written (what is missing and why); the same command then asks only the turns not cached, and writes
    what an uninterrupted run writes."""
    out = tmp_path / "out"
    with FakeSGLang(tokdir) as base, InterruptingSGLang(tokdir, kill_at=8, accept=2.0) as spec:
        args = [
            "--config",
            f"name=spec,algorithm=EAGLE3,url={spec.url}",
            "--config",
            f"name=base,algorithm=none,url={base.url}",
            "--questions",
            str(questions),
            "--warmup",
            "0",
            "--no-progress",
            "--concurrency",
            "1,8",
        ]
        rc, cap = _run([*args, "--out", str(out)], capsys)
        for t in threading.enumerate():  # turns in flight at the signal end (and are cached) in the background
            if t.name.startswith("specbench-"):
                t.join(timeout=30)
        assert rc == 130, cap.err
        assert "interrupted; finished turns are cached, rerun the same command to resume" in cap.err
        assert _events(cap.out) == ["spec concurrency 1", "spec concurrency 8"]
        partial = {c: json.loads((out / f"specbench-c{c}.json").read_text()) for c in (1, 8)}
        assert all(r["partial"] for r in partial.values()) and not list(out.glob(".*.tmp"))
        assert [(m["config"], m["why"]) for m in partial[1]["missing"]] == [("base", "not reached")]
        assert [(m["config"], m["why"]) for m in partial[8]["missing"]] == [
            ("spec", "interrupted"),
            ("base", "not reached"),
        ]
        assert {r["config"] for r in partial[1]["runs"]} == {"spec"}
        assert (out / "specbench-c8.md").read_text().startswith("**PARTIAL** at concurrency 8: missing spec ")
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        records = [json.loads(line) for line in (out / "specbench-cache.jsonl").read_text().splitlines()]
        assert {r["config"] for r in records} == {"spec"} and len(base.requests) == 0
        at_one = next(r["fingerprint"] for r in records if r["turn"] == 1)  # second turns: asked at 1 only
        cached_at_8 = sum(r["fingerprint"] != at_one for r in records)
        assert sum(r["fingerprint"] == at_one for r in records) == 7
        assert 1 <= cached_at_8 <= 5  # first turns only: no second turn is asked after the signal

        rc, cap = _run([*args, "--out", str(out)], capsys)
        assert rc == 0, cap.err
        assert _events(cap.out) == [
            "spec concurrency 1",
            "spec concurrency 8",
            "base concurrency 1",
            "base concurrency 8",
        ]
        assert "[spec] concurrency 1: all 7 turns are cached" in cap.out
        assert f"[spec] concurrency 8: {7 - cached_at_8} of 7 turns to run ({cached_at_8} cached)" in cap.out
        assert "[base] concurrency 8: 7 of 7 turns to run (0 cached)" in cap.out
        assert len(spec.requests) == 7 + cached_at_8 + (7 - cached_at_8)  # each turn asked once at each
        assert len(base.requests) == 14
        resumed = {c: json.loads((out / f"specbench-c{c}.json").read_text()) for c in (1, 8)}

        fresh = tmp_path / "fresh"
        rc, cap = _run([*args, "--out", str(fresh)], capsys)  # uninterrupted (the signal was sent once)
        assert rc == 0, cap.err
    for c in (1, 8):
        whole = json.loads((fresh / f"specbench-c{c}.json").read_text())
        assert resumed[c]["concurrency"] == whole["concurrency"] == c
        assert _rows(resumed[c]) == _rows(whole) and resumed[c]["parity"] == whole["parity"]
        assert _counts_by_row(whole) == {
            (cfg, cat): n
            for cfg in ("spec", "base")
            for cat, n in (("mt_bench", 2), ("translation", 2), ("qa", 1), ("overall", 5))
        }


def test_greedy_parity_failing_at_one_concurrency_exits_1(tokdir, questions, tmp_path, capsys):
    """DYNVOCAB identical at 1 but not at 8: exit 1, the failure named with its concurrency, both results
    written."""
    out = tmp_path / "out"
    with (
        FakeSGLang(tokdir) as target,
        FakeSGLang(tokdir, accept=2.0) as eagle3,
        AlteredSGLang(tokdir, "Hamlet", after=3, accept=2.0) as dyn,  # 3 turns a concurrency: wrong at the second
    ):
        rc, cap = _run(_args(out, questions, *_parity_specs(target, eagle3, dyn)), capsys)
    assert rc == 1, cap.err
    assert len(dyn.requests) == 6
    assert "greedy parity FAILED at concurrency 8" in cap.err and "at concurrency 1" not in cap.err
    assert "dynvocab-hybrid: differs from its control on 1 turn" in cap.err
    one, eight = (json.loads((out / f"specbench-c{c}.json").read_text()) for c in (1, 8))
    assert one["parity"]["parity_ok"] is True and eight["parity"]["parity_ok"] is False
    assert "**parity ok" in (out / "specbench-c1.md").read_text()
    assert "**parity FAILED" in (out / "specbench-c8.md").read_text()
    [diff] = next(r for r in eight["parity"]["configs"] if r["config"] == "dynvocab-hybrid")["ours_turns"]
    assert diff == {"question_id": "301", "category": "qa", "turn": 1}


@pytest.mark.parametrize(
    "value, message",
    [
        ("1,1", "'1,1' names 1 twice"),
        ("8,1,8", "'8,1,8' names 8 twice"),
        ("1,0", "must be positive integers separated by commas, got '1,0'"),
        ("8,-1", "must be positive integers separated by commas, got '8,-1'"),
        (",", "must be positive integers separated by commas, got ','"),
        ("1,x", "must be integers separated by commas, got '1,x'"),
        ("1.5", "must be integers separated by commas, got '1.5'"),
        ("1;8", "must be integers separated by commas, got '1;8'"),
    ],
)
def test_bad_concurrency_lists_are_refused(questions, tmp_path, capsys, value, message):
    rc, cap = _run(
        [
            "--config",
            "name=a,args=--model-path m",
            "--questions",
            str(questions),
            "--out",
            str(tmp_path / "o"),
            f"--concurrency={value}",
        ],
        capsys,
    )
    usage = "(see sglang-specvocab bench specbench --help)"
    assert rc == 2 and cap.err.strip().splitlines() == [
        f"error: sglang-specvocab bench specbench: argument --concurrency: {message} {usage}"
    ]
    assert cap.out == "" and not (tmp_path / "o").exists()


def test_a_concurrency_list_with_spaces_is_read_in_its_order(tokdir, questions, tmp_path, capsys):
    with FakeSGLang(tokdir) as fake:
        rc, cap = _run(
            [
                "--config",
                f"name=a,algorithm=none,url={fake.url}",
                "--questions",
                str(questions),
                "--categories",
                "qa",
                "--out",
                str(tmp_path / "o"),
                "--warmup",
                "0",
                "--no-progress",
                "--concurrency",
                " 4, 2 ,1",
            ],
            capsys,
        )
    assert rc == 0, cap.err
    assert _events(cap.out) == ["a concurrency 4", "a concurrency 2", "a concurrency 1"]
    recorded = {c: json.loads((tmp_path / "o" / f"specbench-c{c}.json").read_text())["concurrency"] for c in (4, 2, 1)}
    assert recorded == {4: 4, 2: 2, 1: 1}

"""The replay command: window semantics checked end to end on random traces, and bad traces refused."""

import json
import random
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from literal import LiteralWindow

from sglang_specvocab.tools.cli import main


@st.composite
def traces(draw):
    sources = draw(st.sampled_from([["context", "extension"], ["context"], ["extension"]]))
    kpre = draw(st.integers(1, 3))
    kver = draw(st.integers(0, 3))
    cap = draw(st.integers(1, 30))
    vocab = draw(st.integers(2, 120))
    tok = st.integers(0, vocab - 1)
    reqs = []
    for _ in range(draw(st.integers(1, 7))):
        n = draw(st.integers(1, 2 * cap + 3))
        req = {
            "prompt_ids": draw(st.lists(tok, min_size=n, max_size=n)),
            "prompt_topk": draw(st.lists(st.lists(tok, min_size=kpre, max_size=kpre + 1), min_size=n, max_size=n)),
            "rounds": [
                {
                    "draft_tokens": draw(st.lists(tok, max_size=10)),
                    "verify_topk": draw(
                        st.lists(st.lists(tok, min_size=max(kver, 1), max_size=kver + 2), min_size=1, max_size=5)
                    ),
                    "accepted": draw(st.lists(tok, min_size=1, max_size=5)),
                }
                for _ in range(draw(st.integers(0, 12)))
            ],
        }
        reqs.append(req)
    return {"sources": sources, "kpre": kpre, "kver": kver, "cap": cap, "vocab": vocab, "requests": reqs}


def literal_sets(t):
    out = []
    for i, req in enumerate(t["requests"]):
        lit = LiteralWindow(t["cap"], t["kpre"], t["kver"], t["sources"])
        lit.prefill(req["prompt_ids"], req["prompt_topk"])
        out.append({"request": i, "round": 0, "size": len(lit.active()), "ids": lit.active()})
        for r, rnd in enumerate(req["rounds"], 1):
            lit.verify(rnd["draft_tokens"], rnd["verify_topk"])
            out.append({"request": i, "round": r, "size": len(lit.active()), "ids": lit.active()})
    return out


def write_case(tmp, t):
    cfg = tmp / "w.yaml"
    # only the extension source reads a top-K (a config that sets one without it is refused)
    topk = f"  prefill_topk: {t['kpre']}\n  verify_topk: {t['kver']}\n" if "extension" in t["sources"] else ""
    cfg.write_text(f"policy: window\ncapacity: {t['cap']}\nwindow:\n{topk}  sources: [{', '.join(t['sources'])}]\n")
    trace = tmp / "t.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in t["requests"]))
    return cfg, trace


@settings(max_examples=120)
@given(t=traces(), batch=st.integers(1, 4))
def test_replay_matches_literal_on_every_round(tmp_path_factory, t, batch):
    tmp = tmp_path_factory.mktemp("replay")
    cfg, trace = write_case(tmp, t)
    out = tmp / "o.jsonl"
    assert (
        main(
            [
                "replay",
                "--config",
                str(cfg),
                "--trace",
                str(trace),
                "--out",
                str(out),
                "--batch-size",
                str(batch),
                "--vocab-size",
                str(max(t["vocab"], t["cap"])),
            ]
        )
        == 0
    )
    got = [json.loads(line) for line in out.read_text().splitlines()]
    assert got == literal_sets(t)


def test_replay_as_a_subprocess(tmp_path):
    t = {
        "sources": ["context", "extension"],
        "kpre": 2,
        "kver": 2,
        "cap": 5,
        "vocab": 50,
        "requests": [
            {
                "prompt_ids": [2, 9, 9, 4],
                "prompt_topk": [[9, 1], [3, 9], [7, 7], [1, 8]],
                "rounds": [
                    {"draft_tokens": [8, 30, 31, 30], "verify_topk": [[30, 40], [41, 30]], "accepted": [30, 41]}
                ],
            },
        ],
    }
    cfg, trace = write_case(tmp_path, t)
    out = tmp_path / "o.jsonl"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "sglang_specvocab",
            "replay",
            "--config",
            str(cfg),
            "--trace",
            str(trace),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    # stream: 2 9 9 4 | 9 1 3 7 8 | 8 30 31 | 30 40 41 -> last 5 after round 1: 30 31 30 40 41
    assert lines == [
        {"request": 0, "round": 0, "size": 5, "ids": [1, 3, 7, 8, 9]},
        {"request": 0, "round": 1, "size": 4, "ids": [30, 31, 40, 41]},
    ]


BAD_TRACES = [
    ('{"prompt_ids": [1, 2], "prompt_topk": [[1, 2, 3]]}', "line 1: prompt_topk has 1 positions but prompt_ids has 2"),
    ('{"prompt_ids": [], "prompt_topk": []}', "line 1: prompt_ids must not be empty"),
    ('{"prompt_ids": [1, -4], "prompt_topk": [[1,2,3],[1,2,3]]}', "prompt_ids has token id -4"),
    (
        '{"prompt_ids": [1, 2], "prompt_topk": [[1,2,3],[1,2]]}',
        "prompt_topk[1] has 2 ids; the policy needs 3 per position",
    ),
    (
        '{"prompt_ids": [1], "prompt_topk": [[1,2,3]], "rounds": [{"draft_tokens": [1]}]}',
        "rounds[0]: missing key 'verify_topk'",
    ),
    (
        '{"prompt_ids": [1], "prompt_topk": [[1,2,3]], "rounds": [{"draft_tokens": ["a"], "verify_topk": []}]}',
        "rounds[0].draft_tokens must be a list of integer token ids",
    ),
    ('{"prompt_ids": [1], "promt_topk": [[1,2,3]]}', "unknown key 'promt_topk'"),
    ('{"prompt_ids": [1]}', "missing key 'prompt_topk'"),
    ('{"prompt_ids": [99999], "prompt_topk": [[1,2,3]]}', "token id 99999; ids must be [0, 1000)"),
    ("[1, 2]", "line 1 must be a JSON object"),
    ('{"prompt_ids": [1], ', "line 1: not valid JSON"),
]


@pytest.mark.parametrize("line,piece", BAD_TRACES, ids=[b[1][:40] for b in BAD_TRACES])
def test_bad_trace_is_refused(tmp_path, capsys, line, piece):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("policy: window\ncapacity: 16\n")
    trace = tmp_path / "t.jsonl"
    trace.write_text(line + "\n")
    rc = main(
        [
            "replay",
            "--config",
            str(cfg),
            "--trace",
            str(trace),
            "--out",
            str(tmp_path / "o.jsonl"),
            "--vocab-size",
            "1000",
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error: ") and piece in err, err
    assert "t.jsonl" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_replay_refuses_dense_policy_and_missing_files(tmp_path, capsys):
    cfg = tmp_path / "f.yaml"
    cfg.write_text("policy: full\n")
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"prompt_ids": [1]}\n')
    assert main(["replay", "--config", str(cfg), "--trace", str(trace), "--out", str(tmp_path / "o")]) == 2
    assert "policy 'full' has no candidate set to replay" in capsys.readouterr().err
    cfg.write_text("policy: window\ncapacity: 4\n")
    assert main(["replay", "--config", str(cfg), "--trace", str(tmp_path / "nope"), "--out", str(tmp_path / "o")]) == 2
    assert "cannot read trace file" in capsys.readouterr().err
    assert (
        main(["replay", "--config", str(cfg), "--trace", str(trace), "--out", str(tmp_path / "o"), "--vocab-size", "3"])
        == 2
    )
    assert "capacity = 4 is invalid: must be at most the vocabulary size 3" in capsys.readouterr().err


def random_trace(rng: random.Random) -> dict:
    """A trace as ``traces()`` draws them, from a plain RNG (1,000 of them cost seconds, not minutes)."""
    sources = rng.choice([["context", "extension"], ["context"], ["extension"]])
    kpre, kver, cap, vocab = rng.randint(1, 3), rng.randint(0, 3), rng.randint(1, 30), rng.randint(2, 120)
    tok = lambda: rng.randrange(vocab)
    reqs = []
    for _ in range(rng.randint(1, 5)):
        n = rng.randint(1, 2 * cap + 3)
        reqs.append(
            {
                "prompt_ids": [tok() for _ in range(n)],
                "prompt_topk": [[tok() for _ in range(rng.randint(kpre, kpre + 1))] for _ in range(n)],
                "rounds": [
                    {
                        "draft_tokens": [tok() for _ in range(rng.randint(0, 10))],
                        "verify_topk": [
                            [tok() for _ in range(rng.randint(max(kver, 1), kver + 2))]
                            for _ in range(rng.randint(1, 5))
                        ],
                        "accepted": [tok() for _ in range(rng.randint(1, 5))],
                    }
                    for _ in range(rng.randint(0, 8))
                ],
            }
        )
    return {"sources": sources, "kpre": kpre, "kver": kver, "cap": cap, "vocab": vocab, "requests": reqs}


@pytest.mark.slow
def test_replay_of_1000_random_traces_matches_literal():
    """1,000 random traces (window configs of every source, capacity 1-30, random batch sizes): every
    request's set after prefill and after every round equals the literal MicroSpec window's."""
    from sglang_specvocab.policies import parse_config
    from sglang_specvocab.tools.lab.replay import Request, Round, replay, replay_policy

    rng = random.Random(2026)
    for n in range(1000):
        t = random_trace(rng)
        ext = "extension" in t["sources"]
        window = {"sources": t["sources"], **({"prefill_topk": t["kpre"], "verify_topk": t["kver"]} if ext else {})}
        policy = replay_policy(
            parse_config({"policy": "window", "capacity": t["cap"], "window": window}), rng.randint(1, 4)
        )
        kpre, kver = policy.prefill_topk, policy.verify_topk
        requests = [
            Request(
                q["prompt_ids"],
                [p[:kpre] for p in q["prompt_topk"]] if kpre else [],
                [
                    Round(r["draft_tokens"], [v[:kver] for v in r["verify_topk"]] if kver else [], r["accepted"])
                    for r in q["rounds"]
                ],
            )
            for q in t["requests"]
        ]
        got = sorted(replay(policy, requests), key=lambda d: (d["request"], d["round"]))
        assert got == literal_sets(t), f"trace {n}: {t}"

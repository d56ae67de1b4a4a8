"""``sglang-specvocab bench host --quick``: the host cost DYNVOCAB adds per decode round and prefill.

Runs the command in a child process (SGLang's LogitsProcessor needs a one-process torch.distributed
group) and checks its JSON and Markdown: every case timed for both stacks with its spread, the
versions and command recorded, and the gate that CI holds (``--check``): per decode round, what a GPU
host with CUDA graphs pays beyond EAGLE3 is at most 2 kernel launches (the verify hook's) and no host
sync, counted exactly. The times are information: on a shared CPU they move by hundreds of us.

How launches and syncs are counted (``LaunchCounter``, ``eager_cost``) is checked on literal ops: views
launch nothing, a captured region's ops count apart, and each kind of host read counts as a sync.

The arithmetic behind the numbers (min of rep medians, a round as the median of per-call sums, wall less the time
in ops, the two verdicts, the Markdown) is checked without SGLang, on a fake clock and fake stacks, against numbers
worked out by hand.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from contextlib import nullcontext
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch

from sglang_specvocab.copies.upstream import SGLANG_VERSION
from sglang_specvocab.tools.bench import host

VERIFY_HOOK_OPS = (
    3  # aten launches of the window policy's verify hook: top-k + window_verify (+ SGLang's own); was 101, then 46
)


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    out = tmp_path_factory.mktemp("host") / "host.json"
    cmd = [
        sys.executable,
        "-m",
        "sglang_specvocab",
        "bench",
        "host",
        "--quick",
        "--check",  # exit status 1 when a case misses the launches/syncs gate: CI holds it
        "--reps",
        "3",
        "--rounds",
        "10",
        "--out",
        str(out),
        "--port",
        "29645",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(out.read_text()), out.with_suffix(".md").read_text()


@pytest.mark.sglang
@pytest.mark.slow
def test_every_case_is_timed_for_both_stacks_with_versions_and_command(result):
    data, md = result
    assert data["versions"]["sglang"] == SGLANG_VERSION and data["versions"]["torch"]
    assert data["command"].startswith("sglang-specvocab bench host --quick")
    shapes = {(c["shape"]["bs"], c["shape"]["topk"]) for c in data["cases"]}
    assert shapes == {(1, 1), (8, 1), (1, 4), (8, 4)}
    for c in data["cases"]:
        for stack in ("EAGLE3", "DYNVOCAB"):
            for phase in ("draft", "verify", "extend", "round"):
                t = c["decode"][stack][phase]
                assert math.isfinite(t["us"]) and t["us"] > 0 and len(t["rep_medians_us"]) == 3
            assert c["prefill"][stack]["us"] > 0
        # the target top-k alone is part of DYNVOCAB's verify (the hook runs it and one more op)
        assert 0 < c["verify_topk_us"] < c["decode"]["DYNVOCAB"]["verify"]["us"]
        # the time inside ops is part of each phase's time, and the rest is what lies outside them
        for stack in ("EAGLE3", "DYNVOCAB"):
            inside, outside = c["in_ops_us"][stack], c["outside_ops_us"][stack]
            phases = [inside[p] for p in ("draft", "verify", "extend")]  # round: the median of per-round sums
            assert max(phases) < inside["round"] < 1.5 * sum(phases)
            assert all(inside[p] > 0 for p in inside)
            # outside = wall less inside, and inside > 0: below the wall time (a sum or a swapped difference is not)
            assert all(outside[p] < c["decode"][stack][p]["us"] for p in outside), (stack, outside)
        assert c["in_ops_us"]["DYNVOCAB"]["verify"] > c["verify_topk_us"] / 2  # the hook's top-k runs inside ops
        assert f"| {c['shape']['bs']} | {c['shape']['topk']} |" in md
    assert "## Outside aten ops" in md and "Verdict (gate, launches and syncs): every case meets it." in md
    assert [r["chunk"] for r in data["prefill_topk"]["rows"]] == [256, 1024]
    assert all(r["ms_per_1k_tokens"] > 0 for r in data["prefill_topk"]["rows"])


@pytest.mark.sglang
@pytest.mark.slow
def test_a_decode_round_adds_at_most_the_verify_hooks_two_launches_and_no_sync(result):
    data, _ = result
    for c in data["cases"]:
        e, d = c["eager"]["EAGLE3"], c["eager"]["DYNVOCAB"]
        # the draft loop is a graph replay for both: nothing launched outside it
        assert e["draft"]["launches"] == d["draft"]["launches"] == 0 and d["draft"]["in_graph"] > 0, c["shape"]
        # the verify hook: the target's top-k and window_verify, beside SGLang's own
        assert d["verify"]["launches"] - e["verify"]["launches"] == 2, (e["verify"], d["verify"])
        assert set(d["verify"]["by_op"]) - set(e["verify"]["by_op"]) == {"topk", "window_verify"}
        # the extend's top-k after its replay: one compact_topk, no more launches than EAGLE3's own top-k
        assert d["extend"]["launches"] <= e["extend"]["launches"], (e["extend"], d["extend"])
        assert d["extend"]["by_op"].get("compact_topk") == 1, d["extend"]["by_op"]
        assert all(d[p]["syncs"] == e[p]["syncs"] == 0 for p in ("draft", "verify", "extend")), c["shape"]
        assert c["added_launches_per_round"] <= 2 and c["added_syncs_per_round"] == 0 and c["meets_gate"]
        ops = {s: {p: c["ops"][s][p]["ops"] for p in ("draft", "verify", "extend")} for s in ("EAGLE3", "DYNVOCAB")}
        assert ops["DYNVOCAB"]["verify"] <= VERIFY_HOOK_OPS, ops
        if c["shape"]["topk"] == 1:  # the chain path: no select_top_k_tokens per step, the top-1 into the chain
            assert ops["DYNVOCAB"]["draft"] <= ops["EAGLE3"]["draft"], ops
        else:  # trees: each step's top-k is one op (compact_topk); the head's row slots are 2 ops a call at most
            assert ops["DYNVOCAB"]["draft"] <= ops["EAGLE3"]["draft"] + 4, ops


# --- what a GPU host pays: launches and syncs, on literal ops (no SGLang, fast) ----------------------------------


def test_views_launch_nothing_and_a_captured_regions_ops_count_apart():
    x = torch.arange(6.0)
    c = host.LaunchCounter()
    with c:
        y = x.view(2, 3).t()  # views: no launch
        y = y + 1  # 1 launch
        with c.captured():  # a graph replay's ops: apart
            y.mul(2).sum()
        y.topk(1, dim=1)  # 1 launch, no sync
    got = c.summary()
    assert got["launches"] == 2 and got["in_graph"] == 2 and got["syncs"] == 0
    assert got["by_op"] == {"add": 1, "topk": 1}


@pytest.mark.parametrize(
    ("read", "op"),
    [
        (lambda x: x.sum().item(), "_local_scalar_dense"),
        (lambda x: bool(x[0] > 1), "_local_scalar_dense"),
        (lambda x: x[x > 2], "index"),  # a boolean mask: a nonzero on the device
        (lambda x: x.nonzero(), "nonzero"),
        (lambda x: torch.repeat_interleave(x.long()), "repeat_interleave"),  # output size = the repeats' sum
        (lambda x: x.tolist(), "tolist"),
        (lambda x: x.numpy(), "numpy"),
    ],
)
def test_each_host_read_counts_as_a_sync(read, op):
    c = host.LaunchCounter()
    with c:
        read(torch.arange(4.0))
    assert c.summary()["sync_ops"] == {op: 1}
    assert torch.Tensor.tolist is not None and torch.arange(2).tolist() == [0, 1]  # the reads are restored


def test_reads_the_device_keeps_are_no_syncs():
    x = torch.arange(4.0)
    c = host.LaunchCounter()
    with c:
        x[torch.tensor([0, 2])]  # an integer index: no output size to read
        torch.repeat_interleave(torch.tensor([1, 2]), output_size=3)
        torch.where(x > 2, x, 0)
        with c.captured():
            x.tolist()  # inside a captured region: not this call's host work
    assert c.summary()["syncs"] == 0 and c.summary()["launches"] == 5


def test_eager_cost_replays_the_draft_loop_and_the_extends_forward():
    x = torch.zeros(3)

    class Runner:
        def forward(self, fb):
            return x.add(1).mul(2)  # the draft forward: 2 ops, replayed as a graph on a GPU

    runner = Runner()

    class R:
        stack = SimpleNamespace(draft_worker=SimpleNamespace(draft_runner=runner))

        def draft(self):
            runner.forward(None)
            x.sub(1)

        def extend(self):
            runner.forward(None)
            x.argmax()  # the top-k after the replay: eager

        def verify(self):
            x.topk(1)
            x.tolist()

    r = R()
    assert host.eager_cost(r, "draft") | {"by_op": None} == {
        "launches": 0,
        "syncs": 0,
        "in_graph": 3,
        "by_op": None,
        "sync_ops": {},
    }
    ext = host.eager_cost(r, "extend")
    assert (ext["launches"], ext["in_graph"], ext["by_op"]) == (1, 2, {"argmax": 1})
    ver = host.eager_cost(r, "verify")
    assert (ver["launches"], ver["syncs"], ver["sync_ops"]) == (1, 1, {"tolist": 1})
    assert runner.forward.__func__ is Runner.forward  # the runner's own method again


# --- the arithmetic, on a fake clock (no SGLang, fast) ---------------------------------------------------------


class _Clock:
    """``time.perf_counter`` of the module under test: advances only when a fake phase says so (in us)."""

    def __init__(self):
        self.us = 0

    def perf_counter(self):
        return self.us * 1e-6

    def tick(self, us):
        self.us += us


class _Stack:
    """A fake stack: each phase advances the clock by its scripted durations (a number: every call; a list: one
    per call, in order) and runs ``work[phase]`` (real aten ops, for the op counter); ``log`` records who ran."""

    def __init__(self, name, clock, us, log=None, work=None):
        self.name, self.clock, self.us, self.log, self.work = name, clock, dict(us), log, work or {}
        self.inputs = SimpleNamespace(verify_round=lambda steps, nd: SimpleNamespace(logits=torch.zeros(2, 5)))

    def _run(self, phase):
        if self.log is not None and phase == "draft":
            self.log.append(self.name)
        us = self.us[phase]
        self.clock.tick(us.pop(0) if isinstance(us, list) else us)
        self.work.get(phase, lambda: None)()

    def draft(self):
        self._run("draft")

    def verify(self):
        self._run("verify")

    def extend(self):
        self._run("extend")

    def round(self):
        self.draft()
        self.verify()
        self.extend()

    def prefill(self):
        self._run("prefill")


def _close(stats, us, spread, medians):
    assert stats["us"] == pytest.approx(us) and stats["spread_us"] == pytest.approx(spread)
    assert stats["rep_medians_us"] == pytest.approx(medians)


def test_a_stacks_number_is_its_least_disturbed_rep_median_and_the_stacks_alternate(monkeypatch):
    clock, log = _Clock(), []
    monkeypatch.setattr(host, "time", clock)
    a = _Stack(
        "A",
        clock,
        {
            "draft": [10, 30, 20, 12, 11, 50, 15, 15, 15],  # rep medians 20, 12, 15
            "verify": 5,
            "extend": [1, 2, 3, 4, 5, 6, 7, 8, 9],  # rep medians 2, 5, 8
        },
        log,
    )
    b = _Stack("B", clock, {"draft": 1, "verify": 1, "extend": 1}, log)
    got = host.time_rounds({"A": a, "B": b}, reps=3, n=3)
    assert log == ["A"] * 3 + ["B"] * 6 + ["A"] * 6 + ["B"] * 3  # who goes first alternates rep by rep
    _close(got["A"]["draft"], 12, 8, [20, 12, 15])
    _close(got["A"]["verify"], 5, 0, [5, 5, 5])
    _close(got["A"]["extend"], 2, 6, [2, 5, 8])
    # A round is the median of each call's own sum (16, 37, 28 | 21, 21, 61 | 27, 28, 29), not a sum of the
    # phases' numbers (12 + 5 + 2 = 19).
    _close(got["A"]["round"], 21, 7, [28, 21, 28])
    _close(got["B"]["round"], 3, 0, [3, 3, 3])


def test_prefill_time_is_the_least_disturbed_rep_median(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(host, "time", clock)
    a = _Stack("A", clock, {"prefill": [300, 100, 200, 90, 400, 95]})  # rep medians 200, 95
    _close(host.time_prefill({"A": a}, reps=2, n=3)["A"], 95, 105, [200, 95])


@dataclass
class _Shape:
    bs: int = 1
    topk: int = 1
    steps: int = 3
    num_draft_tokens: int = 4
    prompt_len: int = 16
    verify_topk: int = 2


def _case(monkeypatch, max_added_launches=2):
    """run_case over fake stacks: EAGLE3 100 + 40 + 30 us a round, DYNVOCAB 110 + 90 + 30; of which inside ops
    (the profiler's pass, given here) 10 + 5 + 5 and 10 + 20 + 5. DYNVOCAB's verify launches an add and a mul (and
    a view, which launches nothing)."""
    clock, x = _Clock(), torch.zeros(4)
    monkeypatch.setattr(host, "time", clock)
    eagle = _Stack("EAGLE3", clock, {"draft": 100, "verify": 40, "extend": 30, "prefill": 500})
    dyn = _Stack(
        "DYNVOCAB",
        clock,
        {"draft": 110, "verify": 90, "extend": 30, "prefill": 540},
        work={"verify": lambda: (x.add(1), x.mul(2), x.view(2, 2))},
    )
    in_ops = {
        "EAGLE3": {"draft": 10.0, "verify": 5.0, "extend": 5.0, "round": 20.0},
        "DYNVOCAB": {"draft": 10.0, "verify": 20.0, "extend": 5.0, "round": 35.0},
    }
    monkeypatch.setattr(host, "time_in_ops", lambda stacks, reps, n: in_ops)
    H = SimpleNamespace(build=lambda shape: (eagle, dyn), stand_ins=lambda inputs: nullcontext())
    return host.run_case(
        H,
        _Shape(),
        SimpleNamespace(reps=3, rounds=4, prefill_reps=2, target_us=50.0, max_added_launches=max_added_launches),
    )


def test_the_verdict_is_python_outside_the_ops_and_wall_time_is_judged_beside_it(monkeypatch):
    c = _case(monkeypatch)
    assert c["decode"]["EAGLE3"]["round"]["us"] == pytest.approx(170)
    assert c["decode"]["DYNVOCAB"]["round"]["us"] == pytest.approx(230)
    assert c["added_round_us"] == pytest.approx(60)  # wall: over the 50 us target
    assert c["outside_ops_us"]["EAGLE3"]["round"] == pytest.approx(150)
    assert c["outside_ops_us"]["DYNVOCAB"]["round"] == pytest.approx(195)
    assert c["outside_ops_us"]["DYNVOCAB"]["verify"] == pytest.approx(70)
    assert c["added_outside_ops_us"] == pytest.approx(45)  # Python: within it
    assert c["meets_target"] is True and c["meets_target_wall"] is False
    assert c["added_prefill_us"] == pytest.approx(40)
    assert c["ops"]["DYNVOCAB"]["verify"] == {"ops": 2, "views": 1, "by_op": {"add": 1, "mul": 1}}
    assert c["ops"]["EAGLE3"]["verify"]["ops"] == 0 and c["added_ops_per_round"] == 2
    # the gate: the two launches of DYNVOCAB's verify, none added elsewhere, no sync: met at 2, missed at 1
    assert c["eager"]["DYNVOCAB"]["verify"]["by_op"] == {"add": 1, "mul": 1}
    assert c["added_launches_per_round"] == 2 and c["added_syncs_per_round"] == 0 and c["meets_gate"] is True


def test_one_launch_past_the_bound_misses_the_gate(monkeypatch):
    c = _case(monkeypatch, max_added_launches=1)
    assert c["added_launches_per_round"] == 2 and c["meets_gate"] is False


def test_markdown_shows_each_case_and_the_verdicts(monkeypatch):
    result = {
        "device": {"name": "cpu"},
        "versions": {"python": "3.11", "torch": "2.x", "sglang": SGLANG_VERSION, "git": "abc"},
        "command": "sglang-specvocab bench host --quick",
        "method": {"timer": "t", "ops": "o"},
        "target_us": 50.0,
        "max_added_launches": 2,
        "cases": [_case(monkeypatch)],
        "prefill_topk": {"tokens": 512, "d": 8, "vocab": 100, "k": 3, "rows": []},
    }
    md = host.markdown(result).splitlines()
    # bs, topk, EAGLE3 | DYNVOCAB per phase and round, added, spread, ops added, wall verdict, target top-k
    assert "| 1 | 1 | 100 | 110 | 40 | 90 | 30 | 30 | 170 | 230 | 60 | 0 | 2 | MISSED | 0 |" in md
    assert "| 1 | 1 | 20 | 35 | 150 | 195 | 45 | 2 | met |" in md  # outside ops: the verdict
    assert "| 1 | 16 | 500 | 540 | 40 | 0 |" in md  # prefill: bs 1, 16 prompt tokens
    # launches (captured) per phase, EAGLE3 | DYNVOCAB: draft, verify, extend; added; syncs; gate; prefill
    assert "| 1 | 1 | 0 | 0 | 0 | 2 | 0 | 0 | 2 | 0 | met | 0 | 0 |" in md
    assert (
        "Verdict (gate, launches and syncs): every case meets it. Information: every case meets the time target "
        "outside ops; in wall time 1 case(s) miss it." in md
    )

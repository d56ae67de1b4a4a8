"""``bench kernels``' verdicts on hand-made records, the lease preset's case order, the whole-file saves, a SIGTERM
mid-run, the revision's provenance and EAGLE3's step as the bench times it (CPU)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from sglang_specvocab.copies.upstream import SGLANG_VERSION
from sglang_specvocab.tools.bench import fit as bench_fit
from sglang_specvocab.tools.bench import heads as hb
from sglang_specvocab.tools.bench import kernels as bench
from sglang_specvocab.tools.bench import kernels_report as report
from sglang_specvocab.tools.bench import kernels_sweep as sweep
from sglang_specvocab.tools.bench import kernels_targets as kt
from sglang_specvocab.tools.cli import parser

REPO = Path(__file__).resolve().parents[1]
CONFIG = {"target_d": 4096, "target_head_width": 3072, "target_head_batch": 1, "target_rows": 10,
          "target_window_batch": 64, "head_kernel": "cuda"}  # fmt: skip


def rec(op, us, kind="d2t", rows=1, batch=1, mode=None, auto="per-request", d=4096, V=128256, W=3072, **extra):
    """One head-op record as ``bench kernels`` writes it (status ok unless ``us`` is None: pending)."""
    r = {"op": op, "backend": "cuda" if op == "head" else "torch", "W": W, "d": d, "rows": rows, "batch": batch}
    r.update(vocab=V, kind=kind, mode=mode, auto_mode=auto, status="ok" if us is not None else "pending")
    if us is not None:
        r["median_us"] = us
    if op == "head":
        r["check"] = "ok"
    r.update(extra)
    return r


def targets(records, pending=(), peak=3.35e12):
    """The targets by name: speed, ideal, rows, auto (the head step's) and window:BACKEND."""
    result = {"config": CONFIG, "records": records, "bandwidth": {"peak_Bps": peak}}
    out = kt.evaluate_targets(result, list(pending))
    names = ["speed", "ideal", "rows", "auto"] + [f"window:{t['backend']}" for t in out[4:]]
    return dict(zip(names, out, strict=True))


def headline(full_us=10.0, d2t_us=10.0, eagle_d2t=96.0, eagle_full=400.0, **extra):
    """The headline point (d 4096, W 3072, batch 1, rows 1) of both kinds: EAGLE3's steps and our per-request head."""
    return [
        rec("stock", eagle_d2t, "d2t"),
        rec("head", d2t_us, "d2t", mode="per-request", ideal_us_peak=7.5, **extra),
        rec("stock", eagle_full, "full"),
        rec("head", full_us, "full", mode="per-request", ideal_us_peak=7.5),
    ]


# -- the verdicts ---------------------------------------------------------------------------------------------------


def test_auto_picking_stock_takes_eagle3s_time_not_our_stock_plan():
    """Where auto picks stock the server runs EAGLE3's path: the head step's time is EAGLE3's op, even when our
    head's stock plan was timed too and is slower (the false "auto slower than stock" of d2t at bs 11-17)."""
    recs = [
        rec("stock", 100.0, "d2t", batch=12, auto="stock"),
        rec("head", 130.0, "d2t", batch=12, mode="stock", auto="stock"),  # our stock plan: not what the server runs
        rec("head", 120.0, "d2t", batch=12, mode="per-request", auto="stock"),
    ]
    e = kt.head_table(recs)[(4096, 128256, "d2t", 3072, 1, 12)]
    assert e["step"]["op"] == "stock" and e["auto"] == 100.0 and e["ratio"] == 1.0
    t = targets(recs)["auto"]
    assert t["met"] is True and t["worst"] == 1.0 and t["cases"] == 1
    assert t["worst_case"].startswith("d 4096, V 128256, d2t, W 3072, rows 1, batch 12 (EAGLE3's step)")
    # the same point with auto on per-request: our plan's time, slower than EAGLE3's -> not met, named
    recs = [{**r, "auto_mode": "per-request"} for r in recs]
    t = targets(recs)["auto"]
    assert t["met"] is False and t["worst"] == pytest.approx(1.2) and "(per-request)" in t["worst_case"]
    md = "\n".join(report.heads_markdown({"config": CONFIG, "records": [{**recs[0], "auto_mode": "stock"}]}))
    assert "stock 100.0*" in md and "EAGLE3's own code path" in md


def test_headline_speedup_and_ideal_targets_name_their_worst_case():
    t = targets(headline(full_us=12.0, d2t_us=10.0))
    speed, ideal = t["speed"], t["ideal"]
    assert speed["target"].startswith(
        "head step at least 8x faster than EAGLE3's d2t-32k step (batch 1, d 4096, W 3072"
    )
    assert speed["cases"] == 2 and speed["met"] is True and speed["worst"] == pytest.approx(8.0)  # 96 / 12
    assert speed["worst_case"].startswith("d 4096, V 128256, full, W 3072, rows 1, batch 1 (per-request)")
    assert "vs EAGLE3 d2t 96.0 us" in speed["worst_case"]  # every kind against EAGLE3's d2t step
    assert ideal["met"] is True and ideal["worst"] == pytest.approx(12.0 / 10.0)  # 12 / (7.5 + 2.5)
    assert "full" in ideal["worst_case"] and ideal["unit"] == "x (ideal + allowance)"
    # rows 10 at the headline is a case of both: slower there, so both name it
    recs = headline() + [rec("stock", 98.0, "d2t", rows=10), rec("head", 16.0, "d2t", rows=10, mode="per-request",
                                                                   ideal_us_peak=7.5)]  # fmt: skip
    t = targets(recs)
    speed, ideal = t["speed"], t["ideal"]
    assert speed["met"] is False and speed["worst"] == pytest.approx(98.0 / 16.0) and "rows 10" in speed["worst_case"]
    assert "vs EAGLE3 d2t 98.0 us" in speed["worst_case"]  # EAGLE3's d2t step of the same rows
    assert ideal["met"] is False and ideal["worst"] == pytest.approx(1.6) and "rows 10" in ideal["worst_case"]
    # points off the headline (another batch, W or d) are not cases of these two
    off = [rec("stock", 96.0, "d2t", batch=8), rec("head", 90.0, "d2t", batch=8, mode="per-request", ideal_us_peak=1)]
    assert targets(headline() + off)["speed"]["cases"] == 2


def test_rows_target_compares_rows_10_with_rows_1_of_the_same_point():
    recs = headline(d2t_us=10.0, full_us=10.0) + [
        rec("head", 12.0, "d2t", rows=10, mode="per-request"),
        rec("head", 14.0, "full", rows=10, mode="per-request"),
        rec("head", 50.0, "full", rows=10, batch=8, mode="per-request"),  # no rows-1 partner: not a case
    ]
    t = targets(recs)["rows"]
    assert t["target"].startswith("rows 10 at most 1.3x rows 1")
    assert t["cases"] == 2 and t["worst"] == pytest.approx(1.4) and t["met"] is False
    assert t["worst_case"].startswith("d 4096, V 128256, full, W 3072, rows 10, batch 1")


def test_a_failed_check_meets_nothing_and_is_the_worst_case():
    recs = headline(check="FAILED (> 0.005)")  # the d2t head is fast, but wrong
    t = targets(recs)
    for key in ("speed", "ideal", "auto"):
        assert t[key]["met"] is False and t[key]["failed_checks"] == 1, t[key]
        assert "d2t" in t[key]["worst_case"] and t[key]["worst_case"].endswith("output check FAILED")
    md = "\n".join(report.heads_markdown({"config": CONFIG, "records": recs}))
    assert "| 96.0 | 10.0 WRONG |" in md and "per-request 10.0 WRONG |" in md  # the head table
    assert "| 4096 | 128256 | 3072 | 1 | 0.10 (per-request, rows 1) WRONG | 0.03 (per-request, rows 1) | no |" in md


def test_met_is_none_only_without_a_measured_case_and_pending_cases_mark_partial():
    t = targets([])
    assert all(v["met"] is None and v["cases"] == 0 and v["worst_case"] is None for v in t.values())
    # the headline's full kind not run yet: judged on the d2t case, partial, the missing case counted
    recs = headline()
    pending = [recs.pop(3) | {"status": "pending", "median_us": None}]
    t = targets(recs, pending)["speed"]
    assert t["cases"] == 1 and t["met"] is True and t["not_measured"] == 1 and t["partial"] is True
    # a case that was skipped (memory, error) is not measured but not pending
    skipped = [{**pending[0], "status": "skipped", "reason": "out of memory"}]
    t = targets(recs + skipped)["speed"]
    assert t["not_measured"] == 1 and t["partial"] is False
    # nothing measured but something pending: no data, partial
    t = targets([], [r | {"status": "pending", "median_us": None} for r in headline()])["speed"]
    assert t["met"] is None and t["cases"] == 0 and t["partial"] is True and t["not_measured"] == 2
    # no peak bandwidth: the ideal target has no measured case
    ideal = targets([{**r, "ideal_us_peak": None} for r in headline()], peak=None)["ideal"]
    assert ideal["met"] is None and ideal["not_measured"] == 2


def test_window_target_per_backend_with_its_worst_case():
    w = {"op": "window_round", "W": 3072, "d": None, "rows": None, "block": 19, "status": "ok"}
    recs = [{**w, "backend": "cuda", "batch": 64, "median_us": 4.7}, {**w, "backend": "torch", "batch": 64,
            "median_us": 31.0}, {**w, "backend": "cuda", "batch": 8, "median_us": 99.0}]  # fmt: skip
    win = [t for t in kt.evaluate_targets({"config": CONFIG, "records": recs}) if t["op"] == "window_round"]
    assert [(t["backend"], t["met"], t["worst"]) for t in win] == [("cuda", True, 4.7), ("torch", False, 31.0)]
    assert win[0]["worst_case"] == "cuda, batch 64, capacity 3072, block 19: 4.70 us"
    assert win[0]["target"] == "window round at most 5 us at batch 64"  # issue 38: the whole round, one launch


# -- the lease preset -------------------------------------------------------------------------------------------------


def lease_args(monkeypatch, plan="per-request"):
    monkeypatch.setattr(sweep, "auto_plan_of", lambda args, W, d, r, b, V, kind: plan(W, b, kind) if callable(plan)
                        else plan)  # fmt: skip
    args = parser().parse_args(["bench", "kernels", "--lease", "--device", "cpu", "--backends", "cuda,triton"])
    args = bench.resolve(args)
    return args


def test_lease_preset_runs_the_headline_first_then_gemma_then_the_window(monkeypatch):
    args = lease_args(monkeypatch)
    assert args.preset == "lease" and args.head_kernel
    lead = sweep.lead_cases(args)
    heads = [c for c in lead if c.op in ("head", "stock")]
    assert len(heads) == 128 and len(lead) == 129  # 64 points x (EAGLE3, per-request) + the window at batch 64
    # the headline point first: d 4096, W 3072, batch 1, both kinds, rows 1 then 10, EAGLE3's step before ours
    first = [(c.op, c.kind, c.rows) for c in lead[:8]]
    assert first == [(op, k, r) for r in (1, 10) for k in ("d2t", "full") for op in ("stock", "head")]
    assert all((c.d, c.vocab, c.W, c.batch) == (4096, 128256, 3072, 1) for c in lead[:8])
    # then Gemma-3 270M's shape, all of it, W 3072 batch 1 first (with rows 10)
    gemma = [c for c in heads if c.d == 640]
    assert lead[8] == gemma[0] and (gemma[0].W, gemma[0].batch, gemma[0].vocab) == (3072, 1, 262144)
    assert {(c.W, c.batch, c.kind) for c in gemma} == {
        (W, b, k) for W in (1024, 2048, 3072) for b in (1, 8, 12, 16, 32) for k in ("d2t", "full")
    }
    assert lead[8 : 8 + len(gemma)] == gemma and {c.rows for c in gemma if (c.W, c.batch) != (3072, 1)} == {1}
    # then the rest of d 4096, then the window round at batch 64 (CUDA only: no Triton window ops)
    assert {c.d for c in heads[8 + len(gemma) :]} == {4096}
    assert [(c.op, c.batch, c.backend) for c in lead[-1:]] == [("window_round", 64, "cuda")]
    # every point has EAGLE3's step of both kinds
    points = {(c.d, c.W, c.rows, c.batch) for c in heads}
    assert len(points) == 32 and all(
        {(c.kind) for c in heads if c.op == "stock" and (c.d, c.W, c.rows, c.batch) == p} == {"d2t", "full"}
        for p in points
    )
    # the quick sweep follows, without repeating a case
    cases = bench.expand(args)
    assert cases[: len(lead)] == lead and len(set(cases)) == len(cases)
    assert {c.op for c in cases[len(lead) :]} >= {"indexed", "dense_static", "head", "stock", "window_round"}
    assert bench.weight_rows(args, 640) == 262144 and bench.weight_rows(args, 4096) == 128256


def test_lease_preset_times_auto_s_union_plan_too_and_no_head_where_auto_picks_stock(monkeypatch):
    plan = lambda W, b, kind: "stock" if b >= 12 and kind == "d2t" else "union-indexed" if b == 8 else "per-request"
    lead = sweep.lead_cases(lease_args(monkeypatch, plan))
    heads = [c for c in lead if c.op == "head"]
    assert {c.mode for c in heads if c.batch >= 12 and c.kind == "d2t"} == {"per-request"}  # EAGLE3's step is auto's
    assert {c.mode for c in heads if c.batch == 8} == {"union-indexed", "per-request"}
    assert not any(c.mode == "stock" for c in heads)


# -- saves, SIGTERM, provenance ---------------------------------------------------------------------------------------


def test_write_atomic_never_leaves_a_truncated_file(tmp_path, monkeypatch):
    out = tmp_path / "k.json"
    report.write_atomic(out, '{"a": 1}\n')
    assert json.loads(out.read_text()) == {"a": 1}

    def killed(src, dst):  # the process dies between the write and the rename
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        report.write_atomic(out, '{"a": 2, "b": "' + "x" * 100000 + '"}\n')
    assert json.loads(out.read_text()) == {"a": 1} and sorted(p.name for p in tmp_path.iterdir()) == ["k.json"]


def test_write_whole_keeps_the_suffix_a_normal_mode_and_the_old_file_when_nothing_was_written(tmp_path):
    """cache.write_whole, under every report, cache entry and token table: the writer sees a temporary name with the
    path's suffix (matplotlib picks the format from it), the file gets a normal mode, a writer that wrote nothing
    (returns False) leaves the old file, and no temporary file stays."""
    from sglang_specvocab.cache import write_whole

    out = tmp_path / "plot.png"
    out.write_bytes(b"old")
    seen = []
    assert write_whole(out, lambda p: seen.append(p.name) or False) is False
    assert out.read_bytes() == b"old" and seen[0].startswith(".plot.png.") and seen[0].endswith(".tmp.png")
    assert write_whole(out, lambda p: p.write_bytes(b"new")) == 3
    umask = os.umask(0)
    os.umask(umask)
    assert out.read_bytes() == b"new" and out.stat().st_mode & 0o777 == 0o666 & ~umask
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plot.png"]


def test_sigterm_ends_the_run_with_the_partial_results_saved(tmp_path):
    out = tmp_path / "kernels-cpu.json"
    argv = [sys.executable, "-m", "sglang_specvocab", "bench", "kernels", "--device", "cpu", "--tiny", "--threads", "1"]
    argv += ["--iters", "200", "--max-ms", "400", "--no-progress", "--no-plot", "--peak-bw", "2e10", "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "SV_GIT": "abc1234-dirty"}
    proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while not out.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert proc.poll() is None, "the sweep ended before its first save"
    first = json.loads(out.read_text())  # a save during the run: whole, partial, with the targets
    assert first["partial"] is True and first["progress"]["not_run"] > 0 and len(first["targets"]) >= 5
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 143, stderr
    res = json.loads(out.read_text())
    assert res["partial"] is True and res["progress"]["why"] == "terminated (SIGTERM)"
    not_run = [r for r in res["records"] if r.get("not_run")]
    assert not_run and res["progress"]["not_run"] == len(not_run) and len(res["records"]) == res["progress"]["cases"]
    assert res["versions"]["git"] == "abc1234-dirty" and res["versions"]["git_source"] == "SV_GIT"
    md = out.with_suffix(".md").read_text()
    assert "**partial**" in md and "terminated (SIGTERM)" in md and "## Targets" in md
    assert "terminated (SIGTERM)" in stderr


def test_revision_from_option_env_or_git(monkeypatch, tmp_path):
    monkeypatch.setenv("SV_GIT", "b3abc6d-dirty")
    assert bench.git_revision() == ("b3abc6d-dirty", "SV_GIT")
    assert bench.git_revision("deadbee") == ("deadbee", "--git")
    assert bench_fit._git() == "b3abc6d-dirty"
    assert bench.environment(torch.device("cpu"))["versions"]["git"] == "b3abc6d-dirty"
    monkeypatch.delenv("SV_GIT")
    monkeypatch.setattr(bench, "ROOT", tmp_path)  # a checkout without .git, as on the GPU machine
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    rev, source = bench.git_revision()
    assert rev is None and source.startswith("unknown")
    args = parser().parse_args(["bench", "kernels", "--git", "deadbee", "--tiny"])
    assert args.git == "deadbee"


def test_environment_names_a_gpu_by_get_device_name(monkeypatch):
    class Props:
        name, major, minor, multi_processor_count, total_memory, L2_cache_size = "props", 9, 0, 132, 80 << 30, 50 << 20

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: Props)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(bench, "_run_text", lambda cmd: None)
    env = bench.environment(torch.device("cuda", 0), git="x")
    assert env["device"]["name"] == "NVIDIA H100 80GB HBM3" and env["versions"]["git"] == "x"


# -- EAGLE3's step --------------------------------------------------------------------------------------------------


def test_eagle3_stock_is_sglangs_draft_step_on_a_cpu():
    g = torch.Generator().manual_seed(0)
    hidden, weight = torch.randn(3, 16, generator=g), torch.randn(40, 16, generator=g)
    hot = torch.randperm(1000, generator=g)[:40]
    logits = (hidden @ weight.T).float()
    # topk 1: the argmax (no softmax), probability 1, positions advanced, then the d2t map
    pos = torch.zeros(3, dtype=torch.int64)
    p, i = hb.eagle3_stock(hidden, weight, 1, hot, pos)
    assert torch.equal(i, hot[logits.argmax(-1, keepdim=True)]) and torch.equal(p, torch.ones(3, 1))
    assert pos.tolist() == [1, 1, 1]
    # topk > 1: softmax then torch.topk (fast_topk), the full draft unmapped
    p, i = hb.eagle3_stock(hidden, weight, 4, None)
    ref = torch.softmax(logits, -1).topk(4, -1)
    assert torch.equal(i, ref.indices) and torch.allclose(p, ref.values)


def test_the_topk1_copy_is_sglangs_kernel():
    """The copied Triton kernels are the pinned SGLang's (where SGLang is installed), and the interpreted copy is the
    argmax (where Triton's interpreter runs)."""
    import ast
    import importlib.util

    from helpers import interpreter_broken

    def trees(text: str) -> dict[str, str]:
        out = {}
        for node in ast.parse(text).body:
            name = getattr(node, "name", None) or getattr(getattr(node, "targets", [None])[0], "id", None)
            out[name] = ast.dump(node)
        return out

    mine = trees((REPO / "sglang_specvocab" / "copies" / "from-sglang" / "eagle3_topk1.py").read_text())
    names = ["_DRAFT_TOPK1_BLOCK", "_draft_topk1_partial_argmax_kernel", "_draft_topk1_finalize_kernel"]
    names.append("draft_topk1_postprocess")
    spec = importlib.util.find_spec("sglang")
    if spec is not None and spec.submodule_search_locations:
        path = Path(next(iter(spec.submodule_search_locations)), "kernels/ops/speculative/topk1.py")
        theirs = trees(path.read_text())
        assert [mine[n] == theirs[n] for n in names] == [True] * len(names)
    if interpreter_broken():
        pytest.skip(interpreter_broken())
    code = (
        "import torch; from sglang_specvocab.copies import load_copy\n"
        f"f = load_copy('eagle3_topk1', {SGLANG_VERSION!r}).draft_topk1_postprocess\n"
        "x = torch.randn(3, 20000, generator=torch.Generator().manual_seed(1)); pos = torch.zeros(3, dtype=torch.long)\n"
        "chain = torch.zeros(3, 2, dtype=torch.long); p, i = f(x, pos, chain, 1)\n"
        "assert torch.equal(i.view(-1), x.argmax(1)) and torch.equal(chain[:, 1], i.view(-1)), (i, x.argmax(1))\n"
        "assert pos.tolist() == [1, 1, 1] and p.eq(1).all()\n"
    )
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr


def test_a_small_d2t_head_rotates_over_weight_slices_so_replays_read_hbm():
    """EAGLE3's d2t step and our d2t head read another slice of the weight per input set where the head is smaller
    than 3x the L2 (as the other ops rotate their inputs), so neither is timed from L2."""
    args = parser().parse_args(["bench", "kernels", "--tiny", "--device", "cpu", "--ops", "head,stock"])
    args = bench.resolve(args)
    timer = bench.make_timer(torch.device("cpu"), 2, 0, 10.0, graph=False)
    b = bench.Bench(args, torch.device("cpu"), torch.bfloat16, timer, 200_000, torch.Generator().manual_seed(0))
    stock = bench.Case("stock", "torch", 48, 32, 1, 1, 2048, kind="d2t", d2t_rows=512)
    calls, sets, _ = b.fns(stock)
    assert sets == len(calls) == 12 and bench.weight_rows(args, 32) == 2048  # 32 KiB head, 200 KB of "L2": the most
    heads = b.data[stock.data_key]["heads"]
    assert len({h.data_ptr() for h in heads}) == 4  # 2048 // 512 slices, in turn
    p, i = calls[1]()
    assert p.shape == i.shape == (1, 1)
    ours = bench.Case("head", "torch", 48, 32, 1, 1, 2048, mode="per-request", kind="d2t", d2t_rows=512)
    calls, sets, check = b.fns(ours)
    assert len(calls) == sets and check() < 1e-2
    assert len({h.weight.data_ptr() for h in b.data[ours.data_key]["last_heads"]}) == min(sets, 4)

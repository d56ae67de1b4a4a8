"""``sglang-specvocab bench kernels`` on the CPU: the sweep, the bandwidth math and the report files."""

import json
import math

import pytest
import torch

from sglang_specvocab import ops
from sglang_specvocab.tools.bench import kernels as bench
from sglang_specvocab.tools.bench import kernels_report
from sglang_specvocab.tools.cli import main, parser


def parse(argv):
    """The command's arguments, resolved as its run resolves them (presets, device, backends)."""
    args = parser().parse_args(["bench", "kernels", *argv])
    args = bench.resolve(args)
    return args


# -- pure parts ------------------------------------------------------------------------------


def test_full_sweep_expands_to_the_issue_grid():
    args = parse(["--device", "cpu", "--backends", "cuda,triton"])
    cases = bench.expand(args)
    by_op = {}
    for c in cases:
        by_op.setdefault(c.op, []).append(c)
    grid = 8 * 4 * 3 * 4  # W x d x rows x batch
    assert len(by_op["indexed"]) == len(by_op["packed"]) == 2 * grid
    assert len(by_op["index_select_matmul"]) == grid
    assert len(by_op["dense_static"]) == 4 * 3 * 4 and {c.W for c in by_op["dense_static"]} == {32768}
    assert len(by_op["dense_full"]) == 3 * 4 * 3 * 4 and {c.W for c in by_op["dense_full"]} == {128256, 151936, 262144}
    # no Triton window update (ops.backend_without_triton): not timed, not recorded as an error
    assert [(c.batch, c.backend) for c in by_op["window_round"]] == [(b, "cuda") for b in (1, 8, 64)]
    assert {c.W for c in by_op["window_round"]} == {3072} and {c.block for c in by_op["window_round"]} == {19}
    assert {(c.W, c.d, c.rows, c.batch) for c in by_op["indexed"]} == {
        (W, d, r, b)
        for W in (512, 1024, 2048, 3072, 4096, 8192, 16384, 32768)
        for d in (640, 2048, 4096, 5120)
        for r in (1, 4, 10)
        for b in (1, 8, 32, 64)
    }
    # the target d runs first (a run cut short still has the headline), each d once
    ds = [c.d for c in cases if c.d is not None and c.op not in bench.HEAD_OPS]
    assert ds[0] == 4096 and [d for i, d in enumerate(ds) if i == 0 or ds[i - 1] != d] == [4096, 640, 2048, 5120]
    # the draft-step heads: the issue's grid, every plan and the stock step per shape, Gemma-4 MTP for full heads
    head_shapes = {(d, V, kind, r, b) for d in (640, 4096, 5120) for V in (128256, 151936, 262144)
                   for kind in ("d2t", "full") for r in (1, 4, 10) for b in (1, 8, 32, 64, 128)}  # fmt: skip
    assert {(c.d, c.vocab, c.kind, c.rows, c.batch) for c in by_op["head"]} == head_shapes
    assert len(by_op["head"]) == 4 * len(head_shapes) and len(by_op["stock"]) == len(head_shapes)
    assert len(by_op["gemma4_mtp"]) == len(head_shapes) // 2 and {c.kind for c in by_op["gemma4_mtp"]} == {"full"}
    assert {c.W for c in by_op["head"]} == {3072} and by_op["head"][0].d == 4096
    assert len(set(cases)) == len(cases)
    assert bench.weight_rows(args) == 262144
    assert bench.weight_rows(args, 2048) == 262144  # dense_full's V
    assert not any(c.op in bench.HEAD_OPS and c.d == 2048 for c in cases)


def test_quick_and_overrides():
    args = parse(["--quick", "--device", "cpu", "--ops", "indexed,window_round", "--backends", "triton"])
    cases = bench.expand(args)
    assert {c.op for c in cases} == {"indexed"}  # Triton has no window update
    assert {(c.W, c.d) for c in cases if c.op == "indexed"} == {(2048, 4096), (3072, 4096)}
    assert len([c for c in cases if c.op == "indexed"]) == 2 * 3 * 4
    args = parse(["--tiny", "--device", "cpu", "--widths", "16,32", "--rows", "3"])
    assert args.widths == [16, 32] and args.rows == [3] and args.dims == [32]
    assert main(["bench", "kernels", "--ops", "nope"]) == 2


def test_bandwidth_math_and_peaks():
    f = kernels_report.bandwidth_fields(16_777_216, 10.0, 3.35e12, 3.0e12)
    assert f["gbps"] == pytest.approx(16_777_216 / 10e-6 / 1e9)
    assert f["ideal_us_peak"] == pytest.approx(16_777_216 / 3.35e12 * 1e6)
    assert f["frac_ideal"] == pytest.approx((16_777_216 / 3.35e12) / 10e-6)
    assert f["frac_ideal_copy"] == pytest.approx((16_777_216 / 3.0e12) / 10e-6)
    assert kernels_report.bandwidth_fields(100, 1.0, None, 1e9)["frac_ideal"] is None
    c = bench.Case("indexed", "cuda", 2048, 4096, 4, 8, 128256)
    assert bench.case_bytes(c, 2) == 8 * 2048 * 4096 * 2 and c.M == 32
    assert bench.case_bytes(bench.Case("dense_full", "torch", 128256, 4096, 4, 8, 128256), 2) == 128256 * 4096 * 2
    assert kernels_report.default_peak("NVIDIA H100 80GB HBM3")[0] == 3.35e12
    assert kernels_report.default_peak("NVIDIA H200")[0] == 4.8e12
    assert kernels_report.default_peak("NVIDIA H100 PCIe")[0] == 2.0e12
    assert kernels_report.default_peak("Some GPU")[0] is None
    assert bench.cold_sets(16 << 20, 50 << 20, hot=False) == 10  # 16 MB calls, 50 MB L2: rotate
    assert bench.cold_sets(1 << 30, 50 << 20, hot=False) == 1
    assert bench.cold_sets(16 << 20, 50 << 20, hot=True) == 1


def test_random_sets_are_sorted_distinct():
    ids = bench.random_sets(5, 40, 100, torch.Generator().manual_seed(0), torch.device("cpu"))
    assert ids.dtype == torch.int32 and ids.shape == (5, 40)
    for row in ids.tolist():
        assert row == sorted(set(row)) and 0 <= row[0] and row[-1] < 100


# -- the whole command on tiny shapes -----------------------------------------------------------


def run(tmp_path, *extra):
    out = tmp_path / "kernels-cpu.json"
    argv = ["--device", "cpu", "--tiny", "--iters", "4", "--warmup", "1", "--threads", "1", "--no-progress"]
    argv += ["--peak-bw", "2e10", "--out", str(out), *extra]
    assert main(["bench", "kernels", *argv]) == 0
    return out, json.loads(out.read_text())


def test_cpu_run_writes_json_md_and_plot(tmp_path):
    out, res = run(tmp_path, "--backends", "torch,triton")
    assert res["schema"] == bench.SCHEMA and res["cpu"] is True
    for key in ("device", "versions", "command", "bandwidth", "records", "targets", "timing", "config"):
        assert key in res
    assert {"name", "driver", "type"} <= set(res["device"])
    assert {"torch", "cuda", "triton", "python"} <= set(res["versions"])
    assert res["command"].startswith("sglang-specvocab bench kernels ") and "--tiny" in res["command"]
    bw = res["bandwidth"]
    assert bw["peak_Bps"] == 2e10 and bw["peak_source"] == "--peak-bw"
    assert bw["copy_Bps"] > 0 and math.isfinite(bw["copy_Bps"]) and bw["copy_bytes"] == 2 * 8 * 2**20

    recs = res["records"]
    keys = [(r["op"], r["backend"], r["W"], r["d"], r["rows"], r["batch"], r.get("kind"), r.get("mode")) for r in recs]
    assert len(keys) == len(set(keys))
    ok = [r for r in recs if r["status"] == "ok"]
    assert {r["op"] for r in ok} == set(kernels_report.OPS)
    for r in ok:
        for k in ("median_us", "p10_us", "p90_us", "gbps", "bytes"):
            assert r[k] > 0 and math.isfinite(r[k]), (k, r)
        assert r["p10_us"] <= r["median_us"] <= r["p90_us"]
        if r["op"] == "window_round":
            assert r["frac_ideal"] is None and r["W"] == 64 and r["block"] == 10
            continue
        if r["op"] in bench.HEAD_OPS:  # their bytes: test_head_sweep_on_a_tiny_grid
            continue
        if r["op"] in bench.TOPK_OPS:  # the fp32 logits read once; no bandwidth ideal (sort-bound)
            assert r["bytes"] == r["rows"] * r["W"] * 4 and r["frac_ideal"] is None
            continue
        elem = 2  # bf16
        nbytes = r["W"] * r["d"] * elem * (1 if r["op"].startswith("dense") else r["batch"])
        assert r["bytes"] == nbytes
        t = r["median_us"] * 1e-6
        assert r["gbps"] == pytest.approx(nbytes / t / 1e9)
        assert r["ideal_us_peak"] == pytest.approx(nbytes / 2e10 * 1e6)
        assert r["frac_ideal"] == pytest.approx((nbytes / 2e10) / t)
        assert r["frac_ideal_copy"] == pytest.approx((nbytes / bw["copy_Bps"]) / t)
    base = {(r["W"], r["d"], r["rows"], r["batch"]): r["median_us"] for r in ok if r["op"] == "index_select_matmul"}
    for r in ok:
        if r["op"] in ("indexed", "packed"):
            assert r["backend"] == "torch" and r["check"] == "ok" and r["rel_err"] < 1e-3
            assert r["speedup_vs_index_select"] == pytest.approx(
                base[(r["W"], r["d"], r["rows"], r["batch"])] / r["median_us"]
            )
            assert r["speedup_vs_dense_static"] > 0

    # the unavailable backend: one skipped record per case, with the reason
    tri = [r for r in recs if r["backend"] == "triton" and r["op"] not in bench.HEAD_OPS]
    assert tri and all(r["status"] == "skipped" for r in tri)
    assert all("triton" in r["reason"] and "unavailable" in r["reason"] for r in tri)
    assert {r["op"] for r in tri} == {"indexed", "packed"}  # no Triton window update: not even a skipped case

    # the five targets, each judged (the tiny grid has every case), each naming its worst case
    assert len(res["targets"]) == 5 and res["partial"] is False
    assert res["progress"] == {"cases": len(recs), "done": len(recs), "not_run": 0, "why": None}
    for t in res["targets"]:
        assert t["met"] in (True, False) and t["cases"] >= 1 and t["worst_case"], t
        assert t["partial"] is False and t["not_measured"] == 0

    md = out.with_suffix(".md").read_text()
    assert "CPU" in md and "## Headline: W 64, 128, d 32" in md and "## Targets" in md
    assert "| 64 | 1 | 1 |" in md and "indexed torch" in md and "## Window round" in md
    assert "backend 'triton' unavailable" in md
    assert "## Draft top-k" in md and "| 300 | 3 |" in md
    topk = {(r["op"], r["backend"]) for r in ok if r["op"] in bench.TOPK_OPS}
    assert topk == {("topk", "torch"), ("topk_stock", "torch")}  # no Triton top-k: not even a skipped case
    if res.get("plot"):
        assert (tmp_path / res["plot"]).stat().st_size > 0


def test_memory_cap_and_missing_api_are_recorded(tmp_path, monkeypatch):
    out, res = run(tmp_path, "--ops", "packed,dense_full", "--backends", "torch", "--max-mem-gb", "1e-6", "--no-plot")
    recs = res["records"]
    assert recs and all(r["status"] == "skipped" for r in recs)
    dense = [r for r in recs if r["op"] == "dense_full"]
    assert dense and all("--max-mem-gb" in r["reason"] for r in dense)
    # without the ops API every one of our cases says why, and the run still completes
    monkeypatch.delattr(ops, "available_backends", raising=False)
    out, res = run(tmp_path, "--ops", "indexed,window_round", "--backends", "torch", "--no-plot")
    assert all(r["status"] == "skipped" and "available_backends" in r["reason"] for r in res["records"])
    assert "no measured headline case" in out.with_suffix(".md").read_text()


def test_time_budget_records_the_rest_as_skipped(tmp_path):
    out, res = run(
        tmp_path, "--ops", "indexed,dense_static", "--backends", "torch", "--time-budget-s", "0", "--no-plot"
    )
    assert res["records"] and all("time budget" in r["reason"] for r in res["records"])
    assert "time budget reached" in out.with_suffix(".md").read_text()


def test_head_sweep_on_a_tiny_grid(tmp_path):
    """The draft-step heads: every plan, the EAGLE3 stock step and the Gemma-4 MTP head on the same inputs, auto's
    plan recorded, the verdict table, the head targets, the plot; --fit writes the cost model's constants."""
    from sglang_specvocab import headcost
    from sglang_specvocab.tools.bench import fit as bench_fit

    ops_ = "head,stock,gemma4_mtp,indexed,dense_static,dense_full,topk"
    out, res = run(
        tmp_path,
        "--ops",
        ops_,
        "--backends",
        "cuda",
        "--head-kernel",
        "cuda",
        "--fit",
        "--rows",
        "1,2",
        "--widths",
        "64",
    )
    heads = [r for r in res["records"] if r["op"] in bench.HEAD_OPS]
    assert heads and all(r["status"] == "ok" for r in heads)
    shapes = {(r["d"], r["vocab"], r["kind"], r["rows"], r["batch"]) for r in heads}
    assert shapes == {(32, 2048, k, n, b) for k in ("d2t", "full") for n in (1, 2) for b in (1, 3)}
    for shape in shapes:
        mine = [r for r in heads if (r["d"], r["vocab"], r["kind"], r["rows"], r["batch"]) == shape]
        plans = sorted(r["mode"] for r in mine if r["op"] == "head")
        assert plans == sorted(headcost.MODES)
        assert [r["op"] for r in mine].count("stock") == 1
        assert [r["op"] for r in mine].count("gemma4_mtp") == (shape[2] == "full")
        assert len({r["auto_mode"] for r in mine}) == 1 and mine[0]["auto_mode"] in headcost.MODES
        for r in mine:
            assert r["H"] == (512 if shape[2] == "d2t" else 2048) and r["C"] == min(16 * 48, r["H"])
            if r["op"] == "head":
                assert r["backend"] == "cuda" and r["check"] == "ok", r
                if r["mode"].startswith("union"):
                    assert 48 <= r["union"] <= min(r["pool"], 48 * shape[4])
    md = out.with_suffix(".md").read_text()
    assert "## Draft-step heads" in md and "## Verdict: the head step's time over EAGLE3's step" in md
    verdict = md.split("## Verdict")[1]
    assert "| 32 | 2048 | 48 | 1 |" in verdict and "| 32 | 2048 | 48 | 3 |" in verdict
    assert md.index("## Targets") < md.index("## Headline")  # the verdicts first
    targets = {t["target"].split(" (")[0]: t for t in res["targets"] if t["op"] == "head"}
    assert len(targets) == 4 and all(t["cases"] > 0 and t["met"] in (True, False) for t in targets.values())
    assert all(t["worst_case"].startswith("d 32, V 2048, ") for t in targets.values())
    if res.get("plot_heads"):
        assert (tmp_path / res["plot_heads"]).stat().st_size > 0
    # the fit: a constants file the cost model loads, naming its source
    costs = headcost.load(out.with_name(out.stem + ".costs.json"))
    assert costs.provenance["source"] == str(out) and costs.indexed.bytes_per_us > 0 and costs.launch_us > 0
    assert "measured" in costs.provenance["launch"]
    # every plan was timed here, so auto may choose any; the top-k has its own line; the margin is the fit's error
    assert costs.modes == headcost.MODES and costs.topk is not None and costs.topk.bytes_per_us > 0
    assert costs.margin >= 0 and "compact_topk shapes" in costs.provenance["topk"]
    assert bench_fit.model_errors(costs, res) and all(e["predicted_us"] > 0 for e in bench_fit.model_errors(costs, res))


def test_fit_reads_the_committed_h100_markdown(tmp_path):
    """The shipped constants are the fit of the committed H100 result: refitting it gives the shipped file."""
    import json
    from pathlib import Path

    from sglang_specvocab import headcost
    from sglang_specvocab.tools.bench import fit as bench_fit

    root = Path(__file__).resolve().parents[1]
    md = root / "benchmarks" / "kernels-h100-8a4c739.md"
    result = bench_fit.records_from_markdown(md.read_text())
    assert result["device"]["name"] == "NVIDIA H100 80GB HBM3" and result["bandwidth"]["copy_Bps"] == 2.438e12
    assert {r["op"] for r in result["records"]} == {"indexed", "dense_static"}
    assert len([r for r in result["records"] if r["op"] == "indexed"]) == 2 * 24  # cuda and triton
    shipped = headcost.costs_for("NVIDIA H100 80GB HBM3")
    fitted = bench_fit.fit(result, shipped.provenance["source"], note=shipped.provenance.get("note"))
    assert fitted.indexed == shipped.indexed and fitted.dense == shipped.dense and fitted.copy == shipped.copy
    # no union and no top-k was timed there: auto may take per-request or stock only, a plan must beat stock by 44 %
    assert fitted.modes == shipped.modes == ("per-request", "stock") and fitted.topk is shipped.topk is None
    assert fitted.margin == shipped.margin == 0.4433
    assert main(["bench", "fit", str(tmp_path / "nope.json")]) == 2
    out = tmp_path / "c.json"
    assert main(["bench", "fit", str(md), "--out", str(out), "--match", "h100,h800"]) == 0
    assert json.loads(out.read_text())["match"] == ["H100", "H800"]

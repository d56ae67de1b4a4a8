"""`sglang-specvocab bench plans` on the CPU (the C++ kernels): every plan timed and compared, and the report."""

import json

from sglang_specvocab.tools import cli
from sglang_specvocab.tools.bench import plans


def test_sweep_times_every_plan_and_writes_its_report(tmp_path):
    out = tmp_path / "sweep.json"
    assert (
        cli.main(
            [
                "bench",
                "plans",
                "--tiny",
                "--device",
                "cpu",
                "--iters",
                "2",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    result = json.loads(out.read_text())
    grid = plans.GRIDS["tiny"]
    shapes = {(r["W"], r["d"], r["batch"], r["rows"]) for r in result["records"]}
    assert shapes == {
        (W, d, b, n) for W in grid["widths"] for d in grid["dims"] for b in grid["batches"] for n in grid["rows"]
    }
    names = {"auto"} | {plans.plan_name(p) for p in plans.PLANS}
    assert {"mt1/nt2", "mt1/nt2/z4"} <= names
    for r in result["records"]:
        assert set(r["times_us"]) == names and all(t > 0 for t in r["times_us"].values())
        assert all(r["bitwise_equal_to_auto"].values()) and r["best"] in names
        assert len(r["auto_plan"]) == 9 and r["M"] == r["batch"] * r["rows"]
    md = out.with_suffix(".md").read_text()
    assert md.count("\n| 48 | 64 |") == len(result["records"]) and result["versions"]["torch"] in md

"""Time the CUDA head kernel (indexed_logits) under every launch plan it can take, to tune the launcher's rule.

The plan's free choices, ``mt`` (16-column tiles per warp), ``ntmax`` (8-row tiles per piece) and ``zs`` (CTAs sharing
a row tile's pieces), never change the logits (csrc/indexed_logits_kernel.cu), so they can be chosen by speed alone.
For each shape this script times the launcher's own choice ("auto"), each forced plan and the Triton backend with the
kernel benchmark's method (a CUDA graph of several calls replayed between events, inputs rotated so a replay reads
>= 3x L2), checks that every plan gives bitwise the logits of "auto", and writes a Markdown table (printed) and JSON.

    sglang-specvocab bench plans --out OUT.json            # W 2048/3072, d 4096, bs 1/8/32/64, rows 1/4/10
    sglang-specvocab bench plans --quick --out OUT.json    # W 3072, bs 1/8/64, rows 1/10
    sglang-specvocab bench plans --tiny --device cpu       # the plumbing, on the C++ CPU kernels
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch

from ... import ops
from ...ops import _ext
from . import kernels as bk
from .kernels_report import default_peak
from .timing import CpuTimer, CudaTimer

PLANS = [
    (1, 2, 1),
    (2, 2, 1),
    (1, 4, 1),
    (2, 4, 1),
    (1, 2, 2),
    (1, 2, 4),
    (1, 2, 8),
]  # (mt, ntmax, zs) forced; "auto" is the launcher's rule
GRIDS = {
    "full": dict(
        widths=[2048, 3072],
        dims=[4096],
        batches=[1, 8, 32, 64],
        rows=[1, 4, 10],
        vocab=128256,
    ),
    "quick": dict(widths=[3072], dims=[4096], batches=[1, 8, 64], rows=[1, 10], vocab=128256),
    "tiny": dict(widths=[48], dims=[64], batches=[1, 2], rows=[1, 3], vocab=500),
}


def plan_name(plan: tuple[int, int, int]) -> str:
    mt, nt, zs = plan
    return f"mt{mt}/nt{nt}" + (f"/z{zs}" if zs > 1 else "")


def configure(args: argparse.Namespace) -> argparse.Namespace:
    """Resolve the CLI's options (``sglang-specvocab bench plans``): the grid and the device."""
    args.grid = GRIDS["quick" if args.quick else "tiny" if args.tiny else "full"]
    args.device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    return args


class forced:
    """The CUDA logits kernels take (mt, ntmax) for the calls inside the block ((0, 0): the launcher's rule)."""

    def __init__(self, plan: tuple[int, int, int]) -> None:
        self.plan = plan

    def __enter__(self) -> None:
        torch.ops.specvocab.force_logits_plan(*self.plan)

    def __exit__(self, *exc) -> None:
        torch.ops.specvocab.force_logits_plan(0, 0)


def sweep(args: argparse.Namespace) -> dict:
    assert _ext.load(), _ext.reason()
    dev = args.device
    gen = torch.Generator(device=dev).manual_seed(0)
    env = bk.environment(dev)
    cuda = dev.type == "cuda"
    timer = (
        CudaTimer(dev, args.iters, args.warmup, args.max_ms, True)
        if cuda
        else CpuTimer(args.iters, args.warmup, args.max_ms)
    )
    peak, peak_src = default_peak(env["device"]["name"]) if cuda else (None, "cpu")
    sms = env["device"].get("sm_count", -1) if cuda else -1
    triton_ok = not args.no_triton and "triton" in ops.available_backends(dev)
    g = args.grid
    records = []
    for d in g["dims"]:
        weight = torch.randn(g["vocab"], d, device=dev, generator=gen).to(torch.bfloat16)
        for W in g["widths"]:
            for bs in g["batches"]:
                for rows in g["rows"]:
                    nbytes = bs * W * d * 2
                    n_sets = bk.cold_sets(nbytes, env["device"].get("l2_bytes"), not cuda)
                    sets = []
                    for _ in range(n_sets):
                        R = bs + 1
                        ids = bk.random_sets(R, W, g["vocab"], gen, dev)
                        cnt = torch.full((R,), W, dtype=torch.int32, device=dev)
                        hidden = torch.randn(bs * rows, d, device=dev, generator=gen).to(torch.bfloat16)
                        slot = (1 + torch.arange(bs, device=dev, dtype=torch.int32)).repeat_interleave(rows)
                        sets.append((hidden, weight, ids, cnt, slot))
                    M = bs * rows
                    auto = torch.ops.specvocab.logits_plan(M, W, d, torch.bfloat16, True, sms, rows)
                    rec = {
                        "W": W,
                        "d": d,
                        "batch": bs,
                        "rows": rows,
                        "M": M,
                        "sets": n_sets,
                        "auto_plan": auto,
                    }
                    rec["ideal_us"] = nbytes / peak * 1e6 if peak else None
                    times, same = {}, {}
                    ref = ops.indexed_logits(*sets[0], backend="cuda")
                    for name, plan in [("auto", (0, 0, 0))] + [(plan_name(p), p) for p in PLANS]:
                        with forced(plan):
                            fns = [lambda s=s: ops.indexed_logits(*s, backend="cuda") for s in sets]
                            t = timer(fns)
                            same[name] = bool(torch.equal(fns[0](), ref))
                        times[name] = statistics.median(t.samples_us)
                    if triton_ok:
                        t = timer([lambda s=s: ops.indexed_logits(*s, backend="triton") for s in sets])
                        times["triton"] = statistics.median(t.samples_us)
                    rec.update(times_us=times, bitwise_equal_to_auto=same)
                    rec["best"] = min((k for k in times if k != "triton"), key=times.get)
                    records.append(rec)
                    print(f"W {W} d {d} bs {bs} rows {rows}: " + ", ".join(f"{k} {v:.1f}" for k, v in times.items()))
    method = timer.method + ("; inputs rotated so a replay reads >= 3x L2" if cuda else "")
    return {
        "schema": "sweep_logits_plans/1",
        **env,
        "peak_Bps": peak,
        "peak_source": peak_src,
        "method": method,
        "command": " ".join(sys.argv),
        "records": records,
    }


def markdown(result: dict) -> str:
    dev, ver = result["device"], result["versions"]
    names = [k for k in result["records"][0]["times_us"]] if result["records"] else []
    lines = [
        f"# indexed_logits launch plans on {dev.get('name')}",
        "",
        f"- command: `{result['command']}`",
        (
            f"- device: {dev.get('name')}, {dev.get('sm_count')} SMs, driver {dev.get('driver')}; torch {ver['torch']}, "
            f"cuda {ver['cuda']}, triton {ver['triton']}, git {ver['git']}"
        ),
        f"- timing: {result['method']}; bf16; microseconds (median)",
        (
            "- auto = [wd, wc, mt, ntmax, vec, nsteps, row tiles, column tiles]; every plan's logits are bitwise auto's "
            "unless marked `!=`"
        ),
        "",
        "| W | d | batch | rows | ideal | auto plan | " + " | ".join(names) + " | best |",
        "|---" * (6 + len(names) + 1) + "|",
    ]
    for r in result["records"]:
        cells = [f"{r['times_us'][k]:.1f}" + ("" if r["bitwise_equal_to_auto"].get(k, True) else " !=") for k in names]
        ideal = f"{r['ideal_us']:.1f}" if r["ideal_us"] else "-"
        lines.append(
            f"| {r['W']} | {r['d']} | {r['batch']} | {r['rows']} | {ideal} | {r['auto_plan']} | "
            + " | ".join(cells)
            + f" | {r['best']} |"
        )
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    """Sweep, print and write the report; 1 when a plan's logits differ from the launcher's own."""
    args = configure(args)
    result = sweep(args)
    text = markdown(result)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        args.out.with_suffix(".md").write_text(text)
    bad = [r for r in result["records"] if not all(r["bitwise_equal_to_auto"].values())]
    return 1 if bad else 0

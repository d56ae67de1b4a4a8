"""The kernel sweep's results: speedups, the targets met or not, Markdown, a plot, the files.

Targets (for the GPU): our ops within ``TARGET_IDEAL_RATIO`` of the bandwidth ideal for up to
``TARGET_MAX_ROWS`` rows per request, at least ``TARGET_SPEEDUP`` times faster than index_select +
matmul, and the window update within ``TARGET_WINDOW_US`` per round at the target batch. A case
whose output check failed meets no target.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

# Issue targets.
TARGET_IDEAL_RATIO = 1.5  # time <= 1.5 x bandwidth ideal ...
TARGET_MAX_ROWS = 16  # ... for up to 16 rows per request
TARGET_SPEEDUP = 4.0  # >= 4x faster than index_select + matmul
TARGET_WINDOW_US = 10.0  # window update <= 10 us per round at batch 64

OURS = ("indexed", "packed")  # ops with a backend choice that compute compact logits


def add_speedups(records: list[dict]) -> None:
    """speedup_vs_index_select (and vs the dense static head) for each of our ok records."""
    base = {
        (r["W"], r["d"], r["rows"], r["batch"]): r["median_us"]
        for r in records
        if r["op"] == "index_select_matmul" and r["status"] == "ok"
    }
    dense = {
        (r["d"], r["rows"], r["batch"]): r["median_us"]
        for r in records
        if r["op"] == "dense_static" and r["status"] == "ok"
    }
    for r in records:
        if r["op"] in OURS and r["status"] == "ok":
            b = base.get((r["W"], r["d"], r["rows"], r["batch"]))
            s = dense.get((r["d"], r["rows"], r["batch"]))
            r["speedup_vs_index_select"] = None if b is None else b / r["median_us"]
            r["speedup_vs_dense_static"] = None if s is None else s / r["median_us"]


def evaluate_targets(result: dict) -> list[dict]:
    a = result["config"]
    # a wrong output meets no target
    recs = [r for r in result["records"] if r["status"] == "ok" and not r.get("check", "").startswith("FAILED")]
    shape = [
        r
        for r in recs
        if r["op"] in OURS and r["W"] in a["target_widths"] and r["d"] == a["target_d"] and r["rows"] <= TARGET_MAX_ROWS
    ]
    out = []
    for op, be in sorted({(r["op"], r["backend"]) for r in shape}):
        mine = [r for r in shape if (r["op"], r["backend"]) == (op, be)]
        for ref, key in (("peak", "ideal_us_peak"), ("copy", "ideal_us_copy")):
            rated = [r for r in mine if r.get(key)]
            worst = max(rated, key=lambda r: r["median_us"] / r[key], default=None)
            ratio = None if worst is None else worst["median_us"] / worst[key]
            out.append(
                {
                    "target": f"within {TARGET_IDEAL_RATIO}x of the bandwidth ideal ({ref})",
                    "op": op,
                    "backend": be,
                    "cases": len(rated),
                    "worst": ratio,
                    "worst_case": _where(worst),
                    "met": None if ratio is None else ratio <= TARGET_IDEAL_RATIO,
                    "unit": "x ideal time",
                }
            )
        sp = [r for r in mine if r.get("speedup_vs_index_select")]
        worst = min(sp, key=lambda r: r["speedup_vs_index_select"], default=None)
        val = None if worst is None else worst["speedup_vs_index_select"]
        out.append(
            {
                "target": f"at least {TARGET_SPEEDUP:g}x faster than index_select + matmul",
                "op": op,
                "backend": be,
                "cases": len(sp),
                "worst": val,
                "worst_case": _where(worst),
                "met": None if val is None else val >= TARGET_SPEEDUP,
                "unit": "x speedup",
            }
        )
    win = [r for r in recs if r["op"] == "window_update" and r["batch"] == a["target_window_batch"]]
    for r in win:
        out.append(
            {
                "target": f"window update at most {TARGET_WINDOW_US:g} us per round at batch {a['target_window_batch']}",
                "op": "window_update",
                "backend": r["backend"],
                "cases": 1,
                "worst": r["median_us"],
                "worst_case": _where(r),
                "met": r["median_us"] <= TARGET_WINDOW_US,
                "unit": "us",
            }
        )
    return out


def _where(r: dict | None) -> str | None:
    if r is None:
        return None
    if r["op"] == "window_update":
        return f"batch {r['batch']}, capacity {r['W']}, block {r.get('block')}"
    return f"W {r['W']}, d {r['d']}, rows {r['rows']}, batch {r['batch']}"


# -- outputs -----------------------------------------------------------------------------------


def _us(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.0f}" if x >= 1000 else f"{x:.1f}" if x >= 10 else f"{x:.2f}"


def _f(x: float | None, fmt: str = ".2f") -> str:
    return "-" if x is None else format(x, fmt)


def _cell(r: dict | None) -> str:
    if r is None:
        return "skip"
    wrong = " WRONG" if r.get("check", "").startswith("FAILED") else ""
    return f"{_us(r['median_us'])} ({_f(r['frac_ideal'])}){wrong}"


def markdown(result: dict) -> str:
    a, dev, bw = result["config"], result["device"], result["bandwidth"]
    recs = result["records"]
    ok = {(r["op"], r["backend"], r["W"], r["d"], r["rows"], r["batch"]): r for r in recs if r["status"] == "ok"}
    cpu = dev["type"] == "cpu"
    lines = [
        f"# Head-op kernels on {dev.get('name')}" + (" (CPU: not GPU numbers)" if cpu else ""),
        "",
        f"- command: `{result['command']}`",
        f"- device: {dev.get('name')}, driver {dev.get('driver')}; "
        + ", ".join(f"{k} {v}" for k, v in result["versions"].items()),
        f"- dtype {a['dtype']}; timing: {result['timing']['method']}; "
        + ("L2-hot (no rotation)" if a["hot"] or cpu else "inputs rotated so a replay reads >= 3x L2"),
        (
            f"- peak bandwidth: {_f(bw['peak_Bps'] and bw['peak_Bps'] / 1e12, '.3f')} TB/s ({bw['peak_source']}); "
            f"measured copy: {_f(bw['copy_Bps'] / 1e12, '.3f')} TB/s (read + write of {bw['copy_bytes'] / 2**20:.0f} MiB)"
        ),
        "",
        f"## Headline: W {', '.join(map(str, a['target_widths']))}, d {a['target_d']}",
        "",
        (
            "Microseconds (median); in brackets the fraction of the bandwidth ideal vs peak (1.00 = at the limit). "
            "`ideal` = batch x W x d x bytes / peak (and / measured copy). Speedups are of our best backend."
        ),
        "",
    ]
    cols = [(op, be) for op in OURS for be in a["backends"] if op in a["ops"]]
    head = ["W", "rows", "batch", "ideal peak/copy"] + [f"{op} {be}" for op, be in cols]
    head += ["index_select+mm", f"dense {a['dense_width']}", "best vs isel", "best vs dense"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    d = a["target_d"]
    any_row = False
    for W in a["target_widths"]:
        for r in a["rows"]:
            for b in a["batches"]:
                mine = [ok.get((op, be, W, d, r, b)) for op, be in cols]
                isel = ok.get(("index_select_matmul", "torch", W, d, r, b))
                dense = ok.get(("dense_static", "torch", a["dense_width"], d, r, b))
                if not any(mine) and not isel:
                    continue
                any_row = True
                ref = next((x for x in (*mine, isel) if x), None)
                cells = [str(W), str(r), str(b), f"{_us(ref['ideal_us_peak'])} / {_us(ref['ideal_us_copy'])}"]
                cells += [_cell(x) for x in mine]
                cells += [_us(isel["median_us"]) if isel else "-", _us(dense["median_us"]) if dense else "-"]
                best = min((x for x in mine if x), key=lambda x: x["median_us"], default=None)
                sp = best and best.get("speedup_vs_index_select")
                sd = best and best.get("speedup_vs_dense_static")
                cells += [f"{sp:.1f}x" if sp else "-", f"{sd:.1f}x" if sd else "-"]
                lines.append("| " + " | ".join(cells) + " |")
    if not any_row:
        lines.append("| (no measured headline case) |" + " |" * (len(head) - 1))
    win = [r for r in recs if r["op"] == "window_update"]
    if win:
        lines += ["", f"## Window update (capacity {a['capacity']}, block {a['draft_tokens']} + {a['topk_ids']})", ""]
        lines += ["| backend | batch | median us | p10-p90 us |", "|---|---|---|---|"]
        for r in win:
            if r["status"] == "ok":
                lines.append(
                    f"| {r['backend']} | {r['batch']} | {_us(r['median_us'])} | {_us(r['p10_us'])}-{_us(r['p90_us'])} |"
                )
            else:
                lines.append(f"| {r['backend']} | {r['batch']} | {r['status']} | {r['reason']} |")
    lines += ["", "## Targets" + (" (CPU run: the targets are for the GPU)" if cpu else ""), ""]
    lines += ["| target | op | backend | cases | worst | where | met |", "|---|---|---|---|---|---|---|"]
    for t in result["targets"]:
        met = "no data" if t["met"] is None else "**met**" if t["met"] else "not met"
        worst = "-" if t["worst"] is None else f"{_f(t['worst'])} {t['unit']}"
        lines.append(
            f"| {t['target']} | {t['op']} | {t['backend']} | {t['cases']} | {worst} | {t['worst_case'] or '-'} | {met} |"
        )
    if not result["targets"]:
        lines.append("| (no data) | | | | | | |")
    bad = [r for r in recs if r.get("check", "ok").startswith("FAILED") or r["status"] == "error"]
    if bad:
        lines += ["", "## Failures", ""]
        for r in bad[:40]:
            lines.append(f"- {r['op']} {r['backend']} ({_where(r)}): {r.get('reason') or r.get('check')}")
    skipped = Counter(r["reason"] for r in recs if r["status"] == "skipped")
    if skipped:
        lines += ["", "## Skipped", ""]
        lines += [f"- {n} x {reason}" for reason, n in skipped.most_common()]
    n_ok = sum(r["status"] == "ok" for r in recs)
    lines += ["", f"{n_ok} of {len(recs)} cases measured; every number is in the JSON beside this file.", ""]
    return "\n".join(lines)


def plot(result: dict, path: Path) -> bool:
    """GB/s vs W per (op, backend) at the target d (else the largest measured d); one panel per (rows, batch)."""
    recs = [r for r in result["records"] if r["status"] == "ok" and r["op"] != "window_update"]
    if not recs:
        return False
    dims = {r["d"] for r in recs}
    d = result["config"]["target_d"] if result["config"]["target_d"] in dims else max(dims)
    recs = [r for r in recs if r["d"] == d]
    try:
        import matplotlib  # optional: the plot needs matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # optional: the plot needs matplotlib
    except ImportError:
        return False
    rows = sorted({r["rows"] for r in recs})
    batches = sorted({r["batch"] for r in recs})
    fig, axes = plt.subplots(len(rows), len(batches), figsize=(3.6 * len(batches), 2.8 * len(rows)), squeeze=False)
    bw = result["bandwidth"]
    series = sorted({(r["op"], r["backend"]) for r in recs})
    for i, nr in enumerate(rows):
        for j, b in enumerate(batches):
            ax = axes[i][j]
            for op, be in series:
                pts = sorted(
                    (r["W"], r["gbps"])
                    for r in recs
                    if (r["op"], r["backend"], r["rows"], r["batch"]) == (op, be, nr, b)
                )
                if not pts:
                    continue
                x, y = zip(*pts, strict=True)
                dense = op.startswith("dense")
                ax.plot(x, y, "s" if dense else "o-", ms=4, label=f"{op} {be}" if op in OURS else op)
            if bw["peak_Bps"]:
                ax.axhline(bw["peak_Bps"] / 1e9, color="k", ls="--", lw=0.8)
            ax.axhline(bw["copy_Bps"] / 1e9, color="gray", ls=":", lw=0.8)
            ax.set_xscale("log", base=2)
            ax.set_title(f"rows {nr}, batch {b}", fontsize=9)
            ax.tick_params(labelsize=7)
            if j == 0:
                ax.set_ylabel("GB/s (rows read once)", fontsize=8)
            if i == len(rows) - 1:
                ax.set_xlabel("W (head rows)", fontsize=8)
    handles, labels = axes[0][0].get_legend_handles_labels()
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(handles, labels, loc="lower center", ncol=min(4, max(1, len(labels))), fontsize=8)
    fig.suptitle(
        f"{result['device'].get('name')}, d = {d}, {result['config']['dtype']} (dashed: peak, dotted: measured copy)",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0.08, 1, 0.96))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def save(result: dict, out: Path, with_plot: bool) -> None:
    add_speedups(result["records"])
    result["targets"] = evaluate_targets(result)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, allow_nan=False) + "\n")
    out.with_suffix(".md").write_text(markdown(result))
    if with_plot:
        png = out.with_suffix(".png")
        result["plot"] = png.name if plot(result, png) else None

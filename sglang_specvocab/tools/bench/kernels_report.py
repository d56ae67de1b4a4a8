"""The kernel sweep's results: its case names, the bandwidth rating, speedups, Markdown, a plot, the files (each
written whole: a temporary file, then ``os.replace``). Free of torch (the CLI's --help reads the case names).

The targets and the head step they judge are ``kernels_targets``'s (its module doc states them as the lease issue
does); every save evaluates them on what was measured so far, and a save made before the sweep ended is marked
``partial`` with the cases not run counted.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from ...cache import write_whole
from ...copies.upstream import SGLANG_VERSION
from .kernels_targets import _us, evaluate_targets, head_table, targets_markdown, verdict, where

# The sweep's case names (``bench kernels --ops``), here rather than in ``kernels`` so that the CLI's --help
# lists them without importing torch.
OPS = (
    "indexed",
    "packed",
    "index_select_matmul",
    "dense_static",
    "dense_full",
    "window_round",
    "head",
    "stock",
    "gemma4_mtp",
    "topk",
    "topk_stock",
)
HEAD_OPS = ("head", "stock", "gemma4_mtp")  # one draft step's head per batch mode (bench/heads.py)
TOPK_OPS = ("topk", "topk_stock")  # a draft step's top-k alone: ours (cuda: compact_topk; torch: unfused), EAGLE3's
OURS = ("indexed", "packed")  # ops with a backend choice that compute compact logits

# Peak HBM bandwidth (B/s) by device name, first match wins; datasheet figures (H200.md of the
# device docs: H200 4.8 TB/s, H100 SXM 3.35 TB/s).
PEAK_BANDWIDTH = [
    ("H200", 4.8e12, "H200 datasheet, 4.8 TB/s"),
    ("H100 NVL", 3.9e12, "H100 NVL datasheet, 3.9 TB/s"),
    ("H100 PCIE", 2.0e12, "H100 PCIe datasheet, 2.0 TB/s"),
    ("H100", 3.35e12, "H100 SXM datasheet, 3.35 TB/s"),
    ("A100-SXM4-80GB", 2.039e12, "A100 80GB SXM datasheet, 2.039 TB/s"),
]


def bandwidth_fields(nbytes: int, median_us: float, peak_Bps: float | None, copy_Bps: float | None) -> dict:
    """GB/s and the fraction of the bandwidth ideal (ideal time / measured time) vs peak and vs copy."""
    t = median_us * 1e-6
    out = {"bytes": nbytes, "gbps": nbytes / t / 1e9}
    for suffix, bw in (("", peak_Bps), ("_copy", copy_Bps)):
        ideal = nbytes / bw if bw else None
        out[f"ideal_us{suffix or '_peak'}"] = None if ideal is None else ideal * 1e6
        out[f"frac_ideal{suffix}"] = None if ideal is None else ideal / t
    return out


def default_peak(name: str) -> tuple[float | None, str]:
    up = name.upper()
    for key, bw, src in PEAK_BANDWIDTH:
        if key in up:
            return bw, src
    return None, f"no datasheet figure known for {name!r}: use --peak-bw"


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


def heads_markdown(result: dict) -> list[str]:
    table = head_table(result["records"])
    if not table:
        return []
    a = result["config"]
    costs = result.get("head_costs", {})
    sizes = result.get("union_sizes", {})
    lines = [
        "",
        "## Draft-step heads: each batch mode against EAGLE3's step",
        "",
        (
            "One draft step's head and its top-k (k = rows per request) in microseconds (median), full sets; a "
            "batch's sets share a pool of the lab's measured union size (`pool`). `EAGLE3` = EAGLE3's own step in "
            f"SGLang {SGLANG_VERSION} (GEMM, fp32 logits, then softmax + top-k, or for rows 1 its Triton split argmax; the d2t "
            f"remap) over the draft kind's head: d2t = {a.get('d2t_rows')} rows, full = V rows. Ours (kernel "
            f"{a.get('head_kernel')}): per-request, union (indexed: one pass over the live union; gemm: gathered + one "
            "GEMM), our stock plan. `auto` is the plan the cost model picks for the shape (constants: "
            f"{costs.get('device')}, {costs.get('provenance', {}).get('source')}; union sizes: "
            f"{sizes.get('provenance', {}).get('source')}) and its time: where auto picks `stock` the server runs "
            "EAGLE3's own code path (`integration/logits.py`), so auto's time there is EAGLE3's (marked *), not our "
            "stock plan's. Gemma-4 MTP: its centroid head (full kind). `-`: not timed (the lease preset times "
            "per-request and auto's plan only)."
        ),
        "",
        (
            "| d | V | kind | W | rows | batch | pool / union | EAGLE3 | per-request | union-indexed | union-gemm "
            "| our stock | auto | auto / EAGLE3 | Gemma-4 MTP |"
        ),
        "|" + "---|" * 15,
    ]
    for (d, V, kind, W, n, bs), e in sorted(table.items()):
        p = {m: _t(r) for m, r in e["plans"].items()}
        ratio = "-" if e["ratio"] is None else f"{e['ratio']:.2f}"
        star = "*" if e["auto_mode"] == "stock" else ""
        lines.append(
            f"| {d} | {V} | {kind} | {W} | {n} | {bs} | {e.get('pool') or '-'} / {e.get('union') or '-'} | "
            f"{_t(e.get('stock'))} | {p.get('per-request', '-')} | {p.get('union-indexed', '-')} | "
            f"{p.get('union-gemm', '-')} | {p.get('stock', '-')} | {e['auto_mode']} {_t(e['step'])}{star} | {ratio} | "
            f"{_t(e.get('gemma4_mtp')) if kind == 'full' else ''} |"
        )
    lines += [
        "",
        "## Verdict: the head step's time over EAGLE3's step",
        "",
        (
            "Per (d, V, W, batch), for each draft kind against EAGLE3's step of its own kind: the worst over rows per "
            "request of the head step's time (auto's plan; EAGLE3's where auto picks stock) / EAGLE3's time "
            "(<= 1.00: auto is never slower), with the plan auto chose there."
        ),
        "",
        "| d | V | W | batch | d2t: auto / EAGLE3 32k | full: auto / EAGLE3 V | met |",
        "|---|---|---|---|---|---|---|",
    ]
    for v in verdict(result["records"]):
        cells, met = [], True
        for kind in ("d2t", "full"):
            w = v.get(kind)
            if w is None:
                cells.append("-")
                met = None if met is not False else met
                continue
            cells.append(f"{w['ratio']:.2f} ({w['mode']}, rows {w['rows']})" + (" WRONG" if w["failed"] else ""))
            met = met and w["ratio"] <= 1.0 and not w["failed"] if met is not None else met
        flag = "no data" if met is None else "**yes**" if met else "no"
        lines.append(f"| {v['d']} | {v['V']} | {v['W']} | {v['batch']} | {cells[0]} | {cells[1]} | {flag} |")
    return lines


def _t(r: dict | None) -> str:
    """A head-op record's time: ``-`` where not measured, WRONG after a failed check."""
    if r is None or r.get("status") != "ok":
        return "-"
    return _us(r["median_us"]) + (" WRONG" if str(r.get("check", "")).startswith("FAILED") else "")


def plot_heads(result: dict, path: Path) -> bool:
    """Time per draft step against batch: EAGLE3's steps, auto and each plan (full kind), Gemma-4 MTP; one panel
    per rows per request, at the headline d and W and the first V."""
    table = head_table(result["records"])
    if not table:
        return False
    try:
        import matplotlib  # optional: the plot needs matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # optional: the plot needs matplotlib
    except ImportError:
        return False
    a = result["config"]
    ds = {k[0] for k in table}
    d = a["target_d"] if a["target_d"] in ds else min(ds)
    V = min(k[1] for k in table if k[0] == d)
    Ws = {k[3] for k in table if k[:2] == (d, V)}
    W = a.get("target_head_width") if a.get("target_head_width") in Ws else max(Ws)
    rows = sorted({k[4] for k in table if (k[0], k[1], k[3]) == (d, V, W)})
    fig, axes = plt.subplots(1, len(rows), figsize=(4.2 * len(rows), 3.4), squeeze=False)
    for ax, n in zip(axes[0], rows, strict=True):
        keys = sorted(k for k in table if (k[0], k[1], k[3], k[4]) == (d, V, W, n))
        full = [k for k in keys if k[2] == "full"]
        series = {
            "EAGLE3 d2t": [(k[5], _time(table[k].get("stock"))) for k in keys if k[2] == "d2t"],
            "EAGLE3 full": [(k[5], _time(table[k].get("stock"))) for k in full],
            "auto d2t": [(k[5], table[k]["auto"]) for k in keys if k[2] == "d2t"],
            "auto full": [(k[5], table[k]["auto"]) for k in full],
            "per-request": [(k[5], _time(table[k]["plans"].get("per-request"))) for k in full],
            "union-indexed": [(k[5], _time(table[k]["plans"].get("union-indexed"))) for k in full],
            "Gemma-4 MTP": [(k[5], _time(table[k].get("gemma4_mtp"))) for k in full],
        }
        for name, pts in series.items():
            pts = [(x, y) for x, y in pts if y]
            if pts:
                x, y = zip(*pts, strict=True)
                style = "--" if name.startswith("EAGLE3") else "-" if name.startswith("auto") else ":"
                ax.plot(x, y, style, marker="o", ms=3, label=name)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"rows {n}", fontsize=9)
        ax.set_xlabel("batch", fontsize=8)
        ax.tick_params(labelsize=7)
    axes[0][0].set_ylabel("us per draft step (head + top-k)", fontsize=8)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=7)
    fig.suptitle(f"{result['device'].get('name')}: draft-step heads, d = {d}, V = {V}, W = {W}", fontsize=10)
    fig.tight_layout(rect=(0, 0.12, 1, 0.94))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _time(r: dict | None) -> float | None:
    return r["median_us"] if r is not None and r.get("status") == "ok" else None


# -- outputs -----------------------------------------------------------------------------------


def _f(x: float | None, fmt: str = ".2f") -> str:
    return "-" if x is None else format(x, fmt)


def _cell(r: dict | None) -> str:
    if r is None:
        return "skip"
    wrong = " WRONG" if r.get("check", "").startswith("FAILED") else ""
    return f"{_us(r['median_us'])} ({_f(r['frac_ideal'])}){wrong}"


def topk_markdown(result: dict) -> list[str]:
    """A draft step's top-k alone: ours fused (cuda: compact_topk) and unfused (torch), EAGLE3's softmax + topk."""
    recs = [r for r in result["records"] if r["op"] in ("topk", "topk_stock")]
    if not recs:
        return []
    ok = {(r["op"], r["backend"], r["W"], r["rows"]): r for r in recs if r["status"] == "ok"}
    lines = ["", "## Draft top-k (k 4, probabilities, fp32 logits with 10 % -inf)", ""]
    lines += [
        "Microseconds (median). `fused`: `compact_topk`; `unfused`: the exact-order top-k in torch ops, then the "
    ]
    lines += ["column map; `softmax+topk`: EAGLE3's (no tie rule). The head uses `fused` up to 16,384 columns.", ""]
    lines += [
        "| W | rows | fused (cuda) | unfused (torch) | softmax+topk | fused vs unfused |",
        "|---|---|---|---|---|---|",
    ]
    for W, n in dict.fromkeys((r["W"], r["rows"]) for r in recs):
        f, u, s = (
            ok.get(key) for key in (("topk", "cuda", W, n), ("topk", "torch", W, n), ("topk_stock", "torch", W, n))
        )
        ratio = f"{u['median_us'] / f['median_us']:.1f}x" if f and u else "-"
        cells = [_us(x["median_us"]) if x else "-" for x in (f, u, s)]
        lines.append(f"| {W} | {n} | " + " | ".join(cells) + f" | {ratio} |")
    return lines


def _progress(result: dict) -> str:
    p = result.get("progress") or {}
    if not p:
        return "progress not recorded"
    line = f"{p.get('done')} of {p.get('cases')} cases run"
    if result.get("partial"):
        line += f", **partial**: {p.get('not_run')} not run ({p.get('why') or 'the run is still going'})"
    return line


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
        + ", ".join(f"{k} {v}" for k, v in result["versions"].items() if k != "git_source")
        + f" (git from {result['versions'].get('git_source', 'git rev-parse')})",
        f"- dtype {a['dtype']}; timing: {result['timing']['method']}; "
        + ("L2-hot (no rotation)" if a["hot"] or cpu else "inputs rotated so a replay reads >= 3x L2"),
        (
            f"- peak bandwidth: {_f(bw['peak_Bps'] and bw['peak_Bps'] / 1e12, '.3f')} TB/s ({bw['peak_source']}); "
            f"measured copy: {_f(bw['copy_Bps'] / 1e12, '.3f')} TB/s (read + write of {bw['copy_bytes'] / 2**20:.0f} MiB)"
        ),
        f"- preset {a.get('preset')}; " + _progress(result),
    ]
    lines += targets_markdown(result)
    lines += [
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
    win = [r for r in recs if r["op"] == "window_round"]
    if win:
        lines += ["", f"## Window round (capacity {a['capacity']}, entries {a['draft_tokens']} + {a['topk_ids']})", ""]
        lines += ["| backend | batch | median us | p10-p90 us |", "|---|---|---|---|"]
        for r in win:
            if r["status"] == "ok":
                lines.append(
                    f"| {r['backend']} | {r['batch']} | {_us(r['median_us'])} | {_us(r['p10_us'])}-{_us(r['p90_us'])} |"
                )
            else:
                lines.append(f"| {r['backend']} | {r['batch']} | {r['status']} | {r['reason']} |")
    lines += topk_markdown(result)
    lines += heads_markdown(result)
    bad = [r for r in recs if r.get("check", "ok").startswith("FAILED") or r["status"] == "error"]
    if bad:
        lines += ["", "## Failures", ""]
        for r in bad[:40]:
            lines.append(f"- {r['op']} {r['backend']} ({where(r)}): {r.get('reason') or r.get('check')}")
    skipped = Counter(r["reason"] for r in recs if r["status"] == "skipped")
    if skipped:
        lines += ["", "## Skipped", ""]
        lines += [f"- {n} x {reason}" for reason, n in skipped.most_common()]
    n_ok = sum(r["status"] == "ok" for r in recs)
    lines += ["", f"{n_ok} of {len(recs)} cases measured; every number is in the JSON beside this file.", ""]
    return "\n".join(lines)


def plot(result: dict, path: Path) -> bool:
    """GB/s vs W per (op, backend) at the target d (else the largest measured d); one panel per (rows, batch)."""
    recs = [
        r
        for r in result["records"]
        if r["status"] == "ok" and r["op"] not in ("window_round", "head", "stock", "gemma4_mtp", "topk", "topk_stock")
    ]
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


def save(result: dict, out: Path, with_plot: bool, pending: list[dict] = ()) -> None:
    """Write the JSON and Markdown (and with ``with_plot`` the plots) of ``result``, its targets evaluated on what was
    measured so far and ``pending``, the records of the cases not run yet; each file whole (``write_atomic``)."""
    add_speedups(result["records"])
    result["targets"] = evaluate_targets(result, list(pending))
    out.parent.mkdir(parents=True, exist_ok=True)
    if with_plot:
        png = out.with_suffix(".png")
        result["plot"] = png.name if write_whole(png, lambda tmp: plot(result, tmp)) else None
        heads_png = out.with_name(out.stem + "-heads.png")
        result["plot_heads"] = heads_png.name if write_whole(heads_png, lambda tmp: plot_heads(result, tmp)) else None
    write_atomic(out, json.dumps(result, indent=1, allow_nan=False) + "\n")
    write_atomic(out.with_suffix(".md"), markdown(result))


def write_atomic(path: Path, text: str) -> None:
    """``path`` gets ``text`` whole or keeps what it had (``cache.write_whole``)."""
    write_whole(path, lambda tmp: tmp.write_text(text))

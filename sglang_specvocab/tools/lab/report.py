"""Lab results as JSON, Markdown and a plot of coverage against set size."""

from __future__ import annotations

import json
from pathlib import Path

#: One sentence, printed wherever the lab's results are shown, on why a set can beat the full head.
WHY_ORACLE = (
    "With a weak draft a restricted head can beat the full one (where the set leaves out the draft's full-vocabulary "
    "choice, that choice was mostly wrong, and the set's best token now and then matches the target instead); with "
    "the oracle draft (the target drafting for itself) the full head is the ceiling, so its column is the set's cost "
    "alone."
)


def trained_label(name: str, t: dict) -> str:
    """One config's trained file as the report says it."""
    rec, head = t["recording"], f"{name}: {t['what']} {Path(t['file']).name}"
    if rec is None:
        return f"{head}, fit on unrecorded states (a file of an earlier version)"
    model = "" if rec.get("model") == t["model"] else f"{rec.get('model')} "  # named only when it differs
    if t["matches"]:
        kinds = ["ShareGPT", *(["code"] if rec.get("code_share") else []), *(
            ["ten-language"] if rec.get("multilingual_share") else [])]  # fmt: skip
        docs = f"{', '.join(kinds[:-1])} and {kinds[-1]} documents" if len(kinds) > 1 else "ShareGPT conversations"
        fit = ", closed-form whitened fit" if rec.get("fit") == "whitened" else ""
        steps = f", {rec['draft_steps']} draft steps each" if rec.get("draft_steps", 1) > 1 else ""
        return f"{head}, fit on {_fit_draft(rec)} states ({rec['source']}, {rec['prompts']} {docs}{steps}{fit})"
    return f"{head} was fit on {model}{_fit_draft(rec)} states, this run drafts with {t['draft']}"


def _fit_draft(rec: dict) -> str:
    """The draft a trained file was fit on: an EAGLE-3 draft by its folder's name and fc fingerprint (the folder it
    was fit in is another machine's), else its spec."""
    if rec.get("draft_fingerprint") is None:
        return str(rec["draft"])
    return f"EAGLE-3 draft {Path(str(rec['draft']).partition(':')[2]).name} (fc {rec['draft_fingerprint']})"


def sampling_label(result: dict) -> str:
    t = result.get("temperature", 0.0)
    return "greedy" if not t else f"sampled at temperature {t:g} (seed {result.get('seed', 0)})"


def lossless(result: dict) -> bool | None:
    """Greedy: every config produced the same tokens, with each draft; sampled: None (not compared)."""
    checked = [result["lossless"]] + ([result["oracle"]["lossless"]] if result.get("oracle") else [])
    return None if None in checked else all(checked)


def lossless_line(result: dict) -> str:
    ok = lossless(result)
    if ok is None:
        return (
            "- lossless: sampled, so configs draw different tokens; the decoder's samples are distributed as the "
            "target's own (chi-square, tests/test_sampling.py)"
        )
    return f"- lossless (every config produced the same tokens, with each draft): {'yes' if ok else 'NO'}"


def oracle_overall(result: dict) -> tuple[dict[str, dict], float | None]:
    """The oracle pass's overall rows by config and full's accept length there (({}, None) when it did not run)."""
    oracle = result.get("oracle")
    if not oracle:
        return {}, None
    return {r["config"]: r for r in oracle["rows"] if r["category"] == "overall"}, full_length(oracle["rows"])


def markdown(result: dict) -> str:
    oracle = result.get("oracle")
    lockstep = result.get("batch", 1) > 1  # a batch's union size is worth a column
    union_col = ("| mean union ", "---:|") if lockstep else ("", "")
    head = [
        f"# Policy lab: {result['model']} (vocabulary {result['vocab_size']:,})",
        "",
        (
            f"- draft: {result['draft']}; steps {result['draft_shape']['steps']}, topk "
            f"{result['draft_shape']['topk']}, {result['draft_shape']['num_draft_tokens']} draft tokens per round"
            + (
                f"; {result['batch']} questions in lockstep (one head call per draft step over one table; first turns)"
                if lockstep
                else ""
            )
        ),
        *(["- draft head: " + "; ".join(f"{n}: {h}" for n, h in result["heads"].items())] if "heads" in result else []),
        f"- prompts: {result['prompts']}"
        + (f" (first {result['per_category']} per category)" if result.get("per_category") else "")
        + (f"; the first {result['turns']} turn(s) of each" if result.get("turns") else "")
        + f"; at most {result['max_new_tokens']} new tokens, {sampling_label(result)}",
        lossless_line(result),
        *([f"- oracle draft: every config again with the target as its own draft. {WHY_ORACLE}"] if oracle else []),
        *(
            ["- trained files: " + "; ".join(trained_label(n, t) for n, t in result["trained_on"].items())]
            if result.get("trained_on")
            else []
        ),
        *([] if result["complete"] else ["- INTERRUPTED: the table covers only the turns that finished"]),
        *(f"- note: {n}" for n in result.get("notes", [])),
        "- versions: " + ", ".join(f"{k} {v}" for k, v in result["versions"].items()),
        f"- command: `{result['command']}`",
        "",
        *overall_table(result),
        "| config | policy | category | accept length | coverage | mean set | max set "
        + union_col[0]
        + "| tokens/s | prompts |",
        "|---|---|---|---:|---:|---:|---:|" + union_col[1] + "---:|---:|",
    ]
    body = [
        f"| {r['config']} | {r['policy']} | {r['category']} | {r['accept_length']:.2f} | {r['coverage']:.3f} "
        f"| {r['mean_set_size']:,.0f} | {r['max_set_size']:,.0f} "
        + (f"| {r['mean_union_size']:,.0f} " if lockstep else "")
        + f"| {r['tokens_per_s']:.2f} | {r['n_prompts']} |"
        for r in result["rows"]
    ]
    mismatches = result["mismatches"] + [f"oracle draft: {m}" for m in (oracle or {}).get("mismatches", [])]
    tail = [""] + [f"- mismatch: {m}" for m in mismatches] + verdict(result)
    return "\n".join(head + body + tail) + "\n"


def reads_fraction(result: dict, row: dict) -> float | None:
    """Modelled: the weight entries one draft step of ``row``'s config reads, as a fraction of the full head's:
    (the set's rows x d + what chooses the set, a ranker's V x rank or a router) / (the head's rows x d). None when
    the run did not record the head's shape (a result of an earlier version)."""
    r = result.get("head_reads", {}).get(row["config"])
    if r is None:
        return None
    rows = min(row["mean_set_size"], r["head_rows"])  # full: its set is the vocabulary, so all of the head's rows
    return (rows * r["hidden"] + r["selection"]) / (r["head_rows"] * r["hidden"])


def verdict(result: dict) -> list[str]:
    """Markdown lines: per config, the accept length it keeps with the run's draft and with the oracle (overall
    and in its lowest category), its mean set and the head's reads per draft step against the full head's, each
    labelled measured or modelled; then the config that keeps the most where it keeps the least."""
    rows = {r["config"]: r for r in result["rows"] if r["category"] == "overall"}
    full = full_length(result["rows"])
    if not full or len(rows) < 2:
        return []
    frac = fractions(result["rows"])
    oracle = result.get("oracle")
    o_frac = fractions(oracle["rows"]) if oracle else {}

    def kept(by: dict[str, float]) -> str:
        cats = {c: v for c, v in by.items() if c != "overall"}
        low = min(cats, key=cats.get) if cats else None
        return f"{by['overall']:.1%}" + (f" ({cats[low]:.1%}, {low})" if low else "")

    lines = [
        "",
        "## Verdict",
        "",
        f"Measured here: accept length (kept = of full's with the same draft; in brackets the lowest category), "
        f"the mean set; modelled: the weights one draft step of the head reads, of the full head's (the set's rows "
        f"x d plus a ranker's V x rank or a router, from shapes; no speed is timed here). Full's accept length: "
        f"{full:.2f} with the {result['draft']}"
        + (f", {full_length(oracle['rows']):.2f} with the oracle draft" if oracle else "")
        + ".",
        "",
        "| config | kept, "
        + result["draft"]
        + (" | kept, oracle draft" if oracle else "")
        + " | mean set (ids) | head reads per draft step (modelled) |",
        "|---|---:|" + ("---:|" if oracle else "") + "---:|---:|",
    ]
    best = None
    for name, r in rows.items():
        if r["policy"] == "full":
            continue
        f = reads_fraction(result, r)
        cells = [kept(frac[name])] + ([kept(o_frac[name])] if oracle else [])
        lines.append(
            f"| {name} | "
            + " | ".join(cells)
            + f" | {r['mean_set_size']:,.0f} | "
            + ("-" if f is None else f"{f:.2%}")
            + " |"
        )
        judged = o_frac.get(name) or frac[name]  # the oracle judges a set; the run's draft when it did not run
        score = min(judged.values())
        if best is None or score > best[1] or (score == best[1] and (f or 1.0) < (best[2] or 1.0)):
            best = (name, score, f)
    if best is not None:
        name, score, f = best
        by = "with the oracle draft" if oracle else f"with the {result['draft']}"
        reads = "" if f is None else f", reading {f:.1%} of the full head's weights per draft step (modelled)"
        best_line = (
            f"**{name}** keeps the most where it keeps least: at least {score:.1%} of full's accept length in every "
            f"category {by}, with a mean set of {rows[name]['mean_set_size']:,.0f} ids{reads}."
        )
        lines += ["", best_line]
    return lines


def full_length(rows: list[dict], category: str = "overall") -> float | None:
    return next((r["accept_length"] for r in rows if r["policy"] == "full" and r["category"] == category), None)


def overall_table(result: dict) -> list[str]:
    """Markdown lines: each config over all prompts, its accept length also as a fraction of ``full``'s, beside
    the oracle draft's (when it ran), then that fraction per category."""
    overall = [r for r in result["rows"] if r["category"] == "overall"]
    full = full_length(result["rows"])
    if not full:
        return []
    oracle = result.get("oracle")
    o_rows, o_full = oracle_overall(result)
    o_head = ("| oracle: accept length | of full | coverage ", "---:|---:|---:|") if o_full else ("", "")

    def o_cells(name: str) -> str:
        if not o_full:
            return ""
        r = o_rows[name]
        return f"| {r['accept_length']:.2f} | {r['accept_length'] / o_full:.1%} | {r['coverage']:.3f} "

    lines = [
        "| config | policy | accept length | of full | coverage | mean set " + o_head[0] + "|",
        "|---|---|---:|---:|---:|---:|" + o_head[1],
        *(
            f"| {r['config']} | {r['policy']} | {r['accept_length']:.2f} | {r['accept_length'] / full:.1%} "
            f"| {r['coverage']:.3f} | {r['mean_set_size']:,.0f} " + o_cells(r["config"]) + "|"
            for r in overall
        ),
        "",
    ]
    lines += category_fractions(result["rows"], result["draft"])
    if o_full:
        lines += category_fractions(oracle["rows"], "oracle (the target drafting for itself)")
    return lines + ["Per category:", ""]


def fractions(rows: list[dict]) -> dict[str, dict[str, float]]:
    """config -> category -> accept length as a fraction of full's in that category."""
    full = {r["category"]: r["accept_length"] for r in rows if r["policy"] == "full"}
    out: dict[str, dict[str, float]] = {}
    for r in rows:
        if full.get(r["category"]):
            out.setdefault(r["config"], {})[r["category"]] = r["accept_length"] / full[r["category"]]
    return out


def category_fractions(rows: list[dict], draft: str) -> list[str]:
    """Markdown lines: fraction of full per config and category, and each config's lowest category."""
    frac = fractions(rows)
    cats = [c for c in dict.fromkeys(r["category"] for r in rows) if c != "overall"]
    if not frac or not cats:
        return []
    return [
        f"Accept length as a fraction of full's in the same category, draft: {draft}:",
        "",
        "| config | " + " | ".join(cats) + " | lowest |",
        "|---|" + "---:|" * (len(cats) + 1),
        *(
            f"| {name} | "
            + " | ".join(f"{by[c]:.1%}" if c in by else "-" for c in cats)
            + f" | {min(by[c] for c in cats if c in by):.1%} |"
            for name, by in frac.items()
        ),
        "",
    ]


def plot(result: dict, path: Path) -> None:
    """Left: coverage against mean set size; right: accept length as a fraction of full's against mean set size,
    filled for the run's draft, hollow for the oracle draft (when it ran). One marker and colour per config, the
    legend below the panels."""
    import matplotlib  # optional: the plot needs matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # optional: the plot needs matplotlib
    from matplotlib.lines import Line2D
    from matplotlib.ticker import PercentFormatter

    overall = [r for r in result["rows"] if r["category"] == "overall"]
    o_rows, o_full = oracle_overall(result)
    full = full_length(result["rows"])
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12.0, 5.0))
    markers = "osD^vP*Xhp<>"
    handles, kept = [], []
    for i, r in enumerate(overall):
        style = dict(marker=markers[i % len(markers)], color=plt.cm.tab10(i % 10))
        ax.scatter(r["mean_set_size"], r["coverage"], s=60, **style)
        ax.annotate(r["config"], (r["mean_set_size"], r["coverage"]), textcoords="offset points", xytext=(6, 4))
        label = f"{r['config']} ({r['policy']}): mean set {r['mean_set_size']:,.0f} ids, coverage {r['coverage']:.3f}"
        if full:
            kept.append(r["accept_length"] / full)
            bx.scatter(r["mean_set_size"], kept[-1], s=60, **style)
            bx.annotate(r["config"], (r["mean_set_size"], kept[-1]), textcoords="offset points", xytext=(6, 4))
            label += f", keeps {kept[-1]:.1%}"
        if o_full and r["config"] in o_rows:
            o = o_rows[r["config"]]
            kept.append(o["accept_length"] / o_full)
            bx.scatter(o["mean_set_size"], kept[-1], s=60, facecolors="none", edgecolors=style["color"],
                       marker=style["marker"])  # fmt: skip
            label += f" ({kept[-1]:.1%} with the oracle)"
        handles.append(Line2D([], [], linestyle="", markersize=7, label=label, **style))
    lowest = min((r["coverage"] for r in overall), default=0.0)
    ax.set_ylim(max(0.0, lowest - 0.05), 1.01)
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_ylabel("coverage: target tokens in the set")
    ax.set_title("What the set holds")
    bx.axhline(1.0, color="grey", lw=0.8)
    # at least 90-105 %, so a round's noise does not read as a cliff
    bx.set_ylim(min([0.9, *kept]) - 0.02, max([1.05, *kept]) + 0.02)
    bx.yaxis.set_major_formatter(PercentFormatter(1.0))
    bx.set_ylabel("accept length, % of full's (same draft)")
    bx.set_title("What the draft keeps")
    if o_full:
        handles += [
            Line2D([], [], linestyle="", marker="o", color="k", label=f"filled: {result['draft']}"),
            Line2D([], [], linestyle="", marker="o", markerfacecolor="none", color="k",
                   label="hollow: the oracle draft (the target itself: the set's cost alone)"),
        ]  # fmt: skip
    for a in (ax, bx):
        a.set_xscale("log")
        a.set_xlabel(f"mean candidate-set size (ids, log scale; the full head: {result['vocab_size']:,})")
        a.grid(True, which="both", alpha=0.3)
    fig.suptitle(f"{result['model']}: {sampling_label(result)}, at most {result['max_new_tokens']} tokens per turn")
    fig.legend(handles=handles, fontsize=8, loc="lower center", ncol=1, frameon=False)
    fig.tight_layout(rect=(0, 0.035 * (len(handles) + 1), 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write(result: dict, out_dir: Path, stem: str = "lab") -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{stem}.json", out_dir / f"{stem}.md", out_dir / f"{stem}.png"]
    paths[0].write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    paths[1].write_text(markdown(result), encoding="utf-8")
    plot(result, paths[2])
    return paths

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
        return f"{head}, fit on {rec['draft']} states ({rec['source']}, {rec['prompts']} {docs}{fit})"
    return f"{head} was fit on {model}{rec['draft']} states, this run drafts with {t['draft']}"


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
    tail = [""] + [f"- mismatch: {m}" for m in mismatches]
    return "\n".join(head + body + tail) + "\n"


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
    filled for the run's draft, hollow for the oracle draft (when it ran). One marker and colour per config."""
    import matplotlib  # optional: the plot needs matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # optional: the plot needs matplotlib

    overall = [r for r in result["rows"] if r["category"] == "overall"]
    o_rows, o_full = oracle_overall(result)
    full = full_length(result["rows"])
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13.0, 4.8))
    markers = "osD^vP*Xhp<>"
    for i, r in enumerate(overall):
        style = dict(marker=markers[i % len(markers)], color=plt.cm.tab20(i % 20))
        label = f"{r['config']}: coverage {r['coverage']:.3f}, accept length {r['accept_length']:.2f}"
        ax.scatter(r["mean_set_size"], r["coverage"], s=50, label=label, **style)
        ax.annotate(
            r["config"], (r["mean_set_size"], r["coverage"]), textcoords="offset points", xytext=(5, 4), fontsize=7
        )
        if full:
            bx.scatter(r["mean_set_size"], r["accept_length"] / full, s=50, **style)
            bx.annotate(
                r["config"],
                (r["mean_set_size"], r["accept_length"] / full),
                textcoords="offset points",
                xytext=(5, 4),
                fontsize=7,
            )
        if o_full and r["config"] in o_rows:
            o = o_rows[r["config"]]
            bx.scatter(
                o["mean_set_size"],
                o["accept_length"] / o_full,
                s=50,
                facecolors="none",
                edgecolors=style["color"],
                marker=style["marker"],
            )
    lowest = min((r["coverage"] for r in overall), default=0.0)
    ax.set_ylim(max(0.0, lowest - 0.1), 1.02)
    ax.set_ylabel("coverage (target tokens in the set)")
    ax.set_title(f"Coverage vs set size: {result['model']}")
    bx.axhline(1.0, color="grey", lw=0.8)
    bx.set_ylabel("accept length / full's")
    what = "filled: draft " + result["draft"] + ("; hollow: oracle draft (the target)" if o_full else "")
    bx.set_title(what, fontsize=8)
    for a in (ax, bx):
        a.set_xscale("log")
        a.set_xlabel("mean active-set size (tokens, log scale)")
        a.grid(True, which="both", alpha=0.3)
    fig.legend(fontsize=7, loc="center left", bbox_to_anchor=(0.80, 0.5))
    fig.tight_layout(rect=(0, 0, 0.79, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write(result: dict, out_dir: Path, stem: str = "lab") -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{stem}.json", out_dir / f"{stem}.md", out_dir / f"{stem}.png"]
    paths[0].write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    paths[1].write_text(markdown(result), encoding="utf-8")
    plot(result, paths[2])
    return paths

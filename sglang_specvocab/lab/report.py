"""Lab results as JSON, Markdown and a plot of coverage against set size."""

from __future__ import annotations

import json
from pathlib import Path


def trained_label(name: str, t: dict) -> str:
    """One config's trained file as the report says it."""
    rec, head = t["recording"], f"{name}: {t['what']} {Path(t['file']).name}"
    if rec is None:
        return f"{head}, fit on unrecorded states (a file of an earlier version)"
    model = "" if rec.get("model") == t["model"] else f"{rec.get('model')} "  # named only when it differs
    if t["matches"]:
        return f"{head}, fit on {rec['draft']} states ({rec['source']}, {rec['prompts']} ShareGPT conversations)"
    return f"{head} was fit on {model}{rec['draft']} states, this run drafts with {t['draft']}"


def markdown(result: dict) -> str:
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
        + f"; at most {result['max_new_tokens']} new tokens, greedy",
        f"- lossless (every config produced the same tokens): {'yes' if result['lossless'] else 'NO'}",
        *(
            ["- trained files: " + "; ".join(trained_label(n, t) for n, t in result["trained_on"].items())]
            if result.get("trained_on")
            else []
        ),
        *([] if result["complete"] else ["- INTERRUPTED: the table covers only the turns that finished"]),
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
    tail = [""] + [f"- mismatch: {m}" for m in result["mismatches"]]
    return "\n".join(head + body + tail) + "\n"


def overall_table(result: dict) -> list[str]:
    """Markdown lines: each config over all prompts, its accept length also as a fraction of ``full``'s."""
    overall = [r for r in result["rows"] if r["category"] == "overall"]
    full = next((r["accept_length"] for r in overall if r["policy"] == "full"), None)
    if not full:
        return []
    lines = [
        "| config | policy | accept length | of full | coverage | mean set |",
        "|---|---|---:|---:|---:|---:|",
        *(
            f"| {r['config']} | {r['policy']} | {r['accept_length']:.2f} | {r['accept_length'] / full:.1%} "
            f"| {r['coverage']:.3f} | {r['mean_set_size']:,.0f} |"
            for r in overall
        ),
        "",
        "Per category:",
        "",
    ]
    return lines


def plot(result: dict, path: Path) -> None:
    import matplotlib  # optional: the plot needs matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # optional: the plot needs matplotlib

    overall = [r for r in result["rows"] if r["category"] == "overall"]
    fig, ax = plt.subplots(figsize=(9.6, 4.8))
    markers = "osD^vP*Xhp<>"
    for i, r in enumerate(overall):  # a marker and colour per config; names beside the points
        label = f"{r['config']}: coverage {r['coverage']:.3f}, accept length {r['accept_length']:.2f}"
        ax.scatter(
            r["mean_set_size"],
            r["coverage"],
            s=50,
            label=label,
            marker=markers[i % len(markers)],
            color=plt.cm.tab20(i % 20),
        )
        ax.annotate(
            r["config"], (r["mean_set_size"], r["coverage"]), textcoords="offset points", xytext=(5, 4), fontsize=7
        )
    ax.set_xscale("log")
    lowest = min((r["coverage"] for r in overall), default=0.0)
    ax.set_ylim(max(0.0, lowest - 0.1), 1.02)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_xlabel("mean active-set size (tokens, log scale)")
    ax.set_ylabel("coverage (target tokens in the set)")
    ax.set_title(f"Coverage vs set size: {result['model']}")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write(result: dict, out_dir: Path, stem: str = "lab") -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{stem}.json", out_dir / f"{stem}.md", out_dir / f"{stem}.png"]
    paths[0].write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    paths[1].write_text(markdown(result), encoding="utf-8")
    plot(result, paths[2])
    return paths

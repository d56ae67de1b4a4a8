"""Spec-Bench results as a table: per configuration and category, and overall (JSON, Markdown, a plot).

Measured like Spec-Bench: a question's speed is its completion tokens over its time (turns summed);
a configuration's speed is the mean over questions; speedup = mean speed / mean speed of the first
configuration, over the questions both finished; accepted length = completion tokens / verify
steps, summed over the category (1 for ``algorithm: none``; empty when a speculative server reports
no ``spec_verify_ct``). The DYNVOCAB columns are the mean over requests of each request's value.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..prompts import Question
from .server import TELEMETRY, ServerConfig, fmt


def summarize(configs: list[ServerConfig], questions: list[Question], records: dict[str, list[dict]]) -> list[dict]:
    """One row per configuration and category (then ``overall``) over the questions whose turns all finished."""
    turns_of = {q.qid: len(q.turns) for q in questions}
    categories = list(dict.fromkeys(q.category for q in questions))
    per_question: dict[str, dict[str, list[dict]]] = {}
    for c in configs:
        by_q: dict[str, list[dict]] = {}
        for r in records.get(c.name, []):
            by_q.setdefault(r["question_id"], []).append(r)
        per_question[c.name] = {qid: rs for qid, rs in by_q.items() if len(rs) == turns_of.get(qid)}
    category_of = {q.qid: q.category for q in questions}

    def speeds(name: str, category: str) -> dict[str, float]:
        out = {}
        for qid, rs in per_question[name].items():
            if category in ("overall", category_of[qid]):
                seconds = sum(r["time_s"] for r in rs)
                out[qid] = sum(r["completion_tokens"] for r in rs) / seconds if seconds > 0 else 0.0
        return out

    base = configs[0]
    rows = []
    for category in [*categories, "overall"]:
        base_speed = speeds(base.name, category)
        for c in configs:
            speed = speeds(c.name, category)
            if not speed:
                continue
            turns = [r for qid in speed for r in per_question[c.name][qid]]
            tokens = sum(r["completion_tokens"] for r in turns)
            verify = sum(r["spec_verify_ct"] or 0 for r in turns)
            if verify > 0:
                accept = tokens / verify
            elif c.algorithm == "none":
                accept = 1.0  # one token per forward pass
            else:
                accept = None
            common = [qid for qid in speed if qid in base_speed]
            if c is base:
                speedup = 1.0
            elif common and sum(base_speed[q] for q in common) > 0:
                speedup = (sum(speed[q] for q in common) / len(common)) / (
                    sum(base_speed[q] for q in common) / len(common)
                )
            else:
                speedup = None
            row = {
                "config": c.name,
                "algorithm": c.algorithm,
                "category": category,
                "tokens_per_s": sum(speed.values()) / len(speed),
                "accept_length": accept,
                "speedup": speedup,
                "n": len(speed),
            }
            for name in TELEMETRY:
                values = [r[name] for r in turns if name in r]
                if values:
                    row[name] = sum(values) / len(values)
            rows.append(row)
    return rows


def markdown(result: dict) -> str:
    runs = result["runs"]
    telemetry = [name for name in TELEMETRY if any(name in r for r in runs)]
    base = runs[0]["config"] if runs else "-"
    head = [
        "# Spec-Bench on SGLang",
        "",
        f"- device: {result['device']}",
        "- versions: " + ", ".join(f"{k} {v}" for k, v in result["versions"].items()),
        (
            f"- concurrency {result['concurrency']}, temperature {result['temperature']:g}; speedup over `{base}` "
            "(ratio of mean per-question tokens/s); accept length = completion tokens / verify steps"
        ),
        f"- command: `{result['command']}`",
        "",
        "| config | algorithm | category | tokens/s | accept length | speedup | questions |"
        + "".join(f" {n.replace('dynvocab_', 'dynvocab ').replace('_', ' ')} |" for n in telemetry),
        "|---|---|---|---:|---:|---:|---:|" + "---:|" * len(telemetry),
    ]
    body = [
        f"| {r['config']} | {r['algorithm']} | {r['category']} | {r['tokens_per_s']:.2f} "
        f"| {fmt(r['accept_length'], '.2f')} | {fmt(r['speedup'], '.3f')} | {r['n']} |"
        + "".join(f" {fmt(r.get(n), ',.0f' if n.endswith('set_size') else '.3f')} |" for n in telemetry)
        for r in runs
    ]
    return "\n".join(head + body) + "\n"


def plot(result: dict, path: Path) -> bool:
    """Speedup per category, one bar per configuration (the baseline is the line at 1)."""
    try:
        import matplotlib  # optional: the plot needs matplotlib
    except ImportError:
        print("matplotlib is not installed: no plot", file=sys.stderr)
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # optional: the plot needs matplotlib

    runs = result["runs"]
    configs = list(dict.fromkeys(r["config"] for r in runs))
    shown = configs[1:] or configs
    categories = list(dict.fromkeys(r["category"] for r in runs))
    value = {(r["config"], r["category"]): r["speedup"] for r in runs}
    fig, ax = plt.subplots(figsize=(max(6.4, 1.1 * len(categories) * max(1, len(shown)) ** 0.5 + 2), 4.4))
    width = 0.8 / max(1, len(shown))
    for i, name in enumerate(shown):
        xs = [j + (i - (len(shown) - 1) / 2) * width for j in range(len(categories))]
        ys = [value.get((name, c)) or 0.0 for c in categories]
        bars = ax.bar(xs, ys, width, label=name, color=plt.cm.tab10(i % 10))
        ax.bar_label(bars, labels=[f"{y:.2f}" if y else "" for y in ys], fontsize=6, padding=1)
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_xticks(range(len(categories)), categories, rotation=20, ha="right")
    ax.set_ylabel(f"speedup over {configs[0]}" if configs else "speedup")
    ax.set_title(
        f"Spec-Bench speedup ({result['device']}, concurrency {result['concurrency']}, "
        f"temperature {result['temperature']:g})",
        fontsize=9,
    )
    ax.legend(fontsize=7)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def write_report(result: dict, out_dir: Path, stem: str = "specbench") -> list[Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{stem}.json", out_dir / f"{stem}.md"]
    paths[0].write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    paths[1].write_text(markdown(result), encoding="utf-8")
    if plot(result, out_dir / f"{stem}.png"):
        paths.append(out_dir / f"{stem}.png")
    return paths

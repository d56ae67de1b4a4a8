"""``sglang-specvocab report-eagle3``: the training record of EAGLE-3 drafts as JSON, Markdown and a plot.

Reads the ``training.json`` that ``train-eagle3`` writes beside each draft (command, data, timings,
the KL of every step, the held-out validation at each check) and writes OUT.json (those records,
without the per-step training top-1), OUT.md (a table per draft) and OUT.png (KL per step,
smoothed; validation accept length against steps).
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

from ...errors import SpecVocabError


def summary(path: Path) -> dict:
    """One draft's record: what its ``training.json`` says about the run."""
    try:
        t = json.loads((Path(path) / "training.json").read_text())
        head = t["args"]["head"]
        loss = t["loss"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SpecVocabError(f"{path}: no readable training.json from train-eagle3 ({exc})") from None
    keys = (
        "command",
        "sequences",
        "tokens",
        "data_source",
        "seconds",
        "data_seconds",
        "data_cpu_seconds",
        "train_seconds",
        "train_cpu_seconds",
        "threads",
        "versions",
        "machine",
    )
    args = t["args"]
    names = (
        "steps",
        "batch_size",
        "lr",
        "warmup",
        "lr_floor",
        "step_weight",
        "fc_norm",
        "seq_len",
        "ttt_steps",
        "init",
    )
    settings = {k: args.get(k) for k in names if k in args}  # drafts of earlier versions lack the recipe's switches
    return {
        "draft": Path(path).name,
        "head": head,
        **{k: t.get(k) for k in keys},
        "args": args,
        "probe": t.get("probe"),
        "settings": settings,
        "loss": loss,
        "validation": t.get("validation", []),
    }


def machine() -> dict:
    """Where a run happens: OS, CPU model and cores."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"platform": platform.platform(), "cpu": cpu, "cores": os.cpu_count()}


def smooth(xs: list[float], n: int) -> list[float]:
    """Trailing mean over ``n`` values (fewer at the start)."""
    out, acc = [], 0.0
    for i, x in enumerate(xs):
        acc += x
        if i >= n:
            acc -= xs[i - n]
        out.append(acc / min(i + 1, n))
    return out


def _fmt(x, digits: int = 0) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


# Options that name files or the run, not the recipe: a comparison leaves them out.
NOT_RECIPE = ("out", "command_line", "resume_state", "init_from", "data", "val_data", "states", "log_every")


def comparison(runs: list[dict]) -> list[str]:
    """Several drafts: one row each against the first (the baseline): the options it changed, the validation
    accept length at the last check and its change, the training rate the probe measured."""
    if len(runs) < 2:
        return []
    base = runs[0]
    lines = [
        f"## Against the baseline ({base['draft']})",
        "",
        "| draft | options changed | steps x batch | accept length (last check) | change | train tokens/s |",
        "|---|---|---:|---:|---:|---:|",
    ]
    first = base["validation"][-1]["accept_length"] if base["validation"] else float("nan")
    for r in runs:
        changed = [
            f"{k} {r['args'].get(k)}"
            for k in r["args"]
            if k not in NOT_RECIPE and r["args"].get(k) != base["args"].get(k)
        ]
        last = r["validation"][-1]["accept_length"] if r["validation"] else float("nan")
        rate = (r.get("probe") or {}).get("tokens_per_s")
        lines.append(
            f"| {r['draft']} | {', '.join(changed) or '-'} | {r['settings']['steps']} x {r['settings']['batch_size']} "
            f"| {last:.3f} | {last - first:+.3f} | {_fmt(rate)} |"
        )
    return [*lines, ""]


def markdown(runs: list[dict]) -> str:
    lines = ["# EAGLE-3 draft training", "", *comparison(runs)]
    for r in runs:
        val = r["validation"]
        k = max(1, len(r["loss"]) // 10)
        lines += [
            f"## {r['draft']} ({r['head']} head)",
            "",
            f"- command: `{r['command']}`",
            f"- data: {r['sequences']} sequences, {_fmt(r['tokens'])} tokens ({r['data_source']})",
            "- settings: " + ", ".join(f"{k_} {v}" for k_, v in r["settings"].items()),
            (
                f"- time: {_fmt(r['train_seconds'])} s training ({_fmt(r['train_cpu_seconds'])} CPU-s, "
                f"{r['threads']} threads), {_fmt(r['seconds'])} s in all (data and states "
                f"{_fmt(r['data_seconds'])} s, {_fmt(r['data_cpu_seconds'])} CPU-s)"
            ),
            "- machine: " + ", ".join(f"{k_} {v}" for k_, v in (r.get("machine") or {}).items()),
            "- versions: " + ", ".join(f"{k_} {v}" for k_, v in (r.get("versions") or {}).items()),
            (
                f"- KL (mean over TTT passes): first {k} steps {sum(r['loss'][:k]) / k:.3f}, "
                f"last {k} steps {sum(r['loss'][-k:]) / k:.3f}"
            ),
            "",
            "| step | validation accept length (chain) | top-1 agreement per draft step | positions |",
            "|---:|---:|---|---:|",
        ]
        for v in val:
            acc = ", ".join(f"{a:.3f}" for a in v["accuracy"])
            lines.append(f"| {v['step']} | {v['accept_length']:.3f} | {acc} | {v['rows']} |")
        lines.append("")
    return "\n".join(lines)


def plot(runs: list[dict], path: Path) -> None:
    import matplotlib  # heavy: matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # heavy: matplotlib

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for r in runs:
        n = max(1, len(r["loss"]) // 20)
        ax1.plot(range(1, len(r["loss"]) + 1), r["loss"], alpha=0.25, color="gray")
        ax1.plot(range(1, len(r["loss"]) + 1), smooth(r["loss"], n), label=f"{r['draft']} (mean of {n} steps)")
        if r["validation"]:
            v = r["validation"]
            ax2.plot([x["step"] for x in v], [x["accept_length"] for x in v], marker="o", label=r["draft"])
    ax1.set(xlabel="step", ylabel="KL(target || draft), mean over TTT passes", title="training loss")
    steps = {r["settings"].get("ttt_steps") for r in runs}
    chain = steps.pop() if len(steps) == 1 else "TTT steps"
    ax2.set(xlabel="step", ylabel=f"accept length (greedy chain of {chain})", title="held-out target answers")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:  # no validation: nothing to label on the right
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(args) -> int:
    runs = [summary(d) for d in args.drafts]
    for r in runs:
        if not r["machine"]:  # drafts trained before training.json recorded it: this machine, said so
            r["machine"] = {**machine(), "recorded": "at report time"}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    paths = [out.with_suffix(s) for s in (".json", ".md", ".png")]
    paths[0].write_text(json.dumps({"drafts": runs, "command": args.command_line}, indent=1) + "\n")
    paths[1].write_text(markdown(runs))
    plot(runs, paths[2])
    print("wrote " + ", ".join(map(str, paths)))
    return 0

"""Spec-Bench results as a table: per configuration and category, and overall (JSON, Markdown, a plot).

Measured like Spec-Bench: a question's speed is its completion tokens over its time (turns summed);
a configuration's speed is the mean over questions; speedup = mean speed / mean speed of the first
configuration, over the questions both finished; accepted length = completion tokens / verify
steps, summed over the category (1 for ``algorithm: none``; empty when a speculative server reports
no ``spec_verify_ct``). The DYNVOCAB columns are the mean over requests of each request's value.

Greedy parity (``parity``, temperature 0 only): every configuration's turns are compared as text with
the reference (the first configuration) and a DYNVOCAB configuration's also with its EAGLE3 control
(``lossless.controls``: same target, draft and tree arguments). A turn after a differing turn of the
same question is not comparable (its prompt holds the configuration's own earlier answer). A DYNVOCAB
turn that equals neither the target nor its control, where comparable (without a control: that
differs from the target), is ours: ``parity_ok`` is false. At temperature > 0 nothing is compared.
Each differing turn is named by its first differing character (with the text around it) and, where both
turns recorded their ``output_ids``, its first differing token: the index in the output, both ids and
their decoded text.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

from ...cache import write_whole
from ..prompts import Question
from .lossless import controls
from .server import TELEMETRY, ServerConfig, fmt
from .specbench_targets import targets_markdown, token_words

#: Characters of each text shown around the first difference.
EXCERPT = 40
#: Differing turns listed in the Markdown per comparison (the JSON lists all).
SHOWN_DIFFERENCES = 20

Decode = Callable[[int], str | None]  # a token id's text


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


# --- greedy parity -----------------------------------------------------------------------------


def _first_difference(a, b) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def first_token_difference(got: dict, want: dict, decode: Decode | None = None) -> dict | None:
    """Where two turns' output token ids first differ: ``index`` in the output, each side's id (None where
    that output ended first) and its decoded text (None without ``decode``); ``index`` None when the ids are
    the same (the texts differ in their detokenization); None when a record has no ``output_ids`` (a cache
    written before they were recorded)."""
    a, b = got.get("output_ids"), want.get("output_ids")
    if not isinstance(a, list) or not isinstance(b, list):
        return None
    if a == b:
        return dict.fromkeys(("index", "expected_id", "got_id", "expected_text", "got_text"))
    at = _first_difference(a, b)
    ids = {"expected_id": b[at] if at < len(b) else None, "got_id": a[at] if at < len(a) else None}
    out = {"index": at, **ids}
    for side in ("expected", "got"):
        token = ids[f"{side}_id"]
        out[f"{side}_text"] = decode(token) if decode is not None and token is not None else None
    return out


def _compare(
    got: dict[tuple[str, int], dict],
    want: dict[tuple[str, int], dict],
    against: str,
    questions: list[Question],
    decode: Decode | None = None,
) -> tuple[dict, dict[tuple[str, int], str]]:
    """One configuration's turns against another's: the counts, the differing turns (the first differing
    character and token) and each turn's status (identical, differs, not_comparable: an earlier turn of its
    question differed, missing)."""
    out = {
        "against": against,
        "compared": 0,
        "identical": 0,
        "differing": 0,
        "not_comparable": 0,  # an earlier turn of the question differed: the prompts differ
        "missing": 0,
        "differences": [],
    }
    status: dict[tuple[str, int], str] = {}
    for q in questions:
        differed = False
        for turn in range(len(q.turns)):
            key = (q.qid, turn)
            a, b = got.get(key), want.get(key)
            if a is None or b is None:
                state = "missing"
            elif differed:
                state = "not_comparable"
            elif a["text"] == b["text"]:
                state = "identical"
            else:
                state, differed = "differs", True
                at = _first_difference(a["text"], b["text"])
                lo = max(0, at - EXCERPT // 2)
                out["differences"].append(
                    {
                        "question_id": q.qid,
                        "category": q.category,
                        "turn": turn + 1,
                        "char": at,
                        "expected": b["text"][lo : lo + EXCERPT],  # the text compared with (reference, control)
                        "got": a["text"][lo : lo + EXCERPT],
                        "token": first_token_difference(a, b, decode),
                    }
                )
            status[key] = state
            out["compared"] += state in ("identical", "differs")
            out["identical"] += state == "identical"
            out["differing"] += state == "differs"
            out["not_comparable"] += state == "not_comparable"
            out["missing"] += state == "missing"
    return out, status


def _turns(n: int) -> str:
    return f"{n} turn{'' if n == 1 else 's'}"


def _verdict(reference: dict | None, control: dict | None, ours: int) -> str:
    if ours:
        if control is not None:
            return f"differs from its control on {_turns(ours)}"
        return f"differs from the target on {_turns(ours)} (no EAGLE3 control)"
    if reference is None:  # the reference itself
        return "identical to EAGLE3 (its control)" if control is not None else "the reference: nothing compared"
    if reference["compared"] == 0:
        return "nothing compared"
    if reference["differing"] == 0:
        return "identical to the target"
    # every turn that differs from the target equals the control (else it would be ours)
    n = _turns(reference["differing"])
    if control is None or control["differing"] == 0:
        return f"identical to EAGLE3 (its control), differs from the target on {n}: the engine's numerics"
    return (
        f"differs from the target on {n}, each identical to EAGLE3 (its control): the engine's numerics; "
        f"differs from its control on {_turns(control['differing'])}, each identical to the target"
    )


def parity(
    configs: list[ServerConfig],
    questions: list[Question],
    records: dict[str, list[dict]],
    temperature: float,
    pairs: dict[str, str | None] | None = None,
    decode: Decode | None = None,
) -> dict:
    """Greedy outputs compared across configurations (see the module doc); ``pairs``: ``controls(configs)``;
    ``decode``: a token id's text (the first differing token of each difference)."""
    if temperature > 0:
        return {"compared": False, "reason": "sampled", "temperature": temperature, "parity_ok": None}
    if pairs is None:
        pairs = controls(configs)
    ref = configs[0]
    texts = {c.name: {(r["question_id"], r["turn"]): r for r in records.get(c.name, [])} for c in configs}
    rows = []
    for c in configs:
        ctl = pairs.get(c.name) if c.algorithm == "DYNVOCAB" else None
        if c is ref and ctl is None:
            continue
        vs_ref = vs_ctl = None
        st_ref: dict = {}
        st_ctl: dict = {}
        if c is not ref:
            vs_ref, st_ref = _compare(texts[c.name], texts[ref.name], ref.name, questions, decode)
        if ctl is not None:
            vs_ctl, st_ctl = _compare(texts[c.name], texts[ctl], ctl, questions, decode)
        row = {
            "config": c.name,
            "algorithm": c.algorithm,
            "control": ctl,
            "against_reference": vs_ref,
            "against_control": vs_ctl,
        }
        if c.algorithm == "DYNVOCAB":
            # ours: comparable with the target or the control, and identical to neither
            ours = [
                {"question_id": q.qid, "category": q.category, "turn": t + 1}
                for q in questions
                for t in range(len(q.turns))
                if {st_ref.get((q.qid, t)), st_ctl.get((q.qid, t))} & {"identical", "differs"}
                and "identical" not in (st_ref.get((q.qid, t)), st_ctl.get((q.qid, t)))
            ]
            row["ours"] = len(ours)
            row["ours_turns"] = ours
            row["verdict"] = _verdict(vs_ref, vs_ctl, len(ours))
        rows.append(row)
    return {
        "compared": True,
        "reference": ref.name,
        "configs": rows,
        "parity_ok": all(r.get("ours", 0) == 0 for r in rows),
    }


def parity_markdown(section: dict | None) -> list[str]:
    if section is None:
        return []
    lines = ["", "## Greedy parity", ""]
    if not section["compared"]:
        return lines + [f"not compared: sampled (temperature {section['temperature']:g})"]
    ref = section["reference"]
    lines += [
        (
            f"Each configuration's text, turn by turn, against the reference `{ref}` (the first configuration) "
            "and, for a DYNVOCAB configuration, against its EAGLE3 control (same target, draft and tree "
            "arguments). A turn-2 prompt holds the configuration's own turn-1 answer: after a differing turn, "
            "the question's later turns are not comparable."
        ),
        "",
        (
            "**parity ok: no DYNVOCAB turn differs from both its control and the target**"
            if section["parity_ok"]
            else "**parity FAILED: a DYNVOCAB turn differs from its control and the target (or, without a "
            "control, from the target)**"
        ),
    ]
    rows = section["configs"]
    verdicts = [r for r in rows if "verdict" in r]
    if verdicts:
        lines += ["", *(f"- `{r['config']}`: {r['verdict']}" for r in verdicts)]
    comparisons = [
        (r, role, cmp)
        for r in rows
        for role, cmp in (("reference", r["against_reference"]), ("control", r["against_control"]))
        if cmp is not None
    ]
    if not comparisons:
        return lines
    missing = any(cmp["missing"] for _, _, cmp in comparisons)
    lines += [
        "",
        "| config | algorithm | against | compared | identical | differing | not comparable (earlier turn differed) |"
        + (" missing |" if missing else ""),
        "|---|---|---|---:|---:|---:|---:|" + ("---:|" if missing else ""),
    ]
    for r, role, cmp in comparisons:
        lines.append(
            f"| {r['config']} | {r['algorithm']} | {cmp['against']} ({role}) | {cmp['compared']} | {cmp['identical']} "
            f"| {cmp['differing']} | {cmp['not_comparable']} |" + (f" {cmp['missing']} |" if missing else "")
        )
    for r, role, cmp in comparisons:
        diffs = cmp["differences"]
        if not diffs:
            continue
        lines += [
            "",
            f"`{r['config']}` against `{cmp['against']}` ({role}): the first differing character, "
            + f"{EXCERPT} characters around it, and the first differing token (its index in the output, id and text):",
            "",
        ]
        for d in diffs[:SHOWN_DIFFERENCES]:
            lines.append(
                f"- question {d['question_id']} ({d['category']}) turn {d['turn']}, char {d['char']}: "
                f"{cmp['against']} {d['expected']!r} / {r['config']} {d['got']!r}; "
                + token_words(d.get("token"), cmp["against"], r["config"])
            )
        if len(diffs) > SHOWN_DIFFERENCES:
            lines.append(f"- and {len(diffs) - SHOWN_DIFFERENCES} more (all in the JSON)")
    return lines


def parity_failures(section: dict | None) -> list[str]:
    """One line per DYNVOCAB configuration that fails greedy parity (empty: none, or not compared)."""
    if not section or not section["compared"]:
        return []
    return [f"{r['config']}: {r['verdict']}" for r in section["configs"] if r.get("ours")]


def partial_line(result: dict) -> str | None:
    """The Markdown's first line when the result is partial: PARTIAL, and what is missing and why."""
    if not result.get("partial"):
        return None
    missing = "; ".join(
        f"{m['config']} ({m['why']}; {m['turns_missing']} of {m['turns']} turns missing)" for m in result["missing"]
    )
    return f"**PARTIAL** at concurrency {result['concurrency']}: missing {missing}"


def budget_markdown(budget: dict | None) -> list[str]:
    if not budget:
        return []
    return ["", f"## Time budget ({budget['time_budget_s']:g} s)", "", *(f"- {d}" for d in budget["decisions"])]


def markdown(result: dict) -> str:
    runs = result["runs"]
    telemetry = [name for name in TELEMETRY if any(name in r for r in runs)]
    base = runs[0]["config"] if runs else "-"
    partial = partial_line(result)
    head = [
        *([partial, ""] if partial else []),
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
    tail = (
        parity_markdown(result.get("parity"))
        + targets_markdown(result.get("targets"))
        + budget_markdown(result.get("budget"))
    )
    return "\n".join(head + body + tail) + "\n"


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
    fig.savefig(path, dpi=120, format="png")
    plt.close(fig)
    return True


def write_report(result: dict, out_dir: Path, stem: str = "specbench") -> list[Path]:
    """OUT/STEM.json, .md and .png (without matplotlib or rows, no plot), each replaced atomically."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{stem}.json", out_dir / f"{stem}.md"]
    text = json.dumps(result, indent=2) + "\n"
    write_whole(paths[0], lambda p: p.write_text(text, encoding="utf-8"))
    write_whole(paths[1], lambda p: p.write_text(markdown(result), encoding="utf-8"))
    if result["runs"] and write_whole(out_dir / f"{stem}.png", lambda p: plot(result, p)):
        paths.append(out_dir / f"{stem}.png")
    return paths

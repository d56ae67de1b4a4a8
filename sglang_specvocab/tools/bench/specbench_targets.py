"""Spec-Bench's verdicts: each DYNVOCAB configuration against its EAGLE3 control, from what the run measured.

Two targets per DYNVOCAB configuration and concurrency (the report's ``targets``):

- ``speed``: its output tokens/s over its control's. Spec-Bench's speed, as in the table: per question,
  completion tokens / time (turns summed, the server's e2e latency), averaged over the questions both
  finished; the ratio of the two means, overall (judged) and per category (the worst is named). At
  concurrency > 1 this is per-request speed with that many requests in flight, not the server's total
  throughput (which the run does not time as a whole). Goal: ``SPEED_TARGETS`` (at least 1.15x at
  concurrency 1, at least 1.0x at 8); other concurrencies have none (the ratio is shown, ``met`` None).
- ``greedy parity`` (temperature 0): every DYNVOCAB output equal to its control's, turn by turn (a turn
  after a differing turn of its question is not comparable). The worst case is the differing turn whose
  outputs part earliest: its first differing token (index, both ids and their text) or, without recorded
  token ids, character. The logit gap between the two tokens there is not measured by this run
  (``gap`` None, "gap not measured").

``met``: True, False, or None when not measured (``why``: no EAGLE3 control, a side with no finished
question at this concurrency, sampled, no target at this concurrency).
"""

from __future__ import annotations

from ..prompts import Question
from .server import ServerConfig

#: Concurrency -> the least DYNVOCAB / EAGLE3 ratio of output tokens/s.
SPEED_TARGETS = {1: 1.15, 8: 1.0}
GAP_NOTE = "gap not measured"


def question_speeds(records: list[dict], questions: list[Question]) -> dict[str, float]:
    """Spec-Bench's speed of each question whose turns all finished (as ``summarize``): completion tokens /
    time, its turns summed."""
    turns_of = {q.qid: len(q.turns) for q in questions}
    by_q: dict[str, list[dict]] = {}
    for r in records:
        by_q.setdefault(r["question_id"], []).append(r)
    out = {}
    for qid, rs in by_q.items():
        if len(rs) == turns_of.get(qid):
            seconds = sum(r["time_s"] for r in rs)
            out[qid] = sum(r["completion_tokens"] for r in rs) / seconds if seconds > 0 else 0.0
    return out


def _ratio(ours: dict[str, float], ctl: dict[str, float], qids: list[str]) -> float | None:
    base = sum(ctl[q] for q in qids)
    return sum(ours[q] for q in qids) / base if qids and base > 0 else None


def speed_target(
    name: str, control: str | None, concurrency: int, questions: list[Question], records: dict[str, list[dict]]
) -> dict:
    """The speed target of DYNVOCAB ``name`` against ``control`` at ``concurrency`` (see the module doc)."""
    threshold = SPEED_TARGETS.get(concurrency)
    out = {
        "target": "speed",
        "config": name,
        "control": control,
        "concurrency": concurrency,
        "goal": None if threshold is None else f">= {threshold:g}x its control's output tokens/s",
        "threshold": threshold,
        "value": None,
        "questions": 0,
        "met": None,
        "worst": None,
        "why": None,
    }
    if control is None:
        return {**out, "why": "no EAGLE3 control"}
    ours, ctl = (question_speeds(records.get(n, []), questions) for n in (name, control))
    common = [q.qid for q in questions if q.qid in ours and q.qid in ctl]
    if not common:
        side = name if not ours else control
        return {**out, "why": f"{side} has no finished question at concurrency {concurrency}"}
    value = _ratio(ours, ctl, common)
    categories: dict[str, list[str]] = {}
    for q in questions:
        if q.qid in common:
            categories.setdefault(q.category, []).append(q.qid)
    ratios = [(r, cat, len(qids)) for cat, qids in categories.items() if (r := _ratio(ours, ctl, qids)) is not None]
    worst = min(ratios, default=None)
    out.update(value=value, questions=len(common))
    if worst is not None:
        out["worst"] = {"category": worst[1], "ratio": worst[0], "questions": worst[2]}
    if value is None:
        out["why"] = f"{control}'s speed is 0"
    elif threshold is None:
        out["why"] = f"no target at concurrency {concurrency}"
    else:
        out["met"] = value >= threshold
    return out


def parity_target(name: str, control: str | None, concurrency: int, parity: dict | None) -> dict:
    """The greedy parity target of DYNVOCAB ``name`` against its control, from the parity section."""
    out = {
        "target": "greedy parity",
        "config": name,
        "control": control,
        "concurrency": concurrency,
        "goal": "every output equal to its EAGLE3 control's",
        "value": None,
        "met": None,
        "worst": None,
        "gap": None,
        "gap_note": GAP_NOTE,
        "why": None,
    }
    if parity is None or not parity.get("compared"):
        return {**out, "why": "sampled (temperature > 0): nothing compared"}
    if control is None:
        return {**out, "why": "no EAGLE3 control"}
    row = next((r for r in parity["configs"] if r["config"] == name), None)
    cmp = None if row is None else row.get("against_control")
    if cmp is None:
        return {**out, "why": "no EAGLE3 control"}
    out["value"] = {k: cmp[k] for k in ("compared", "identical", "differing", "not_comparable", "missing")}
    if cmp["compared"] == 0:
        return {**out, "why": f"no turn of both at concurrency {concurrency}"}
    out["met"] = cmp["differing"] == 0
    if cmp["differences"]:

        def parts_at(d: dict) -> tuple:
            token = d.get("token") or {}
            index = token.get("index")
            return (index is None, index if index is not None else d["char"])

        out["worst"] = min(cmp["differences"], key=parts_at)
    return out


def targets(
    configs: list[ServerConfig],
    questions: list[Question],
    records: dict[str, list[dict]],
    concurrency: int,
    pairs: dict[str, str | None],
    parity: dict | None,
) -> list[dict]:
    """Every DYNVOCAB configuration's targets at ``concurrency``: speed, then greedy parity."""
    out = []
    for c in configs:
        if c.algorithm == "DYNVOCAB":
            control = pairs.get(c.name)
            out.append(speed_target(c.name, control, concurrency, questions, records))
            out.append(parity_target(c.name, control, concurrency, parity))
    return out


def token_words(token: dict | None, against: str, name: str) -> str:
    """A difference's first differing token in words (``specbench_report.first_token_difference``)."""
    if token is None:
        return "token ids not recorded"
    if token["index"] is None:
        return "the same token ids"

    def side(which: str) -> str:
        tid, text = token[f"{which}_id"], token[f"{which}_text"]
        if tid is None:
            return "(ended)"
        return f"{tid}" + ("" if text is None else f" {text!r}")

    return f"token {token['index']}: {against} {side('expected')} / {name} {side('got')}"


def _met(t: dict) -> str:
    if t["met"] is not None:
        return "yes" if t["met"] else "**NO**"
    if t["target"] == "speed" and t["threshold"] is None and t["value"] is not None:
        return "no target at this concurrency"
    return f"not measured: {t['why']}"


def _questions(n: int) -> str:
    return f"{n} question{'' if n == 1 else 's'}"


def _row(t: dict) -> str:
    if t["target"] == "speed":
        goal = "-" if t["threshold"] is None else f">= {t['threshold']:g}x"
        measured = "-" if t["value"] is None else f"{t['value']:.3f}x ({_questions(t['questions'])})"
        w = t["worst"]
        worst = "-" if w is None else f"{w['category']} {w['ratio']:.3f}x ({_questions(w['questions'])})"
    else:
        goal = "every output equal"
        v = t["value"]
        measured = "-" if v is None else f"{v['identical']} of {v['compared']} turns identical"
        if v is not None and (v["not_comparable"] or v["missing"]):
            measured += f" ({v['not_comparable']} not comparable, {v['missing']} missing)"
        d = t["worst"]
        worst = "-"
        if d is not None:
            where = f"question {d['question_id']} ({d['category']}) turn {d['turn']}"
            worst = f"{where}: {token_words(d.get('token'), t['control'], t['config'])} ({t['gap_note']})"
    control = t["control"] or "-"
    return f"| {t['target']} | {t['config']} | {control} | {goal} | {measured} | {_met(t)} | {worst} |"


def targets_markdown(section: list[dict] | None) -> list[str]:
    if not section:
        return []
    return [
        "",
        "## Targets",
        "",
        (
            "Each DYNVOCAB configuration against its EAGLE3 control, from what this run measured. speed: output "
            "tokens/s (Spec-Bench's mean per-question speed, over the questions both finished) over the "
            "control's, at least 1.15x at concurrency 1 and 1.0x at 8; greedy parity: every output equal to the "
            "control's, the worst case the turn whose outputs part earliest."
        ),
        "",
        "| target | config | control | goal | measured | met | worst case |",
        "|---|---|---|---|---|---|---|",
        *(_row(t) for t in section),
    ]

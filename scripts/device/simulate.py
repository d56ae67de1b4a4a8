"""A lease's plan played against the times measured so far (stage.py PHASE_S), before any GPU is lent.

Standard library only (it runs beside stage.py). For the plan of ``stage.py plan LEASE`` it answers, per scenario,
which phase of the working call ends, which is cut off, which is refused and which never starts, and how many
device seconds the lease spends:

- ``nominal``: every phase takes its planned time;
- ``lost before call N``: the machine went back before call N (over 30 s idle, or it failed): a new start, and the
  chunks carried before N are gone; the working call's own carry (its chunk and, for E, ``base``) is not;
- ``cut in PHASE``: the device stopped the working call halfway through PHASE (its time ran out: every phase that
  ended before it has already sent its results to $OUT, run.sh).

``problems`` says what breaks the lease's promises: the nominal plan must end every phase (Spec-Bench at
concurrency 1 on every server included) within the call's budget and the planned device seconds; a lost machine
must still bring the kernels' evidence (tests, bench) within the lent seconds; a cut-off must keep every phase that
ended before it. The CI test (tests/test_device_staging.py) fails when the work no longer fits.

The model of run.sh: phases in the command's order; ``+name`` runs in a background chain started where it is
listed; a phase that needs a background phase waits for it; a phase whose prerequisite did not pass, or whose
staged file is not on the machine, is refused at once; one that would start with less than NOT_STARTED_BELOW_S
left does not start; each ends by its own budget and the call's. Spec-Bench asks concurrency 1 of every server
first, and concurrency 8 of a running server only when the time left after it still covers concurrency 1 of
every server after it (``bench specbench --time-budget-s``).
"""

from __future__ import annotations

import re

import stage

NOT_STARTED_BELOW_S = 30  # run.sh MIN_START_S: a phase with less left than this is not started
STARTS_ON_LESS = ("debug",)  # run.sh min_start: it checks its time per crash itself
OPTIONAL = ("debug",)  # "if time is left": the nominal plan need not end it


def _seconds(name: str) -> int:
    return stage.PHASE_S[name][0]


def _budget(call: dict, phase: str) -> int | None:
    m = re.search(rf"SV_BUDGET_{phase}=(\d+)", call["command"])
    return int(m.group(1)) if m else None


def specbench(seconds: float, configs: list[str], levels: list[str]) -> tuple[list[str], list[str], float]:
    """Spec-Bench in ``seconds``: (servers asked at the first concurrency, servers asked at a later one, seconds
    used). A server starts only when its start and first concurrency fit; a later concurrency only when the time
    left after it covers the first concurrency of every server still to start."""
    first = _seconds("server_first")
    later = _seconds("server")
    c1, c8, stop = _seconds("turns_c1"), _seconds("turns_c8"), _seconds("server_stop")
    done1, done8, t = [], [], 0.0
    for i, name in enumerate(configs):
        start = first if i == 0 else later
        if t + start + c1 + stop > seconds:
            break
        t += start + c1
        done1.append(name)
        rest = (len(configs) - i - 1) * (later + c1 + stop)
        if len(levels) > 1 and t + c8 + stop + rest <= seconds:
            t += c8
            done8.append(name)
        t += stop
    return done1, done8, t


def play(plan: dict, lost_before: int | None = None, cut_in: str | None = None) -> dict:
    """One scenario: the device seconds spent and the working call's phases (state, start, end)."""
    *chunk_calls, work = plan["calls"]
    used = stage.START_S
    here: set[int] = set()  # the chunks on the machine
    for c in plan["calls"]:
        if lost_before == c["n"]:  # a new machine: a start, and nothing of the calls before
            used += stage.START_S
            here = set()
        used += c["planned_s"] if c in chunk_calls else 0  # the working call's own seconds: below
        here |= {int(p.split("-")[1]) for p in c["phases"] if p.startswith("chunk-")}
    limit = min(work["timeout_s"], stage.LENT_S - used - stage.WORK_TRANSFER_S)  # the device's limit_s
    out = _work_call(plan, work, here, min(work["budget_s"], limit), cut_in)
    out["device_s"] = used + min(limit, out["ended_s"] + stage.MARGIN_S) + stage.WORK_TRANSFER_S
    out["limit_s"] = limit
    out["scenario"] = (
        "nominal"
        if lost_before is None and cut_in is None
        else (f"lost before call {lost_before}" if lost_before is not None else f"cut in {cut_in}")
    )
    return out


def _missing(plan: dict, phase: str, here: set[int]) -> list[str]:
    """The staged files ``phase`` needs that are not whole on the machine."""
    files = plan["chunk_files"]
    wanted = []
    for w in stage.NEEDS[phase][1]:
        wanted += [f for f in files if f.startswith("gemma3_270m")] if w == "gguf" else [w]
    return [f for f in wanted if not set(files.get(f, [0])) <= here]


def _work_call(plan: dict, work: dict, here: set[int], budget: int, cut_in: str | None) -> dict:
    phases = [p for p in work["phases"] if not p.startswith("chunk-")]
    rows: dict[str, dict] = {}
    fg = float(_seconds("import"))
    bg = 0.0
    stop_at = None  # the device's stop, for cut_in: halfway through that phase
    for p in phases:
        name, background = p.lstrip("+"), p.startswith("+")
        now = max(bg, fg) if background else fg
        needs = stage.NEEDS[name][0]
        for n in needs:  # a phase that needs a background one waits for it
            if n in rows and rows[n]["background"] and rows[n]["state"] == "passed":
                now = max(now, rows[n]["end"])
        row = {"phase": name, "background": background, "start": now, "end": now}
        rows[name] = row
        if stop_at is not None and now >= stop_at:
            row["state"] = "not started"
        elif any(rows.get(n, {}).get("state") != "passed" for n in needs):
            row["state"] = "refused"
            row["why"] = "needs " + ", ".join(n for n in needs if rows.get(n, {}).get("state") != "passed")
        elif missing := _missing(plan, name, here):
            row["state"] = "refused"
            row["why"] = "not on the machine: " + ", ".join(missing)
        elif budget - now < (1 if name in STARTS_ON_LESS else NOT_STARTED_BELOW_S):
            row["state"] = "not started"
        else:
            left, ok = budget - now, True
            if name == "specbench":  # it ends itself within its time budget, with the servers that fit
                configs = re.search(r"SV_SPECBENCH_CONFIGS='([^']*)'", work["command"]).group(1).split()
                levels = re.search(r"SV_SPECBENCH_CONCURRENCY=([\d,]+)", work["command"]).group(1).split(",")
                row["c1"], row["c8"], d = specbench(left, configs, levels)
                row["servers"] = configs
            else:
                d = min(_seconds(name), _budget(work, name) or _seconds(name))
            if d > left:
                d, ok = left, False
            row["end"] = now + d
            row["state"] = "passed" if ok else "cut off"
            if cut_in == name:
                stop_at = now + d / 2
                row["end"], row["state"] = stop_at, "cut off"
        if background:
            bg = row["end"]
        else:
            fg = row["end"]
    if stop_at is not None:
        for row in rows.values():  # a background phase still running at the stop
            if row["state"] == "passed" and row["end"] > stop_at:
                row["end"], row["state"] = stop_at, "cut off"
    ended = max([r["end"] for r in rows.values()], default=0.0) if stop_at is None else stop_at
    return {"phases": list(rows.values()), "ended_s": ended, "budget_s": budget}


def scenarios(plan: dict) -> list[dict]:
    """Every scenario of the module doc, for ``plan``."""
    work = plan["calls"][-1]
    runs = [play(plan)]
    runs += [play(plan, lost_before=c["n"]) for c in plan["calls"][1:]]
    runs += [play(plan, cut_in=p.lstrip("+")) for p in work["phases"] if not p.startswith("chunk-")]
    return runs


def problems(plan: dict, runs: list[dict]) -> list[str]:
    """Where the plan breaks its promises (empty: none)."""
    out = []
    for r in runs:
        states = {p["phase"]: p for p in r["phases"]}
        where = r["scenario"]
        if r["device_s"] > stage.LENT_S:
            out.append(f"{where}: {r['device_s']:.0f} device seconds of {stage.LENT_S}")
        if where == "nominal":
            late = [p["phase"] for p in r["phases"] if p["state"] != "passed" and p["phase"] not in OPTIONAL]
            late += [f"specbench at concurrency 1 on {s}" for p in r["phases"] if "c1" in p
                     for s in p["servers"] if s not in p["c1"]]  # fmt: skip
            if late:
                out.append(f"nominal: {', '.join(late)} do not end within the call's {r['budget_s']} s")
            if r["device_s"] > stage.PLANNED_MAX_S:
                out.append(f"nominal: {r['device_s']:.0f} device seconds planned (at most {stage.PLANNED_MAX_S})")
        elif where.startswith("lost"):
            for p in ("tests", "bench"):
                if p in states and states[p]["state"] != "passed":
                    out.append(f"{where}: {p} {states[p]['state']} (the kernels' evidence must come back)")
        else:
            cut = where.removeprefix("cut in ")
            for p in r["phases"]:
                if p["phase"] == cut:
                    break
                if not p["background"] and p["state"] != "passed":
                    out.append(f"{where}: {p['phase']} {p['state']} before the cut")
    return out


def markdown(plan: dict, runs: list[dict]) -> str:
    """One row per scenario: the device seconds and each phase's state (Spec-Bench: the servers asked)."""
    names = [p["phase"] for p in runs[0]["phases"]]
    lines = [
        f"# Lease {plan['lease']} played against the planned times",
        "",
        "Constants (stage.py PHASE_S): " + "; ".join(f"{k} {v[0]} s ({v[1]})" for k, v in stage.PHASE_S.items()),
        "",
        "| scenario | device s | call limit s | " + " | ".join(names) + " |",
        "|---|---:|---:|" + "---|" * len(names),
    ]
    for r in runs:
        cells = []
        for p in r["phases"]:
            cell = f"{p['state']} {p['start']:.0f}-{p['end']:.0f}"
            if "c1" in p:
                cell += f" (c1: {len(p['c1'])}/{len(p['servers'])}, c8: {len(p['c8'])})"
            cells.append(cell)
        lines.append(f"| {r['scenario']} | {r['device_s']:.0f} | {r['limit_s']} | " + " | ".join(cells) + " |")
    bad = problems(plan, runs)
    lines += ["", "Problems: " + ("; ".join(bad) if bad else "none")]
    return "\n".join(lines) + "\n"

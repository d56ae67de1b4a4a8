"""``sglang-specvocab bench host``: the host cost DYNVOCAB adds to SGLang's decode round and prefill.

Drives the real worker methods of both algorithms over a toy draft (``integration/harness.py``:
what is real and what is a stand-in), on a CPU, one torch thread:

- a decode round = ``draft_forward`` (the draft loop) + ``verify`` (EAGLE3: SGLang's, over a recorded
  verify result; DYNVOCAB: that plus its event hook) + ``_draft_extend_for_decode``, each phase timed
  with ``time.perf_counter`` on every round;
- a prefill = ``_forward_prefill_batch`` over a recorded target output (DYNVOCAB: slot reset, prompt
  ids, the target's top-K, the policy's prefill event, then the draft extend).

Noise (a shared machine): the two stacks run interleaved, alternating which goes first, ``--reps``
times; each rep takes the median over ``--rounds`` calls; a stack's number is the minimum of its
rep medians (the least-disturbed estimate); the spread of the rep medians is reported beside it.
Ops per call (aten ops dispatched, views excluded: what would launch work on a GPU) are counted
once, exactly. Shapes are tiny so the time is host work (Python and op dispatch), not arithmetic.

Also the prefill top-K on its own (``events._chunked_topk``: the target's LM head over prompt
positions, ``--topk-chunks`` rows at a time): milliseconds per 1k prompt tokens at ``--topk-d`` x
``--topk-vocab``, and the largest logits tensor each chunk size allocates.

Wall time on a CPU holds the ops' arithmetic too, which a GPU runs as kernels (the verify hook's target
top-k over ``[bs x draft tokens, V]`` is most of it for trees). So each phase is also run under torch's
profiler for the time spent inside the aten ops it calls (a separate pass); the wall time less that is the time outside
the ops: Python and the ops' Python bindings, what a GPU's host still pays (plus one launch per op).

The target: DYNVOCAB adds at most ``--target-us`` (50) microseconds of Python per decode round over
EAGLE3, the time outside the ops; wall time is judged against the same bound beside it. With ``--check``
the exit status is 1 when a case misses the target outside the ops.
"""

from __future__ import annotations

import gc
import json
import statistics
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function
from torch.utils._python_dispatch import TorchDispatchMode

from ..patches import installed_sglang_version
from .kernels import environment as kernel_env

SCHEMA = 1
PHASES = ("draft", "verify", "extend")
QUICK = {
    "batches": [1, 8],
    "topks": [1, 4],
    "reps": 5,
    "rounds": 20,
    "prefill_reps": 3,
    "topk_chunks": [256, 1024],
    "topk_tokens": 512,
}
FULL = {
    "batches": [1, 8, 32],
    "topks": [1, 4],
    "reps": 9,
    "rounds": 40,
    "prefill_reps": 5,
    "topk_chunks": [256, 1024, 4096],
    "topk_tokens": 2048,
}


class OpCounter(TorchDispatchMode):
    """Counts the aten ops dispatched (views apart: they launch nothing on a GPU)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops, self.views = Counter(), 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.is_view:
            self.views += 1
        else:
            self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def time_in_ops(rounds_by_stack: dict, reps: int, n: int) -> dict:
    """Per stack and phase: min over reps of the median per-call time inside aten ops (us), from torch's
    profiler: the ops called directly by each phase (their arithmetic and C++ dispatch), after the Python
    binding has parsed their arguments (which stays outside, as it does on a GPU)."""
    meds = {s: {p: [] for p in (*PHASES, "round")} for s in rounds_by_stack}
    for _ in range(reps):
        for s, r in rounds_by_stack.items():
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for i in range(n):
                    for p in PHASES:
                        with record_function(f"phase:{p}:{i}"):
                            getattr(r, p)()
            inside = {p: [0.0] * n for p in PHASES}
            for e in prof.events():
                if e.name.startswith("phase:"):
                    _, p, i = e.name.split(":")
                    inside[p][int(i)] = sum(c.cpu_time_total for c in e.cpu_children)
            for p in PHASES:
                meds[s][p].append(statistics.median(inside[p]))
            meds[s]["round"].append(statistics.median([sum(inside[p][i] for p in PHASES) for i in range(n)]))
    return {s: {p: min(v) for p, v in meds[s].items()} for s in meds}


def count_ops(fn) -> dict:
    with OpCounter() as c:
        fn()
    return {"ops": sum(c.ops.values()), "views": c.views, "by_op": dict(c.ops.most_common())}


def _stats(medians: list[float]) -> dict:
    return {"us": min(medians), "spread_us": max(medians) - min(medians), "rep_medians_us": medians}


def time_rounds(rounds_by_stack: dict, reps: int, n: int) -> dict:
    """Per stack and phase: min over reps of the median per-call time (us), stacks interleaved."""
    names = list(rounds_by_stack)
    meds = {s: {p: [] for p in (*PHASES, "round")} for s in names}
    for rep in range(reps):
        order = names if rep % 2 == 0 else names[::-1]
        for s in order:
            r = rounds_by_stack[s]
            samples = {p: [] for p in (*PHASES, "round")}
            for _ in range(n):
                t0 = time.perf_counter()
                r.draft()
                t1 = time.perf_counter()
                r.verify()
                t2 = time.perf_counter()
                r.extend()
                t3 = time.perf_counter()
                for p, dt in zip((*PHASES, "round"), (t1 - t0, t2 - t1, t3 - t2, t3 - t0), strict=True):
                    samples[p].append(dt * 1e6)
            for p, v in samples.items():
                meds[s][p].append(statistics.median(v))
    return {s: {p: _stats(v) for p, v in meds[s].items()} for s in names}


def time_prefill(rounds_by_stack: dict, reps: int, n: int) -> dict:
    names = list(rounds_by_stack)
    meds = {s: [] for s in names}
    for rep in range(reps):
        for s in names if rep % 2 == 0 else names[::-1]:
            samples = []
            for _ in range(n):
                t0 = time.perf_counter()
                rounds_by_stack[s].prefill()
                samples.append((time.perf_counter() - t0) * 1e6)
            meds[s].append(statistics.median(samples))
    return {s: _stats(v) for s, v in meds.items()}


def topk_cost(tokens: int, d: int, vocab: int, k: int, chunks: list[int], reps: int) -> list[dict]:
    """The prefill top-K alone: ms per 1k prompt tokens per chunk size (min over reps), and its largest tensor."""
    # integration/ is the SGLang side of the package: loaded only when a benchmark runs
    from ..integration.events import _chunked_topk

    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(tokens, d, generator=g)
    weight = torch.randn(vocab, d, generator=g)
    out = []
    for chunk in chunks:
        _chunked_topk(hidden[: min(tokens, chunk)], weight, k, chunk, vocab)  # warm-up
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            _chunked_topk(hidden, weight, k, chunk, vocab)
            times.append(time.perf_counter() - t0)
        out.append(
            {
                "chunk": chunk,
                "ms_per_1k_tokens": min(times) * 1e3 * 1000 / tokens,
                "spread_ms_per_1k": (max(times) - min(times)) * 1e3 * 1000 / tokens,
                "largest_logits_bytes": min(chunk, tokens) * vocab * 4,
            }
        )
    return out


def verify_topk_cost(inputs, shape, reps: int, n: int) -> dict:
    """The verify hook's target top-k alone on this round's logits ``[bs * nd, V]``: arithmetic that DYNVOCAB's verify
    time holds on a CPU (on a GPU, a device kernel launched once)."""
    logits = inputs.verify_round(shape.steps, shape.num_draft_tokens).logits
    meds = []
    for _ in range(reps):
        samples = []
        for _ in range(n):
            t0 = time.perf_counter()
            logits.topk(shape.verify_topk, dim=-1)
            samples.append((time.perf_counter() - t0) * 1e6)
        meds.append(statistics.median(samples))
    return _stats(meds)


def environment() -> dict:
    env = kernel_env(torch.device("cpu"))
    env["versions"]["sglang"] = installed_sglang_version()
    return env


def run_case(H, shape, args) -> dict:
    eagle, dyn = H.build(shape)
    stacks = {"EAGLE3": eagle, "DYNVOCAB": dyn}
    with H.stand_ins(eagle.inputs):
        for r in stacks.values():  # warm-up: first calls build caches (layouts, compiled stances)
            for _ in range(3):
                r.round()
                r.prefill()
        ops = {s: {p: count_ops(getattr(r, p)) for p in (*PHASES, "prefill")} for s, r in stacks.items()}
        gc.collect()
        gc.disable()
        try:
            decode = time_rounds(stacks, args.reps, args.rounds)
            in_ops = time_in_ops(stacks, args.reps, args.rounds)
            verify_topk = verify_topk_cost(dyn.inputs, shape, args.reps, args.rounds)
            prefill = time_prefill(stacks, args.prefill_reps, max(3, args.rounds // 4))
        finally:
            gc.enable()
    added = decode["DYNVOCAB"]["round"]["us"] - decode["EAGLE3"]["round"]["us"]
    outside = {s: {p: decode[s][p]["us"] - in_ops[s][p] for p in (*PHASES, "round")} for s in stacks}
    added_outside = outside["DYNVOCAB"]["round"] - outside["EAGLE3"]["round"]
    return {
        "shape": asdict(shape),
        "decode": decode,
        "prefill": prefill,
        "ops": ops,
        "added_round_us": added,
        "in_ops_us": in_ops,
        "outside_ops_us": outside,
        "added_outside_ops_us": added_outside,
        "verify_topk_us": verify_topk["us"],
        "added_prefill_us": prefill["DYNVOCAB"]["us"] - prefill["EAGLE3"]["us"],
        "added_ops_per_round": sum(ops["DYNVOCAB"][p]["ops"] - ops["EAGLE3"][p]["ops"] for p in PHASES),
        # The measure is Python per round: the time outside the ops (their arithmetic is kernels on a
        # GPU). Wall time is reported beside it; on a CPU it also holds the verify hook's top-k arithmetic.
        "meets_target": added_outside <= args.target_us,
        "meets_target_wall": added <= args.target_us,
    }


def run(args) -> int:
    """``bench host``: every case, then JSON + Markdown; 1 with ``--check`` when a case misses the target."""
    # SGLang and its stand-ins are loaded only when the benchmark runs (the CLI starts without them)
    from ..testing.standins import install

    install()  # SGLang's worker modules import torchvision (absent on a CPU machine)
    from ..integration import harness as H  # SGLang's worker modules, after the stand-ins

    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    torch.set_num_threads(1)
    H.init_dist(args.port)
    env = environment()
    out = args.out or Path("benchmarks") / "host-cpu.json"
    cases = []
    for topk in args.topks:
        for bs in args.batches:
            nd = args.steps + 1 if topk == 1 else args.draft_tokens
            shape = H.Shape(bs=bs, topk=topk, steps=args.steps, num_draft_tokens=nd, prompt_len=args.prompt_len)
            print(f"bench host: bs {bs}, topk {topk}, steps {args.steps}, draft tokens {nd}", flush=True)
            cases.append(run_case(H, shape, args))
    topk = topk_cost(args.topk_tokens, args.topk_d, args.topk_vocab, 3, args.topk_chunks, args.prefill_reps)
    result = {
        "schema": SCHEMA,
        **env,
        "command": args.command_line,
        "config": {k: v for k, v in vars(args).items() if k not in ("run", "command_line", "command", "bench", "out")},
        "method": {
            "timer": "time.perf_counter per phase of every call; min over reps of the per-rep median; "
            "stacks interleaved, alternating which goes first; gc off while timing; one torch thread",
            "ops": "aten ops dispatched per call (TorchDispatchMode), views excluded",
            "in_ops": "time inside the aten ops each phase calls (torch.profiler, CPU: the top-level ops' total "
            "time), a separate pass, same min-of-rep-medians; outside ops = wall - in ops",
        },
        "target_us": args.target_us,
        "cases": cases,
        "prefill_topk": {"tokens": args.topk_tokens, "d": args.topk_d, "vocab": args.topk_vocab, "k": 3, "rows": topk},
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, allow_nan=False) + "\n")
    md = markdown(result)
    out.with_suffix(".md").write_text(md)
    print(md)
    print(f"wrote {out} and {out.with_suffix('.md').name}")
    missed = [c for c in cases if not c["meets_target"]]
    return 1 if args.check and missed else 0


def _f(x: float) -> str:
    return f"{x:.0f}"


def markdown(result: dict) -> str:
    dev, ver = result["device"], result["versions"]
    lines = [
        "# Host cost per decode round and per prefill: DYNVOCAB against EAGLE3 (CPU)",
        "",
        (
            f"Device: {dev.get('name')} (CPU, 1 torch thread). Versions: python {ver['python']}, "
            f"torch {ver['torch']}, sglang {ver.get('sglang')}, git {ver.get('git')}."
        ),
        f"Command: `{result['command']}`",
        "",
        (
            f"Method: {result['method']['timer']}; ops: {result['method']['ops']}. What runs is "
            "`sglang_specvocab/integration/harness.py`: the real worker methods of both algorithms over a toy "
            "draft (tiny shapes: host work, not arithmetic). On a GPU the draft loop runs inside a CUDA graph "
            "(its host cost is a replay for both); the verify hook and the extend's top-k run eagerly."
        ),
        "",
        (
            f"Target: DYNVOCAB adds at most {result['target_us']:g} us of Python per decode round over EAGLE3: the time "
            "outside aten ops (below), what a GPU's host pays, decides (`--check`). Wall time is judged against it "
            "too; on this CPU it also holds the ops' arithmetic, which a GPU runs as kernels."
        ),
        "",
        "## Decode round (us; spread = max - min of the rep medians)",
        "",
        (
            "| bs | topk | EAGLE3 draft | DYNVOCAB draft | EAGLE3 verify | DYNVOCAB verify | EAGLE3 extend | "
            "DYNVOCAB extend | EAGLE3 round | DYNVOCAB round | added | spread | ops added | wall target | "
            "of which target top-k |"
        ),
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|:--|---:|",
    ]
    for c in result["cases"]:
        s, e, d = c["shape"], c["decode"]["EAGLE3"], c["decode"]["DYNVOCAB"]
        cells = [str(s["bs"]), str(s["topk"])]
        for p in (*PHASES, "round"):
            cells += [_f(e[p]["us"]), _f(d[p]["us"])]
        spread = max(e["round"]["spread_us"], d["round"]["spread_us"])
        cells += [
            _f(c["added_round_us"]),
            _f(spread),
            str(c["added_ops_per_round"]),
            "met" if c["meets_target_wall"] else "MISSED",
            _f(c["verify_topk_us"]),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "## Outside aten ops: Python and dispatch (us; wall less the time inside ops, timed in a separate pass)",
        "",
        (
            "What a GPU's host pays of each round (the ops' arithmetic becomes kernels there), plus one launch per op. "
            "The profiler's own cost per op (about a microsecond) counts as in ops, for both stacks."
        ),
        "",
        (
            "| bs | topk | EAGLE3 in ops | DYNVOCAB in ops | EAGLE3 outside | DYNVOCAB outside | added outside | "
            "ops added | target |"
        ),
        "|---:|---:|---:|---:|---:|---:|---:|---:|:--|",
    ]
    for c in result["cases"]:
        s, i, o = c["shape"], c["in_ops_us"], c["outside_ops_us"]
        lines.append(
            f"| {s['bs']} | {s['topk']} | {_f(i['EAGLE3']['round'])} | {_f(i['DYNVOCAB']['round'])} | "
            f"{_f(o['EAGLE3']['round'])} | {_f(o['DYNVOCAB']['round'])} | {_f(c['added_outside_ops_us'])} | "
            f"{c['added_ops_per_round']} | {'met' if c['meets_target'] else 'MISSED'} |"
        )
    lines += [
        "",
        "## Ops per call (aten ops, views excluded)",
        "",
        "| bs | topk | phase | EAGLE3 | DYNVOCAB |",
        "|---:|---:|:--|---:|---:|",
    ]
    for c in result["cases"]:
        s = c["shape"]
        for p in (*PHASES, "prefill"):
            lines.append(
                f"| {s['bs']} | {s['topk']} | {p} | {c['ops']['EAGLE3'][p]['ops']} | {c['ops']['DYNVOCAB'][p]['ops']} |"
            )
    lines += [
        "",
        "## Prefill (one batch of bs prompts; us)",
        "",
        "| bs | prompt tokens | EAGLE3 | DYNVOCAB | added | spread |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    seen = set()
    for c in result["cases"]:
        s = c["shape"]
        if s["bs"] in seen:
            continue
        seen.add(s["bs"])
        p = c["prefill"]
        spread = max(p["EAGLE3"]["spread_us"], p["DYNVOCAB"]["spread_us"])
        lines.append(
            f"| {s['bs']} | {s['bs'] * s['prompt_len']} | {_f(p['EAGLE3']['us'])} | {_f(p['DYNVOCAB']['us'])} | "
            f"{_f(c['added_prefill_us'])} | {_f(spread)} |"
        )
    t = result["prefill_topk"]
    lines += [
        "",
        f"## Prefill top-K alone ({t['tokens']} prompt tokens, d {t['d']}, V {t['vocab']}, k {t['k']}; CPU, 1 thread)",
        "",
        "| chunk | ms per 1k tokens | spread | largest logits tensor (MB) |",
        "|---:|---:|---:|---:|",
    ]
    for r in t["rows"]:
        lines.append(
            f"| {r['chunk']} | {r['ms_per_1k_tokens']:.1f} | {r['spread_ms_per_1k']:.1f} | "
            f"{r['largest_logits_bytes'] / 2**20:.1f} |"
        )
    lines += [
        "",
        (
            "`of which target top-k`: the verify hook's top-k of the target's logits `[bs x draft tokens, V]` timed "
            "alone (min of the rep medians): arithmetic that DYNVOCAB's verify time holds here, one device kernel on a "
            "GPU."
        ),
    ]
    missed = [c for c in result["cases"] if not c["meets_target"]]
    wall_missed = [c for c in result["cases"] if not c["meets_target_wall"]]
    lines += [
        "",
        (
            f"Verdict (Python, outside ops): {'every case meets' if not missed else f'{len(missed)} case(s) miss'} "
            f"the target. Wall time: {'every case meets' if not wall_missed else f'{len(wall_missed)} case(s) miss'} it."
        ),
        "",
    ]
    return "\n".join(lines)


__all__ = ["count_ops", "markdown", "run", "topk_cost"]

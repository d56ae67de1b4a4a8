"""``sglang-specvocab bench host``: the host cost DYNVOCAB adds to SGLang's decode round and prefill.

Drives the real worker methods of both algorithms over a toy draft (``bench/harness.py``:
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

The gate (``--check``: exit status 1 where a case misses it) is what a GPU host with CUDA graphs pays per
decode round beyond EAGLE3, counted exactly (``LaunchCounter``): at most ``--max-added-launches`` (2) kernel
launches in the phases that stay eager (verify, the extend's top-k after its graph replay) and no host sync.
The times stay as information against ``--target-us`` (50 us): on a shared CPU they move by hundreds of
microseconds between runs, and microseconds per round are the GPU's to measure (graphs on; in no lease yet).
"""

from __future__ import annotations

import contextlib
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

from ...copies import installed_sglang_version
from ..testing.graphs import in_ops_check
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


# Ops whose result (a value or an output size) the host must read on a GPU: each is a device-to-host sync.
SYNC_OPS = frozenset(
    {"_local_scalar_dense", "nonzero", "masked_select", "_unique", "_unique2", "unique_dim", "unique_consecutive"}
)
_INDEX_OPS = frozenset({"index", "index_put", "index_put_", "_index_put_impl_"})


def syncs_host(func, args, kwargs) -> bool:
    """Whether aten ``func`` on these arguments makes a GPU's host wait for the device."""
    name = func.overloadpacket.__name__
    if name in SYNC_OPS:
        return True
    if name in _INDEX_OPS and len(args) > 1:  # a boolean mask index is a nonzero on the device
        return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in args[1])
    if name == "repeat_interleave" and func._overloadname == "Tensor":  # the output size is the repeats' sum
        return kwargs.get("output_size") is None
    return False


class LaunchCounter(TorchDispatchMode):
    """What a GPU's host pays per call, counted exactly on a CPU: kernel launches (aten ops dispatched outside a
    region a GPU replays as a CUDA graph; views launch nothing) and host syncs (``syncs_host``, plus the Python
    reads ``tolist``/``numpy``, which copy a device tensor to the host). ``with counter.captured():`` marks a
    region SGLang captures (the draft loop, the draft extend's forward): its ops count as one replay's, apart."""

    def __init__(self) -> None:
        super().__init__()
        self.launches, self.syncs, self.in_graph, self.views, self._depth = Counter(), Counter(), 0, 0, 0
        self.order: list[str] = []  # the launches' op names, in dispatch order

    @contextlib.contextmanager
    def captured(self):
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if in_ops_check():  # the ops' value checks read CPU tensors only: nothing on a GPU host
            pass
        elif func.is_view:
            self.views += 1
        else:
            if self._depth:
                self.in_graph += 1
            else:
                self.launches[func.overloadpacket.__name__] += 1
                self.order.append(func.overloadpacket.__name__)
                if syncs_host(func, args, kwargs):
                    self.syncs[func.overloadpacket.__name__] += 1
        return func(*args, **kwargs)

    def __enter__(self):
        self._reads = {name: getattr(torch.Tensor, name) for name in ("tolist", "numpy")}
        for name, read in self._reads.items():
            setattr(torch.Tensor, name, self._host_read(name, read))
        return super().__enter__()

    def __exit__(self, *exc):
        for name, read in self._reads.items():
            setattr(torch.Tensor, name, read)
        return super().__exit__(*exc)

    def _host_read(self, name, read):
        def counted(t, *a, **kw):
            if not self._depth and not in_ops_check():
                self.syncs[name] += 1
            return read(t, *a, **kw)

        return counted

    def summary(self) -> dict:
        return {
            "launches": sum(self.launches.values()),
            "syncs": sum(self.syncs.values()),
            "in_graph": self.in_graph,
            "by_op": dict(self.launches.most_common()),
            "sync_ops": dict(self.syncs.most_common()),
        }


def count_ops(fn) -> dict:
    """The aten ops ``fn`` dispatches, views apart (they launch nothing on a GPU)."""
    with LaunchCounter() as c:
        fn()
    return {"ops": sum(c.launches.values()), "views": c.views, "by_op": dict(c.launches.most_common())}


def eager_cost(r, phase: str) -> dict:
    """``LaunchCounter.summary`` of one call of ``phase`` on round ``r``, as a GPU host with CUDA graphs pays it:
    SGLang captures the draft loop whole (``draft``: a replay) and the decode draft extend's forward (the draft
    runner's; the top-k after the replay stays eager); verify and prefill run eagerly."""
    c = LaunchCounter()
    runner = getattr(getattr(getattr(r, "stack", None), "draft_worker", None), "draft_runner", None)
    if runner is not None:
        forward = runner.forward

        def replayed(fb):
            with c.captured():
                return forward(fb)

        runner.forward = replayed
    try:
        with c, c.captured() if phase == "draft" else contextlib.nullcontext():
            getattr(r, phase)()
    finally:
        if runner is not None:
            del runner.forward  # the class's method again
    return c.summary()


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
    from ...integration.events import _chunked_topk

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


EVENT_CASES = ((1, 0), (8, 0), (1, 2000), (8, 2000), (1, 16000))  # (requests, radix-cache-hit ids per request)
EVENT_TARGET_US = 200.0


def event_cost(cases, ext: int, reps: int, n: int = 20) -> list[dict]:
    """The host work of the prefill event (``events.prefill_event`` without the top-K, whose arithmetic is a device
    kernel on a GPU, timed apart): index building and the radix-cache hits' ids, per (requests, hit ids each) with
    ``ext`` extended tokens each; min over reps of the median, us."""
    # integration/ is the SGLang side of the package: loaded only when a benchmark runs
    from ...integration.events import prefill_event

    out = []
    for b, hit in cases:
        ids = torch.arange(b * ext) % 251
        full = [list(range(1000, 1000 + hit + ext)) for _ in range(b)]
        args = (None, None, ids, [ext] * b, [hit] * b, full, [0] * b)
        prefill_event(*args, k=0)  # warm-up
        meds = []
        for _ in range(reps):
            samples = []
            for _ in range(n):
                t0 = time.perf_counter()
                prefill_event(*args, k=0)
                samples.append((time.perf_counter() - t0) * 1e6)
            meds.append(statistics.median(samples))
        stats = _stats(meds)
        out.append({"requests": b, "hit_ids": hit, "extend": ext, **stats, "meets": stats["us"] <= EVENT_TARGET_US})
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
        eager = {s: {p: eager_cost(r, p) for p in (*PHASES, "prefill")} for s, r in stacks.items()}
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
    added_launches = sum(eager["DYNVOCAB"][p]["launches"] - eager["EAGLE3"][p]["launches"] for p in PHASES)
    added_syncs = sum(eager["DYNVOCAB"][p]["syncs"] - eager["EAGLE3"][p]["syncs"] for p in PHASES)
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
        # The gate: what a GPU host with CUDA graphs pays per decode round beyond EAGLE3, counted exactly.
        "eager": eager,
        "added_launches_per_round": added_launches,
        "added_syncs_per_round": added_syncs,
        "meets_gate": added_launches <= args.max_added_launches and added_syncs <= 0,
        # Information: the time outside the ops (their arithmetic is kernels on a GPU) and wall time, against
        # --target-us. Noisy on a shared CPU (one CI run missed it by 226 us), so not the gate.
        "meets_target": added_outside <= args.target_us,
        "meets_target_wall": added <= args.target_us,
    }


def run(args) -> int:
    """``bench host``: every case, then JSON + Markdown; 1 with ``--check`` when a case misses the target."""
    # SGLang and its stand-ins are loaded only when the benchmark runs (the CLI starts without them)
    from ..testing.standins import install

    install()  # SGLang's worker modules import torchvision (absent on a CPU machine)
    from . import harness as H  # SGLang's worker modules, after the stand-ins

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
    event = event_cost(EVENT_CASES, args.prompt_len, args.prefill_reps)
    result = {
        "schema": SCHEMA,
        **env,
        "command": args.command_line,
        "config": {k: v for k, v in vars(args).items() if k not in ("run", "command_line", "command", "bench", "out")},
        "method": {
            "timer": "time.perf_counter per phase of every call; min over reps of the per-rep median; "
            "stacks interleaved, alternating which goes first; gc off while timing; one torch thread",
            "ops": "aten ops dispatched per call (TorchDispatchMode), views excluded",
            "eager": "per phase, as a GPU host with CUDA graphs pays it (the draft loop and the decode extend's "
            "forward replayed as graphs): launches = aten ops dispatched outside them, views excluded; syncs = ops "
            f"whose value or output size the host reads ({', '.join(sorted(SYNC_OPS))}, boolean-mask indexing, "
            "repeat_interleave without output_size) and Python tolist/numpy reads",
            "in_ops": "time inside the aten ops each phase calls (torch.profiler, CPU: the top-level ops' total "
            "time), a separate pass, same min-of-rep-medians; outside ops = wall - in ops",
        },
        "target_us": args.target_us,
        "max_added_launches": args.max_added_launches,
        "cases": cases,
        "prefill_event": {"target_us": EVENT_TARGET_US, "rows": event},
        "prefill_topk": {"tokens": args.topk_tokens, "d": args.topk_d, "vocab": args.topk_vocab, "k": 3, "rows": topk},
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, allow_nan=False) + "\n")
    md = markdown(result)
    out.with_suffix(".md").write_text(md)
    print(md)
    print(f"wrote {out} and {out.with_suffix('.md').name}")
    missed = [c for c in cases if not c["meets_gate"]]
    return 1 if args.check and missed else 0


def _f(x: float) -> str:
    return f"{x:.0f}"


def markdown(result: dict) -> str:
    """The report of ``run``'s result: its header, one section per table, and the verdict."""
    lines = _md_header(result)
    lines += _md_gate(result["cases"])
    lines += _md_decode(result["cases"])
    lines += _md_outside_ops(result["cases"])
    lines += _md_ops(result["cases"])
    lines += _md_prefill(result["cases"])
    lines += _md_event(result.get("prefill_event"))
    lines += _md_topk(result["prefill_topk"])
    lines += _md_verdict(result["cases"])
    return "\n".join(lines)


def _md_header(result: dict) -> list[str]:
    """The title, the machine and command, the method and the gate."""
    dev, ver = result["device"], result["versions"]
    return [
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
            "`sglang_specvocab/tools/bench/harness.py`: the real worker methods of both algorithms over a toy "
            "draft (tiny shapes: host work, not arithmetic). On a GPU the draft loop runs inside a CUDA graph "
            "(its host cost is a replay for both); the verify hook and the extend's top-k run eagerly."
        ),
        "",
        (
            f"Gate (`--check`): per decode round DYNVOCAB adds at most {result['max_added_launches']} kernel launches "
            "and no host sync to what a GPU host with CUDA graphs pays for EAGLE3 (counted exactly, below). "
            f"Information: the time it adds, outside aten ops and wall, against {result['target_us']:g} us; on this "
            "CPU wall time also holds the ops' arithmetic, which a GPU runs as kernels."
        ),
    ]


def _eager_cell(x: dict) -> str:
    """Launches of one phase, then the ops inside its graph and its syncs where there are any."""
    graph = f" ({x['in_graph']})" if x["in_graph"] else ""
    sync = f", {x['syncs']} sync" if x["syncs"] else ""
    return f"{x['launches']}{graph}{sync}"


def _md_gate(cases: list[dict]) -> list[str]:
    """The gate's table: launches and host syncs per call."""
    lines = [
        "",
        "## Launches and host syncs per call, as a GPU host with CUDA graphs pays them (the gate)",
        "",
        (
            "Draft: the loop is one graph replay for both (its ops, captured, in parentheses). Extend: the draft "
            "forward is a replay (in parentheses), the top-k after it eager. Verify: eager. Prefill: eager, "
            "information only: on a CPU the count includes the host-tensor index building (a GPU runs those on "
            "the host, no launch) and their `tolist`s (no sync there)."
        ),
        "",
        (
            "| bs | topk | EAGLE3 draft | DYNVOCAB draft | EAGLE3 verify | DYNVOCAB verify | EAGLE3 extend | "
            "DYNVOCAB extend | launches added per round | syncs added | gate | EAGLE3 prefill | DYNVOCAB prefill |"
        ),
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|:--|---:|---:|",
    ]
    for c in cases:
        s, e, d = c["shape"], c["eager"]["EAGLE3"], c["eager"]["DYNVOCAB"]
        cells = [str(s["bs"]), str(s["topk"])]
        for ph in PHASES:
            cells += [_eager_cell(e[ph]), _eager_cell(d[ph])]
        cells += [
            str(c["added_launches_per_round"]),
            str(c["added_syncs_per_round"]),
            "met" if c["meets_gate"] else "MISSED",
            _eager_cell(e["prefill"]),
            _eager_cell(d["prefill"]),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _md_decode(cases: list[dict]) -> list[str]:
    """Wall time per phase and per decode round."""
    lines = [
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
    for c in cases:
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
    return lines


def _md_outside_ops(cases: list[dict]) -> list[str]:
    """Time per round inside and outside aten ops."""
    lines = [
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
    for c in cases:
        s, i, o = c["shape"], c["in_ops_us"], c["outside_ops_us"]
        lines.append(
            f"| {s['bs']} | {s['topk']} | {_f(i['EAGLE3']['round'])} | {_f(i['DYNVOCAB']['round'])} | "
            f"{_f(o['EAGLE3']['round'])} | {_f(o['DYNVOCAB']['round'])} | {_f(c['added_outside_ops_us'])} | "
            f"{c['added_ops_per_round']} | {'met' if c['meets_target'] else 'MISSED'} |"
        )
    return lines


def _md_ops(cases: list[dict]) -> list[str]:
    """Aten ops per call of each phase."""
    lines = [
        "",
        "## Ops per call (aten ops, views excluded)",
        "",
        "| bs | topk | phase | EAGLE3 | DYNVOCAB |",
        "|---:|---:|:--|---:|---:|",
    ]
    for c in cases:
        s = c["shape"]
        for p in (*PHASES, "prefill"):
            lines.append(
                f"| {s['bs']} | {s['topk']} | {p} | {c['ops']['EAGLE3'][p]['ops']} | {c['ops']['DYNVOCAB'][p]['ops']} |"
            )
    return lines


def _md_prefill(cases: list[dict]) -> list[str]:
    """Prefill time, once per batch size."""
    lines = [
        "",
        "## Prefill (one batch of bs prompts; us)",
        "",
        "| bs | prompt tokens | EAGLE3 | DYNVOCAB | added | spread |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    seen = set()
    for c in cases:
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
    return lines


def _md_event(ev: dict | None) -> list[str]:
    """The prefill event's host work, where the result has it."""
    if not ev:
        return []
    lines = [
        "",
        "## Prefill event, host work (us; `prefill_event` without its top-K: index building, the cache hits' ids)",
        "",
        "| requests | hit ids each | extended each | us | spread | under " + f"{ev['target_us']:g} us |",
        "|---:|---:|---:|---:|---:|:--|",
    ]
    for r in ev["rows"]:
        lines.append(
            f"| {r['requests']} | {r['hit_ids']} | {r['extend']} | {_f(r['us'])} | {_f(r['spread_us'])} | "
            f"{'met' if r['meets'] else 'MISSED'} |"
        )
    return lines


def _md_topk(t: dict) -> list[str]:
    """The prefill top-K alone, per chunk size."""
    lines = [
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
    return lines


def _md_verdict(cases: list[dict]) -> list[str]:
    """The note on the target top-k column, and the verdict of the gate and the time targets."""
    gate = [c for c in cases if not c["meets_gate"]]
    missed = [c for c in cases if not c["meets_target"]]
    wall_missed = [c for c in cases if not c["meets_target_wall"]]

    def verdict(bad):
        return "every case meets" if not bad else f"{len(bad)} case(s) miss"

    return [
        "",
        (
            "`of which target top-k`: the verify hook's top-k of the target's logits `[bs x draft tokens, V]` timed "
            "alone (min of the rep medians): arithmetic that DYNVOCAB's verify time holds here, one device kernel on a "
            "GPU."
        ),
        "",
        (
            f"Verdict (gate, launches and syncs): {verdict(gate)} it. Information: {verdict(missed)} the time "
            f"target outside ops; in wall time {verdict(wall_missed)} it."
        ),
        "",
    ]


__all__ = ["count_ops", "markdown", "run", "topk_cost"]

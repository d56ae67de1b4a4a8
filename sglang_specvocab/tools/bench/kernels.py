"""``sglang-specvocab bench kernels``: the head ops (indexed / packed logits, window round), the draft head step
against EAGLE3's, over a grid of shapes (``kernels_sweep.GRIDS``: data, one preset each; ``--lease``: the targets'
cases first).

Each case is checked against an fp32 oracle, timed with ``timing.make_timer`` and rated against the bandwidth ideal;
``kernels_report`` writes the JSON, Markdown and plot, ``kernels_targets`` judges the targets. The results are saved
as the sweep goes (every few seconds, each file written whole), each save with the targets on what was measured so
far (``partial`` until the sweep ends); SIGTERM ends the run with the results saved. The options and the method are
in ``sglang-specvocab bench kernels --help``.
"""

from __future__ import annotations

import json
import math
import os
import platform
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ... import headcost, ops
from ...errors import SpecVocabError
from . import heads as hb
from .kernels_report import HEAD_OPS, OURS, TOPK_OPS, bandwidth_fields, default_peak, save
from .kernels_sweep import (  # noqa: F401 (the sweep's names, also read from here)
    DTYPES,
    GRIDS,
    TOPK_K,
    Case,
    KernelBench,
    auto_plan_of,
    case_bytes,
    expand,
    head_bytes,
    resolve,
    union_columns,
    weight_rows,
)
from .timing import Timing, make_timer, summarize

#: The window's verified top-K ids per accepted position in a timed round (configs/microspec.yaml's verify_topk).
WINDOW_VERIFY_TOPK = 3

ROOT = Path(__file__).resolve().parents[3]  # the source checkout: its git revision goes into the results

try:
    from tqdm import tqdm
except ImportError:  # progress bars are a convenience only
    tqdm = None

SCHEMA = "bench_kernels/1"
CHECK_TOL = {"bf16": 5e-3, "fp16": 5e-3, "fp32": 1e-4}  # relative error of our output vs an fp32 oracle
CHECK_MAX_ELEMENTS = 1 << 27  # skip the oracle where the fp32 gather would exceed this many elements
SAVE_EVERY_S = 5.0  # a save at least this often while the sweep runs (and at every change of d)


# -- inputs ------------------------------------------------------------------------------------


class Skip(Exception):
    """A case that is not run, with the reason."""


def random_sets(rows: int, W: int, V: int, gen: torch.Generator, device: torch.device) -> torch.Tensor:
    """``rows`` sets of W distinct ids from [0, V), each sorted ascending (as the table keeps them): int32."""
    out = torch.empty(rows, W, dtype=torch.int32, device=device)
    chunk = max(1, (1 << 26) // max(V, 1))
    for lo in range(0, rows, chunk):
        hi = min(rows, lo + chunk)
        key = torch.rand(hi - lo, V, generator=gen, device=device)
        out[lo:hi] = key.argsort(dim=1)[:, :W].sort(dim=1).values.to(torch.int32)
    return out


def cold_sets(nbytes: int, l2_bytes: int | None, hot: bool, most: int = 12) -> int:
    """Input sets to rotate so one graph replay reads at least 3x the L2 cache."""
    if hot or not l2_bytes:
        return 1
    return max(1, min(most, math.ceil(3 * l2_bytes / max(nbytes, 1))))


@dataclass
class Bench:
    args: KernelBench
    device: torch.device
    dtype: torch.dtype
    timer: Callable[[list[Callable[[], object]]], Timing]
    l2_bytes: int | None
    gen: torch.Generator
    avail: list[str] | None = None  # ops.available_backends here (None: see avail_err)
    avail_err: str | None = None
    weights: dict = field(default_factory=dict)  # d -> [Vmax, d] weight
    data: dict = field(default_factory=dict)  # the current data key -> its inputs

    @property
    def elem(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    # memory ----------------------------------------------------------------------------------

    def need_bytes(self, case: Case, sets: int) -> int:
        e, M, W, d, bs = self.elem, case.M or 0, case.W, case.d or 0, case.batch
        out = M * W * 4
        hidden = sets * M * d * e
        if case.op == "indexed":
            extra = M * W * d * (e + 4) if case.backend == "torch" else 0
            return hidden + 2 * out + extra
        if case.op == "packed":
            extra = M * W * d * (e + 4) if case.backend == "torch" else 0
            return hidden + 2 * out + sets * bs * W * d * e + extra
        if case.op == "index_select_matmul":
            return hidden + bs * W * d * e + 2 * M * W * e
        if case.op in ("dense_static", "dense_full"):
            return hidden + 2 * M * W * e
        if case.op in HEAD_OPS:
            tables = sets * (case.batch + 1) * W * 4 * 3
            if case.op == "stock":
                return hidden + tables + M * case.H * (e + 8)
            if case.op == "gemma4_mtp":
                return hidden + tables + head_bytes(case, e) + M * case.vocab * (e + 8)
            width = {"per-request": W, "stock": case.H}.get(case.mode, union_columns(case))
            gather = union_columns(case) * d * e if case.mode == "union-gemm" else 0
            return hidden + tables + gather + M * width * 24 + 16 * case.vocab
        return 0

    def check_memory(self, need: int) -> None:
        if self.args.max_mem_gb is not None and need > self.args.max_mem_gb * 1e9:
            raise Skip(f"needs about {need / 1e9:.2f} GB, over --max-mem-gb {self.args.max_mem_gb:g}")
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            free += torch.cuda.memory_reserved(self.device) - torch.cuda.memory_allocated(self.device)
            if need > free - (1 << 30):
                raise Skip(f"does not fit memory: needs about {need / 1e9:.2f} GB, {free / 1e9:.2f} GB free")

    # data --------------------------------------------------------------------------------------

    def weight(self, d: int) -> torch.Tensor:
        if d not in self.weights:
            self.weights.clear()  # one d at a time
            self.data.clear()
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            V = weight_rows(self.args, d)
            w = torch.randn(V, d, generator=self.gen, device=self.device, dtype=torch.float32).to(self.dtype)
            self.weights[d] = w.mul_(0.05)
        return self.weights[d]

    def inputs(self, case: Case, sets: int) -> dict:
        """ids / cnt / row_to_slot / hidden (``sets`` of them) for an indexed-family case, cached per data key."""
        key = case.data_key
        have = self.data.get(key)
        if have is not None and len(have["sets"]) >= sets:
            return have
        self.data.clear()
        bs, r, W, d = case.batch, case.rows, case.W, case.d
        w = self.weight(d)
        ids = random_sets(sets * bs, W, case.vocab, self.gen, self.device)
        hidden = torch.randn(sets, bs * r, d, generator=self.gen, device=self.device).to(self.dtype)
        cnt = torch.full((bs,), W, dtype=torch.int32, device=self.device)
        r2s = torch.arange(bs, dtype=torch.int32, device=self.device).repeat_interleave(r)
        entry = {
            "weight": w[: case.vocab],
            "cnt": cnt,
            "row_to_slot": r2s,
            "sets": [{"ids": ids[i * bs : (i + 1) * bs], "hidden": hidden[i]} for i in range(sets)],
        }
        self.data = {key: entry}
        return entry

    def packed(self, entry: dict) -> list[torch.Tensor]:
        if "packed" not in entry:
            w = entry["weight"]
            entry["packed"] = [
                w.index_select(0, s["ids"].reshape(-1)).view(*s["ids"].shape, w.shape[1]) for s in entry["sets"]
            ]
        return entry["packed"]

    # cases -------------------------------------------------------------------------------------

    def fns(self, case: Case) -> tuple[list[Callable[[], object]], int, Callable[[], float | None] | None]:
        """The calls to time (one per input set), the set count, and an optional correctness check."""
        nbytes = case_bytes(case, self.elem)
        if case.op == "window_round":
            return self.window_fns(case)
        if case.op in TOPK_OPS:
            return self.topk_fns(case)
        if case.op in HEAD_OPS:
            return self.head_fns(case, nbytes)
        if case.op in ("dense_static", "dense_full"):
            sets = 1
            if case.op == "dense_static":
                sets = min(
                    cold_sets(nbytes, self.l2_bytes, self.args.hot), max(1, weight_rows(self.args, case.d) // case.W)
                )
            self.check_memory(self.need_bytes(case, sets))
            w = self.weight(case.d)
            hidden = torch.randn(sets, case.M, case.d, generator=self.gen, device=self.device).to(self.dtype)
            heads = [w[i * case.W : (i + 1) * case.W] for i in range(sets)]
            return [(lambda h=hidden[i], wt=heads[i]: h @ wt.T) for i in range(sets)], sets, None
        if case.W > case.vocab:
            raise Skip(f"W = {case.W} > the {case.vocab} ids it draws from")
        sets = cold_sets(nbytes, self.l2_bytes, self.args.hot)
        self.check_memory(self.need_bytes(case, sets))
        e = self.inputs(case, sets)
        w, cnt, r2s = e["weight"], e["cnt"], e["row_to_slot"]
        bs, r, W, d = case.batch, case.rows, case.W, case.d
        if case.op == "index_select_matmul":

            def isel(s: dict) -> torch.Tensor:
                rows = w.index_select(0, s["ids"].reshape(-1)).view(bs, W, d)
                return torch.bmm(s["hidden"].view(bs, r, d), rows.transpose(1, 2))

            return [(lambda s=s: isel(s)) for s in e["sets"]], sets, None
        if case.op == "indexed":
            fn = _op("indexed_logits")
            calls = [(lambda s=s: fn(s["hidden"], w, s["ids"], cnt, r2s, backend=case.backend)) for s in e["sets"]]
        else:
            fn = _op("packed_logits")
            packed = self.packed(e)
            calls = [
                (lambda s=s, p=p: fn(s["hidden"], p, cnt, r2s, backend=case.backend))
                for s, p in zip(e["sets"], packed, strict=True)
            ]
        return calls, sets, (lambda: self.check(calls[0](), e["sets"][0], w, bs, r))

    def check(self, out: torch.Tensor, s: dict, w: torch.Tensor, bs: int, r: int) -> float | None:
        """Relative error of one output against an fp32 oracle (None where the oracle is too large)."""
        W, d = s["ids"].shape[1], w.shape[1]
        if tuple(out.shape) != (bs * r, W) or out.dtype != torch.float32:
            raise RuntimeError(f"output is {out.dtype} {tuple(out.shape)}, expected float32 {(bs * r, W)}")
        if bs * W * d > CHECK_MAX_ELEMENTS:
            return None
        rows = w.index_select(0, s["ids"].reshape(-1)).view(bs, W, d).float()
        ref = torch.bmm(s["hidden"].view(bs, r, d).float(), rows.transpose(1, 2)).reshape(bs * r, W)
        return float((out - ref).norm() / ref.norm().clamp_min(1e-30))

    def head_inputs(self, case: Case, sets: int) -> dict:
        """The head of a draft kind, its tables (sets drawn from one pool per batch) and hidden rows, per data key."""
        key = case.data_key
        have = self.data.get(key)
        if have is not None and len(have["tables"]) >= sets:
            return have
        self.data.clear()
        w = self.weight(case.d)
        H, V, dev = case.H, case.vocab, self.device
        if case.kind == "d2t":
            # a d2t head is small (42 MB at d 640): the sets rotate over other row slices of the weight as well, so
            # a replay reads it from HBM, not L2 (EAGLE3's step and ours alike)
            hot = torch.randperm(V, generator=self.gen, device=dev)[:H]
            n = max(1, min(sets, w.shape[0] // H))
            heads, space = [w[(i % n) * H : (i % n + 1) * H] for i in range(sets)], hot
        else:
            hot, heads, space = None, [w[:V]] * sets, torch.arange(V, device=dev)
        pool = hb.pool_size(case.batch, case.W, H, headcost.shipped_union_sizes())
        tables = hb.make_tables(case.batch, case.W, space, pool, sets, self.gen, dev)
        hidden = torch.randn(sets, case.M, case.d, generator=self.gen, device=dev).to(self.dtype)
        entry = {"head": heads[0], "heads": heads, "hot": hot, "tables": tables, "hiddens": list(hidden), "pool": pool}
        self.data = {key: entry}
        return entry

    def head_fns(self, case: Case, nbytes: int):
        if case.W > case.H:
            raise Skip(f"W = {case.W} > the head's {case.H} rows")
        sets = cold_sets(nbytes, self.l2_bytes, self.args.hot)
        self.check_memory(self.need_bytes(case, sets))
        e = self.head_inputs(case, sets)
        head, hot, k = e["head"], e["hot"], case.rows
        heads, hiddens = e["heads"][:sets], e["hiddens"][:sets]
        if case.op == "stock":  # EAGLE3's step; its topk-1 kernel advances positions and writes the chain
            pos = torch.zeros(case.M, dtype=torch.int64, device=self.device)
            chain = torch.zeros(case.M, 2, dtype=torch.int64, device=self.device)
            calls = [(lambda x=x, h=h: hb.eagle3_stock(x, h, k, hot, pos, chain)) for x, h in zip(hiddens, heads)]
            return calls, sets, None
        if case.op == "gemma4_mtp":
            if "mtp" not in e:
                e["mtp"] = hb.Gemma4MTP(head, case.vocab, self.gen)
            mtp = e["mtp"]
            return [(lambda x=x: mtp(x, k)) for x in e["hiddens"]], sets, None
        ours, calls = hb.head_calls(
            heads, e["tables"][:sets], hiddens, case.mode, k, case.backend, hot, case.vocab, union_columns(case)
        )
        e["last_heads"] = ours

        def check() -> float | None:
            """Relative error of the top-k probabilities against the torch head of the same plan."""
            if case.M * case.W * case.d > CHECK_MAX_ELEMENTS:
                return None
            got = calls[0]()[0]
            ref = hb.head_calls(
                heads[:1], e["tables"][:1], hiddens[:1], case.mode, k, "torch", hot, case.vocab, union_columns(case)
            )[1][0]()[0]
            return float((got - ref).norm() / ref.norm().clamp_min(1e-30))

        return calls, sets, check

    def topk_fns(self, case: Case) -> tuple[list[Callable[[], object]], int, None]:
        """A draft step's top-k of fp32 logits [rows, W] (10 % -inf) with probabilities: compact_topk (backend
        cuda) or the unfused exact-order path (torch) through a column map, or EAGLE3's softmax + topk."""
        N, W, dev = case.M, case.W, self.device
        logits = torch.randn(N, W, generator=self.gen, device=dev)
        logits.masked_fill_(torch.rand(N, W, generator=self.gen, device=dev) < 0.1, float("-inf"))
        if case.op == "topk_stock":
            return [lambda: torch.softmax(logits, dim=-1).topk(TOPK_K, dim=-1)], 1, None
        fn = _op("compact_topk")
        col_ids = torch.randperm(1 << 20, generator=self.gen, device=dev)[:W]  # target ids of the columns
        return [lambda: fn(logits, col_ids, None, TOPK_K, fallback_id=0, mode=2, backend=case.backend)], 1, None

    def window_fns(self, case: Case) -> tuple[list[Callable[[], object]], int, None]:
        """One verify round of the window policy as the verify hook runs it (``ops.window_verify``: the round's
        entries, its telemetry and the window update), every position accepted: ``draft_tokens`` draft tokens and
        ``block - draft_tokens`` top-K ids a request (``WINDOW_VERIFY_TOPK`` per position, the shipped window's)."""
        fn = _op("window_verify")
        cap, B, n, V = case.W, case.batch, case.block, case.vocab
        nd, k = self.args.draft_tokens, WINDOW_VERIFY_TOPK
        S = max(1, (n - nd) // k)
        R = max(B, *self.args.window_batches)
        dev, g = self.device, self.gen
        # Steady state: a full ring (the stream has wrapped), a published table.
        ring = torch.randint(0, V, (R, cap + 1), generator=g, device=dev, dtype=torch.int32)
        ring[:, cap] = -1
        length = torch.full((R,), 7 * cap + 5, dtype=torch.int64, device=dev)
        ids = random_sets(R, cap, V, g, dev)
        cnt = torch.full((R,), cap, dtype=torch.int32, device=dev)
        rows = torch.randperm(R, generator=g, device=dev)[:B].to(torch.int64)
        # SGLang's verify tensors: the tree path compacted to the front, all S positions accepted
        node = torch.arange(S, device=dev).clamp(max=nd - 1)
        accept_index = (torch.arange(B, device=dev)[:, None] * nd + node[None, :]).to(torch.int32)
        kk = max(k, 10)
        round_ = ops.WindowRound(
            ring=ring,
            length=length,
            ids=ids,
            cnt=cnt,
            acc=torch.zeros(4, R, dtype=torch.float64, device=dev),
            rows=rows,
            draft_token=torch.randint(0, V, (B * nd,), generator=g, device=dev),
            accept_index=accept_index,
            accept_lens=torch.full((B,), S, dtype=torch.int32, device=dev),
            predict=torch.randint(0, V, (B * nd,), generator=g, device=dev, dtype=torch.int32),
            topk_values=torch.randn(B * nd, kk, generator=g, device=dev).sort(1, descending=True).values,
            topk_ids=torch.randint(0, V, (B * nd, kk), generator=g, device=dev),
            hot=None,
            k=k,
            context=True,
            compacted=True,
            fallback_id=0,
            vocab_size=V,
        )

        def call():
            fn(round_, backend=case.backend)

        return [call], 1, None


def _op(name: str) -> Callable:
    f = getattr(ops, name, None)
    if f is None:
        raise Skip(f"sglang_specvocab.ops has no {name} (ops API not there yet)")
    return f


def available_backends(device: torch.device) -> tuple[list[str] | None, str | None]:
    f = getattr(ops, "available_backends", None)
    if f is None:
        return None, "sglang_specvocab.ops has no available_backends (ops API not there yet)"
    try:
        return list(f(device)), None
    except Exception as exc:  # noqa: BLE001 (recorded in the results: the sweep goes on)
        return None, f"ops.available_backends({device}) raised {type(exc).__name__}: {exc}"


# -- environment -------------------------------------------------------------------------------


def _run_text(cmd: list[str]) -> str | None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=True)
        return out.stdout.strip() or None
    except Exception:  # noqa: BLE001 (a fact the machine cannot give is recorded as unknown)
        return None


def environment(device: torch.device, git: str | None = None) -> dict:
    """The device (its name as ``torch.cuda.get_device_name`` gives it: what ``headcost.costs_for`` matches) and the
    versions; the checkout's revision from ``git_revision``."""
    dev: dict = {"type": device.type}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        dev.update(
            name=torch.cuda.get_device_name(device),
            capability=f"{props.major}.{props.minor}",
            sm_count=props.multi_processor_count,
            memory_bytes=props.total_memory,
            l2_bytes=getattr(props, "L2_cache_size", None),
            driver=_run_text(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]),
        )
        if dev["driver"]:
            lines = dev["driver"].splitlines()
            dev["driver"] = lines[min(device.index or 0, len(lines) - 1)]
    else:
        dev.update(name=platform.processor() or platform.machine(), driver=None, threads=torch.get_num_threads())
    try:
        import triton  # optional: Triton may be absent

        triton_version = triton.__version__
    except Exception:  # noqa: BLE001 (absent or broken: recorded as unknown)
        triton_version = None
    rev, source = git_revision(git)
    versions = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton_version,
        "git": rev,
        "git_source": source,
    }
    return {"device": dev, "versions": versions}


def git_revision(option: str | None = None) -> tuple[str | None, str]:
    """The checkout's revision and where it came from: ``--git REV``, else ``$SV_GIT`` (a lease's command sets it to
    ``git describe --always --dirty`` of the checkout it staged: the GPU machine's copy has no .git), else git itself
    (``rev-parse HEAD``, ``+dirty`` with uncommitted changes), else None."""
    if option:
        return option, "--git"
    if os.environ.get("SV_GIT"):
        return os.environ["SV_GIT"], "SV_GIT"
    git = _run_text(["git", "-C", str(ROOT), "rev-parse", "HEAD"])
    if git is None:
        return None, "unknown: no --git, no SV_GIT, no git checkout"
    dirty = _run_text(["git", "-C", str(ROOT), "status", "--porcelain"])
    return git + ("+dirty" if dirty else ""), "git rev-parse"


def device_slug(env: dict) -> str:
    if env["device"]["type"] == "cpu":
        return "cpu"
    name = re.sub(r"^nvidia\s+", "", env["device"]["name"].lower())
    return re.sub(r"[^a-z0-9]+", "-", name).strip("-") or "gpu"


def measure_launch(bench: Bench) -> dict:
    """The gap between kernels in a CUDA graph: a one-element kernel's time per call (the cost model's launch_us)."""
    x = torch.zeros(1, device=bench.device)
    t = bench.timer([lambda: x.add_(1)])
    return summarize(t.samples_us)


def measure_copy(bench: Bench) -> dict:
    """Achievable bandwidth: a large device-to-device copy, bytes read + written over the median time."""
    n = bench.args.copy_mb * (1 << 20)
    src = torch.randint(0, 255, (n,), dtype=torch.uint8, device=bench.device, generator=bench.gen)
    dst = torch.empty_like(src)
    t = bench.timer([lambda: dst.copy_(src)])
    stats = summarize(t.samples_us)
    return {"copy_Bps": 2 * n / (stats["median_us"] * 1e-6), "copy_bytes": 2 * n, **stats}


# -- the run -----------------------------------------------------------------------------------


def record_of(case: Case, **extra) -> dict:
    rec = {"op": case.op, "backend": case.backend, "W": case.W, "d": case.d, "rows": case.rows, "batch": case.batch}
    rec.update(M=case.M, vocab=case.vocab)
    if case.block is not None:
        rec["block"] = case.block
    if case.kind is not None:
        rec.update(kind=case.kind, H=case.H, C=union_columns(case), mode=case.mode)
    rec.update(extra)
    return rec


def head_fields(args: KernelBench, case: Case) -> dict:
    """A head op's plan ``auto`` picks for its shape on this device and the pool its sets are drawn from."""
    if case.op not in HEAD_OPS:
        return {}
    return {
        "auto_mode": auto_plan_of(args, case.W, case.d, case.rows, case.batch, case.vocab, case.kind),
        "pool": hb.pool_size(case.batch, case.W, case.H, headcost.shipped_union_sizes()),
    }


def run_case(bench: Bench, case: Case, avail: list[str] | None, avail_err: str | None, result: dict) -> dict:
    rec = _run_case(bench, case, avail, avail_err, result)
    rec.update(head_fields(bench.args, case))
    heads = bench.data.get(case.data_key, {}).get("last_heads")
    if case.op == "head" and case.mode.startswith("union") and heads and heads[0].union_ids is not None:
        rec["union"] = int((heads[0].union_ids >= 0).sum())  # measured after timing: one host read
    return rec


def _run_case(bench: Bench, case: Case, avail: list[str] | None, avail_err: str | None, result: dict) -> dict:
    if case.op in (*OURS, "window_round", "head", "topk"):
        if avail is None:
            return record_of(case, status="skipped", reason=avail_err)
        if case.backend not in avail:
            why = (
                f"backend '{case.backend}' unavailable on {bench.device.type} (available: {', '.join(avail) or 'none'})"
            )
            return record_of(case, status="skipped", reason=why)
    try:
        calls, sets, check = bench.fns(case)
        err = check() if check is not None else None
        timing = bench.timer(calls)
    except Skip as exc:
        return record_of(case, status="skipped", reason=str(exc))
    except NotImplementedError as exc:
        return record_of(case, status="skipped", reason=f"not implemented: {exc}"[:300])
    except torch.cuda.OutOfMemoryError:
        bench.data.clear()
        if bench.device.type == "cuda":
            torch.cuda.empty_cache()
        return record_of(case, status="skipped", reason="out of memory")
    except Exception as exc:
        if "CUDA error" in str(exc) or "illegal memory" in str(exc):
            raise  # the context is gone: save and stop
        return record_of(case, status="error", reason=f"{type(exc).__name__}: {exc}"[:300])
    stats = summarize(timing.samples_us)
    bw = result["bandwidth"]
    rec = record_of(case, status="ok", **stats, inner=timing.inner, sets=sets, graph=timing.graph)
    rec.update(bandwidth_fields(case_bytes(case, bench.elem), stats["median_us"], bw["peak_Bps"], bw["copy_Bps"]))
    if case.op in ("window_round", *TOPK_OPS):  # no bandwidth ideal for sort-bound ops
        for k in ("ideal_us_peak", "frac_ideal", "ideal_us_copy", "frac_ideal_copy"):
            rec[k] = None
    if case.op in (*OURS, "head"):
        tol = CHECK_TOL[bench.args.dtype]
        finite = err is None or math.isfinite(err)
        rec["rel_err"] = err if finite else None
        if not finite:
            rec["check"] = "FAILED (non-finite output)"
        else:
            rec["check"] = "skipped (too large)" if err is None else "ok" if err <= tol else f"FAILED (> {tol:g})"
    if timing.note:
        rec["note"] = timing.note
    return rec


class Terminated(BaseException):
    """SIGTERM arrived: the sweep stops where it is and the run ends with its results saved."""


def _terminate(signum, frame) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one is enough: the save that follows must finish
    raise Terminated


def run(args: KernelBench) -> int:
    """``sglang-specvocab bench kernels`` (its command line read once, ``KernelBench.from_args``): the sweep, saved
    as it goes; 1 if an output check failed, 143 after a SIGTERM, 130 after Ctrl-C (the results saved either way)."""
    started = time.perf_counter()
    args = resolve(args)
    bench, result, cases, out = _setup(args)
    try:
        previous = signal.signal(signal.SIGTERM, _terminate)
    except ValueError:  # not the main thread: no handler, SIGTERM keeps its default
        previous = None
    why = None
    try:
        _sweep(bench, result, cases, out, started)
    except Terminated:
        why = "terminated (SIGTERM)"
    except KeyboardInterrupt:
        why = "interrupted (Ctrl-C)"
    except BaseException as exc:
        why = f"stopped by {type(exc).__name__}: {exc}"[:200]
        raise
    finally:
        _finish(args, result, cases, out, why)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    if args.fit:
        _fit(result, out)
    md = out.with_suffix(".md").read_text()
    print(md.split("## Skipped")[0].rstrip())
    print(f"\nwrote {out} and {out.with_suffix('.md').name}" + (f", {result['plot']}" if result.get("plot") else ""))
    if why is not None:
        print(f"bench_kernels: {why}; the results above hold what was measured", file=sys.stderr)
        return 143 if why.startswith("terminated") else 130
    wrong = [r for r in result["records"] if r.get("check", "").startswith("FAILED")]
    return 1 if wrong else 0


def _setup(args: KernelBench) -> tuple[Bench, dict, list[Case], Path]:
    """The device, the environment, the bandwidth and launch measurements, the result's skeleton and the cases."""
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SpecVocabError("--device cuda but torch sees no GPU (use --device cpu)")
    if device.type == "cuda":
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
    if args.threads:
        torch.set_num_threads(args.threads)
    env = environment(device, args.git)
    out = args.out or Path("benchmarks") / f"kernels-{device_slug(env)}.json"
    torch.manual_seed(args.seed)
    gen = torch.Generator(device=device)
    gen.manual_seed(args.seed)
    timer = make_timer(device, args.iters, args.warmup, args.max_ms, graph=not args.no_graph)
    bench = Bench(args, device, DTYPES[args.dtype], timer, env["device"].get("l2_bytes"), gen)
    if args.peak_bw is not None:
        peak, source = args.peak_bw, "--peak-bw"
    elif device.type == "cuda":
        peak, source = default_peak(env["device"]["name"])
    else:
        peak, source = None, "none for a CPU: use --peak-bw"
    copy = measure_copy(bench)
    launch = measure_launch(bench)
    config = args.config()
    cases = expand(args)
    result = {
        "schema": SCHEMA,
        "cpu": device.type == "cpu",
        **env,
        "command": args.command_line,
        "config": config,
        "timing": {"method": timer.method, "iters": args.iters, "warmup": args.warmup, "max_ms": args.max_ms},
        "bandwidth": {"peak_Bps": peak, "peak_source": source, **copy},
        "launch": launch,
        "head_costs": headcost.costs_for(env["device"].get("name") or device.type).to_json()
        if device.type == "cuda"
        else headcost.fallback_costs(device.type).to_json(),
        "union_sizes": headcost.shipped_union_sizes().to_json(),
        "partial": True,
        "progress": {"cases": len(cases), "done": 0, "not_run": len(cases), "why": None},
        "records": [],
        "targets": [],
    }
    avail, avail_err = available_backends(device)
    result["available_backends"] = bench.avail = avail
    bench.avail_err = avail_err
    print(
        f"bench_kernels: {len(cases)} cases on {env['device'].get('name')} ({args.preset} sweep); "
        f"backends available: {avail if avail is not None else avail_err}; "
        f"copy {copy['copy_Bps'] / 1e9:.0f} GB/s; peak {peak and peak / 1e9} GB/s ({source}); out {out}",
        flush=True,
    )
    return bench, result, cases, out


def _sweep(bench: Bench, result: dict, cases: list[Case], out: Path, started: float) -> None:
    """Run the cases in order, one record each; save every ``SAVE_EVERY_S`` seconds and at every change of d."""
    args = bench.args
    bar = None
    if tqdm is not None and not args.no_progress:
        bar = tqdm(total=len(cases), unit="case", desc="bench", mininterval=2.0, file=sys.stderr)
    last_d, last_save = object(), time.perf_counter()
    try:
        for i, case in enumerate(cases):
            if result["records"] and (case.d != last_d or time.perf_counter() - last_save > SAVE_EVERY_S):
                save_progress(args, result, cases, out)  # a run cut short keeps what it measured
                last_save = time.perf_counter()
            last_d = case.d
            if bar is not None:
                bar.set_postfix_str(
                    f"{case.op} {case.backend} W{case.W} d{case.d} r{case.rows} b{case.batch}", refresh=False
                )
            if args.time_budget_s is not None and time.perf_counter() - started > args.time_budget_s:
                why = f"time budget reached (--time-budget-s {args.time_budget_s:g})"
                result["records"].extend(not_run(args, c, why) for c in cases[i:])
                break
            result["records"].append(run_case(bench, case, bench.avail, bench.avail_err, result))
            if bar is not None:
                bar.update()
    finally:
        if bar is not None:
            bar.close()


def not_run(args: KernelBench, case: Case, why: str) -> dict:
    """The record of a case the run did not reach (time budget, SIGTERM): skipped, ``not_run``."""
    return record_of(case, status="skipped", reason=why, not_run=True, **head_fields(args, case))


def save_progress(args: KernelBench, result: dict, cases: list[Case], out: Path, final: bool = False) -> None:
    """Save what was measured: the targets on it and on the cases still to run (``pending``), ``partial`` while
    any case has no record or was not run; the plots with the ``final`` save."""
    done = len(result["records"])
    skipped = sum(bool(r.get("not_run")) for r in result["records"])
    pending = [record_of(c, status="pending", **head_fields(args, c)) for c in cases[done:]]
    stopped = next((r["reason"] for r in result["records"] if r.get("not_run")), None)
    result["partial"] = bool(pending or skipped)
    result["progress"] = {
        "cases": len(cases),
        "done": done - skipped,
        "not_run": len(pending) + skipped,
        "why": stopped if result["partial"] else None,
    }
    save(result, out, with_plot=final and not args.no_plot, pending=pending)


def _finish(args: KernelBench, result: dict, cases: list[Case], out: Path, why: str | None) -> None:
    """The last save: the cases not reached recorded as not run (with ``why``), the plots."""
    if why is not None:
        done = len(result["records"])
        result["records"].extend(not_run(args, c, why) for c in cases[done:])
    save_progress(args, result, cases, out, final=True)


def _fit(result: dict, out: Path) -> None:
    from .fit import fit  # the fit of this run's measurements

    try:
        costs = fit(result, str(out))
    except SpecVocabError as exc:
        if not result.get("partial"):
            raise
        print(f"bench_kernels: no cost fit: {exc} (the run was cut short)", file=sys.stderr)
        return
    path = out.with_name(out.stem + ".costs.json")
    path.write_text(json.dumps(costs.to_json(), indent=1) + "\n")
    print(f"wrote {path} (ship it as configs/data/head-costs-<device>.json for auto to use it)")

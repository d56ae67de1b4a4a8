"""The cases of ``bench kernels``: the presets (``GRIDS``), one ``Case`` per timing, the order they run in, and the
bytes each must move at the least.

Presets: ``full`` (every W, d, rows and batch of interest), ``quick`` (the headline shapes, one full head), ``tiny``
(seconds on a CPU) and ``lease`` (``--lease``: one GPU lease's call, the targets' cases first; see ``lead_cases``).

The ``lease`` preset. Its must-have part (the *lead*, ``lead_cases``) is the draft head step of the targets, most
valuable first:

1. the headline point, d 4096 (V 128,256), W 3072, batch 1, both draft kinds (d2t 32k and full), rows 1 and 10:
   EAGLE3's step (``stock``) and our head per-request and in the plan ``auto`` picks;
2. Gemma-3 270M's shape, d 640 (V 262,144): W 3072, 2048, 1024 x batch 1, 8, 12, 16, 32 x both kinds, rows 1
   (and rows 10 at W 3072, batch 1);
3. the rest of d 4096 (V 128,256) on the same grid;
4. the window round at batch 64 (each backend that has one: not Triton);

then the rest of the ``quick`` sweep (a case already run is not repeated), while ``--time-budget-s`` lasts. Our head
is timed per-request and in auto's plan where that is a union plan; where auto picks ``stock`` the server runs
EAGLE3's own code path, which is the ``stock`` op (timed anyway), so our stock plan is not timed in the lead.

Size and time (an estimate: no GPU has run this preset). The lead is 2 shapes x 3 W x 5 batches x 2 kinds = 60
points of rows 1 and 4 of rows 10, each with EAGLE3's step and our per-request head (128 cases), one more case where
auto picks a union plan (none with the shipped H100 constants; one on an H200, which falls back to bandwidth-only
constants), and the window round at batch 64 on the CUDA backend: 129-131 cases. Basis: the old quick sweep, 327
cases of which 169 draft-step heads (d 4096, V 128,256, W 3072, batch up to 128, rows up to 10, every plan), took
45 s on an H100 with its start-up (the copy and launch measurements) in, as the lease plans state it (its log
is not in the repository): 0.14 s a case; the full sweep of 2,118
op cases took 190 s there (``benchmarks/kernels-h100-8a4c739.md``, the device-staging notes): 0.09 s a case. The
lead's cases are no larger than the quick sweep's heads (rows 1 but 4 points, batch <= 32; Gemma's V 262,144 only
at d 640), so at 0.14-0.2 s a case the lead takes 18-26 s, plus about 5 s of start-up and weights and 3-8 s of
Triton compiling EAGLE3's topk-1 kernels on a fresh machine (vocabulary and split count are constexpr: one pair per
head width, 32,768, 128,256 and 262,144 rows; the old quick sweep had no Triton kernel in it): 28-39 s on an H100,
inside the 45 s asked for. The rest of the quick sweep (about 300 cases, 40 s; the dense static head first, so
that ``--fit`` has its measurements early) fills what the time budget leaves.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ... import headcost, ops
from ..options import FromArgs
from . import heads as hb
from .heads import D2T_ROWS, HEAD_PLANS
from .kernels_report import HEAD_OPS, OPS, OURS, TOPK_OPS

TOPK_K = 4  # the draft tree's top-k of the top-k cases
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}

GRIDS = {
    # the whole sweep: every W, d, rows and batch of interest
    "full": {
        "widths": [512, 1024, 2048, 3072, 4096, 8192, 16384, 32768],
        "dims": [640, 2048, 4096, 5120],
        "rows": [1, 4, 10],
        "batches": [1, 8, 32, 64],
        "full_vocabs": [128256, 151936, 262144],
        "index_vocab": 128256,
        "dense_width": 32768,
        "window_batches": [1, 8, 64],
        "capacity": 3072,
        "draft_tokens": 4,
        "topk_ids": 15,
        "target_widths": [2048, 3072],
        "target_d": 4096,
        "target_window_batch": 64,
        "target_head_width": 3072,
        "target_head_batch": 1,
        "target_rows": 10,
        "copy_mb": 2048,
        "head_dims": [640, 4096, 5120],
        "head_shapes": None,  # (d, V) pairs of the head ops; None: every head d with every full V
        "head_batches": [1, 8, 32, 64, 128],
        "head_widths": [3072],
        "head_kinds": ["d2t", "full"],
        "d2t_rows": D2T_ROWS,
        "topk_widths": [3072, 16384, 49152, 262144],
        "topk_rows": [1, 4, 40, 256],
        # the lead (run first, the lease preset's): none here
        "lead_shapes": [],
        "lead_widths": [],
        "lead_batches": [],
        "lead_window_batches": [],
    },
    # a first look: exactly the headline (target) shapes, one full head
    "quick": {
        "widths": [2048, 3072],
        "dims": [4096],
        "rows": [1, 4, 10],
        "batches": [1, 8, 32, 64],
        "full_vocabs": [128256],
        "window_batches": [1, 8, 64],
        "head_dims": [4096],
        "topk_widths": [1200, 3072, 49152],  # two fused widths, four points: the fit's top-k line
        "topk_rows": [4, 40],
    },
    # one GPU lease's call: the targets' draft head steps first (module doc), then the quick sweep (merged over it)
    "lease": {
        "lead_shapes": [[4096, 128256], [640, 262144]],
        "lead_widths": [3072, 2048, 1024],
        "lead_batches": [1, 8, 12, 16, 32],
        "lead_window_batches": [64],
    },
    # seconds on a CPU: for the test and a sanity run
    "tiny": {
        "widths": [64, 128],
        "dims": [32],
        "rows": [1, 2],
        "batches": [1, 2],
        "full_vocabs": [2048],
        "index_vocab": 1024,
        "dense_width": 256,
        "window_batches": [1, 2],
        "capacity": 64,
        "draft_tokens": 4,
        "topk_ids": 6,
        "target_widths": [64, 128],
        "target_d": 32,
        "target_window_batch": 2,
        "target_head_width": 48,
        "target_rows": 2,
        "copy_mb": 8,
        "head_dims": [32],
        "head_batches": [1, 3],
        "head_widths": [48],
        "d2t_rows": 512,
        "topk_widths": [48, 300],
        "topk_rows": [1, 3],
    },
}
PRESET_CHAIN = {"full": ("full",), "quick": ("full", "quick"), "lease": ("full", "quick", "lease"),
                "tiny": ("full", "tiny")}  # fmt: skip


@dataclass
class KernelBench(FromArgs):
    """``bench kernels``' settings: its command line, read once (``from_args``), with the preset's shapes filled in
    where no option gave them and the device, backends and head kernel this machine has (``resolve``). The sweep,
    the bench and the report read these, never the argparse namespace."""

    quick: bool = False
    tiny: bool = False
    lease: bool = False
    device: str | None = None
    git: str | None = None
    ops: list[str] = field(default_factory=lambda: list(OPS))
    backends: list[str] | None = None
    dtype: str = "bf16"
    iters: int = 200
    warmup: int = 10
    max_ms: float = 200.0
    peak_bw: float | None = None
    out: Path | None = None
    seed: int = 0
    hot: bool = False
    no_graph: bool = False
    max_mem_gb: float | None = None
    time_budget_s: float | None = None
    threads: int | None = None
    fit: bool = False
    head_kernel: str | None = None
    no_plot: bool = False
    no_progress: bool = False
    command_line: str | None = None
    preset: str = "full"
    # the shapes (``GRIDS``); None: the preset's
    widths: list[int] | None = None
    dims: list[int] | None = None
    rows: list[int] | None = None
    batches: list[int] | None = None
    full_vocabs: list[int] | None = None
    index_vocab: int | None = None
    dense_width: int | None = None
    window_batches: list[int] | None = None
    capacity: int | None = None
    draft_tokens: int | None = None
    topk_ids: int | None = None
    target_widths: list[int] | None = None
    target_d: int | None = None
    target_window_batch: int | None = None
    target_head_width: int | None = None
    target_head_batch: int | None = None
    target_rows: int | None = None
    copy_mb: int | None = None
    head_dims: list[int] | None = None
    head_shapes: list[tuple[int, int]] | None = None
    head_batches: list[int] | None = None
    head_widths: list[int] | None = None
    head_kinds: list[str] | None = None
    d2t_rows: int | None = None
    topk_widths: list[int] | None = None
    topk_rows: list[int] | None = None
    lead_shapes: list | None = None
    lead_widths: list[int] | None = None
    lead_batches: list[int] | None = None
    lead_window_batches: list[int] | None = None

    def config(self) -> dict:
        """The settings recorded with the results (the output path apart)."""
        return {k: v for k, v in asdict(self).items() if k not in ("out", "command_line")}


def resolve(args: argparse.Namespace | KernelBench) -> KernelBench:
    """The settings of a ``bench kernels`` command line: the sweep from the preset (``--tiny``/``--quick``/``--lease``,
    else the full grid) where no shape option was given, and the device and backends from what this machine has."""
    cfg = args if isinstance(args, KernelBench) else KernelBench.from_args(args)
    preset = "tiny" if cfg.tiny else "lease" if cfg.lease else "quick" if cfg.quick else "full"
    merged: dict = {}
    for name in PRESET_CHAIN[preset]:
        merged.update(GRIDS[name])
    for key, value in merged.items():
        if getattr(cfg, key) is None:
            setattr(cfg, key, value)
    cfg.preset = preset
    if cfg.device is None:
        cfg.device = "cuda" if torch.cuda.is_available() else "cpu"
    if cfg.backends is None:
        cfg.backends = ["cuda", "triton"] if cfg.device.startswith("cuda") else ["cuda", "triton", "torch"]
    if cfg.head_kernel is None:
        cfg.head_kernel = ops.resolve("auto", torch.device(cfg.device), "indexed_logits")  # what the server runs
    return cfg


@dataclass(frozen=True)
class Case:
    """One timing: (op, backend, W, d, rows, batch); ``vocab`` = weight rows the op sees."""

    op: str
    backend: str
    W: int
    d: int | None
    rows: int | None
    batch: int
    vocab: int | None = None
    block: int | None = None  # window_round: entries per verify round (draft tokens + top-K ids)
    mode: str | None = None  # head: the plan (per-request, union-indexed, union-gemm, stock)
    kind: str | None = None  # head ops: the draft kind, d2t (a 32k head) or full (V rows)
    d2t_rows: int = D2T_ROWS  # head ops: the rows of a d2t draft's head

    @property
    def M(self) -> int | None:
        return None if self.rows is None else self.rows * self.batch

    @property
    def H(self) -> int | None:
        """Head ops: the draft head's rows."""
        return None if self.kind is None else self.d2t_rows if self.kind == "d2t" else self.vocab

    @property
    def data_key(self) -> tuple:
        """Cases with one data key share their inputs (ids, hidden rows, packed rows; a head shape's tables)."""
        if self.op in HEAD_OPS:
            return ("head", self.W, self.d, self.rows, self.batch, self.vocab, self.kind)
        return (self.W, self.d, self.rows, self.batch) if self.op in (*OURS, "index_select_matmul") else (self.op, self)


def head_shapes(args: KernelBench) -> list[tuple[int, int]]:
    """(d, V) of the head ops past the lead: ``head_shapes`` where set, else every head d with every full V; the
    target d first."""
    pairs = args.head_shapes or [(d, V) for d in args.head_dims for V in args.full_vocabs]
    return sorted(((int(d), int(V)) for d, V in pairs), key=lambda p: (p[0] != args.target_d, p[0]))


def elem_size(args: KernelBench) -> int:
    return torch.empty((), dtype=DTYPES[args.dtype]).element_size()


def auto_plan_of(args: KernelBench, W: int, d: int, r: int, b: int, V: int, kind: str) -> str:
    """The plan ``auto`` picks for a head case on this run's device."""
    H = args.d2t_rows if kind == "d2t" else V
    C = union_columns(Case("head", "", W, d, r, b, V, kind=kind, d2t_rows=args.d2t_rows))
    return hb.auto_plan(b, r, W, d, H, V, C, elem_size(args), torch.device(args.device))


def lead_points(args: KernelBench) -> list[tuple[int, int, int, int]]:
    """(d, V, W, batch) of the lead in the order they run: the headline point (the target d, W and batch), then every
    point of the other shapes, then the rest of the target d's."""
    pts = [
        (int(d), int(V), W, b)
        for d, V in args.lead_shapes
        for W in sorted(args.lead_widths, key=lambda W: (W != args.target_head_width, -W))
        for b in sorted(args.lead_batches, key=lambda b: (b != args.target_head_batch, b))
    ]

    def rank(p: tuple) -> int:
        if p[0] == args.target_d and p[2] == args.target_head_width and p[3] == args.target_head_batch:
            return 0
        return 2 if p[0] == args.target_d else 1

    return sorted(pts, key=rank)  # stable: each shape's own order kept


def lead_cases(args: KernelBench) -> list[Case]:
    """The lease preset's must-have part (module doc): per lead point and draft kind, EAGLE3's step and our head
    per-request and in auto's plan (where auto picks stock the step is EAGLE3's: per-request shows what the other side
    of the crossover costs), rows 1 and the rows target's rows at the target W and batch; then the window round at
    the lead's batches."""
    sel, out = set(args.ops), []
    for d, V, W, b in lead_points(args):
        at_target = W == args.target_head_width and b == args.target_head_batch
        for r in [1, args.target_rows] if at_target else [1]:
            for kind in args.head_kinds:
                if "stock" in sel:
                    out.append(Case("stock", "torch", W, d, r, b, V, kind=kind, d2t_rows=args.d2t_rows))
                if "head" not in sel:
                    continue
                auto = auto_plan_of(args, W, d, r, b, V, kind)
                plans = [p for p in dict.fromkeys([auto, "per-request"]) if p != "stock"]
                out.extend(
                    Case("head", args.head_kernel, W, d, r, b, V, mode=m, kind=kind, d2t_rows=args.d2t_rows)
                    for m in plans
                )
    if "window_round" in sel:
        n = args.draft_tokens + args.topk_ids
        for b in args.lead_window_batches:
            out.extend(
                Case("window_round", be, args.capacity, None, None, b, args.index_vocab, n)
                for be in window_backends(args)
            )
    return out


def window_backends(args: KernelBench) -> list[str]:
    """The backends of the window update: ours but Triton, which has none (``ops.backend_without_triton``)."""
    return [b for b in args.backends if b != "triton"]


def expand(args: KernelBench) -> list[Case]:
    """Every case of the sweep, in the order it runs: the lead (the lease preset's), then window rounds, top-k, per d
    (target d first) the dense static head, indexed / packed / index_select for each (W, rows, batch), the dense full
    heads, then the draft-step heads; a case already in the lead is not repeated."""
    cases = lead_cases(args)
    seen = set(cases)
    cases.extend(c for c in _sweep(args) if c not in seen)
    return cases


def _sweep(args: KernelBench) -> list[Case]:
    cases: list[Case] = []
    sel = set(args.ops)
    if "window_round" in sel:
        n = args.draft_tokens + args.topk_ids
        for b in args.window_batches:
            for be in window_backends(args):
                cases.append(Case("window_round", be, args.capacity, None, None, b, args.index_vocab, n))
    for W in args.topk_widths if sel & set(TOPK_OPS) else ():
        for n in args.topk_rows:
            if "topk" in sel:
                backends = dict.fromkeys(b for b in (*args.backends, "torch") if b != "triton")  # no Triton top-k
                cases.extend(Case("topk", be, W, None, n, 1) for be in backends)
            if "topk_stock" in sel:
                cases.append(Case("topk_stock", "torch", W, None, n, 1))
    dims = sorted(args.dims, key=lambda d: (d != args.target_d, d))
    for d in dims:
        if "dense_static" in sel:  # first: with a few indexed cases, what --fit needs, early in a cut-short run
            for r in args.rows:
                for b in args.batches:
                    cases.append(Case("dense_static", "torch", args.dense_width, d, r, b, args.dense_width))
        for W in args.widths:
            for r in args.rows:
                for b in args.batches:
                    for op in OURS:
                        if op in sel:
                            cases.extend(Case(op, be, W, d, r, b, args.index_vocab) for be in args.backends)
                    if "index_select_matmul" in sel:
                        cases.append(Case("index_select_matmul", "torch", W, d, r, b, args.index_vocab))
        if "dense_full" in sel:
            for V in args.full_vocabs:
                for r in args.rows:
                    for b in args.batches:
                        cases.append(Case("dense_full", "torch", V, d, r, b, V))
    if sel & set(HEAD_OPS):
        cases.extend(_head_sweep(args, sel))
    return cases


def _head_sweep(args: KernelBench, sel: set) -> list[Case]:
    cases = []
    H2 = args.d2t_rows
    for d, V in head_shapes(args):
        for W in args.head_widths:
            for kind in args.head_kinds:
                for r in args.rows:
                    for b in args.head_batches:
                        if "stock" in sel:
                            cases.append(Case("stock", "torch", W, d, r, b, V, kind=kind, d2t_rows=H2))
                        if "head" in sel:
                            cases.extend(
                                Case("head", args.head_kernel, W, d, r, b, V, mode=m, kind=kind, d2t_rows=H2)
                                for m in HEAD_PLANS
                            )
                        if "gemma4_mtp" in sel and kind == "full":
                            cases.append(Case("gemma4_mtp", "torch", W, d, r, b, V, kind=kind, d2t_rows=H2))
    return cases


def weight_rows(args: KernelBench, d: int | None = None) -> int:
    """Rows of the one weight allocated per d (of ``d``; None: of any d): every op's vocabulary is a prefix of it."""
    sel = set(args.ops)
    need = []
    dims = args.dims if d is None else [x for x in args.dims if x == d]
    if dims and sel & {*OURS, "index_select_matmul"}:
        need.append(args.index_vocab)
    if dims and "dense_static" in sel:
        need.append(args.dense_width)
    if dims and "dense_full" in sel:
        need.extend(args.full_vocabs)
    if sel & set(HEAD_OPS):
        shapes = [*head_shapes(args), *((int(x), int(V)) for x, V in args.lead_shapes)]
        need.extend(V for x, V in shapes if d is None or x == d)
    return max(need, default=0)


# -- bandwidth math ----------------------------------------------------------------------------


def case_bytes(case: Case, elem: int) -> int:
    """The bytes the op must move at the least (rows read once)."""
    if case.op == "window_round":
        # ring row read, table row written, the block read (int32 each)
        return case.batch * ((case.W + 1) * 4 + case.W * 4 + (case.block or 0) * 4)
    if case.op in ("dense_static", "dense_full"):
        return case.W * case.d * elem
    if case.op in HEAD_OPS:
        return head_bytes(case, elem)
    if case.op in TOPK_OPS:
        return case.M * case.W * 4  # the fp32 logits read once
    return case.batch * case.W * case.d * elem


def union_columns(case: Case) -> int:
    """The union head's columns for a head case: the config's default (16 sets, at most the head's rows)."""
    return min(max(case.W, 16 * case.W), case.H)


def head_bytes(case: Case, elem: int) -> int:
    """Head rows a head op must read at the least: per plan (the expected union for a union), the stock head's H,
    the Gemma-4 MTP head's gathered rows."""
    if case.op == "stock":
        return case.H * case.d * elem
    if case.op == "gemma4_mtp":
        per = case.vocab // hb.MTP_CLUSTERS
        return case.M * hb.MTP_TOP * per * case.d * elem + hb.MTP_CLUSTERS * case.d * elem
    U = hb.pool_size(case.batch, case.W, case.H, headcost.shipped_union_sizes())
    return int(hb.expected_bytes(case.mode, case.batch, case.W, case.d, case.H, U, union_columns(case), elem))

"""The head's cost model: the predicted time of each way to score a batch, and the choice ``head.batch: auto`` makes.

A draft step scores ``N = bs * n`` hidden rows (``n`` rows per request: the tree's ``topk`` in the draft loop, 1 in
the draft extends). The ways (``MODES``):

- ``per-request``: each request over its own set (the indexed kernel reads ``bs * W`` candidate rows);
- ``union-indexed``: the batch's deduplicated union of sets (``U`` distinct ids, at most ``C`` columns), scored in one pass of
  the indexed kernel with the whole batch on one slot: it reads only the ``U`` live rows, so its cost follows the
  union, not the static capacity;
- ``union-gemm``: the same union gathered into a ``[C, d]`` buffer (``index_select``) and scored by one dense GEMM
  (tensor cores at any N, but it reads, writes and reads again all ``C`` rows);
- ``stock``: the draft's own dense head over its ``H`` rows (what EAGLE3 runs).

Each piece is a roofline with a fixed start, ``t = t0 + max(bytes / bandwidth, flops / throughput)``, of one of three
kinds: ``indexed`` (our head kernel), ``dense`` (a cuBLAS GEMM) and ``copy`` (elementwise passes: gathers, the union's
bitmap and prefix sum, the mask). Every mode also pays the exact top-k over its logits' width as it runs: up to
``FUSED_TOPK_MAX_WIDTH`` columns one ``compact_topk`` launch (its own measured roofline where the fit had top-k
timings, else one copy pass), wider the unfused torch top-k, a pass of int64 keys plus ``WIDE_TOPK_LAUNCHES`` small
ops. The constants come from a file written by ``sglang-specvocab bench fit`` (device name, the measurements and
command they were fit to); a device with no file gets ``fallback_costs``: bandwidth only, so ``auto`` then picks the
mode that moves the fewest bytes.

Two rules keep ``auto`` from a plan it cannot vouch for: it chooses only among the plans a GPU has timed on the device
(``HeadCosts.modes``, from the fit's measurements; no file: ``per-request`` and ``stock``), and a plan other than
``stock`` must beat ``stock`` by the fit's worst relative error (``HeadCosts.margin``), so a model error of that size
still never makes the choice slower than EAGLE3's own step.

The union's size is not a shape: ``auto`` uses the expected size ``E[U](bs)`` measured in the lab (window sets over
Spec-Bench prompts, ``UnionSizes``), scaled to the set capacity and capped at ``bs * W``, the capacity and the head.

``choose`` is a pure function of static shapes (no tensor is read), so the head picks once per CUDA-graph batch
bucket, at capture; ``stock`` is always a candidate, so the chosen mode is never slower than it by the model (less
its margin).
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path

MODES = ("per-request", "union-indexed", "union-gemm", "stock")
UNION_MODES = ("union-indexed", "union-gemm")
SCHEMA = "head_costs/1"
UNION_SCHEMA = "union_sizes/1"
#: Bytes per element of the unfused exact top-k (an int64 key per logit: built, then read by torch.topk) and the
#: logsumexp; the fused one (``compact_topk``, up to ``FUSED_TOPK_MAX_WIDTH`` columns) reads each fp32 logit once.
TOPK_BYTES = 4 + 8 + 8 + 4
#: The widest logits the head gives to ``compact_topk`` (one CUDA block per row); wider ones (the stock heads) keep
#: torch's top-k, whose multi-block selection spreads a row over more SMs (to measure: ``bench kernels`` topk).
FUSED_TOPK_MAX_WIDTH = 16384
#: Bytes per element of the stock plan's top-k, EAGLE3's own: softmax (an fp32 read and write), then torch's top-k
#: (a read).
STOCK_TOPK_BYTES = 4 + 4 + 4
#: Launches a union call pays besides its scoring kernel (indexed_logits, or the gather's GEMM) and the top-k: the
#: build (the table read safe against bad slots and counts, bitmap, prefix sum, compaction, the bad-entry count),
#: the own view's membership mask, and for union-gemm the gather (and a d2t draft's row map). Counted, not
#: estimated: tests/test_head.py dispatches each plan on the CPU and pins these numbers to what it sees.
#: Ops of the unfused top-k of a wide union's logits (order keys, torch.topk, gather, logsumexp, the column map, the
#: fallback, the probabilities), by whether k is 1 (a max instead of the keys): counted on the CPU by
#: tests/test_head.py, as UNION_LAUNCHES.
WIDE_TOPK_LAUNCHES = {True: 14, False: 26}
#: The plans ``auto`` may choose on a device whose file names none (every GPU has timed these two).
MEASURED_DEFAULT = ("per-request", "stock")
UNION_LAUNCHES = {("union-indexed", False): 41, ("union-indexed", True): 41, ("union-gemm", False): 43,
                  ("union-gemm", True): 47}  # fmt: skip


@dataclass(frozen=True)
class Roofline:
    """``t0 + max(bytes / bytes_per_us, flops / flops_per_us)`` microseconds (``flops_per_us`` None: bandwidth only)."""

    t0_us: float
    bytes_per_us: float
    flops_per_us: float | None = None

    def time(self, nbytes: float, flops: float = 0.0) -> float:
        t = nbytes / self.bytes_per_us
        if self.flops_per_us:
            t = max(t, flops / self.flops_per_us)
        return self.t0_us + t


@dataclass(frozen=True)
class HeadCosts:
    """The constants of one device: three rooflines, the launch gap inside a graph, the fused top-k's roofline where it
    was measured, the plans a GPU timed here, the fit's worst relative error, and where they came from."""

    device: str
    match: tuple[str, ...]  # substrings of torch.cuda.get_device_name that this file serves (upper case)
    indexed: Roofline
    dense: Roofline
    copy: Roofline
    launch_us: float
    provenance: dict = field(default_factory=dict)
    topk: Roofline | None = None  # compact_topk as measured (None: priced as one copy pass)
    modes: tuple[str, ...] = MEASURED_DEFAULT  # the plans auto may choose: those a GPU timed on this device
    margin: float = 0.0  # a plan other than stock must be predicted this much faster than stock (relative)

    def to_json(self) -> dict:
        out = asdict(self)
        out["schema"] = SCHEMA
        out["match"] = list(self.match)
        out["modes"] = list(self.modes)
        return out

    @classmethod
    def from_json(cls, data: dict) -> HeadCosts:
        if data.get("schema") != SCHEMA:
            raise ValueError(f"head costs: schema {data.get('schema')!r} is not {SCHEMA!r}")
        return cls(
            device=data["device"],
            match=tuple(data["match"]),
            indexed=Roofline(**data["indexed"]),
            dense=Roofline(**data["dense"]),
            copy=Roofline(**data["copy"]),
            launch_us=float(data["launch_us"]),
            provenance=dict(data.get("provenance", {})),
            topk=Roofline(**data["topk"]) if data.get("topk") else None,
            modes=tuple(data.get("modes", MEASURED_DEFAULT)),
            margin=float(data.get("margin", 0.0)),
        )


def fallback_costs(device: str = "unknown") -> HeadCosts:
    """Bandwidth only, one bandwidth for every kind (a GPU with no fitted file, and the CPU): ``auto`` then
    minimises the bytes moved plus a start per kernel. The figures are placeholders whose ratios alone matter."""
    bw = 1e6  # bytes per microsecond (1 TB/s)
    line = Roofline(t0_us=5.0, bytes_per_us=bw)
    return HeadCosts(
        device=device,
        match=(),
        indexed=line,
        dense=line,
        copy=Roofline(t0_us=2.0, bytes_per_us=bw),
        launch_us=2.0,
        provenance={"source": "fallback: bandwidth only (no fitted constants for this device)"},
    )


@dataclass(frozen=True)
class UnionSizes:
    """Mean distinct ids in the union of ``bs`` requests' sets, over ``W``, measured at set capacity ``capacity``."""

    capacity: int
    batches: tuple[int, ...]
    ratio: tuple[float, ...]  # mean union size / capacity at each batch
    provenance: dict = field(default_factory=dict)

    def expected(self, bs: int, W: int) -> float:
        """``E[U]`` for ``bs`` requests of capacity ``W``: the measured ratio (interpolated in log bs, held flat past
        the ends) times ``W``, never above ``bs * W``."""
        xs = [math.log(b) for b in self.batches]
        x = math.log(max(bs, 1))
        if x <= xs[0]:
            r = self.ratio[0]
        elif x >= xs[-1]:
            # past the last measurement the union still grows: at the last measured slope per log(bs)
            slope = (self.ratio[-1] - self.ratio[-2]) / (xs[-1] - xs[-2]) if len(xs) > 1 else 0.0
            r = self.ratio[-1] + max(slope, 0.0) * (x - xs[-1])
        else:
            i = next(i for i in range(1, len(xs)) if x <= xs[i])
            t = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
            r = self.ratio[i - 1] + t * (self.ratio[i] - self.ratio[i - 1])
        return min(bs * W, r * W)

    def to_json(self) -> dict:
        return {
            "schema": UNION_SCHEMA,
            "capacity": self.capacity,
            "batches": list(self.batches),
            "ratio": list(self.ratio),
            "provenance": self.provenance,
        }

    @classmethod
    def from_json(cls, data: dict) -> UnionSizes:
        if data.get("schema") != UNION_SCHEMA:
            raise ValueError(f"union sizes: schema {data.get('schema')!r} is not {UNION_SCHEMA!r}")
        return cls(int(data["capacity"]), tuple(data["batches"]), tuple(data["ratio"]), dict(data["provenance"]))


#: With no measurement: every request's set is its own (the worst case: the union is bs * W).
DISJOINT = UnionSizes(
    1, tuple(2**i for i in range(13)), tuple(float(2**i) for i in range(13)), {"source": "none: sets assumed disjoint"}
)


@dataclass(frozen=True)
class Shape:
    """The static shapes of one head call (what a CUDA-graph bucket fixes)."""

    bs: int  # requests
    n: int  # hidden rows per request
    W: int  # set capacity (0: no sets, a dense policy)
    d: int  # hidden size
    H: int  # rows of the draft's dense head (d2t 32k or the full vocabulary)
    V: int  # the table's id space (the target vocabulary): the union's bitmap
    C: int  # union columns (static capacity)
    elem: int = 2  # bytes per weight element
    k: int = 1  # top-k per row
    mapped: bool = False  # the table's ids go through a row map (d2t draft or TP shard; read inside the kernel)

    @property
    def N(self) -> int:
        return self.bs * self.n


def indexed_work(
    rows_read: float, N: int, width: int, d: int, elem: int, cols: float | None = None
) -> tuple[float, float]:
    """(bytes, flops) of one indexed-kernel call: candidate rows read once, hidden rows in, fp32 logits ``[N, width]``
    out; each row dots ``cols`` live columns (default ``width``: its request's full set)."""
    return rows_read * d * elem + N * d * elem + N * width * 4, 2.0 * N * (width if cols is None else cols) * d


def dense_work(H: int, N: int, d: int, elem: int) -> tuple[float, float]:
    """(bytes, flops) of one dense GEMM ``hidden @ weight.T`` in the weight's dtype (what the benchmark's dense op times)."""
    return H * d * elem + N * d * elem + N * H * elem, 2.0 * N * H * d


def predict(shape: Shape, costs: HeadCosts, sizes: UnionSizes = DISJOINT) -> dict[str, float]:
    """Predicted microseconds of each mode the shape allows (logits and exact top-k; no sets: stock only)."""
    s, e = shape, shape.elem
    N, d = s.N, s.d

    def topk(width: int) -> float:  # as it runs: compact_topk, or the unfused ops past its width
        if width <= FUSED_TOPK_MAX_WIDTH:
            return (costs.topk or costs.copy).time(N * width * 4)
        return costs.copy.time(N * width * TOPK_BYTES) + (WIDE_TOPK_LAUNCHES[s.n == 1] - 1) * costs.launch_us

    def gemm(H: int) -> float:  # the GEMM, then its logits cast to fp32 (one more pass)
        return costs.dense.time(*dense_work(H, N, d, e)) + costs.copy.time(N * H * (e + 4))

    out = {"stock": gemm(s.H) + costs.copy.time(N * s.H * STOCK_TOPK_BYTES)}
    if s.W <= 0:
        return out
    # one indexed launch (the slot expansion and a d2t / TP row map are read inside it), then the top-k
    out["per-request"] = costs.indexed.time(*indexed_work(s.bs * s.W, N, s.W, d, e)) + topk(s.W)
    U = min(sizes.expected(s.bs, s.W), s.C, s.H)
    build = (25 * s.V + 12 * s.bs * s.W + s.bs * s.C + 9 * N * s.C) / costs.copy.bytes_per_us

    def launches(mode: str) -> float:
        return UNION_LAUNCHES[mode, s.mapped] * costs.launch_us

    out["union-indexed"] = (
        costs.indexed.time(*indexed_work(U, N, s.C, d, e, cols=U)) + build + launches("union-indexed") + topk(s.C)
    )
    out["union-gemm"] = costs.copy.time(2 * s.C * d * e) + gemm(s.C) + build + launches("union-gemm") + topk(s.C)
    return out


def choose(shape: Shape, costs: HeadCosts, sizes: UnionSizes = DISJOINT, allowed: tuple[str, ...] = MODES) -> str:
    """The cheapest allowed mode by ``predict`` (ties: the earlier in ``MODES``); ``stock`` when no mode is allowed.

    With ``stock`` allowed (``head.batch: auto``) the choice is among the plans timed on this device
    (``costs.modes``), and a plan other than stock must be predicted faster than stock by ``costs.margin``. A union
    expected to overflow its columns (``E[U] > C``: ids dropped, acceptance lost) is chosen only when nothing else
    is allowed (``head.batch: union``)."""
    times = predict(shape, costs, sizes)
    if "stock" in allowed:
        allowed = tuple(m for m in allowed if m in costs.modes or m == "stock")
    if shape.W > 0 and sizes.expected(shape.bs, shape.W) > shape.C and set(allowed) - set(UNION_MODES):
        allowed = tuple(m for m in allowed if m not in UNION_MODES)
    best = [m for m in MODES if m in allowed and m in times]
    if not best:
        return "stock"
    pick = min(best, key=lambda m: times[m])
    if pick != "stock" and "stock" in best and times[pick] * (1.0 + costs.margin) > times["stock"]:
        return "stock"
    return pick


# -- the shipped files ------------------------------------------------------------------------------


def _data_dir():
    return resources.files("sglang_specvocab.configs").joinpath("data")


@functools.cache
def shipped_costs() -> tuple[HeadCosts, ...]:
    """Every ``head-costs-*.json`` shipped in ``sglang_specvocab.configs/data``."""
    out = []
    for entry in sorted(_data_dir().iterdir(), key=lambda p: p.name):
        if entry.name.startswith("head-costs-") and entry.name.endswith(".json"):
            out.append(HeadCosts.from_json(json.loads(entry.read_text())))
    return tuple(out)


def costs_for(device_name: str) -> HeadCosts:
    """The shipped constants whose ``match`` is in the device name (first file by name), else ``fallback_costs``."""
    up = device_name.upper()
    for c in shipped_costs():
        if any(m in up for m in c.match):
            return c
    return fallback_costs(device_name)


@functools.cache
def shipped_union_sizes() -> UnionSizes:
    """The union sizes measured in the lab (``union-sizes.json``), or ``DISJOINT`` if the file is absent."""
    entry = _data_dir().joinpath("union-sizes.json")
    if not entry.is_file():
        return DISJOINT
    return UnionSizes.from_json(json.loads(entry.read_text()))


def load(path: str | Path) -> HeadCosts:
    return HeadCosts.from_json(json.loads(Path(path).read_text()))


# -- fitting ------------------------------------------------------------------------------------------


def fit_roofline(
    points: list[tuple[float, float, float]], flops: bool = True, max_flops_per_us: float = 3e9
) -> tuple[Roofline, float]:
    """The roofline closest to ``points`` = ``[(bytes, flops, microseconds)]`` in relative error; (line, worst error).

    A log-spaced grid over bandwidth (0.1-10 TB/s) and throughput (10 TFLOP/s to ``max_flops_per_us``); for each
    pair the start ``t0 >= 0`` minimising the squared relative error has a closed form. ``flops=False`` fits
    bandwidth only.
    """
    import numpy as np  # the fit only (numpy is a dependency anyway)

    b = np.array([p[0] for p in points], dtype=np.float64)
    f = np.array([p[1] for p in points], dtype=np.float64)
    t = np.array([p[2] for p in points], dtype=np.float64)
    bws = np.geomspace(1e5, 1e7, 241)  # bytes/us
    fls = np.geomspace(1e7, max_flops_per_us, 241) if flops else np.array([np.inf])  # flop/us
    m = np.maximum(b[None, None, :] / bws[:, None, None], f[None, None, :] / fls[None, :, None])  # [bw, fl, P]
    # t0 minimising sum(((t0 + m) / t - 1)^2): t0 = sum((t - m) / t^2) / sum(1 / t^2), at least 0
    t0 = np.clip(((t - m) / t**2).sum(-1) / (1.0 / t**2).sum(), 0.0, None)
    err = ((t0[..., None] + m) / t - 1.0) ** 2
    loss = err.sum(-1)
    i, j = np.unravel_index(int(np.argmin(loss)), loss.shape)
    line = Roofline(float(t0[i, j]), float(bws[i]), None if not flops else float(fls[j]))
    worst = float(np.sqrt(err[i, j].max()))
    return line, worst


__all__ = [
    "DISJOINT",
    "MEASURED_DEFAULT",
    "MODES",
    "UNION_MODES",
    "WIDE_TOPK_LAUNCHES",
    "HeadCosts",
    "Roofline",
    "Shape",
    "UnionSizes",
    "choose",
    "costs_for",
    "dense_work",
    "fallback_costs",
    "fit_roofline",
    "indexed_work",
    "load",
    "predict",
    "shipped_costs",
    "shipped_union_sizes",
]

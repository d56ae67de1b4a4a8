"""The dynamic draft head: one implementation for the server and the lab.

``DraftHead(weight, table, space, head)(hidden, rows)`` scores ``N = bs * n`` hidden rows, request-major (``n``
consecutive rows per request, ``rows[b]`` the table slot of request b), and returns a ``HeadOutput``: fp32 logits and
the map from their columns to target token ids. ``HeadOutput.topk`` is the one top-k: value descending, then column
ascending (columns run in ascending token id, so the lower id first); an entry of value ``-inf`` (only when k exceeds a
row's live columns) is the table's fallback id. Logit scale then softcapping (Gemma-2 style, monotonic) apply to live
columns only: a dead column stays ``-inf``.

How a batch is scored (``head.batch``; ``auto`` picks per (bs, n) with ``headcost.choose``, a pure function of
shapes, so once per CUDA-graph batch bucket):

- ``per-request``: row m over the set of its request (``indexed_logits``; columns = the set's ``W`` ids);
- ``union``: the batch's deduplicated union of sets, built on the device with static shapes (a bitmap over the
  vocabulary, a prefix sum, a compaction into ``C`` columns in ascending id; ids past ``C`` are dropped from that
  call's union, the highest first, and ``union_overflow`` counts such calls), scored once for all rows: by the indexed
  kernel with the whole batch on one slot (reads only the live union rows) or, ``union-gemm``, gathered and multiplied
  by one dense GEMM. With ``union_view: own`` (default) each row is then masked to its own request's set, so its
  logits and top-k are those of ``per-request``; with ``all`` every row sees the whole union;
- ``stock``: the draft's own dense head over all its rows (what EAGLE3 runs); the dense policy ``full`` always.

Vocabulary spaces (``vocab.VocabSpace``, built once by the caller). Table ids are target ids. A d2t draft's head row of
id i is ``t2d[i]``, a tensor-parallel rank holds the rows ``shard = (start, end)``: the space's ``row_map`` maps ids to
local rows, -1 where this rank (or the draft) has none. The logits op reads the ids through that map and each request's
slot over its ``n`` rows itself (``indexed_logits(..., rows, row_map=...)``), so a per-request step is two launches (the
logits and ``compact_topk``) and the kernel reads a request's rows once for all its hidden rows; an id with no local row
is a dead column. With ``group`` (tp_size > 1) the top-k is a local top-k merged across ranks. The stock plan on one
rank is EAGLE3's own code path in the server (``integration/logits.py``); here it is the head's dense GEMM.

Bad table entries: one rule on every plan and backend (``table.head_reads``, which the logits ops follow). A request
whose slot is outside ``[0, R)`` reads nothing; a count is clamped into ``[0, W]`` (so one ``<= 0`` reads nothing:
``cnt >= 1`` is the table's contract, and 0 breaks it; one above ``W`` reads all ``W`` columns); an id ``>= V``
inside the count is a dead column; a negative id is a dead column by design, not an error. Whatever a request reads
nothing of is ``-inf``, so its top-k entries there are the fallback id with probability 0. Each bad entry is added
to ``ops.bad_entries(device)`` once per hidden row that reads it (a bad slot or count once, a bad id once per
column), with no host sync; nothing is raised. Under the debug setting (``SGLANG_DYNVOCAB_DEBUG_CHECKS``) every
table plan refuses the first one instead, before its ops run, with the same ``ValueError("DraftHead: ...")``.
The stock plan reads no table: nothing to count or refuse. The top-k reads a bad slot's map row as no token
(``compact_topk``, ``ops.topk.column_tokens``).

CUDA graphs. The server runs the head inside SGLang's captured graphs and, in the draft extend, its top-k eagerly
after the replay, where no Python of the head ran. So the head keeps no state of its last call: what a call's logits
mean is a pure function of the call's shape key ``(bs, n)`` (``plan``, cached) plus tensors the call writes in place
(the union's column map lives in the static buffer ``union_ids``; the per-request map is the table; the stock map is
fixed). ``output(logits, rows, key)`` rebuilds the column map of logits from the key of the call that produced them,
so a caller that replayed a graph captured at batch size B passes ``(B, n)``. ``union_ids`` holds the last union
call's map: read it before the next union call (the draft loops do).

``head.mode: packed`` (the lab's MicroSpec ablation; the server refuses it) keeps each request's rows in a buffer
``[R, W, d]`` that ``refresh(rows)`` updates after each set change, copying only the rows that entered, on a side CUDA
stream; the head waits for that copy just before it runs (a caller replaying the head in a CUDA graph calls
``wait()`` before the replay instead). It is always per request.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from . import headcost, ops
from .config import BATCH_MODES, HEAD_MODES, UNION_VIEWS, HeadSection, default_union_columns
from .ops import checks
from .ops.compact_topk import TOPK_MAX_K
from .ops.topk import NEG_INF, column_tokens, local_topk, merge_topk
from .table import CandidateTable
from .vocab import VocabSpace

PLANS = headcost.MODES  # what a call runs; "union" is either union plan (the cost model picks), a plan name forces it


@dataclass
class HeadOutput:
    """Logits of one head call and how to read their columns as token ids."""

    logits: torch.Tensor  # fp32 [N, width]: this rank's columns, -inf where dead
    col_ids: torch.Tensor | None  # target id of each (global) column: [width] shared, or [rows, width] per map row
    rows: torch.Tensor | None = None  # the requests' rows of a 2-D col_ids (request-major logits rows)
    fallback_id: int = 0  # the token of a -inf entry
    col_offset: int = 0  # global column of local column 0 (a stock head's TP shard)
    group: Any = None  # process group of the top-k merge (tp_size > 1)
    tp_size: int = 1
    topk_op: Callable | None = None  # compact_topk of the head's backend: the one-rank top-k in one op
    plan: str = ""  # the plan of the call that produced the logits (one of PLANS)

    def _fused(self, k: int, mode: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """``compact_topk`` where it applies (one rank, k within the op's limit), else None."""
        if self.topk_op is None or self.tp_size > 1 or self.col_offset or k > TOPK_MAX_K:
            return None
        if self.logits.shape[1] > headcost.FUSED_TOPK_MAX_WIDTH:
            return None
        return self.topk_op(self.logits, self.col_ids, self.rows, k, self.fallback_id, mode)

    def tokens(self, cols: torch.Tensor) -> torch.Tensor:
        """int64 target ids of global columns ``cols [N, k]`` (-1 where a column has no token)."""
        return column_tokens(self.col_ids, self.rows, cols)

    def topk(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(values fp32 ``[N, k]``, token ids int64 ``[N, k]``), best first, identical on every rank."""
        values, tokens, _ = self.topk_lse(k)
        return values, tokens

    def topk_lse(self, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``topk`` and the logsumexp ``[N]`` of each row's logits (over all ranks)."""
        fused = self._fused(k, 0)
        if fused is not None:
            return fused
        values, cols, lse = local_topk(self.logits, k)
        if self.col_offset:
            cols = cols + self.col_offset
        if self.tp_size > 1:
            values, cols, lse = merge_topk(values, cols, lse, k, self.group)
        tokens = self.tokens(cols)
        dead = torch.isneginf(values) | (tokens < 0)
        return values, torch.where(dead, self.fallback_id, tokens), lse

    def topk_logprobs(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(log-probabilities over the row's live columns ``[N, k]``, token ids): -inf for a -inf entry."""
        fused = self._fused(k, 1)
        if fused is not None:
            return fused[0], fused[1]
        values, tokens, lse = self.topk_lse(k)
        return torch.where(torch.isneginf(values), NEG_INF, values - lse[:, None]), tokens

    def topk_probs(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(probabilities over the row's live columns ``[N, k]``, token ids): 0 for a -inf entry."""
        fused = self._fused(k, 2)
        if fused is not None:
            return fused[0], fused[1]
        logp, tokens = self.topk_logprobs(k)
        return torch.exp(logp), tokens


def _either(values: tuple[str, ...]) -> str:
    return " or ".join(repr(v) for v in values)


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


def _check_options(table: CandidateTable | None, mode: str, batch: str, union_view: str) -> None:
    """The config's allowed values (a config was validated against them already; a direct caller was not), and for
    batch also a plan's name, which forces that plan."""
    if mode not in HEAD_MODES:
        raise ValueError(f"DraftHead: mode = {mode!r} is invalid: must be {_either(HEAD_MODES)}")
    if batch not in BATCH_MODES + PLANS:
        valid = ", ".join(dict.fromkeys(BATCH_MODES + PLANS))
        raise ValueError(f"DraftHead: batch = {batch!r} is invalid: must be one of {valid}")
    if union_view not in UNION_VIEWS:
        raise ValueError(f"DraftHead: union_view = {union_view!r} is invalid: must be {_either(UNION_VIEWS)}")
    if table is None and (mode == "packed" or batch not in ("auto", "stock")):
        raise ValueError(f"DraftHead: mode {mode!r} / batch {batch!r} need a candidate table (the dense head has none)")


def head_options(**options: Any) -> HeadSection:
    """A ``head:`` section from keywords (``kernel``, ``mode``, ``batch``, ``union_capacity``, ``union_view``) where
    ``batch`` may also name a plan (``PLANS``), which forces it: no config file can, a bench or a test does. The head
    checks the values (``_check_options``)."""
    return HeadSection().model_copy(update=options)


class DraftHead:
    def __init__(
        self,
        weight: torch.Tensor,
        table: CandidateTable | None,
        space: VocabSpace | None = None,
        head: HeadSection | None = None,
        *,
        logit_softcap: float | None = None,
        logit_scale: float | None = None,
        group: Any = None,
        costs: headcost.HeadCosts | None = None,
        union_sizes: headcost.UnionSizes | None = None,
    ):
        """``weight``: this rank's head rows ``[H_local, d]`` (a shard may end in padding rows); ``table``: the
        candidate sets (None: the dense policy); ``space``: the draft vocabulary (``vocab.VocabSpace``: the target
        ids, a d2t map, this rank's shard; default: a full-vocabulary head of ``weight``'s rows on one rank);
        ``head``: the config's ``head:`` section (default: all defaults; ``head_options`` forces a plan);
        ``logit_softcap``/``logit_scale``: what the draft model applies to its logits; ``group``: the process group
        of the top-k merge (tp_size > 1); ``costs``/``union_sizes``: the cost model (default: the shipped constants
        for this device and the lab's union sizes)."""
        head = head or HeadSection()
        mode, batch, union_view = head.mode, head.batch, head.union_view
        _check_options(table, mode, batch, union_view)
        dev = weight.device
        if space is None:
            space = VocabSpace.build(int(weight.shape[0]), fallback_id=0 if table is None else table.fallback_id)
        space = space.on(dev)
        if table is not None:
            space.check_fallback(table.fallback_id, "DraftHead")
        self.weight, self.table, self.space = weight, table, space
        self.logit_softcap, self.logit_scale = logit_softcap, logit_scale
        self.mode, self.batch, self.union_view = mode, batch, union_view
        self.group, self.tp_size = group, space.tp_size
        # H: the draft head's rows over all ranks; V: the table's id space.
        self.head_rows, self.vocab_size = space.head_rows, space.size
        # One rank: rows past the head's own (SGLang pads ParallelLMHead's weight to a multiple of 64) are no tokens.
        self.start, self.end = (
            space.shard if space.shard is not None else (0, min(int(weight.shape[0]), space.head_rows))
        )
        if space.row_map is None and self.vocab_size > weight.shape[0]:
            raise ValueError(
                f"DraftHead: the vocabulary's {self.vocab_size} ids are more than the head's {weight.shape[0]} rows "
                "(a full-vocabulary head on one rank has a row for every id; a d2t draft's space has its head_ids)"
            )
        # The logits op reads ids through it (an id past it is a bad entry, counted; -1: no row here, a dead column)
        self.row_map = space.row_map
        self._bad = ops.bad_entries(dev)  # the counter the logits ops add bad table entries to
        # Stock columns are global head rows; their tokens: the d2t map, or the row itself.
        self.stock_ids = space.head_ids
        if self.stock_ids is not None and space.shard is None and weight.shape[0] > self.stock_ids.numel():
            pad = weight.shape[0] - self.stock_ids.numel()  # the padding rows' columns: no token (-inf logits)
            self.stock_ids = torch.cat([self.stock_ids, self.stock_ids.new_full((pad,), -1)])
        self.costs = costs or headcost.costs_for(_device_name(dev))
        self.union_sizes = union_sizes or headcost.shipped_union_sizes()
        self.union_overflow = torch.zeros((), dtype=torch.int64, device=dev)  # calls whose union passed C
        self._plans: dict[tuple[int, int], str] = {}
        self.union_ids: torch.Tensor | None = None  # the last union call's column map [C] (a static buffer)
        # The top-k has no Triton version: a Triton head (or auto) gets the extension's where it runs, else torch.
        kernel = head.kernel
        self._topk = ops.implementation(ops.backend_without_triton(kernel), dev, "compact_topk")
        if table is None:
            self.capacity = 0
            return
        self.capacity = table.capacity
        C = head.union_capacity or default_union_columns(self.capacity, self.head_rows)
        if C < self.capacity:
            raise ValueError(f"DraftHead: union_capacity = {C} must be at least the set capacity {self.capacity}")
        self.union_capacity = min(C, self.vocab_size)
        # Written in place by every union call (captured or eager), so a graph replay refreshes what the eager top-k
        # reads; column C is the sink of ids past the capacity.
        self._union_buf = torch.full((self.union_capacity + 1,), -1, dtype=torch.int32, device=dev)
        self.union_ids = self._union_buf[: self.union_capacity]
        # Constants of the union build, made once (each would be a launch per call)
        self._cols = torch.arange(self.capacity, device=dev)[None, :]
        self._vocab_ids = torch.arange(self.vocab_size, dtype=torch.int32, device=dev)
        self._one_slot = torch.zeros(1, dtype=torch.int32, device=dev)  # the whole batch on one slot of the union
        self._indexed = ops.implementation(kernel, dev, "indexed_logits")
        if mode == "fused":
            self._logits = self._indexed
            return
        if self.row_map is not None:
            raise ValueError("DraftHead: mode 'packed' needs a full-vocabulary head on one rank")
        self._logits = ops.implementation(kernel, dev, "packed_logits")
        R, W, d = table.num_rows, table.capacity, weight.shape[1]
        self.packed = weight.new_zeros((R, W, d))
        self.packed_ids = torch.full((R, W), -1, dtype=torch.int32, device=dev)
        self._pack = ops.implementation(ops.backend_without_triton(kernel), dev, "pack_update")
        on_gpu = dev.type == "cuda"
        self._stream = torch.cuda.Stream(dev) if on_gpu else None
        self._ready = torch.cuda.Event() if on_gpu else None
        self.refresh(torch.arange(R, device=dev))

    # --- the choice ---------------------------------------------------------------------------------

    def shape(self, bs: int, n: int) -> headcost.Shape:
        """The static shapes of a call with ``bs`` requests of ``n`` rows (what the cost model sees)."""
        return headcost.Shape(
            bs=bs,
            n=n,
            W=self.capacity,
            d=int(self.weight.shape[1]),
            H=int(self.weight.shape[0]),
            V=self.vocab_size,
            C=getattr(self, "union_capacity", 0),
            elem=self.weight.element_size(),
            mapped=self.row_map is not None,
        )

    def plan(self, bs: int, n: int) -> str:
        """The plan of a call with ``bs`` requests of ``n`` rows (one of ``PLANS``): shapes only, cached."""
        mode = self._plans.get((bs, n))
        if mode is None:
            if self.table is None:
                mode = "stock"
            elif self.mode == "packed":
                mode = "per-request"
            elif self.batch in PLANS:
                mode = self.batch
            else:
                allowed = headcost.UNION_MODES if self.batch == "union" else headcost.MODES
                mode = headcost.choose(self.shape(bs, n), self.costs, self.union_sizes, allowed)
            self._plans[(bs, n)] = mode
        return mode

    @property
    def planned(self) -> dict[tuple[int, int], str]:
        """Every call shape ``(bs, n)`` planned so far (each call plans its own) and its plan."""
        return dict(self._plans)

    # --- packed mode ----------------------------------------------------------------------------------

    def refresh(self, rows: torch.Tensor) -> None:
        """After the sets of ``rows`` changed: bring their packed rows up to date (packed mode)."""
        if self.mode != "packed":
            return
        t = self.table
        if self._stream is None:
            self._pack(self.packed, self.packed_ids, self.weight, t.ids, t.cnt, rows)
            return
        # The copy starts once the set update queued before it is done, and runs beside the
        # draft's other work; rows stays alive for the side stream until the copy ends.
        self._stream.wait_stream(torch.cuda.current_stream(self.weight.device))
        with torch.cuda.stream(self._stream):
            self._pack(self.packed, self.packed_ids, self.weight, t.ids, t.cnt, rows)
            self._ready.record(self._stream)
        rows.record_stream(self._stream)

    def wait(self) -> None:
        """Order the current stream after the last ``refresh`` (outside CUDA-graph capture)."""
        if self.mode == "packed" and self._ready is not None:
            torch.cuda.current_stream(self.weight.device).wait_event(self._ready)

    # --- scoring --------------------------------------------------------------------------------------

    @staticmethod
    def head_key(bs: int, N: int) -> tuple[int, int]:
        """The shape key ``(bs, n)`` of a call scoring ``N`` request-major hidden rows of ``bs`` requests."""
        if N and (bs == 0 or N % bs):
            raise ValueError(
                f"DraftHead: {N} hidden rows do not split evenly over {bs} requests (rows must be request-major)"
            )
        return max(bs, 1), N // bs if N else 1

    def __call__(self, hidden: torch.Tensor, rows: torch.Tensor, weight: torch.Tensor | None = None) -> HeadOutput:
        """Score ``hidden [bs * n, d]`` (request-major) for the requests in table slots ``rows [bs]``.

        ``weight``: the head's weight if it is not the one given at construction (the server passes its module's)."""
        weight = self.weight if weight is None else weight
        key = self.head_key(rows.shape[0], hidden.shape[0])
        mode = self.plan(*key)
        hidden = hidden.to(weight.dtype)
        if mode != "stock" and checks.debug_checks() and checks.readable(rows):
            # every table plan refuses a bad entry alike, before its ops run (see "Bad table entries")
            t = self.table
            checks.check_table_entries(
                "DraftHead", t.ids, t.cnt, rows, t.capacity, self.vocab_size, rows=hidden.shape[0], slots="rows"
            )
        if mode == "stock":
            logits = self._stock(hidden, weight)
        elif mode == "per-request":
            logits = self._per_request(hidden, weight, rows)
        else:
            logits = self._union(hidden, weight, rows, gemm=mode == "union-gemm")  # union-indexed or union-gemm
        if self.logit_scale is not None:
            logits = logits.mul_(self.logit_scale)
        if self.logit_softcap:
            c = self.logit_softcap
            logits = torch.where(torch.isneginf(logits), logits, torch.tanh(logits / c) * c)
        return self.output(logits, rows, key)

    def output(self, logits: torch.Tensor, rows: torch.Tensor, key: tuple[int, int]) -> HeadOutput:
        """The column map of ``logits`` produced by a call of shape key ``key = (bs, n)`` (``bs`` requests of ``n``
        rows: for a replayed graph, its captured batch size), read for ``rows`` (request-major, any rows per request:
        the server's draft extend keeps one row per request of a call that scored several, and a replay's logits
        drop the graph's padding rows). A union's map is the last union call's (``union_ids``)."""
        mode = self.plan(*key)
        fallback = self.table.fallback_id if self.table is not None else 0
        common = {
            "fallback_id": fallback,
            "group": self.group,
            "tp_size": self.tp_size,
            "topk_op": self._topk,
            "plan": mode,
        }
        if mode == "stock":
            ids = self.stock_ids
            if ids is not None and self.tp_size == 1 and logits.shape[1] < ids.numel():  # cut to the vocabulary
                ids = ids[: logits.shape[1]]
            out = HeadOutput(logits, ids, col_offset=self.start, **common)
        elif mode == "per-request":
            ids = self.packed_ids if self.mode == "packed" else self.table.ids
            out = HeadOutput(logits, ids, rows, **common)
        else:
            out = HeadOutput(logits, self.union_ids, **common)
        width = out.col_ids.shape[-1] if mode != "stock" else self.weight.shape[0]
        # a stock head's logits cover its rows, or only its vocabulary (SGLang's processor cuts the padding rows)
        if logits.shape[1] != width and not (mode == "stock" and logits.shape[1] == self.end - self.start):
            raise ValueError(
                f"DraftHead.output: logits have {logits.shape[1]} columns, the {mode} head of a call of shape "
                f"(bs, n) = {tuple(key)} has {width} (is the key the one of the call that produced them?)"
            )
        return out

    def _stock(self, hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        logits = (hidden @ weight.T).float()
        own = self.end - self.start
        if own < weight.shape[0]:  # a TP shard's padding rows are no tokens
            logits[:, own:] = NEG_INF
        return logits

    def _per_request(self, hidden: torch.Tensor, weight: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        t, N = self.table, hidden.shape[0]
        if N == 0:
            return torch.empty((0, t.capacity), dtype=torch.float32, device=hidden.device)
        if self.mode == "packed":
            if not (hidden.is_cuda and torch.cuda.is_current_stream_capturing()):
                self.wait()
            return self._logits(hidden, self.packed, t.cnt, rows)
        # One launch from the requests' slots to logits: the op expands each request's slot over its N // bs rows
        # and reads the ids through the draft's row map (d2t, a TP shard), so a request's candidate rows are read
        # once for all its hidden rows and no mapped copy of the sets is made.
        if self.row_map is None and weight.shape[0] > self.vocab_size:
            # SGLang's padding rows are no tokens: an id past the vocabulary is a bad entry here too, as in a union
            weight = weight.narrow(0, 0, self.vocab_size)
        return self._logits(hidden, weight, t.ids, t.cnt, rows, row_map=self.row_map)

    def _union(self, hidden: torch.Tensor, weight: torch.Tensor, rows: torch.Tensor, gemm: bool) -> torch.Tensor:
        t, N, dev = self.table, hidden.shape[0], hidden.device
        V, C = self.vocab_size, self.union_capacity
        bs, W = rows.shape[0], t.capacity
        # The table is read as the per-request op reads it (table.head_reads): a slot outside [0, R) reads nothing,
        # a count is clamped into [0, W], an id >= V is a bad column; each counted once per hidden row.
        slot = rows.clamp(0, t.num_rows - 1)
        raw = t.cnt.index_select(0, slot).masked_fill_(slot != rows, 0)  # a bad slot: count 0
        ids = t.ids.index_select(0, slot).long()
        live = self._cols < raw[:, None]
        bad = live & (ids >= V)
        self._bad.add_(bad.sum() + (raw.clamp(1, W) != raw).sum(), alpha=N // bs if bs else 0)
        dead = ~(live & (ids >= 0) & ~bad)
        at = ids.masked_fill_(dead, V)  # dead and bad entries mark the sink V
        mark = torch.zeros(V + 1, dtype=torch.int32, device=dev).index_fill_(0, at.view(-1), 1)[:V]
        pos = mark.cumsum(0) - 1  # union column of each marked id, in ascending id
        total = pos[-1] + 1
        pos.masked_fill_(mark == 0, C).clamp_(max=C)  # unmarked ids and those past the capacity: the sink C
        buf = self._union_buf.fill_(-1)
        buf.scatter_(0, pos, self._vocab_ids)
        union_ids = buf[:C]
        self.union_overflow.add_(total > C)
        if N == 0:
            return torch.empty((0, C), dtype=torch.float32, device=dev)
        if gemm:
            loc = (
                union_ids
                if self.row_map is None
                else self.row_map[union_ids.clamp(min=0)].masked_fill_(union_ids < 0, -1)
            )
            head = weight.index_select(0, loc.clamp(min=0))
            logits = (hidden @ head.T).float().masked_fill_(loc[None, :] < 0, NEG_INF)
        else:
            # the whole batch on one slot (the union's rows read once); ids through the row map inside the op
            count = total.clamp(1, C).to(torch.int32).view(1)
            logits = self._indexed(hidden, weight, union_ids[None, :], count, self._one_slot, row_map=self.row_map)
        if self.union_view == "own":  # each row keeps the union columns of its own request's set
            col = pos.index_select(0, at.view(-1).clamp_(max=V - 1)).view(bs, W)
            col = col.masked_fill_(dead, C)  # dead or bad entries: the sink column C (as past the capacity)
            outside = torch.ones((bs, C + 1), dtype=torch.bool, device=dev).scatter_(1, col, False)[:, :C]
            logits.view(bs, N // bs, C).masked_fill_(outside[:, None, :], NEG_INF)
        return logits


__all__ = ["PLANS", "DraftHead", "HeadOutput", "head_options"]

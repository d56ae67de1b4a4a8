"""Per-request DYNVOCAB telemetry: the mean active-set size and the coverage of the committed tokens.

Accumulated on the device in ``[R]`` tensors keyed by request slot (``req_pool_idx``), one
update per verify round, no host sync:

- ``set_sum``: the sum over rounds of the set size the round drafted from (``cnt[row]``);
- ``rounds``: verify rounds;
- ``in_set``: committed tokens that were in the set (``table.contains(rows, accepted)``, taken
  BEFORE ``on_verify`` updates the set);
- ``committed``: committed tokens (accepted drafts + the bonus; SGLang cuts at EOS /
  ``max_new_tokens`` later, on the host, so a request's last round may count a few more).

``dynvocab_set_size = set_sum / rounds`` and ``dynvocab_coverage = in_set / committed``.

A fifth row, ``unseeded``, counts the prompt positions of a request seeded from ids only: a radix-cache
hit has no hidden states (no forward ran over it), so a policy that reads the target's prefill top-K gets
none for those positions, and a cached prompt can get a different set than an uncached one. Recomputing
them needs a forward over the cached prefix, storing them costs K ids per cached token in the radix
cache; instead the count is reported (``dynvocab_prefix_without_topk``; 0 when the policy reads no
prefill top-K, or nothing was cached). Run with ``--disable-radix-cache`` for sets independent of cache
state. A dense
policy (no table) counts the vocabulary size and full coverage. For stepwise (ranker) policies the
table at verify time holds the set of the round's last draft step, so both numbers describe that
step's set.

Rows are reset with the policy's rows (a re-used slot, ``reset_rows``). The worker reads a
finished request's row in ``note_request_finished``, on the scheduler's host thread while (under
overlap scheduling) the next batch is already on the GPU, so reading the device accumulators
there would either wait for that batch or race with it. Instead, on a GPU, ``publish`` (called
after each round's ``record``, on the forward stream) copies the accumulators without blocking
into one of two pinned host buffers and records an event; ``summary`` reads the newest buffer
whose copy has finished (the batch whose results the scheduler is processing has always
finished its copy, since it precedes that batch's output copy on the same stream), and waits on
an event only when neither copy has finished. A request's summary therefore includes its round
in the batch that finished it, and possibly the one-step overshoot round of the batch after.

Reporting (``report``): the pinned SGLang lets a worker add fields to a request's ``meta_info``
through ``req.customized_info`` (``batch_result_processor._maybe_collect_customized_info`` ->
``output_streamer`` -> ``tokenizer_manager.update_request_meta_info``, which accumulates each
key's values into a list). Keys the output streamer calls request-level
(``SchedulerOutputStreamer.is_request_level_customized_info_key``) are sent whole, once, when a
non-streaming request finishes; ``install_request_level_keys`` makes the two DYNVOCAB keys
request-level. So a finished non-streaming request has ``meta_info["dynvocab_set_size"] == [x]``
and ``meta_info["dynvocab_coverage"] == [y]`` (SGLang's accumulation makes every customized
value a list). SGLang sends request-level keys of a *streaming* request only with its first
chunk, before it finished, so streaming requests do not get them; the Prometheus gauges
``sglang:dynvocab_set_size`` / ``sglang:dynvocab_coverage`` (most recent finished request, only
with ``--enable-metrics``) cover every request.

Counters (``watch``/``counts``): device int64 scalars that count events of the whole server, published with
the accumulators (one more non-blocking copy per counter into pinned host memory, same event, no host sync)
and read from the newest finished copy. The worker watches two: ``bad_table_entries``
(``ops.bad_entries``: candidate-table entries the draft head read that broke the table's contract, each
read as ``-inf`` logits) and ``union_overflow`` (``DraftHead.union_overflow``: head calls whose batch union
exceeded its capacity, ids past it dropped from that call's union). Both are counted since the process
started and exported as the gauges ``sglang:dynvocab_bad_table_entries`` / ``sglang:dynvocab_union_overflow``
(updated when a request finishes; with ``--enable-metrics``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any, ClassVar

import torch

logger = logging.getLogger(__name__)

SET_SIZE_KEY = "dynvocab_set_size"
COVERAGE_KEY = "dynvocab_coverage"
UNSEEDED_KEY = "dynvocab_prefix_without_topk"
KEYS = (SET_SIZE_KEY, COVERAGE_KEY, UNSEEDED_KEY)
BAD_ENTRIES = "bad_table_entries"  # counters (see the module doc)
UNION_OVERFLOW = "union_overflow"


class Telemetry:
    """``[R]`` device accumulators, one row per request slot (row 0: SGLang's padding row).

    The five are rows of one ``[5, R]`` float64 tensor ``all`` (counts stay exact below 2**53), so one copy
    publishes them all; ``acc`` is its first four rows, the per-round ones (``window_verify`` adds to them). ``mirror`` (default: on CUDA) keeps the two pinned host buffers."""

    def __init__(self, num_rows: int, device: torch.device | str | None = None, mirror: bool | None = None) -> None:
        self.all = torch.zeros(5, num_rows, dtype=torch.float64, device=device)
        self.acc = self.all[:4]  # the per-round accumulators (contiguous), which window_verify adds to
        self.set_sum, self.rounds, self.in_set, self.committed, self.unseeded = self.all.unbind(0)
        self.mirror = self.all.is_cuda if mirror is None else mirror
        self._host: list[torch.Tensor] = []
        self._events: list = [None, None]
        self._next = 0
        self._sources: dict[str, Callable[[], torch.Tensor | None]] = {}  # watched counters
        self._host_counts: list[torch.Tensor] = []
        if self.mirror:
            self._host = [self._host_buffer() for _ in range(2)]

    # seams for tests (a CPU machine has neither pinned memory nor CUDA events)
    def _host_buffer(self) -> torch.Tensor:
        return torch.empty(self.all.shape, dtype=self.all.dtype, pin_memory=True)

    def _host_counts_buffer(self, n: int) -> torch.Tensor:
        return torch.zeros(n, dtype=torch.int64, pin_memory=True)

    def watch(self, name: str, source: Callable[[], torch.Tensor | None]) -> None:
        """Publish the int64 device scalar ``source()`` with the accumulators from now on (``counts``). ``source``
        is called at each publish (its owner may rebind the tensor; None: nothing to copy). At start, not per step."""
        self._sources[name] = source
        if self.mirror:
            self._host_counts = [self._host_counts_buffer(len(self._sources)) for _ in range(2)]

    def _new_event(self):
        event = torch.cuda.Event()
        event.record()
        return event

    def reset(self, rows: torch.Tensor) -> None:
        """Zero ``rows`` (published too: a request that finishes before its first round reads zeros)."""
        self.all.index_fill_(1, rows, 0)
        self.publish()

    def record(self, rows: torch.Tensor, set_size: torch.Tensor, in_set: torch.Tensor, committed: torch.Tensor) -> None:
        """Add one round per row: ``set_size``/``in_set``/``committed`` are ``[B]`` device tensors."""
        one = torch.ones_like(committed)
        # one add of the [4, B] rows (few ops per round: this runs eagerly after every verify)
        self.acc.index_add_(1, rows, torch.stack((set_size, one, in_set, committed)).to(self.acc.dtype))

    def record_unseeded(self, rows: torch.Tensor, counts: torch.Tensor) -> None:
        """At prefill: ``counts[B]`` prompt positions of ``rows`` seeded without the target's top-K."""
        self.unseeded.index_add_(0, rows, counts.to(self.acc.dtype))
        self.publish()  # a request that finishes before its first round reads it too

    def record_verify(self, table, rows: torch.Tensor, accepted: torch.Tensor, vocab_size: int | None = None) -> None:
        """One verify round: ``accepted[B, S]`` (-1 padded) against the sets of ``rows`` as they are
        now. Call BEFORE ``policy.on_verify``. ``table`` None (a dense policy): the set is the
        whole vocabulary ``vocab_size``, every token is in it."""
        valid = accepted >= 0
        if table is None:
            committed = valid.sum(1)
            size = torch.full(rows.shape, float(vocab_size or 0), dtype=torch.float64, device=rows.device)
            self.record(rows, size, committed, committed)
            return
        hit, committed = torch.stack((table.contains(rows, accepted), valid)).sum(2)  # contains is False on -1
        self.record(rows, table.cnt.index_select(0, rows), hit, committed)

    def publish(self) -> None:
        """After a round's ``record``, on the same stream: a non-blocking copy to the next host buffer."""
        if not self.mirror:
            return
        i = self._next
        self._host[i].copy_(self.all, non_blocking=True)
        for k, source in enumerate(self._sources.values()):  # a copy each, no kernel: 0-d views of one buffer
            t = source()
            if t is not None:
                self._host_counts[i][k : k + 1].copy_(t.reshape(1), non_blocking=True)
        self._events[i] = self._new_event()
        self._next = 1 - i

    def _host_index(self) -> int | None:
        """The newest finished host copy's buffer (waiting only if none has finished); None before any publish."""
        newest, older = 1 - self._next, self._next
        for i in (newest, older):
            if self._events[i] is not None and self._events[i].query():
                return i
        for i in (older, newest):  # neither finished: wait for the earlier copy
            if self._events[i] is not None:
                self._events[i].synchronize()
                return i
        return None

    def _host_values(self) -> torch.Tensor | None:
        i = self._host_index()
        return None if i is None else self._host[i]

    def counts(self) -> dict[str, int]:
        """The watched counters on the host: off-GPU read directly, on a GPU from the newest published copy (0 for
        each before the first publish), never a read of the live device tensors."""
        if not self.mirror:
            return {name: 0 if (t := source()) is None else int(t) for name, source in self._sources.items()}
        i = self._host_index() if self._sources else None
        if i is None:
            return dict.fromkeys(self._sources, 0)
        return dict(zip(self._sources, self._host_counts[i].tolist(), strict=True))

    def _row(self, row: int) -> list[float] | None:
        """One row's five values on the host: off-GPU the accumulators, on a GPU the published copy."""
        if self.mirror:
            host = self._host_values()
            return None if host is None else host[:, row].tolist()
        return self.all[:, row].tolist()

    def unseeded_positions(self, row: int) -> int:
        """Prompt positions of ``row`` seeded without the target's top-K (radix-cache hits); 0 before any."""
        vals = self._row(row)
        return 0 if vals is None else int(vals[4])

    def summary(self, row: int) -> tuple[float, float]:
        """Host ``(mean set size, coverage)`` of one row; NaN without rounds. Off-GPU it reads the
        accumulators; on a GPU the published host copy (see the module doc)."""
        vals = self._row(row)
        if vals is None:
            return math.nan, math.nan
        set_sum, rounds, in_set, committed, _ = vals
        size = set_sum / rounds if rounds else math.nan
        coverage = in_set / committed if committed else math.nan
        return size, coverage


# --- reporting ----------------------------------------------------------------------------------


def report_to_request(req: Any, set_size: float, coverage: float, unseeded: int = 0) -> None:
    """Put the values on ``req.customized_info`` (request-level keys, see the module doc)."""
    info = getattr(req, "customized_info", None)
    if info is None:
        info = {}
        req.customized_info = info
    info[SET_SIZE_KEY] = [set_size]
    info[COVERAGE_KEY] = [coverage]
    info[UNSEEDED_KEY] = [unseeded]


_installed_streamer = None


def install_request_level_keys() -> None:
    """Make ``SchedulerOutputStreamer`` treat the DYNVOCAB keys as request-level (idempotent, per process)."""
    global _installed_streamer
    # late: keeps the plug-in's import (every server process) light
    from sglang.srt.managers.scheduler_components.output_streamer import SchedulerOutputStreamer

    if _installed_streamer is SchedulerOutputStreamer:
        return
    original = SchedulerOutputStreamer.is_request_level_customized_info_key

    def is_request_level_customized_info_key(self, key: str) -> bool:
        return key in KEYS or original(self, key)

    is_request_level_customized_info_key.__wrapped__ = original
    SchedulerOutputStreamer.is_request_level_customized_info_key = is_request_level_customized_info_key
    _installed_streamer = SchedulerOutputStreamer


class Gauges:
    """``sglang:dynvocab_set_size`` / ``sglang:dynvocab_coverage`` and the counters' gauges
    (``sglang:dynvocab_bad_table_entries`` / ``sglang:dynvocab_union_overflow``; prometheus_client), or nothing."""

    _cache: ClassVar[dict[tuple, Any]] = {}

    def __init__(self, enabled: bool, labels: dict[str, str] | None = None) -> None:
        self.labels = dict(labels or {})
        self.set_size = self.coverage = None
        self.counters: dict[str, Any] = {}
        if not enabled:
            return
        try:
            from prometheus_client import Gauge  # optional: only with --enable-metrics
        except ImportError:
            logger.warning("prometheus_client is not installed: no DYNVOCAB gauges")
            return
        names = tuple(sorted(self.labels))
        key = ("gauges", names)
        if key not in Gauges._cache:  # one registration per process
            Gauges._cache[key] = (
                Gauge(
                    name="sglang:dynvocab_set_size",
                    documentation="DYNVOCAB: mean candidate-set size over the rounds of the most recent finished request.",
                    labelnames=names,
                    multiprocess_mode="mostrecent",
                ),
                Gauge(
                    name="sglang:dynvocab_coverage",
                    documentation="DYNVOCAB: share of the most recent finished request's committed tokens that were in its set.",
                    labelnames=names,
                    multiprocess_mode="mostrecent",
                ),
                # Totals since start that the device counts and telemetry publishes: gauges set to the published
                # value (a Counter only adds), monotonic between restarts.
                Gauge(
                    name="sglang:dynvocab_bad_table_entries",
                    documentation="DYNVOCAB: candidate-table entries the draft head read that broke the table's "
                    "contract (a slot or count out of range, an id >= vocab), each read as -inf logits; since start.",
                    labelnames=names,
                    multiprocess_mode="mostrecent",
                ),
                Gauge(
                    name="sglang:dynvocab_union_overflow",
                    documentation="DYNVOCAB: draft-head calls whose batch union of sets exceeded the union capacity "
                    "(the highest ids dropped from that call); since start.",
                    labelnames=names,
                    multiprocess_mode="mostrecent",
                ),
            )
        self.set_size, self.coverage, bad, overflow = Gauges._cache[key]
        self.counters = {BAD_ENTRIES: bad, UNION_OVERFLOW: overflow}

    def _set(self, gauge, value: float) -> None:
        (gauge.labels(**self.labels) if self.labels else gauge).set(value)

    def update(self, set_size: float, coverage: float) -> None:
        if self.set_size is None:
            return
        for gauge, value in ((self.set_size, set_size), (self.coverage, coverage)):
            if not math.isnan(value):
                self._set(gauge, value)

    def update_counts(self, counts: dict[str, int]) -> None:
        """The counters' published host values (``Telemetry.counts``); names without a gauge are ignored."""
        for name, value in counts.items():
            if name in self.counters:
                self._set(self.counters[name], value)


__all__ = [
    "BAD_ENTRIES",
    "COVERAGE_KEY",
    "KEYS",
    "SET_SIZE_KEY",
    "UNION_OVERFLOW",
    "Gauges",
    "Telemetry",
    "install_request_level_keys",
    "report_to_request",
]

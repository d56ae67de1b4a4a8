"""The candidate table: the contract between policies (writers) and the head (reader).

One row per request slot (SGLang's ``req_pool_idx``): ``ids[r, :cnt[r]]`` are the token ids
of slot r's set in ascending order, ``ids[r, cnt[r]:]`` hold ``fallback_id`` so every entry is
a valid id to gather. Tensors are allocated once and only mutated in place, so a CUDA graph
that captured them sees every update. Row 0 is SGLang's padding row: it, like every row,
always holds at least one id (``cnt >= 1``), so no head row is ever all ``-inf``.

All methods take ``rows`` as an int64 tensor on the table's device and do no host sync; a row outside ``[0, R)``
(a bad request slot) is skipped by the writes and holds nothing for ``contains``, never an exception or an
out-of-bounds access.

How the head reads the table (``head_reads``, shared by every backend of the logits ops): an entry that breaks
the contract (a slot outside ``[0, R)``, a count outside ``[1, W]``, an id ``>= V``) is never read out of bounds;
it gives ``-inf`` logits where it would have given columns and is counted (``ops.bad_entries``).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

_EMPTY = -1  # padding in every event tensor: negative ids are "no entry"


def compact(values: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Move the kept entries of each row to the front, in order; the rest become -1."""
    order = torch.argsort((~keep).to(torch.int8), dim=1, stable=True)
    out = values.gather(1, order)
    return torch.where(keep.gather(1, order), out, torch.full_like(out, _EMPTY))


_NONE = torch.iinfo(torch.int64).max  # sort key of empty entries: after every id


def _sorted_runs(values: torch.Tensor, stable: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sort each row's ids (empty entries last): (sorted keys, order, mask of each run's first entry)."""
    key = torch.where(values >= 0, values.long(), _NONE)
    srt, order = torch.sort(key, dim=1, stable=stable)
    first = torch.ones_like(srt, dtype=torch.bool)
    first[:, 1:] = srt[:, 1:] != srt[:, :-1]
    return srt, order, first & (srt != _NONE)


def unique_first(values: torch.Tensor) -> torch.Tensor:
    """Per row: the distinct non-negative ids in order of first occurrence, then -1 padding."""
    if values.shape[1] == 0:
        return values
    # A stable sort keeps equal ids in position order: the first of each run is the first occurrence.
    _, order, first = _sorted_runs(values, stable=True)
    keep = torch.empty_like(first).scatter_(1, order, first)
    return compact(values, keep)


@functools.lru_cache(maxsize=64)
def _earlier_in_segment(lengths: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """bool ``[n, n]``: ``[i, j]`` when entry j comes before entry i in the same segment (made once per shape)."""
    # Made on the device from the Python lengths: a host tensor copied over would be a blocking copy (a sync)
    seg = torch.cat([torch.full((n,), i, device=device) for i, n in enumerate(lengths)])
    pos = torch.arange(seg.numel(), device=device)
    return (seg[:, None] == seg[None, :]) & (pos[None, :] < pos[:, None])


def distinct_segments(segments: list[torch.Tensor]) -> torch.Tensor:
    """``[B, sum n_i]``: the segments side by side, each id that repeats an earlier one of its own segment
    replaced by -1 (a hole). The window stream is the same as ``unique_first`` of each segment's (holes are
    skipped), in O(n^2) elementwise work and a fixed handful of ops: for a verify round's few entries."""
    block = torch.cat(segments, dim=1) if len(segments) > 1 else segments[0]
    earlier = _earlier_in_segment(tuple(s.shape[1] for s in segments), block.device)
    repeat = ((block[:, :, None] == block[:, None, :]) & earlier).any(dim=2)
    return torch.where(repeat, -1, block)


def safe_rows(rows: torch.Tensor, R: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(``rows`` clamped into ``[0, R)``, which of them were in range): a bad request slot is read as row 0 and
    then ignored, with no host sync."""
    safe = rows.clamp(0, R - 1)
    return safe, safe == rows


def put_rows(dst: torch.Tensor, rows: torch.Tensor, src: torch.Tensor) -> None:
    """``dst[rows[b]] = src[b]`` in place for each ``rows[b]`` in ``[0, R)``; one outside (a bad request slot) is
    skipped, with no host sync. Integer tensors: each listed row adds its difference (exact, modulo the dtype's
    range), so a bad row, read as row 0, adds nothing; a row listed twice gets an unspecified value, as with
    ``index_copy_`` on a GPU."""
    safe, ok = safe_rows(rows, dst.shape[0])
    delta = src.to(dst.dtype) - dst.index_select(0, safe)
    dst.index_add_(0, safe, delta.masked_fill_(~ok.view(-1, *[1] * (delta.dim() - 1)), 0))


def set_contains(
    ids: torch.Tensor, cnt: torch.Tensor, rows: torch.Tensor, tokens: torch.Tensor, columns: torch.Tensor | None = None
) -> torch.Tensor:
    """``out[b, j]``: whether ``tokens[b, j]`` (-1: none) is in the set of table row ``rows[b]`` (``ids``/``cnt``;
    a row outside ``[0, R)``, a bad request slot, holds nothing). ``columns``: ``arange(capacity)`` made once by a
    caller that runs every round."""
    if columns is None:
        columns = torch.arange(ids.shape[1], device=ids.device)
    safe, ok = safe_rows(rows, ids.shape[0])
    sel = ids.index_select(0, safe)
    live = columns[None, :] < cnt.index_select(0, safe).masked_fill_(~ok, 0)[:, None]
    sel = torch.where(live, sel, torch.iinfo(torch.int32).max)  # sorted rows for searchsorted
    tok = tokens.to(torch.int32).contiguous()
    pos = torch.searchsorted(sel, tok).clamp(max=ids.shape[1] - 1)
    return (sel.gather(1, pos) == tok) & (tokens >= 0)


def _sets(candidates: torch.Tensor, cap: int, fallback_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each candidates row as a table row: (ids int32 ``[B, cap]``, cnt int32 ``[B]``)."""
    srt, _, first = _sorted_runs(candidates)
    count = first.sum(1)
    packed = compact(srt, first)[:, :cap]
    if packed.shape[1] < cap:
        packed = torch.nn.functional.pad(packed, (0, cap - packed.shape[1]), value=_EMPTY)
    packed = torch.where(packed >= 0, packed, fallback_id)  # an empty row becomes the set {fallback_id}
    return packed.to(torch.int32), torch.where(count == 0, 1, count.clamp(max=cap)).to(torch.int32)


def assign_sets(
    ids: torch.Tensor, cnt: torch.Tensor, rows: torch.Tensor, candidates: torch.Tensor, fallback_id: int
) -> None:
    """``CandidateTable.assign`` on raw table tensors (also the window update's torch reference); a bad request
    slot is skipped (``put_rows``)."""
    new_ids, new_cnt = _sets(candidates, ids.shape[1], fallback_id)
    put_rows(ids, rows, new_ids)
    put_rows(cnt, rows, new_cnt)


class HeadReads(NamedTuple):
    """What a logits call reads of the table for each of its M hidden rows (``head_reads``)."""

    slot: torch.Tensor  # [M] int64, the row's slot clamped into [0, R) (safe to index with)
    ids: torch.Tensor | None  # [M, W] the slot's ids (indexed calls; None for packed ones)
    live: torch.Tensor  # [M, W] bool, the columns that are read
    row_bad: torch.Tensor | None  # [M] bool, the slot or its count is out of range: one bad entry per hidden row
    id_bad: torch.Tensor | None  # [M, W] bool, a column within the count whose id is >= V (None for packed calls)


def head_reads(
    ids: torch.Tensor | None,
    cnt: torch.Tensor,
    row_to_slot: torch.Tensor,
    W: int,
    V: int,
    *,
    counted: bool = True,
    rows: int | None = None,
    row_map: torch.Tensor | None = None,
) -> HeadReads:
    """What the logits ops read of a table for each hidden row m (the CUDA kernel's rules, which cannot check
    values without a host sync; every backend follows them).

    ``rows``: the hidden rows M (default ``len(row_to_slot)``); ``row_to_slot`` holds one slot per ``M // B``
    consecutive rows (``B = len(row_to_slot)``: per hidden row, or per request of request-major rows), so
    ``s = row_to_slot[m // (M // B)]``. A slot outside ``[0, R)`` reads nothing (its count is 0); the count
    ``cnt[s]`` is clamped into ``[0, W]`` (so one ``<= 0`` reads nothing and one ``> W`` reads all ``W`` columns);
    column j is live if ``j < count`` and, with ``ids`` (indexed, not packed), its head row ``0 <= r < V``: the id
    itself, or with ``row_map [L]`` (ids to head rows: a d2t draft, a tensor-parallel shard) ``row_map[id]`` for
    ``0 <= id < L`` (a negative entry: the head has no row, a dead column), ``-1`` for a negative id, and a bad
    row for an id ``>= L``. A negative row is a dead column by design, one ``>= V`` a bad one. Bad entries: one
    per hidden row whose slot or count is out of range, one per column within the count whose row is bad
    (``counted=False``: not computed, None).
    """
    R = cnt.shape[0]
    M = row_to_slot.shape[0] if rows is None else rows
    B = row_to_slot.shape[0]
    slot = row_to_slot.long()
    if B != M:  # one slot per request of M // B request-major rows
        slot = slot.repeat_interleave(M // B, output_size=M) if B else slot.new_zeros(M)
    slot_ok = (slot >= 0) & (slot < R)
    slot = torch.where(slot_ok, slot, 0)
    raw = torch.where(slot_ok, cnt.index_select(0, slot), 0) if R else torch.zeros_like(slot)
    row_bad = (raw < 1) | (raw > W) if counted else None  # a bad slot reads as count 0
    live = torch.arange(W, device=cnt.device)[None, :] < raw.clamp(0, W)[:, None]
    if ids is None:
        return HeadReads(slot, None, live, row_bad, None)
    sel = ids.index_select(0, slot) if R else torch.zeros((M, W), dtype=ids.dtype, device=ids.device)
    if row_map is not None:
        L = row_map.shape[0]
        mapped = row_map.long()[sel.long().clamp(0, max(L - 1, 0))] if L else torch.full_like(sel, -1, dtype=torch.long)
        sel = torch.where(sel < 0, -1, torch.where(sel >= L, V, mapped))  # an id past the map: a bad row
    id_bad = live & (sel >= V) if counted else None
    return HeadReads(slot, sel, live & (sel >= 0) & (sel < V), row_bad, id_bad)


class CandidateTable:
    """``ids[R, W]`` int32 and ``cnt[R]`` int32, one row per request slot."""

    def __init__(
        self,
        num_rows: int,
        capacity: int,
        *,
        device: torch.device | str | None = None,
        fallback_id: int = 0,
    ) -> None:
        if num_rows < 1:
            raise ValueError(f"CandidateTable: num_rows = {num_rows} is invalid: must be >= 1 (row 0 is padding)")
        if capacity < 1:
            raise ValueError(f"CandidateTable: capacity = {capacity} is invalid: must be >= 1")
        if fallback_id < 0:
            raise ValueError(f"CandidateTable: fallback_id = {fallback_id} is invalid: must be a token id >= 0")
        self.fallback_id = fallback_id
        # One spare row past the slots, never read: a write sends a bad request slot there (no host sync, no
        # out-of-bounds access). ids and cnt are views of the slots' rows.
        self._ids_all = torch.full((num_rows + 1, capacity), fallback_id, dtype=torch.int32, device=device)
        self._cnt_all = torch.ones(num_rows + 1, dtype=torch.int32, device=device)
        self.ids, self.cnt = self._ids_all[:num_rows], self._cnt_all[:num_rows]
        self._columns = torch.arange(capacity, device=device)  # made once: contains runs every verify round

    @classmethod
    def over(cls, ids: torch.Tensor, cnt: torch.Tensor, fallback_id: int = 0) -> CandidateTable:
        """A table over existing tensors (shared, never copied): e.g. the server's head over the policy's table."""
        if ids.dtype != torch.int32 or cnt.dtype != torch.int32 or ids.dim() != 2 or cnt.shape != ids.shape[:1]:
            raise ValueError("CandidateTable.over: ids must be int32 [R, W] and cnt int32 [R]")
        self = cls.__new__(cls)
        self.fallback_id, self.ids, self.cnt = fallback_id, ids, cnt
        self._ids_all = self._cnt_all = None  # no spare row: writes skip a bad slot with put_rows
        self._columns = torch.arange(ids.shape[1], device=ids.device)  # contains() needs it as much (was missing)
        return self

    @property
    def num_rows(self) -> int:
        return self.ids.shape[0]

    @property
    def capacity(self) -> int:
        return self.ids.shape[1]

    @property
    def device(self) -> torch.device:
        return self.ids.device

    def _spare(self, rows: torch.Tensor) -> torch.Tensor:
        """``rows``, a bad request slot replaced by the spare row (``num_rows``)."""
        return torch.where(rows.clamp(0, self.num_rows - 1) == rows, rows, self.num_rows)

    def reset(self, rows: torch.Tensor) -> None:
        """Give ``rows`` the fallback set ``{fallback_id}`` (a fresh slot, before its prefill)."""
        if self._ids_all is None:
            put_rows(self.ids, rows, torch.full((rows.shape[0], self.capacity), self.fallback_id, device=self.device))
            put_rows(self.cnt, rows, torch.ones(rows.shape[0], dtype=torch.int32, device=self.device))
            return
        target = self._spare(rows)
        self._ids_all.index_fill_(0, target, self.fallback_id)
        self._cnt_all.index_fill_(0, target, 1)

    def assign(self, rows: torch.Tensor, candidates: torch.Tensor) -> None:
        """Set each row to the distinct non-negative ids of its candidates row.

        ``candidates[B, n]`` may repeat ids and use -1 for empty entries. The set is stored in
        ascending order; a row with no ids gets the fallback set. More than ``capacity``
        distinct ids is the caller's error (policies keep their sets within capacity).
        """
        if self._ids_all is None:
            assign_sets(self.ids, self.cnt, rows, candidates, self.fallback_id)
            return
        new_ids, new_cnt = _sets(candidates, self.capacity, self.fallback_id)
        target = self._spare(rows)
        self._ids_all.index_copy_(0, target, new_ids)
        self._cnt_all.index_copy_(0, target, new_cnt)

    def contains(self, rows: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """``out[b, j]``: whether ``tokens[b, j]`` is in the set of ``rows[b]``."""
        return set_contains(self.ids, self.cnt, rows, tokens, self._columns)

    def row(self, r: int) -> list[int]:
        """Host copy of slot r's set (for tools and tests, never per step)."""
        return self.ids[r, : int(self.cnt[r])].tolist()

"""Torch reference of the head ops: the one definition every faster backend is tested against.

Arguments are checked by ``checks`` (shared with Triton); fp64 is accepted here for exact CPU oracles.
The logits ops read the candidate table as ``table.head_reads`` says (a bad entry gives ``-inf`` and is
added to the optional int64 counter ``bad``), exactly as the CUDA and Triton kernels do.
"""

from __future__ import annotations

import torch

from ..table import assign_sets, compact, distinct_segments, head_reads, set_contains
from .checks import (
    REFERENCE_FLOATS,
    check_compact_topk,
    check_indexed_logits,
    check_pack_update,
    check_packed_logits,
    check_window_update,
    check_window_verify,
)
from .topk import column_tokens, local_topk


def _count_bad(bad: torch.Tensor | None, reads) -> None:
    if bad is not None:  # on the device, no sync: one per bad hidden row, one per bad column of a row
        bad.add_(reads.row_bad.sum() if reads.id_bad is None else reads.row_bad.sum() + reads.id_bad.sum())


def indexed_logits(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    ids: torch.Tensor,
    cnt: torch.Tensor,
    row_to_slot: torch.Tensor,
    bad: torch.Tensor | None = None,
    row_map: torch.Tensor | None = None,
) -> torch.Tensor:
    """Compact logits: ``out[m, j] = dot(weight[r], hidden[m])`` for live columns, else -inf.

    ``s = row_to_slot[m // (M // B)]``: a slot per hidden row (``B = M``) or per request of ``M // B``
    request-major rows (``B`` requests: the slot expansion happens inside the op). The head row of column j is
    ``r = ids[s, j]``, or ``row_map[ids[s, j]]`` with ``row_map`` (int32 ``[L]``, target ids to this head's rows,
    -1 where it has none: a d2t draft, a tensor-parallel shard; the id-to-row map inside the op). Column j is
    live if ``j < cnt[s]`` and ``0 <= r < V``. Shapes: hidden ``[M, d]``, weight ``[V, d]`` (same float dtype),
    ids ``[R, W]`` int32, cnt ``[R]`` int32, row_to_slot ``[B]`` int32 or int64. Returns fp32 ``[M, W]`` with
    products and sums in fp32 (in fp64 for fp64 inputs, then rounded to fp32).

    A dead column's row is never read. A negative id lets a slot's set mapped to local head rows (d2t
    drafts, tensor-parallel shards) mark the ids the local head lacks and keep the request's slot, so
    all of a request's hidden rows still share one read of its candidate rows. Entries that break the
    table's contract (a slot outside ``[0, R)``, a count outside ``[1, W]``, an id ``>= V``) are read as
    ``table.head_reads`` says (``-inf`` where they would give columns; a count above ``W`` reads ``W``)
    and added to ``bad`` (an int64 counter of one element) when given.
    """
    check_indexed_logits(hidden, weight, ids, cnt, row_to_slot, bad, row_map, floats=REFERENCE_FLOATS)
    acc = torch.float64 if hidden.dtype == torch.float64 else torch.float32
    reads = head_reads(
        ids, cnt, row_to_slot, ids.shape[1], weight.shape[0], counted=bad is not None, rows=hidden.shape[0],
        row_map=row_map,
    )  # fmt: skip
    rows = weight[torch.where(reads.live, reads.ids, 0)].to(acc)  # [M, W, d]
    out = torch.einsum("mwd,md->mw", rows, hidden.to(acc)).float()
    _count_bad(bad, reads)
    return out.masked_fill_(~reads.live, float("-inf"))


def compact_topk(
    logits: torch.Tensor,
    col_ids: torch.Tensor | None,
    rows: torch.Tensor | None,
    k: int,
    fallback_id: int,
    mode: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The draft head's top-k of fp32 logits ``[N, W]``: (values ``[N, k]``, token ids int64 ``[N, k]``, lse ``[N]``).

    Per row: the k best columns, value descending, then column ascending (``ops.topk.local_topk``); the column's
    token through the head's column map ``col_ids`` (``ops.topk.column_tokens``: None, ``[W]``, or ``[R, W]`` with
    ``rows [bs]`` the map row of each request's ``N // bs`` request-major rows); an entry of value ``-inf`` (k above
    the row's live columns) or of a negative id is ``fallback_id``. ``lse``: the row's logsumexp. Values: the raw
    logit (``mode`` 0), the log-probability ``v - lse`` (1; ``-inf`` for a ``-inf`` entry) or the probability (2; 0
    for a ``-inf`` entry). ``k <= 16``. The order of NaN logits is unspecified.
    """
    check_compact_topk(logits, col_ids, rows, k, fallback_id, mode)
    values, cols, lse = local_topk(logits, k)
    tokens = column_tokens(col_ids, rows, cols)
    empty = torch.isneginf(values)
    tokens = torch.where(empty | (tokens < 0), fallback_id, tokens)
    if mode == 1:
        values = torch.where(empty, float("-inf"), values - lse[:, None])
    elif mode == 2:
        values = torch.where(empty, 0.0, torch.exp(values - lse[:, None]))
    return values, tokens, lse


# --- MicroSpec window update -------------------------------------------------------------------


def window_update(
    ring: torch.Tensor,
    length: torch.Tensor,
    ids: torch.Tensor,
    cnt: torch.Tensor,
    rows: torch.Tensor,
    block: torch.Tensor,
    fallback_id: int,
    vocab_size: int,
) -> None:
    """Append stream entries to each listed row's ring, then publish the row's set; in place.

    ``ring`` int32 ``[R, >= capacity]`` (columns past ``capacity = ids.shape[1]`` are scratch),
    ``length`` int64 ``[R]`` (entries appended so far), ``ids``/``cnt`` the candidate table,
    ``rows`` int64 ``[B]`` distinct slots, ``block`` int32 ``[B, n]``. The valid entries of
    ``block[b]`` are its ids in ``[0, vocab_size)``, in order (anything else is a hole); of
    ``count`` valid entries only the last ``capacity`` are kept, the one of rank r going to
    ``ring[s, (length[s] + r) % capacity]``; ``length[s] += count``. Then ``ids[s]`` is the sorted
    distinct valid ids of ``ring[s, :capacity]`` followed by ``fallback_id``, and ``cnt[s]`` their
    number (1, the set ``{fallback_id}``, when there are none).
    """
    check_window_update(ring, length, ids, cnt, rows, block, fallback_id, vocab_size)
    cap = ids.shape[1]
    n = block.shape[1]
    if n:
        valid = (block >= 0) & (block < vocab_size)
        entries = compact(block, valid)
        count = valid.sum(1)
        i = torch.arange(n, device=block.device)[None, :]
        keep = (i < count[:, None]) & (i >= (count - cap)[:, None])
        slot = (length.index_select(0, rows)[:, None] + i) % cap
        # Entries not kept write to column ``cap`` of a padded copy, which is then dropped.
        slot = torch.where(keep, slot, cap)
        part = torch.nn.functional.pad(ring.index_select(0, rows)[:, :cap], (0, 1))
        part.scatter_(1, slot, entries.to(torch.int32))
        ring[:, :cap].index_copy_(0, rows, part[:, :cap])
        length.index_add_(0, rows, count.to(length.dtype))
    current = ring.index_select(0, rows)[:, :cap]
    current = torch.where((current >= 0) & (current < vocab_size), current, -1)
    assign_sets(ids, cnt, rows, current, fallback_id)


def window_verify(
    ring: torch.Tensor,
    length: torch.Tensor,
    ids: torch.Tensor,
    cnt: torch.Tensor,
    acc: torch.Tensor,
    rows: torch.Tensor,
    draft_token: torch.Tensor,
    accept_index: torch.Tensor,
    accept_lens: torch.Tensor,
    predict: torch.Tensor,
    topk_values: torch.Tensor,
    topk_ids: torch.Tensor,
    hot: torch.Tensor | None,
    k: int,
    context: bool,
    compacted: bool,
    fallback_id: int,
    vocab_size: int,
) -> torch.Tensor:
    """One verify round of the window policy from SGLang's verify tensors, in place; returns ``accepted``.

    Inputs (``B`` requests, ``nd`` draft tokens each, ``S`` accept columns): ``draft_token`` ``[B * nd]``
    (root first), ``accept_index`` ``[B, S]`` (global node rows of the accepted path, -1 padded),
    ``accept_lens`` ``[B]``, ``predict`` ``[B * nd]`` (the committed token after each node; with
    ``compacted`` token s of request b sits at ``b * nd + min(s, nd - 1)``), ``topk_values``/``topk_ids``
    ``[B * nd, kk]`` (the target's top-``kk`` per node, ``kk <= k``), ``hot`` an optional bool mask of
    the draft vocabulary. Position s of request b is accepted when ``accept_index[b, s] >= 0`` and
    ``s < accept_lens[b]``.

    1. ``accepted[b, s]``: the committed token at each accepted position, else -1 (int64 ``[B, S]``).
    2. Telemetry, against the sets as they are before this round: ``acc[:, rows[b]] += (cnt[rows[b]],
       1, committed tokens in the set, committed tokens)``.
    3. The window entries, two segments: the draft tokens (if ``context``), then per position s
       ``k`` top-k ids in rank order (-1 where s is not accepted, past ``kk``, or the logit is -inf).
       An id outside ``[0, vocab_size)`` or ``hot`` is a hole; so is a repeat of an earlier id of its
       own segment. ``window_update(ring, length, ids, cnt, rows, entries, fallback_id, vocab_size)``.
    """
    check_window_verify(
        ring,
        length,
        ids,
        cnt,
        acc,
        rows,
        draft_token,
        accept_index,
        accept_lens,
        predict,
        topk_values,
        topk_ids,
        hot,
        k,
        fallback_id,
        vocab_size,
    )
    B, S = accept_index.shape
    nd = draft_token.numel() // B
    dev = ids.device
    steps = torch.arange(S, device=dev)
    index = accept_index.long()
    valid = (index >= 0) & (steps[None, :] < accept_lens.long()[:, None])
    pos = index.clamp(min=0)
    front = torch.arange(B, device=dev)[:, None] * nd + steps.clamp(max=nd - 1)[None, :]
    accepted = torch.where(valid, predict.long()[front if compacted else pos], -1)

    def keep(t: torch.Tensor) -> torch.Tensor:
        ok = (t >= 0) & (t < vocab_size)
        if hot is not None:
            ok &= (t < hot.numel()) & hot[t.clamp(0, max(hot.numel() - 1, 0))]
        return torch.where(ok, t, -1)

    segments = []
    if context:
        segments.append(keep(draft_token.long().view(B, nd)))
    if k:
        kk = topk_ids.shape[1]
        top = torch.where(valid[:, :, None] & (topk_values[pos] > float("-inf")), topk_ids[pos], -1)  # [B, S, kk]
        top = torch.nn.functional.pad(top[:, :, :k], (0, k - min(kk, k)), value=-1)
        segments.append(keep(top.reshape(B, S * k)))
    # each id that repeats an earlier one of its own segment is a hole
    block = distinct_segments(segments) if segments else torch.empty((B, 0), dtype=torch.int64, device=dev)

    live = cnt.index_select(0, rows)
    hit = set_contains(ids, cnt, rows, accepted).sum(1)
    committed = (accepted >= 0).sum(1)
    acc.index_add_(
        1,
        rows,
        torch.stack((live.double(), torch.ones_like(live, dtype=torch.float64), hit.double(), committed.double())),
    )
    window_update(ring, length, ids, cnt, rows, block.to(torch.int32), fallback_id, vocab_size)
    return accepted


# --- Packed head mode: MicroSpec's asynchronous gathering ----------------------------------------
# Each slot keeps its set's LM-head rows in packed[s, :cnt[s]] with their ids in packed_ids[s];
# an update copies only the rows of ids that entered the set. Table rows are sorted, so the packed
# layout uses stable slots instead: survivors keep theirs, entering ids and survivors past the new
# count fill the vacated ones (rules in pack_update's docstring; tests/literal.py states them per row).

_PAST = torch.iinfo(torch.int64).max  # search key of dead entries: after every id, so rows stay sorted


def pack_update(
    packed: torch.Tensor,
    packed_ids: torch.Tensor,
    weight: torch.Tensor,
    ids: torch.Tensor,
    cnt: torch.Tensor,
    rows: torch.Tensor,
) -> None:
    """Bring the packed rows of ``rows`` up to date with the table, in place, reading ``weight`` only for new ids.

    Shapes: packed ``[R, W, d]`` (weight's dtype), packed_ids ``[R, W]`` int32, weight ``[V, d]``,
    ids ``[R, W]`` int32, cnt ``[R]`` int32, rows ``[B]`` int64 (distinct slots). For each s in rows,
    with ``c_old`` live slots (packed_ids >= 0, always a prefix; a fresh row is all -1), new count
    ``c = cnt[s]`` and new set ``N = ids[s, :c]``:

    * survivors are the old live slots whose id is in N; they keep slot and row (not re-read) if below c;
    * the free slots are the j < c that are leaving (id not in N) or past c_old, ascending;
    * the fillers are the entering ids (in N, not old live) in table order, then the survivors at
      slots >= c in slot order; the i-th free slot gets the i-th filler: its id, and its row
      (``weight[id]`` for an entering id, the survivor's packed row for a moved one);
    * ``packed_ids[s, c:] = -1``; ``packed[s, c:]`` keeps whatever it held. Other rows are untouched.

    Batched over rows with fixed shapes (no host sync; runs on ``meta``). The survivors' and
    unused rows' writes here copy their own values back, which is the same as not writing them.
    """
    check_pack_update(packed, packed_ids, weight, ids, cnt, rows, floats=REFERENCE_FLOATS)
    B, W = rows.shape[0], ids.shape[1]
    dev = ids.device
    old = packed_ids.index_select(0, rows).long()  # [B, W]
    new = ids.index_select(0, rows).long()
    c = cnt.index_select(0, rows).long()[:, None]
    col = torch.arange(W, device=dev)[None, :]
    old_live = col < (old >= 0).sum(1, keepdim=True)  # j < c_old
    new_live = col < c  # k < c
    # Membership by binary search in each row's sorted live ids (dead entries sort last).
    new_keys = torch.where(new_live, new, _PAST)  # ids[s, :c] is ascending already
    at = torch.searchsorted(new_keys, old).clamp_(max=W - 1)
    survivor = old_live & (new_keys.gather(1, at) == old)
    old_keys = torch.where(old_live, old, _PAST).sort(dim=1).values
    at = torch.searchsorted(old_keys, new).clamp_(max=W - 1)
    entering = new_live & (old_keys.gather(1, at) != new)
    # Below c, a slot that holds no survivor is leaving (j < c_old) or was dead (j >= c_old): free.
    free = new_live & ~survivor
    mover = survivor & ~new_live  # survivors at j >= c
    # Fillers in order: entering ids by k, then movers by j; column W takes every non-filler's write.
    # Their number is c - (survivors below c), that of the free slots too, so filler ranks are < W.
    n_entering = entering.sum(1, keepdim=True)
    rank = torch.where(entering, entering.cumsum(1) - 1, torch.where(mover, n_entering + mover.cumsum(1) - 1, W))
    fill_id = torch.full((B, W + 1), -1, dtype=torch.long, device=dev)
    fill_id.scatter_(1, rank, torch.where(entering, new, old))
    fill_from = torch.full((B, W + 1), -1, dtype=torch.long, device=dev)  # -1: weight[id], else that slot
    fill_from.scatter_(1, rank, torch.where(mover, col, -1))
    # The i-th free slot takes the i-th filler.
    i = torch.where(free, free.cumsum(1) - 1, W)
    slot_id, slot_from = fill_id.gather(1, i), fill_from.gather(1, i)
    from_weight = free & (slot_from < 0)
    src_slot = torch.where(free & (slot_from >= 0), slot_from, col)  # a moved row, else the slot's own
    kept = packed[rows[:, None], src_slot]  # [B, W, d], read before any write
    fetched = weight[torch.where(from_weight, slot_id, 0)]
    packed[rows] = torch.where(from_weight[..., None], fetched, kept)
    packed_ids[rows] = torch.where(new_live, torch.where(free, slot_id, old), -1).to(torch.int32)


def packed_logits(
    hidden: torch.Tensor,
    packed: torch.Tensor,
    cnt: torch.Tensor,
    row_to_slot: torch.Tensor,
    bad: torch.Tensor | None = None,
) -> torch.Tensor:
    """Compact logits over packed rows: ``out[m, j] = dot(packed[s, j], hidden[m])`` for ``j < cnt[s]``, else -inf.

    ``s = row_to_slot[m // (M // B)]`` (as in ``indexed_logits``); column j is token ``packed_ids[s, j]`` (see
    ``pack_update``). Shapes: hidden ``[M, d]``, packed ``[R, W, d]`` (same float dtype), cnt ``[R]`` int32,
    row_to_slot ``[B]`` int32 or int64. Returns fp32 ``[M, W]``, accumulated like ``indexed_logits``; a bad slot or count is
    read and counted as there (``table.head_reads``).
    """
    check_packed_logits(hidden, packed, cnt, row_to_slot, bad, floats=REFERENCE_FLOATS)
    acc = torch.float64 if hidden.dtype == torch.float64 else torch.float32
    reads = head_reads(None, cnt, row_to_slot, packed.shape[1], 0, counted=bad is not None, rows=hidden.shape[0])
    slot = reads.slot
    rows = packed.index_select(0, slot) if packed.shape[0] else packed.new_zeros((slot.shape[0], *packed.shape[1:]))
    out = torch.einsum("mwd,md->mw", rows.to(acc), hidden.to(acc)).float()
    _count_bad(bad, reads)
    return out.masked_fill_(~reads.live, float("-inf"))

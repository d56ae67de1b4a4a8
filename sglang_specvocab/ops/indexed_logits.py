"""``indexed_logits`` and ``packed_logits``, the draft head's compact logits over each request's candidate set
(csrc/indexed_logits.cpp, csrc/indexed_logits_kernel.cu; Triton: ``triton_ops``): their argument checks,
torch references, Triton wrappers, fake kernels and public entries.

``indexed_logits`` gathers each column's head row through the table's ids; ``packed_logits`` reads rows
already packed per request slot (``pack_update`` keeps them). Both read the table as ``table.head_reads``
says and count its bad entries into the optional ``bad`` counter (see the package doc).
"""

from __future__ import annotations

import torch

from ..table import head_reads
from ._backend import implementation, register
from ._ext import fake
from .checks import (
    KERNEL_FLOATS,
    REFERENCE_FLOATS,
    check_counter,
    check_table_entries,
    debug_checks,
    float_names,
    need,
    one_device,
    readable,
)

# --- argument checks ---------------------------------------------------------------------------------


def _check_logits(op, hidden, rows, name, cnt, row_to_slot, R, W, floats) -> None:
    """What the two logits ops share; ``rows`` holds the candidate rows (``weight`` or ``packed``)."""
    need(hidden.dim() == 2, op, f"hidden must be [M, d], got shape {tuple(hidden.shape)}")
    need(hidden.shape[1] == rows.shape[-1], op, f"hidden has d={hidden.shape[1]} but {name} has d={rows.shape[-1]}")
    need(hidden.dtype in floats, op, f"hidden dtype {hidden.dtype} must be one of {float_names(floats)}")
    need(rows.dtype == hidden.dtype, op, f"{name} dtype {rows.dtype} must equal hidden dtype {hidden.dtype}")
    need(
        cnt.dim() == 1 and cnt.dtype == torch.int32 and cnt.shape[0] == R,
        op,
        f"cnt must be int32 [R={R}], got {cnt.dtype} {tuple(cnt.shape)}",
    )
    M, B = hidden.shape[0], row_to_slot.shape[0] if row_to_slot.dim() == 1 else -1
    need(
        row_to_slot.dim() == 1
        and row_to_slot.dtype in (torch.int32, torch.int64)
        and (B == M or (B > 0 and M % B == 0) or (M == 0 and B >= 0)),
        op,
        f"row_to_slot must be int32 or int64 [B] with B dividing M={M} (a slot per hidden row, or per request of "
        f"M // B request-major rows), got {row_to_slot.dtype} {tuple(row_to_slot.shape)}",
    )
    one_device(op, hidden, rows, cnt, row_to_slot)


def check_indexed_logits(
    hidden, weight, ids, cnt, row_to_slot, bad=None, row_map=None, *, floats=KERNEL_FLOATS
) -> None:
    op = "indexed_logits"
    need(weight.dim() == 2, op, f"weight must be [V, d], got shape {tuple(weight.shape)}")
    need(
        ids.dim() == 2 and ids.dtype == torch.int32, op, f"ids must be int32 [R, W], got {ids.dtype} {tuple(ids.shape)}"
    )
    one_device(op, ids, weight)
    _check_logits(op, hidden, weight, "weight", cnt, row_to_slot, ids.shape[0], ids.shape[1], floats)
    check_counter(op, bad, hidden.device)
    if row_map is not None:
        need(
            row_map.dim() == 1 and row_map.dtype == torch.int32,
            op,
            f"row_map must be int32 [L] (ids to head rows, -1: no row), got {row_map.dtype} {tuple(row_map.shape)}",
        )
        one_device(op, row_map, hidden)
    if debug_checks() and readable(hidden):
        V = weight.shape[0] if row_map is None else row_map.shape[0]  # a mapped table's ids index the map
        check_table_entries(op, ids, cnt, row_to_slot, ids.shape[1], V, rows=hidden.shape[0])


def check_packed_logits(hidden, packed, cnt, row_to_slot, bad=None, *, floats=KERNEL_FLOATS) -> None:
    op = "packed_logits"
    need(packed.dim() == 3, op, f"packed must be [R, W, d], got shape {tuple(packed.shape)}")
    _check_logits(op, hidden, packed, "packed", cnt, row_to_slot, packed.shape[0], packed.shape[1], floats)
    check_counter(op, bad, hidden.device)
    if debug_checks() and readable(hidden):
        check_table_entries(op, None, cnt, row_to_slot, packed.shape[1], 0, rows=hidden.shape[0])


# --- torch references --------------------------------------------------------------------------------


def _count_bad(bad: torch.Tensor | None, reads) -> None:
    if bad is not None:  # on the device, no sync: one per bad hidden row, one per bad column of a row
        bad.add_(reads.row_bad.sum() if reads.id_bad is None else reads.row_bad.sum() + reads.id_bad.sum())


def reference_indexed_logits(
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


def reference_packed_logits(
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


# --- Triton (GPU tensors, or CPU ones under TRITON_INTERPRET=1) ------------------------------------------


def triton_indexed_logits(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    ids: torch.Tensor,
    cnt: torch.Tensor,
    row_to_slot: torch.Tensor,
    bad: torch.Tensor | None = None,
    row_map: torch.Tensor | None = None,
    *,
    block_w: int | None = None,
    block_d: int | None = None,
    num_warps: int = 4,
) -> torch.Tensor:
    """``out[m, j] = dot(weight[r], hidden[m])`` for ``j < cnt[s]`` and ``0 <= r < V``, else -inf.

    ``s = row_to_slot[m // (M // B)]`` (a slot per hidden row or per request), ``r = ids[s, j]`` or
    ``row_map[ids[s, j]]``; a negative row is a dead column (see ``reference_indexed_logits``).

    hidden ``[M, d]``, weight ``[V, d]`` (bf16/fp16/fp32, same dtype), ids ``[R, W]`` int32, cnt ``[R]``
    int32 in ``[1, W]``, row_to_slot ``[B]`` int32 or int64, row_map ``[L]`` int32. Returns fp32 ``[M, W]``.
    Bad table entries give -inf and are added to the int64 counter ``bad`` when given (``table.head_reads``).
    Arguments are checked by ``check_indexed_logits`` (shapes always; the table's values only under the debug
    setting).
    ``block_w``/``block_d`` (powers of two >= 16) override the tiles.
    """
    from .triton_ops import launch  # optional: Triton may be absent

    check_indexed_logits(hidden, weight, ids, cnt, row_to_slot, bad, row_map)
    return launch(hidden, weight, ids, cnt, row_to_slot, bad, ids.shape[1], False, block_w, block_d, num_warps, row_map)


def triton_packed_logits(
    hidden: torch.Tensor,
    packed: torch.Tensor,
    cnt: torch.Tensor,
    row_to_slot: torch.Tensor,
    bad: torch.Tensor | None = None,
    *,
    block_w: int | None = None,
    block_d: int | None = None,
    num_warps: int = 4,
) -> torch.Tensor:
    """``out[m, j] = dot(packed[s, j], hidden[m])`` for ``j < cnt[s]``, else -inf; ``s = row_to_slot[m]``.

    hidden ``[M, d]``, packed ``[R, W, d]`` (same dtype), cnt ``[R]`` int32 in ``[1, W]``,
    row_to_slot ``[M]`` int32. Returns fp32 ``[M, W]``; ``bad`` as in ``indexed_logits``.
    """
    from .triton_ops import launch  # optional: Triton may be absent

    check_packed_logits(hidden, packed, cnt, row_to_slot, bad)
    return launch(hidden, packed, None, cnt, row_to_slot, bad, packed.shape[1], True, block_w, block_d, num_warps)


# --- fake kernels (torch.compile, the meta device) -------------------------------------------------------


@fake("indexed_logits")
def _fake_indexed_logits(hidden, weight, ids, cnt, row_to_slot, bad=None, row_map=None):
    return hidden.new_empty((hidden.shape[0], ids.shape[1]), dtype=torch.float32)


@fake("packed_logits")
def _fake_packed_logits(hidden, packed, cnt, row_to_slot, bad=None):
    return hidden.new_empty((hidden.shape[0], packed.shape[1]), dtype=torch.float32)


# --- public entries --------------------------------------------------------------------------------------

register(
    "indexed_logits", reference_indexed_logits, check=check_indexed_logits, triton=triton_indexed_logits, counted=True
)
register("packed_logits", reference_packed_logits, check=check_packed_logits, triton=triton_packed_logits, counted=True)


def indexed_logits(
    hidden, weight, ids, cnt, row_to_slot, *, backend: str = "auto", bad=None, row_map=None
) -> torch.Tensor:
    """Compact logits ``[M, W]`` over each row's candidate set (see ``reference_indexed_logits``: ``row_to_slot``
    per hidden row or per request, ids through ``row_map``); bad table entries are counted into ``bad``, by default
    ``ops.bad_entries(hidden.device)``."""
    fn = implementation(backend, hidden.device, "indexed_logits")
    return fn(hidden, weight, ids, cnt, row_to_slot, row_map=row_map, **({} if bad is None else {"bad": bad}))


def packed_logits(hidden, packed, cnt, row_to_slot, *, backend: str = "auto", bad=None) -> torch.Tensor:
    """Compact logits ``[M, W]`` over packed candidate rows (see ``reference_packed_logits``); ``bad`` as in
    ``indexed_logits``."""
    fn = implementation(backend, hidden.device, "packed_logits")
    return fn(hidden, packed, cnt, row_to_slot, **({} if bad is None else {"bad": bad}))

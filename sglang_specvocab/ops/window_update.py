"""``window_update``: MicroSpec's window append + publish, in place (csrc/window_update.cpp,
csrc/window_update_kernel.cu): its argument check, torch reference, fake kernel and public entry.
"""

from __future__ import annotations

import torch

from ..table import assign_sets, compact, put_rows, safe_rows
from ._backend import implementation, register
from ._ext import fake
from .checks import check_rows, need, one_device, readable

# --- argument check --------------------------------------------------------------------------------------


def check_window_update(ring, length, ids, cnt, rows, block, fallback_id: int, vocab_size: int) -> None:
    op = "window_update"
    # in place: the compiled op writes them through their data pointers, so they must be dense (rows of ring)
    need(
        ids.dim() == 2 and ids.dtype == torch.int32 and ids.is_contiguous(),
        op,
        f"ids must be a contiguous int32 [R, capacity] table, got {ids.dtype} {tuple(ids.shape)}",
    )
    R, cap = ids.shape
    need(
        cnt.dim() == 1 and cnt.dtype == torch.int32 and cnt.shape[0] == R and cnt.is_contiguous(),
        op,
        f"cnt must be contiguous int32 [R={R}], got {cnt.dtype} {tuple(cnt.shape)}",
    )
    need(
        ring.dim() == 2
        and ring.dtype == torch.int32
        and ring.shape[0] == R
        and ring.shape[1] >= cap
        and ring.stride(1) == 1,
        op,
        f"ring must be int32 [R={R}, >= capacity={cap}] with contiguous rows, got {ring.dtype} {tuple(ring.shape)}",
    )
    need(
        length.dim() == 1 and length.dtype == torch.int64 and length.shape[0] == R and length.is_contiguous(),
        op,
        f"length must be contiguous int64 [R={R}], got {length.dtype} {tuple(length.shape)}",
    )
    need(
        rows.dim() == 1 and rows.dtype == torch.int64,
        op,
        f"rows must be int64 [B], got {rows.dtype} {tuple(rows.shape)}",
    )
    if block is not None:  # None: the caller makes the block itself (window_verify)
        need(
            block.dim() == 2 and block.dtype == torch.int32 and block.shape[0] == rows.shape[0],
            op,
            f"block must be int32 [B={rows.shape[0]}, n], got {block.dtype} {tuple(block.shape)}",
        )
    need(1 <= vocab_size <= 2**31, op, f"vocab_size = {vocab_size} must be in [1, 2^31]")
    need(
        0 <= fallback_id < vocab_size,
        op,
        f"fallback_id = {fallback_id} must be a token id in [0, vocab_size={vocab_size})",
    )
    one_device(op, ring, length, ids, cnt, rows, *(() if block is None else (block,)))
    if readable(ids):
        check_rows(op, rows, R)


# --- torch reference -------------------------------------------------------------------------------------


def reference_window_update(
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
    ``rows`` int64 ``[B]`` distinct slots (one outside ``[0, R)`` is refused where values are read, else skipped),
    ``block`` int32 ``[B, n]``. The valid entries of
    ``block[b]`` are its ids in ``[0, vocab_size)``, in order (anything else is a hole); of
    ``count`` valid entries only the last ``capacity`` are kept, the one of rank r going to
    ``ring[s, (length[s] + r) % capacity]``; ``length[s] += count``. Then ``ids[s]`` is the sorted
    distinct valid ids of ``ring[s, :capacity]`` followed by ``fallback_id``, and ``cnt[s]`` their
    number (1, the set ``{fallback_id}``, when there are none).
    """
    check_window_update(ring, length, ids, cnt, rows, block, fallback_id, vocab_size)
    cap = ids.shape[1]
    n = block.shape[1]
    # A row out of range (refused above where values are read) is skipped, as the CUDA kernel skips it.
    safe, ok = safe_rows(rows, ids.shape[0])
    if n:
        valid = (block >= 0) & (block < vocab_size)
        entries = compact(block, valid)
        count = valid.sum(1)
        i = torch.arange(n, device=block.device)[None, :]
        keep = (i < count[:, None]) & (i >= (count - cap)[:, None])
        slot = (length.index_select(0, safe)[:, None] + i) % cap
        # Entries not kept write to column ``cap`` of a padded copy, which is then dropped.
        slot = torch.where(keep, slot, cap)
        part = torch.nn.functional.pad(ring.index_select(0, safe)[:, :cap], (0, 1))
        part.scatter_(1, slot, entries.to(torch.int32))
        put_rows(ring[:, :cap], rows, part[:, :cap])
        length.index_add_(0, safe, count.to(length.dtype).masked_fill_(~ok, 0))
    current = ring.index_select(0, safe)[:, :cap]
    current = torch.where((current >= 0) & (current < vocab_size), current, -1)
    assign_sets(ids, cnt, rows, current, fallback_id)


@fake("window_update")
def _fake_window_update(ring, length, ids, cnt, rows, block, fallback_id, vocab_size):
    return None


register("window_update", reference_window_update, check=check_window_update)


def window_update(ring, length, ids, cnt, rows, block, *, fallback_id: int, vocab_size: int, backend: str = "auto"):
    """MicroSpec's window append + publish, in place (see ``reference_window_update``)."""
    implementation(backend, ids.device, "window_update")(ring, length, ids, cnt, rows, block, fallback_id, vocab_size)

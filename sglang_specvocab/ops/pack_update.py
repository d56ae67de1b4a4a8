"""``pack_update``: the packed head mode's update, which copies the rows that entered each listed slot's set into its
packed buffer, in place (csrc/pack_update.cpp, csrc/pack_update_kernel.cu): its argument check, torch reference,
fake kernel and public entry. ``packed_logits`` (in ``indexed_logits.py``) reads the buffer.
"""

from __future__ import annotations

import torch

from ._backend import implementation, register
from ._ext import fake
from .checks import KERNEL_FLOATS, REFERENCE_FLOATS, check_rows, float_names, need, one_device, readable

# --- argument check --------------------------------------------------------------------------------------


def check_pack_update(packed, packed_ids, weight, ids, cnt, rows, *, floats=KERNEL_FLOATS) -> None:
    op = "pack_update"
    need(packed.dim() == 3, op, f"packed must be [R, W, d], got shape {tuple(packed.shape)}")
    R, W, d = packed.shape
    need(weight.dim() == 2, op, f"weight must be [V, d], got shape {tuple(weight.shape)}")
    need(weight.shape[1] == d, op, f"packed has d={d} but weight has d={weight.shape[1]}")
    need(packed.dtype in floats, op, f"packed dtype {packed.dtype} must be one of {float_names(floats)}")
    need(weight.dtype == packed.dtype, op, f"weight dtype {weight.dtype} must equal packed dtype {packed.dtype}")
    for name, t in (("packed_ids", packed_ids), ("ids", ids)):
        need(
            t.dtype == torch.int32 and tuple(t.shape) == (R, W),
            op,
            f"{name} must be int32 [R={R}, W={W}], got {t.dtype} {tuple(t.shape)}",
        )
    need(
        cnt.dtype == torch.int32 and tuple(cnt.shape) == (R,),
        op,
        f"cnt must be int32 [R={R}], got {cnt.dtype} {tuple(cnt.shape)}",
    )
    need(
        rows.dim() == 1 and rows.dtype == torch.int64,
        op,
        f"rows must be int64 [B], got {rows.dtype} {tuple(rows.shape)}",
    )
    one_device(op, packed, packed_ids, weight, ids, cnt, rows)
    # written in place, or too big to copy: the compiled op takes their data pointers
    for name, t in (("packed", packed), ("packed_ids", packed_ids), ("weight", weight)):
        need(t.is_contiguous(), op, f"{name} must be contiguous")
    if readable(packed):
        check_rows(op, rows, R)
    if packed.device.type != "cpu" or rows.numel() == 0:  # the table's values: on the CPU only, as the C++ op
        return
    V = weight.shape[0]
    c = cnt[rows].long()[:, None]
    need(bool(((c >= 1) & (c <= W)).all()), op, f"cnt[rows] must be in [1, W={W}]")
    col = torch.arange(W)[None, :]
    new, live = ids[rows], col < c
    need(bool(((new >= 0) & (new < V) | ~live).all()), op, f"ids[rows, :cnt] must be in [0, V={V})")
    need(bool(((new[:, 1:] > new[:, :-1]) | ~live[:, 1:]).all()), op, "ids[rows, :cnt] must be strictly ascending")
    old = packed_ids[rows]
    need(bool((old < V).all()), op, f"packed_ids[rows] must be in [-1, V={V})")
    need(
        torch.equal(old >= 0, col < (old >= 0).sum(1, keepdim=True)) and bool((old >= -1).all()),
        op,
        "packed_ids[rows] must be live ids >= 0 followed by -1 (a fresh row is all -1)",
    )


# --- torch reference -------------------------------------------------------------------------------------


# Each slot keeps its set's LM-head rows in packed[s, :cnt[s]] with their ids in packed_ids[s];
# an update copies only the rows of ids that entered the set. Table rows are sorted, so the packed
# layout uses stable slots instead: survivors keep theirs, entering ids and survivors past the new
# count fill the vacated ones (rules in reference_pack_update's docstring; tests/literal.py states them per row).

_PAST = torch.iinfo(torch.int64).max  # search key of dead entries: after every id, so rows stay sorted


def reference_pack_update(
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


@fake("pack_update")
def _fake_pack_update(packed, packed_ids, weight, ids, cnt, rows):
    return None


register("pack_update", reference_pack_update, check=check_pack_update)


def pack_update(packed, packed_ids, weight, ids, cnt, rows, *, backend: str = "auto"):
    """Copy the rows that entered each listed slot's set into its packed buffer (see ``reference_pack_update``)."""
    implementation(backend, ids.device, "pack_update")(packed, packed_ids, weight, ids, cnt, rows)

"""Torch reference of the head ops: the one definition every faster backend is tested against."""

from __future__ import annotations

import torch

# bf16/fp16/fp32 are the kernels' contract; fp64 is accepted here for exact CPU oracles.
_FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def _check(hidden, weight, ids, cnt, row_to_slot) -> None:
    def need(ok: bool, msg: str) -> None:
        if not ok:
            raise ValueError(f"indexed_logits: {msg}")

    need(hidden.dim() == 2, f"hidden must be [M, d], got shape {tuple(hidden.shape)}")
    need(weight.dim() == 2, f"weight must be [V, d], got shape {tuple(weight.shape)}")
    need(hidden.shape[1] == weight.shape[1], f"hidden has d={hidden.shape[1]} but weight has d={weight.shape[1]}")
    need(hidden.dtype in _FLOATS, f"hidden dtype {hidden.dtype} must be one of bf16, fp16, fp32, fp64")
    need(weight.dtype == hidden.dtype, f"weight dtype {weight.dtype} must equal hidden dtype {hidden.dtype}")
    need(ids.dim() == 2 and ids.dtype == torch.int32, f"ids must be int32 [R, W], got {ids.dtype} {tuple(ids.shape)}")
    need(
        cnt.dim() == 1 and cnt.dtype == torch.int32 and cnt.shape[0] == ids.shape[0],
        f"cnt must be int32 [R={ids.shape[0]}], got {cnt.dtype} {tuple(cnt.shape)}",
    )
    need(
        row_to_slot.dim() == 1 and row_to_slot.dtype == torch.int32 and row_to_slot.shape[0] == hidden.shape[0],
        f"row_to_slot must be int32 [M={hidden.shape[0]}], got {row_to_slot.dtype} {tuple(row_to_slot.shape)}",
    )
    devices = {t.device for t in (hidden, weight, ids, cnt, row_to_slot)}
    need(len(devices) == 1, f"all tensors must be on one device, got {sorted(map(str, devices))}")
    if hidden.device.type == "cpu":  # value checks cost a sync on a GPU, nothing here
        need(bool(((cnt >= 1) & (cnt <= ids.shape[1])).all()), f"cnt must be in [1, W={ids.shape[1]}]")
        need(bool(((ids >= 0) & (ids < weight.shape[0])).all()), f"ids must be in [0, V={weight.shape[0]})")
        need(
            bool(((row_to_slot >= 0) & (row_to_slot < ids.shape[0])).all()),
            f"row_to_slot must be in [0, R={ids.shape[0]})",
        )


def indexed_logits(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    ids: torch.Tensor,
    cnt: torch.Tensor,
    row_to_slot: torch.Tensor,
) -> torch.Tensor:
    """Compact logits: ``out[m, j] = dot(weight[ids[s, j]], hidden[m])`` for ``j < cnt[s]``, else -inf.

    ``s = row_to_slot[m]``. Shapes: hidden ``[M, d]``, weight ``[V, d]`` (same float dtype),
    ids ``[R, W]`` int32, cnt ``[R]`` int32, row_to_slot ``[M]`` int32. Returns fp32 ``[M, W]``
    with products and sums in fp32 (in fp64 for fp64 inputs, then rounded to fp32).
    """
    _check(hidden, weight, ids, cnt, row_to_slot)
    acc = torch.float64 if hidden.dtype == torch.float64 else torch.float32
    slot = row_to_slot.long()
    rows = weight[ids.long().index_select(0, slot)].to(acc)  # [M, W, d]
    out = torch.einsum("mwd,md->mw", rows, hidden.to(acc)).float()
    dead = torch.arange(ids.shape[1], device=ids.device)[None, :] >= cnt.long().index_select(0, slot)[:, None]
    return out.masked_fill_(dead, float("-inf"))


def compact_topk(
    logits: torch.Tensor, ids: torch.Tensor, row_to_slot: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k of compact logits ``[M, W]`` as (values ``[M, k]``, token ids int64 ``[M, k]``).

    Values descend; equal values keep column order (the lower column first). A column past
    ``cnt`` (value -inf, only when k > cnt) maps to that slot's padding id.
    """
    if not 1 <= k <= logits.shape[1]:
        raise ValueError(f"compact_topk: k = {k} must be in [1, W={logits.shape[1]}]")
    values, cols = torch.sort(logits, dim=1, descending=True, stable=True)
    values, cols = values[:, :k], cols[:, :k]
    tokens = ids.long().index_select(0, row_to_slot.long()).gather(1, cols)
    return values, tokens

"""Torch-only pieces of the compact draft head under SGLang's layout: vocabulary shards, row maps and top-k.

- layout: ``vocab_shard`` (the head rows a TP rank owns, as SGLang's ``ParallelLMHead``),
  ``head_row_map`` (target id -> local head row: a d2t draft and/or a shard), ``row_slots``
  (the request slot of each request-major row);
- top-k: ``local_topk`` per rank, ``merge_topk`` across ranks (one all-gather), ``sharded_topk``
  both; the merged result equals the one-process top-k (values, columns, tie order).

Tie rule everywhere: value descending, then column ascending (``order_keys``); ``-inf`` entries (k
above a row's live columns) come last, and the head reads them as its fallback id. No SGLang import,
no host sync. The head itself (scoring, the column -> token map) is ``sglang_specvocab.head``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

NEG_INF = float("-inf")
DEFAULT_VOCAB_PADDING_SIZE = 64  # sglang.srt.layers.vocab_parallel_embedding


# --- layout and maps --------------------------------------------------------------------------------


def _pad(n: int, to: int) -> int:
    return (n + to - 1) // to * to


def vocab_shard(
    vocab_size: int, tp_size: int, tp_rank: int, padding_size: int = DEFAULT_VOCAB_PADDING_SIZE
) -> tuple[int, int]:
    """Head rows ``[start, end)`` (global ids) that rank ``tp_rank`` owns, as SGLang's ``ParallelLMHead``.

    The vocabulary is padded to a multiple of ``padding_size`` (times ``tp_size`` when the padded
    size does not divide by it), split evenly, and the padding removed; the local weight row of
    id ``i`` is ``i - start``. No LoRA-added vocabulary.
    """
    if tp_size < 1 or not 0 <= tp_rank < tp_size:
        raise ValueError(f"vocab_shard: tp_rank = {tp_rank} must be in [0, tp_size = {tp_size})")
    if _pad(vocab_size, padding_size) % tp_size:
        padding_size *= tp_size
    per = _pad(vocab_size, padding_size) // tp_size
    return min(tp_rank * per, vocab_size), min((tp_rank + 1) * per, vocab_size)


def head_row_map(
    target_vocab_size: int,
    *,
    hot_token_id: torch.Tensor | None = None,
    shard: tuple[int, int] | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor | None:
    """int32 ``[target_vocab_size]``: the local head row of each target id, -1 where this rank has none.

    ``hot_token_id[j]`` is the target id of draft row j (a d2t draft; None for a full-vocabulary
    head), ``shard = (start, end)`` the draft rows this rank holds (None: all). Returns None for
    the identity (full vocabulary, one rank), where table ids are head rows directly.
    """
    if hot_token_id is None and shard is None:
        return None
    if hot_token_id is None:
        draft = torch.arange(target_vocab_size, device=device)
    else:
        hot = hot_token_id.to(device=device, dtype=torch.long).flatten()
        if hot.numel() and (int(hot.min()) < 0 or int(hot.max()) >= target_vocab_size):
            raise ValueError(f"head_row_map: hot_token_id must hold target ids in [0, {target_vocab_size})")
        if hot.unique().numel() != hot.numel():
            raise ValueError("head_row_map: hot_token_id must hold distinct target ids")
        draft = torch.full((target_vocab_size,), -1, dtype=torch.long, device=device)
        draft[hot] = torch.arange(hot.numel(), device=device)
    if shard is not None:
        start, end = shard
        draft = torch.where((draft >= start) & (draft < end), draft - start, -1)
    return draft.to(torch.int32)


def row_slots(req_pool_indices: torch.Tensor, num_rows: int) -> torch.Tensor:
    """int32 ``[num_rows]``: the request slot of each request-major row (``num_rows // bs`` per request)."""
    bs = req_pool_indices.shape[0]
    if num_rows == 0:
        return req_pool_indices.new_zeros(0, dtype=torch.int32)
    if bs == 0 or num_rows % bs:
        raise ValueError(
            f"dynvocab logits: {num_rows} rows do not split evenly over {bs} requests (rows must be request-major)"
        )
    # contiguous before the flat view: two ops at every bs (a reshape of the expand copies, then casts), and never a
    # stride-0 view (for one request), which the C++ op's CPU value check would read as if dense
    return req_pool_indices.view(bs, 1).to(torch.int32).expand(bs, num_rows // bs).contiguous().view(-1)


# --- top-k: local, merged across ranks --------------------------------------------------------------


def order_keys(logits: torch.Tensor) -> torch.Tensor:
    """int64 ``[N, W]`` keys whose descending order is the tie rule: value descending, then column ascending.

    The high 32 bits are the fp32 value as an order-preserving integer (``-0.0`` counts as ``+0.0``, as the floats
    compare), the low 32 bits ``W - 1 - column``. Keys are distinct, so ``topk`` over them has one answer.
    """
    bits = (logits.float() + 0.0).view(torch.int32)  # + 0.0 turns -0.0 into +0.0
    mono = torch.where(bits < 0, torch.bitwise_xor(bits, 0x7FFFFFFF), bits).long()
    W = logits.shape[1]
    return mono * 4294967296 + (W - 1 - torch.arange(W, device=logits.device))


def local_topk(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(values fp32 ``[N, k]``, columns int64 ``[N, k]``, logsumexp fp32 ``[N]``) of ``[N, W]`` logits.

    Exact order: value descending, then column ascending (``torch.max`` returns the first maximum; for k > 1 a
    ``topk`` over ``order_keys``, which reads the logits once more than a plain ``topk`` but never depends on how
    a backend breaks ties).
    """
    if not 1 <= k <= logits.shape[1]:
        raise ValueError(f"local_topk: k = {k} must be in [1, W = {logits.shape[1]}]")
    logits = logits.float()
    if k == 1:
        values, cols = logits.max(dim=1, keepdim=True)
    else:
        top = order_keys(logits).topk(k, dim=1).values
        cols = (logits.shape[1] - 1) - torch.bitwise_and(top, 0xFFFFFFFF)
        values = logits.gather(1, cols)
    return values, cols, torch.logsumexp(logits, dim=1)


def column_tokens(col_ids: torch.Tensor | None, rows: torch.Tensor | None, cols: torch.Tensor) -> torch.Tensor:
    """int64 target ids of columns ``cols [N, k]`` through a head's column map: the column itself (``col_ids`` None),
    ``col_ids[c]`` (``[W]``, one map for all rows) or ``col_ids[rows[m // (N // bs)], c]`` (``[R, W]``, a map row
    per request, request-major logits rows; a map row outside ``[0, R)``, a bad request slot, maps every column to
    -1, no token)."""
    cols = cols.long()
    if col_ids is None:
        return cols
    if col_ids.dim() == 1:
        return col_ids.long()[cols]
    R, width = col_ids.shape
    N, bs = cols.shape[0], rows.shape[0]
    if N and (bs == 0 or N % bs):
        row_slots(rows, N)  # its error: rows do not split evenly
    # int64 throughout: a wild slot must not wrap into the map's range (row_slots' int32 would)
    col_row = rows.long().view(-1, 1).expand(bs, N // bs if bs else 0).reshape(-1)
    safe = col_row.clamp(0, max(R - 1, 0))
    tokens = col_ids.reshape(-1)[safe[:, None] * width + cols].long()
    return tokens.masked_fill_((safe != col_row)[:, None], -1)


def _world(group: Any) -> int:
    if group is not None and hasattr(group, "all_gather_into_tensor") and hasattr(group, "world_size"):
        return int(group.world_size)  # an SGLang GroupCoordinator
    return dist.get_world_size(group) if dist.is_initialized() else 1


def _all_gather(out: torch.Tensor, inp: torch.Tensor, group: Any) -> None:
    if group is not None and hasattr(group, "all_gather_into_tensor") and hasattr(group, "world_size"):
        group.all_gather_into_tensor(out, inp)
    else:
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in torch 2.13
        gather(out, inp, group=group)


def merge_topk(
    values: torch.Tensor,
    cols: torch.Tensor,
    lse: torch.Tensor,
    k: int,
    group: Any = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Merge every rank's local top-k into the global one, identical on every rank.

    One all-gather of ``[tp, N, 2k+1]`` fp32 (values, columns, local logsumexp; columns are
    exact in fp32 below 2**24). Order: value descending, column ascending. ``group``: a
    ``torch.distributed`` process group (None: the default group) or an SGLang
    ``GroupCoordinator``. Returns (values ``[N, k]``, columns ``[N, k]``, global logsumexp ``[N]``); a ``-inf``
    entry's column is any dead one (a rank's local top-k may list another rank's column as ``-inf``).
    """
    tp = _world(group)
    N = values.shape[0]
    if tp > 1 and N > 0:
        packed = torch.cat([values.float(), cols.float(), lse.float()[:, None]], dim=1).contiguous()
        gathered = torch.empty((tp * N, 2 * k + 1), dtype=packed.dtype, device=packed.device)
        _all_gather(gathered, packed, group)
        gathered = gathered.view(tp, N, 2 * k + 1)
        v = gathered[:, :, :k].permute(1, 0, 2).reshape(N, tp * k)
        c = gathered[:, :, k : 2 * k].permute(1, 0, 2).reshape(N, tp * k).long()
        lse = torch.logsumexp(gathered[:, :, 2 * k], dim=0)
        # Two stable sorts: by column, then by value: equal values stay in column order.
        c, order = torch.sort(c, dim=1, stable=True)
        v, order = torch.sort(v.gather(1, order), dim=1, descending=True, stable=True)
        values, cols = v[:, :k], c.gather(1, order)[:, :k]
    return values, cols, lse


def sharded_topk(
    local_logits: torch.Tensor, k: int, group: Any = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top-k of logits sharded by column ownership across ranks (``-inf`` where not owned):
    local top-k, then ``merge_topk``. Equals the one-process top-k of the full logits."""
    values, cols, lse = local_topk(local_logits, k)
    return merge_topk(values, cols, lse, k, group)


__all__ = [
    "column_tokens",
    "head_row_map",
    "local_topk",
    "merge_topk",
    "order_keys",
    "row_slots",
    "sharded_topk",
    "vocab_shard",
]

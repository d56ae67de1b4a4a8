"""``compact_topk``: the draft head's top-k through its column map, with the logsumexp, in one op
(csrc/compact_topk.cpp, csrc/compact_topk_kernel.cu): its argument check, torch reference, fake kernel and public
entry.
"""

from __future__ import annotations

import torch

from ._backend import implementation, register
from ._ext import fake
from .checks import need, one_device
from .topk import column_tokens, local_topk

TOPK_MAX_K = 16  # compact_topk's largest k (csrc/compact_topk_row.h kTopkMaxK)


# --- argument check --------------------------------------------------------------------------------------


def check_compact_topk(logits, col_ids, rows, k: int, fallback_id: int, mode: int) -> None:
    op = "compact_topk"
    need(
        logits.dim() == 2 and logits.dtype == torch.float32,
        op,
        f"logits must be float32 [N, W], got {logits.dtype} {tuple(logits.shape)}",
    )
    N, W = logits.shape
    need(1 <= W < 2**31 - 1, op, f"logits must have 1 to 2^31 - 2 columns, got W={W}")
    need(1 <= k <= min(TOPK_MAX_K, W), op, f"k = {k} must be in [1, min({TOPK_MAX_K}, W={W})]")
    need(mode in (0, 1, 2), op, f"mode = {mode} must be 0 (values), 1 (log-probabilities) or 2 (probabilities)")
    if col_ids is None:
        return
    need(col_ids.dtype in (torch.int32, torch.int64), op, f"col_ids must be int32 or int64, got {col_ids.dtype}")
    one_device(op, logits, col_ids)
    need(
        col_ids.dim() in (1, 2) and col_ids.shape[-1] == W,
        op,
        f"col_ids must be [W={W}] or [R, W={W}], got {tuple(col_ids.shape)}",
    )
    if col_ids.dim() == 1:
        return
    need(rows is not None, op, "a 2-D col_ids [R, W] needs rows (each request's map row)")
    need(
        rows.dim() == 1 and rows.dtype in (torch.int32, torch.int64),
        op,
        f"rows must be int32 or int64 [bs], got {rows.dtype} {tuple(rows.shape)}",
    )
    one_device(op, logits, rows)
    bs = rows.shape[0]
    need(
        N == 0 or (bs > 0 and N % bs == 0),
        op,
        f"{N} logits rows do not split evenly over {bs} requests (rows must be request-major)",
    )


# --- torch reference -------------------------------------------------------------------------------------


def reference_compact_topk(
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
    ``rows [bs]`` the map row of each request's ``N // bs`` request-major rows; a row outside ``[0, R)``, a bad
    request slot, gives no token); an entry of value ``-inf`` (k above the row's live columns), of a negative id or
    of no token is ``fallback_id``. ``lse``: the row's logsumexp. Values: the raw
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


@fake("compact_topk")
def _fake_compact_topk(logits, col_ids, rows, k, fallback_id, mode):
    N = logits.shape[0]
    return logits.new_empty((N, k)), logits.new_empty((N, k), dtype=torch.int64), logits.new_empty((N,))


register("compact_topk", reference_compact_topk, check=check_compact_topk)


def compact_topk(logits, col_ids, rows, k: int, *, fallback_id: int, mode: int, backend: str = "auto"):
    """The draft head's top-k through its column map, with the logsumexp (see ``reference_compact_topk``)."""
    return implementation(backend, logits.device, "compact_topk")(logits, col_ids, rows, k, fallback_id, mode)

"""One argument check per op, shared by the Python backends (the torch reference and Triton).

Each ``check_<op>`` raises ``ValueError("<op>: ...")`` naming the argument, what it must be and
what it got. Shapes, dtypes and devices are always checked. Values, where reading them costs no
device sync (CPU tensors), or under the debug setting below:

- ``rows`` of the in-place updates (``window_update``, ``window_verify``, ``pack_update``): in
  range and distinct. The GPU kernels trust them (one block per listed row: a row listed twice is
  a data race whose result for that row is unspecified, a row out of range an out-of-bounds access);
  SGLang's ``req_pool_indices`` are distinct and in range by construction.
- the table entries the logits ops read (slots, counts, ids): never refused by default. Every
  backend reads a bad entry the same way, as ``-inf`` logits, and counts it (``table.head_reads``,
  ``ops.bad_entries``); under the debug setting every backend refuses the first one instead
  (``check_table_entries``: the op, the hidden row, the bad value).

Debug setting: ``SGLANG_DYNVOCAB_DEBUG_CHECKS=1`` (also ``true``/``yes``/``on``), read once when this
module is imported (the C++ ops read the same variable once when the extension loads); it adds host
reads, so a sync per call on a GPU: for debugging, never for serving. ``ops.set_debug_checks``
switches both at run time (tests).

The compiled extension keeps its own ``TORCH_CHECK``s with the same rules (``csrc/``);
``tests/test_op_checks.py`` shows every backend refuses the same bad inputs. ``floats`` is the
backend's float dtypes: the reference also takes fp64 (exact CPU oracles), the kernels bf16, fp16
and fp32.
"""

from __future__ import annotations

import os

import torch

from ..table import head_reads

DEBUG_ENV = "SGLANG_DYNVOCAB_DEBUG_CHECKS"


def _env_flag(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


_debug = _env_flag(os.environ.get(DEBUG_ENV))  # read once (see the module doc)


def debug_checks() -> bool:
    """Whether the debug setting is on (``SGLANG_DYNVOCAB_DEBUG_CHECKS``, or ``ops.set_debug_checks``)."""
    return _debug


def _set_debug(on: bool) -> None:  # ops.set_debug_checks sets this and the extension's flag together
    global _debug
    _debug = bool(on)


def _readable(t: torch.Tensor) -> bool:
    """Whether values are checked: on the CPU (free), or anywhere but meta under the debug setting."""
    return t.device.type == "cpu" or (_debug and t.device.type != "meta")


KERNEL_FLOATS = (torch.bfloat16, torch.float16, torch.float32)
REFERENCE_FLOATS = (*KERNEL_FLOATS, torch.float64)
_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64"}


def _need(ok: bool, op: str, msg: str) -> None:
    if not ok:
        raise ValueError(f"{op}: {msg}")


def _one_device(op: str, *tensors: torch.Tensor) -> None:
    devices = {t.device for t in tensors}
    _need(len(devices) == 1, op, f"all tensors must be on one device, got {sorted(map(str, devices))}")


def _floats(floats) -> str:
    return ", ".join(_NAMES[f] for f in floats)


def _check_counter(op: str, bad, device: torch.device) -> None:
    if bad is None:
        return
    _need(
        bad.dtype == torch.int64 and bad.numel() == 1 and bad.is_contiguous(),
        op,
        f"bad must be an int64 counter of one element, got {bad.dtype} {tuple(bad.shape)}",
    )
    _need(bad.device == device, op, f"all tensors must be on one device, got {sorted(map(str, {bad.device, device}))}")


def check_rows(op: str, rows: torch.Tensor, R: int) -> None:
    """``rows`` (read on the host) in ``[0, R)`` and distinct: the first bad one, by position, is named."""
    seen: dict[int, int] = {}
    for b, r in enumerate(rows.tolist()):
        _need(0 <= r < R, op, f"rows must be in [0, R={R}), got rows[{b}] = {r}")
        _need(r not in seen, op, f"rows must be distinct, got {r} twice (rows[{seen.get(r)}] and rows[{b}])")
        seen[r] = b


def check_table_entries(op: str, ids, cnt, row_to_slot, W: int, V: int, *, rows: int | None = None) -> None:
    """The debug setting's check of the entries a logits call reads (``table.head_reads``; ``rows``: the hidden
    rows, each slot covering ``rows // len(row_to_slot)``): the first hidden row with a bad one, and in that row its
    slot, then its count, then its first bad column, named with the value."""
    R = cnt.shape[0]
    reads = head_reads(ids, cnt, row_to_slot, W, V, rows=rows)
    row_bad, id_bad = reads.row_bad, reads.id_bad
    bad = (row_bad if id_bad is None else row_bad | id_bad.any(1)).nonzero()
    if bad.numel() == 0:
        return
    m = int(bad[0, 0])
    b = m // ((rows or row_to_slot.shape[0]) // row_to_slot.shape[0])
    s = int(row_to_slot[b])
    _need(0 <= s < R, op, f"row_to_slot must be in [0, R={R}), got row_to_slot[{b}] = {s}")
    c = int(cnt[s])
    _need(1 <= c <= W, op, f"cnt must be in [1, W={W}], got cnt[{s}] = {c} (the slot of hidden row {m})")
    j = int(id_bad[m].nonzero()[0, 0])
    _need(
        False,
        op,
        f"ids must be below V={V} (a negative id is a dead column), got ids[{s}, {j}] = {int(ids[s, j])} "
        f"(a live column of hidden row {m})",
    )


def _check_logits(op, hidden, rows, name, cnt, row_to_slot, R, W, floats) -> None:
    """What the two logits ops share; ``rows`` holds the candidate rows (``weight`` or ``packed``)."""
    _need(hidden.dim() == 2, op, f"hidden must be [M, d], got shape {tuple(hidden.shape)}")
    _need(hidden.shape[1] == rows.shape[-1], op, f"hidden has d={hidden.shape[1]} but {name} has d={rows.shape[-1]}")
    _need(hidden.dtype in floats, op, f"hidden dtype {hidden.dtype} must be one of {_floats(floats)}")
    _need(rows.dtype == hidden.dtype, op, f"{name} dtype {rows.dtype} must equal hidden dtype {hidden.dtype}")
    _need(
        cnt.dim() == 1 and cnt.dtype == torch.int32 and cnt.shape[0] == R,
        op,
        f"cnt must be int32 [R={R}], got {cnt.dtype} {tuple(cnt.shape)}",
    )
    M, B = hidden.shape[0], row_to_slot.shape[0] if row_to_slot.dim() == 1 else -1
    _need(
        row_to_slot.dim() == 1
        and row_to_slot.dtype in (torch.int32, torch.int64)
        and (B == M or (B > 0 and M % B == 0) or (M == 0 and B >= 0)),
        op,
        f"row_to_slot must be int32 or int64 [B] with B dividing M={M} (a slot per hidden row, or per request of "
        f"M // B request-major rows), got {row_to_slot.dtype} {tuple(row_to_slot.shape)}",
    )
    _one_device(op, hidden, rows, cnt, row_to_slot)


def check_indexed_logits(
    hidden, weight, ids, cnt, row_to_slot, bad=None, row_map=None, *, floats=KERNEL_FLOATS
) -> None:
    op = "indexed_logits"
    _need(weight.dim() == 2, op, f"weight must be [V, d], got shape {tuple(weight.shape)}")
    _need(
        ids.dim() == 2 and ids.dtype == torch.int32, op, f"ids must be int32 [R, W], got {ids.dtype} {tuple(ids.shape)}"
    )
    _one_device(op, ids, weight)
    _check_logits(op, hidden, weight, "weight", cnt, row_to_slot, ids.shape[0], ids.shape[1], floats)
    _check_counter(op, bad, hidden.device)
    if row_map is not None:
        _need(
            row_map.dim() == 1 and row_map.dtype == torch.int32,
            op,
            f"row_map must be int32 [L] (ids to head rows, -1: no row), got {row_map.dtype} {tuple(row_map.shape)}",
        )
        _one_device(op, row_map, hidden)
    if _debug and _readable(hidden):
        V = weight.shape[0] if row_map is None else row_map.shape[0]  # a mapped table's ids index the map
        check_table_entries(op, ids, cnt, row_to_slot, ids.shape[1], V, rows=hidden.shape[0])


def check_packed_logits(hidden, packed, cnt, row_to_slot, bad=None, *, floats=KERNEL_FLOATS) -> None:
    op = "packed_logits"
    _need(packed.dim() == 3, op, f"packed must be [R, W, d], got shape {tuple(packed.shape)}")
    _check_logits(op, hidden, packed, "packed", cnt, row_to_slot, packed.shape[0], packed.shape[1], floats)
    _check_counter(op, bad, hidden.device)
    if _debug and _readable(hidden):
        check_table_entries(op, None, cnt, row_to_slot, packed.shape[1], 0, rows=hidden.shape[0])


def check_window_update(ring, length, ids, cnt, rows, block, fallback_id: int, vocab_size: int) -> None:
    op = "window_update"
    _need(
        ids.dim() == 2 and ids.dtype == torch.int32,
        op,
        f"ids must be int32 [R, capacity], got {ids.dtype} {tuple(ids.shape)}",
    )
    R, cap = ids.shape
    _need(
        cnt.dim() == 1 and cnt.dtype == torch.int32 and cnt.shape[0] == R,
        op,
        f"cnt must be int32 [R={R}], got {cnt.dtype} {tuple(cnt.shape)}",
    )
    _need(
        ring.dim() == 2 and ring.dtype == torch.int32 and ring.shape[0] == R and ring.shape[1] >= cap,
        op,
        f"ring must be int32 [R={R}, >= capacity={cap}], got {ring.dtype} {tuple(ring.shape)}",
    )
    _need(
        length.dim() == 1 and length.dtype == torch.int64 and length.shape[0] == R,
        op,
        f"length must be int64 [R={R}], got {length.dtype} {tuple(length.shape)}",
    )
    _need(
        rows.dim() == 1 and rows.dtype == torch.int64,
        op,
        f"rows must be int64 [B], got {rows.dtype} {tuple(rows.shape)}",
    )
    _need(
        block.dim() == 2 and block.dtype == torch.int32 and block.shape[0] == rows.shape[0],
        op,
        f"block must be int32 [B={rows.shape[0]}, n], got {block.dtype} {tuple(block.shape)}",
    )
    _need(1 <= vocab_size <= 2**31, op, f"vocab_size = {vocab_size} must be in [1, 2^31]")
    _need(
        0 <= fallback_id < vocab_size,
        op,
        f"fallback_id = {fallback_id} must be a token id in [0, vocab_size={vocab_size})",
    )
    _one_device(op, ring, length, ids, cnt, rows, block)
    if _readable(ids):
        check_rows(op, rows, R)


def check_pack_update(packed, packed_ids, weight, ids, cnt, rows, *, floats=KERNEL_FLOATS) -> None:
    op = "pack_update"
    _need(packed.dim() == 3, op, f"packed must be [R, W, d], got shape {tuple(packed.shape)}")
    R, W, d = packed.shape
    _need(weight.dim() == 2, op, f"weight must be [V, d], got shape {tuple(weight.shape)}")
    _need(weight.shape[1] == d, op, f"packed has d={d} but weight has d={weight.shape[1]}")
    _need(packed.dtype in floats, op, f"packed dtype {packed.dtype} must be one of {_floats(floats)}")
    _need(weight.dtype == packed.dtype, op, f"weight dtype {weight.dtype} must equal packed dtype {packed.dtype}")
    for name, t in (("packed_ids", packed_ids), ("ids", ids)):
        _need(
            t.dtype == torch.int32 and tuple(t.shape) == (R, W),
            op,
            f"{name} must be int32 [R={R}, W={W}], got {t.dtype} {tuple(t.shape)}",
        )
    _need(
        cnt.dtype == torch.int32 and tuple(cnt.shape) == (R,),
        op,
        f"cnt must be int32 [R={R}], got {cnt.dtype} {tuple(cnt.shape)}",
    )
    _need(
        rows.dim() == 1 and rows.dtype == torch.int64,
        op,
        f"rows must be int64 [B], got {rows.dtype} {tuple(rows.shape)}",
    )
    _one_device(op, packed, packed_ids, weight, ids, cnt, rows)
    if _readable(packed):
        check_rows(op, rows, R)
    if packed.device.type != "cpu" or rows.numel() == 0:  # the table's values: on the CPU only, as the C++ op
        return
    V = weight.shape[0]
    c = cnt[rows].long()[:, None]
    _need(bool(((c >= 1) & (c <= W)).all()), op, f"cnt[rows] must be in [1, W={W}]")
    col = torch.arange(W)[None, :]
    new, live = ids[rows], col < c
    _need(bool(((new >= 0) & (new < V) | ~live).all()), op, f"ids[rows, :cnt] must be in [0, V={V})")
    _need(bool(((new[:, 1:] > new[:, :-1]) | ~live[:, 1:]).all()), op, "ids[rows, :cnt] must be strictly ascending")
    old = packed_ids[rows]
    _need(bool((old < V).all()), op, f"packed_ids[rows] must be in [-1, V={V})")
    _need(
        torch.equal(old >= 0, col < (old >= 0).sum(1, keepdim=True)) and bool((old >= -1).all()),
        op,
        "packed_ids[rows] must be live ids >= 0 followed by -1 (a fresh row is all -1)",
    )


def check_window_verify(
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
    k: int,
    fallback_id: int,
    vocab_size: int,
) -> None:
    op = "window_verify"
    _need(ids.dim() == 2, op, f"ids must be int32 [R, capacity], got {ids.dtype} {tuple(ids.shape)}")
    R = ids.shape[0]
    _need(
        acc.dtype == torch.float64 and tuple(acc.shape) == (4, R),
        op,
        f"acc must be float64 [4, R={R}], got {acc.dtype} {tuple(acc.shape)}",
    )
    _need(
        rows.dim() == 1 and rows.dtype == torch.int64,
        op,
        f"rows must be int64 [B], got {rows.dtype} {tuple(rows.shape)}",
    )
    B = rows.shape[0]
    _need(
        accept_index.dim() == 2 and accept_index.shape[0] == B,
        op,
        f"accept_index must be [B={B}, S], got {tuple(accept_index.shape)}",
    )
    _need(
        accept_lens.dim() == 1 and accept_lens.shape[0] == B,
        op,
        f"accept_lens must be [B={B}], got {tuple(accept_lens.shape)}",
    )
    _need(
        B > 0 and draft_token.dim() == 1 and draft_token.numel() > 0 and draft_token.numel() % B == 0,
        op,
        f"draft_token must be [B * num_draft_tokens] with B={B} >= 1, got {tuple(draft_token.shape)}",
    )
    nd = draft_token.numel() // B
    _need(
        predict.dim() == 1 and predict.numel() == B * nd,
        op,
        f"predict must be [B * num_draft_tokens={B * nd}], got {tuple(predict.shape)}",
    )
    _need(
        topk_values.dim() == 2
        and topk_values.shape[0] == B * nd
        and topk_values.shape == topk_ids.shape
        and topk_ids.dtype == torch.int64
        and topk_values.is_floating_point(),
        op,
        f"topk_values (float) and topk_ids (int64) must both be [B * num_draft_tokens={B * nd}, kk], got "
        f"{topk_values.dtype} {tuple(topk_values.shape)} and {topk_ids.dtype} {tuple(topk_ids.shape)}",
    )
    for name, t in (
        ("draft_token", draft_token),
        ("accept_index", accept_index),
        ("accept_lens", accept_lens),
        ("predict", predict),
    ):
        _need(
            not t.is_floating_point() and t.dtype != torch.bool, op, f"{name} must be an integer tensor, got {t.dtype}"
        )
    _need(k >= 0, op, f"k = {k} must be >= 0")
    if hot is not None:
        _need(
            hot.dim() == 1 and hot.dtype == torch.bool,
            op,
            f"hot must be a bool [vocab] mask, got {hot.dtype} {tuple(hot.shape)}",
        )
    _one_device(
        op,
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
        *([hot] if hot is not None else []),
    )
    block = torch.empty((B, 0), dtype=torch.int32, device=ids.device)
    check_window_update(ring, length, ids, cnt, rows, block, fallback_id, vocab_size)


TOPK_MAX_K = 16  # compact_topk's largest k (csrc/compact_topk_row.h kTopkMaxK)


def check_compact_topk(logits, col_ids, rows, k: int, fallback_id: int, mode: int) -> None:
    op = "compact_topk"
    _need(
        logits.dim() == 2 and logits.dtype == torch.float32,
        op,
        f"logits must be float32 [N, W], got {logits.dtype} {tuple(logits.shape)}",
    )
    N, W = logits.shape
    _need(W >= 1, op, f"logits must have at least one column, got W={W}")
    _need(1 <= k <= min(TOPK_MAX_K, W), op, f"k = {k} must be in [1, min({TOPK_MAX_K}, W={W})]")
    _need(mode in (0, 1, 2), op, f"mode = {mode} must be 0 (values), 1 (log-probabilities) or 2 (probabilities)")
    if col_ids is None:
        return
    _need(col_ids.dtype in (torch.int32, torch.int64), op, f"col_ids must be int32 or int64, got {col_ids.dtype}")
    _one_device(op, logits, col_ids)
    _need(
        col_ids.dim() in (1, 2) and col_ids.shape[-1] == W,
        op,
        f"col_ids must be [W={W}] or [R, W={W}], got {tuple(col_ids.shape)}",
    )
    if col_ids.dim() == 1:
        return
    _need(rows is not None, op, "a 2-D col_ids [R, W] needs rows (each request's map row)")
    _need(
        rows.dim() == 1 and rows.dtype in (torch.int32, torch.int64),
        op,
        f"rows must be int32 or int64 [bs], got {rows.dtype} {tuple(rows.shape)}",
    )
    _one_device(op, logits, rows)
    bs = rows.shape[0]
    _need(
        N == 0 or (bs > 0 and N % bs == 0),
        op,
        f"{N} logits rows do not split evenly over {bs} requests (rows must be request-major)",
    )
    if rows.device.type == "cpu":
        R = col_ids.shape[0]
        _need(bool(((rows >= 0) & (rows < R)).all()), op, f"rows must be in [0, R={R})")

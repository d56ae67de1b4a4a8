"""What every op's argument check shares: the debug setting, the ``rows`` and table-entry checks, the helpers.

Each op's module holds its ``check_<op>``, shared by its Python backends (the torch reference and Triton),
which raises ``ValueError("<op>: ...")`` naming the argument, what it must be and what it got. Shapes,
dtypes and devices are always checked. Values, where reading them costs no device sync (CPU tensors), or
under the debug setting below:

- ``rows`` of the in-place updates (``window_update``, ``window_verify``, ``pack_update``): in
  range and distinct. The GPU kernels trust them (one block per listed row: a row listed twice is
  a data race whose result for that row is unspecified; a row out of range is skipped, never an
  out-of-bounds access; the window ops' torch reference skips it too, pack_update's (the lab's packed
  mode) does not);
  SGLang's ``req_pool_indices`` are distinct and in range by construction.
- the table entries the logits ops read (slots, counts, ids): never refused by default. Every
  backend reads a bad entry the same way, as ``-inf`` logits, and counts it (``table.head_reads``,
  ``ops.bad_entries``); under the debug setting every backend refuses the first one instead
  (``check_table_entries``: the op, the hidden row, the bad value).

Every value check is a function named ``check_*`` in ``ops/`` (``testing.graphs`` lets those, and only those,
read CPU tensors inside an emulated capture).

Debug setting: ``SGLANG_DYNVOCAB_DEBUG_CHECKS=1`` (also ``true``/``yes``/``on``), read once when this
module is imported (the C++ ops read the same variable once when the extension loads); it adds host
reads, so a sync per call on a GPU: for debugging, never for serving. ``ops.set_debug_checks``
switches both at run time (tests).

The compiled extension keeps its own ``TORCH_CHECK``s with the same rules (``csrc/``), for direct calls;
``ops.implementation`` runs the Python check before the compiled op too, so a caller of the package meets only
these ValueErrors and never a C++ exception (csrc/binding.cpp says why). ``tests/test_op_checks.py`` shows every
backend refuses the same bad inputs. ``floats`` (an argument of
the checks) is the backend's float dtypes: the reference also takes fp64 (exact CPU oracles), the kernels
bf16, fp16 and fp32.
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


def readable(t: torch.Tensor) -> bool:
    """Whether values are checked: on the CPU (free), or anywhere but meta under the debug setting."""
    return t.device.type == "cpu" or (_debug and t.device.type != "meta")


KERNEL_FLOATS = (torch.bfloat16, torch.float16, torch.float32)
REFERENCE_FLOATS = (*KERNEL_FLOATS, torch.float64)
_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64"}


def need(ok: bool, op: str, msg: str) -> None:
    if not ok:
        raise ValueError(f"{op}: {msg}")


def one_device(op: str, *tensors: torch.Tensor) -> None:
    devices = {t.device for t in tensors}
    need(len(devices) == 1, op, f"all tensors must be on one device, got {sorted(map(str, devices))}")


def float_names(floats) -> str:
    return ", ".join(_NAMES[f] for f in floats)


def check_counter(op: str, bad, device: torch.device) -> None:
    if bad is None:
        return
    need(
        bad.dtype == torch.int64 and bad.numel() == 1 and bad.is_contiguous(),
        op,
        f"bad must be an int64 counter of one element, got {bad.dtype} {tuple(bad.shape)}",
    )
    need(bad.device == device, op, f"all tensors must be on one device, got {sorted(map(str, {bad.device, device}))}")


def check_rows(op: str, rows: torch.Tensor, R: int) -> None:
    """``rows`` (read on the host) in ``[0, R)`` and distinct: the first bad one, by position, is named."""
    seen: dict[int, int] = {}
    for b, r in enumerate(rows.tolist()):
        need(0 <= r < R, op, f"rows must be in [0, R={R}), got rows[{b}] = {r}")
        need(r not in seen, op, f"rows must be distinct, got {r} twice (rows[{seen.get(r)}] and rows[{b}])")
        seen[r] = b


def check_table_entries(
    op: str, ids, cnt, row_to_slot, W: int, V: int, *, rows: int | None = None, slots: str = "row_to_slot"
) -> None:
    """The debug setting's check of the entries a logits call reads (``table.head_reads``; ``rows``: the hidden
    rows, each slot covering ``rows // len(row_to_slot)``): the first hidden row with a bad one, and in that row its
    slot, then its count, then its first bad column, named with the value. ``slots``: the caller's name of
    ``row_to_slot`` (the head's is ``rows``)."""
    R = cnt.shape[0]
    reads = head_reads(ids, cnt, row_to_slot, W, V, rows=rows)
    row_bad, id_bad = reads.row_bad, reads.id_bad
    bad = (row_bad if id_bad is None else row_bad | id_bad.any(1)).nonzero()
    if bad.numel() == 0:
        return
    m = int(bad[0, 0])
    b = m // ((rows or row_to_slot.shape[0]) // row_to_slot.shape[0])
    s = int(row_to_slot[b])
    need(0 <= s < R, op, f"{slots} must be in [0, R={R}), got {slots}[{b}] = {s}")
    c = int(cnt[s])
    need(1 <= c <= W, op, f"cnt must be in [1, W={W}], got cnt[{s}] = {c} (the slot of hidden row {m})")
    j = int(id_bad[m].nonzero()[0, 0])
    need(
        False,
        op,
        f"ids must be below V={V} (a negative id is a dead column), got ids[{s}, {j}] = {int(ids[s, j])} "
        f"(a live column of hidden row {m})",
    )

"""Python face of the ops: one entry per op, a backend chosen per call site.

Backends (the ``head.kernel`` key of a config):
- ``cuda``: the compiled extension, ``torch.ops.specvocab.*`` (csrc/): its CUDA kernels on GPU
  tensors, its C++ kernels on CPU tensors;
- ``triton``: Triton kernels (GPU tensors; CPU tensors only under ``TRITON_INTERPRET=1``);
  they exist for the two logits ops, the updates use the extension or torch;
- ``torch``: the reference in ``reference.py``, the definition every other backend is tested
  against;
- ``auto``: the extension's CUDA kernels on a GPU when built, else Triton on a GPU, else torch.

``resolve(backend, device, op)`` picks once (call sites keep the result: nothing to decide per
step); an explicit choice that cannot run raises ``BackendError`` saying why.

Bad table entries. The logits ops take an optional int64 counter ``bad`` (one element, on the
tensors' device): every backend reads an entry that breaks the table's contract (a slot outside
``[0, R)``, a count outside ``[1, W]``, an id ``>= V``) as ``-inf`` logits (``table.head_reads``) and
adds it to ``bad`` on the device, without a host sync. The kernels add nothing when ``bad`` is absent
and add with an atomic only on the bad path when it is given (no launch is added either way).
``implementation`` binds the logits ops to ``bad_entries(device)``, one counter per device that
telemetry reads (``integration/telemetry.py``), so every head built on them counts. Under the debug
setting ``SGLANG_DYNVOCAB_DEBUG_CHECKS=1`` (``checks``; ``set_debug_checks`` at run time) every
backend refuses such an entry with a ``ValueError`` naming the op, the hidden row and the value, and
the GPU backends also check the ``rows`` of the in-place updates on the host.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
from collections.abc import Callable

import torch

from ..config import KERNELS
from ..errors import SpecVocabError
from . import _ext, checks, reference

log = logging.getLogger(__name__)

_TRITON_OPS = ("indexed_logits", "packed_logits")
_COUNTED = ("indexed_logits", "packed_logits")  # the ops that read the table and count its bad entries
OPS = ("indexed_logits", "packed_logits", "window_update", "window_verify", "compact_topk", "pack_update")


class BackendError(SpecVocabError):
    """An explicitly chosen kernel backend cannot run here."""


@functools.cache
def _triton_importable() -> bool:
    return importlib.util.find_spec("triton") is not None


def _triton_runs_on(device: torch.device) -> bool:
    return _triton_importable() and (device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1")


@functools.cache
def _say_once(message: str) -> None:
    log.warning(message)


def available_backends(device: torch.device | str, op: str = "indexed_logits") -> list[str]:
    """The explicit backends that can run ``op`` on tensors of ``device``."""
    device = torch.device(device)
    out = []
    if _ext.available() and (device.type != "cuda" or _ext.has_cuda_kernels()):
        out.append("cuda")
    if op in _TRITON_OPS and _triton_runs_on(device):
        out.append("triton")
    out.append("torch")
    return out


def resolve(backend: str, device: torch.device | str, op: str) -> str:
    """The backend that runs ``op`` on ``device`` for a configured choice (see module doc)."""
    if backend not in KERNELS:
        raise BackendError(f"kernel backend {backend!r} is invalid: must be one of {', '.join(KERNELS)}")
    if op not in OPS:
        raise BackendError(f"unknown op {op!r}: must be one of {', '.join(OPS)}")
    device = torch.device(device)
    if backend == "auto":
        if device.type != "cuda":
            return "torch"
        if _ext.has_cuda_kernels():
            return "cuda"
        _say_once(
            "sglang-specvocab: CUDA kernels unavailable ("
            + (_ext.reason() or "the extension was built without nvcc")
            + "): using the Triton and torch backends only"
        )
        return "triton" if op in _TRITON_OPS and _triton_runs_on(device) else "torch"
    if backend == "cuda":
        if not _ext.available():
            raise BackendError(f"kernel backend 'cuda' is unavailable for {op}: {_ext.reason()}")
        if device.type == "cuda" and not _ext.has_cuda_kernels():
            raise BackendError(
                f"kernel backend 'cuda' is unavailable for {op} on {device}: the extension was built without "
                "nvcc (CPU kernels only); reinstall with a CUDA toolkit (CUDA_HOME) or choose 'triton' or 'torch'"
            )
    if backend == "triton":
        if op not in _TRITON_OPS:
            raise BackendError(f"kernel backend 'triton' has no {op}: choose 'auto', 'cuda' or 'torch'")
        if not _triton_importable():
            raise BackendError(f"kernel backend 'triton' is unavailable for {op}: triton is not installed")
        if not _triton_runs_on(device):
            raise BackendError(
                f"kernel backend 'triton' needs GPU tensors for {op}, got {device} (or set TRITON_INTERPRET=1)"
            )
    return backend


def update_backend(kernel: str) -> str:
    """The backend the set updates use for a configured ``head.kernel``: they have no Triton
    version, so a Triton head (or ``auto``) gets the extension's update where it runs, else torch."""
    return kernel if kernel in ("cuda", "torch") else "auto"


_BAD: dict[torch.device, torch.Tensor] = {}


def _device_key(device: torch.device | str) -> torch.device:
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def bad_entries(device: torch.device | str) -> torch.Tensor:
    """The int64 device scalar that the logits ops from ``implementation`` add their bad table entries to.

    Made once per device, when a call site resolves its op (before any CUDA-graph capture), and only added to
    in place, so captured calls count too; read it through the telemetry's host copy, not per step."""
    key = _device_key(device)
    counter = _BAD.get(key)
    if counter is None:
        counter = _BAD[key] = torch.zeros((), dtype=torch.int64, device=key)
    return counter


def set_debug_checks(on: bool) -> None:
    """Switch the debug setting (``SGLANG_DYNVOCAB_DEBUG_CHECKS``, see ``checks``) for every backend at once."""
    checks._set_debug(on)
    if _ext.available():
        torch.ops.specvocab.set_debug_checks(bool(on))


def implementation(backend: str, device: torch.device | str, op: str) -> Callable:
    """The function that runs ``op`` with ``resolve(backend, device, op)``; the logits ops count their bad
    table entries into ``bad_entries(device)`` (a caller may pass its own ``bad=`` instead)."""
    chosen = resolve(backend, device, op)
    if chosen == "cuda":
        fn = getattr(torch.ops.specvocab, op)
    elif chosen == "triton":
        from . import triton_ops  # optional: Triton may be absent

        fn = getattr(triton_ops, op)
    else:
        fn = getattr(reference, op)
    return functools.partial(fn, bad=bad_entries(device)) if op in _COUNTED else fn


def indexed_logits(
    hidden, weight, ids, cnt, row_to_slot, *, backend: str = "auto", bad=None, row_map=None
) -> torch.Tensor:
    """Compact logits ``[M, W]`` over each row's candidate set (see ``reference.indexed_logits``: ``row_to_slot``
    per hidden row or per request, ids through ``row_map``); bad table entries are counted into ``bad``, by default
    ``bad_entries(hidden.device)``."""
    fn = implementation(backend, hidden.device, "indexed_logits")
    return fn(hidden, weight, ids, cnt, row_to_slot, row_map=row_map, **({} if bad is None else {"bad": bad}))


def packed_logits(hidden, packed, cnt, row_to_slot, *, backend: str = "auto", bad=None) -> torch.Tensor:
    """Compact logits ``[M, W]`` over packed candidate rows (see ``reference.packed_logits``); ``bad`` as in
    ``indexed_logits``."""
    fn = implementation(backend, hidden.device, "packed_logits")
    return fn(hidden, packed, cnt, row_to_slot, **({} if bad is None else {"bad": bad}))


def window_update(ring, length, ids, cnt, rows, block, *, fallback_id: int, vocab_size: int, backend: str = "auto"):
    """MicroSpec's window append + publish, in place (see ``reference.window_update``)."""
    implementation(backend, ids.device, "window_update")(ring, length, ids, cnt, rows, block, fallback_id, vocab_size)


def window_verify(
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
    *,
    k: int,
    context: bool,
    compacted: bool,
    fallback_id: int,
    vocab_size: int,
    backend: str = "auto",
) -> torch.Tensor:
    """One verify round of the window policy, in place; returns the committed tokens (see ``reference.window_verify``)."""
    return implementation(backend, ids.device, "window_verify")(
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
        context,
        compacted,
        fallback_id,
        vocab_size,
    )


def compact_topk(logits, col_ids, rows, k: int, *, fallback_id: int, mode: int, backend: str = "auto"):
    """The draft head's top-k through its column map, with the logsumexp (see ``reference.compact_topk``)."""
    return implementation(backend, logits.device, "compact_topk")(logits, col_ids, rows, k, fallback_id, mode)


def pack_update(packed, packed_ids, weight, ids, cnt, rows, *, backend: str = "auto"):
    """Copy the rows that entered each listed slot's set into its packed buffer (see ``reference.pack_update``)."""
    implementation(backend, ids.device, "pack_update")(packed, packed_ids, weight, ids, cnt, rows)


__all__ = [
    "BackendError",
    "available_backends",
    "bad_entries",
    "compact_topk",
    "implementation",
    "indexed_logits",
    "pack_update",
    "packed_logits",
    "resolve",
    "set_debug_checks",
    "update_backend",
    "window_update",
    "window_verify",
]

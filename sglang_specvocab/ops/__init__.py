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
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
from collections.abc import Callable

import torch

from ..errors import SpecVocabError
from . import _ext, reference

log = logging.getLogger(__name__)

BACKENDS = ("auto", "cuda", "triton", "torch")
_TRITON_OPS = ("indexed_logits", "packed_logits")
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
    if backend not in BACKENDS:
        raise BackendError(f"kernel backend {backend!r} is invalid: must be one of {', '.join(BACKENDS)}")
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


def implementation(backend: str, device: torch.device | str, op: str) -> Callable:
    """The function that runs ``op`` with ``resolve(backend, device, op)``."""
    chosen = resolve(backend, device, op)
    if chosen == "cuda":
        return getattr(torch.ops.specvocab, op)
    if chosen == "triton":
        from . import triton_ops  # optional: Triton may be absent

        return getattr(triton_ops, op)
    return getattr(reference, op)


def indexed_logits(hidden, weight, ids, cnt, row_to_slot, *, backend: str = "auto") -> torch.Tensor:
    """Compact logits ``[M, W]`` over each row's candidate set (see ``reference.indexed_logits``)."""
    return implementation(backend, hidden.device, "indexed_logits")(hidden, weight, ids, cnt, row_to_slot)


def packed_logits(hidden, packed, cnt, row_to_slot, *, backend: str = "auto") -> torch.Tensor:
    """Compact logits ``[M, W]`` over packed candidate rows (see ``reference.packed_logits``)."""
    return implementation(backend, hidden.device, "packed_logits")(hidden, packed, cnt, row_to_slot)


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
    "BACKENDS",
    "BackendError",
    "available_backends",
    "compact_topk",
    "implementation",
    "indexed_logits",
    "pack_update",
    "packed_logits",
    "resolve",
    "update_backend",
    "window_update",
    "window_verify",
]

"""The choice of backend per op and call site, which every op's module uses: ``resolve``, ``implementation``,
the ops' table of backends (``register``), the bad-entry counters (``bad_entries``) and ``set_debug_checks``.

Each op's module registers its backends when it is imported (``ops/__init__.py`` imports them all):
its torch reference, its Triton wrapper if it has one, and how its compiled op is called (by default
``torch.ops.specvocab.<op>`` with the same arguments as the reference). See the package doc for the
backends and the bad entries.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
from collections.abc import Callable
from typing import NamedTuple

import torch

from ..config import KERNELS
from ..errors import SpecVocabError
from ._ext import available, has_cuda_kernels, reason
from .checks import _set_debug

log = logging.getLogger(__name__)


class BackendError(SpecVocabError):
    """An explicitly chosen kernel backend cannot run here."""


class _Backends(NamedTuple):
    reference: Callable
    triton: Callable | None
    cuda: Callable | None  # None: torch.ops.specvocab.<op>, called as the reference is
    counted: bool  # reads the table and counts its bad entries (the logits ops)
    check: Callable | None  # check_<op>, run before the compiled op (see implementation)


_OPS: dict[str, _Backends] = {}  # in import order: the order resolve's error lists them in


def register(
    op: str,
    reference: Callable,
    *,
    check: Callable,
    triton: Callable | None = None,
    cuda: Callable | None = None,
    counted: bool = False,
) -> None:
    """Declare ``op``'s backends (its module does, on import); ``check``: its ``check_<op>``, called with the op's
    arguments; ``counted``: ``implementation`` binds its ``bad`` argument to ``bad_entries(device)``."""
    _OPS[op] = _Backends(reference, triton, cuda, counted, check)


def _has_triton(op: str) -> bool:
    return op in _OPS and _OPS[op].triton is not None


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
    if available() and (device.type != "cuda" or has_cuda_kernels()):
        out.append("cuda")
    if _has_triton(op) and _triton_runs_on(device):
        out.append("triton")
    out.append("torch")
    return out


def resolve(backend: str, device: torch.device | str, op: str) -> str:
    """The backend that runs ``op`` on ``device`` for a configured choice (see the package doc)."""
    if backend not in KERNELS:
        raise BackendError(f"kernel backend {backend!r} is invalid: must be one of {', '.join(KERNELS)}")
    if op not in _OPS:
        raise BackendError(f"unknown op {op!r}: must be one of {', '.join(sorted(_OPS))}")
    device = torch.device(device)
    if backend == "auto":
        if device.type != "cuda":
            return "torch"
        if has_cuda_kernels():
            return "cuda"
        _say_once(
            "sglang-specvocab: CUDA kernels unavailable ("
            + (reason() or "the extension was built without nvcc")
            + "): using the Triton and torch backends only"
        )
        return "triton" if _has_triton(op) and _triton_runs_on(device) else "torch"
    if backend == "cuda":
        if not available():
            raise BackendError(f"kernel backend 'cuda' is unavailable for {op}: {reason()}")
        if device.type == "cuda" and not has_cuda_kernels():
            raise BackendError(
                f"kernel backend 'cuda' is unavailable for {op} on {device}: the extension was built without "
                "nvcc (CPU kernels only); reinstall with a CUDA toolkit (CUDA_HOME) or choose 'triton' or 'torch'"
            )
    if backend == "triton":
        if not _has_triton(op):
            raise BackendError(f"kernel backend 'triton' has no {op}: choose 'auto', 'cuda' or 'torch'")
        if not _triton_importable():
            raise BackendError(f"kernel backend 'triton' is unavailable for {op}: triton is not installed")
        if not _triton_runs_on(device):
            raise BackendError(
                f"kernel backend 'triton' needs GPU tensors for {op}, got {device} (or set TRITON_INTERPRET=1)"
            )
    return backend


def backend_without_triton(kernel: str) -> str:
    """The backend of an op with no Triton version (the window update and round, the top-k, the pack update) for a
    configured ``head.kernel``: a Triton head (or ``auto``) gets the extension's op where it runs, else torch."""
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
    _set_debug(on)
    if available():
        torch.ops.specvocab.set_debug_checks(bool(on))


def _checked(op: str, check: Callable, compiled: Callable) -> Callable:
    """``compiled`` after the op's Python check: every refusal a caller can meet is the check's ValueError, raised
    before the extension is entered. The extension keeps its own TORCH_CHECKs (for direct calls), but a C++
    exception leaving it crashed the whole process on the GPU machines (SIGSEGV, torch 2.11; see
    csrc/binding.cpp), so the serving path never relies on one."""

    def run(*args, **kwargs):
        check(*args, **kwargs)
        return compiled(*args, **kwargs)

    run.__name__ = run.__qualname__ = f"checked_{op}"
    run.__wrapped__ = compiled  # what runs once the check passed
    return run


def implementation(backend: str, device: torch.device | str, op: str) -> Callable:
    """The function that runs ``op`` with ``resolve(backend, device, op)``; the logits ops count their bad
    table entries into ``bad_entries(device)`` (a caller may pass its own ``bad=`` instead)."""
    chosen = resolve(backend, device, op)
    backends = _OPS[op]
    if chosen == "cuda":
        fn = _checked(op, backends.check, backends.cuda or getattr(torch.ops.specvocab, op))
    elif chosen == "triton":
        fn = backends.triton
    else:
        fn = backends.reference
    return functools.partial(fn, bad=bad_entries(device)) if backends.counted else fn

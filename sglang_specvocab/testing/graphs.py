"""CUDA-graph capture and replay, emulated on a CPU: what runs at a replay is the recorded tensor ops, never Python.

A CUDA graph records the kernels a function launches at capture, on fixed memory; a replay re-runs those kernels
on that memory. The Python around them (attribute writes, dict caches, ``if`` on shapes) ran once, at capture.
``capture(fn)`` runs ``fn`` once under a ``TorchDispatchMode`` that records every aten (or registered custom) op
with its tensors; ``Graph.replay()`` re-runs the recorded ops in order on the same tensor objects and writes each
result into the tensor the capture produced (a view or in-place result already is that memory). So after a replay
every tensor the graph wrote (its outputs, the static buffers it fills in place) holds this replay's values, and
every piece of Python state still holds what the *last capture* left in it: the situation of a server after
SGLang captured its batch-size buckets (largest first) and replays one of them.

A host sync inside a captured region (``.item()``, ``bool(t)``, ``.tolist()``) fails on a GPU: here it raises
``HostSyncInCapture`` at capture, except the ops' value checks (the ``check_*`` functions of ``ops/``), which read CPU
tensors only (the tensors here stand for device tensors, where those checks do not run). Inputs are static: write new
values into the tensors the captured function read (``copy_``), as SGLang's graph runners do, then ``replay()``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

__all__ = ["Graph", "HostSyncInCapture", "capture"]

_SYNCS = {torch.ops.aten._local_scalar_dense.default}
_OPS_DIR = os.path.join("sglang_specvocab", "ops")


def _in_cpu_only_check() -> bool:
    frame = sys._getframe(2)
    while frame is not None:
        code = frame.f_code
        if code.co_name.startswith("check_") and os.path.dirname(code.co_filename).endswith(_OPS_DIR):
            return True
        frame = frame.f_back
    return False


class HostSyncInCapture(RuntimeError):
    """A captured region read a tensor's value on the host (illegal under CUDA-graph capture)."""


class _Recorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[Any, tuple, dict, Any]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _SYNCS and not _in_cpu_only_check():
            raise HostSyncInCapture(f"host sync inside a captured region: {func}")
        out = func(*args, **kwargs)
        self.ops.append((func, args, kwargs, out))
        return out


class Graph:
    """The ops one capture recorded; ``replay()`` re-runs them on the captured tensors."""

    def __init__(self, ops: list[tuple[Any, tuple, dict, Any]]) -> None:
        self.ops = ops
        self.replays = 0

    def replay(self) -> None:
        for func, args, kwargs, out in self.ops:
            new = func(*args, **kwargs)
            for old, fresh in zip(_tensors(out), _tensors(new), strict=True):
                # In-place ops and views return the captured memory itself; anything else is copied into it.
                if old.untyped_storage().data_ptr() != fresh.untyped_storage().data_ptr() or (
                    old.storage_offset() != fresh.storage_offset()
                ):
                    old.copy_(fresh)
        self.replays += 1


def _tensors(x: Any) -> list[torch.Tensor]:
    return [t for t in tree_leaves(x) if isinstance(t, torch.Tensor)]


def capture(fn: Callable[[], Any]) -> tuple[Graph, Any]:
    """Run ``fn()`` once, recording its ops: ``(graph, what fn returned)`` (the tensors a replay refreshes)."""
    rec = _Recorder()
    with rec:
        result = fn()
    return Graph(rec.ops), result

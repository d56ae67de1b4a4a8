"""CUDA-graph capture and replay, emulated on a CPU: what runs at a replay is the recorded tensor ops, never Python.

A CUDA graph records the kernels a function launches at capture, on fixed memory; a replay re-runs those kernels
on that memory. The Python around them (attribute writes, dict caches, ``if`` on shapes) ran once, at capture.
``capture(fn)`` runs ``fn`` once under a ``TorchDispatchMode`` that records every aten (or registered custom) op
with its tensors; ``Graph.replay()`` re-runs the recorded ops in order on the same tensor objects and writes each
result into the tensor the capture produced (a view or in-place result already is that memory). So after a replay
every tensor the graph wrote (its outputs, the static buffers it fills in place) holds this replay's values, and
every piece of Python state still holds what the *last capture* left in it: the situation of a server after
SGLang captured its batch-size buckets (largest first) and replays one of them. Inputs are static: write new
values into the tensors the captured function read (``copy_``), as SGLang's graph runners do, then ``replay()``.

What a CUDA capture refuses, ``capture`` refuses too, raising ``HostSyncInCapture`` that names the Python call
(``torch.Tensor.tolist``, ``torch.where``, ...) and the aten op. The tensors here stand for device tensors (a
tensor made outside the capture, or by an op inside it), so a read of their values on the host is a device sync:

- an op that returns a tensor's value to Python: torch's tag ``data_dependent_output`` (``_local_scalar_dense``,
  behind ``.item()``, ``bool(t)``, ``int(t)``, ``if t.any():``; ``torch.equal``, ``torch.allclose``);
- an op whose output size depends on tensor values: torch's tag ``dynamic_output_shape`` (``nonzero``,
  ``torch.where(cond)``, ``argwhere``, ``masked_select``, ``unique``, ``bincount``, ``repeat_interleave`` of
  a repeats tensor, ``t[mask]``), the size being read on the host. Two tagged ops are static in some calls,
  as on a GPU: ``t[index]`` with integer indices (only a boolean mask sizes the result) and
  ``repeat_interleave(..., output_size=n)``. One untagged op is data-dependent: an indexed write ``t[mask] = v``
  (``index_put_``) with a boolean mask turns it into indices on the device, unless ``v`` is one host value
  (torch then runs ``masked_fill_``);
- a read of a tensor value the op makes on the host: ``masked_fill`` with a tensor value (the kernel takes it as
  a scalar), unless that value was made from Python data inside the capture (``torch.tensor(0.0)``: a host
  tensor). A Python number is always fine;
- a copy to the host, seen at the Python call since on a CPU it is no op at all: ``.tolist()``, ``.cpu()``,
  ``.numpy()`` (``np.asarray(t)``), ``.pin_memory()``, printing or formatting a tensor, ``.to(d)`` with a device
  ``d`` named by a string on the CPU (``"cpu"``), and any factory with ``pin_memory=True`` (a host staging
  buffer). A ``torch.device`` argument is not judged: code for the GPU takes it from a tensor
  (``x.to(y.device)``, no copy there), which here is the CPU too.

What torch itself computes with a host read on a CPU (``F.one_hot``'s bounds check) is refused as well: the
emulation sees only the ops. The exception: the ops' value checks (the ``check_*`` functions of ``ops/``) read
CPU tensors only (on a device they do not read values), so nothing they call is refused.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode, resolve_name
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

__all__ = ["Graph", "HostSyncInCapture", "capture"]

aten = torch.ops.aten
_OPS_DIR = os.path.join("sglang_specvocab", "ops")

# Python calls that copy a tensor to the host. On a CPU they run no aten op (the tensor already is on the host),
# so the dispatch mode cannot see them: they are refused by name.
_HOST_COPIES = {
    torch.Tensor.tolist,
    torch.Tensor.cpu,
    torch.Tensor.numpy,
    torch.Tensor.__array__,
    torch.Tensor.pin_memory,
    torch.Tensor.__repr__,
    torch.Tensor.__str__,
    torch.Tensor.__format__,
}
# The indexed reads and writes: their tag (index.Tensor's dynamic_output_shape) is the op's, but only a
# boolean (or uint8) mask among the indices makes them data-dependent; integer indices give a static shape.
_INDEX_READ = aten.index.Tensor
_INDEX_WRITES = {aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default}
# Tagged dynamic_output_shape, static when the caller gives the output size (a GPU then reads no sum).
_REPEAT_INTERLEAVE = aten.repeat_interleave.Tensor
# Untagged, but the CUDA kernel reads a tensor value with .item(): a sync unless the value is a host tensor.
_MASKED_FILL_TENSOR = {aten.masked_fill.Tensor, aten.masked_fill_.Tensor}


def _in_cpu_only_check() -> bool:
    frame = sys._getframe(2)
    while frame is not None:
        code = frame.f_code
        if code.co_name.startswith("check_") and os.path.dirname(code.co_filename).endswith(_OPS_DIR):
            return True
        frame = frame.f_back
    return False


def _names_cpu(device: Any) -> bool:
    return isinstance(device, str) and torch.device(device).type == "cpu"


def _host_copy(func: Any, args: tuple, kwargs: dict) -> bool:
    if func in _HOST_COPIES:
        return True
    if func is torch.Tensor.to:  # to(device, dtype, ...), to(dtype, ...), to(tensor, ...), to(device=...)
        return any(_names_cpu(a) for a in args[1:]) or _names_cpu(kwargs.get("device"))
    return False


def _masked(indices: Any) -> bool:
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices)


class HostSyncInCapture(RuntimeError):
    """A captured region read a tensor's value on the host (illegal under CUDA-graph capture)."""


class _Calls(TorchFunctionMode):
    """The Python-level torch call being run (for the message), and the host copies no aten op shows."""

    def __init__(self) -> None:
        super().__init__()
        self.func: Any = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _host_copy(func, args, kwargs) and not _in_cpu_only_check():
            raise HostSyncInCapture(f"host sync inside a captured region: {_name(func)} copies a tensor to the host")
        outer = self.func is None  # the message names the call the captured code made, not torch's inner ones
        if outer:
            self.func = func
        try:
            return func(*args, **kwargs)
        finally:
            if outer:
                self.func = None


def _name(func: Any) -> str:
    return resolve_name(func) or getattr(func, "__qualname__", None) or repr(func)


class _Recorder(TorchDispatchMode):
    def __init__(self, calls: _Calls) -> None:
        super().__init__()
        self.calls = calls
        self.ops: list[tuple[Any, tuple, dict, Any]] = []
        self.host: list[torch.Tensor] = []  # tensors made from Python data in the capture (held: ids stay theirs)

    def _is_host(self, t: Any) -> bool:
        return isinstance(t, torch.Tensor) and any(t is h for h in self.host)

    def _refusal(self, func, args, kwargs) -> str | None:
        """Why ``func`` syncs with the host under a CUDA capture, or None."""
        if kwargs.get("pin_memory"):
            return "allocates pinned host memory (a host staging buffer)"
        if func is _INDEX_READ:
            return "indexes with a boolean mask (its True count sizes the result)" if _masked(args[1]) else None
        if func in _INDEX_WRITES:
            if not _masked(args[1]):
                return None
            value, accumulate = args[2], (args[3] if len(args) > 3 else kwargs.get("accumulate", False))
            if not accumulate and value.numel() == 1 and self._is_host(value):
                return None  # torch's masked_fill_ path: one host value, no indices
            return "writes through a boolean mask (made into indices by nonzero on the device)"
        if func in _MASKED_FILL_TENSOR:
            return None if self._is_host(args[2]) else "reads its tensor value on the host (.item())"
        if func is _REPEAT_INTERLEAVE and kwargs.get("output_size") is not None:
            return None
        if torch.Tag.data_dependent_output in func.tags:
            return "returns a tensor's value to the host"
        if torch.Tag.dynamic_output_shape in func.tags:
            return "has an output shape that depends on tensor values"
        return None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        why = self._refusal(func, args, kwargs)
        if why is not None and not _in_cpu_only_check():
            call = self.calls.func
            where = f"{_name(call)}: " if call is not None else ""
            raise HostSyncInCapture(f"host sync inside a captured region: {where}{func} {why}")
        out = func(*args, **kwargs)
        if func is aten.lift_fresh.default:
            self.host.append(out)
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
    """Run ``fn()`` once, recording its ops: ``(graph, what fn returned)`` (the tensors a replay refreshes).
    Raises ``HostSyncInCapture`` where ``fn`` syncs with the host (the module doc)."""
    calls = _Calls()
    rec = _Recorder(calls)
    with calls, rec:
        result = fn()
    return Graph(rec.ops), result

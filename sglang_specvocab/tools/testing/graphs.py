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

What a CUDA capture refuses (a host sync: the CPU waits for the device), ``capture`` refuses too, raising
``HostSyncInCapture`` that names the Python call (``torch.Tensor.tolist``, ``torch.where``, ...) and the aten op.
Every tensor stands for a device tensor, except the host tensors made inside the capture: from Python data
(``torch.tensor(data)``, a scalar written through an index, a Python list used as an index), by a factory given no
device or the string ``"cpu"`` (``torch.arange(n)``: torch's default device is the CPU on a GPU server too), and
what ops compute from host tensors alone. A ``torch.device`` (``x.device``) names the device. Work on host
tensors alone is never refused. Refused:

- an op that returns a device tensor's value to Python: torch's tag ``data_dependent_output``
  (``_local_scalar_dense``, behind ``.item()``, ``bool(t)``, ``int(t)``, ``if t.any():``, ``x in t``;
  ``torch.equal``, ``torch.allclose``);
- an op whose output size depends on device values: torch's tag ``dynamic_output_shape`` (``nonzero``,
  ``torch.where(cond)``, ``argwhere``, ``masked_select``, ``unique``, ``bincount``, ``repeat_interleave`` of a
  repeats tensor, ``t[mask]``). Two tagged ops are static in some calls, as on a GPU: ``t[index]`` with integer
  indices (only a boolean mask sizes the result) and ``repeat_interleave(..., output_size=n)``. Torch's tags miss
  two host reads of CUDA kernels, added by hand: a write ``t[mask] = v`` through a boolean mask (``index_put_``)
  makes the mask into indices with ``nonzero``, unless ``v`` is one host value (torch then runs ``masked_fill_``);
  ``masked_fill(mask, v)`` reads a tensor ``v`` with ``.item()`` (a Python number or a host ``v`` is fine);
- a blocking copy between host and device: of a device tensor to the host (``.tolist()``, ``.cpu()``,
  ``.numpy()``, ``np.asarray(t)``, printing or formatting it, ``.to("cpu")``: on a CPU these run no aten op, so
  they are judged at the Python call; ``host.copy_(t)``), of a host tensor to the device (``.to(x.device)``,
  ``torch.tensor(data, device=x.device)``), and a host tensor of one or more dimensions given to an op with
  device tensors (torch copies it over, as the indices of ``t[[0, 2]]``, or refuses the mix; a 0-dim host
  tensor is a kernel argument).
  A non-blocking copy into pinned memory, which a capture allows, does not exist on a CPU-only torch.

What torch itself computes with a host read on a CPU (``F.one_hot``'s bounds check) is refused as well: the
emulation sees the ops, not the device they would run on. The exception: the ops' value checks (the ``check_*``
functions of ``ops/``) read CPU tensors only (on a device they read no values), so nothing they call is refused.
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

__all__ = ["Graph", "HostSyncInCapture", "capture", "in_ops_check"]

aten = torch.ops.aten
_OPS_DIR = os.path.join("sglang_specvocab", "ops")

# Python calls that copy a tensor to the host. On a CPU they run no aten op (the tensor already is on the host),
# so the dispatch mode cannot see them: they are judged by name.
_HOST_COPIES = {
    torch.Tensor.tolist,
    torch.Tensor.cpu,
    torch.Tensor.numpy,
    torch.Tensor.__array__,
    torch.Tensor.__repr__,
    torch.Tensor.__str__,
    torch.Tensor.__format__,
}
_FROM_DATA = {torch.tensor, torch.as_tensor, torch.asarray}  # Python data to a tensor: a copy to its device
# The indexed reads and writes: their tag (index.Tensor's dynamic_output_shape) is the op's, but only a
# boolean (or uint8) mask among the indices makes them data-dependent; integer indices give a static shape.
_INDEX_READ = aten.index.Tensor
_INDEX_WRITES = {aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default}
# Tagged dynamic_output_shape, static when the caller gives the output size (a GPU then reads no sum).
_REPEAT_INTERLEAVE = aten.repeat_interleave.Tensor
# Untagged, but the CUDA kernel reads its value tensor with .item(): a sync when that tensor is on the device.
_MASKED_FILL_TENSOR = {aten.masked_fill.Tensor, aten.masked_fill_.Tensor}


def in_ops_check() -> bool:
    """Whether the caller runs inside an op's value check (a ``check_*`` function of ``ops/``), which reads values only
    of CPU tensors: on a GPU it reads none, so what it does here stands for nothing a GPU host pays."""
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name.startswith("check_") and os.path.dirname(code.co_filename).endswith(_OPS_DIR):
            return True
        frame = frame.f_back
    return False


def _names_host(device: Any) -> bool:
    """A device argument that names the host: the string ``"cpu"`` (a ``torch.device`` is the stand-in device)."""
    return isinstance(device, str) and torch.device(device).type == "cpu"


def _tensors(x: Any) -> list[torch.Tensor]:
    return [t for t in tree_leaves(x) if isinstance(t, torch.Tensor)]


def _masked(indices: Any) -> bool:
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices)


def _name(func: Any) -> str:
    return resolve_name(func) or getattr(func, "__qualname__", None) or repr(func)


class HostSyncInCapture(RuntimeError):
    """A captured region synced with the host (illegal under CUDA-graph capture)."""


class _Capture:
    """What both modes share: the host tensors made in the capture, the Python call being run."""

    def __init__(self) -> None:
        self.host: dict[int, torch.Tensor] = {}  # id -> tensor, held so that no other tensor takes its id
        self.call: Any = None  # the outermost torch call of the captured code (for the message)

    def is_host(self, t: torch.Tensor) -> bool:
        return self.host.get(id(t)) is t

    def mark_host(self, x: Any) -> None:
        for t in _tensors(x):
            self.host[id(t)] = t

    def refuse(self, func: Any, why: str) -> None:
        if in_ops_check():
            return
        call = f"{_name(self.call)}: " if self.call is not None and self.call is not func else ""
        raise HostSyncInCapture(f"host sync inside a captured region: {call}{_name(func)} {why}")

    def python_refusal(self, func: Any, args: tuple, kwargs: dict) -> str | None:
        """Why a Python-level torch call syncs (the copies no aten op shows on a CPU), or None."""
        src = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if func in _HOST_COPIES:
            return None if src is None or self.is_host(src) else "copies a device tensor to the host"
        if func is torch.Tensor.to:  # to(device, dtype, ...), to(dtype, ...), to(other, ...), to(device=...)
            targets = [*args[1:], kwargs.get("device")]
            if not self.is_host(src) and any(_names_host(d) for d in targets):
                return "copies a device tensor to the host"
            to_device = any(
                isinstance(d, torch.device) or (isinstance(d, torch.Tensor) and not self.is_host(d)) for d in targets
            )
            return "copies a host tensor to the device (a blocking copy)" if self.is_host(src) and to_device else None
        if func in _FROM_DATA and kwargs.get("device") is not None and not _names_host(kwargs["device"]):
            return "copies Python data to the device (a blocking copy)"
        return None

    def op_refusal(self, func: Any, args: tuple, kwargs: dict) -> str | None:
        """Why an aten op syncs with the host under a CUDA capture, or None."""
        tensors = _tensors((args, kwargs))
        if all(self.is_host(t) for t in tensors):
            return None  # host work (or a factory): no device memory involved
        if func is aten.copy_.default and self.is_host(args[0]):
            return "copies a device tensor to the host"
        if func is _INDEX_READ and _masked(args[1]):
            return "indexes with a boolean mask (its True count sizes the result)"
        if func in _INDEX_WRITES and _masked(args[1]):
            value, accumulate = args[2], (args[3] if len(args) > 3 else kwargs.get("accumulate", False))
            if accumulate or value.numel() != 1 or not self.is_host(value):
                return "writes through a boolean mask (made into indices by nonzero on the device)"
            tensors = [t for t in tensors if t is not value]  # torch's masked_fill_ path: one host value
        if func in _MASKED_FILL_TENSOR and not self.is_host(args[2]):
            return "reads its device value tensor on the host (.item())"
        # tagged, but static here: integer indices (a mask returned above), a repeat with its output size
        static = func is _INDEX_READ or (func is _REPEAT_INTERLEAVE and kwargs.get("output_size") is not None)
        if torch.Tag.data_dependent_output in func.tags:
            return "returns a tensor's value to the host"
        if torch.Tag.dynamic_output_shape in func.tags and not static:
            return "has an output shape that depends on tensor values"
        if any(self.is_host(t) and t.dim() > 0 for t in tensors):  # a 0-dim host tensor is a kernel argument
            return "takes a host tensor with device tensors (copied to the device: a blocking copy)"
        return None


class _Calls(TorchFunctionMode):
    """The Python-level torch calls: the host copies no aten op shows on a CPU, the host tensors factories make."""

    def __init__(self, state: _Capture) -> None:
        super().__init__()
        self.state = state

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs, s = kwargs or {}, self.state
        why = s.python_refusal(func, args, kwargs)
        if why is not None:
            s.refuse(func, why)
        outer = s.call is None  # the message names the call the captured code made, not torch's inner ones
        if outer:
            s.call = func
        try:
            out = func(*args, **kwargs)
        finally:
            if outer:
                s.call = None
        # A factory (no tensor argument) with no device or the host's makes a host tensor, as torch's default
        # device is the CPU on a GPU server too.
        device = kwargs.get("device")
        if (device is None or _names_host(device)) and not _tensors((args, kwargs)):
            s.mark_host(out)
        return out


class _Recorder(TorchDispatchMode):
    def __init__(self, state: _Capture) -> None:
        super().__init__()
        self.state = state
        self.ops: list[tuple[Any, tuple, dict, Any]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs, s = kwargs or {}, self.state
        why = s.op_refusal(func, args, kwargs)
        if why is not None:
            s.refuse(func, why)
        out = func(*args, **kwargs)
        inputs = _tensors((args, kwargs))
        # Python data (torch.tensor, a scalar written through an index) is on the host, and so is what host
        # tensors alone compute.
        if func is aten.lift_fresh.default or (inputs and all(s.is_host(t) for t in inputs)):
            s.mark_host(out)
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


def capture(fn: Callable[[], Any]) -> tuple[Graph, Any]:
    """Run ``fn()`` once, recording its ops: ``(graph, what fn returned)`` (the tensors a replay refreshes).
    Raises ``HostSyncInCapture`` where ``fn`` syncs with the host (the module doc)."""
    state = _Capture()
    rec = _Recorder(state)
    with _Calls(state), rec:
        result = fn()
    return Graph(rec.ops), result

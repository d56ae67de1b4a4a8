"""Python face of the ops: one entry per op, a backend chosen per call site.

One module per op, as csrc/ has one file set per op: ``indexed_logits`` (with ``packed_logits``),
``window_update``, ``window_verify``, ``compact_topk``, ``pack_update``. Each holds the op's argument check
``check_<op>``, torch reference ``reference_<op>``, Triton wrapper ``triton_<op>`` where there is one, fake
kernel and public entry ``<op>``, which this package exports (so ``ops.indexed_logits`` is the function;
import a module's other names from the module: ``from sglang_specvocab.ops.indexed_logits import
reference_indexed_logits``). Shared: ``_backend`` (the choice of backend, the bad-entry counters),
``_ext`` (the compiled extension), ``checks`` (the debug setting and what every check shares),
``triton_ops`` (the Triton kernel), ``topk`` (torch-only layout and top-k pieces of the head).

Backends (the ``head.kernel`` key of a config):
- ``cuda``: the compiled extension, ``torch.ops.specvocab.*`` (csrc/): its CUDA kernels on GPU
  tensors, its C++ kernels on CPU tensors;
- ``triton``: Triton kernels (GPU tensors; CPU tensors only under ``TRITON_INTERPRET=1``);
  they exist for the two logits ops, the updates use the extension or torch;
- ``torch``: the op's ``reference_<op>``, the definition every other backend is tested against;
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

from ._backend import (
    BackendError,
    available_backends,
    backend_without_triton,
    bad_entries,
    implementation,
    resolve,
    set_debug_checks,
)
from .compact_topk import compact_topk
from .indexed_logits import indexed_logits, packed_logits
from .pack_update import pack_update
from .window_update import window_update
from .window_verify import WindowRound, window_verify

__all__ = [
    "BackendError",
    "WindowRound",
    "available_backends",
    "backend_without_triton",
    "bad_entries",
    "compact_topk",
    "implementation",
    "indexed_logits",
    "pack_update",
    "packed_logits",
    "resolve",
    "set_debug_checks",
    "window_update",
    "window_verify",
]

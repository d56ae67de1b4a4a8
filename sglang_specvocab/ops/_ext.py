"""The compiled kernels extension (``sglang_specvocab._C``, built from csrc/ at install time).

``load()`` loads it once into ``torch.ops.specvocab`` and registers the fake (meta) kernels
that let the ops trace under ``torch.compile`` and run on the meta device. It never raises:
``available()`` says whether the ops are there and ``reason()`` why not (not built, or built
against another torch). ``has_cuda_kernels()`` is False for a build made without nvcc.
"""

from __future__ import annotations

import importlib.util
import logging

import torch

log = logging.getLogger(__name__)

OPS = ("indexed_logits", "packed_logits", "window_update", "pack_update")
_state: dict[str, object] = {}


def load() -> bool:
    if "ok" in _state:
        return bool(_state["ok"])
    ok, why = False, ""
    spec = importlib.util.find_spec("sglang_specvocab._C")
    if spec is None or spec.origin is None:
        why = (
            "the kernels extension is not built (install with `pip install --no-build-isolation` into an "
            "environment that has torch, see README 'Kernels')"
        )
    else:
        try:
            torch.ops.load_library(spec.origin)
            _register_fakes()
            ok = True
        except (OSError, RuntimeError) as exc:  # e.g. built against another torch: undefined symbols
            why = f"the kernels extension {spec.origin} does not load ({exc}); rebuild it against torch {torch.__version__}"
    _state.update(ok=ok, why=why)
    return ok


def available() -> bool:
    return load()


def reason() -> str:
    load()
    return str(_state.get("why", ""))


def has_cuda_kernels() -> bool:
    return load() and torch._C._dispatch_has_kernel_for_dispatch_key("specvocab::indexed_logits", "CUDA")


def _register_fakes() -> None:
    lib = "specvocab::"

    @torch.library.register_fake(lib + "indexed_logits")
    def _(hidden, weight, ids, cnt, row_to_slot):
        return hidden.new_empty((hidden.shape[0], ids.shape[1]), dtype=torch.float32)

    @torch.library.register_fake(lib + "packed_logits")
    def _(hidden, packed, cnt, row_to_slot):
        return hidden.new_empty((hidden.shape[0], packed.shape[1]), dtype=torch.float32)

    @torch.library.register_fake(lib + "window_update")
    def _(ring, length, ids, cnt, rows, block, fallback_id, vocab_size):
        return None

    @torch.library.register_fake(lib + "pack_update")
    def _(packed, packed_ids, weight, ids, cnt, rows):
        return None

"""Stand-ins for two modules of the pinned SGLang whose native dependencies are not staged on the GPU machine.

Installed by scripts/device/install.sh into the device's site-packages with a ``.pth`` line that
imports this module at interpreter start, so every process (servers and their schedulers too)
has them before SGLang is imported. Each stand-in serves only while its dependency is missing:
once the real package is installed, the real SGLang module loads instead.

- ``sglang.kernels.ops.gemm.cutedsl_dual_gemm`` needs ``cutlass`` (nvidia-cutlass-dsl, about
  90 MiB of wheels). ``layers/dual_gemm.py`` imports it while building every Llama/Gemma MLP on
  CUDA; the kernel is Blackwell-only (SM100), so on an H100/H200 the answer is "no dual GEMM".
- ``sglang.srt.layers.attention.flashmla_backend`` needs ``flash_mla`` (built from source, not on
  PyPI). The EAGLE workers import ``FlashMLABackend`` at CUDA-graph capture only for an
  ``isinstance`` test; building one (``--attention-backend flashmla``) is refused with a reason.
"""

from __future__ import annotations

import enum
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

DUAL_GEMM = "sglang.kernels.ops.gemm.cutedsl_dual_gemm"
FLASHMLA = "sglang.srt.layers.attention.flashmla_backend"
NEEDS = {DUAL_GEMM: "cutlass", FLASHMLA: "flash_mla"}  # module -> the package whose absence it stands in for


class DualGemmQuantMode(enum.IntEnum):
    """The member names and values SGLang's dual_gemm.py selects from (none is ever chosen here)."""

    STATIC_PER_TENSOR = 0
    STATIC_PER_TOKEN = 1
    DYNAMIC_PER_TENSOR = 2
    DYNAMIC_PER_TOKEN = 3
    UNQUANT = 4

    @property
    def is_quantized(self) -> bool:
        return self is not DualGemmQuantMode.UNQUANT


def can_use_dual_gemm(*args, **kwargs) -> bool:
    return False  # no cutlass here, and the kernel needs SM100


class FlashMLABackend:
    def __init__(self, *args, **kwargs):
        raise RuntimeError(
            "flash_mla is not installed on this machine (scripts/device stages a stand-in): "
            "use --attention-backend triton"
        )


def _fill(module: types.ModuleType) -> None:
    if module.__name__ == DUAL_GEMM:
        module.MAX_DUAL_GEMM_DECODE_TOKENS = 0
        module.DualGemmQuantMode = DualGemmQuantMode
        module.can_use_dual_gemm = can_use_dual_gemm
    else:
        module.FlashMLABackend = FlashMLABackend

    def missing(name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        raise ImportError(f"{module.__name__}.{name}: a stand-in ({NEEDS[module.__name__]} is not installed)")

    module.__getattr__ = missing


class StandIns(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name not in NEEDS or importlib.util.find_spec(NEEDS[name]) is not None:
            return None
        return importlib.machinery.ModuleSpec(name, self, origin=__file__)

    def create_module(self, spec):
        return None  # the default module object

    def exec_module(self, module):
        _fill(module)


def install() -> None:
    if not any(isinstance(f, StandIns) for f in sys.meta_path):
        sys.meta_path.insert(0, StandIns())


install()

"""How to build the kernels extension from this folder: one recipe for both ways it is built.

- at install time, by setup.py (``sglang_specvocab._C``, a ``CppExtension`` that also compiles the .cu
  files when a CUDA toolkit is found, even against a CPU-only torch);
- on first use, by ``sglang_specvocab/ops/_ext.py`` when the wheel was built without torch
  (``torch.utils.cpp_extension.load`` over this folder, shipped inside the package).

Standard library only: setup.py loads it by path before torch may be importable.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

HERE = Path(__file__).resolve().parent

CPU_SOURCES = [
    "binding.cpp",
    "indexed_logits.cpp",
    "window_update.cpp",
    "window_verify.cpp",
    "compact_topk.cpp",
    "pack_update.cpp",
]
# Object names must differ from the .cpp ones (same stem, one build folder).
CUDA_SOURCES = [
    "indexed_logits_kernel.cu",
    "window_update_kernel.cu",
    "window_verify_kernel.cu",
    "compact_topk_kernel.cu",
    "pack_update_kernel.cu",
]
NO_CUDA_SOURCE = "no_cuda.cpp"  # the launchers' stand-ins when no CUDA kernels are built
SHIPPED = ("*.cpp", "*.cu", "*.h", "recipe.py")  # what the wheel carries for the JIT build

CXX_FLAGS = ["-O3", "-std=c++17"]
WITH_CUDA_DEFINE = "-DSPECVOCAB_WITH_CUDA"
# sm_80 (A100) and sm_90a (H100/H200) machine code, and compute_80 PTX for anything newer.
GENCODE = [
    "-gencode=arch=compute_80,code=sm_80",
    "-gencode=arch=compute_90a,code=sm_90a",
    "-gencode=arch=compute_80,code=compute_80",
]
NVCC_FLAGS = ["-O3", "-std=c++17", "--expt-relaxed-constexpr", *GENCODE]


def cuda_home() -> Path | None:
    """The CUDA toolkit folder: $CUDA_HOME / $CUDA_PATH, else the one ``nvcc`` on PATH belongs to.

    None when there is none, or when $SPECVOCAB_NO_CUDA is set (CPU kernels only).
    """
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            home = Path(os.environ[var])
            return home if (home / "bin" / "nvcc").exists() else None
    if os.environ.get("SPECVOCAB_NO_CUDA"):
        return None
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return None
    # nvcc on PATH may be a wrapper script (it is on our machines): prefer the toolkit folder.
    for home in (Path("/usr/local/cuda"), Path(os.path.realpath(nvcc)).parent.parent):
        if (home / "bin" / "nvcc").exists() and (home / "include" / "cuda_runtime.h").exists():
            return home
    return None


def sources(with_cuda: bool) -> list[str]:
    """The source file names (in this folder) of a build with or without the CUDA kernels."""
    return CPU_SOURCES + (CUDA_SOURCES if with_cuda else [NO_CUDA_SOURCE])

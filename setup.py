"""Builds the kernels extension ``sglang_specvocab._C`` from csrc/ against the installed torch.

Everything else is declared in pyproject.toml. Build with ``pip install --no-build-isolation``
so the build sees the torch that will run it (an extension is tied to one torch ABI: never
ship a binary). Three outcomes, each said once on stderr:
- torch and nvcc found: CPU kernels (C++) and CUDA kernels for sm_80 and sm_90a, plus PTX;
- torch found, no nvcc: CPU kernels only; on a GPU the ops run through Triton or torch;
- torch not importable (an isolated build): no extension; the torch reference and Triton remain.
The .cu files include no torch header and the binding needs no torch CUDA library, so the CUDA
kernels also build on a machine with a CPU-only torch (CI checks them with cuobjdump).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).resolve().parent
CSRC = Path("csrc")
CPU_SOURCES = ["binding.cpp", "indexed_logits.cpp", "window_update.cpp", "pack_update.cpp"]
CUDA_SOURCES = [
    "indexed_logits_kernel.cu",
    "window_update_kernel.cu",
    "pack_update_kernel.cu",
]  # object names must differ from the .cpp
# sm_80 (A100) and sm_90a (H100/H200) machine code, and compute_80 PTX for anything newer.
GENCODE = [
    "-gencode=arch=compute_80,code=sm_80",
    "-gencode=arch=compute_90a,code=sm_90a",
    "-gencode=arch=compute_80,code=compute_80",
]


def _say(msg: str) -> None:
    print(f"sglang-specvocab build: {msg}", file=sys.stderr)


def cuda_home() -> Path | None:
    """The CUDA toolkit folder: $CUDA_HOME / $CUDA_PATH, else the one ``nvcc`` on PATH belongs to."""
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


def extensions() -> tuple[list, dict]:
    try:
        import torch
        from torch.utils import cpp_extension
    except ImportError:
        _say(
            "torch is not importable here (an isolated build?): no kernels extension; the torch "
            "reference and Triton backends remain. Install with `pip install --no-build-isolation` "
            "into an environment that has torch to build the CPU and CUDA kernels."
        )
        return [], {}
    home = cuda_home()
    sources = [str(CSRC / s) for s in CPU_SOURCES]
    args = {"cxx": ["-O3", "-std=c++17"]}
    kwargs: dict = {}
    if home is not None:
        # A CPU-only torch has no CUDA_HOME of its own; point it at the toolkit for nvcc.
        cpp_extension.CUDA_HOME = str(home)
        sources += [str(CSRC / s) for s in CUDA_SOURCES]
        args["cxx"].append("-DSPECVOCAB_WITH_CUDA")
        args["nvcc"] = ["-O3", "-std=c++17", "--expt-relaxed-constexpr", *GENCODE]
        kwargs = {
            "include_dirs": [str(HERE / CSRC), str(home / "include")],
            "library_dirs": [str(home / "lib64")],
            # Static cudart: the library loads without libcudart.so and never clashes with torch's.
            "libraries": ["cudart_static", "rt", "pthread", "dl"],
        }
        _say(f"torch {torch.__version__}, CUDA toolkit {home}: CPU kernels and CUDA kernels (sm_80, sm_90a + PTX)")
    else:
        sources.append(str(CSRC / "no_cuda.cpp"))
        kwargs = {"include_dirs": [str(HERE / CSRC)]}
        _say(
            f"torch {torch.__version__}, no nvcc found (set CUDA_HOME to a CUDA toolkit): CPU kernels only; "
            "on a GPU the head runs through the Triton or torch backends"
        )
    ext = cpp_extension.CppExtension("sglang_specvocab._C", sources, extra_compile_args=args, **kwargs)
    return [ext], {"build_ext": cpp_extension.BuildExtension.with_options(use_ninja=shutil.which("ninja") is not None)}


ext_modules, cmdclass = extensions()
setup(ext_modules=ext_modules, cmdclass=cmdclass)

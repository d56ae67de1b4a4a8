"""Builds the kernels extension ``sglang_specvocab._C`` from csrc/ against the installed torch
(the recipe: csrc/recipe.py, shared with the first-use JIT build).

Everything else is declared in pyproject.toml. Build with ``pip install --no-build-isolation``
so the build sees the torch that will run it (an extension is tied to one torch ABI: never
ship a binary). Three outcomes, each said once on stderr:
- torch and nvcc found: CPU kernels (C++) and CUDA kernels for sm_80 and sm_90a, plus PTX;
- torch found, no nvcc: CPU kernels only; on a GPU the ops run through Triton or torch;
- torch not importable (an isolated build): no extension; the kernels compile on first use against the
  installed torch (``sglang_specvocab/ops/_ext.py``, from csrc/ shipped as ``sglang_specvocab.csrc``).
The .cu files include no torch header and the binding needs no torch CUDA library, so the CUDA
kernels also build on a machine with a CPU-only torch (CI checks them with cuobjdump).
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).resolve().parent
CSRC = Path("csrc")
# The build recipe shared with the JIT build (csrc/recipe.py), loaded by path: torch may be absent here.
_spec = importlib.util.spec_from_file_location("_specvocab_recipe", HERE / CSRC / "recipe.py")
recipe = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(recipe)


def _say(msg: str) -> None:
    print(f"sglang-specvocab build: {msg}", file=sys.stderr)


def extensions() -> tuple[list, dict]:
    try:
        import torch
        from torch.utils import cpp_extension
    except ImportError:
        _say(
            "torch is not importable here (an isolated build?): no compiled kernels in this build; they "
            "compile once on first use against the installed torch (or install with `pip install "
            "--no-build-isolation` into an environment that has torch to build them now)."
        )
        return [], {}
    home = recipe.cuda_home()
    sources = [str(CSRC / s) for s in recipe.sources(with_cuda=home is not None)]
    args = {"cxx": list(recipe.CXX_FLAGS)}
    kwargs: dict = {}
    if home is not None:
        # A CPU-only torch has no CUDA_HOME of its own; point it at the toolkit for nvcc.
        cpp_extension.CUDA_HOME = str(home)
        args["cxx"].append(recipe.WITH_CUDA_DEFINE)
        args["nvcc"] = list(recipe.NVCC_FLAGS)
        kwargs = {
            "include_dirs": [str(HERE / CSRC), str(home / "include")],
            "library_dirs": [str(home / "lib64")],
            # Static cudart: the library loads without libcudart.so and never clashes with torch's.
            "libraries": ["cudart_static", "rt", "pthread", "dl"],
        }
        _say(f"torch {torch.__version__}, CUDA toolkit {home}: CPU kernels and CUDA kernels (sm_80, sm_90a + PTX)")
    else:
        kwargs = {"include_dirs": [str(HERE / CSRC)]}
        _say(
            f"torch {torch.__version__}, no nvcc found (set CUDA_HOME to a CUDA toolkit): CPU kernels only; "
            "on a GPU the head runs through the Triton or torch backends"
        )
    ext = cpp_extension.CppExtension("sglang_specvocab._C", sources, extra_compile_args=args, **kwargs)
    return [ext], {"build_ext": cpp_extension.BuildExtension.with_options(use_ninja=shutil.which("ninja") is not None)}


ext_modules, cmdclass = extensions()
setup(ext_modules=ext_modules, cmdclass=cmdclass)

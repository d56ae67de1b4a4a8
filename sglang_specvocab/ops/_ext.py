"""The compiled kernels extension: ``sglang_specvocab._C`` (built from csrc/ at install time) or, where the
wheel was built without torch, the same sources compiled on first use against the installed torch.

``load()`` loads it once into ``torch.ops.specvocab``, registers the fake (meta) kernels that let the
ops trace under ``torch.compile`` and run on the meta device (each op's module declares its own with
``fake``), and hands it the debug setting (``checks``). It never raises: ``available()`` says
whether the ops are there and ``reason()`` why not (no compiler for the first-use build, or a build made
against another torch). ``has_cuda_kernels()`` is False for a build made without nvcc.

The first-use (JIT) build: ``torch.utils.cpp_extension.load`` over ``sglang_specvocab.csrc`` (csrc/ shipped
in the wheel, recipe in ``csrc/recipe.py``), into ``<cache>/kernels/<torch version>-<hash of sources and
flags>`` (``sglang_specvocab.cache.cache_dir``), so it compiles once per torch and source version; later
processes only load it. CUDA kernels are compiled when torch has CUDA and a toolkit is found, else CPU
kernels only. It is said once in the log.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import torch

from .checks import debug_checks

log = logging.getLogger(__name__)

_state: dict[str, object] = {}
_FAKES: dict[str, Callable] = {}  # op -> its fake kernel, registered when the library loads


def fake(op: str) -> Callable[[Callable], Callable]:
    """Decorator: ``op``'s fake (meta) kernel, which each op's module declares beside the op (``torch.library``
    needs the op defined, so it is registered once the library has loaded; every op module is imported by then,
    as the package imports them all)."""

    def add(fn: Callable) -> Callable:
        _FAKES[op] = fn
        return fn

    return add


def load() -> bool:
    if "ok" in _state:
        return bool(_state["ok"])
    ok, why = False, ""
    spec = importlib.util.find_spec("sglang_specvocab._C")
    if spec is None or spec.origin is None:
        try:
            jit_build()
            _loaded()
            ok = True
        except (OSError, RuntimeError, ImportError) as exc:  # no compiler, a failed compile, no csrc/ shipped
            why = f"the kernels extension is not built and the first-use build failed: {exc}"
            log.warning("sglang-specvocab: %s; the head runs through the Triton or torch backends", why)
    else:
        try:
            torch.ops.load_library(spec.origin)
            _loaded()
            ok = True
        except (OSError, RuntimeError) as exc:  # e.g. built against another torch: undefined symbols
            why = f"the kernels extension {spec.origin} does not load ({exc}); rebuild it against torch {torch.__version__}"
    _state.update(ok=ok, why=why)
    return ok


def jit_build() -> Path:
    """Compile the kernels from the shipped csrc/ against this torch (once per version; cached) and load them.

    Raises ``RuntimeError`` naming what is missing (the sources, a C++ compiler) or why the compile failed.
    """
    from torch.utils import cpp_extension  # heavy: only for a first-use build

    from ..cache import cache_dir

    try:
        from ..csrc import recipe  # only for a first-use build; an install without the sources lacks it
    except ImportError as exc:
        raise RuntimeError("the kernel sources (sglang_specvocab.csrc) are not installed") from exc
    src = Path(recipe.__file__).resolve().parent
    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None:
        raise RuntimeError(
            f"no C++ compiler: '{cxx}' is not on PATH (install g++, or set CXX to a C++17 compiler, "
            "or install with `pip install --no-build-isolation` where one is)"
        )
    home = recipe.cuda_home() if torch.version.cuda else None  # CUDA kernels need a CUDA torch to run
    files = [str(src / f) for f in recipe.sources(with_cuda=home is not None)]
    cflags = list(recipe.CXX_FLAGS) + ([recipe.WITH_CUDA_DEFINE] if home is not None else [])
    cuda_flags = list(recipe.NVCC_FLAGS) if home is not None else []
    digest = hashlib.sha256(repr((torch.__version__, cflags, cuda_flags)).encode())
    for f in sorted(src.glob("*.[ch]*")):
        digest.update(f.name.encode() + f.read_bytes())
    key = digest.hexdigest()[:16]
    build_dir = cache_dir() / "kernels" / f"torch-{torch.__version__}-{key}"
    build_dir.mkdir(parents=True, exist_ok=True)
    name = f"sglang_specvocab_C_{key}"
    kind = "CPU and CUDA kernels" if home is not None else "CPU kernels"
    if any(build_dir.glob(f"{name}*.so")):
        log.info("sglang-specvocab: loading the kernels compiled on first use from %s", build_dir)
    else:
        log.warning(
            "sglang-specvocab: this install has no compiled kernels: compiling %s from %s against torch %s "
            "into %s (once; later runs load it)",
            kind,
            src,
            torch.__version__,
            build_dir,
        )
    if home is not None:
        cpp_extension.CUDA_HOME = str(home)  # the toolkit found by the recipe, not torch's guess
    try:
        cpp_extension.load(
            name,
            files,
            extra_cflags=cflags,
            extra_cuda_cflags=cuda_flags,
            extra_include_paths=[str(src)],
            build_directory=str(build_dir),
            with_cuda=home is not None,
            is_python_module=False,
        )
    except RuntimeError as exc:  # cpp_extension reports a failed compile (and a missing ninja) this way
        raise RuntimeError(f"compiling {kind} in {build_dir} failed: {exc}") from exc
    return build_dir


def available() -> bool:
    return load()


def reason() -> str:
    load()
    return str(_state.get("why", ""))


def has_cuda_kernels() -> bool:
    return load() and torch._C._dispatch_has_kernel_for_dispatch_key("specvocab::indexed_logits", "CUDA")


def describe() -> str:
    """What kernels this machine runs, in words (setup prints it): CUDA kernels built on a machine without a
    GPU are named as such, not as usable."""
    if not load():
        return f"none: {reason()}"
    if not has_cuda_kernels():
        return "CPU only (built without nvcc)"
    if torch.cuda.is_available():
        return "CPU + CUDA"
    return "CPU; CUDA kernels compiled, no GPU here"


def _loaded() -> None:
    """After the library loaded: its fake kernels, and the Python side's debug setting (one source of truth once
    ``ops.set_debug_checks`` changed it; the library read the same variable on load)."""
    _register_fakes()
    if hasattr(torch.ops.specvocab, "set_debug_checks"):  # absent from a library built before it existed
        torch.ops.specvocab.set_debug_checks(debug_checks())


def _register_fakes() -> None:
    for op, fn in _FAKES.items():
        torch.library.register_fake("specvocab::" + op)(fn)

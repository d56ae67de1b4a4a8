"""Empty stand-in modules that let SGLang's modules import on a CPU machine.

SGLang's config package imports ``torchvision`` (no CPU build; only multimodal configs use it) and
its RotaryEmbedding imports ``vllm``'s kernel on a non-CUDA build (no CPU forward uses it).
``install(names)`` serves empty modules for those of ``names`` that are not installed: real module
objects with a ``__spec__`` (some code calls ``importlib.util.find_spec``) whose every attribute is
an empty class. It first lets transformers settle "torchvision is unavailable", so transformers
never mistakes a stand-in for the real package. ``child_preamble()`` is the source a child process
runs first (tests run SGLang's model code in children: it initialises ``torch.distributed``).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

NAMES = ("torchvision", "vllm")


def child_preamble(names: tuple[str, ...] = NAMES) -> str:
    """Python source that installs the stand-ins for ``names``: the first lines of a child's script."""
    return f"from sglang_specvocab.tools.testing.standins import install\ninstall({tuple(names)!r})\n"


class _StandIns(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names

    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in self.names:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = _empty_class
        return module

    def exec_module(self, module):
        pass


def _empty_class(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    return type(name, (), {})


def install(names: tuple[str, ...] = NAMES) -> tuple[str, ...]:
    """Serve stand-ins for the missing ones of ``names`` (idempotent); returns the names stood in for."""
    installed = {n for f in sys.meta_path if isinstance(f, _StandIns) for n in f.names}
    missing = tuple(n for n in names if n not in installed and importlib.util.find_spec(n) is None)
    if missing:
        from transformers.utils import import_utils  # heavy, and only needed when something is missing

        import_utils.is_torchvision_available()  # cached as False before a stand-in exists
        import_utils.is_torchvision_v2_available()
        sys.meta_path.insert(0, _StandIns(missing))
    return missing


CHILD_PREAMBLE = child_preamble()

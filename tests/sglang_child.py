"""What a child process needs before it imports SGLang's model code on a CPU machine.

``STUBS`` is Python source to put first in a child's script: it caches transformers' answer that
torchvision is absent, then makes empty stand-in modules for ``torchvision`` (only multimodal
configs use it, and it has no CPU build) and ``vllm`` (SGLang's RotaryEmbedding imports its kernel
on a non-CUDA, non-CPU-engine build; no CPU forward uses it), each only when it is not installed.
Tests run SGLang in a child because it initialises ``torch.distributed`` for the process.
"""

import importlib.util
import socket
import textwrap

STUBS = textwrap.dedent(
    """
    import importlib.abc, importlib.machinery, importlib.util, json, sys, types
    from transformers.utils import import_utils

    import_utils.is_torchvision_available()  # cached as False before the stub exists


    def _missing(attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return type(attr, (), {})


    _MISSING = tuple(m for m in ("torchvision", "vllm") if importlib.util.find_spec(m) is None)


    class _Stub(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in _MISSING:
                return importlib.machinery.ModuleSpec(name, self, is_package=True)

        def create_module(self, spec):
            m = types.ModuleType(spec.name)
            m.__path__, m.__getattr__ = [], _missing
            return m

        def exec_module(self, module):
            pass


    sys.meta_path.insert(0, _Stub())
    """
)


def sglang_available() -> bool:
    return importlib.util.find_spec("sglang") is not None


def free_port() -> int:
    """A free local TCP port for a child's torch.distributed rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

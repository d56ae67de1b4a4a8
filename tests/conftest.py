import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types

import pytest
import torch
from hypothesis import HealthCheck, settings

# CI runs a fixed, reproducible set of examples; locally hypothesis explores new ones.
settings.register_profile("ci", derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


def tiny_llama(vocab_size: int = 512, layers: int = 4, seed: int = 0, dtype=torch.float64):
    """A random Llama with spread-out logits, so greedy decoding is not one repeated token."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        initializer_range=0.2,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    return LlamaForCausalLM(cfg).to(dtype).eval()


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models: one thread is several times faster than two on a shared 2-core machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def llama():
    return tiny_llama()


@pytest.fixture(scope="session")
def gemma():
    """Gemma-3 270M from the PyPI GGUF (dequantized once, then cached)."""
    from sglang_specvocab.lab.models import load_model

    return load_model("gemma3-270m")


class _TorchvisionStandIn(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Empty ``torchvision`` modules: SGLang's config package imports it, it has no CPU build, Llama never uses it.

    Real module objects (with a ``__spec__``), because some code calls ``importlib.util.find_spec``."""

    def find_spec(self, name, path, target=None):
        if name.split(".")[0] == "torchvision":
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = _standin_attr
        return module

    def exec_module(self, module):
        pass


def _standin_attr(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return type(name, (), {})


def install_torchvision_standin() -> None:
    """Install the stand-in once, only when torchvision is missing (also callable from child processes)."""
    if any(isinstance(f, _TorchvisionStandIn) for f in sys.meta_path) or importlib.util.find_spec("torchvision"):
        return
    from transformers.utils import import_utils

    import_utils.is_torchvision_available()  # let transformers settle "unavailable" before the stand-in exists
    sys.meta_path.insert(0, _TorchvisionStandIn())


@pytest.fixture(scope="session")
def torchvision_standin():
    install_torchvision_standin()

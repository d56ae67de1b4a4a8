"""An EAGLE-3 draft on disk, as SGLang's ``LlamaForCausalLMEagle3`` loads it: written after training,
read back (checked against the target) by the reference decoder and by ``--init-from``.

Checkpoint names: ``fc.weight``, ``midlayer.*`` (SGLang's legacy name of ``layers.0``; its loader
stacks ``q/k/v_proj`` and ``gate/up_proj``), ``norm.weight``, ``lm_head.weight`` (d2t head only),
``d2t`` (``target_id - draft_id`` per draft id: SGLang's ``hot_token_id = d2t + arange``) and
``t2d``. No ``embed_tokens``: SGLang binds the target's. ``draft_vocab_size: null`` with
``tie_word_embeddings: false`` makes SGLang load the target's LM head (the key must be present).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from ...errors import SpecVocabError
from ...policies.base import draft_fingerprint
from .model import (
    SGLANG_ARCHITECTURE,
    Eagle3Config,
    Eagle3Draft,
    _rope_theta,
    capture_layers_from_ids,
    sglang_default_capture_layers,
)


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


def checkpoint_fingerprint(path: str | Path) -> str:
    """The draft's identity as trained files record it (``policies.base.draft_fingerprint`` of its ``fc.weight``), read
    from its ``model.safetensors`` alone."""
    try:
        with safe_open(str(Path(path) / "model.safetensors"), framework="pt") as f:
            fc = f.get_tensor("fc.weight")
    except (OSError, ValueError, KeyError) as exc:  # KeyError: a draft file without fc
        raise SpecVocabError(f"EAGLE-3 draft {path}: cannot read fc.weight from model.safetensors: {exc}") from None
    return draft_fingerprint(fc)


def read_checkpoint(path: str | Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """(``config.json``, ``model.safetensors`` tensors) of an EAGLE-3 draft in SGLang's format."""
    path = Path(path)
    try:
        config = json.loads((path / "config.json").read_text())
        tensors = load_file(str(path / "model.safetensors"))
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc).splitlines()[0]
        raise SpecVocabError(f"EAGLE-3 draft {path}: cannot read config.json and model.safetensors: {reason}") from None
    archs = config.get("architectures") or []
    if SGLANG_ARCHITECTURE not in archs:
        raise SpecVocabError(f"EAGLE-3 draft {path}: architectures {archs} is not [{SGLANG_ARCHITECTURE!r}]")
    return config, {k.removeprefix("model."): v for k, v in tensors.items()}


def load_checkpoint(path: str | Path, target) -> Eagle3Draft:
    """An EAGLE-3 draft saved in SGLang's ``LlamaForCausalLMEagle3`` format, bound to ``target`` (a
    Hugging Face causal LM: its embedding, and its LM head when the draft has no vocabulary of its
    own), as SGLang's EAGLE-3 worker binds them. Checks that the draft fits the target."""
    config, tensors = read_checkpoint(path)
    where = f"EAGLE-3 draft {path}"
    tc = target.config
    vocab = target.get_input_embeddings().weight.shape[0]
    need = ("hidden_size", "intermediate_size", "num_attention_heads", "rms_norm_eps", "vocab_size")
    missing = [k for k in need if k not in config]
    if missing:
        raise SpecVocabError(f"{where}: config.json lacks {', '.join(missing)}")
    if config["hidden_size"] != tc.hidden_size or config.get("target_hidden_size", tc.hidden_size) != tc.hidden_size:
        raise SpecVocabError(
            f"{where}: hidden_size {config['hidden_size']} (target_hidden_size "
            f"{config.get('target_hidden_size')}) does not match the target's {tc.hidden_size}"
        )
    if config["vocab_size"] != vocab:
        raise SpecVocabError(f"{where}: vocab_size {config['vocab_size']} is not the target's {vocab}")
    if config.get("num_hidden_layers", 1) != 1:
        raise SpecVocabError(f"{where}: num_hidden_layers {config['num_hidden_layers']}: only 1 is supported")
    ids = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    layers = (
        sglang_default_capture_layers(tc.num_hidden_layers)
        if ids is None
        else capture_layers_from_ids(ids, tc.num_hidden_layers)
    )
    if config.get("norm_before_fc") or (config.get("eagle_config") or {}).get("norm_before_fc"):
        raise SpecVocabError(f"{where}: norm_before_fc (one norm over all captured layers) is not supported here")
    heads = config["num_attention_heads"]
    dvs = config.get("draft_vocab_size")
    if config.get("tie_word_embeddings") or dvs == vocab:
        dvs = None  # SGLang binds the target's head (load_lm_head_from_target)
    cfg = Eagle3Config(
        vocab_size=vocab,
        hidden_size=config["hidden_size"],
        target_hidden_size=config.get("target_hidden_size", config["hidden_size"]),
        intermediate_size=config["intermediate_size"],
        num_attention_heads=heads,
        num_key_value_heads=config.get("num_key_value_heads") or heads,
        head_dim=config.get("head_dim") or config["hidden_size"] // heads,
        rms_norm_eps=float(config["rms_norm_eps"]),
        rope_theta=_rope_theta(SimpleNamespace(**config)),
        max_position_embeddings=int(config.get("max_position_embeddings", 8192)),
        capture_layers=layers,
        draft_vocab_size=dvs,
        fc_norm=bool(config.get("fc_norm") or config.get("use_aux_norm")),  # as SGLang reads them
    )
    hot = None
    if dvs is not None:
        if "d2t" not in tensors:
            raise SpecVocabError(f"{where}: draft_vocab_size {dvs} but no d2t tensor in model.safetensors")
        hot = tensors["d2t"].to(torch.int64) + torch.arange(len(tensors["d2t"]))
        if len(hot) != dvs or hot.min() < 0 or hot.max() >= vocab or len(hot.unique()) != len(hot):
            raise SpecVocabError(f"{where}: d2t does not map {dvs} draft ids to distinct target ids below {vocab}")
    head = target.get_output_embeddings().weight
    draft = Eagle3Draft(cfg, target.get_input_embeddings().weight, head, hot)
    _load_params(draft, tensors, where, with_head=True)
    return draft.eval()


def _load_params(draft: Eagle3Draft, tensors: dict[str, torch.Tensor], where: str, *, with_head: bool) -> None:
    own = dict(draft.named_parameters())
    names = [n for n in own if with_head or not n.startswith("lm_head.")]
    missing = [n for n in names if n not in tensors]
    if missing:
        raise SpecVocabError(f"{where}: model.safetensors lacks {', '.join(missing)}")
    with torch.no_grad():
        for n in names:
            if tensors[n].shape != own[n].shape:
                raise SpecVocabError(
                    f"{where}: {n} has shape {list(tensors[n].shape)}, the draft needs {list(own[n].shape)}"
                )
            own[n].copy_(tensors[n])


def load_into(draft: Eagle3Draft, path: str | Path) -> None:
    """Start training from a saved draft: its layer, ``fc`` and norms, and its head when both are
    d2t drafts over the same vocabulary (a d2t draft started from a full one keeps the target's rows)."""
    _, tensors = read_checkpoint(path)
    same_head = (
        draft.hot_ids is not None
        and "d2t" in tensors
        and torch.equal(tensors["d2t"].to(torch.int64) + torch.arange(len(tensors["d2t"])), draft.hot_ids.cpu())
    )
    if draft.fc_norm is not None and "fc_norm.0.weight" not in tensors:
        raise SpecVocabError(
            f"--init-from {path}: that draft has no fc_norm, and its fc was fit to features that were not normed; "
            "continue it without --fc-norm, or start a new draft with it"
        )
    if draft.fc_norm is None and "fc_norm.0.weight" in tensors:
        raise SpecVocabError(f"--init-from {path}: that draft norms its features before fc: continue it with --fc-norm")
    _load_params(draft, tensors, f"--init-from {path}", with_head=same_head)

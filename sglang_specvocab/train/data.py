"""Self-distilled training data for an EAGLE-3 draft: prompts answered greedily by the target itself.

``SelfDistillData`` holds prompt + response token ids (prompt first), saved in one ``.pt`` file
(``DATA_FORMAT``) so a run reuses what an earlier one generated; ``hot_vocabulary`` picks a d2t
draft's vocabulary (the most frequent target ids).
"""

from __future__ import annotations

import itertools
import json
import pickle
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..errors import SpecVocabError
from ..vocab_data import load_frequency_ids

DATA_FORMAT = "sglang-specvocab/eagle3-self-distill/1"


@dataclass
class SelfDistillData:
    """Prompt + the target's own greedy response, as token ids (the prompt first)."""

    sequences: list[torch.Tensor]
    prompt_lens: list[int]
    meta: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.sequences)

    def save(self, path: str | Path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        lens = torch.tensor([len(s) for s in self.sequences], dtype=torch.int64)
        tmp = path.with_name(path.name + ".tmp")
        torch.save(
            {
                "format": DATA_FORMAT,
                "tokens": torch.cat(self.sequences).to(torch.int32)
                if self.sequences
                else torch.zeros(0, dtype=torch.int32),
                "offsets": torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)]),
                "prompt_lens": torch.tensor(self.prompt_lens, dtype=torch.int64),
                "meta": json.dumps(self.meta),
            },
            tmp,
        )
        tmp.replace(path)  # a crash never leaves a half-written cache

    @classmethod
    def load(cls, path: str | Path, vocab_size: int | None = None) -> SelfDistillData:
        try:
            d = torch.load(path, weights_only=True)
        except (OSError, RuntimeError, EOFError, ValueError, pickle.UnpicklingError) as exc:
            reason = getattr(exc, "strerror", None) or str(exc).splitlines()[0]
            raise SpecVocabError(f"{path}: cannot read EAGLE-3 training data: {reason}") from None
        if not isinstance(d, dict) or d.get("format") != DATA_FORMAT:
            raise SpecVocabError(f"{path}: not EAGLE-3 training data written by this script (format {DATA_FORMAT})")
        meta = json.loads(d["meta"])
        if vocab_size is not None and meta.get("vocab_size") not in (None, vocab_size):
            raise SpecVocabError(
                f"{path}: made for a {meta['vocab_size']}-token vocabulary (target {meta.get('target')!r}), "
                f"the target has {vocab_size}; delete it or pass another --data"
            )
        off = d["offsets"].tolist()
        seqs = [d["tokens"][a:b].to(torch.int64) for a, b in itertools.pairwise(off)]
        return cls(seqs, d["prompt_lens"].tolist(), meta)


@torch.no_grad()
def generate_responses(
    model,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    batch_size: int,
    eos_token_ids: Sequence[int],
    pad_token_id: int,
    progress: bool = False,
) -> list[list[int]]:
    """The target's greedy continuation of every prompt (HF ``generate``, left-padded batches;
    each response ends at its first EOS, which it keeps)."""
    from tqdm import tqdm  # the lab extra (progress bars)
    from transformers import GenerationConfig  # heavy: transformers

    device = next(model.parameters()).device
    order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))  # similar lengths share a batch
    eos = set(eos_token_ids)
    gen = GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=list(eos_token_ids) or None,
        pad_token_id=pad_token_id,
    )
    out: list[list[int]] = [[] for _ in prompts]
    batches = [order[s : s + batch_size] for s in range(0, len(order), batch_size)]
    for batch in tqdm(batches, desc="generate", unit="batch", disable=not progress):
        width = max(len(prompts[i]) for i in batch)
        ids = torch.full((len(batch), width), pad_token_id, dtype=torch.int64)
        mask = torch.zeros_like(ids)
        for r, i in enumerate(batch):
            p = torch.as_tensor(list(prompts[i]), dtype=torch.int64)
            ids[r, width - len(p) :] = p
            mask[r, width - len(p) :] = 1
        gen_ids = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), generation_config=gen)
        for r, i in enumerate(batch):
            resp = []
            for tok in gen_ids[r, width:].tolist():
                resp.append(tok)
                if tok in eos:
                    break
            out[i] = resp
    return out


def build_data(
    model, prompts, *, max_new_tokens, batch_size, eos_token_ids, pad_token_id, meta=None, progress=False
) -> SelfDistillData:
    responses = generate_responses(
        model,
        prompts,
        max_new_tokens=max_new_tokens,
        batch_size=batch_size,
        eos_token_ids=eos_token_ids,
        pad_token_id=pad_token_id,
        progress=progress,
    )
    seqs = [torch.tensor(list(p) + r, dtype=torch.int64) for p, r in zip(prompts, responses, strict=True)]
    return SelfDistillData(seqs, [len(p) for p in prompts], dict(meta or {}))


def hot_vocabulary(
    size: int, vocab_size: int, *, freq_path: str | Path | None = None, data: SelfDistillData | None = None
) -> torch.Tensor:
    """The ``size`` most frequent target ids, ascending (EAGLE-3's convention for ``d2t``): from a
    frequency table (``sglang-specvocab build-freq``) or counted over ``data``'s responses
    (ties, and ids never seen, by lower id)."""
    if freq_path is not None:
        ids = load_frequency_ids(freq_path, vocab_size, size)
    elif data is not None:
        resp = [s[p:] for s, p in zip(data.sequences, data.prompt_lens, strict=True)]
        counts = torch.bincount(torch.cat(resp), minlength=vocab_size) if resp else torch.zeros(vocab_size)
        ids = torch.sort(-counts.to(torch.float64), stable=True).indices[:size]
    else:
        raise ValueError("hot_vocabulary needs freq_path or data")
    return ids.to(torch.int64).sort().values

"""Self-distilled training data for an EAGLE-3 draft: prompts answered greedily by the target itself.

``SelfDistillData`` holds prompt + response token ids (prompt first), saved in one ``.pt`` file
(``DATA_FORMAT``; xz-compressed when the name ends in ``.xz``, the form a GPU lease carries) so a
run reuses what an earlier one generated; ``hot_vocabulary`` picks a d2t draft's vocabulary (the
most frequent target ids). ``compute_states`` runs the target once over the data and keeps what
training needs of it (``TargetStates``: captured features, final hidden states, top-K ids), cached
in chunks; ``batch_of`` assembles a training ``Batch`` from both. ``OnlineStates`` computes the same
batches with the target at every step instead, for data whose states would not fit in memory.
"""

from __future__ import annotations

import io
import itertools
import json
import lzma
import pickle
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ...cache import weights_key
from ...errors import SpecVocabError
from ...vocab_data import load_frequency_ids
from .model import TargetTap

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
        payload = {
            "format": DATA_FORMAT,
            "tokens": torch.cat(self.sequences).to(torch.int32)
            if self.sequences
            else torch.zeros(0, dtype=torch.int32),
            "offsets": torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)]),
            "prompt_lens": torch.tensor(self.prompt_lens, dtype=torch.int64),
            "meta": json.dumps(self.meta),
        }
        if path.suffix == ".xz":
            buf = io.BytesIO()
            torch.save(payload, buf)
            tmp.write_bytes(lzma.compress(buf.getvalue(), preset=9 | lzma.PRESET_EXTREME))
        else:
            torch.save(payload, tmp)
        tmp.replace(path)  # a crash never leaves a half-written cache

    @classmethod
    def load(cls, path: str | Path, vocab_size: int | None = None) -> SelfDistillData:
        try:
            if Path(path).suffix == ".xz":
                d = torch.load(io.BytesIO(lzma.decompress(Path(path).read_bytes())), weights_only=True)
            else:
                d = torch.load(path, weights_only=True)
        except (OSError, RuntimeError, EOFError, ValueError, pickle.UnpicklingError, lzma.LZMAError) as exc:
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


@dataclass
class Batch:
    """Sequences and what the target computed on them (see :class:`TargetStates`)."""

    input_ids: torch.Tensor  # [B, T], right-padded
    lengths: torch.Tensor  # [B]
    prompt_lens: torch.Tensor  # [B]
    aux: torch.Tensor  # [B, T, k * hidden]: the captured features
    hidden: torch.Tensor  # [B, T, hidden]: the target's final normed hidden states
    topk: torch.Tensor  # [B, T, K]: the target's top-K ids over its whole vocabulary, best first

    def to(self, device) -> Batch:
        return Batch(*(getattr(self, f).to(device) for f in self.__dataclass_fields__))


@dataclass
class TargetStates:
    """What the target computes on every training sequence (cut to ``seq_len``), flat over sequences:
    the captured features (``aux``, bfloat16), its final normed hidden states (``hidden``, from which
    the teacher logits over any columns are one matmul) and its top-K ids over the whole vocabulary
    (``topk``; column 0 is its greedy choice). Computing them is most of a training run's target
    work, so they are cached and reused across runs (and by ranker/router training)."""

    aux: torch.Tensor  # [N, k * hidden]
    hidden: torch.Tensor  # [N, hidden]
    topk: torch.Tensor  # [N, K] int32
    offsets: torch.Tensor  # [S + 1] int64: sequence s is rows offsets[s]:offsets[s+1]
    meta: dict = field(default_factory=dict)

    def rows(self, i: int) -> slice:
        return slice(int(self.offsets[i]), int(self.offsets[i + 1]))

    def batch(self, data: SelfDistillData, idx: Sequence[int], pad_token_id: int = 0) -> Batch:
        return batch_of(data, self, idx, pad_token_id)


class OnlineStates:
    """The target's states computed for each batch when it is asked for, on the target's device:
    the same :class:`Batch` that ``batch_of(data, compute_states(tap, data, seq_len, topk=topk), idx)``
    gives (up to floating-point rounding of the batch shapes), without keeping the states of the
    whole data set (several KB per token: 6.4 KB for Gemma-3 270M, 84 GB for 20k conversations)."""

    def __init__(self, tap: TargetTap, seq_len: int, topk: int = 8, head_rows: int = 4096) -> None:
        self.tap, self.topk, self.head_rows = tap, topk, head_rows
        self.meta = {"seq_len": seq_len, "capture_layers": tap.layers, "capture_style": tap.style, "topk": topk}

    @torch.no_grad()
    def batch(self, data: SelfDistillData, idx: Sequence[int], pad_token_id: int = 0) -> Batch:
        head = self.tap.model.get_output_embeddings().weight
        device = head.device
        seqs = [data.sequences[i][: self.meta["seq_len"]] for i in idx]
        lens = torch.tensor([len(x) for x in seqs])
        b, t = len(seqs), int(lens.max())
        ids = torch.full((b, t), pad_token_id, dtype=torch.int64)
        for r, x in enumerate(seqs):
            ids[r, : len(x)] = x
        valid = torch.arange(t)[None, :] < lens[:, None]
        a, h = self.tap.states(ids.to(device), valid.to(device, torch.int64))
        keep = valid.to(device)[..., None]
        flat = h.reshape(b * t, -1)
        top = torch.cat([(c @ head.T).topk(self.topk, dim=-1).indices for c in flat.split(self.head_rows)])
        prompt_lens = torch.tensor([min(data.prompt_lens[i], int(n)) for i, n in zip(idx, lens, strict=True)])
        return Batch(
            ids.to(device),
            lens.to(device),
            prompt_lens.to(device),
            torch.where(keep, a.to(torch.bfloat16), 0),
            torch.where(keep, h.float(), 0),
            torch.where(keep, top.reshape(b, t, -1).to(torch.int64), 0),
        )


@torch.no_grad()
def _states_of(tap: TargetTap, seqs: list[torch.Tensor], topk: int, batch_size: int, bar) -> dict:
    """Flat states of ``seqs`` (in their order), batching similar lengths."""
    model = tap.model
    head = model.get_output_embeddings().weight
    lens = [len(x) for x in seqs]
    offsets = torch.tensor([0, *lens], dtype=torch.int64).cumsum(0)
    n, d = int(offsets[-1]), model.config.hidden_size
    aux = torch.empty(n, len(tap.layers) * d, dtype=torch.bfloat16)
    hidden = torch.empty(n, d, dtype=torch.float32)
    top = torch.empty(n, topk, dtype=torch.int32)
    order = sorted(range(len(lens)), key=lambda i: -lens[i])
    device = head.device
    for s in range(0, len(order), batch_size):
        idx = order[s : s + batch_size]
        width = lens[idx[0]]
        ids = torch.zeros(len(idx), width, dtype=torch.int64)
        mask = torch.zeros_like(ids)
        for r, i in enumerate(idx):
            ids[r, : lens[i]] = seqs[i]
            mask[r, : lens[i]] = 1
        a, h = tap.states(ids.to(device), mask.to(device))
        for r, i in enumerate(idx):
            rows = slice(int(offsets[i]), int(offsets[i + 1]))
            hr = h[r, : lens[i]]
            aux[rows] = a[r, : lens[i]].to(torch.bfloat16).cpu()
            hidden[rows] = hr.float().cpu()
            top[rows] = (
                torch.cat([(c @ head.T).topk(topk, dim=-1).indices for c in hr.split(256)]).to(torch.int32).cpu()
            )
            bar.update(lens[i])
    return {"aux": aux, "hidden": hidden, "topk": top, "lens": torch.tensor(lens)}


def compute_states(
    tap: TargetTap,
    data: SelfDistillData,
    seq_len: int,
    *,
    topk: int = 8,
    batch_size: int = 4,
    cache: str | Path | None = None,
    chunk: int = 32,
    progress: bool = False,
) -> TargetStates:
    """Run the target over every sequence of ``data`` cut to ``seq_len`` and keep its :class:`TargetStates`.

    With ``cache`` (a folder), the states are kept there in chunks of ``chunk`` sequences, each
    checked against its token ids when read: an interrupted run resumes, and a larger data set
    whose first sequences are the same (more conversations of the same source) reuses them."""
    from tqdm import tqdm  # the lab extra (progress bars)

    seqs = [x[:seq_len] for x in data.sequences]
    bar = tqdm(total=sum(map(len, seqs)), desc="target states", unit="tok", unit_scale=True, disable=not progress)
    parts = []
    for c in range(0, len(seqs), chunk):
        part = seqs[c : c + chunk]
        key = weights_key(torch.cat(part), topk=topk, layers=tap.layers, style=tap.style, seq_len=seq_len)
        path = None if cache is None else Path(cache) / f"chunk-{c // chunk:05d}.pt"
        got = None
        if path is not None and path.is_file():
            try:
                got = torch.load(path, weights_only=True)
            except (OSError, RuntimeError, EOFError, ValueError, pickle.UnpicklingError):  # damaged: recompute
                got = None
            if got is not None and got.get("key") != key:
                got = None
        if got is None:
            got = _states_of(tap, part, topk, batch_size, bar)
            if path is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_name(path.name + ".tmp")
                torch.save({**got, "key": key}, tmp)
                tmp.replace(path)
        else:
            bar.update(int(got["lens"].sum()))
        parts.append(got)
    bar.close()
    lens = torch.cat([p["lens"] for p in parts]) if parts else torch.zeros(0, dtype=torch.int64)
    d = tap.model.config.hidden_size
    meta = {"seq_len": seq_len, "capture_layers": tap.layers, "capture_style": tap.style, "topk": topk}
    return TargetStates(
        torch.cat([p["aux"] for p in parts]) if parts else torch.zeros(0, len(tap.layers) * d, dtype=torch.bfloat16),
        torch.cat([p["hidden"] for p in parts]) if parts else torch.zeros(0, d),
        torch.cat([p["topk"] for p in parts]) if parts else torch.zeros(0, topk, dtype=torch.int32),
        torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)]),
        meta,
    )


def batch_of(data: SelfDistillData, states: TargetStates, idx: Sequence[int], pad_token_id: int = 0) -> Batch:
    """The sequences ``idx`` (cut to the states' ``seq_len``), right-padded, with their target states."""
    rows = [states.rows(i) for i in idx]
    lens = [r.stop - r.start for r in rows]
    b, t = len(idx), max(lens)
    ids = torch.full((b, t), pad_token_id, dtype=torch.int64)
    aux = torch.zeros(b, t, states.aux.shape[1], dtype=states.aux.dtype)
    hidden = torch.zeros(b, t, states.hidden.shape[1], dtype=states.hidden.dtype)
    topk = torch.zeros(b, t, states.topk.shape[1], dtype=torch.int64)
    for r, (i, rr, n) in enumerate(zip(idx, rows, lens, strict=True)):
        ids[r, :n] = data.sequences[i][:n]
        aux[r, :n], hidden[r, :n], topk[r, :n] = (states.aux[rr], states.hidden[rr], states.topk[rr])
    prompt_lens = torch.tensor([min(data.prompt_lens[i], n) for i, n in zip(idx, lens, strict=True)])
    return Batch(ids, torch.tensor(lens), prompt_lens, aux, hidden, topk)

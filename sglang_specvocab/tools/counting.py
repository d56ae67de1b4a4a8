"""Counting token streams into the frequency tables and successor graphs of ``vocab_data`` (``build-freq``).

``count_tokens`` counts streams of token ids (``text_streams``: a corpus tokenized, FR-Spec; ``generated_streams``:
the target's own greedy output, VocabTrim); ``vocab_data`` writes and reads the files.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import torch

from ..errors import SpecVocabError
from .prompts import format_prompt

_FLUSH_TOKENS = 1 << 22  # token ids buffered before a counting pass: bounds memory, keeps numpy calls large


def count_tokens(
    streams: Iterable[Sequence[int] | np.ndarray], vocab_size: int, successors: int = 0
) -> tuple[np.ndarray, np.ndarray | None]:
    """Token counts [V] int64 over ``streams`` and, if ``successors`` > 0, the successor graph [V, S].

    Row t of the graph holds the S most frequent tokens that directly follow t within a stream
    (count descending, ties by lower id, -1 padded). Pairs are counted as keys ``a * V + b``
    merged by sorting, so memory grows with the distinct pairs seen, never V x V.
    """
    counts = np.zeros(vocab_size, dtype=np.int64)
    pair_keys = np.empty(0, dtype=np.int64)  # distinct pairs so far, sorted
    pair_counts = np.empty(0, dtype=np.int64)
    tokens: list[np.ndarray] = []
    pairs: list[np.ndarray] = []
    buffered = 0

    def flush() -> None:
        nonlocal pair_keys, pair_counts, buffered
        if tokens:
            counts[:] += np.bincount(np.concatenate(tokens), minlength=vocab_size)
        if pairs:
            keys = np.concatenate(pairs)
            pair_keys, pair_counts = _merge_counts(pair_keys, pair_counts, keys, np.ones(keys.size, dtype=np.int64))
        tokens.clear()
        pairs.clear()
        buffered = 0

    for stream in streams:
        ids = np.asarray(stream, dtype=np.int64)
        if ids.size == 0:
            continue
        if ids.min() < 0 or ids.max() >= vocab_size:
            bad = ids[(ids < 0) | (ids >= vocab_size)][0]
            raise SpecVocabError(f"token id {bad} is outside the vocabulary of {vocab_size} ids")
        tokens.append(ids)
        if successors > 0 and ids.size > 1:
            pairs.append(ids[:-1] * vocab_size + ids[1:])
        buffered += ids.size
        # Flushing no more often than the merged set grows keeps the repeated merges O(n log n) overall.
        if buffered >= max(_FLUSH_TOKENS, pair_keys.size):
            flush()
    flush()
    if successors <= 0:
        return counts, None
    return counts, _top_successors(pair_keys, pair_counts, vocab_size, successors)


def _merge_counts(keys_a, counts_a, keys_b, counts_b) -> tuple[np.ndarray, np.ndarray]:
    """Sorted distinct keys of both (key, count) sets, with the counts of equal keys added."""
    keys = np.concatenate([keys_a, keys_b])
    order = np.argsort(keys, kind="stable")
    keys = keys[order]
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    return keys[starts], np.add.reduceat(np.concatenate([counts_a, counts_b])[order], starts)


def _top_successors(keys: np.ndarray, counts: np.ndarray, vocab_size: int, width: int) -> np.ndarray:
    first, second = keys // vocab_size, keys % vocab_size
    order = np.lexsort((second, -counts, first))  # by first token, then count desc, then lower id
    first, second = first[order], second[order]
    starts = np.flatnonzero(np.r_[True, first[1:] != first[:-1]])
    rank = np.arange(first.size) - np.repeat(starts, np.diff(np.r_[starts, first.size]))
    keep = rank < width
    out = np.full((vocab_size, width), -1, dtype=np.int32)
    out[first[keep], rank[keep]] = second[keep]
    return out


# --- token streams to count ----------------------------------------------------------------------

TOKENIZE_BATCH = 256  # segments per tokenizer call: the Rust tokenizer parallelizes within a call


def text_streams(docs: Iterable[list[str]], tokenizer) -> Iterator[list[int]]:
    """FR-Spec's counting stream: token ids of every segment, without special tokens (only the text is counted)."""
    pending: list[str] = []
    for segments in itertools.chain(docs, [None]):
        if segments is not None:
            pending.extend(segments)
        if pending and (segments is None or len(pending) >= TOKENIZE_BATCH):
            yield from tokenizer(pending, add_special_tokens=False, verbose=False)["input_ids"]
            pending = []


def generated_streams(
    docs: Iterable[list[str]],
    loaded,
    *,
    max_new_tokens: int,
    prompt_tokens: int,
    batch_size: int,
    device: str | None = None,
) -> Iterator[list[int]]:
    """VocabTrim's counting stream: the greedy continuations by ``loaded`` (a ``models.LoadedModel``)
    of each document's first segment (cut to ``prompt_tokens``), up to and including the first EOS.
    A tokenizer with a chat template (an instruct model) gets the cut segment as a user turn, so the
    counted tokens are the model's answers, as served."""
    from transformers import GenerationConfig  # heavy: only when generating

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = loaded.model.to(device)
    eos = loaded.eos_token_ids
    pad = loaded.tokenizer.pad_token_id if loaded.tokenizer.pad_token_id is not None else eos[0]
    # A fresh config: the checkpoint's own may ask for sampling, and only greedy is reproducible.
    config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos, pad_token_id=pad)
    tokenizer = loaded.tokenizer

    def prompt_ids(text: str) -> list[int]:
        if not getattr(tokenizer, "chat_template", None):
            return loaded.encode(text)[:prompt_tokens]
        cut = tokenizer.decode(tokenizer(text, add_special_tokens=False).input_ids[:prompt_tokens])
        return loaded.encode(format_prompt(tokenizer, [cut], []))

    docs = iter(docs)
    while batch := [prompt_ids(segments[0]) for segments in itertools.islice(docs, batch_size)]:
        width = max(len(p) for p in batch)
        input_ids = torch.full((len(batch), width), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, prompt in enumerate(batch):  # left padding: every prompt ends where generation starts
            input_ids[row, width - len(prompt) :] = torch.tensor(prompt)
            mask[row, width - len(prompt) :] = 1
        with torch.no_grad():
            out = model.generate(
                input_ids=input_ids.to(device), attention_mask=mask.to(device), generation_config=config
            )
        for row in out[:, width:].tolist():
            ends = [i for i, t in enumerate(row) if t in eos]
            yield row[: ends[0] + 1] if ends else row  # what follows the EOS is padding

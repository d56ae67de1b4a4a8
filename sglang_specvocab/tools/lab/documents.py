"""Build-data's documents, shared by build-data (its counts and its ranker) and ``train-ranker --source mixed``: ShareGPT
conversations and code chunks, mixed with the target's greedy answers to requests in ten languages."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
from tqdm import tqdm

from ..counting import generated_streams
from ..prompts import LANGUAGES, format_prompt, multilingual_requests
from . import frequency

MULTILINGUAL_NEW_TOKENS = 96  # per answer to a multilingual request


@dataclass(frozen=True)
class Answered:
    """One multilingual request and the target's greedy answer: ``ids`` is the prompt as the lab and a server
    give it (the chat template, else the lab's transcript) followed by the answer, as the target saw them."""

    language: str
    request: str
    answer: str
    ids: list[int]


def multilingual_answers(
    lm, *, prompt_tokens: int, batch_size: int, device: str | None, progress: bool = True
) -> list[Answered]:
    """The target's greedy answers (at most MULTILINGUAL_NEW_TOKENS) to every request of ``multilingual_requests``."""
    tok = lm.tokenizer
    requests = list(multilingual_requests())
    prompts = [format_prompt(tok, [r], []) for _, r in requests]
    # generated_streams wraps a request in the chat template itself; a base model gets the lab's transcript here.
    chat = bool(getattr(tok, "chat_template", None))
    docs = tqdm([[r] if chat else [p] for (_, r), p in zip(requests, prompts, strict=True)], desc="answers",
                unit="request", disable=not progress)  # fmt: skip
    answers = generated_streams(docs, lm, max_new_tokens=MULTILINGUAL_NEW_TOKENS, prompt_tokens=prompt_tokens,
                                batch_size=batch_size, device=device)  # fmt: skip
    out = []
    for (language, request), prompt, answer in zip(requests, prompts, answers, strict=True):
        text = tok.decode(answer, skip_special_tokens=True)
        out.append(Answered(language, request, text, lm.encode(prompt) + list(answer)))
    tokens = sum(len(a.ids) for a in out)
    print(f"answers:         {len(out)} in {len(LANGUAGES)} languages, {tokens:,} tokens with their prompts")
    return out


def document_ids(lm, answered: list[Answered], count: int, seq_len: int, code_share: float, multilingual_share: float):
    """The first ``count`` of build-data's mixed documents (ShareGPT conversations and code chunks, and the
    multilingual ``answered``, mixed as counted) as token ids, each cut to ``seq_len``."""
    text = (lm.encode("\n".join(doc)) for doc in frequency.sharegpt_documents(code_share)[0])
    docs = frequency.mix(text, (a.ids for a in answered), multilingual_share)
    return [torch.tensor(ids[:seq_len]) for ids in itertools.islice(docs, count)]


def mixed_documents(lm, count: int, seq_len: int, code_share: float, multilingual_share: float, device=None):
    """``train-ranker --source mixed``: the documents build-data fits the shipped rankers on, the target's multilingual
    answers generated first (build-data's defaults: prompts of at most 128 tokens, batches of 16)."""
    answered = []
    if multilingual_share:
        answered = multilingual_answers(lm, prompt_tokens=128, batch_size=16, device=device)
    return document_ids(lm, answered, count, seq_len, code_share, multilingual_share)

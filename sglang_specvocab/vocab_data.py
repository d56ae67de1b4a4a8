"""Token statistics on disk: the frequency tables and successor (co-occurrence) graphs the policies read.

Counting them is a tool's job (``tools/counting.py``, ``sglang-specvocab build-freq``); this module is the format,
what a server process loads. Both files are ``.npz`` archives read with ``allow_pickle=False``:

- frequency table: ``ids`` int32 (ids with a nonzero count, most frequent first, ties by
  lower id), ``counts`` int64 aligned with ``ids``, ``vocab_size``, ``meta`` (JSON string);
- successor graph: ``rows`` int32 (tokens with at least one successor), ``table`` int32
  [len(rows), S] (their S most frequent next tokens, -1 padded), ``vocab_size``, ``meta``.

Every unusable file fails with one ``ConfigError`` naming the path and what is wrong.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np
import torch

from .cache import write_whole
from .errors import ConfigError

_BUILD_HINT = "build one with sglang-specvocab build-freq"


def save_frequency_table(path: str | Path, counts: np.ndarray, *, tokenizer: str, source: str) -> None:
    """Write the ids with a nonzero count in ``counts`` [V], most frequent first."""
    counts = np.asarray(counts, dtype=np.int64)
    if counts.ndim != 1 or (counts < 0).any():
        raise ValueError("counts must be a 1-D array of non-negative token counts")
    order = np.argsort(-counts, kind="stable")  # stable: equal counts keep the lower id first
    ids = order[counts[order] > 0]
    meta = {"tokenizer": tokenizer, "source": source, "tokens": int(counts.sum())}
    _write_npz(
        path,
        ids=ids.astype(np.int32),
        counts=counts[ids],
        vocab_size=np.int64(counts.shape[0]),
        meta=np.str_(json.dumps(meta)),
    )


def load_frequency_ids(path: str | Path, vocab_size: int, size: int, allowed: np.ndarray | None = None) -> torch.Tensor:
    """The ``size`` most frequent ids of a frequency table, int64 [size]; with ``allowed`` (bool
    ``[vocab_size]``, a d2t draft's vocabulary) the most frequent of the allowed ids."""
    data = read_npz(path, "frequency table", ("ids", "counts", "vocab_size"), vocab_size)
    ids = data["ids"]
    among = ""
    if allowed is not None:
        ids = ids[allowed[ids]]
        among = " of the draft's vocabulary"
    if size < 1:
        raise ConfigError(f"{path}: size = {size} is invalid: must be at least 1")
    if size > ids.shape[0]:
        raise ConfigError(
            f"{path}: size = {size} is larger than the {ids.shape[0]} ids{among} with a nonzero count in this "
            f"frequency table; count more text (more --text files, a larger --limit) or use a smaller size"
        )
    return torch.from_numpy(ids[:size].astype(np.int64))


def save_successors(path: str | Path, successors: np.ndarray, *, tokenizer: str, source: str) -> None:
    """Write a successor graph [V, S] (-1 padded), keeping only the rows with a successor."""
    successors = np.asarray(successors, dtype=np.int32)
    if successors.ndim != 2 or successors.shape[1] < 1:
        raise ValueError("successors must be a [vocab_size, S] array with S >= 1")
    rows = np.flatnonzero(successors[:, 0] >= 0)  # rows are filled left to right, so column 0 says it all
    meta = {"tokenizer": tokenizer, "source": source, "successors": int(successors.shape[1])}
    _write_npz(
        path,
        rows=rows.astype(np.int32),
        table=successors[rows],
        vocab_size=np.int64(successors.shape[0]),
        meta=np.str_(json.dumps(meta)),
    )


def load_successors(path: str | Path, vocab_size: int, k: int) -> torch.Tensor:
    """The ``k`` most frequent successors of every token, int32 [vocab_size, k], -1 padded."""
    data = read_npz(path, "successor graph", ("rows", "table", "vocab_size"), vocab_size)
    rows, table = data["rows"], data["table"]
    stored = table.shape[1]
    if not 1 <= k <= stored:
        raise ConfigError(
            f"{path}: k = {k} is invalid: this successor graph keeps {stored} successors per token, "
            f"so k must be in 1..{stored}"
        )
    out = np.full((vocab_size, k), -1, dtype=np.int32)
    out[rows] = table[:, :k]
    return torch.from_numpy(out)


def _write_npz(path: str | Path, **arrays: np.ndarray) -> None:
    """Write a compressed archive through a temporary file, so readers never see half a file."""

    def save(tmp: Path) -> None:
        with open(tmp, "wb") as f:  # a file object: savez would add ".npz" to a name without it
            np.savez_compressed(f, **arrays)

    write_whole(path, save)


def read_npz(path: str | Path, kind: str, required: tuple[str, ...], vocab_size: int) -> dict[str, np.ndarray]:
    """The arrays of a ``kind`` archive, checked for presence and for ``vocab_size``."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            data = {name: npz[name] for name in npz.files}
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read {kind}: {exc.strerror or exc}") from None
    except (ValueError, zipfile.BadZipFile, EOFError):
        raise ConfigError(f"{path}: not a {kind} (not a readable .npz archive); {_BUILD_HINT}") from None
    missing = [name for name in required if name not in data]
    if missing:
        raise ConfigError(f"{path}: not a {kind} (missing arrays: {', '.join(missing)}); {_BUILD_HINT}")
    built_for = int(data["vocab_size"])
    if built_for != vocab_size:
        raise ConfigError(f"{path}: {kind} built for a {built_for}-token vocabulary, the model has {vocab_size}")
    return data


def table_vocab_size(path: str | Path) -> int:
    """The vocabulary size a frequency table or successor graph was built for (when no model says)."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            return int(npz["vocab_size"])
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except (KeyError, ValueError, zipfile.BadZipFile, EOFError):
        raise ConfigError(f"{path}: not a frequency table or successor graph; {_BUILD_HINT}") from None

"""``static``: FR-Spec / VocabTrim, a fixed set of the most frequent token ids, EOS forced in.

The frequency table comes from ``sglang-specvocab build-freq``: counted over local text
(FR-Spec) or over text the target model generated (VocabTrim). Every row holds the same set
from the start; events never change it.
"""

from __future__ import annotations

from typing import ClassVar, Literal

import torch
from pydantic import Field

from ..config import PolicyConfig, Section
from ..table import CandidateTable
from ..vocab_data import load_frequency_ids, table_vocab_size
from .base import ModelContext, Policy


class StaticSection(Section):
    table: str = Field(description="a frequency table (.npz) from sglang-specvocab build-freq")
    size: int = Field(ge=1, description="how many of the most frequent ids form the set")


class StaticConfig(PolicyConfig):
    policy: Literal["static"]
    static: StaticSection

    capacity_key: ClassVar[str] = "static.size"
    file_keys: ClassVar[tuple] = (("static", "table", None, "build-freq"),)

    @property
    def table_capacity(self) -> int:
        return self.static.size


def vocab_size(model: ModelContext, table_file) -> int:
    """The model's vocabulary size, or (without a model, e.g. in replay) the one a data file was built for."""
    return model.vocab_size if model.vocab_size is not None else table_vocab_size(table_file)


def frequent_ids(config: PolicyConfig, path: str, size: int, model: ModelContext, fallback: int) -> torch.Tensor:
    """The ``size`` most frequent ids of a table, with every EOS id forced in (replacing the rarest); for
    a d2t draft (``model.space``) only ids of its vocabulary (the fallback id is one).

    One-time set-up on the host, never per step.
    """
    file = config.resolve(path)
    mask = None if model.space is None else model.space.mask
    allowed = None if mask is None else mask.cpu().numpy()  # a d2t draft's ids
    ids = load_frequency_ids(file, vocab_size(model, file), size, allowed).tolist()  # most frequent first
    eos = [e for e in model.eos_token_ids or (fallback,) if allowed is None or allowed[e]]
    eos = list(dict.fromkeys(eos or (fallback,)))[:size]
    if not set(eos) <= set(ids):
        ids = [i for i in ids if i not in eos][: size - len(eos)] + eos
    return torch.tensor(sorted(ids), dtype=torch.int64)


class StaticPolicy(Policy):
    name = "static"

    def __init__(self, config: StaticConfig, table: CandidateTable, model: ModelContext | None = None) -> None:
        super().__init__(config, table, model)
        ids = frequent_ids(config, config.static.table, config.static.size, self.model, table.fallback_id)
        self.ids = ids.to(table.device)
        self.on_reset(torch.arange(table.num_rows, device=table.device))

    def on_reset(self, rows: torch.Tensor) -> None:
        self.table.assign(rows, self.ids[None, :].expand(rows.shape[0], -1))

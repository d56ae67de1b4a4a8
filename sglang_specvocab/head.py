"""The dynamic draft head: logits over each row's candidate set, top-k as token ids.

``DraftHead(weight, table)`` computes compact logits ``[M, W]`` for M hidden rows, row m over
the set of slot ``row_to_slot[m]``; with no table (the ``full`` policy) it is the dense head
over the whole vocabulary, where a column is its token id.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import ops
from .table import CandidateTable


@dataclass
class HeadOutput:
    """Logits of one head call and how to read their columns as token ids."""

    logits: torch.Tensor  # fp32 [M, W] (compact) or [M, V] (dense); -inf past a row's count
    ids: torch.Tensor | None  # the table's ids [R, W]; None when dense
    row_to_slot: torch.Tensor | None  # int32 [M]; None when dense

    def topk(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(values ``[M, k]``, token ids int64 ``[M, k]``), best first."""
        if self.ids is None:
            return self.logits.topk(k, dim=1)
        return ops.compact_topk(self.logits, self.ids, self.row_to_slot, k)


class DraftHead:
    def __init__(self, weight: torch.Tensor, table: CandidateTable | None, *, logit_softcap: float | None = None):
        self.weight = weight
        self.table = table
        self.logit_softcap = logit_softcap

    def __call__(self, hidden: torch.Tensor, row_to_slot: torch.Tensor) -> HeadOutput:
        hidden = hidden.to(self.weight.dtype)
        if self.table is None:
            out = HeadOutput((hidden @ self.weight.T).float(), None, None)
        else:
            slot = row_to_slot.to(torch.int32)
            logits = ops.indexed_logits(hidden, self.weight, self.table.ids, self.table.cnt, slot)
            out = HeadOutput(logits, self.table.ids, slot)
        if self.logit_softcap:  # Gemma-2 style soft-capping: monotonic, so top-k is unchanged
            c = self.logit_softcap
            out.logits = torch.tanh(out.logits / c) * c
        return out

"""``window``: MicroSpec's sliding window over a candidate stream (Eq. 2-4), exact.

Per request, a stream of token ids grows by events:
- prefill: the prompt ids (repeats kept), then the distinct ids of the prompt top-K in
  position-major, rank-minor order (first occurrence kept);
- each verify round: the distinct draft-tree tokens (first occurrence order), then the
  distinct verified top-K ids (position-major, rank-minor).
The active set is the set of ids among the last ``capacity`` stream entries.

``sources`` is MicroSpec's ablation: ``context`` = the ids of the sequence being decoded
(prompt ids, draft-tree tokens), ``extension`` = the target's top-K predictions (prompt
top-K, verified top-K).

State: a ring of the last ``capacity`` stream entries per request slot and the number of
entries appended so far. An append writes each entry to slot ``(position) % capacity``,
which evicts exactly the oldest entries; the table row is then the sorted distinct ids of
the ring. Everything is batched over rows with fixed-shape tensor ops: no host sync, and
memory O(R x capacity), independent of the vocabulary size.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field, field_validator, model_validator

from .. import ops
from ..config import PolicyConfig, Section
from ..table import CandidateTable, distinct_segments, unique_first
from .base import ModelContext, Policy

Source = Literal["context", "extension"]


class WindowSection(Section):
    prefill_topk: int = Field(3, ge=0, description="K_pre: target top-K ids per prompt position")
    verify_topk: int = Field(3, ge=0, description="K_ver: target top-K ids per verified position")
    sources: list[Source] = Field(default_factory=lambda: ["context", "extension"])

    @field_validator("sources")
    @classmethod
    def _distinct_sources(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("must name at least one of 'context', 'extension'")
        if len(set(v)) != len(v):
            raise ValueError("must not repeat a source")
        return v

    @model_validator(mode="after")
    def _never_empty(self) -> WindowSection:
        if self.sources == ["extension"] and self.prefill_topk == 0:
            raise ValueError(
                "prefill_topk = 0 is invalid with sources = ['extension']: must be >= 1, "
                "or the set is empty after prefill"
            )
        if "extension" not in self.sources:  # a top-K nobody reads: refused, not silently ignored
            for key in ("prefill_topk", "verify_topk"):
                if key in self.model_fields_set and getattr(self, key) > 0:
                    raise ValueError(
                        f"window.{key} = {getattr(self, key)} is invalid with sources = {self.sources}: only the "
                        "'extension' source reads the target's top-K; add 'extension', or drop the key"
                    )
        return self


class WindowConfig(PolicyConfig):
    policy: Literal["window"]
    capacity: int = Field(ge=1, description="W_max, the most ids in a request's set; an integer >= 1")
    window: WindowSection = Field(default_factory=WindowSection)


class WindowPolicy(Policy):
    name = "window"
    fused_verify = True

    def __init__(self, config: WindowConfig, table: CandidateTable, model: ModelContext | None = None) -> None:
        super().__init__(config, table, model)
        cap = config.capacity
        if table.capacity != cap:
            raise ValueError(f"window policy: table capacity {table.capacity} != config capacity {cap}")
        self.capacity = cap
        w = config.window
        self.use_context = "context" in w.sources
        self.use_extension = "extension" in w.sources
        # Column ``cap`` is scratch (the torch reference's sink for entries an append does not keep).
        self.ring = torch.full((table.num_rows, cap + 1), -1, dtype=torch.int32, device=table.device)
        self.length = torch.zeros(table.num_rows, dtype=torch.int64, device=table.device)
        # Ids at or past the vocabulary are holes; without a model any int32 id is one.
        self.vocab_size = self.model.vocab_size or 2**31 - 1
        # Chosen once (an unavailable choice fails here), never per event.
        self._window_update = ops.implementation(
            ops.backend_without_triton(config.head.kernel), table.device, "window_update"
        )
        self._window_verify = ops.implementation(
            ops.backend_without_triton(config.head.kernel), table.device, "window_verify"
        )
        self._no_telemetry: torch.Tensor | None = None  # window_verify's accumulators when the caller keeps none

    @property
    def prefill_topk(self) -> int:
        return self.config.window.prefill_topk if self.use_extension else 0

    @property
    def verify_topk(self) -> int:
        return self.config.window.verify_topk if self.use_extension else 0

    # -- events ------------------------------------------------------------------------------

    def on_reset(self, rows: torch.Tensor) -> None:
        self.length.index_fill_(0, rows, 0)
        self.ring.index_fill_(0, rows, -1)
        self.table.reset(rows)

    def on_prefill(self, rows: torch.Tensor, prompt_ids: torch.Tensor, prompt_topk: torch.Tensor | None) -> None:
        blocks = []
        if self.use_context:
            blocks.append(prompt_ids)
        if self.prefill_topk:
            blocks.append(self._topk_block(prompt_topk, self.prefill_topk, "prompt_topk"))
        self._update(rows, blocks)

    def on_verify(
        self,
        rows: torch.Tensor,
        draft_tokens: torch.Tensor,
        verify_topk: torch.Tensor | None,
        accepted: torch.Tensor,
    ) -> None:
        segments = []
        if self.use_context:
            segments.append(draft_tokens)
        if self.verify_topk:
            segments.append(self._topk_block(verify_topk, self.verify_topk, "verify_topk", distinct=False))
        if not segments:
            return self._update(rows, [])
        # A round's entries are few: repeats become holes in one pass (no sort), which the update skips.
        self._update(rows, [distinct_segments(segments)])

    def on_verify_round(
        self,
        rows: torch.Tensor,
        draft_token: torch.Tensor,
        accept_index: torch.Tensor,
        accept_lens: torch.Tensor,
        predict: torch.Tensor,
        logits: torch.Tensor | None,
        *,
        compacted: bool,
        vocab_size: int,
        acc: torch.Tensor | None = None,
        hot: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """A whole verify round from SGLang's verify tensors in two ops (the target's top-k, then
        ``window_verify``): the same sets, ring and telemetry as ``verify_event`` + ``record_verify`` +
        ``on_verify`` (tested), for the eager verify hook's host time. ``acc``: telemetry ``[4, R]``
        accumulators (``Telemetry.acc``) or None; ``hot``: the draft vocabulary mask of a d2t draft.
        Returns the committed tokens ``[B, S]``."""
        k = self.verify_topk
        if k:
            if logits is None:
                raise ValueError("window policy: verify logits are required when verify_topk > 0")
            vocab = min(vocab_size, logits.shape[-1])
            values, top = logits[:, :vocab].topk(min(k, vocab), dim=-1)
        else:
            values = predict.new_empty((predict.shape[0], 0), dtype=torch.float32)
            top = predict.new_empty((predict.shape[0], 0), dtype=torch.int64)
        if acc is None:
            if self._no_telemetry is None:
                self._no_telemetry = torch.zeros(4, self.table.num_rows, dtype=torch.float64, device=self.table.device)
            acc = self._no_telemetry
        t = self.table
        return self._window_verify(
            ops.WindowRound(
                ring=self.ring,
                length=self.length,
                ids=t.ids,
                cnt=t.cnt,
                acc=acc,
                rows=rows,
                draft_token=draft_token,
                accept_index=accept_index,
                accept_lens=accept_lens,
                predict=predict,
                topk_values=values,
                topk_ids=top,
                hot=hot,
                k=k,
                context=self.use_context,
                compacted=compacted,
                fallback_id=t.fallback_id,
                vocab_size=self.vocab_size,
            )
        )

    # -- internals ---------------------------------------------------------------------------

    @staticmethod
    def _topk_block(topk: torch.Tensor | None, k: int, what: str, distinct: bool = True) -> torch.Tensor:
        if topk is None or topk.dim() != 3 or topk.shape[2] < k:
            got = None if topk is None else tuple(topk.shape)
            raise ValueError(f"window policy: {what} must have shape [B, positions, >= {k}], got {got}")
        block = topk[:, :, :k].reshape(topk.shape[0], -1)  # position-major, rank-minor
        return unique_first(block) if distinct else block

    def _update(self, rows: torch.Tensor, blocks: list[torch.Tensor]) -> None:
        """Append the blocks' entries (holes skipped) to the rows' streams, in order, and publish the sets."""
        block = torch.cat([b.to(torch.int32) for b in blocks], dim=1) if blocks else self._no_entries(rows)
        t = self.table
        self._window_update(self.ring, self.length, t.ids, t.cnt, rows, block, t.fallback_id, self.vocab_size)

    def _no_entries(self, rows: torch.Tensor) -> torch.Tensor:
        return torch.empty((rows.shape[0], 0), dtype=torch.int32, device=rows.device)

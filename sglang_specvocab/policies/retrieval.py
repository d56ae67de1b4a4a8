"""``retrieval``: EvoSpec, a static core plus a dynamic part grown by retrieval, ARC-evicted.

A request's set = a static core (the ``static_size`` most frequent ids of a frequency table,
EOS forced in) plus at most ``dynamic_size`` ids held by an Adaptive Replacement Cache.
After each verify, for every committed token, in order:
- in the core: nothing;
- in the dynamic part: a cache hit (ARC promotes it);
- outside the set (a miss, EvoSpec's trigger): the token itself, its ``neighbours`` nearest
  LM-head rows to the target hidden state that produced it, and its ``successors`` in a token
  co-occurrence graph are referenced in the cache, in that order (core ids skipped).

Nearest rows by maximum inner product to the target hidden state h are exactly the top ids of
the target's logits ``W h`` (EAGLE drafts share the target's LM head), which verification has
already computed: the policy takes them from ``verify_topk``, an exact search at no extra cost,
so no approximate index (HNSW) is needed. The co-occurrence graph comes from
``sglang-specvocab build-freq --cooccurrence``.

``align:`` (opt-in) adds EvoSpec's online LoRA alignment of the draft (``tools/lab/align.py``); the
reference decoder runs it.
"""

from __future__ import annotations

from typing import ClassVar, Literal

import torch
from pydantic import Field, model_validator

from ..config import PolicyConfig, Section
from ..table import CandidateTable, unique_first
from ..vocab_data import load_successors
from .arc import BatchedARC
from .base import ModelContext, Policy
from .static import frequent_ids, vocab_size


class RetrievalSection(Section):
    table: str = Field(description="frequency table (.npz) of the static core, from sglang-specvocab build-freq")
    static_size: int = Field(ge=1, description="ids in the static core (EvoSpec: 32k)")
    dynamic_size: int = Field(ge=1, description="the most retrieved ids a request keeps (EvoSpec: 256-1024)")
    neighbours: int = Field(8, ge=0, description="nearest LM-head rows to the target hidden state per miss")
    graph: str | None = Field(None, description="co-occurrence successor graph (.npz); null: no successors")
    successors: int = Field(4, ge=0, description="co-occurrence successors per miss")

    @model_validator(mode="after")
    def _successors_need_graph(self) -> RetrievalSection:
        # a set key that would be ignored is refused, not silently dropped
        if self.graph is None and "successors" in self.model_fields_set and self.successors > 0:
            raise ValueError(
                f"retrieval.successors = {self.successors} is invalid without retrieval.graph: successors come "
                "from the co-occurrence graph; set retrieval.graph, or drop retrieval.successors"
            )
        return self


class AlignSection(Section):
    """EvoSpec's online LoRA alignment of the draft (run by the reference decoder, ``tools/lab/align.py``)."""

    rank: int = Field(8, ge=1, description="LoRA rank")
    alpha: float = Field(16.0, gt=0, description="LoRA scale numerator (the update is scaled by alpha / rank)")
    lr: float = Field(1e-4, gt=0, description="Adam learning rate")


class RetrievalConfig(PolicyConfig):
    policy: Literal["retrieval"]
    retrieval: RetrievalSection
    align: AlignSection | None = Field(None, description="EvoSpec's online LoRA alignment of the draft (opt-in)")

    capacity_key: ClassVar[str] = "retrieval.static_size + retrieval.dynamic_size"
    file_keys: ClassVar[tuple] = (
        ("retrieval", "table", None, "build-freq"),
        ("retrieval", "graph", None, "build-freq"),
    )

    @property
    def table_capacity(self) -> int:
        return self.retrieval.static_size + self.retrieval.dynamic_size


class RetrievalPolicy(Policy):
    name = "retrieval"

    def __init__(self, config: RetrievalConfig, table: CandidateTable, model: ModelContext | None = None) -> None:
        super().__init__(config, table, model)
        c = config.retrieval
        dev = table.device
        self.core = frequent_ids(config, c.table, c.static_size, self.model, table.fallback_id).to(dev)
        vocab = vocab_size(self.model, config.resolve(c.table))
        self.in_core = torch.zeros(vocab, dtype=torch.bool, device=dev)
        self.in_core[self.core] = True
        self.successors = None
        if c.graph is not None and c.successors > 0:
            succ = load_successors(config.resolve(c.graph), vocab, c.successors).to(dev)
            self.successors = torch.where(self.model.in_draft_vocab(succ), succ, -1)  # holes: no d2t head row
        self.cache = BatchedARC(table.num_rows, c.dynamic_size, device=dev)
        self.neighbours = c.neighbours
        self.on_reset(torch.arange(table.num_rows, device=dev))

    @property
    def verify_topk(self) -> int:
        return self.neighbours

    def on_reset(self, rows: torch.Tensor) -> None:
        self.cache.reset(rows)
        self._publish(rows)

    def on_verify(self, rows, draft_tokens, verify_topk, accepted) -> None:
        self.cache.access(rows, self.references(rows, verify_topk, accepted))
        self._publish(rows)

    def references(self, rows: torch.Tensor, verify_topk: torch.Tensor | None, accepted: torch.Tensor) -> torch.Tensor:
        """The round's cache references ``[B, A * (1 + neighbours + successors)]`` in order, -1 = none."""
        tok = accepted.long()
        live = tok >= 0
        safe = tok.clamp(min=0)
        miss = live & ~self.table.contains(rows, tok)
        parts = [torch.where(live, tok, -1)[:, :, None]]  # hits and misses reference the token itself
        if self.neighbours:
            near = verify_topk[:, :, : self.neighbours].long()
            if near.shape[1] < tok.shape[1]:  # positions without a verified top-K have no neighbours
                near = torch.nn.functional.pad(near, (0, 0, 0, tok.shape[1] - near.shape[1]), value=-1)
            near = near[:, : tok.shape[1]]
            parts.append(torch.where(miss[:, :, None], near, -1))
        if self.successors is not None:
            parts.append(torch.where(miss[:, :, None], self.successors[safe].long(), -1))
        refs = torch.cat(parts, dim=2)
        refs = torch.where((refs >= 0) & ~self.in_core[refs.clamp(min=0)], refs, -1)  # the core is never cached
        b, a, n = refs.shape
        return unique_first(refs.reshape(b * a, n)).reshape(b, a * n)  # one reference per id per miss

    def _publish(self, rows: torch.Tensor) -> None:
        core = self.core[None, :].expand(rows.shape[0], -1)
        self.table.assign(rows, torch.cat([core, self.cache.members(rows)], dim=1))

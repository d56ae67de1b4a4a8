"""The draft vocabulary: which target ids the draft head can score, through which of its rows, on which rank.

One ``VocabSpace`` is built once at start-up (by the server's worker, the lab or a bench) and handed whole to the
head, the policies and the lab; nothing else builds a d2t mask, checks the fallback id or maps ids to head rows.

- ``size`` (V): the target's id space. Table ids, events and outputs are always target ids.
- ``head_ids``: int64 ``[H]``, the target id of each draft head row (a d2t draft: SGLang's ``hot_token_id``);
  None for a full-vocabulary head, whose row i is id i.
- ``mask``: bool ``[V]``, the ids that have a head row (None: every id in ``[0, V)``).
- ``shard``: the global head rows ``[start, end)`` this tensor-parallel rank holds (None: all, one rank);
  ``row_map``: int32 ``[V]``, the local head row of each id, -1 where this rank (or the draft) has none; None for
  the identity (full vocabulary, one rank).
- ``fallback_id``: the token of an entry with no live column (a set's filler, an empty row's top-k): the first EOS
  id the draft can score, else the draft's first id; always inside the draft vocabulary (checked here, once).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from .ops.topk import head_row_map


@dataclass(frozen=True, eq=False)
class VocabSpace:
    size: int
    head_ids: torch.Tensor | None = None
    shard: tuple[int, int] | None = None
    tp_size: int = 1
    fallback_id: int = 0
    mask: torch.Tensor | None = field(default=None, repr=False)
    row_map: torch.Tensor | None = field(default=None, repr=False)

    @classmethod
    def build(
        cls,
        size: int,
        *,
        head_ids: torch.Tensor | Sequence[int] | None = None,
        shard: tuple[int, int] | None = None,
        tp_size: int = 1,
        eos_token_ids: Sequence[int] = (),
        fallback_id: int | None = None,
        device: torch.device | str | None = None,
    ) -> VocabSpace:
        """The space of a draft over ``size`` target ids. ``head_ids``: a d2t draft's map (distinct ids in
        ``[0, size)``); ``shard``/``tp_size``: this rank's head rows; ``fallback_id``: given, or chosen from
        ``eos_token_ids`` (the smallest the draft can score) and else the draft's first id. Raises ``ValueError`` on
        a bad map, shard or fallback."""
        size = int(size)
        if size < 1:
            raise ValueError(f"VocabSpace: size = {size} must be at least 1")
        if tp_size < 1 or (tp_size > 1 and shard is None):
            raise ValueError(f"VocabSpace: tp_size = {tp_size} needs this rank's shard (got {shard})")
        mask = None
        if head_ids is not None:
            head_ids = torch.as_tensor(head_ids, dtype=torch.long, device=device).flatten()
            if head_ids.numel() == 0:
                raise ValueError("VocabSpace: a d2t draft's head_ids is empty")
            mask = torch.zeros(size, dtype=torch.bool, device=head_ids.device)
            mask[head_ids.clamp(0, size - 1)] = True
        # checks the map (ids in range, distinct) and maps ids to this rank's rows, once
        row_map = head_row_map(size, hot_token_id=head_ids, shard=shard, device=device)
        if fallback_id is None:
            # start-up only: host reads of the map
            hot = None if head_ids is None else set(head_ids.tolist())
            live = [e for e in sorted(int(t) for t in eos_token_ids) if 0 <= e < size and (hot is None or e in hot)]
            fallback_id = live[0] if live else (0 if head_ids is None else int(head_ids[0]))
        space = cls(size, head_ids, shard, tp_size, int(fallback_id), mask, row_map)
        space.check_fallback(space.fallback_id, "VocabSpace")
        return space

    def check_fallback(self, fallback_id: int, who: str) -> None:
        """Refuse a fallback id the draft cannot score (a table's filler must be a token of the draft's head): the
        one check, run where a table meets a space (start-up only: a host read)."""
        if not (0 <= fallback_id < self.size) or (self.mask is not None and not bool(self.mask[fallback_id])):
            raise ValueError(f"{who}: fallback_id {fallback_id} is not in the draft vocabulary ({self.describe()})")

    @property
    def d2t(self) -> bool:
        """True for a reduced-vocabulary (d2t) draft."""
        return self.head_ids is not None

    @property
    def head_rows(self) -> int:
        """H, the draft head's real rows over all ranks (SGLang pads its weight past them)."""
        return self.size if self.head_ids is None else int(self.head_ids.numel())

    def contains(self, ids: torch.Tensor) -> torch.Tensor:
        """Whether each id (any shape; negative: none) is a target id the draft head can score."""
        ok = (ids >= 0) & (ids < self.size)
        if self.mask is None:
            return ok
        return ok & self.mask.to(ids.device)[ids.long().clamp(0, self.size - 1)]

    def row_ids(self, rows: torch.Tensor) -> torch.Tensor:
        """The target ids of draft head rows ``rows`` (any shape; a d2t draft's map, else the rows themselves)."""
        return rows if self.head_ids is None else self.head_ids.to(rows.device)[rows]

    def on(self, device: torch.device | str) -> VocabSpace:
        """The same space with its tensors on ``device``."""

        def move(t):
            return None if t is None else t.to(device)

        return VocabSpace(
            self.size,
            move(self.head_ids),
            self.shard,
            self.tp_size,
            self.fallback_id,
            move(self.mask),
            move(self.row_map),
        )

    def describe(self) -> str:
        """One line for logs and errors."""
        kind = f"d2t draft of {self.head_rows} ids" if self.d2t else "full-vocabulary draft"
        rank = f", rows {self.shard[0]}..{self.shard[1]} of tp {self.tp_size}" if self.shard else ""
        return f"{kind} over {self.size} target ids{rank}, fallback {self.fallback_id}"


__all__ = ["VocabSpace"]

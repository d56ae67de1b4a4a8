"""``union``: any member policies, each with its own budget (its capacity), in one set.

A request's set is the distinct ids of its members' sets; when they exceed ``capacity``, the
members listed first keep theirs (all of member 1, then member 2's new ids, ...). Members get
every event; if any member is a ranker (``stepwise``), the union is rebuilt at every draft step.
The registry parses the members (``finish``) and builds their policies (``build_policy``).
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import Field, PrivateAttr

from ..config import ParseConfig, PolicyConfig
from ..errors import ConfigError
from ..table import CandidateTable, unique_first
from .base import ModelContext, Policy


class UnionConfig(PolicyConfig):
    policy: Literal["union"]
    capacity: int | None = Field(None, ge=1, description="the most ids in the union (default: the sum of the budgets)")
    members: list[dict[str, Any]] = Field(min_length=1, description="member policy configs, each with its budget")
    _members: list[PolicyConfig] = PrivateAttr(default_factory=list)

    def finish(self, parse: ParseConfig) -> None:
        self._members = []
        for i, m in enumerate(self.members):
            where = f"{self.source} members[{i}]"
            cfg = parse(m, where)
            for key in ("head", "prefill_chunk"):  # the union's own keys rule: a member's would be ignored
                if key in cfg.model_fields_set:
                    raise ConfigError(
                        f"{where}: {key} = {m[key]!r} is invalid in a member: the union's top-level {key} applies "
                        "to every member; move it to the top level"
                    )
            if cfg.table_capacity is None or cfg.policy == "union":
                raise ConfigError(f"{where}: policy = {cfg.policy!r} is invalid: a member must be a set policy")
            cfg._base = self._base or self.source  # relative paths resolve from the union's file
            self._members.append(cfg)

    @property
    def member_configs(self) -> list[PolicyConfig]:
        return self._members

    @property
    def table_capacity(self) -> int:
        return self.capacity if self.capacity is not None else sum(c.table_capacity for c in self._members)


class UnionPolicy(Policy):
    name = "union"

    def __init__(
        self, config: UnionConfig, table: CandidateTable, model: ModelContext | None, members: list[Policy]
    ) -> None:
        super().__init__(config, table, model)
        self.members = members  # one per member config, each with its own table of the same rows
        self.stepwise = any(m.stepwise for m in self.members)
        # the lab reports (and warns about) a member's trained file as the union's own
        self.trained = next((m.trained for m in self.members if m.trained is not None), None)
        self.check_head_mode()
        self._publish(torch.arange(table.num_rows, device=table.device))

    @property
    def prefill_topk(self) -> int:
        return max(m.prefill_topk for m in self.members)

    @property
    def verify_topk(self) -> int:
        return max(m.verify_topk for m in self.members)

    def selection_reads(self) -> int:
        return sum(m.selection_reads() for m in self.members)

    def on_reset(self, rows: torch.Tensor) -> None:
        for m in self.members:
            m.on_reset(rows)
        self._publish(rows)

    def on_prefill(self, rows, prompt_ids, prompt_topk) -> None:
        for m in self.members:
            m.on_prefill(rows, prompt_ids, None if prompt_topk is None else prompt_topk[:, :, : m.prefill_topk])
        self._publish(rows)

    def on_verify(self, rows, draft_tokens, verify_topk, accepted) -> None:
        for m in self.members:
            m.on_verify(
                rows, draft_tokens, None if verify_topk is None else verify_topk[:, :, : m.verify_topk], accepted
            )
        self._publish(rows)

    def select(self, rows, step, hidden, tokens) -> None:
        for m in self.members:
            if m.stepwise:
                m.select(rows, step, hidden, tokens)
        self._publish(rows)

    def _publish(self, rows: torch.Tensor) -> None:
        parts = []
        for m in self.members:
            t = m.table
            ids = t.ids.index_select(0, rows).long()
            live = torch.arange(t.capacity, device=ids.device)[None, :] < t.cnt.index_select(0, rows)[:, None]
            parts.append(torch.where(live, ids, -1))
        merged = unique_first(torch.cat(parts, dim=1))[:, : self.table.capacity]
        self.table.assign(rows, merged)

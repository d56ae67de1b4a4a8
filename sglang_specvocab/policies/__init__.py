"""Candidate-set policies, one module each, chosen by the ``policy:`` key of a config."""

from __future__ import annotations

from typing import NamedTuple

from ..config import PolicyConfig
from ..table import CandidateTable
from .base import ModelContext, Policy
from .cluster import ClusterConfig, ClusterPolicy
from .full import FullConfig, FullPolicy
from .lowrank import LowRankConfig, LowRankPolicy
from .retrieval import RetrievalConfig, RetrievalPolicy
from .static import StaticConfig, StaticPolicy
from .union import UnionConfig, UnionPolicy
from .window import WindowConfig, WindowPolicy


class PolicyEntry(NamedTuple):
    config_cls: type[PolicyConfig]
    policy_cls: type[Policy]


POLICIES: dict[str, PolicyEntry] = {
    "full": PolicyEntry(FullConfig, FullPolicy),
    "window": PolicyEntry(WindowConfig, WindowPolicy),
    "static": PolicyEntry(StaticConfig, StaticPolicy),
    "lowrank": PolicyEntry(LowRankConfig, LowRankPolicy),
    "cluster": PolicyEntry(ClusterConfig, ClusterPolicy),
    "retrieval": PolicyEntry(RetrievalConfig, RetrievalPolicy),
    "union": PolicyEntry(UnionConfig, UnionPolicy),
}


def build_policy(
    config: PolicyConfig,
    num_rows: int,
    *,
    device=None,
    fallback_id: int = 0,
    model: ModelContext | None = None,
) -> Policy:
    """The policy of ``config`` with its own table of ``num_rows`` request slots (None if dense).

    ``model`` gives what ranker and file-based policies need (LM head, embeddings, vocabulary
    size, EOS ids); policies that need a missing part say so.
    """
    entry = POLICIES[config.policy]
    cap = config.table_capacity
    table = None if cap is None else CandidateTable(num_rows, cap, device=device, fallback_id=fallback_id)
    return entry.policy_cls(config, table, model)


__all__ = ["POLICIES", "ModelContext", "Policy", "PolicyEntry", "build_policy"]

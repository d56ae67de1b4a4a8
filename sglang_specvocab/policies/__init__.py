"""Candidate-set policies, one module each, chosen by the ``policy:`` key of a config."""

from __future__ import annotations

from typing import NamedTuple

from ..config import PolicyConfig
from ..table import CandidateTable
from .base import Policy
from .full import FullConfig, FullPolicy
from .window import WindowConfig, WindowPolicy


class PolicyEntry(NamedTuple):
    config_cls: type[PolicyConfig]
    policy_cls: type[Policy]


POLICIES: dict[str, PolicyEntry] = {
    "full": PolicyEntry(FullConfig, FullPolicy),
    "window": PolicyEntry(WindowConfig, WindowPolicy),
}


def build_policy(
    config: PolicyConfig,
    num_rows: int,
    *,
    device=None,
    fallback_id: int = 0,
) -> Policy:
    """The policy of ``config`` with its own table of ``num_rows`` request slots (None if dense)."""
    entry = POLICIES[config.policy]
    cap = config.table_capacity
    table = None if cap is None else CandidateTable(num_rows, cap, device=device, fallback_id=fallback_id)
    return entry.policy_cls(config, table)


__all__ = ["POLICIES", "Policy", "PolicyEntry", "build_policy"]

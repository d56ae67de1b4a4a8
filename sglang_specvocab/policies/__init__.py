"""Candidate-set policies, one module each, and the registry that picks one by a config's ``policy:`` key.

``load_config(path)`` / ``parse_config(data, source)`` read and validate a policy config (every
error a ``ConfigError`` naming file, key, value and what is valid); ``build_policy(config, rows)``
makes the policy with its own candidate table. Every policy module imports only ``base`` and the
core (``config``, ``table``, ``ops``, ``vocab_data``), never this registry.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import yaml
from pydantic import ValidationError

from ..config import PolicyConfig, explain, short
from ..errors import ConfigError
from ..table import CandidateTable
from .base import DraftVocabPolicy, ModelContext, Policy
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


def policy_names() -> list[str]:
    return sorted(POLICIES)


def load_config(path: str | Path) -> PolicyConfig:
    """Read and validate a policy YAML file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(f"cannot read config file {path}: {reason}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{path}: not valid YAML{where}: {problem}") from None
    return parse_config(data, source=str(path))


def parse_config(data: Any, source: str = "<config>") -> PolicyConfig:
    """Validate an already-parsed mapping (what ``yaml.safe_load`` returns)."""
    valid = ", ".join(sorted(POLICIES))
    if data is None:
        raise ConfigError(f"{source}: is empty; it must be a YAML mapping with at least 'policy' (one of: {valid})")
    if not isinstance(data, dict):
        raise ConfigError(
            f"{source}: must be a YAML mapping of keys to values, got {type(data).__name__} {short(data)}"
        )
    _refuse_cycle(data, source)
    if "policy" not in data:
        raise ConfigError(f"{source}: missing required key 'policy' (one of: {valid})")
    name = data["policy"]
    if not isinstance(name, str) or name not in POLICIES:
        raise ConfigError(f"{source}: policy = {short(name)} is invalid: must be one of {valid}")
    cls = POLICIES[name].config_cls
    try:
        cfg = cls.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(explain(exc, cls, source, name)) from None
    cfg._source = source
    cfg.finish(parse_config)
    cfg.check_head()
    return cfg


def _refuse_cycle(data: Any, source: str) -> None:
    """Refuse a mapping or list that contains itself: a YAML alias inside its own anchor (``&a`` ... ``*a``)
    loads as a cyclic structure, which parsing (a union's members) would follow until Python's recursion
    limit. The error names the cycle as key paths, enclosing first."""
    enclosing: dict[int, str] = {}  # id of each container on the current path -> its key path
    done: set[int] = set()  # containers walked whole: shared (aliased) but acyclic, not walked again

    def walk(node: Any, path: str) -> None:
        if not isinstance(node, (dict, list)) or id(node) in done:
            return
        if id(node) in enclosing:
            outer = enclosing[id(node)] or "top level"
            kind = "mapping" if isinstance(node, dict) else "list"
            raise ConfigError(
                f"{source}: {path} is invalid: it is a YAML alias of the {kind} at {outer}, which encloses it, so "
                f"the config contains itself (cycle: {outer} -> {path} -> {outer}); write the nested config out "
                "instead of aliasing an anchor it is inside"
            )
        enclosing[id(node)] = path
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, f"{path}.{key}" if path else str(key))
        else:
            for i, value in enumerate(node):
                walk(value, f"{path}[{i}]")
        del enclosing[id(node)]
        done.add(id(node))

    walk(data, "")


def build_policy(
    config: PolicyConfig,
    num_rows: int,
    *,
    device=None,
    fallback_id: int | None = None,
    model: ModelContext | None = None,
) -> Policy:
    """The policy of ``config`` with its own table of ``num_rows`` request slots (None if dense).

    ``model`` gives what ranker and file-based policies need (LM head, embeddings, the vocabulary space, EOS ids);
    policies that need a missing part say so. A composite policy (``union``) gets its member policies, built here
    first, each with its own table. ``fallback_id``: the token of an empty set (default: the space's, else 0); it must
    be in the draft vocabulary. Over a d2t draft's space the policy is wrapped in ``DraftVocabPolicy`` (events cut to
    the draft vocabulary).
    """
    space = None if model is None else model.space
    if fallback_id is None:
        fallback_id = 0 if space is None else space.fallback_id
    elif space is not None:
        space.check_fallback(fallback_id, "build_policy")
    policy = _build(config, num_rows, device, fallback_id, model)
    return DraftVocabPolicy(policy) if space is not None and space.d2t else policy


def _build(config: PolicyConfig, num_rows: int, device, fallback_id: int, model: ModelContext | None) -> Policy:
    cap = config.table_capacity
    table = None if cap is None else CandidateTable(num_rows, cap, device=device, fallback_id=fallback_id)
    policy_cls = POLICIES[config.policy].policy_cls
    if config.member_configs:
        members = [_build(c, num_rows, device, fallback_id, model) for c in config.member_configs]
        return policy_cls(config, table, model, members)
    return policy_cls(config, table, model)


__all__ = [
    "POLICIES",
    "DraftVocabPolicy",
    "ModelContext",
    "Policy",
    "PolicyEntry",
    "build_policy",
    "load_config",
    "parse_config",
    "policy_names",
]

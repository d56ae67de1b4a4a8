"""The config schema's bases: every policy module defines its config as a ``PolicyConfig`` subclass.

Every bad input fails with one ``ConfigError`` whose message names the file, the key, the value
and what would be valid (``explain`` turns pydantic's errors into those lines). Reading and
dispatching a YAML file by its ``policy:`` key is ``sglang_specvocab.policies.load_config``; this
module imports no policy.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, Literal, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

from .errors import ConfigError


class Section(BaseModel):
    """Base of every config block: unknown keys and loose types (bool for int, "3" for 3) are errors."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


#: The union head's default columns, as a multiple of the set capacity (see ``default_union_columns``).
UNION_CAPACITY_FACTOR = 16

# The head section's allowed values, declared once: the schema below, ``head.DraftHead``'s checks, ``ops`` and the
# CLI read them.
HeadKernel = Literal["auto", "cuda", "triton", "torch"]
HeadMode = Literal["fused", "packed"]
HeadBatch = Literal["auto", "per-request", "union", "stock"]
UnionView = Literal["own", "all"]
KERNELS: tuple[str, ...] = get_args(HeadKernel)
HEAD_MODES: tuple[str, ...] = get_args(HeadMode)
BATCH_MODES: tuple[str, ...] = get_args(HeadBatch)
UNION_VIEWS: tuple[str, ...] = get_args(UnionView)


class HeadSection(Section):
    """How the draft head computes logits over the sets (every policy accepts a ``head:`` block)."""

    kernel: HeadKernel = Field(
        "auto", description="auto: CUDA extension on a GPU when built, else Triton on a GPU, else torch"
    )
    mode: HeadMode = Field(
        "fused",
        description="fused: gather each request's rows in the head kernel; packed: keep them in a per-request "
        "buffer updated after each set change (context policies only; the lab's MicroSpec ablation, refused by "
        "the server)",
    )
    batch: HeadBatch = Field(
        "auto",
        description="how a batch is scored: per-request (each request over its own set), union (the batch's "
        "deduplicated union in one pass), stock (the draft's own dense head, as EAGLE3), auto (per batch size, "
        "the cheapest of them by the cost model)",
    )
    union_capacity: int | None = Field(
        None,
        ge=1,
        description="columns of the union head, fixed at start-up (default: 16 x capacity, at most the draft "
        "head's rows); ids past it are dropped from that call's union, highest ids first",
    )
    union_view: UnionView = Field(
        "own",
        description="union head: own (each row scores only its own request's set, as per-request) or all (every "
        "row sees the whole union)",
    )


def default_union_columns(capacity: int, head_rows: int) -> int:
    """Columns of the union head when ``head.union_capacity`` is unset: ``UNION_CAPACITY_FACTOR`` sets of
    ``capacity`` ids, at most the draft head's ``head_rows`` rows, at least one set."""
    return max(capacity, min(UNION_CAPACITY_FACTOR * capacity, head_rows))


#: ``parse_config(data, source)``, handed to ``PolicyConfig.finish`` (so this module needs no policy).
ParseConfig = Callable[[Any, str], "PolicyConfig"]


class PolicyConfig(Section):
    """Top level of a policy YAML. Subclasses add ``capacity`` and their own section."""

    policy: str
    head: HeadSection = Field(default_factory=HeadSection)
    prefill_chunk: int = Field(
        1024,
        ge=1,
        le=65536,
        description="prompt positions per step of the target's prefill top-K (at most a [chunk, V] logits "
        "tensor at a time); an integer in [1, 65536]",
    )
    _source: str = PrivateAttr(default="<config>")
    _base: str | None = PrivateAttr(default=None)  # the file relative paths start from (members of a union)

    @property
    def source(self) -> str:
        """The file (or description) this config came from, for error messages."""
        return self._source

    @property
    def table_capacity(self) -> int | None:
        """Width W of the candidate table, or None for policies that use the dense head."""
        return getattr(self, "capacity", None)

    def resolve(self, path: str) -> Path:
        """A path from this config: relative paths are relative to the config file's folder."""
        p = Path(path).expanduser()
        src = Path(self._base or self.source)
        return p if p.is_absolute() or not src.is_file() else src.parent / p

    def finish(self, parse: ParseConfig) -> None:
        """Checks that need ``source`` (called by ``parse_config`` after validation); ``parse`` parses a
        nested policy config (a union's members) as ``parse_config`` does."""

    @property
    def member_configs(self) -> list[PolicyConfig]:
        """Configs of the member policies a composite policy (``union``) is built from; none by default."""
        return []

    #: The key that sets ``table_capacity`` (for error messages; policies name theirs).
    capacity_key: ClassVar[str] = "capacity"

    #: The keys that name files: ``(section, key, built-in value that is no file or None, the command
    #: that makes one)``; policies name theirs.
    file_keys: ClassVar[tuple[tuple[str, str, str | None, str], ...]] = ()

    def check_files(self) -> None:
        """Refuse a file key (this config's or a member's) whose file is missing, naming the config and the
        resolved path (relative paths start at the config file's folder)."""
        for cfg in (self, *self.member_configs):
            for section, key, builtin, command in cfg.file_keys:
                value = getattr(getattr(cfg, section, None), key, None)
                if value is None or value == builtin:
                    continue
                path = cfg.resolve(value)
                if not path.is_file():
                    use = f"use '{builtin}' or " if builtin else "make "
                    raise ConfigError(
                        f"{cfg.source}: {section}.{key} = {value!r} is invalid: {path} is not a file; "
                        f"{use}a file from sglang-specvocab {command}"
                    )

    def check_vocab(self, vocab_size: int, model_name: str = "the model") -> None:
        """Refuse a capacity (and a union head) the model's vocabulary cannot fill."""
        cap = self.table_capacity
        if cap is not None and cap > vocab_size:
            raise ConfigError(
                f"{self.source}: {self.capacity_key} = {cap} is invalid: must be at most the vocabulary size "
                f"{vocab_size} of {model_name}"
            )
        uc = self.head.union_capacity
        if uc is not None and cap is not None and uc > vocab_size:
            raise ConfigError(
                f"{self.source}: head.union_capacity = {uc} is invalid: must be at most the vocabulary size "
                f"{vocab_size} of {model_name} (a union holds distinct ids of its rows)"
            )

    def check_head(self) -> None:
        """The head options this policy can use, checked once the config is complete (``parse_config``)."""
        head, cap = self.head, self.table_capacity
        if cap is None and head.batch in ("per-request", "union"):
            raise ConfigError(
                f"{self.source}: head.batch = {head.batch!r} is invalid for policy '{self.policy}', which has no "
                "candidate sets (the whole vocabulary): use head.batch: auto or stock"
            )
        if head.mode == "packed" and head.batch in ("union", "stock"):
            raise ConfigError(
                f"{self.source}: head.batch = {head.batch!r} is invalid with head.mode = 'packed', whose rows are "
                "packed per request: use head.batch: per-request (or auto), or head.mode: fused"
            )
        if cap is not None and head.union_capacity is not None and head.union_capacity < cap:
            raise ConfigError(
                f"{self.source}: head.union_capacity = {head.union_capacity} is invalid: must be at least the "
                f"capacity {cap} (one request's set must fit the union)"
            )

    def check_draft_topk(self, topk: int, flag: str = "--speculative-eagle-topk") -> None:
        """Refuse a set narrower than the draft's top-k per step (a union: each member too).

        The head takes the top ``topk`` columns of each request's ``[N, W]`` logits, so ``W`` must be at
        least ``topk``; a member narrower than that could never fill one draft step either."""
        for cfg in (self, *self.member_configs):
            cap = cfg.table_capacity
            if cap is not None and cap < topk:
                raise ConfigError(
                    f"{cfg.source}: {cfg.capacity_key} = {cap} is invalid with {flag} {topk}: must be at least "
                    f"the draft's top-k per step ({topk}); raise it, or lower {flag}"
                )


# --- error messages -------------------------------------------------------------------------


def short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _key(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _model_at(cls: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """The Section class that owns the keys at ``loc`` (for listing valid keys)."""
    for part in loc:
        field = cls.model_fields.get(part) if isinstance(part, str) else None
        if field is None:
            return None
        ann = field.annotation
        candidates = [ann, *get_args(ann)] if get_origin(ann) is not None else [ann]
        nxt = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if nxt is None:
            return None
        cls = nxt
    return cls


def explain(exc: ValidationError, cls: type[BaseModel], source: str, policy: str) -> str:
    """One line per pydantic error of ``cls`` (policy ``policy``, from ``source``): key, value, what is valid."""
    lines = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        key = _key(loc)
        kind = err["type"]
        if kind == "extra_forbidden":
            owner = _model_at(cls, loc[:-1])
            keys = ", ".join(owner.model_fields) if owner is not None else "?"
            under = f" under '{_key(loc[:-1])}'" if loc[:-1] else ""
            lines.append(
                f"{source}: unknown key '{key}' (value {short(err['input'])}); "
                f"valid keys{under} for policy '{policy}': {keys}"
            )
        elif kind == "missing":
            field = (_model_at(cls, loc[:-1]) or cls).model_fields.get(loc[-1])
            hint = f" ({field.description})" if field is not None and field.description else ""
            lines.append(f"{source}: missing required key '{key}'{hint}")
        elif kind in ("model_type", "model_attributes_type", "dict_type"):
            owner = _model_at(cls, loc)
            keys = f" with keys {', '.join(owner.model_fields)}" if owner is not None else ""
            lines.append(f"{source}: {key} = {short(err['input'])} is invalid: must be a mapping{keys}")
        elif isinstance(err["input"], dict):  # a rule across several keys of one section
            msg = err["msg"].removeprefix("Value error, ")
            lines.append(f"{source}: {msg}" if not key else f"{source}: in '{key}': {msg}")
        else:
            msg = err["msg"]
            for prefix in ("Value error, ", "Assertion failed, "):
                msg = msg.removeprefix(prefix)
            msg = msg.replace("Input should be", "must be").replace("List should have", "must have")
            lines.append(f"{source}: {key} = {short(err['input'])} is invalid: {msg}")
    return "\n".join(lines)

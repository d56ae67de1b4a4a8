"""What every policy implements: react to decoding events by writing the candidate table.

Events carry batched, padded tensors keyed by request slot; negative ids are padding:
- ``rows``: int64 ``[B]`` distinct request slots (SGLang's ``req_pool_indices``);
- ``on_prefill``: ``prompt_ids[B, L]`` (a prompt or one chunk of it), ``prompt_topk[B, L, K]``
  the target's top-K ids after each prompt position (rank order), or None when the policy
  asks for none (``prefill_topk == 0``);
- ``on_verify``: ``draft_tokens[B, T]`` the round's draft-tree tokens (root first),
  ``verify_topk[B, P, K]`` the target's top-K ids at the verified positions (the accepted
  tokens and the bonus token, in order), ``accepted[B, A]`` the tokens the round committed.

Ranker policies (``stepwise = True``) also write the table inside every draft step, from the
draft's hidden states: ``select(rows, step, hidden[B, n, d], tokens[B, n])``, where the n
rows of a request are its beams (tree branches) at draft step ``step`` (0 = the root step)
and ``tokens`` the ids they consumed. A request's rows share one set.

Per-round code is tensor code only: no Python loop over tokens or requests, no ``.item()``,
``.cpu()`` or ``.tolist()``, so it runs unchanged on CUDA tensors and inside the decode loop.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from ..config import PolicyConfig
from ..errors import ConfigError, SpecVocabError
from ..table import CandidateTable
from ..vocab import VocabSpace


@dataclass(frozen=True)
class ModelContext:
    """What some policies need from the draft model (None where the caller has no model, e.g. replay)."""

    weight: torch.Tensor | None = None  # the draft's LM head [H, d]
    embedding: torch.Tensor | None = None  # the draft's input embeddings [V, d]
    #: The draft vocabulary (``vocab.VocabSpace``: V target ids, a d2t draft's map and mask, the fallback id); None
    #: where the caller has no model (replay), and then data files say V.
    space: VocabSpace | None = None
    eos_token_ids: tuple[int, ...] = ()
    cache_dir: Path | None = None  # where derived data (clusters, rankers) is cached
    #: Tensor parallelism: all-gather along dim 0 over the ranks that shard ``weight`` / ``embedding`` (SGLang's
    #: vocabulary-parallel layers: equal, padded slices in rank order); None where the tensor is whole.
    gather_weight: Callable[[torch.Tensor], torch.Tensor] | None = None
    gather_embedding: Callable[[torch.Tensor], torch.Tensor] | None = None

    @property
    def vocab_size(self) -> int | None:
        """V, the target's ids (None without a space)."""
        return None if self.space is None else self.space.size

    @property
    def head_rows(self) -> int | None:
        """H, the draft head's real rows over all ranks (None without a head)."""
        if self.space is not None:
            return self.space.head_rows
        return None if self.weight is None else int(self.weight.shape[0])

    def head_weight(self) -> torch.Tensor | None:
        """The draft's whole LM head ``[H, d]``: row j scores the token ``row_ids(j)``. A TP shard is gathered from
        every rank (a fresh tensor of the whole head: use it at start-up, keep only what is derived from it) and
        SGLang's padding rows are cut, so a policy built from it is the same on every rank and at every TP size."""
        return _whole(self.weight, self.gather_weight, self.head_rows)

    def embedding_weight(self) -> torch.Tensor | None:
        """The draft's whole input embedding ``[V, d]`` (gathered and cut as ``head_weight``)."""
        return _whole(self.embedding, self.gather_embedding, self.vocab_size)

    def row_ids(self, rows: torch.Tensor) -> torch.Tensor:
        """The target ids of draft head rows ``rows`` (any shape; a d2t draft's map, else the rows themselves)."""
        return rows if self.space is None else self.space.row_ids(rows)

    def in_draft_vocab(self, ids: torch.Tensor) -> torch.Tensor:
        """Whether each id (any shape, negative = none) is a live id the draft head can score."""
        return ids >= 0 if self.space is None else self.space.contains(ids)


def _whole(part: torch.Tensor | None, gather, rows: int | None) -> torch.Tensor | None:
    if part is None:
        return None
    whole = part if gather is None else gather(part.detach().contiguous())
    return whole if rows is None or rows >= whole.shape[0] else whole[:rows]


class Policy:
    """Base class; context policies override the ``on_*`` events, ranker policies ``select``."""

    name = "base"
    #: True when the head must use the whole vocabulary (no table).
    dense = False
    #: True when the set is chosen inside each draft step by ``select``.
    stepwise = False
    #: True when ``on_verify_round`` takes SGLang's verify tensors directly (the window policy: two ops a round).
    fused_verify = False
    trained: dict | None = None  # the trained file a mode loaded: {"what", "file", "recording"} (the lab reports it)

    def __init__(self, config: PolicyConfig, table: CandidateTable | None, model: ModelContext | None = None) -> None:
        self.config = config
        self.table = table
        self.model = model or ModelContext()
        self.check_head_mode()

    def check_head_mode(self) -> None:
        """Refuse ``head.mode: packed`` for sets it cannot serve (a union calls it again once it knows)."""
        if self.config.head.mode == "packed" and (self.stepwise or self.dense):
            why = "uses the whole vocabulary" if self.dense else "changes its set inside every draft step"
            raise ConfigError(
                f"{self.config.source}: head.mode = 'packed' is invalid for policy '{self.config.policy}', which "
                f"{why}: packed rows pay off only for sets that change between rounds; use head.mode: fused"
            )

    def selection_reads(self) -> int:
        """Weight entries one draft step reads to choose this policy's set (a ranker's or router's), beyond the
        set's own head rows: what the set costs on top of its rows (0: the set is chosen between rounds)."""
        return 0

    def require(self, what: str) -> torch.Tensor:
        """The model tensor ``what``, whole (``ModelContext.head_weight`` / ``embedding_weight``: over all TP ranks,
        without padding rows): 'weight' or 'embedding', or a clear error if the caller gave none."""
        m = self.model
        value = m.head_weight() if what == "weight" else m.embedding_weight()
        if value is None:
            desc = {"weight": "the draft's LM head", "embedding": "the draft's input embeddings"}[what]
            raise SpecVocabError(
                f"{self.config.source}: policy '{self.name}' needs {desc}; it cannot run without the model "
                "(e.g. in replay, which only has trace events)"
            )
        return value

    @property
    def prefill_topk(self) -> int:
        """How many target top-K ids per prompt position ``on_prefill`` needs (0: none)."""
        return 0

    @property
    def verify_topk(self) -> int:
        """How many target top-K ids per verified position ``on_verify`` needs (0: none)."""
        return 0

    def on_reset(self, rows: torch.Tensor) -> None:
        if self.table is not None:
            self.table.reset(rows)

    def on_prefill(self, rows: torch.Tensor, prompt_ids: torch.Tensor, prompt_topk: torch.Tensor | None) -> None:
        pass

    def on_verify(
        self,
        rows: torch.Tensor,
        draft_tokens: torch.Tensor,
        verify_topk: torch.Tensor | None,
        accepted: torch.Tensor,
    ) -> None:
        pass

    def select(self, rows: torch.Tensor, step: int, hidden: torch.Tensor, tokens: torch.Tensor) -> None:
        """Ranker policies: write the sets of ``rows`` for draft step ``step`` (see the module doc)."""


class DraftVocabPolicy(Policy):
    """A policy restricted to a reduced (d2t) draft vocabulary: every event id outside it becomes a hole.

    A stock EAGLE-3 draft scores only its ``H`` hot ids (``ModelContext.space``); any other id in a
    set would take a slot (a window entry, a union budget, a telemetry count) and get a ``-inf`` column.
    So the ids of every event (prompt ids and top-K, draft tokens, verified top-K, committed tokens, a
    stepwise policy's input tokens) are mapped to -1 here, before the wrapped policy sees them; the
    file-based sets (``static``, ``retrieval``) read the same mask when they load their data. A committed
    token outside the draft vocabulary is therefore a hole for the policy (it triggers no retrieval).
    ``build_policy`` wraps every policy built over a d2t draft's space; attributes the wrapper does not
    define (the ring, the members, the cache, ...) are the wrapped policy's.
    """

    def __init__(self, inner: Policy) -> None:  # no Policy.__init__: the inner policy ran its checks
        self.inner = inner
        self.config, self.table, self.model = inner.config, inner.table, inner.model
        self.name, self.dense, self.stepwise = inner.name, inner.dense, inner.stepwise

    def __getattr__(self, name: str):
        if name == "inner":  # not set yet (unpickling, copy): never recurse
            raise AttributeError(name)
        return getattr(self.inner, name)

    @property
    def prefill_topk(self) -> int:
        return self.inner.prefill_topk

    @property
    def verify_topk(self) -> int:
        return self.inner.verify_topk

    @property
    def fused_verify(self) -> bool:
        return self.inner.fused_verify

    def on_verify_round(self, *args, **kwargs) -> torch.Tensor:
        """The inner policy's fused verify round with the draft vocabulary as its hole mask."""
        return self.inner.on_verify_round(*args, **kwargs, hot=self.model.space.mask)

    def keep(self, ids: torch.Tensor | None) -> torch.Tensor | None:
        """``ids`` with every id outside the draft vocabulary replaced by -1."""
        if ids is None:
            return None
        return torch.where(self.model.in_draft_vocab(ids), ids, torch.full_like(ids, -1))

    def on_reset(self, rows: torch.Tensor) -> None:
        self.inner.on_reset(rows)

    def on_prefill(self, rows: torch.Tensor, prompt_ids: torch.Tensor, prompt_topk: torch.Tensor | None) -> None:
        self.inner.on_prefill(rows, self.keep(prompt_ids), self.keep(prompt_topk))

    def on_verify(self, rows, draft_tokens, verify_topk, accepted) -> None:
        self.inner.on_verify(rows, self.keep(draft_tokens), self.keep(verify_topk), self.keep(accepted))

    def select(self, rows: torch.Tensor, step: int, hidden: torch.Tensor, tokens: torch.Tensor) -> None:
        self.inner.select(rows, step, hidden, self.keep(tokens))


def load_trained(
    path, keys: tuple[str, ...], what: str, command: str, where: str, optional: tuple[str, ...] = ()
) -> dict:
    """The tensors/values ``keys`` (and those of ``optional`` it has) of a trained file written by
    ``sglang-specvocab <command>``, or a clear error; also ``recording``: the settings it was fit on (model,
    draft, data), None in files of earlier versions."""
    try:
        data = torch.load(path, weights_only=True, map_location="cpu")
        out = {k: data[k] for k in keys} | {k: data[k] for k in optional if k in data}
        out["recording"] = json.loads(data["recording"]) if "recording" in data else None
        return out
    except FileNotFoundError:
        raise ConfigError(
            f"{where}: {what} file {path} does not exist (train one with sglang-specvocab {command})"
        ) from None
    except Exception as exc:  # noqa: BLE001  (any unreadable file gets the same clear message)
        raise ConfigError(
            f"{where}: {what} file {path} is not a {what} from sglang-specvocab {command} ({exc!r})"
        ) from None


def draft_fingerprint(fc_weight: torch.Tensor | None) -> str | None:
    """An EAGLE-3 draft's identity as trained files record it: the sha256 (16 hex digits) of its ``fc`` weight (the
    projection of the target's features that only that draft has) in bfloat16, so the same draft read in fp32, bf16
    or from its file gives the same value wherever it lives; None for a draft without ``fc``. One copy to the host,
    at start-up only."""
    if fc_weight is None:
        return None
    data = fc_weight.detach().to("cpu", torch.bfloat16).contiguous().view(torch.int16).numpy().tobytes()
    return hashlib.sha256(data).hexdigest()[:16]


def fit_mismatch(trained: dict | None, fingerprint: str | None) -> str | None:
    """Why a policy's trained file (``Policy.trained``: what, file, recording) was not fit on the draft whose ``fc``
    has ``fingerprint`` (None: not an EAGLE-3 draft), or None when it was, or when the file records nothing to compare
    (files of earlier versions). A file fit on the target's own states or a self-draft's is another draft's."""
    if trained is None or trained.get("recording") is None:
        return None
    rec = trained["recording"]
    fit = rec.get("draft_fingerprint")
    if fit is not None and fit == fingerprint:
        return None
    if fit is None and fingerprint is None:
        return None  # neither is an EAGLE-3 draft: the caller compares its own spec (the lab's self-drafts)
    served = "an EAGLE-3 draft with fc fingerprint " + fingerprint if fingerprint else "a draft that is not EAGLE-3"
    made = str(rec.get("draft", "?")) + (f" (fc fingerprint {fit})" if fit else "")
    return f"{trained['what']} {Path(trained['file']).name} was fit on {made} states, this one drafts with {served}"

"""The DYNVOCAB speculative algorithm as SGLang sees it: the spec class, the EAGLE defaults, and every
refusal that must happen before the server starts.

``DynVocabAlgo`` answers as EAGLE3 wherever SGLang asks (``is_eagle``, ``is_eagle3``, the duck-typed
methods ``CustomSpecAlgo`` lacks, and a ``__getattr__`` fallback to ``SpeculativeAlgorithm.EAGLE3``
for any method a later SGLang adds); only the worker differs (``integration/worker.py``).

Refusals (all raised during server-argument resolution, i.e. before any process or model starts):

1. ``UNSUPPORTED``: option combinations DYNVOCAB does not support, each with the flag to remove; and
   with ``--speculative-adaptive`` (supported: SGLang's batch-size-dependent draft steps) what SGLang's
   adaptive steps cannot run with (``ADAPTIVE_CONFLICTS``: a top-k above 1, two-batch overlap, PD
   multiplexing), refused where SGLang would silently turn adaptive off.
2. The policy config (``--speculative-dynvocab-config``, see ``config_location``): any ``ConfigError``
   of ``load_config``, then what the models cannot serve (``check_config_for_models``):

   - the draft must be an EAGLE-3 checkpoint (an architecture name containing ``Eagle3``) without
     DSA/QSA index sharing (``index_share_for_mtp_iteration``);
   - **vocabulary rule.** Candidate sets hold *target* token ids. The draft's head has ``H`` rows:
     ``H = draft_vocab_size`` for a d2t draft (stock EAGLE-3, e.g. 32k), ``H = V`` (the target's
     vocabulary) for a full-vocabulary draft (no ``draft_vocab_size``, or tied embeddings). A set can
     only be scored on the head's rows, so with a d2t draft the effective set is the policy's set
     intersected with the draft vocabulary (every event id outside it becomes a hole before the policy
     sees it, ``policies.DraftVocabPolicy``; a warning says so at start). Hence: every ``capacity``
     (the table width; for ``union`` also each member's) must be at most ``H``, or the set could
     never fill and the config is refused;
   - ``head.mode: packed`` is refused (the lab keeps it); ``head.union_capacity`` must be at most ``H``
     (the union holds distinct head rows);
   - every set must hold at least ``--speculative-eagle-topk`` ids (the table width ``capacity``, and
     for ``union`` each member's budget): the draft takes the top-k columns of each request's set.
     Checked in ``handle_server_args``, after EAGLE's defaults chose an automatic topk;
   - data files that hold target ids (``static.table``, ``retrieval.table``, ``retrieval.graph``)
     must have been built for the target's vocabulary ``V``; trained ranker/router files
     (``lowrank.ranker``, ``cluster.router``) must exist (their shapes are checked when the policy
     is built in the scheduler).
"""

from __future__ import annotations

import functools
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang.srt.speculative.spec_registry import CustomSpecAlgo

from ..config import PolicyConfig
from ..errors import ConfigError, SpecVocabError
from ..policies import load_config
from ..policies.lowrank import read_ranker
from ..vocab import VocabSpace
from ..vocab_data import load_frequency_ids, table_vocab_size
from .names import ATTR, DEFAULT_CONFIG, ENV, FLAG, NAME

logger = logging.getLogger(__name__)


class UnsupportedCombinationError(SpecVocabError):
    """A server option DYNVOCAB cannot run with; the message names the flag to remove."""


# --- option combinations ----------------------------------------------------------------------


@dataclass(frozen=True)
class Unsupported:
    flag: str
    active: Callable[[Any], bool]  # reads the resolving view of the server args
    reason: str


def _get(cfg: Any, name: str, default: Any = None) -> Any:
    return getattr(cfg, name, default)


def _lora(cfg: Any) -> bool:
    enable = _get(cfg, "enable_lora")
    return bool(enable) or (enable is None and bool(_get(cfg, "lora_paths")))


#: Every option combination DYNVOCAB refuses before start. One table, in the order they are checked.
UNSUPPORTED: tuple[Unsupported, ...] = (
    Unsupported(
        "--speculative-use-rejection-sampling",
        lambda c: bool(_get(c, "speculative_use_rejection_sampling")),
        "the draft scores only a per-request candidate set, while SGLang's rejection-sampling kernel needs "
        "the draft's full distribution over the target vocabulary",
    ),
    Unsupported(
        "--speculative-use-block-verification",
        lambda c: bool(_get(c, "speculative_use_block_verification")),
        "block verification needs rejection sampling (see --speculative-use-rejection-sampling)",
    ),
    Unsupported(
        "--pp-size",
        lambda c: (_get(c, "pp_size", 1) or 1) > 1,
        "with pipeline parallelism only the last stage hosts the draft, and the verify/prefill events that "
        "update the candidate sets are not relayed between stages",
    ),
    Unsupported(
        "--attn-dp-size (or --enable-dp-attention)",
        lambda c: (_get(c, "attn_dp_size", 1) or 1) > 1 or bool(_get(c, "enable_dp_attention")),
        "with DP attention the draft batch's rows are no longer this scheduler's request slots, which key "
        "the candidate table",
    ),
    Unsupported(
        "--enable-multi-layer-eagle",
        lambda c: bool(_get(c, "enable_multi_layer_eagle")),
        "multi-layer EAGLE runs its own draft worker (MultiLayerEagleWorkerV2), which has no candidate-set head",
    ),
    Unsupported(
        "--disaggregation-mode",
        lambda c: _get(c, "disaggregation_mode", "null") not in (None, "null"),
        "PD disaggregation would need the candidate sets seeded on the prefill server to be transferred to "
        "the decode server, which is not implemented",
    ),
    Unsupported(
        "--enable-mixed-chunk",
        lambda c: bool(_get(c, "enable_mixed_chunk")),
        "a mixed chunk runs the running requests as plain one-token decodes, which skip the verify events "
        "that update the candidate sets",
    ),
    Unsupported(
        "--speculative-token-map",
        lambda c: _get(c, "speculative_token_map") is not None,
        "the draft vocabulary comes from the EAGLE-3 checkpoint (d2t) and the candidate sets from the DYNVOCAB "
        f"config ({FLAG}); a token map would be ignored",
    ),
    Unsupported(
        "--enable-lora (or --lora-paths)",
        _lora,
        "SGLang validates LoRA with speculative decoding for its own algorithm names only",
    ),
    # SGLang checks these two by the algorithm's name ("EAGLE3"), which DYNVOCAB's is not.
    Unsupported(
        "--enable-attn-tp-input-scattered",
        lambda c: bool(_get(c, "enable_attn_tp_input_scattered")),
        "SGLang keeps input-scattered attention off for EAGLE3 by name (the draft reads the target's "
        "auxiliary hidden states whole), a check DYNVOCAB's name would pass; EAGLE3 ignores the flag too",
    ),
    Unsupported(
        "--enable-unified-memory",
        lambda c: bool(_get(c, "enable_unified_memory")),
        "SGLang has audited the unified pool's fused draft KV for EAGLE/EAGLE3 only (by name), not for "
        "a draft head over candidate sets",
    ),
)


def check_combinations(cfg: Any) -> None:
    """Raise ``UnsupportedCombinationError`` for the first active row of ``UNSUPPORTED``, then ``check_adaptive``."""
    for row in UNSUPPORTED:
        if row.active(cfg):
            raise UnsupportedCombinationError(
                f"--speculative-algorithm {NAME} does not support {row.flag}: {row.reason}. "
                f"Remove {row.flag}, or use --speculative-algorithm EAGLE3."
            )
    check_adaptive(cfg)


#: What the pinned SGLang's adaptive steps cannot run with (``adaptive_spec_params.adaptive_unsupported_reason``,
#: which for EAGLE3 turns adaptive off with a warning): refused for DYNVOCAB, with the flag to drop.
#: (DP attention and multi-layer EAGLE, also on SGLang's list, are refused for DYNVOCAB by ``UNSUPPORTED``.)
ADAPTIVE_CONFLICTS: tuple[tuple[str, Callable[[Any], bool], str], ...] = (
    (
        "--speculative-eagle-topk",
        lambda c: _get(c, "speculative_eagle_topk") not in (None, 1),
        "adaptive steps switch between draft chains (top-k 1)",
    ),
    (
        "--enable-two-batch-overlap",
        lambda c: bool(_get(c, "enable_two_batch_overlap")),
        "a step switch would discard the two-batch-overlap attention wrapper",
    ),
    ("--enable-pdmux", lambda c: bool(_get(c, "enable_pdmux")), "a step switch does not update PD multiplexing"),
)


def check_adaptive(cfg: Any) -> None:
    """With ``--speculative-adaptive``: refuse what SGLang's adaptive steps cannot run with (before start)."""
    if not _get(cfg, "speculative_adaptive"):
        return
    for flag, active, reason in ADAPTIVE_CONFLICTS:
        if active(cfg):
            value = _get(cfg, flag.removeprefix("--").replace("-", "_"))
            raise UnsupportedCombinationError(
                f"--speculative-algorithm {NAME} with --speculative-adaptive does not support {flag} {value}: "
                f"{reason}. Remove --speculative-adaptive, or {flag}."
            )


# --- the policy config ------------------------------------------------------------------------


def default_config_path() -> Path:
    """The ``microspec.yaml`` shipped in the package."""
    return Path(str(resources.files("sglang_specvocab.configs").joinpath(DEFAULT_CONFIG)))


def config_location(server_args: Any) -> tuple[str, str]:
    """``(path, where it came from)``: the flag (or the same keyword), else ``$SGLANG_DYNVOCAB_CONFIG``, else the
    shipped default.

    ``server_args`` may be the record or any SGLang view of it (reads fall through to the record).
    """
    path = getattr(server_args, ATTR, None)
    if path:
        return str(path), FLAG
    env = os.environ.get(ENV)
    if env:
        return os.path.abspath(os.path.expanduser(env)), f"${ENV}"
    return str(default_config_path()), f"the default ({DEFAULT_CONFIG} shipped in sglang_specvocab.configs)"


def load_server_config(server_args: Any) -> PolicyConfig:
    """The policy config the server args name; a ``ConfigError`` says where the path came from."""
    path, origin = config_location(server_args)
    try:
        return load_config(path)
    except ConfigError as exc:
        raise ConfigError(f"{exc}\n(DYNVOCAB policy config {path}, given by {origin})") from None


@dataclass(frozen=True)
class DraftInfo:
    path: str
    architectures: tuple[str, ...]
    vocab_size: int  # the target's vocabulary V (the id space of every set)
    head_size: int  # H: rows of the draft's LM head
    d2t: bool  # True when the head is a reduced (draft_vocab_size) head with a d2t map
    hidden_size: int | None = None  # d, the width of the draft's hidden states (None: not in its config)

    def describe(self) -> str:
        kind = f"a d2t draft, draft_vocab_size {self.head_size}" if self.d2t else "a full-vocabulary draft"
        return f"the draft head of {self.path} ({kind})"


def draft_info(draft_hf_config: Any, draft_path: str, target_vocab_size: int) -> DraftInfo:
    """What the vocabulary rule needs from an EAGLE-3 draft's HF config."""
    archs = tuple(getattr(draft_hf_config, "architectures", None) or ())
    dvs = getattr(draft_hf_config, "draft_vocab_size", None)
    tied = bool(getattr(draft_hf_config, "tie_word_embeddings", False))
    d2t = dvs is not None and not tied and int(dvs) != target_vocab_size
    head = int(dvs) if d2t else target_vocab_size
    text = getattr(draft_hf_config, "text_config", draft_hf_config)
    hidden = getattr(text, "hidden_size", getattr(draft_hf_config, "hidden_size", None))
    hidden = int(hidden) if isinstance(hidden, int) else None
    return DraftInfo(str(draft_path), archs, int(target_vocab_size), head, d2t, hidden)


def checkpoint_hot_ids(draft_path: str):
    """A d2t draft's hot ids (the target id of each head row: SGLang's ``hot_token_id = d2t + row``), read from a
    local safetensors checkpoint without its other tensors; None where the draft is not such a directory (a hub id
    not yet downloaded: the policy checks the same once the weights load)."""
    root = Path(draft_path)
    if not root.is_dir():
        return None
    index = root / "model.safetensors.index.json"
    if index.is_file():
        name = json.loads(index.read_text()).get("weight_map", {}).get("d2t")
        files = [root / name] if name else []
    else:
        files = sorted(root.glob("*.safetensors"))
    for file in files:
        with safe_open(str(file), "pt") as f:
            if "d2t" in f.keys():  # noqa: SIM118  (safe_open has keys(), not __contains__)
                d2t = f.get_tensor("d2t").long().flatten()
                return d2t + torch.arange(d2t.numel())
    return None


def _members(config: PolicyConfig) -> list[PolicyConfig]:
    return [config, *getattr(config, "member_configs", [])]


_TARGET_ID_FILES = (("static", "table"), ("retrieval", "table"), ("retrieval", "graph"))
_SIZED_TABLES = (("static", "size"), ("retrieval", "static_size"))  # a frequency table and how many ids it gives


def _hot_mask(draft: DraftInfo) -> np.ndarray | None:
    """A d2t draft's vocabulary as a bool mask over the target ids; None for a full head or a checkpoint that is not
    a local directory."""
    ids = checkpoint_hot_ids(draft.path) if draft.d2t else None
    if ids is None:
        return None
    return VocabSpace.build(draft.vocab_size, head_ids=ids).mask.numpy()


def _check_sized_tables(cfg: PolicyConfig, draft: DraftInfo, hot: Callable[[], np.ndarray | None]) -> None:
    """A frequency table holds the ids a static core asks for (of the d2t draft's vocabulary, where the checkpoint
    is local): the check the policy makes again when it is built, here before any weights load."""
    for section, size in _SIZED_TABLES:
        sec = getattr(cfg, section, None)
        if sec is not None:
            load_frequency_ids(cfg.resolve(sec.table), draft.vocab_size, getattr(sec, size), hot())


def check_config_for_models(config: PolicyConfig, draft: DraftInfo) -> None:
    """The module docstring's rules: the head options, the draft kind, capacities against ``H``, data files against ``V``."""
    if config.head.mode == "packed":
        raise ConfigError(
            f"{config.source}: head.mode = 'packed' is invalid for the server: it is the lab's ablation of MicroSpec's "
            "asynchronous gathering (never faster on a GPU); use head.mode: fused"
        )
    if not any("eagle3" in a.lower() for a in draft.architectures):
        raise ConfigError(
            f"--speculative-algorithm {NAME} needs an EAGLE-3 draft (an architecture like LlamaForCausalLMEagle3); "
            f"--speculative-draft-model-path {draft.path} has architectures {list(draft.architectures)}"
        )
    config.check_files()  # every named file exists (this config's and its members')
    hot = functools.cache(lambda: _hot_mask(draft))  # read once, only when a check needs it
    for cfg in _members(config):  # data files first: a file built for another model explains the rest
        for section, key in _TARGET_ID_FILES:
            value = getattr(getattr(cfg, section, None), key, None)
            if value is None:
                continue
            path = cfg.resolve(value)
            built_for = table_vocab_size(path)
            if built_for != draft.vocab_size:
                raise ConfigError(
                    f"{cfg.source}: {section}.{key} = {value!r} is invalid: {path} was built for a "
                    f"{built_for}-token vocabulary, the target model has {draft.vocab_size}; "
                    "build one for this model with sglang-specvocab build-freq"
                )
        cfg.check_vocab(draft.head_size, draft.describe())
        _check_sized_tables(cfg, draft, hot)
        lowrank = getattr(cfg, "lowrank", None)
        if lowrank is not None and lowrank.ranker != "svd" and draft.hidden_size is not None:
            read_ranker(cfg.resolve(lowrank.ranker), draft.head_size, draft.hidden_size, lowrank.rank, cfg.source)
        if getattr(cfg, "align", None) is not None:  # tools/lab/align.py runs in the reference decoder only
            raise ConfigError(
                f"{cfg.source}: align = {dict(cfg.align)!r} is invalid for a server: EvoSpec's online alignment "
                "runs in the reference decoder (sglang-specvocab lab) only; remove the align block"
            )


def _draft_hf_config(cfg: Any) -> Any:
    # late: keeps the plug-in's import (every server process) light
    from sglang.srt.utils.hf_transformers_utils import get_config

    return get_config(
        cfg.speculative_draft_model_path,
        trust_remote_code=bool(_get(cfg, "trust_remote_code", False)),
        revision=_get(cfg, "speculative_draft_model_revision"),
    )


def validate_server_args(server_args: Any) -> None:
    """SGLang's ``validate_server_args`` hook (runs before ``handle_server_args``): refuse or return."""
    check_combinations(server_args)
    config = load_server_config(server_args)
    draft_path = _get(server_args, "speculative_draft_model_path")
    if draft_path is None:
        raise ConfigError(
            f"--speculative-algorithm {NAME} needs --speculative-draft-model-path: an EAGLE-3 draft "
            "(a full-vocabulary one, or a d2t one whose candidate sets are cut to its vocabulary)"
        )
    # late: keeps the plug-in's import (every server process) light
    from sglang.srt.arg_groups.overrides import model_config_of

    hf = _draft_hf_config(server_args)
    text = getattr(hf, "text_config", hf)
    if getattr(text, "index_share_for_mtp_iteration", getattr(hf, "index_share_for_mtp_iteration", False)):
        raise UnsupportedCombinationError(
            f"--speculative-algorithm {NAME} does not support DSA/QSA index sharing "
            f"(index_share_for_mtp_iteration in {draft_path}): its draft steps reuse indexer state that the "
            "candidate-set head does not maintain. Use --speculative-algorithm EAGLE3 with this draft."
        )
    info = draft_info(hf, draft_path, model_config_of(server_args).vocab_size)
    check_config_for_models(config, info)
    if info.d2t and config.table_capacity is not None:
        logger.warning(
            "%s: %s; candidate ids outside its %d-token vocabulary are dropped from every set",
            NAME,
            info.describe(),
            info.head_size,
        )


# --- the spec class ---------------------------------------------------------------------------


class DynVocabAlgo(CustomSpecAlgo):
    """``CustomSpecAlgo`` that is EAGLE3 to every SGLang call site except the worker factory."""

    def is_eagle(self) -> bool:
        return True

    def is_eagle3(self) -> bool:
        return True

    def supports_grammar_overlap(self) -> bool:
        return True  # the EAGLE V2 verify path (grammar barrier included) is inherited unchanged

    def supports_mixed_chunk(self) -> bool:
        return False  # and --enable-mixed-chunk is refused (UNSUPPORTED)

    def has_draft_kv(self) -> bool:
        return True

    def carries_draft_hidden_states(self) -> bool:
        return True

    def need_topk(self) -> bool:
        return True

    def get_platform_worker_cls(self):
        return None  # always our worker, never an out-of-tree platform's EAGLE replacement

    def create_future_map(self, device, req_to_token_pool, needs_cpu_seq_lens=True, needs_confidence_relay=False):
        # late: keeps the plug-in's import (every server process) light
        from sglang.srt.managers.overlap_utils import FutureMap

        return FutureMap(device, self, req_to_token_pool, needs_cpu_seq_lens, needs_confidence_relay)

    def handle_server_args(self, server_args) -> None:
        """EAGLE3's defaults (SGLang's ``_handle_eagle_family``) on the resolution stand-in.

        The stand-in reads through to the record; ``_handle_eagle_family`` declares its decisions on
        the record's ``_resolved_overrides`` list (reached through the stand-in), exactly as it does for
        EAGLE3. Tested: steps/topk/draft tokens, max_running_requests=48, overlap off on CPU.
        """
        # late: keeps the plug-in's import (every server process) light
        from sglang.srt.arg_groups.speculative_hook import _handle_eagle_family

        check_combinations(server_args)
        _handle_eagle_family(server_args)
        # after EAGLE's defaults: an auto --speculative-eagle-topk is only chosen there
        topk = getattr(server_args, "speculative_eagle_topk", None)
        if topk is not None:
            load_server_config(server_args).check_draft_topk(int(topk))

    def __getattr__(self, name: str):
        # Anything a later SGLang asks of an algorithm that this class does not define: answer as EAGLE3.
        if name.startswith("__") or name in ("name", "factory", "supports_overlap", "validate_server_args"):
            raise AttributeError(name)
        return getattr(SpeculativeAlgorithm.EAGLE3, name)


__all__ = [
    "ADAPTIVE_CONFLICTS",
    "ATTR",
    "DEFAULT_CONFIG",
    "ENV",
    "FLAG",
    "NAME",
    "UNSUPPORTED",
    "DraftInfo",
    "DynVocabAlgo",
    "Unsupported",
    "UnsupportedCombinationError",
    "check_adaptive",
    "check_combinations",
    "check_config_for_models",
    "config_location",
    "default_config_path",
    "draft_info",
    "load_server_config",
    "validate_server_args",
]

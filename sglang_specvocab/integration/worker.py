"""DYNVOCAB's speculative worker for the pinned SGLang (compact draft logits over each request's set).

Imported lazily by the worker factory (``plugin.worker_factory``), in the scheduler process.

- ``DynVocabWorkerV2(EAGLEWorkerV2)``: ``__init__`` is EAGLE's (copied in
  ``copies/from-sglang/eagle_worker_v2.py``) with the draft worker class swapped, as
  ``StandaloneWorkerV2`` does; ``verify`` is EAGLE's followed by the telemetry and
  ``policy.on_verify`` (``integration/events.verify_event``, on the forward stream, no host sync,
  idle batches skipped); ``_forward_prefill_batch`` is a copy (``copies/.../dynvocab_worker.py``)
  that calls ``dynvocab_prefill`` between the target forward and the draft extend: re-used slots
  are reset (``reset_rows`` on the pool's generation counter; policy and telemetry rows), then
  ``policy.on_prefill`` with the prompt ids (radix-cache hits seeded from ids) and the target's
  top-K from ``last_hidden_states``; ``note_request_finished`` reports the request's telemetry
  and the head's published counters, bad table entries and union overflows (``integration/telemetry.py``).
- ``DynVocabDraftWorker(EagleDraftWorker)``: ``alloc_memory_pool`` runs EAGLE's (draft KV pools,
  token map, LM head), builds the policy and its candidate table with one row per request slot
  (``R = req_to_token_pool.req_to_token.shape[0]``, row 0 SGLang's padding row) and the telemetry,
  then ``install_dynvocab_head``: the compact logits processor (``integration/logits.py``) over the
  table replaces ``draft_runner.model.logits_processor`` (the table tensors are shared, never
  rebound), and the target's ``logits_processor.keep_last_hidden_states`` is set when the policy
  wants prefill top-K. ``draft_forward`` / ``_draft_extend_for_prefill`` /
  ``_draft_extend_for_decode`` are copies (``copies/.../dynvocab_draft.py``) whose top-k is
  ``proc.draft_topk``; a dense policy (``full``, no table) keeps SGLang's own methods and head.

Stepwise (ranker) policies (``lowrank``, ``cluster``, a union with one) choose the set inside each
draft step: the installed processor is ``StepwiseProcessor``, whose ``_get_logits`` calls
``policy.select(rows, step, hidden[B, n, d], tokens[B, n])`` on the LM head's input rows right
before the head (``stepwise_inputs``): step 0 in the draft extends (the row of each request's last
position: prefill last row, decode ``select_index`` / ``accept_lens - 1``), step ``i + 1`` in the
``i``-th forward of ``draft_forward`` (its ``topk`` beams). Everything is static-shaped tensor code
on the forward batch's ``req_pool_indices`` (the static buffer inside a CUDA graph), so it is
captured with the draft graphs. With a d2t draft the rankers rank the draft head's rows and write
their target ids (``dynvocab_space``, one ``VocabSpace``); at TP > 1 each rank builds its ranker or clusters from
the whole head (gathered once at start-up, ``ModelContext.head_weight``) and the hidden states are the
same on every rank, so every rank writes the same set with no collective in the draft step.

Where the installed SGLang has the hooks of the repository's ``patches/sglang-draft-topk-hook.diff``
(``SGLANG_HOOK``, detected once when this module is imported), none of the copies is used: SGLang's own
``__init__`` builds ``draft_worker_cls``, its ``_forward_prefill_batch`` calls ``on_target_prefill_complete``
(``dynvocab_prefill``), and its draft methods take the top-k from ``CompactTopKHook`` (set by
``install_dynvocab_head``): the ``proc.dv_step``, ``proc.draft_topk`` and ``proc.draft_topk1`` of the copies.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from sglang.srt.runtime_context import get_observability, get_parallel
from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker, EAGLEWorkerV2

from .. import ops
from ..copies import has_draft_topk_hook, load_copy
from ..errors import SpecVocabError
from ..policies import ModelContext, Policy, build_policy
from ..policies.base import draft_fingerprint, fit_mismatch
from ..vocab import VocabSpace
from .algorithm import NAME, draft_info, load_server_config
from .events import host_to_device, prefill_event, reset_rows, verify_event
from .logits import DynVocabLogitsProcessor, head_shard, install
from .telemetry import BAD_ENTRIES, UNION_OVERFLOW, Gauges, Telemetry, install_request_level_keys, report_to_request

logger = logging.getLogger(__name__)

# SGLang with the draft top-k hook: its own methods, no copies (see the module docstring).
SGLANG_HOOK = has_draft_topk_hook()
if SGLANG_HOOK:
    logger.info("DYNVOCAB: the installed SGLang has the draft top-k hook; the copied SGLang methods are not used")
else:
    # The copied SGLang methods (copies/from-sglang/), bound once when this module is imported (in the
    # scheduler, by the worker factory after the version and signature checks): load_copy reads
    # package metadata (ms), which must never run per decode round.
    _DRAFT = load_copy("dynvocab_draft")
    _PREFILL = load_copy("dynvocab_worker")
    _INIT = load_copy("eagle_worker_v2")


# --- stepwise policies: select inside the LM head ----------------------------------------------------


def stepwise_inputs(
    mode: str,
    hidden: torch.Tensor,
    input_ids: torch.Tensor,
    rows: torch.Tensor,
    *,
    extend_seq_lens: torch.Tensor | None = None,
    select_index: torch.Tensor | None = None,
    num_accept_tokens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(hidden[B, n, d], tokens[B, n])`` for ``policy.select`` from the LM head's input rows.

    ``hidden`` is what the head gets (already pruned by SGLang), ``input_ids`` the forward's
    unpruned ids, ``rows`` its ``req_pool_indices`` (B requests). Modes:
    - ``"decode"`` (a ``draft_forward`` step): ``N = B * topk`` request-major beams, all kept;
    - ``"extend"`` (the prefill draft extend): one pruned row per request, the last extended
      position; its token is ``input_ids[cumsum(extend_seq_lens) - 1]``;
    - ``"draft_extend"`` (the decode draft extend): pruned to ``select_index`` (graph path: one row
      per request), or all ``num_draft_tokens`` rows per request (eager path), of which the
      request's last accepted one, ``accept_lens - 1``, is taken.
    Static shapes, no host sync.
    """
    bs = rows.shape[0]
    if mode == "decode":
        n = hidden.shape[0] // bs
        return hidden.view(bs, n, hidden.shape[-1]), input_ids.view(bs, n)
    if mode == "extend":
        idx = torch.cumsum(extend_seq_lens, dim=0) - 1
        return hidden.view(bs, 1, hidden.shape[-1]), input_ids[idx.long()].view(bs, 1)
    if mode == "draft_extend":
        if select_index is not None and hidden.shape[0] == bs:
            return hidden.view(bs, 1, hidden.shape[-1]), input_ids[select_index.long()].view(bs, 1)
        n = hidden.shape[0] // bs
        idx = torch.arange(bs, device=hidden.device) * n + num_accept_tokens.long() - 1
        return hidden[idx].view(bs, 1, hidden.shape[-1]), input_ids[idx].view(bs, 1)
    raise ValueError(f"stepwise_inputs: unknown mode {mode!r}")


def _forward_mode_name(forward_mode) -> str | None:
    if forward_mode.is_idle():
        return None
    if forward_mode.is_draft_extend_v2():
        return "draft_extend"
    if forward_mode.is_extend():
        return "extend"
    if forward_mode.is_decode():
        return "decode"
    return None


def _tp_gather(module):
    """The all-gather of a vocabulary-parallel module's weight over SGLang's TP group, None for a whole one.
    Start-up only (a policy builds its ranker or clusters from the whole head, the same on every rank)."""
    if int(getattr(module, "tp_size", 1)) <= 1:
        return None
    group = get_parallel().tp_group
    return lambda part: group.all_gather(part, dim=0)


class StepwiseProcessor(DynVocabLogitsProcessor):
    """``DynVocabLogitsProcessor`` that runs ``policy.select`` on the head's input right before the head."""

    dv_policy = None
    dv_step = 0
    _dv_fb = None
    _dv_input_ids = None

    def forward(self, input_ids, hidden_states, lm_head, logits_metadata, *args, **kwargs):
        self._dv_fb, self._dv_input_ids = logits_metadata, input_ids
        try:
            return super().forward(input_ids, hidden_states, lm_head, logits_metadata, *args, **kwargs)
        finally:
            self._dv_fb = self._dv_input_ids = None

    def _get_logits(self, hidden_states, lm_head, logits_metadata, *args, **kwargs):
        fb = self._dv_fb
        mode = None if fb is None else _forward_mode_name(fb.forward_mode)
        if mode is not None and hidden_states.shape[0] > 0:
            spec = getattr(fb, "spec_info", None)
            hidden, tokens = stepwise_inputs(
                mode,
                hidden_states,
                self._dv_input_ids,
                fb.req_pool_indices,
                extend_seq_lens=fb.extend_seq_lens,
                select_index=getattr(spec, "select_index", None),
                num_accept_tokens=getattr(spec, "num_accept_tokens", None),
            )
            step = 0 if mode != "decode" else self.dv_step
            self.dv_policy.select(fb.req_pool_indices.long(), step, hidden, tokens)
        return super()._get_logits(hidden_states, lm_head, logits_metadata, *args, **kwargs)


class CompactTopKHook:
    """SGLang's draft top-k hook over the compact processor (an SGLang with the hook; the copies otherwise)."""

    def __init__(self, proc: DynVocabLogitsProcessor):
        self.proc = proc

    def before_draft_forward(self, forward_batch, step: int) -> None:
        self.proc.dv_step = step  # the draft step whose set a stepwise policy picks inside the LM head

    def draft_topk(self, logits, topk: int, forward_batch, step: int, head_shape: tuple[int, int]):
        # head_shape: the (bs, n) of the head call that produced the logits (a replayed graph's captured batch
        # size), which the top-k reads their column map from: after a replay no Python of the head ran.
        # topk 1 in the draft steps and the decode extend: the argmax with p = 1, as upstream's topk-1 paths
        # there (and the copies); the prefill extend (an EXTEND batch) keeps the softmax, as upstream's.
        rows, key = forward_batch.req_pool_indices, tuple(head_shape)
        if topk == 1 and not forward_batch.forward_mode.is_extend():
            return self.proc.draft_topk1(logits, rows, head_key=key)
        return self.proc.draft_topk(logits, topk, rows, head_key=key)


# --- the target's LM head (prefill top-K) -------------------------------------------------------------


def target_head_modules(model) -> tuple[Any, Any]:
    """``(logits_processor, lm_head)`` of a target model: its own, else its ``language_model``'s, walked down.

    Multimodal wrappers keep the language model's head inside it (SGLang's
    ``Gemma3ForConditionalGeneration`` has neither attribute; ``KimiK25ForConditionalGeneration`` only an
    ``lm_head`` property), and their forward runs the inner model's logits processor. Raises
    ``SpecVocabError`` naming the model class when either is missing.
    """
    chain, m = [], model
    while m is not None and len(chain) < 4:  # a wrapper of a wrapper at most, in practice
        chain.append(m)
        m = getattr(m, "language_model", None)
    lp = next((x for x in (getattr(c, "logits_processor", None) for c in chain) if x is not None), None)
    head = next((x for x in (getattr(c, "lm_head", None) for c in chain) if x is not None), None)
    if lp is None or head is None:
        missing = " and ".join(n for n, v in (("logits_processor", lp), ("lm_head", head)) if v is None)
        raise SpecVocabError(
            f"{NAME}: the target model {type(model).__name__} has no {missing} (looked at the model and its "
            "language_model), which the prefill top-K needs; use a policy with no prefill top-K "
            "(e.g. window.prefill_topk: 0)"
        )
    return lp, head


def prefill_head(head, tp_group: Callable[[], Any]):
    """The target LM head for the prefill top-K: its weight, or a callable that all-gathers TP shards."""
    base = getattr(head, "base_layer", head)  # a LoRA wrapper's inner layer
    weight = getattr(base, "weight", None)
    if weight is None or not weight.is_floating_point():
        raise SpecVocabError(f"{NAME}: prefill top-K needs an unquantized target lm_head with a float weight")
    tp = int(getattr(base, "tp_size", 1))
    if tp == 1:
        return weight
    group = tp_group()

    def head_fn(h: torch.Tensor) -> torch.Tensor:
        return group.all_gather((h.to(weight.dtype) @ weight.T).contiguous(), dim=-1)

    return head_fn


class DynVocabDraftWorker(EagleDraftWorker):
    """EAGLE's draft worker plus the candidate-set policy, its table and the compact head."""

    def __init__(self, server_args, gpu_id, nccl_port, target_worker):
        # The config first: a bad file stops here, before the draft weights load.
        self.dynvocab_config = load_server_config(server_args)
        self.dynvocab_policy: Policy | None = None
        self.dynvocab_proc = None
        self.dynvocab_telemetry: Telemetry | None = None
        self.dynvocab_target_head = None  # the target LM head for the prefill top-K (install_dynvocab_head)
        super().__init__(server_args, gpu_id, nccl_port, target_worker)

    def alloc_memory_pool(self, memory_pool_config=None, req_to_token_pool=None, token_to_kv_pool_allocator=None):
        super().alloc_memory_pool(
            memory_pool_config=memory_pool_config,
            req_to_token_pool=req_to_token_pool,
            token_to_kv_pool_allocator=token_to_kv_pool_allocator,
        )
        self.dynvocab_policy = self.build_dynvocab_policy(req_to_token_pool)
        num_rows = int(req_to_token_pool.req_to_token.shape[0])
        self.dynvocab_telemetry = Telemetry(num_rows, device=self.device)
        self.install_dynvocab_head()

    def dynvocab_space(self) -> VocabSpace:
        """The draft vocabulary, built once (start-up only: host reads of the d2t map): the target's ids, a d2t
        draft's map, this rank's head shard, the fallback id (the smallest EOS id the draft can score)."""
        space = getattr(self, "_dynvocab_space", None)
        if space is None:
            target_config = self.target_worker.model_runner.model_config
            eos = tuple(sorted(getattr(target_config, "hf_eos_token_id", None) or ()))
            hot = self.dynvocab_hot_token_id()
            head = getattr(self.draft_runner.model, "lm_head", None)
            weight = getattr(head, "weight", None)  # the space's tensors live with the head
            space = VocabSpace.build(
                int(target_config.vocab_size),
                head_ids=None if hot is None else hot.flatten().long(),
                **head_shard(head),
                eos_token_ids=eos,
                device=self.device if weight is None else weight.device,
            )
            self._dynvocab_space = space
        return space

    def dynvocab_model_context(self) -> ModelContext:
        """What the policies get from the models: the draft head and embeddings, the vocabulary space, the EOS ids."""
        draft = self.draft_runner.model
        target_config = self.target_worker.model_runner.model_config
        head = getattr(draft, "lm_head", None)
        inner = getattr(draft, "model", None)
        embed = getattr(inner, "embed_tokens", None)
        eos = tuple(sorted(getattr(target_config, "hf_eos_token_id", None) or ()))
        return ModelContext(
            weight=getattr(head, "weight", None),
            embedding=getattr(embed, "weight", None),
            space=self.dynvocab_space(),
            eos_token_ids=eos,
            gather_weight=_tp_gather(head),
            gather_embedding=_tp_gather(embed),
        )

    def dynvocab_hot_token_id(self) -> torch.Tensor | None:
        """The d2t map (draft row -> target id) of a reduced-vocabulary draft, None for a full head."""
        hot = getattr(self, "hot_token_id", None)
        if hot is None:
            hot = getattr(self.draft_runner.model, "hot_token_id", None)
        return hot

    def build_dynvocab_policy(self, req_to_token_pool) -> Policy:
        """The policy with a table of one row per request slot of ``req_to_token_pool``."""
        num_rows = int(req_to_token_pool.req_to_token.shape[0])
        model = self.dynvocab_model_context()
        draft_config = self.draft_runner.model_config
        info = draft_info(draft_config.hf_config, draft_config.model_path, model.vocab_size)
        self.dynvocab_config.check_vocab(info.head_size, info.describe())
        policy = build_policy(self.dynvocab_config, num_rows, device=self.device, model=model)
        table = policy.table
        logger.info(
            "DYNVOCAB policy %s (%s): table %s; %s",
            self.dynvocab_config.policy,
            self.dynvocab_config.source,
            "none (dense head)" if table is None else f"{num_rows} rows x {table.capacity} ids on {self.device}",
            model.space.describe(),
        )
        fc = getattr(getattr(self.draft_runner.model, "model", None), "fc", None)
        why = fit_mismatch(policy.trained, draft_fingerprint(getattr(fc, "weight", None)))
        if why is not None:  # it still serves (losslessly): the sets may just leave out more of this draft's choices
            logger.warning(
                "DYNVOCAB config %s: its %s; the sets were fit to another draft's states and may leave out more of "
                "this draft's choices. Fit one to this draft: sglang-specvocab train-ranker --fit whitened --draft "
                "eagle3:%s --rank R --out FILE (docs/policies.md, 'Fit to the draft that serves')",
                self.dynvocab_config.source,
                why,
                draft_config.model_path,
            )
        return policy

    def install_dynvocab_head(self) -> None:
        """The compact logits processor over this policy's table on the draft model instance; the
        target keeps its last hidden states when the policy wants prefill top-K. A dense policy
        (no table) keeps SGLang's head and draft methods."""
        policy = self.dynvocab_policy
        self.dynvocab_target_head = None
        if policy.prefill_topk > 0:  # checked here, at start, not at the first prefill
            target_lp, head = target_head_modules(self.target_worker.model_runner.model)
            self.dynvocab_target_head = prefill_head(head, lambda: get_parallel().tp_group)
            target_lp.keep_last_hidden_states = True
        table = policy.table
        if table is None:
            self.dynvocab_proc = None
            return
        model = self.draft_runner.model
        cls = StepwiseProcessor if policy.stepwise else DynVocabLogitsProcessor
        # the head sizes its union: head.union_capacity, else config.default_union_columns over its rows
        proc = install(model, table, self.dynvocab_config.head, cls=cls, space=self.dynvocab_space())
        if policy.stepwise:
            proc.dv_policy = policy
        self.dynvocab_proc = proc
        if SGLANG_HOOK:
            self.set_draft_topk_hook(CompactTopKHook(proc))

    if not SGLANG_HOOK:
        # The compact-head copies (copies/from-sglang/dynvocab_draft.py); SGLang's own with a dense policy.
        def draft_forward(self, forward_batch):
            if self.dynvocab_proc is None:
                return super().draft_forward(forward_batch)
            return _DRAFT.draft_forward(self, forward_batch)

        def _draft_extend_for_prefill(
            self, batch, target_hidden_states, next_token_ids, mm_input_embeds=None, kv_loc_plan=None
        ):
            if self.dynvocab_proc is None:
                return super()._draft_extend_for_prefill(
                    batch, target_hidden_states, next_token_ids, mm_input_embeds, kv_loc_plan=kv_loc_plan
                )
            return _DRAFT.draft_extend_for_prefill(
                self, batch, target_hidden_states, next_token_ids, mm_input_embeds, kv_loc_plan
            )

        def _draft_extend_for_decode(self, batch, batch_result, *, kv_loc_plan=None):
            if self.dynvocab_proc is None:
                return super()._draft_extend_for_decode(batch, batch_result, kv_loc_plan=kv_loc_plan)
            return _DRAFT.draft_extend_for_decode(self, batch, batch_result, kv_loc_plan=kv_loc_plan)


class DynVocabWorkerV2(EAGLEWorkerV2):
    """EAGLE's V2 worker with ``DynVocabDraftWorker`` as its draft worker, the policy events and telemetry."""

    draft_worker_cls = DynVocabDraftWorker

    def __init__(self, server_args, gpu_id, nccl_port, target_worker):
        if SGLANG_HOOK:  # SGLang's own __init__ builds self.draft_worker_cls
            super().__init__(server_args, gpu_id, nccl_port, target_worker)
        else:
            _INIT.worker_init(self, server_args, gpu_id, nccl_port, target_worker, self.draft_worker_cls)
        self._init_dynvocab_state(server_args)

    def _init_dynvocab_state(self, server_args) -> None:
        self._dv_seen: torch.Tensor | None = None  # CPU [R]: pool generation each row was last seen at
        self._dv_fed: torch.Tensor | None = None  # CPU [R]: positions already fed to the policy
        self._dv_live: dict[str, tuple] = {}  # rid -> (row, req), for the finished-request report
        self._dv_row_rid: dict[int, str] = {}
        install_request_level_keys()
        enabled = False
        labels = {}
        try:
            enabled = bool(get_observability().enable_metrics)
        except Exception as exc:  # noqa: BLE001  (no runtime context: tests, embedders; no gauges)
            _warn_no_gauges(exc)
            enabled = False
        if enabled:
            name = getattr(server_args, "served_model_name", None) or getattr(server_args, "model_path", "")
            labels = {"model_name": str(name)}
        self.dynvocab_gauges = Gauges(enabled, labels)
        self._dynvocab_watch_counters()

    def _dynvocab_watch_counters(self) -> None:
        """Publish the draft head's device counters with the telemetry (``Telemetry.watch``): the bad table entries
        its ops counted (``ops.bad_entries``) and its union overflows. None without a head (a dense policy)."""
        telemetry = self.dynvocab_telemetry
        proc = getattr(self._draft_worker, "dynvocab_proc", None)
        head = getattr(proc, "dv_head", None)
        if telemetry is None or head is None:
            return
        bad = ops.bad_entries(head.weight.device)  # the counter the head's logits ops were bound to
        telemetry.watch(BAD_ENTRIES, lambda: bad)
        telemetry.watch(UNION_OVERFLOW, lambda: getattr(head, "union_overflow", None))

    @property
    def dynvocab_policy(self) -> Policy | None:
        return None if self._draft_worker is None else self._draft_worker.dynvocab_policy

    @property
    def dynvocab_telemetry(self) -> Telemetry | None:
        return None if self._draft_worker is None else getattr(self._draft_worker, "dynvocab_telemetry", None)

    def _dynvocab_vocab_size(self) -> int:
        return int(self.target_worker.model_runner.model_config.vocab_size)

    # --- verify ---------------------------------------------------------------------------------

    def verify(self, batch, pp_proxy_tensors=None, grammar_barrier=None):
        verify_input = batch.spec_info  # before verify replaces or consumes it
        rows = batch.req_pool_indices
        res = super().verify(batch, pp_proxy_tensors=pp_proxy_tensors, grammar_barrier=grammar_barrier)
        policy = self.dynvocab_policy
        if policy is None or batch.forward_mode.is_idle() or rows is None or rows.shape[0] == 0:
            return res
        if getattr(res, "accept_index", None) is None:
            return res
        self.dynvocab_on_verify(policy, verify_input, rows, res)
        return res

    def dynvocab_on_verify(self, policy: Policy, verify_input, rows: torch.Tensor, res) -> None:
        """The round's event: telemetry against the sets as they were, then ``policy.on_verify``."""
        k = policy.verify_topk
        logits = res.logits_output.next_token_logits if k > 0 else None
        telemetry = self.dynvocab_telemetry
        if getattr(policy, "fused_verify", False):  # the window policy: a top-k and one op per round
            policy.on_verify_round(
                rows.long(),
                verify_input.draft_token,
                res.accept_index,
                res.accept_lens,
                res.next_token_ids,
                logits,
                compacted=self.topk > 1,
                vocab_size=self._dynvocab_vocab_size(),
                acc=None if telemetry is None else telemetry.acc,
            )
            if telemetry is not None:
                telemetry.publish()
            return
        draft_tokens, verify_topk, accepted = verify_event(
            verify_input.draft_token,
            res.accept_index,
            res.accept_lens,
            res.next_token_ids,
            logits,
            num_draft_tokens=self.speculative_num_draft_tokens,
            k=k,
            compacted=self.topk > 1,
            vocab_size=self._dynvocab_vocab_size(),
        )
        rows = rows.long()
        if telemetry is not None:
            telemetry.record_verify(policy.table, rows, accepted, self._dynvocab_vocab_size())
            telemetry.publish()
        policy.on_verify(rows, draft_tokens, verify_topk, accepted)

    # --- prefill --------------------------------------------------------------------------------

    if not SGLANG_HOOK:  # the copy that calls dynvocab_prefill (copies/from-sglang/dynvocab_worker.py)

        def _forward_prefill_batch(self, batch, on_publish=None, pp_proxy_tensors=None, coordination_plan=None):
            return _PREFILL.forward_prefill_batch(self, batch, on_publish, pp_proxy_tensors, coordination_plan)

    def on_target_prefill_complete(self, batch, batch_output) -> None:
        """SGLang's prefill hook (an SGLang with the draft top-k hook): the prefill event."""
        self.dynvocab_prefill(batch, batch_output)

    def _dynvocab_target_head(self):
        """The target LM head for the prefill top-K, resolved at start (``install_dynvocab_head``)."""
        return self._draft_worker.dynvocab_target_head

    def dynvocab_prefill(self, batch, batch_output) -> None:
        """Reset re-used slots, then ``policy.on_prefill`` (prompt ids and the target's top-K) of this extend."""
        policy = self.dynvocab_policy
        if policy is None or batch.forward_mode.is_idle() or not batch.reqs:
            return
        pool = self.req_to_token_pool
        if self._dv_seen is None:
            n = pool.req_generation.shape[0]
            self._dv_seen = torch.full((n,), -1, dtype=torch.int64)
            self._dv_fed = torch.zeros(n, dtype=torch.int64)
        reqs = batch.reqs
        rows_host = [int(r.kv.req_pool_idx) for r in reqs]
        device = batch.req_pool_indices.device
        stale = reset_rows(pool.req_generation, self._dv_seen, rows_host, self._dv_fed)
        if stale.numel():
            stale_dev = host_to_device(stale, device)  # pinned, non-blocking: no stream sync
            policy.on_reset(stale_dev)
            if self.dynvocab_telemetry is not None:
                self.dynvocab_telemetry.reset(stale_dev)
            for row in stale.tolist():  # host tensor: no device sync
                old = self._dv_row_rid.pop(row, None)
                if old is not None and self._dv_live.get(old, (None,))[0] == row:
                    del self._dv_live[old]
        for r, row in zip(reqs, rows_host, strict=True):
            self._dv_live[r.rid] = (row, r)
            self._dv_row_rid[row] = r.rid

        extend_lens = [int(x) for x in batch.extend_lens]
        prefix_lens = [int(x) for x in batch.prefix_lens]
        fed = self._dv_fed[rows_host].tolist()
        full_ids = None
        if any(p > f for p, f in zip(prefix_lens, fed, strict=True)):
            full_ids = [_req_ids(r) for r in reqs]
        k = policy.prefill_topk
        hidden = head = None
        if k > 0:
            hidden = batch_output.logits_output.last_hidden_states
            if hidden is None:
                raise SpecVocabError(
                    f"{NAME}: the target returned no last_hidden_states for the prefill top-K "
                    "(keep_last_hidden_states with FULL capture and EAGLE-3 aux hidden states)"
                )
            head = self._dynvocab_target_head()
        prompt_ids, prompt_topk = prefill_event(
            hidden,
            head,
            batch.input_ids,
            extend_lens,
            prefix_lens,
            full_ids,
            fed,
            k=k,
            chunk=policy.config.prefill_chunk,
            vocab_size=self._dynvocab_vocab_size(),
        )
        if hidden is not None:  # nothing downstream reads them: let [n_tokens, H] go now
            batch_output.logits_output.last_hidden_states = None
            del hidden
        rows = batch.req_pool_indices.long()
        policy.on_prefill(rows, prompt_ids, prompt_topk)
        if k > 0 and full_ids is not None and self.dynvocab_telemetry is not None:
            # radix-cache hits were seeded from ids only (no hidden states): counted, see telemetry's doc
            hits = torch.tensor([max(p - f, 0) for p, f in zip(prefix_lens, fed, strict=True)])
            self.dynvocab_telemetry.record_unseeded(rows, host_to_device(hits, rows.device))
        self._dv_fed[rows_host] = torch.tensor([p + e for p, e in zip(prefix_lens, extend_lens, strict=True)])

    # --- finished requests -----------------------------------------------------------------------

    def note_request_finished(self, *, rid: str, natural_stop: bool) -> None:
        super().note_request_finished(rid=rid, natural_stop=natural_stop)
        self.dynvocab_report(rid)

    def dynvocab_report(self, rid: str, req=None) -> tuple[float, float] | None:
        """Per finished request: ``meta_info`` fields and the gauges, from the published host copy (no device read)."""
        entry = self._dv_live.pop(rid, None)
        telemetry = self.dynvocab_telemetry
        if entry is None or telemetry is None:
            return None
        row, live_req = entry
        if self._dv_row_rid.get(row) == rid:
            del self._dv_row_rid[row]
        set_size, coverage = telemetry.summary(row)
        req = req if req is not None else live_req
        if req is not None:
            report_to_request(req, set_size, coverage, telemetry.unseeded_positions(row))
        self.dynvocab_gauges.update(set_size, coverage)
        self.dynvocab_gauges.update_counts(telemetry.counts())  # the published host copy, like the summary
        return set_size, coverage


_warned_no_gauges = False


def _warn_no_gauges(exc: Exception) -> None:
    """Once per process: why the Prometheus gauges are off (no runtime context)."""
    global _warned_no_gauges
    if _warned_no_gauges:
        return
    _warned_no_gauges = True
    logger.warning(
        "DYNVOCAB: no Prometheus gauges (set size, coverage, bad table entries, union overflow): SGLang's "
        "observability settings could not be read: %r",
        exc,
    )


def _req_ids(req):
    """A request's ids from position 0 up to this extend's end: ``Req.get_fill_ids()``, the ids SGLang
    builds the extend batch from (``origin_input_ids + output_ids``, so a retracted request's refill
    includes its output), whose positions ``[0, prefix_len)`` are the radix-cache hit."""
    return req.get_fill_ids()


__all__ = [
    "SGLANG_HOOK",
    "CompactTopKHook",
    "DynVocabDraftWorker",
    "DynVocabWorkerV2",
    "StepwiseProcessor",
    "prefill_head",
    "stepwise_inputs",
    "target_head_modules",
]

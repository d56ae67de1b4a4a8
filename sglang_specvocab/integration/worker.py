"""DYNVOCAB's speculative worker for SGLang 0.5.23 (first version: construction and allocation only).

Imported lazily by the worker factory (``plugin.worker_factory``), in the scheduler process.

- ``DynVocabWorkerV2(EAGLEWorkerV2)``: ``__init__`` is EAGLE's (copied in
  ``patches/sglang-0.5.23/eagle_worker_v2.py``) with the draft worker class swapped, as
  ``StandaloneWorkerV2`` does.
- ``DynVocabDraftWorker(EagleDraftWorker)``: loads the policy config (the same file the launcher
  validated, ``algorithm.config_location``); ``alloc_memory_pool`` runs EAGLE's (draft KV pools,
  token map, LM head), then builds the policy and its candidate table with one row per request
  slot, ``R = req_to_token_pool.req_to_token.shape[0]`` (row 0 is SGLang's padding row), on the
  draft's device, through ``sglang_specvocab.policies.build_policy``.

NOT IMPLEMENTED YET — GPU paths, each raising ``NotImplementedError`` with the reason (nothing is
silently skipped; until they exist a DYNVOCAB server stops at start-up, in ``alloc_memory_pool``):

- ``DynVocabDraftWorker.install_dynvocab_head``: replace ``draft_runner.model.logits_processor``
  by the compact logits processor (``integration/logits.py``), sharing this table, and set the
  target's ``logits_processor.keep_last_hidden_states`` for prefill seeding;
- ``DynVocabWorkerV2.verify``: EAGLE's verify, then ``policy.on_verify`` from the verify outputs
  (``integration/events.py``), on the forward stream, without host syncs;
- ``DynVocabWorkerV2._forward_prefill_batch``: reset re-used request slots (the request pool's
  generation counter), then ``policy.on_prefill`` with the prompt ids and target top-K before
  the draft extend (a copied-and-trimmed method, to live in ``patches/sglang-0.5.23/``).

Also left for that wiring: ranker policies (``lowrank``, ``cluster``) with a d2t draft rank the
draft head's rows (draft-space indices) and need the ``hot_token_id`` map to target ids; with
TP > 1 the head weight and embeddings given to the policy are this rank's vocabulary shard.
"""

from __future__ import annotations

import logging

from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker, EAGLEWorkerV2

from ..patches import load_patch_module
from ..policies import ModelContext, Policy, build_policy
from .algorithm import draft_info, load_server_config

logger = logging.getLogger(__name__)

_WIRING = "the DYNVOCAB GPU wiring is not implemented yet in this version of sglang-specvocab"


class DynVocabDraftWorker(EagleDraftWorker):
    """EAGLE's draft worker plus the candidate-set policy and its table."""

    def __init__(self, server_args, gpu_id, nccl_port, target_worker):
        # The config first: a bad file stops here, before the draft weights load.
        self.dynvocab_config = load_server_config(server_args)
        self.dynvocab_policy: Policy | None = None
        super().__init__(server_args, gpu_id, nccl_port, target_worker)

    def alloc_memory_pool(self, memory_pool_config=None, req_to_token_pool=None, token_to_kv_pool_allocator=None):
        super().alloc_memory_pool(
            memory_pool_config=memory_pool_config,
            req_to_token_pool=req_to_token_pool,
            token_to_kv_pool_allocator=token_to_kv_pool_allocator,
        )
        self.dynvocab_policy = self.build_dynvocab_policy(req_to_token_pool)
        self.install_dynvocab_head()

    def dynvocab_model_context(self) -> ModelContext:
        """What the policies get from the models: the draft head and embeddings, V, the EOS ids."""
        draft = self.draft_runner.model
        target_config = self.target_worker.model_runner.model_config
        head = getattr(draft, "lm_head", None)
        inner = getattr(draft, "model", None)
        embed = getattr(inner, "embed_tokens", None)
        eos = tuple(sorted(getattr(target_config, "hf_eos_token_id", None) or ()))
        return ModelContext(
            weight=getattr(head, "weight", None),
            embedding=getattr(embed, "weight", None),
            vocab_size=int(target_config.vocab_size),
            eos_token_ids=eos,
        )

    def build_dynvocab_policy(self, req_to_token_pool) -> Policy:
        """The policy with a table of one row per request slot of ``req_to_token_pool``."""
        num_rows = int(req_to_token_pool.req_to_token.shape[0])
        model = self.dynvocab_model_context()
        draft_config = self.draft_runner.model_config
        info = draft_info(draft_config.hf_config, draft_config.model_path, model.vocab_size)
        self.dynvocab_config.check_vocab(info.head_size, info.describe())
        fallback = model.eos_token_ids[0] if model.eos_token_ids else 0
        policy = build_policy(self.dynvocab_config, num_rows, device=self.device, fallback_id=fallback, model=model)
        table = policy.table
        logger.info(
            "DYNVOCAB policy %s (%s): table %s",
            self.dynvocab_config.policy,
            self.dynvocab_config.source,
            "none (dense head)" if table is None else f"{num_rows} rows x {table.capacity} ids on {self.device}",
        )
        return policy

    def install_dynvocab_head(self) -> None:
        """GPU path: swap in the compact logits processor over this policy's table."""
        raise NotImplementedError(
            f"{_WIRING}: DynVocabDraftWorker.install_dynvocab_head (replace draft_runner.model.logits_processor "
            "by the compact logits processor of sglang_specvocab.integration.logits over the candidate table). "
            "Use --speculative-algorithm EAGLE3 until then."
        )


class DynVocabWorkerV2(EAGLEWorkerV2):
    """EAGLE's V2 worker with ``DynVocabDraftWorker`` as its draft worker."""

    draft_worker_cls = DynVocabDraftWorker

    def __init__(self, server_args, gpu_id, nccl_port, target_worker):
        load_patch_module("eagle_worker_v2").worker_init(
            self, server_args, gpu_id, nccl_port, target_worker, self.draft_worker_cls
        )

    @property
    def dynvocab_policy(self) -> Policy | None:
        return None if self._draft_worker is None else self._draft_worker.dynvocab_policy

    def verify(self, batch, pp_proxy_tensors=None, grammar_barrier=None):
        raise NotImplementedError(
            f"{_WIRING}: DynVocabWorkerV2.verify (EAGLE's verify, then policy.on_verify from the verify outputs "
            "via sglang_specvocab.integration.events, on the GPU)"
        )

    def _forward_prefill_batch(self, batch, on_publish=None, pp_proxy_tensors=None, coordination_plan=None):
        raise NotImplementedError(
            f"{_WIRING}: DynVocabWorkerV2._forward_prefill_batch (reset re-used request slots, then policy.on_prefill "
            "with the prompt ids and the target's top-K before the draft extend, on the GPU)"
        )


__all__ = ["DynVocabDraftWorker", "DynVocabWorkerV2"]

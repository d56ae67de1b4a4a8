"""The compact draft logits processor: SGLang's ``LogitsProcessor`` with the dynamic head (``head.DraftHead``).

``DynVocabLogitsProcessor`` replaces the draft model's ``logits_processor`` instance. SGLang's
forward calls it exactly like the original (``(input_ids, hidden, lm_head, forward_batch, aux)``);
it keeps everything of ``LogitsProcessor.forward`` (row pruning, hidden-state capture, the
autotune early return) and replaces only ``_get_logits``: instead of ``hidden @ W.T`` over the
whole vocabulary plus the TP all-gather, the one ``DraftHead`` of the package scores the rows
(per request, over the batch's union, or with the stock dense head: ``head.batch``, chosen per
batch size from shapes only), with the original's logit scale and softcapping. ``draft_topk``
is the head's top-k.

Rows are request-major: ``N // bs`` consecutive rows per request, ``bs = len(req_pool_indices)``
(``topk`` rows per request in the multi-step draft, one in the prefill draft-extend and in the
graph draft-extend that prunes to ``select_index``, ``num_draft_tokens`` in the eager decode
draft-extend). Everything is shape-static and sync-free: the slot of a row comes from
``forward_batch.req_pool_indices`` (the static buffer inside a CUDA graph), the table is read,
never rebound, and no value reaches the host.

Vocabulary spaces: one ``vocab.VocabSpace``, built by the worker at start-up and shared with the policy. Table ids
are always *target* token ids; a full-vocabulary head's row is the id, a 32k d2t draft's is ``t2d[id]`` (the space's
``row_map``). An id outside the draft vocabulary has no row: its column is ``-inf``. Keeping such ids out of the table
is the policy's job (``DraftVocabPolicy``, over the same space), and the table's ``fallback_id`` must be one of the
draft's ids (checked once at construction, ``VocabSpace.check_fallback``); ``check_table`` verifies the live ids with
a host sync, for tests and debugging.

Tensor parallelism. Each rank holds a vocabulary shard of the head (``ParallelLMHead``: rank r
owns rows ``[r*Vp/tp, (r+1)*Vp/tp) ∩ [0, V)`` of the padded vocabulary, see ``ops.topk.vocab_shard``).
Every rank holds the same table; each computes the columns whose head row is in its shard
(others ``-inf``). ``next_token_logits`` is then that *rank-local* part; ``draft_topk`` takes a
local top-k and merges it across ranks (one all-gather of ``[tp, N, 2k+1]``), so every rank ends
with the same top-k values, token ids and probabilities.

CUDA graphs. SGLang replays the head inside its captured graphs and, in the decode draft extend, runs the
top-k eagerly after the replay: ``draft_topk``/``draft_topk1`` read the logits with the column map of the head
call that produced them, named by its shape (``head_key = (bs, n)``, default: what the logits show), never with
Python state of a later call (``head.DraftHead``, "CUDA graphs"; docs/serving.md, "CUDA graphs").

Tie rule: value descending, then column ascending (columns run in ascending token id); an entry of value ``-inf``
is the fallback id (``HeadOutput.topk``). The stock plan on one rank is EAGLE3's own code path instead (the original
processor's ``_get_logits``; ``sampling_softmax`` + ``fast_topk`` + the d2t map; the argmax for chains), so it costs
what EAGLE3 costs: torch's top-k order there (exact ties of float logits aside, the same tokens).
"""

from __future__ import annotations

from typing import Any

import torch
from sglang.kernels.ops.sampling import softmax as sampling_softmax
from sglang.srt.layers.logits_processor import LogitsProcessor
from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.runtime_context import get_parallel
from sglang.srt.utils.common import fast_topk

from ..config import HeadSection
from ..head import DraftHead
from ..table import CandidateTable
from ..vocab import VocabSpace


def head_shard(lm_head) -> dict:
    """``shard`` and ``tp_size`` of a (vocabulary-parallel) ``ParallelLMHead``, for ``VocabSpace.build``."""
    tp_size = int(getattr(lm_head, "tp_size", 1))
    if tp_size == 1:
        return {"shard": None, "tp_size": 1}
    si = lm_head.shard_indices
    return {"shard": (si.org_vocab_start_index, si.org_vocab_end_index), "tp_size": tp_size}


class DynVocabLogitsProcessor(LogitsProcessor):
    """``LogitsProcessor`` whose logits are compact ``[N, W]`` over each request's candidate set.

    Build with ``wrap(original, lm_head, table, head, ...)``: the new instance copies the
    original's state (softcapping, logit scale, hidden-state capture flags), so SGLang's own
    ``forward`` runs unchanged up to the LM head. See the module doc for the contract.
    """

    @classmethod
    def wrap(
        cls,
        original: LogitsProcessor,
        lm_head,
        table: CandidateTable,
        head: HeadSection,
        *,
        space: VocabSpace | None = None,
        tp_group: Any = None,
    ) -> DynVocabLogitsProcessor:
        """``original``: the draft model's ``logits_processor``; ``lm_head``: its (sharded)
        ``ParallelLMHead``; ``table``: the policy's candidate table (on the head's device; its
        tensors are read, never rebound); ``head``: the config's ``head`` section; ``space``: the draft
        vocabulary (``vocab.VocabSpace``: the target ids, a d2t draft's map, this rank's shard; default: a
        full-vocabulary head on one rank, over the head's vocabulary); ``tp_group``: the group the head is sharded
        over (default: SGLang's TP ``GroupCoordinator`` when ``lm_head.tp_size > 1``)."""
        self = cls.__new__(cls)
        torch.nn.Module.__init__(self)
        skip = ("_parameters", "_buffers", "_modules", "_dv_original")
        state = {k: (v.copy() if isinstance(v, dict) else v) for k, v in original.__dict__.items() if k not in skip}
        self.__dict__.update(state)  # the original's settings; hook dicts copied, not shared
        for name, mod in original.named_children():
            self.add_module(name, mod)
        weight = getattr(lm_head, "weight", None)
        if weight is None or not weight.is_floating_point() or hasattr(lm_head, "set_lora"):
            raise ValueError("DynVocabLogitsProcessor: needs an unquantized, non-LoRA lm_head with a float weight")
        if getattr(self, "do_tensor_parallel_all_gather_dp_attn", False) or getattr(self, "use_attn_tp_group", False):
            raise ValueError("DynVocabLogitsProcessor: DP attention / a DP LM head is not supported")
        if table.ids.device != weight.device or table.cnt.device != weight.device:
            raise ValueError("DynVocabLogitsProcessor: the table must live on the head's device")
        tp_size = int(getattr(lm_head, "tp_size", 1))
        head_vocab = int(getattr(lm_head, "org_vocab_size", weight.shape[0]))
        if space is None:
            space = VocabSpace.build(head_vocab, **head_shard(lm_head), fallback_id=table.fallback_id)
        if space.head_rows != head_vocab:
            raise ValueError(
                f"DynVocabLogitsProcessor: the vocabulary space has {space.head_rows} head rows, the head {head_vocab}"
            )
        if space.tp_size != tp_size:
            raise ValueError(f"DynVocabLogitsProcessor: the space is for tp_size {space.tp_size}, the head {tp_size}")
        if tp_size > 1 and tp_group is None:  # the GroupCoordinator the head is sharded over
            tp_group = get_parallel().tp_group
        self.dv_head = DraftHead(
            weight,
            table,
            space,
            head,
            logit_softcap=self.final_logit_softcapping or None,
            logit_scale=self.logit_scale,
            group=tp_group,
        )
        # The stock plan on one rank is EAGLE3's own code path: the original's _get_logits (not a submodule: its
        # state is copied above; a reference, so nothing is registered twice). A stand-in original (tests, the host
        # benchmark's toy) keeps the head's own stock GEMM.
        stock = tp_size == 1 and isinstance(original, LogitsProcessor)
        object.__setattr__(self, "_dv_stock", original if stock else None)
        self.vocab_size = table.capacity  # the per-request width (the union and stock heads are wider)
        self.do_tensor_parallel_all_gather = False  # columns stay rank-local; draft_topk merges
        self._dv_rows = None
        return self

    # SGLang entry point: stash the request slots, then the original forward.
    def forward(self, input_ids, hidden_states, lm_head, logits_metadata, *args, **kwargs):
        if not isinstance(logits_metadata, ForwardBatch):
            raise TypeError("DynVocabLogitsProcessor needs the ForwardBatch (its req_pool_indices)")
        self._dv_rows = logits_metadata.req_pool_indices
        try:
            return super().forward(input_ids, hidden_states, lm_head, logits_metadata, *args, **kwargs)
        finally:
            self._dv_rows = None

    def _get_logits(self, hidden_states, lm_head, logits_metadata, embedding_bias=None, use_logits_buffer=True):
        if getattr(logits_metadata, "extend_return_logprob", False):
            raise ValueError("DynVocabLogitsProcessor: input logprobs are not supported on the draft")
        rows = self._dv_rows
        if rows is None:
            raise RuntimeError("DynVocabLogitsProcessor: _get_logits called outside forward (no request slots)")
        head, N = self.dv_head, hidden_states.shape[0]
        if self._dv_stock is not None and N and head.plan(*head.head_key(rows.shape[0], N)) == "stock":
            # EAGLE3's logits, by its own code (LM head GEMM, logits buffer, scale and softcapping, vocab cut)
            return self._dv_stock._get_logits(
                hidden_states, lm_head, logits_metadata, embedding_bias, use_logits_buffer
            )
        return head(hidden_states, rows, weight=lm_head.weight).logits

    # --- for the worker ---------------------------------------------------------------------------

    def draft_topk(
        self,
        next_token_logits: torch.Tensor | None,
        k: int,
        req_pool_indices: torch.Tensor,
        head_key: tuple[int, int] | None = None,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(probabilities fp32 ``[N, k]``, target token ids int64 ``[N, k]``), identical on every TP rank.

        Replaces ``renorm_draft_probs`` + ``fast_topk`` + the ``hot_token_id`` remap: the head's top-k of
        the logits, read with the column map of the head call that produced them, with the probabilities over
        the row's whole distribution (all ranks). ``head_key``: that call's ``(bs, n)`` where it differs from
        what the logits show (a CUDA graph replayed at a padded batch size, rows selected after the head);
        default ``(len(req_pool_indices), N // len(req_pool_indices))``. Never Python state of an earlier call:
        after a graph replay none of the head's Python ran. ``None`` logits (an autotune pass without LM head)
        give ``(None, None)``.
        """
        if next_token_logits is None:
            return None, None
        if next_token_logits.shape[0] == 0:
            z = next_token_logits.new_zeros((0, k))
            return z.float(), z.long()
        key = head_key or DraftHead.head_key(req_pool_indices.shape[0], next_token_logits.shape[0])
        out = self.dv_head.output(next_token_logits, req_pool_indices, key)
        if out.plan == "stock" and out.tp_size == 1:
            # EAGLE3's draft top-k, the same ops in the same order: renorm_draft_probs (its softmax, without
            # rejection sampling), fast_topk, the d2t map
            probs, cols = fast_topk(sampling_softmax(next_token_logits), k, dim=-1)
            return probs, cols if out.col_ids is None else out.col_ids[cols]
        return out.topk_probs(k)

    def draft_topk1(
        self,
        next_token_logits: torch.Tensor | None,
        req_pool_indices: torch.Tensor,
        chain: torch.Tensor | None = None,
        column: int = 0,
        head_key: tuple[int, int] | None = None,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """``draft_topk`` for topk = 1 (draft chains), with fewer ops: the argmax column of each row
        through the table, probability 1 as in upstream's topk=1 paths (a chain never reads it).
        Written into ``chain[:, column]`` too when given (``draft_forward``'s chain buffer, as
        upstream's fused topk-1 kernel does). Same ids as ``draft_topk(logits, 1, ...)``; ``head_key`` as there."""
        if next_token_logits is None:
            return None, None
        head, N = self.dv_head, next_token_logits.shape[0]
        if N == 0:
            index = next_token_logits.new_zeros((0, 1), dtype=torch.long)
        elif head.tp_size > 1:  # shards to merge
            _, index = self.draft_topk(next_token_logits, 1, req_pool_indices, head_key)
        else:
            key = head_key or DraftHead.head_key(req_pool_indices.shape[0], next_token_logits.shape[0])
            out = head.output(next_token_logits, req_pool_indices, key)  # host only: the call's column map
            if out.plan == "stock":  # EAGLE3's topk-1 step: the argmax, then the d2t map
                cols = torch.argmax(next_token_logits, dim=-1, keepdim=True)
                index = cols if out.col_ids is None else out.col_ids[cols]
            elif (fused := out._fused(1, 0)) is not None:  # compact_topk: the top-1's token in one launch
                index = fused[1]
            else:
                # a map compact_topk does not take (wider than it), without the logsumexp;
                # max returns the first maximum: the lowest column, as local_topk
                values, cols = next_token_logits.max(dim=1, keepdim=True)
                tokens = out.tokens(cols)
                index = torch.where(torch.isneginf(values) | (tokens < 0), out.fallback_id, tokens)
        if chain is not None:
            chain[:, column].copy_(index.view(-1))
        return torch.ones_like(index, dtype=torch.float32), index

    def check_table(self) -> None:
        """Host-sync check (tests, debugging): every live table id is in the draft vocabulary."""
        t = self.dv_head.table
        live = torch.arange(t.capacity, device=t.ids.device)[None, :] < t.cnt[:, None]
        bad = live & ~self.dv_head.space.contains(t.ids)
        if bool(bad.any()):
            r, j = (int(x) for x in bad.nonzero()[0])
            raise ValueError(f"candidate table row {r} holds id {int(t.ids[r, j])} outside the draft vocabulary")


def install(model, table: CandidateTable, head: HeadSection, *, cls: type | None = None, **kwargs):
    """Replace ``model.logits_processor`` (the draft model instance) by the compact one over ``table``
    with the config's ``head`` section; returns it.

    ``cls``: ``DynVocabLogitsProcessor`` (default) or a subclass; ``kwargs`` go to its ``wrap``
    (space, tp_group). Idempotent: an installed processor is rebuilt
    from its original.
    """
    cls = cls or DynVocabLogitsProcessor
    original = model.logits_processor
    original = getattr(original, "_dv_original", original)
    proc = cls.wrap(original, model.lm_head, table, head, **kwargs)
    object.__setattr__(proc, "_dv_original", original)
    model.logits_processor = proc
    return proc


__all__ = ["DynVocabLogitsProcessor", "head_shard", "install"]

"""Copied-and-trimmed from the pinned SGLang (``copies/upstream.py``), ``sglang/srt/speculative/eagle_worker_v2.py``
(Apache-2.0, Copyright the SGLang Team). Loaded by path through
``sglang_specvocab.copies.load_copy("dynvocab_draft")``; bound to ``DynVocabDraftWorker``
(``integration/worker.py``), whose ``dynvocab_proc`` is the compact logits processor of
``integration/logits.py`` (the draft logits are ``[N, W]`` over each request's set).

Common to the three methods:
- every draft top-k is ``proc.draft_topk(logits, topk, req_pool_indices)``, which returns
  probabilities over the request's whole set and *target* token ids, identical on every TP rank
  (replaces ``renorm_draft_probs`` + ``fast_topk`` / ``argmax`` / the Triton topk1 kernels and
  the ``hot_token_id`` remaps); so ``EagleDraftInput.topk_index`` and the ``FutureMap`` relay carry
  target ids;
- dropped branches DYNVOCAB refuses before start (``integration/algorithm.py``): rejection
  sampling (``draft_probs``), DSA/QSA index sharing (``IndexTopKShareState``, the DSA seed top-k),
  the STANDALONE capture mode;
- ``maybe_detect_inf`` / ``maybe_detect_oob`` on the draft logits are dropped: ``-inf`` columns
  past a set's count are normal in compact logits, and columns are not vocabulary ids.

``draft_forward``: the topk==1 chain fast path keeps upstream's shape (``draft_tokens_topk1``, the
preallocated ``_topk1_*`` buffers, no ``select_top_k_tokens`` per step) on every device, with
``proc.draft_topk1`` (argmax over the set, ids through the table, written into the chain) in place of
the Triton ``draft_topk1_postprocess``; before each step's forward it sets ``proc.dv_step = i + 1`` (the draft step whose set a stepwise policy picks
inside the LM head, see ``integration/worker.py``); ``positions`` advance by one per step as in
every upstream branch. Returns ``draft_probs = None``.

``draft_extend_for_prefill`` and ``draft_extend_for_decode``: only the top-k block at the end changes (plus the drops
above; topk == 1 in the decode extend: ``proc.draft_topk1``, upstream's argmax with p = 1); the input
rotation, the forward, the graph/eager split and the ``select_index`` row selection are
upstream's. The decode extend's top-k runs eagerly after a graph replay: it names the head call that produced
the logits (``head_key``: the replayed graph's batch size, one row a request; or the eager forward's rows before
``select_index``), so it never reads Python state of another call (``head.DraftHead``, "CUDA graphs").
"""

from __future__ import annotations

import contextlib

import torch
from sglang.srt.speculative import eagle_worker_v2 as ew


def draft_forward(self, forward_batch):
    proc = self.dynvocab_proc
    spec_info = forward_batch.spec_info
    if forward_batch.forward_mode.is_idle():
        return self._draft_forward_idle(forward_batch, spec_info)

    out_cache_loc = forward_batch.out_cache_loc
    topk_p, topk_index, hidden_states = (spec_info.topk_p, spec_info.topk_index, spec_info.hidden_states)
    ew.maybe_detect_nan(topk_p, "draft_forward: NaN in initial topk_p from spec_info")
    # topk_index already holds target ids (draft_topk at the draft extend): no hot_token_id remap.

    out_cache_loc = ew.per_step_draft_out_cache_loc(
        out_cache_loc, forward_batch.batch_size, self.topk, self.speculative_num_steps
    )

    score_list = []
    token_list = []
    parents_list = []
    topk1_chain_fits = self.topk == 1 and topk_index.shape[0] <= self._topk1_parents_prealloc.shape[0]
    # The chain (topk=1) goes straight into its buffer, as upstream's fused topk-1 path does, on every
    # device: each step's token is the argmax over the request's set (proc.draft_topk1).
    draft_tokens_topk1 = None
    if topk1_chain_fits:
        draft_tokens_topk1 = torch.empty(
            (topk_index.shape[0], self.speculative_num_steps), dtype=topk_index.dtype, device=topk_index.device
        )
        draft_tokens_topk1[:, :1].copy_(topk_index)
    rows = forward_batch.req_pool_indices
    is_mtp_moe = self.draft_runner.model_config.hf_config.architectures[0] == "Qwen3MoeForCausalLMMTP"

    scores = None
    for i in range(self.speculative_num_steps):
        if draft_tokens_topk1 is not None:
            input_ids = topk_index.flatten()
        else:
            input_ids, hidden_states, scores, tree_info = ew.select_top_k_tokens(
                i, topk_p, topk_index, hidden_states, scores, self.topk
            )
            score_list.append(tree_info[0])
            token_list.append(tree_info[1])
            parents_list.append(tree_info[2])

        if i == self.speculative_num_steps - 1:
            break

        forward_batch.input_ids = input_ids
        if is_mtp_moe:
            out_cache_loc = out_cache_loc.contiguous()
        forward_batch.out_cache_loc = out_cache_loc[i]
        spec_info.hidden_states = hidden_states

        proc.dv_step = i + 1
        canary_index_ctx = (
            c.with_active_single_forward_manager(i)
            if (c := self.draft_runner.canary_manager) is not None
            else contextlib.nullcontext()
        )
        with (
            ew.forward_context(
                ew.ForwardContext(attn_backend=self.draft_attn_backend.attn_backends[i]),
                forward_batch=forward_batch,
            ),
            canary_index_ctx,
        ):
            logits_output = self.draft_runner.forward(forward_batch).logits_output
        ew.maybe_detect_nan(logits_output.next_token_logits, f"draft_forward step {i}")
        if self.topk == 1:
            topk_p, topk_index = proc.draft_topk1(logits_output.next_token_logits, rows, draft_tokens_topk1, i + 1)
        else:
            topk_p, topk_index = proc.draft_topk(logits_output.next_token_logits, self.topk, rows)
        forward_batch.positions.add_(1)
        if self.draft_runner.model_config.model_is_mrope:
            forward_batch.mrope_positions.add_(1)
        hidden_states = logits_output.hidden_states

    if draft_tokens_topk1 is not None:
        bs = draft_tokens_topk1.shape[0]
        top_scores_index = self._topk1_score_indices_prealloc[:bs]
        parent_list = self._topk1_parents_prealloc[:bs]
        return parent_list, top_scores_index, draft_tokens_topk1, None

    parent_list, top_scores_index, draft_tokens = ew.organize_draft_results(
        score_list, token_list, parents_list, self.speculative_num_draft_tokens
    )
    return parent_list, top_scores_index, draft_tokens, None


def _extend_canary_ctx(self, forward_batch):
    """The canary context both draft extends enter around their one forward (upstream, unchanged)."""
    c = self.draft_runner.canary_manager
    if c is None:
        return contextlib.nullcontext()
    return ew.context_tuple(
        c.with_ops_outside_graph(single_forward_indices=[0], maybe_inaccurate_forward_batch=forward_batch),
        c.with_active_single_forward_manager(0),
    )


def draft_extend_for_prefill(self, batch, target_hidden_states, next_token_ids, mm_input_embeds=None, kv_loc_plan=None):
    proc = self.dynvocab_proc
    if not batch.forward_mode.is_idle():
        tail_tokens = ew._eagle_prefill_tail_tokens(batch, next_token_ids)
        new_input_ids = torch.empty_like(batch.input_ids)
        if mm_input_embeds is not None:
            rotated_mm = torch.empty_like(mm_input_embeds)
        pt = 0
        for i, extend_len in enumerate(batch.extend_lens):
            input_ids = batch.input_ids[pt : pt + extend_len]
            new_input_ids[pt : pt + extend_len].copy_(torch.cat((input_ids[1:], tail_tokens[i].reshape(1))))
            if mm_input_embeds is not None:
                rotated_mm[pt : pt + extend_len - 1].copy_(mm_input_embeds[pt + 1 : pt + extend_len])
            pt += extend_len
        assert pt == batch.input_ids.numel()
        batch.input_ids = new_input_ids
        if mm_input_embeds is not None:
            mm_input_embeds = rotated_mm

    batch.spec_info = ew.EagleDraftExtendInput(
        hidden_states=target_hidden_states,
        num_tokens_per_req=1,
        num_tokens_for_logprob_per_req=1,
    )
    forward_batch = ew.ForwardBatch.init_new(
        batch,
        self.draft_runner,
        capture_hidden_mode=ew.CaptureHiddenMode.LAST,
        return_hidden_states_before_norm=False,
        kv_loc_plan=kv_loc_plan,
    )
    forward_batch.return_logprob = False
    if mm_input_embeds is not None:
        forward_batch.mm_input_embeds = mm_input_embeds

    canary_ctx = _extend_canary_ctx(self, forward_batch)
    proc.dv_step = 0
    with canary_ctx:
        logits_output = self.draft_runner.forward(forward_batch).logits_output
    ew.maybe_detect_nan(logits_output.next_token_logits, "draft_extend_for_prefill")

    # One row per request (the last prefill position): the first top-k over the request's set.
    topk_p, topk_index = proc.draft_topk(logits_output.next_token_logits, self.topk, forward_batch.req_pool_indices)
    return ew.EagleDraftInput(
        topk_p=topk_p,
        topk_index=topk_index,
        draft_probs=None,
        hidden_states=logits_output.hidden_states,
        bonus_tokens=next_token_ids,
        num_tokens_per_req=1,
        num_tokens_for_logprob_per_req=1,
        dsa_topk_indices=None,
        cuda_graph_compatible=True,
    )


def draft_extend_for_decode(self, batch, batch_result, *, kv_loc_plan=None):
    proc = self.dynvocab_proc
    if batch_result.prepared_draft_extend_inputs is not None:
        num_correct_drafts, select_index, next_token_ids = batch_result.prepared_draft_extend_inputs
    elif batch_result.accept_lens.is_cuda:
        from sglang.kernels.ops.speculative.eagle import prepare_draft_extend_inputs

        num_correct_drafts, select_index, next_token_ids = prepare_draft_extend_inputs(
            batch_result.accept_lens, batch_result.next_token_ids, self.speculative_num_draft_tokens
        )
    else:
        num_correct_drafts = batch_result.accept_lens - 1
        select_index = (
            torch.arange(
                0,
                len(batch.seq_lens) * self.speculative_num_draft_tokens,
                self.speculative_num_draft_tokens,
                device=self.device,
            )
            + batch_result.accept_lens
            - 1
        )
        next_token_ids = batch_result.next_token_ids.to(torch.int64)

    draft_extend_input = ew.EagleDraftExtendInput(
        hidden_states=batch_result.logits_output.hidden_states,
        num_correct_drafts=num_correct_drafts,
        num_accept_tokens=batch_result.accept_lens,
        num_tokens_per_req=self.speculative_num_draft_tokens,
        num_tokens_for_logprob_per_req=self.speculative_num_draft_tokens,
    )
    if self.plan_stream:
        self.plan_stream.wait_stream(torch.get_device_module(self.device).current_stream())
    with self.plan_stream_ctx:
        forward_batch = ew.prepare_for_draft_extend(
            draft_extend_input,
            batch,
            next_token_ids,
            self.speculative_num_draft_tokens,
            self.draft_runner,
            self.cuda_graph_runner_for_draft_extend,
            return_hidden_states_before_norm=False,
            kv_loc_plan=kv_loc_plan,
        )
    if self.plan_stream:
        torch.get_device_module(self.device).current_stream().wait_stream(self.plan_stream)

    can_run_decode_cuda_graph = (
        self.cuda_graph_runner_for_draft_extend and self.cuda_graph_runner_for_draft_extend.can_run_graph(forward_batch)
    )
    canary_ctx = _extend_canary_ctx(self, forward_batch)
    proc.dv_step = 0
    with canary_ctx:
        if can_run_decode_cuda_graph:
            draft_logits_output = self.cuda_graph_runner_for_draft_extend.execute(forward_batch, select_index)
        else:
            draft_logits_output = self.draft_runner.forward(forward_batch).logits_output
    ew.maybe_detect_nan(
        draft_logits_output.next_token_logits,
        f"draft_extend_for_decode (cuda_graph={can_run_decode_cuda_graph})",
    )

    rows = forward_batch.req_pool_indices
    if can_run_decode_cuda_graph:
        # The head ran inside the graph, at its captured batch size, one row a request (the graph prunes to
        # select_index before the LM head); none of its Python ran at this replay: the top-k reads that call.
        head_key = (self.cuda_graph_runner_for_draft_extend.bs, 1)
    else:
        # every draft token's row
        head_key = proc.dv_head.head_key(rows.shape[0], draft_logits_output.next_token_logits.shape[0])
        draft_logits_output.next_token_logits = draft_logits_output.next_token_logits[select_index]
        if draft_logits_output.hidden_states is not None:
            draft_logits_output.hidden_states = draft_logits_output.hidden_states[select_index]
    # One row per request (its last accepted position): the next round's first top-k (topk=1: argmax, p = 1,
    # as upstream's decode extend).
    if self.topk == 1:
        ret_topk_p, ret_topk_index = proc.draft_topk1(draft_logits_output.next_token_logits, rows, head_key=head_key)
    else:
        ret_topk_p, ret_topk_index = proc.draft_topk(
            draft_logits_output.next_token_logits, self.topk, rows, head_key=head_key
        )

    next_draft_input = batch_result.next_draft_input
    next_draft_input.topk_p, next_draft_input.topk_index, next_draft_input.hidden_states = (
        ret_topk_p,
        ret_topk_index,
        draft_logits_output.hidden_states,
    )
    next_draft_input.cuda_graph_compatible = True


__all__ = ["draft_extend_for_decode", "draft_extend_for_prefill", "draft_forward"]
